"""Which Delta tables a lake holds, and every one of them as a Spark view under its own name.

:func:`find_tables` is the discovery (a directory directly under the lake with a ``_delta_log/``
inside is a table), for a local lake and for one behind a URI (``s3://bucket/lake``, ``file://…``)
alike: it lists through :class:`pipelines.storage.Location`, imports nothing heavy, and is shared by
the SQL engines, the SQL server and the maintenance job. :func:`register_lake_views` makes each
table a temporary view (``messages``, ``consume_queue``, ``consumer_lag``, …): through Spark's own
``delta`` format when the Delta Spark jar is loaded and the lake is local, otherwise through
:mod:`pipelines.sources.delta` (delta-rs, with the lake's storage options). With the latter every
query on a view plans its read afresh, so a view sees commits made after it was registered.

Why a remote lake never goes through the Delta Spark jar: its storage options (endpoint, keys)
belong to the Location, and Spark's ``delta`` format would need them as Hadoop ``s3a`` settings
of the whole session; the delta-rs source carries them with each read.
"""

from __future__ import annotations

import logging
import os
import re

import pyarrow.fs as pafs

from pipelines.storage import Location, StorageError

log = logging.getLogger(__name__)

DELTA_LOG_DIR = "_delta_log"


class LakeNotFound(ValueError):
    """``--lake`` names a place that does not exist (no directory, no object under the prefix, no bucket)."""


MAX_ERROR_CHARS = 400
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def one_line(exc: BaseException) -> str:
    """A storage or delta-rs error as one readable line. delta-rs reports a chain over several
    lines (``Generic S3 error`` / ``↳ Error performing list request`` / ``↳ 404 Not Found`` / …), in
    colour; the first line alone says nothing, so the chain is joined, without the colour codes."""
    text = _ANSI.sub("", str(exc))
    parts = [line.strip().lstrip("↳").strip() for line in text.splitlines()]
    joined = ": ".join(p for p in parts if p) or type(exc).__name__
    return joined if len(joined) <= MAX_ERROR_CHARS else joined[:MAX_ERROR_CHARS - 1] + "…"


def _missing_lake(lake: Location) -> LakeNotFound:
    if lake.is_local:
        return LakeNotFound(f"lake directory {lake} does not exist")
    scheme, _, rest = lake.uri.partition("://")
    root = Location(f"{scheme}://{rest.split('/', 1)[0]}", lake.options)
    try:
        root_missing = not root.exists()
    except (OSError, StorageError):
        root_missing = False
    if root_missing:
        return LakeNotFound(f"lake {lake} does not exist: there is no bucket {root}")
    return LakeNotFound(f"lake {lake} does not exist (nothing is stored under it)")


def find_tables(lake: str | os.PathLike | Location) -> dict[str, Location]:
    """``{table name: table Location}`` of the Delta tables directly under ``lake`` (a local path,
    a ``file://`` URI, any URI :class:`~pipelines.storage.Location` reaches, or a Location carrying
    storage options), sorted by name; ``{}`` when it holds none. Directories starting with ``.`` or
    ``_`` are skipped, as Spark skips them (``_quality`` is not a table).

    Raises :class:`LakeNotFound` when the lake does not exist, and ValueError with the storage's own
    first line when it cannot be listed (unreachable endpoint, refused credentials): every caller
    treats both as a wrong ``--lake`` and says so in one line."""
    root = Location.parse(lake)
    try:
        if not root.is_dir():
            raise _missing_lake(root)
        names = sorted(info.base_name for info in root.list() if info.type == pafs.FileType.Directory)
        return {name: root.child(name) for name in names
                if not name.startswith((".", "_")) and root.child(name, DELTA_LOG_DIR).is_dir()}
    except (OSError, StorageError) as exc:
        raise ValueError(f"cannot list lake {root}: {one_line(exc)}") from None


def lake_table_paths(lake: str | os.PathLike | Location) -> dict[str, str]:
    """``{table name: table path or URI}`` of :func:`find_tables`, for messages and listings.

    Raises ValueError naming the lake when it does not exist, cannot be listed or holds no Delta
    table: every caller (views, the SQL server, the SQL engines) treats that as a wrong ``--lake``."""
    return {name: loc.uri for name, loc in tables_or_error(lake).items()}


def tables_or_error(lake: str | os.PathLike | Location) -> dict[str, Location]:
    """:func:`find_tables`, with a lake that holds no table an error too (ValueError naming it)."""
    tables = find_tables(lake)
    if not tables:
        raise ValueError(f"no Delta tables under {Location.parse(lake)} (expected <lake>/<table>/{DELTA_LOG_DIR}/)")
    return tables


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def register_lake_views(spark, lake: str | os.PathLike | Location, *, global_views: bool = False) -> dict[str, str]:
    """Register every lake table as a temporary view named after it (and, with ``global_views``,
    also as ``global_temp.<name>``, visible to every session of the application).

    Returns ``{name: path or URI}``. Raises ValueError naming the lake when it holds no Delta table."""
    from pipelines.lake import delta_spark_available

    root = Location.parse(lake)
    tables = tables_or_error(root)
    if root.is_local and delta_spark_available(spark):
        engine = "delta-spark"

        def frame(table: Location):
            return spark.read.format("delta").load(table.uri)
    else:
        from pipelines.sources.delta import load_delta

        engine = "delta-rs"

        def frame(table: Location):
            return load_delta(spark, table)
    for name, table in tables.items():
        df = frame(table)
        df.createOrReplaceTempView(_quoted(name))
        if global_views:
            df.createOrReplaceGlobalTempView(_quoted(name))
    log.info("registered %d lake views (%s) from %s: %s", len(tables), engine, root, ", ".join(tables))
    return {name: table.uri for name, table in tables.items()}
