"""The lake API: write and read Delta tables from Spark, with or without the Delta Spark jar.

When the Delta Spark classes are on the driver's classpath, Spark's own ``delta`` format is used;
otherwise :mod:`pipelines.delta_writer` (a Python Data Source on delta-rs) writes, and reads go
through deltalake's list of the table's current files. Either way the result is a standard Delta
table under ``<lake_dir>/<name>``.

Exactly-once: pass ``app_id`` and ``app_version``; a write whose ``app_version`` is not greater than
what the table already records for ``app_id`` is skipped (``WriteResult.skipped``), and a committed
write records the pair atomically with its data (the Delta ``txn`` action).
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from pipelines import delta_writer

DELTA_SPARK_CLASS = "io.delta.tables.DeltaTable"


@dataclass(frozen=True)
class WriteResult:
    path: str
    engine: str                # "delta-spark" | "delta-rs"
    committed: bool
    skipped: bool              # app_id/app_version already recorded: nothing written
    version: int | None        # table version after the write (None when unknown)
    num_files: int | None
    num_rows: int | None
    reason: str | None = None


def table_path(lake_dir: str | os.PathLike, name: str) -> str:
    return os.path.join(os.path.abspath(os.fspath(lake_dir)), name)


def delta_spark_available(spark) -> bool:
    """True when the Delta Spark classes can be loaded by the driver JVM."""
    try:
        jvm = spark._jvm  # not there on Spark Connect
        if jvm is None:
            return False
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_SPARK_CLASS, False, loader)
        return True
    except Exception:
        return False


def table_exists(lake_dir: str | os.PathLike, name: str) -> bool:
    from deltalake import DeltaTable
    return DeltaTable.is_deltatable(table_path(lake_dir, name))


def table_version(lake_dir: str | os.PathLike, name: str) -> int | None:
    """Current version of the table, None when it does not exist."""
    from deltalake import DeltaTable
    path = table_path(lake_dir, name)
    if not DeltaTable.is_deltatable(path):
        return None
    return DeltaTable(path).version()


def app_version(lake_dir: str | os.PathLike, name: str, app_id: str) -> int | None:
    """Highest ``app_version`` committed for ``app_id`` (the Delta ``txn`` action), None if none."""
    return _recorded_app_version(lake_dir, name, app_id)


def _recorded_app_version(lake_dir, name, app_id) -> int | None:
    from deltalake import DeltaTable
    path = table_path(lake_dir, name)
    if not DeltaTable.is_deltatable(path):
        return None
    return DeltaTable(path).transaction_version(app_id)


def already_recorded(lake_dir: str | os.PathLike, name: str, app_id: str | None, app_version: int | None,
                     engine: str) -> WriteResult | None:
    """The "skipped" result when the table already records ``app_version`` (or later) for
    ``app_id``; None when the write should go ahead. Raises when only one of the two is given."""
    if (app_id is None) != (app_version is None):
        raise ValueError("app_id and app_version go together")
    if app_id is None:
        return None
    seen = _recorded_app_version(lake_dir, name, app_id)
    if seen is None or seen < app_version:
        return None
    return WriteResult(table_path(lake_dir, name), engine, committed=False, skipped=True,
                       version=table_version(lake_dir, name), num_files=0, num_rows=0,
                       reason=f"appId {app_id!r} already at version {seen} >= {app_version}")


@contextmanager
def writer_result_file() -> Iterator[str]:
    """A path for :class:`pipelines.delta_writer.DeltaArrowWriter`'s ``resultFile`` report (its commit
    may run in another process), removed afterwards."""
    fd, result_file = tempfile.mkstemp(prefix="rocketlake-delta-", suffix=".json")
    os.close(fd)
    os.remove(result_file)
    try:
        yield result_file
    finally:
        if os.path.exists(result_file):
            os.remove(result_file)


def read_writer_result(path: str, result_file: str) -> WriteResult:
    """The WriteResult of a delta-rs write job from its report file."""
    with open(result_file, encoding="utf-8") as fh:
        result = json.load(fh)
    return WriteResult(path, "delta-rs", committed=result["committed"], skipped=result["skipped"],
                       version=result.get("version"), num_files=result.get("num_files"),
                       num_rows=result.get("num_rows"), reason=result.get("reason"))


def write_table(df, lake_dir: str | os.PathLike, name: str, *, partition_by: Iterable[str] = (),
                app_id: str | None = None, app_version: int | None = None,
                schema: pa.Schema | None = None, mode: str = "append",
                engine: str | None = None) -> WriteResult:
    """Append ``df`` (or overwrite with ``mode="overwrite"``) to ``<lake_dir>/<name>`` in one commit.

    ``schema``: Arrow schema of the table (column order, exact types); the rows are cast to it.
    ``engine``: force "delta-spark" or "delta-rs" (default: delta-spark when its jar is loaded).
    """
    if (app_id is None) != (app_version is None):
        raise ValueError("app_id and app_version go together")
    if mode not in ("append", "overwrite"):
        raise ValueError(f"mode must be 'append' or 'overwrite', not {mode!r}")
    partition_by = list(partition_by)
    path = table_path(lake_dir, name)
    spark = df.sparkSession
    if schema is not None:
        missing = [n for n in schema.names if n not in df.columns]
        if missing:
            raise ValueError(f"DataFrame lacks table columns {missing}")
        df = df.select(*schema.names)
    if engine is None:
        engine = "delta-spark" if delta_spark_available(spark) else "delta-rs"

    # cheap early skip (the delta-rs commit checks again, atomically enough for one writer per appId)
    skipped = already_recorded(lake_dir, name, app_id, app_version, engine)
    if skipped is not None:
        return skipped

    if engine == "delta-spark":
        return _write_delta_spark(df, path, partition_by, app_id, app_version, schema, mode)
    if engine != "delta-rs":
        raise ValueError(f"unknown engine {engine!r}")
    return _write_delta_rs(df, path, partition_by, app_id, app_version, schema, mode)


def _write_delta_rs(df, path, partition_by, app_id, app_ver, schema, mode) -> WriteResult:
    delta_writer.register(df.sparkSession)
    os.makedirs(path, exist_ok=True)
    with writer_result_file() as result_file:
        writer = (df.write.format(delta_writer.FORMAT_NAME).mode(mode)
                  .option("partitionBy", json.dumps(partition_by))
                  .option("resultFile", result_file))
        if schema is not None:
            writer = writer.option("arrowSchema", delta_writer.encode_schema(schema))
        if app_id is not None:
            writer = writer.option("appId", app_id).option("appVersion", str(int(app_ver)))
        writer.save(path)
        return read_writer_result(path, result_file)


def _write_delta_spark(df, path, partition_by, app_id, app_ver, schema, mode) -> WriteResult:
    writer = df.write.format("delta").mode(mode)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if app_id is not None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", str(int(app_ver)))
    before = _version_or_none(path)
    writer.save(path)
    after = _version_or_none(path)
    committed = after is not None and after != before
    return WriteResult(path, "delta-spark", committed=committed, skipped=not committed,
                       version=after, num_files=None, num_rows=None,
                       reason=None if committed else "Delta Spark skipped the write (txnAppId)")


def _version_or_none(path: str) -> int | None:
    from deltalake import DeltaTable
    return DeltaTable(path).version() if DeltaTable.is_deltatable(path) else None


def append_arrow(lake_dir: str | os.PathLike, name: str, table: pa.Table, *, partition_by: Iterable[str] = (),
                 app_id: str | None = None, app_version: int | None = None) -> WriteResult:
    """Append a small Arrow table from the driver (no Spark job) in one commit, with delta-rs.

    For tables the driver computes itself (run records, findings, lag snapshots): a Spark job per
    few rows would cost seconds. Same exactly-once rule as :func:`write_table`.
    """
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    skipped = already_recorded(lake_dir, name, app_id, app_version, "delta-rs")
    if skipped is not None:
        return skipped
    path = table_path(lake_dir, name)
    props = CommitProperties(app_transactions=[Transaction(app_id, app_version)] if app_id else None,
                             custom_metadata={"rocketlake.writer": "append_arrow"})
    write_deltalake(path, table, mode="append", partition_by=list(partition_by) or None, commit_properties=props)
    return WriteResult(path, "delta-rs", committed=True, skipped=False, version=DeltaTable(path).version(),
                       num_files=None, num_rows=table.num_rows)


def replace_arrow(lake_dir: str | os.PathLike, name: str, table: pa.Table, *, predicate: str | None = None,
                  partition_by: Iterable[str] = ()) -> WriteResult:
    """Replace the rows matching ``predicate`` (a delta-rs SQL predicate such as
    ``broker_name IN ('a', 'b')``; None: the whole table) by ``table``, in ONE commit.

    For report tables the driver recomputes in full for the brokers it was given: other brokers'
    rows stay, readers never see the table half replaced. Columns that ``table`` has and the table
    lacks (a lake written before a report gained a column) are added (schema merge).
    """
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    path = table_path(lake_dir, name)
    exists = DeltaTable.is_deltatable(path)
    write_deltalake(path, table, mode="overwrite" if exists else "append",
                    predicate=predicate if exists else None, partition_by=list(partition_by) or None,
                    schema_mode="merge" if exists else None, commit_properties=CommitProperties(custom_metadata={"rocketlake.writer": "replace_arrow"}))
    return WriteResult(path, "delta-rs", committed=True, skipped=False, version=DeltaTable(path).version(),
                       num_files=None, num_rows=table.num_rows)


def sql_string_list(values: Iterable[str]) -> str:
    """``'a', 'b'`` for an SQL ``IN (…)`` (quotes doubled)."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def scan_arrow(lake_dir: str | os.PathLike, name: str, columns: list[str] | None = None,
               filter=None) -> pa.Table:
    """Rows of the table's current snapshot as Arrow, read by the driver (pyarrow.dataset through
    deltalake: partition and file statistics prune files). ``filter`` is a ``pyarrow.compute`` expression."""
    from deltalake import DeltaTable

    path = table_path(lake_dir, name)
    dt = DeltaTable(path)
    local = dt.table_uri.startswith("file://") or "://" not in dt.table_uri
    # Local tables are read through pyarrow's own filesystem: with delta-rs's Python filesystem
    # handler (the default), pyarrow's I/O threads can still be calling into Python at interpreter
    # exit and abort the process (seen in ~10 % of runs), failing a job that had finished its work.
    filesystem = pafs.SubTreeFileSystem(os.path.abspath(os.fspath(path)), pafs.LocalFileSystem()) if local else None
    return dt.to_pyarrow_dataset(filesystem=filesystem).to_table(columns=columns, filter=filter)


