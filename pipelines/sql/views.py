"""Every Delta table of a lake as a Spark view under its own name, in one call.

:func:`lake_table_paths` is the discovery (a directory directly under the lake with a
``_delta_log/`` inside is a table); it imports nothing heavy, so the DuckDB/DataFusion engines
reuse it. :func:`register_lake_views` makes each table a temporary view (``messages``,
``consume_queue``, ``consumer_lag``, …): through Spark's own ``delta`` format when the Delta Spark
jar is loaded, otherwise through :mod:`pipelines.sources.delta` (delta-rs). With the latter every
query on a view plans its read afresh, so a view sees commits made after it was registered.
"""

from __future__ import annotations

import logging
import os
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

DELTA_LOG_DIR = "_delta_log"


def _local_dir(lake: str | os.PathLike) -> str:
    text = os.fspath(lake)
    if text.startswith("file:"):
        text = unquote(urlparse(text).path)
    return os.path.abspath(text)


def lake_table_paths(lake: str | os.PathLike) -> dict[str, str]:
    """``{table name: absolute table path}`` of the Delta tables directly under ``lake`` (a local
    path or ``file://`` URI), sorted by name. Directories starting with ``.`` or ``_`` are skipped,
    as Spark skips them.

    Raises ValueError naming the path when it is not a directory or holds no Delta table: every
    caller (views, the SQL server, the DuckDB/DataFusion engines) treats that as a wrong ``--lake``."""
    root = _local_dir(lake)
    if not os.path.isdir(root):
        raise ValueError(f"lake directory {root} does not exist")
    with os.scandir(root) as it:
        entries = sorted(it, key=lambda e: e.name)
    tables = {e.name: e.path for e in entries
              if e.is_dir() and not e.name.startswith((".", "_")) and os.path.isdir(os.path.join(e.path, DELTA_LOG_DIR))}
    if not tables:
        raise ValueError(f"no Delta tables under {root} (expected <lake>/<table>/{DELTA_LOG_DIR}/)")
    return tables


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def register_lake_views(spark, lake: str | os.PathLike, *, global_views: bool = False) -> dict[str, str]:
    """Register every lake table as a temporary view named after it (and, with ``global_views``,
    also as ``global_temp.<name>``, visible to every session of the application).

    Returns ``{name: path}``. Raises ValueError naming the path when it holds no Delta table."""
    from pipelines.lake import delta_spark_available

    tables = lake_table_paths(lake)
    if delta_spark_available(spark):
        engine = "delta-spark"

        def frame(path: str):
            return spark.read.format("delta").load(path)
    else:
        from pipelines.sources.delta import load_delta

        engine = "delta-rs"

        def frame(path: str):
            return load_delta(spark, path)
    for name, path in tables.items():
        df = frame(path)
        df.createOrReplaceTempView(_quoted(name))
        if global_views:
            df.createOrReplaceGlobalTempView(_quoted(name))
    log.info("registered %d lake views (%s) from %s: %s", len(tables), engine, _local_dir(lake), ", ".join(tables))
    return tables
