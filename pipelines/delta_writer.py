"""Write Delta tables from Spark without the Delta Spark jar: a Python Data Source on delta-rs.

``df.write.format("rocketlake_delta").mode("append").option(...).save(table_dir)``:

* every Spark task (``DataSourceArrowWriter.write``, on the executors) writes zstd Parquet files
  with column statistics straight into the table directory (Hive-style ``col=value`` directories for
  the partition columns, which are not stored in the files, as Delta does) and returns the Delta
  ``add`` action of each file (relative path, size, partition values, mtime, stats JSON);
* ``commit`` (driver side, in a Python worker the driver JVM starts) commits all of them as ONE Delta
  transaction through deltalake (delta-rs); ``abort`` deletes every file the job wrote.

Options (all strings):

``partitionBy``  JSON list of partition columns (default none)
``arrowSchema``  base64 of an Arrow IPC-serialised schema the rows are cast to (default: Spark's)
``appId`` / ``appVersion``  exactly-once: the commit carries the Delta ``txn`` action
                 (appId, appVersion); when the table already records a version >= appVersion for
                 the appId the job does not commit, deletes its files and reports ``skipped``
``resultFile``   where ``commit``/``abort`` write a JSON report (they run in a separate Python
                 process, so this is how the caller learns the outcome)
``customMetadata`` JSON object added to the commit info
``targetRowsPerFile`` rows after which a task starts a new file per partition (default 1,000,000)

Mode ``overwrite`` replaces the table's content in the same single transaction.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

FORMAT_NAME = "rocketlake_delta"
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
DEFAULT_ROWS_PER_FILE = 1_000_000
STATS_STRING_PREFIX = 32  # as Delta Spark: string min/max are kept up to 32 characters
ABORT_MARKER_DIR = "_rocketlake_aborted"  # <table>/_rocketlake_aborted/<job_id>: the job was aborted
ABORT_MARKER_MAX_AGE_S = 7 * 24 * 3600


# ---------------------------------------------------------------------------------------------- helpers
def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def partition_value_string(value: Any) -> str | None:
    """A partition value as the Delta protocol serialises it (``partitionValues``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, _dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        raise TypeError("binary partition columns are not supported")
    return str(value)


def partition_dir(columns: list[str], values: list[str | None]) -> str:
    """``col=value/…`` directory on disk (values percent-escaped as delta-rs does)."""
    parts = []
    for col, val in zip(columns, values):
        parts.append(f"{col}={HIVE_NULL if val is None else quote(val, safe='')}")
    return "/".join(parts)


def _stat_value(value: Any, typ: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_timestamp(typ):
        if value.tzinfo is not None:
            value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if pa.types.is_date(typ):
        return value.isoformat()
    if pa.types.is_decimal(typ):
        return float(value)
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None  # NaN / inf are not valid JSON stats
    return value


def _min_max_supported(typ: pa.DataType) -> bool:
    return (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_string(typ)
            or pa.types.is_large_string(typ) or pa.types.is_timestamp(typ) or pa.types.is_date(typ)
            or pa.types.is_boolean(typ) or pa.types.is_decimal(typ))


def _null_count_supported(typ: pa.DataType) -> bool:
    # delta-rs records nullCount for primitive columns only (not binary / nested), do the same
    return _min_max_supported(typ)


class _FileStats:
    """numRecords / minValues / maxValues / nullCount of one data file, merged batch by batch."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.num_records = 0
        self.min: dict[str, Any] = {}
        self.max: dict[str, Any] = {}
        self.nulls: dict[str, int] = {}
        self.no_minmax: set[str] = set()

    def update(self, table: pa.Table) -> None:
        self.num_records += table.num_rows
        for f in self.schema:
            if not _null_count_supported(f.type):
                continue
            col = table.column(f.name)
            self.nulls[f.name] = self.nulls.get(f.name, 0) + col.null_count
            if not _min_max_supported(f.type) or f.name in self.no_minmax:
                continue
            if col.null_count == len(col):
                continue
            if pa.types.is_floating(f.type) and pc.any(pc.is_nan(col)).as_py():
                self.no_minmax.add(f.name)  # NaN makes min/max meaningless
                self.min.pop(f.name, None)
                self.max.pop(f.name, None)
                continue
            mm = pc.min_max(col)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if f.name not in self.min or lo < self.min[f.name]:
                self.min[f.name] = lo
            if f.name not in self.max or hi > self.max[f.name]:
                self.max[f.name] = hi

    def to_json(self) -> str:
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        for f in self.schema:
            if f.name in self.min:
                lo, hi = self.min[f.name], self.max[f.name]
                if isinstance(lo, str) and len(lo) > STATS_STRING_PREFIX:
                    lo = lo[:STATS_STRING_PREFIX]  # a prefix is still a lower bound
                if isinstance(hi, str) and len(hi) > STATS_STRING_PREFIX:
                    hi = None  # a truncated max would not be an upper bound: leave it out
                lo, hi = _stat_value(lo, f.type), _stat_value(hi, f.type)
                if lo is not None:
                    mins[f.name] = lo
                if hi is not None:
                    maxs[f.name] = hi
        return json.dumps({"numRecords": self.num_records, "minValues": mins, "maxValues": maxs,
                           "nullCount": dict(self.nulls)}, separators=(",", ":"))


def _keep_views(target: pa.Schema, actual: pa.Schema) -> pa.Schema:
    """``target`` with each ``binary``/``string`` field that arrives as its ``*_view`` type kept
    as the view: casting a view column to the plain type copies every value, and Parquet stores
    both types as the same column."""
    fields = []
    for f in target:
        got = actual.field(f.name).type
        if (pa.types.is_binary(f.type) and pa.types.is_binary_view(got)) or \
                (pa.types.is_string(f.type) and pa.types.is_string_view(got)):
            f = f.with_type(got)
        fields.append(f)
    return pa.schema(fields, metadata=target.metadata)


@dataclass
class AddInfo:
    """What the driver needs to build a deltalake ``AddAction`` for one written file."""
    path: str                      # relative to the table root as on disk (delta-rs URI-encodes it)
    size: int
    partition_values: dict[str, str | None]
    modification_time: int         # epoch milliseconds
    stats: str
    num_records: int


@dataclass
class DeltaCommitMessage(WriterCommitMessage):
    job_id: str
    partition_id: int
    files: list[AddInfo] = field(default_factory=list)


def _local_path(table_dir: str, rel_path: str) -> str:
    return os.path.join(table_dir, *rel_path.split("/"))


# ------------------------------------------------------------------------------------------ data source
class RocketlakeDeltaDataSource(DataSource):
    """``format("rocketlake_delta")``: append/overwrite a Delta table through delta-rs."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def writer(self, schema, overwrite: bool) -> "DeltaArrowWriter":
        from pyspark.sql.pandas.types import to_arrow_schema

        opts = {k.lower(): v for k, v in self.options.items()}
        path = opts.get("path")
        if not path:
            raise ValueError(f"{FORMAT_NAME}: save(path) or option('path', …) is required")
        if "arrowschema" in opts:
            arrow_schema = decode_schema(opts["arrowschema"])
        else:
            arrow_schema = to_arrow_schema(schema, timezone="UTC")
        spark_names = [f.name for f in schema.fields]
        if [f.name for f in arrow_schema] != spark_names:
            missing = set(arrow_schema.names) ^ set(spark_names)
            if missing:
                raise ValueError(f"{FORMAT_NAME}: DataFrame columns {spark_names} do not match "
                                 f"the table schema {arrow_schema.names}")
        partition_by = json.loads(opts.get("partitionby") or "[]")
        for col in partition_by:
            if col not in arrow_schema.names:
                raise ValueError(f"{FORMAT_NAME}: partition column {col!r} not in the schema")
        app_id = opts.get("appid")
        app_version = opts.get("appversion")
        if (app_id is None) != (app_version is None):
            raise ValueError(f"{FORMAT_NAME}: appId and appVersion go together")
        return DeltaArrowWriter(
            table_dir=os.path.abspath(path.removeprefix("file://")),
            arrow_schema=arrow_schema,
            partition_by=list(partition_by),
            overwrite=overwrite,
            app_id=app_id,
            app_version=int(app_version) if app_version is not None else None,
            result_file=opts.get("resultfile"),
            custom_metadata=json.loads(opts["custommetadata"]) if opts.get("custommetadata") else None,
            rows_per_file=int(opts.get("targetrowsperfile") or DEFAULT_ROWS_PER_FILE),
        )


class DeltaArrowWriter(DataSourceArrowWriter):
    """Pickled to every task and to the commit/abort worker: keep it plain data."""

    def __init__(self, *, table_dir: str, arrow_schema: pa.Schema, partition_by: list[str],
                 overwrite: bool, app_id: str | None, app_version: int | None,
                 result_file: str | None, custom_metadata: dict | None, rows_per_file: int) -> None:
        self.table_dir = table_dir
        self.arrow_schema = arrow_schema
        self.partition_by = partition_by
        self.overwrite = overwrite
        self.app_id = app_id
        self.app_version = app_version
        self.result_file = result_file
        self.custom_metadata = custom_metadata
        self.rows_per_file = max(1, rows_per_file)
        self.job_id = uuid.uuid4().hex  # one per write job: names every file the job writes
        self.file_schema = pa.schema([f for f in arrow_schema if f.name not in partition_by])
        # binary columns (message bodies) get neither a dictionary attempt nor Parquet min/max:
        # both cost a hash or compare per value and never pay off for payloads
        self._not_binary = [f.name for f in self.file_schema
                            if not (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))]

    # ---------------------------------------------------------------------------------- executors
    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part_id = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        open_files: dict[tuple, tuple[pq.ParquetWriter, str, _FileStats, list[str | None]]] = {}
        done: list[AddInfo] = []
        written: list[str] = []
        counter = 0

        def close(key: tuple) -> None:
            writer, rel, stats, values = open_files.pop(key)
            writer.close()
            local = _local_path(self.table_dir, rel)
            st = os.stat(local)
            done.append(AddInfo(path=rel, size=st.st_size,
                                partition_values=dict(zip(self.partition_by, values)),
                                modification_time=int(st.st_mtime * 1000),
                                stats=stats.to_json(), num_records=stats.num_records))

        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                table = pa.Table.from_batches([batch])
                table = table.select(self.arrow_schema.names)
                table = table.cast(_keep_views(self.arrow_schema, table.schema))
                for values, piece in self._split(table):
                    key = tuple(values)
                    if key not in open_files:
                        pdir = partition_dir(self.partition_by, values) if self.partition_by else ""
                        name = f"part-{part_id:05d}-{self.job_id}-a{attempt}-c{counter:03d}.zstd.parquet"
                        counter += 1
                        rel_disk = f"{pdir}/{name}" if pdir else name
                        local = os.path.join(self.table_dir, *rel_disk.split("/"))
                        os.makedirs(os.path.dirname(local), exist_ok=True)
                        written.append(local)
                        file_schema = pa.schema([f for f in table.schema if f.name not in self.partition_by])
                        # a view column is stored as the same Parquet column as its plain type; the
                        # embedded Arrow schema would name the view type, so it is left out then
                        writer = pq.ParquetWriter(local, file_schema, compression="zstd",
                                                  use_dictionary=self._not_binary,
                                                  write_statistics=self._not_binary,
                                                  store_schema=file_schema == self.file_schema)
                        open_files[key] = (writer, rel_disk,
                                           _FileStats(self.file_schema), values)
                        # after the file exists: a task still running when the driver aborted
                        # (abort writes its marker before it scans for the job's files) sees the
                        # marker here and removes its own files
                        self._raise_if_aborted()
                    writer, _, stats, _ = open_files[key]
                    data = piece.drop_columns(self.partition_by) if self.partition_by else piece
                    if data.schema != writer.schema:
                        data = data.cast(writer.schema)
                    writer.write_table(data)
                    stats.update(data)
                    if stats.num_records >= self.rows_per_file:
                        close(key)
            for key in list(open_files):
                close(key)
            self._raise_if_aborted()
        except BaseException:
            for writer, *_ in open_files.values():
                try:
                    writer.close()
                except Exception:
                    pass
            for local in written:
                _remove_quietly(local)
            raise
        return DeltaCommitMessage(job_id=self.job_id, partition_id=part_id, files=done)

    def _split(self, table: pa.Table) -> Iterator[tuple[list[str | None], pa.Table]]:
        if not self.partition_by:
            yield [], table
            return
        keys = table.select(self.partition_by).group_by(self.partition_by).aggregate([]).to_pylist()
        if len(keys) == 1:  # the usual case (one store_date per batch): no filter, no copy
            yield [partition_value_string(keys[0][c]) for c in self.partition_by], table
            return
        for row in keys:
            mask = None
            for col in self.partition_by:
                value = row[col]
                cond = pc.is_null(table[col]) if value is None else pc.equal(table[col], pa.scalar(
                    value, type=table.schema.field(col).type))
                cond = pc.fill_null(cond, False)
                mask = cond if mask is None else pc.and_(mask, cond)
            yield [partition_value_string(row[c]) for c in self.partition_by], table.filter(mask)

    # ------------------------------------------------------------------------------------- driver
    def commit(self, messages: list[DeltaCommitMessage | None]) -> None:
        from deltalake import DeltaTable
        from deltalake.schema import Schema as DeltaSchema
        from deltalake.transaction import (AddAction, CommitProperties, Transaction,
                                           create_table_with_add_actions)

        infos = [info for m in messages if m is not None for info in m.files]
        num_rows = sum(i.num_records for i in infos)
        exists = DeltaTable.is_deltatable(self.table_dir)
        if self.app_id is not None and exists:
            seen = DeltaTable(self.table_dir).transaction_version(self.app_id)
            if seen is not None and seen >= self.app_version:
                self._delete(infos)
                self._report(committed=False, skipped=True, version=DeltaTable(self.table_dir).version(),
                             num_files=0, num_rows=0, reason=f"appId {self.app_id!r} already at "
                             f"version {seen} >= {self.app_version}")
                return
        actions = [AddAction(path=i.path, size=i.size, partition_values=i.partition_values,
                             modification_time=i.modification_time, data_change=True, stats=i.stats)
                   for i in infos]
        metadata = {"rocketlake.writer": FORMAT_NAME, "rocketlake.jobId": self.job_id}
        metadata.update(self.custom_metadata or {})
        props = CommitProperties(
            custom_metadata=metadata,
            app_transactions=[Transaction(self.app_id, self.app_version)] if self.app_id else None)
        try:
            if exists:
                DeltaTable(self.table_dir).create_write_transaction(
                    actions, "overwrite" if self.overwrite else "append", schema=self.arrow_schema,
                    partition_by=self.partition_by or None, commit_properties=props)
            else:
                create_table_with_add_actions(
                    self.table_dir, DeltaSchema.from_arrow(self.arrow_schema), actions,
                    mode="error", partition_by=self.partition_by or None, commit_properties=props)
        except BaseException:
            self._delete(infos)
            raise
        self._report(committed=True, skipped=False, version=DeltaTable(self.table_dir).version(),
                     num_files=len(infos), num_rows=num_rows)

    def abort(self, messages: list[DeltaCommitMessage | None]) -> None:
        # Spark calls abort as soon as a task fails, while other tasks of the job may still be
        # writing: mark the job aborted first (they check the marker after creating each file),
        # then delete every file of the job that exists now.
        marker_dir = os.path.join(self.table_dir, ABORT_MARKER_DIR)
        os.makedirs(marker_dir, exist_ok=True)
        with open(os.path.join(marker_dir, self.job_id), "w", encoding="utf-8") as fh:
            fh.write(f"{time.time()}\n")
        _expire_markers(marker_dir, keep=self.job_id)
        infos = [info for m in messages if m is not None for info in m.files]
        self._delete(infos)
        self._report(committed=False, skipped=False, version=None, num_files=0, num_rows=0,
                     reason="aborted: a write task failed")

    # ------------------------------------------------------------------------------------ helpers
    def _raise_if_aborted(self) -> None:
        if os.path.exists(os.path.join(self.table_dir, ABORT_MARKER_DIR, self.job_id)):
            raise RuntimeError(f"{FORMAT_NAME}: write job {self.job_id} was aborted")

    def _delete(self, infos: list[AddInfo]) -> None:
        """Remove the listed files and any other file of this job (from tasks that never reported)."""
        removed: set[str] = set()
        for info in infos:
            local = _local_path(self.table_dir, info.path)
            _remove_quietly(local)
            removed.add(os.path.dirname(local))
        if not os.path.isdir(self.table_dir):
            return
        for root, dirs, files in os.walk(self.table_dir):
            dirs[:] = [d for d in dirs if d not in ("_delta_log", ABORT_MARKER_DIR)]
            for name in files:
                if self.job_id in name:
                    _remove_quietly(os.path.join(root, name))
                    removed.add(root)
        # drop the partition directories this job left empty (rmdir refuses non-empty ones)
        top = os.path.abspath(self.table_dir)
        for d in sorted(removed, key=len, reverse=True):
            d = os.path.abspath(d)
            while d.startswith(top + os.sep):
                try:
                    os.rmdir(d)
                except OSError:
                    break
                d = os.path.dirname(d)

    def _report(self, **result: Any) -> None:
        if not self.result_file:
            return
        result["job_id"] = self.job_id
        result["time"] = time.time()
        tmp = f"{self.result_file}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
        os.replace(tmp, self.result_file)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _expire_markers(marker_dir: str, keep: str) -> None:
    now = time.time()
    for name in os.listdir(marker_dir):
        full = os.path.join(marker_dir, name)
        try:
            if name != keep and now - os.stat(full).st_mtime > ABORT_MARKER_MAX_AGE_S:
                os.remove(full)
        except OSError:
            pass


def register(spark) -> None:
    """Register the data source with a session (idempotent)."""
    from pipelines.session import register_data_source

    register_data_source(spark, RocketlakeDeltaDataSource)