def read_table(spark, lake_dir: str | os.PathLike, name: str, *, engine: str | None = None):
    """The table's current snapshot as a Spark DataFrame (columns in table order)."""
    path = table_path(lake_dir, name)
    if engine is None:
        engine = "delta-spark" if delta_spark_available(spark) else "delta-rs"
    if engine == "delta-spark":
        return spark.read.format("delta").load(path)
    from deltalake import DeltaTable
    from pyspark.sql.pandas.types import from_arrow_schema

    dt = DeltaTable(path)
    arrow_schema = pa.schema(dt.schema().to_arrow())
    spark_schema = from_arrow_schema(arrow_schema)
    if _has_deletion_vectors(dt):
        # rare for our own tables: let delta-rs apply them and hand over the rows
        return spark.createDataFrame(pa.table(dt.to_pyarrow_table()).cast(arrow_schema),
                                     schema=spark_schema)
    files = dt.file_uris()
    if not files:
        return spark.createDataFrame([], spark_schema)
    partition_cols = dt.metadata().partition_columns
    if not partition_cols:
        return spark.read.schema(spark_schema).parquet(*files).select(*arrow_schema.names)
    from urllib.parse import unquote

    root = os.fspath(dt.table_uri).removeprefix("file://").rstrip("/")
    by_values: dict[tuple, list[str]] = {}
    hive_layout = True
    for add in pa.table(dt.get_add_actions(flatten=False)).to_pylist():
        values = add.get("partition") or {}
        key = tuple(delta_writer.partition_value_string(values.get(c)) for c in partition_cols)
        rel = unquote(add["path"])
        by_values.setdefault(key, []).append(f"{root}/{rel}")
        if os.path.dirname(rel) != delta_writer.partition_dir(partition_cols, list(key)):
            hive_layout = False
    if hive_layout:
        # every file sits in its col=value directory (this writer, delta-rs, Delta Spark without
        # column mapping): one scan, Spark's partition discovery under basePath yields the values
        return (spark.read.schema(spark_schema).option("basePath", root)
                .parquet(*[f for paths in by_values.values() for f in paths])
                .select(*arrow_schema.names))
    # otherwise: one scan per partition-value tuple, values from the Delta log as typed literals
    from pyspark.sql import functions as F

    data_schema = from_arrow_schema(pa.schema([f for f in arrow_schema
                                               if f.name not in partition_cols]))
    frames = []
    for key, paths in by_values.items():
        frame = spark.read.schema(data_schema).parquet(*paths)
        for col, value in zip(partition_cols, key):
            typ = spark_schema[col].dataType
            frame = frame.withColumn(col, F.lit(value).cast(typ))
        frames.append(frame.select(*arrow_schema.names))
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def _has_deletion_vectors(dt) -> bool:
    protocol = dt.protocol()
    return "deletionVectors" in (protocol.reader_features or [])
