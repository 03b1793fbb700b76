"""The lake API: write and read Delta tables from Spark, with or without the Delta Spark jar.

When the Delta Spark classes are on the driver's classpath, Spark's own ``delta`` format is used;
otherwise :mod:`pipelines.delta_writer` (a Python Data Source on delta-rs) writes, and reads go
through deltalake's list of the table's current files. Either way the result is a standard Delta
table under ``<lake>/<name>``.

Where the lake is: every function taking ``lake_dir`` accepts a local path, a ``file://`` URI, a
``pyarrow.fs``/delta-rs URI such as ``s3://bucket/lake``, or a :class:`~pipelines.storage.Location`
(a URI plus storage options). Every delta-rs call gets the location's storage options
(:func:`open_table`), and Arrow reads go through the location's ``pyarrow.fs`` filesystem.

Reading a remote table into Spark (:func:`read_table`): Spark's own Parquet reader would need the
Hadoop S3A (GCS, ABFS) jars, which this project does not ship. A remote table is therefore read by
the ``rocketlake_delta_scan`` Python data source (:func:`pipelines.sources.delta.load_delta`): the
driver lists the snapshot's files with delta-rs, the executors read them through ``pyarrow.fs``
with the location's storage options (they travel as ``storage.KEY`` source options), so the read
is distributed and needs no Hadoop configuration. Local tables keep Spark's Parquet reader.

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
from pipelines.delta_commit import open_delta, skip_reason
from pipelines.delta_files import partition_dir, partition_value_string
from pipelines.storage import Location, source_options

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


def table_location(lake_dir: str | os.PathLike | Location, name: str) -> Location:
    """Where table ``name`` of the lake lives (the lake's storage options included)."""
    return Location.parse(lake_dir).child(name)


def table_path(lake_dir: str | os.PathLike | Location, name: str) -> str:
    """The table's absolute local path or URI, for messages and for callers that need a string."""
    return str(table_location(lake_dir, name))


def open_table(lake_dir: str | os.PathLike | Location, name: str):
    """The table as a ``deltalake.DeltaTable`` (storage options applied), None when it is not a
    Delta table."""
    return open_delta(table_location(lake_dir, name))


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


def table_exists(lake_dir: str | os.PathLike | Location, name: str) -> bool:
    from deltalake import DeltaTable

    table = table_location(lake_dir, name)
    return DeltaTable.is_deltatable(table.delta_uri(), storage_options=table.delta_options())


def table_version(lake_dir: str | os.PathLike | Location, name: str) -> int | None:
    """Current version of the table, None when it does not exist."""
    dt = open_table(lake_dir, name)
    return None if dt is None else dt.version()


def table_schema(lake_dir: str | os.PathLike | Location, name: str) -> pa.Schema | None:
    """The table's current schema as Arrow, None when it does not exist."""
    dt = open_table(lake_dir, name)
    return None if dt is None else pa.schema(dt.schema().to_arrow())


def app_version(lake_dir: str | os.PathLike | Location, name: str, app_id: str) -> int | None:
    """Highest ``app_version`` committed for ``app_id`` (the Delta ``txn`` action), None if none."""
    dt = open_table(lake_dir, name)
    return None if dt is None else dt.transaction_version(app_id)


def already_recorded(lake_dir: str | os.PathLike | Location, name: str, app_id: str | None,
                     app_version: int | None, engine: str) -> WriteResult | None:
    """The "skipped" result when the table already records ``app_version`` (or later) for
    ``app_id``; None when the write should go ahead. Raises when only one of the two is given."""
    if (app_id is None) != (app_version is None):
        raise ValueError("app_id and app_version go together")
    if app_id is None:
        return None
    dt = open_table(lake_dir, name)
    reason = skip_reason(dt, app_id, app_version)
    if reason is None:
        return None
    return WriteResult(table_path(lake_dir, name), engine, committed=False, skipped=True,
                       version=dt.version(), num_files=0, num_rows=0, reason=reason)


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


def result_from_outcome(path: str, outcome) -> WriteResult:
    """The WriteResult of a :class:`pipelines.delta_commit.CommitOutcome` (delta-rs engine)."""
    return WriteResult(path, "delta-rs", committed=outcome.committed, skipped=outcome.skipped,
                       version=outcome.version, num_files=outcome.num_files, num_rows=outcome.num_rows,
                       reason=outcome.reason)


def write_table(df, lake_dir: str | os.PathLike | Location, name: str, *, partition_by: Iterable[str] = (),
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
    table = table_location(lake_dir, name)
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
        return _write_delta_spark(df, table, partition_by, app_id, app_version, schema, mode)
    if engine != "delta-rs":
        raise ValueError(f"unknown engine {engine!r}")
    return _write_delta_rs(df, table, partition_by, app_id, app_version, schema, mode)


def _write_delta_rs(df, table: Location, partition_by, app_id, app_ver, schema, mode) -> WriteResult:
    delta_writer.register(df.sparkSession)
    if table.is_local:
        os.makedirs(table.uri, exist_ok=True)
    with writer_result_file() as result_file:
        writer = (df.write.format(delta_writer.FORMAT_NAME).mode(mode)
                  .option("partitionBy", json.dumps(partition_by))
                  .option("resultFile", result_file)
                  .options(**source_options(table)))
        if schema is not None:
            writer = writer.option("arrowSchema", delta_writer.encode_schema(schema))
        if app_id is not None:
            writer = writer.option("appId", app_id).option("appVersion", str(int(app_ver)))
        writer.save(table.uri)
        return read_writer_result(str(table), result_file)


def _write_delta_spark(df, table: Location, partition_by, app_id, app_ver, schema, mode) -> WriteResult:
    # Spark's delta format reaches remote URIs through Hadoop filesystems (S3A, …) and their
    # spark.hadoop.* settings, not through the location's storage options
    writer = df.write.format("delta").mode(mode)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if app_id is not None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", str(int(app_ver)))
    before = _version_or_none(table)
    writer.save(table.uri)
    after = _version_or_none(table)
    committed = after is not None and after != before
    return WriteResult(str(table), "delta-spark", committed=committed, skipped=not committed,
                       version=after, num_files=None, num_rows=None,
                       reason=None if committed else "Delta Spark skipped the write (txnAppId)")


def _version_or_none(table: Location) -> int | None:
    dt = open_delta(table)
    return None if dt is None else dt.version()


def append_arrow(lake_dir: str | os.PathLike | Location, name: str, table: pa.Table, *,
                 partition_by: Iterable[str] = (),
                 app_id: str | None = None, app_version: int | None = None) -> WriteResult:
    """Append a small Arrow table from the driver (no Spark job) in one commit, with delta-rs.

    For tables the driver computes itself (run records, findings, lag snapshots): a Spark job per
    few rows would cost seconds. Same exactly-once rule as :func:`write_table`.
    """
    from deltalake import CommitProperties, Transaction, write_deltalake

    skipped = already_recorded(lake_dir, name, app_id, app_version, "delta-rs")
    if skipped is not None:
        return skipped
    target = table_location(lake_dir, name)
    props = CommitProperties(app_transactions=[Transaction(app_id, app_version)] if app_id else None,
                             custom_metadata={"rocketlake.writer": "append_arrow"})
    write_deltalake(target.delta_uri(), table, mode="append", partition_by=list(partition_by) or None,
                    commit_properties=props, storage_options=target.delta_options())
    return WriteResult(str(target), "delta-rs", committed=True, skipped=False,
                       version=open_delta(target, missing_ok=False).version(),
                       num_files=None, num_rows=table.num_rows)


def replace_arrow(lake_dir: str | os.PathLike | Location, name: str, table: pa.Table, *,
                  predicate: str | None = None, partition_by: Iterable[str] = ()) -> WriteResult:
    """Replace the rows matching ``predicate`` (a delta-rs SQL predicate such as
    ``broker_name IN ('a', 'b')``; None: the whole table) by ``table``, in ONE commit.

    For report tables the driver recomputes in full for the brokers it was given: other brokers'
    rows stay, readers never see the table half replaced. Columns that ``table`` has and the table
    lacks (a lake written before a report gained a column) are added (schema merge).
    """
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    target = table_location(lake_dir, name)
    exists = DeltaTable.is_deltatable(target.delta_uri(), storage_options=target.delta_options())
    write_deltalake(target.delta_uri(), table, mode="overwrite" if exists else "append",
                    predicate=predicate if exists else None, partition_by=list(partition_by) or None,
                    schema_mode="merge" if exists else None, storage_options=target.delta_options(),
                    commit_properties=CommitProperties(custom_metadata={"rocketlake.writer": "replace_arrow"}))
    return WriteResult(str(target), "delta-rs", committed=True, skipped=False,
                       version=open_delta(target, missing_ok=False).version(),
                       num_files=None, num_rows=table.num_rows)


def sql_string_list(values: Iterable[str]) -> str:
    """``'a', 'b'`` for an SQL ``IN (…)`` (quotes doubled)."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def scan_arrow(lake_dir: str | os.PathLike | Location, name: str, columns: list[str] | None = None,
               filter=None) -> pa.Table:
    """Rows of the table's current snapshot as Arrow, read by the driver (pyarrow.dataset through
    deltalake: partition and file statistics prune files). ``filter`` is a ``pyarrow.compute`` expression."""
    table = table_location(lake_dir, name)
    return _scan(open_delta(table, missing_ok=False), table, columns, filter)


def _scan(dt, table: Location, columns: list[str] | None = None, filter=None) -> pa.Table:
    # Files are read through the location's pyarrow filesystem: with delta-rs's Python filesystem
    # handler (the default), pyarrow's I/O threads can still be calling into Python at interpreter
    # exit and abort the process (seen in ~10 % of runs), failing a job that had finished its work.
    fs, root = table.filesystem()
    return dt.to_pyarrow_dataset(filesystem=pafs.SubTreeFileSystem(root, fs)).to_table(columns=columns, filter=filter)


def read_table(spark, lake_dir: str | os.PathLike | Location, name: str, *, engine: str | None = None):
    """The table's current snapshot as a Spark DataFrame (columns in table order). A remote table
    is read through the ``rocketlake_delta_scan`` source (see the module doc)."""
    table = table_location(lake_dir, name)
    if engine is None:
        engine = "delta-spark" if delta_spark_available(spark) else "delta-rs"
    if engine == "delta-spark":
        return spark.read.format("delta").load(table.uri)
    from pyspark.sql.pandas.types import from_arrow_schema

    if not table.is_local:
        from pipelines.sources.delta import load_delta

        open_delta(table, missing_ok=False)  # the same error as locally when there is no table
        return load_delta(spark, table)
    dt = open_delta(table, missing_ok=False)
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
        key = tuple(partition_value_string(values.get(c)) for c in partition_cols)
        rel = unquote(add["path"])
        by_values.setdefault(key, []).append(f"{root}/{rel}")
        if os.path.dirname(rel) != partition_dir(partition_cols, list(key)):
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
