"""Read a Delta table from Spark through delta-rs, without the Delta Spark jar (a Python Data Source).

``spark.read.format("rocketlake_delta_scan").load(TABLE_DIR)`` — or, better, :func:`load_delta`
(see "Plans" below). The table directory may also be a ``file://`` URI or a remote one
(``s3://bucket/lake/messages``, anything :class:`pipelines.storage.Location` reaches).

Remote tables: the storage options (endpoint, credentials; delta-rs names such as
``AWS_ENDPOINT_URL``) are source options ``storage.<KEY>`` (see
:func:`pipelines.storage.source_options`; :func:`load_delta` sets them from a Location). The driver
opens the log with delta-rs and those options; every input partition carries them, so each
executor reads its files through its own ``pyarrow.fs`` filesystem (ranged reads of footers and
column chunks, no download of whole files) and needs no environment or Hadoop configuration of its
own. Spark's ``spark.redaction.regex`` (``secret``, ``token``, ``access.key``, …) keeps the secret
ones out of plans and the UI.

What comes from the Delta log (deltalake reads it; this module never parses JSON itself):

* the schema (``DeltaTable.schema().to_arrow()``, converted by PySpark's own
  ``from_arrow_schema``), the current snapshot's data files, their partition values (typed), sizes
  and statistics (``get_add_actions(flatten=True)``: ``num_records``, ``null_count``/``min``/``max``);
* files are grouped into input partitions by size the way Spark groups files
  (``maxPartitionBytes``, ``openCostInBytes``, ``minPartitions`` options);
* each task reads its Parquet files with pyarrow, adds the partition columns from the log with
  their exact types, casts to the declared schema and yields Arrow batches.

Filter pushdown: comparisons, ``IN``, ``IS [NOT] NULL`` and ``STARTSWITH`` on partition columns
(exact values) and on columns with min/max statistics (ints, strings, dates, timestamps, booleans)
drop files that cannot hold a matching row. Every filter is still handed back to Spark, so pruning
can only cost speed, never rows. Floats/decimals are not pruned (NaN ordering), nor is anything
under ``NOT``.

Column projection: PySpark 4.2.0's Python Data Source API has no column-pruning hook (its
``PythonScanBuilder`` implements only ``SupportsPushDownFilters``; ``reader(schema)`` always gets
the full declared schema), so every declared column is read. A caller who wants fewer columns
declares them: ``spark.read.format(...).schema("topic STRING, commitlog_offset BIGINT").load(p)``
reads only those columns from the files.

Reader features: when the table needs something the direct file read would get wrong — column
mapping (physical column names), deletion vectors on any current file, or a reader feature this
module does not know — the whole scan falls back to delta-rs's own engine
(``DeltaTable.scan()``, which honours column mapping and deletion vectors) in one task. Note that
``DeltaTable.to_pyarrow_dataset()`` is *not* a safe fallback: deltalake 1.6.6 returns nulls for
column-mapped tables.

Plans (why :func:`load_delta` exists): PySpark 4.2.0 caches the planned read (partitions + pickled
reader) on the relation's ``PythonDataSourceV2`` and reuses it for any later query on the same
DataFrame that pushes no filter — such a query would get the file list (snapshot *and* pruning) of
an earlier query. :func:`load_delta` adds a guard: the source declares an extra always-null column
``_rocketlake_plan_guard`` (option ``planGuard``), and the DataFrame is
``load(...).where(guard IS NULL).drop(guard)``. Every query on it, and on views over it, therefore
pushes at least that filter, which makes Spark plan the read afresh: the snapshot is the table's
version when the query is planned (new commits show up) and no query ever reads with another
query's pruning. Without the guard, filter pushdown is off unless ``pushFilters`` is ``true``
(same caveat as :mod:`pipelines.sources.rocketmq`). Residual gap: two queries planned at the same
instant on the *same* DataFrame/view share the relation object, and the second plan could
overwrite the first's between Spark's optimizer and physical planning (milliseconds); Spark fixes
this upstream by scoping the read to the scan.

Options: ``path``; ``storage.<KEY>`` (storage options); ``versionAsOf`` (time travel); ``planGuard``;
``pushFilters``; ``maxPartitionBytes`` (default 128 MiB); ``openCostInBytes`` (default 4 MiB); ``minPartitions``
(default 1; :func:`load_delta` passes Spark's default parallelism).
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence
from urllib.parse import unquote, urlparse

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from pipelines.sources.options import opt_bool, opt_int
from pipelines.storage import Location, location_from_source_options, source_options

log = logging.getLogger(__name__)

FORMAT_NAME = "rocketlake_delta_scan"  # "rocketlake_delta" is the writer (pipelines.delta_writer)
GUARD_COLUMN = "_rocketlake_plan_guard"
DEFAULT_MAX_PARTITION_BYTES = 128 << 20
DEFAULT_OPEN_COST_BYTES = 4 << 20
BATCH_ROWS = 64 * 1024
# reader features a plain Parquet read honours (typeWidening: files hold narrower types, the cast
# to the table type widens them); columnMapping and deletionVectors are checked case by case
SAFE_READER_FEATURES = frozenset({"timestampNtz", "typeWidening", "typeWidening-preview",
                                  "vacuumProtocolCheck", "v2Checkpoint"})
# timestamps statistics may be truncated to milliseconds (Delta Spark writes them so): widen max
_TS_MAX_SLACK_US = 1000


# ---- options and paths ---------------------------------------------------------------------------



StorageOptions = tuple[tuple[str, str], ...]  # as they travel in partitions (hashable, picklable)


def source_location(options) -> Location:
    """The ``path`` option (a local path, ``file://`` or remote URI) with the ``storage.*`` options."""
    path = options.get("path")
    if not path:
        raise ValueError(f"{FORMAT_NAME}: no table path: use .load(TABLE_DIR) or .option('path', TABLE_DIR)")
    return location_from_source_options(str(path), options)


def _open_table(location: Location, version: int | None):
    from deltalake import DeltaTable

    uri, storage = location.delta_uri(), location.delta_options()
    if not DeltaTable.is_deltatable(uri, storage_options=storage):
        raise ValueError(f"{FORMAT_NAME}: {location} is not a Delta table (no _delta_log/)")
    return DeltaTable(uri, version=version, storage_options=storage)


def table_arrow_schema(dt) -> pa.Schema:
    """The table's logical schema (column order of the log) as Arrow."""
    return pa.schema(dt.schema().to_arrow())


# ---- what the log says about the files -----------------------------------------------------------

@dataclass(frozen=True)
class DataFile:
    """One ``add`` action: where the file is and what the log knows about it."""

    path: str                                   # absolute local path or URI
    size: int
    partition_values: tuple[tuple[str, Any], ...]  # (column, typed value), from the log
    num_records: int | None = None
    stats: tuple[tuple[str, Any, Any, int | None], ...] = ()  # (column, min, max, null_count)


@dataclass(frozen=True)
class FileGroup(InputPartition):
    """The files one Spark task reads (``storage``: the table's storage options, for remote files)."""

    files: tuple[DataFile, ...]
    storage: StorageOptions = ()

    @property
    def value(self):  # InputPartition's attribute (repr/debugging)
        return [f.path for f in self.files]


@dataclass(frozen=True)
class DeltaRsScan(InputPartition):
    """The whole snapshot, materialised by delta-rs (column mapping, deletion vectors, …)."""

    location: str
    version: int
    reason: str
    storage: StorageOptions = ()

    @property
    def value(self):
        return (self.location, self.version, self.reason)


def needs_delta_rs(protocol, configuration: dict[str, str] | None,
                   has_deletion_vectors=lambda: False) -> str | None:
    """Why a direct Parquet read would be wrong for this snapshot, or None when it is fine.

    ``has_deletion_vectors`` is only called when the protocol allows deletion vectors."""
    features = set(protocol.reader_features or [])
    mode = (configuration or {}).get("delta.columnMapping.mode", "none")
    if mode not in (None, "", "none"):
        return f"column mapping mode {mode!r}"
    if protocol.min_reader_version > 3:
        return f"reader version {protocol.min_reader_version}"
    unknown = features - SAFE_READER_FEATURES - {"columnMapping", "deletionVectors"}
    if unknown:
        return f"reader features {sorted(unknown)}"
    if "deletionVectors" in features and has_deletion_vectors():
        return "deletion vectors"
    return None


def _dv_present(dt) -> bool:
    reader = dt.deletion_vectors()
    return any(batch.num_rows for batch in pa.RecordBatchReader.from_stream(reader))


def _table_root(dt) -> str:
    uri = str(dt.table_uri).rstrip("/")
    if uri.startswith("file:"):
        return unquote(urlparse(uri).path).rstrip("/") or "/"
    return uri


def data_files(dt, arrow_schema: pa.Schema) -> list[DataFile]:
    """The current snapshot's files with typed partition values and min/max/null statistics."""
    adds = pa.table(dt.get_add_actions(flatten=True))
    root = _table_root(dt)
    partition_cols = list(dt.metadata().partition_columns)
    names = set(adds.column_names)
    stat_cols = [f.name for f in arrow_schema
                 if f.name not in partition_cols and _stat_kind(f.type) is not None]
    columns = {n: adds.column(n).to_pylist() for n in names
               if n in ("path", "size_bytes", "num_records") or n.startswith(("partition.", "min.", "max.", "null_count."))}
    out = []
    for i in range(adds.num_rows):
        rel = columns["path"][i]
        path = rel if urlparse(rel).scheme else f"{root}/{unquote(rel)}"
        values = tuple((c, columns[f"partition.{c}"][i] if f"partition.{c}" in columns else None)
                       for c in partition_cols)
        stats = tuple((c, _get(columns, f"min.{c}", i), _get(columns, f"max.{c}", i),
                       _get(columns, f"null_count.{c}", i)) for c in stat_cols)
        num = columns["num_records"][i] if "num_records" in columns else None
        out.append(DataFile(path, int(columns["size_bytes"][i]), values, num, stats))
    out.sort(key=lambda f: f.path)
    return out


def _get(columns: dict, name: str, i: int):
    col = columns.get(name)
    return None if col is None else col[i]


# ---- file pruning ----------------------------------------------------------------------------------

def _stat_kind(t: pa.DataType) -> str | None:
    """Types whose min/max order is Spark's order (no NaN, binary string collation)."""
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "ts"
    if pa.types.is_boolean(t):
        return "bool"
    return None


def _epoch_us(value: _dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    delta = value - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _key(value: Any, kind: str) -> Any:
    """A comparable form of a filter literal or statistic, None when it does not fit the column."""
    if value is None:
        return None
    if kind == "int":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if kind == "str":
        return value if isinstance(value, str) else None
    if kind == "date":
        return value if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime) else None
    if kind == "ts":
        return _epoch_us(value) if isinstance(value, _dt.datetime) else None
    return None


@dataclass(frozen=True)
class ColumnFacts:
    """What is known about one column's values in one file: bounds (inclusive), null counts."""

    kind: str
    lo: Any = None
    hi: Any = None
    null_count: int | None = None
    num_records: int | None = None

    @property
    def all_null(self) -> bool:
        return self.null_count is not None and self.num_records is not None and self.null_count >= self.num_records


def might_match(f: Filter, facts: ColumnFacts) -> bool:
    """False only when no row of the file can satisfy ``f`` (SQL semantics: NULL never compares)."""
    if isinstance(f, IsNull) or (isinstance(f, EqualNullSafe) and f.value is None):
        return facts.null_count is None or facts.null_count > 0
    if isinstance(f, IsNotNull):
        return not facts.all_null
    if facts.all_null:
        return False  # every other pushed filter is false or unknown on NULL
    lo, hi = facts.lo, facts.hi
    if isinstance(f, (EqualTo, EqualNullSafe)):
        v = _key(f.value, facts.kind)
        return v is None or not ((lo is not None and v < lo) or (hi is not None and v > hi))
    if isinstance(f, In):
        values = [_key(v, facts.kind) for v in f.value if v is not None]
        if any(v is None for v in values):
            return True
        return any(not ((lo is not None and v < lo) or (hi is not None and v > hi)) for v in values)
    if isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
        v = _key(f.value, facts.kind)
        if v is None:
            return True
        if isinstance(f, GreaterThan):
            return hi is None or hi > v
        if isinstance(f, GreaterThanOrEqual):
            return hi is None or hi >= v
        if isinstance(f, LessThan):
            return lo is None or lo < v
        return lo is None or lo <= v
    if isinstance(f, StringStartsWith) and facts.kind == "str" and isinstance(f.value, str):
        p = f.value
        return not ((lo is not None and lo[:len(p)] > p) or (hi is not None and hi[:len(p)] < p))
    return True


def _column(f: Filter) -> str | None:
    attr = getattr(f, "attribute", None)
    return attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None


def file_facts(file: DataFile, column: str, kinds: dict[str, str]) -> ColumnFacts | None:
    """What the log says about ``column`` in ``file`` (None when it says nothing usable)."""
    kind = kinds.get(column)
    if kind is None:
        return None
    for name, value in file.partition_values:
        if name == column:
            if value is None:
                return ColumnFacts(kind, null_count=1, num_records=1)
            key = _key(value, kind)
            return None if key is None else ColumnFacts(kind, key, key, 0, 1)
    for name, lo, hi, nulls in file.stats:
        if name == column:
            lo_k, hi_k = _key(lo, kind), _key(hi, kind)
            if kind == "ts" and hi_k is not None:
                hi_k += _TS_MAX_SLACK_US
            return ColumnFacts(kind, lo_k, hi_k, nulls, file.num_records)
    return None


def prune(files: Sequence[DataFile], filters: Sequence[Filter], arrow_schema: pa.Schema) -> list[DataFile]:
    """The files that may hold rows satisfying every filter (the filters are ANDed)."""
    kinds = {f.name: k for f in arrow_schema if (k := _stat_kind(f.type)) is not None}
    usable = [(f, c) for f in filters if (c := _column(f)) in kinds]
    if not usable:
        return list(files)
    kept = []
    for file in files:
        ok = True
        for f, col in usable:
            facts = file_facts(file, col, kinds)
            if facts is not None and not might_match(f, facts):
                ok = False
                break
        if ok:
            kept.append(file)
    return kept


def group_files(files: Sequence[DataFile], max_bytes: int, open_cost: int, min_partitions: int) -> list[tuple[DataFile, ...]]:
    """Spark's file packing: split size from the total, biggest files first, next-fit bins."""
    if not files:
        return []
    total = sum(f.size + open_cost for f in files)
    split = min(max_bytes, max(open_cost, total // max(1, min_partitions)))
    groups: list[list[DataFile]] = []
    current: list[DataFile] = []
    size = 0
    for f in sorted(files, key=lambda f: (-f.size, f.path)):
        if current and size + f.size > split:
            groups.append(current)
            current, size = [], 0
        current.append(f)
        size += f.size + open_cost
    if current:
        groups.append(current)
    return [tuple(sorted(g, key=lambda f: f.path)) for g in groups]


# ---- the plan -----------------------------------------------------------------------------------

@dataclass
class ScanPlan:
    """What a query reads: the version, the files kept after pruning, and the task grouping."""

    version: int
    total_files: int
    files: list[DataFile] = field(default_factory=list)
    partitions: list[InputPartition] = field(default_factory=list)
    delta_rs_reason: str | None = None


def plan_scan(location: str | os.PathLike | Location, *, version: int | None = None, filters: Sequence[Filter] = (),
              max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
              open_cost: int = DEFAULT_OPEN_COST_BYTES, min_partitions: int = 1,
              columns: Sequence[str] = ()) -> ScanPlan:
    """Resolve the snapshot (latest unless ``version``) and plan the read. Called by
    :meth:`DeltaReader.partitions` at query planning; usable directly to see what a filter prunes.
    ``columns``: names the caller will read (an unknown one is an error, not a null column).
    ``location``: a path or URI, or a Location with the storage options of a remote table."""
    location = Location.parse(location)
    dt = _open_table(location, version)
    snapshot = dt.version()
    schema = table_arrow_schema(dt)
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise ValueError(f"{FORMAT_NAME}: {location} v{snapshot} has no column(s) {unknown}")
    reason = needs_delta_rs(dt.protocol(), dt.metadata().configuration, lambda: _dv_present(dt))
    if reason is not None:
        log.info("%s v%d: reading through delta-rs (%s)", location, snapshot, reason)
        return ScanPlan(snapshot, -1, [], [DeltaRsScan(location.uri, snapshot, reason, location.options)], reason)
    files = data_files(dt, schema)
    kept = prune(files, filters, schema)
    groups = group_files(kept, max_partition_bytes, open_cost, min_partitions)
    log.info("%s v%d: %d of %d files in %d partitions", location, snapshot, len(kept), len(files), len(groups))
    return ScanPlan(snapshot, len(files), kept, [FileGroup(g, location.options) for g in groups])


# ---- reading (executors) ---------------------------------------------------------------------------

def _filesystem(path: str, storage: StorageOptions = ()):
    """(pyarrow filesystem, path inside it) for a data file: a local path, or a URI whose
    filesystem is that of its bucket (``scheme://netloc``) with the table's storage options, so
    one filesystem per bucket and process serves every file (:class:`Location` caches it)."""
    from pyarrow import fs as pafs

    if not urlparse(path).scheme or os.path.isabs(path):
        return pafs.LocalFileSystem(), path
    scheme, _, rest = path.partition("://")
    if scheme.lower() == "file":
        return pafs.LocalFileSystem(), unquote(urlparse(path).path)
    netloc, _, inner = rest.partition("/")
    # the storage options were resolved on the driver: taken as they are, no executor environment
    fs, base = Location(f"{scheme}://{netloc}", storage).filesystem()
    return fs, f"{base.rstrip('/')}/{inner}"


def _constant(value: Any, typ: pa.DataType, n: int) -> pa.Array:
    """A partition value (typed by deltalake from the log) repeated as a column of ``typ``."""
    if value is None:
        return pa.nulls(n, typ)
    try:
        return pa.repeat(pa.scalar(value, typ), n)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. a widened type: convert, then cast
        return pa.repeat(pa.scalar(value), n).cast(typ)


def _column_as(array: pa.Array | pa.ChunkedArray, typ: pa.DataType) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array if array.type.equals(typ) else array.cast(typ)


def read_file(file: DataFile, target: pa.Schema, skip: frozenset[str] = frozenset(),
              storage: StorageOptions = ()) -> Iterator[pa.RecordBatch]:
    """``target`` batches of one data file: file columns cast, partition values from the log,
    columns the file lacks (added to the table later) and ``skip`` columns as nulls. ``storage``:
    the storage options of a remote file."""
    import pyarrow.parquet as pq

    filesystem, path = _filesystem(file.path, storage)
    partition = dict(file.partition_values)
    with filesystem.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        in_file = set(pf.schema_arrow.names)
        wanted = [f.name for f in target if f.name in in_file and f.name not in partition and f.name not in skip]
        if wanted:
            batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=wanted, use_threads=False)
        else:  # only partition/null columns declared: the row counts are enough
            batches = _row_counts(pf.metadata.num_rows)
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            arrays = []
            for f in target:
                if f.name in partition:
                    arrays.append(_constant(partition[f.name], f.type, n))
                elif f.name in skip or f.name not in in_file or not wanted:
                    arrays.append(pa.nulls(n, f.type))
                else:
                    arrays.append(_column_as(batch.column(f.name), f.type))
            yield pa.RecordBatch.from_arrays(arrays, schema=target)


class _Rows:
    """A stand-in batch that only has a row count."""

    def __init__(self, n: int) -> None:
        self.num_rows = n


def _row_counts(n: int) -> Iterator[_Rows]:
    for start in range(0, n, BATCH_ROWS):
        yield _Rows(min(BATCH_ROWS, n - start))


def read_with_delta_rs(scan: DeltaRsScan, target: pa.Schema, skip: frozenset[str] = frozenset()) -> Iterator[pa.RecordBatch]:
    """``target`` batches of the snapshot as delta-rs's engine reads it (it applies column mapping
    and deletion vectors)."""
    dt = _open_table(Location(scan.location, scan.storage), scan.version)
    present = set(table_arrow_schema(dt).names)
    wanted = [f.name for f in target if f.name in present and f.name not in skip]
    reader = pa.RecordBatchReader.from_stream(dt.scan(columns=wanted or None))
    for batch in reader:
        n = batch.num_rows
        if n == 0:
            continue
        arrays = [_column_as(batch.column(f.name), f.type) if f.name in wanted else pa.nulls(n, f.type)
                  for f in target]
        yield pa.RecordBatch.from_arrays(arrays, schema=target)


# ---- the data source --------------------------------------------------------------------------------

class DeltaReader(DataSourceReader):
    """Plans (driver-side worker) and reads (executors). Pickled after ``pushFilters``, before
    ``partitions()``: everything a task needs travels in its partition."""

    def __init__(self, options, schema) -> None:
        self.location = source_location(options)
        self.version = opt_int(options, "versionAsOf", None, FORMAT_NAME)
        self.guard = opt_bool(options, "planGuard", False)
        self.push_enabled = opt_bool(options, "pushFilters", self.guard)
        self.max_partition_bytes = opt_int(options, "maxPartitionBytes", DEFAULT_MAX_PARTITION_BYTES, FORMAT_NAME)
        self.open_cost = opt_int(options, "openCostInBytes", DEFAULT_OPEN_COST_BYTES, FORMAT_NAME)
        self.min_partitions = max(1, opt_int(options, "minPartitions", 1, FORMAT_NAME))
        if self.max_partition_bytes <= 0 or self.open_cost < 0:
            raise ValueError(f"{FORMAT_NAME}: maxPartitionBytes must be > 0 and openCostInBytes >= 0")
        self.schema = schema  # Spark StructType; the Arrow form is built where it is used
        self.filters: list[Filter] = []

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if self.guard and isinstance(f, IsNull) and _column(f) == GUARD_COLUMN:
                continue  # always true: the guard column is always null
            if self.push_enabled:
                self.filters.append(f)  # prunes files; Spark still evaluates it
            yield f

    def partitions(self) -> list[InputPartition]:
        plan = plan_scan(self.location, version=self.version, filters=self.filters,
                         max_partition_bytes=self.max_partition_bytes, open_cost=self.open_cost,
                         min_partitions=self.min_partitions,
                         columns=[n for n in self.schema.fieldNames() if not (self.guard and n == GUARD_COLUMN)])
        return plan.partitions or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(self.schema, timezone="UTC")  # exactly what the worker checks
        skip = frozenset({GUARD_COLUMN}) if self.guard else frozenset()
        if isinstance(partition, DeltaRsScan):
            return read_with_delta_rs(partition, target, skip)
        if isinstance(partition, FileGroup):
            return (batch for file in partition.files for batch in read_file(file, target, skip, partition.storage))
        return iter(())


class DeltaDataSource(DataSource):
    """``spark.read.format("rocketlake_delta_scan").load(TABLE_DIR)``: a Delta table via delta-rs."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema
        from pyspark.sql.types import BooleanType, StructField

        location = source_location(self.options)
        dt = _open_table(location, opt_int(self.options, "versionAsOf", None, FORMAT_NAME))
        schema = from_arrow_schema(table_arrow_schema(dt))
        if opt_bool(self.options, "planGuard", False):
            if GUARD_COLUMN in schema.fieldNames():
                raise ValueError(f"{FORMAT_NAME}: table {location} has a column named {GUARD_COLUMN}")
            schema = schema.add(StructField(GUARD_COLUMN, BooleanType(), True))
        return schema

    def reader(self, schema) -> DataSourceReader:
        return DeltaReader(self.options, schema)


def register(spark) -> None:
    """Register the format with a session, and the filter pushdown it relies on."""
    if str(spark.conf.get("spark.sql.python.filterPushdown.enabled", "false")).lower() != "true":
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    from pipelines.session import register_data_source

    register_data_source(spark, DeltaDataSource)


def load_delta(spark, path: str | os.PathLike | Location, **options: Any):
    """The table as a DataFrame whose every query plans its read afresh (see "Plans" above):
    latest snapshot at planning time, filter pushdown on. ``path``: a local path, a URI, or a
    Location whose storage options go along. Extra ``options`` go to the source."""
    from pyspark.sql import functions as F

    register(spark)
    location = Location.parse(path)
    opts = {"minPartitions": str(spark.sparkContext.defaultParallelism), **source_options(location),
            **{k: str(v) for k, v in options.items()}}
    opts["planGuard"] = "true"
    reader = spark.read.format(FORMAT_NAME)
    for key, value in opts.items():
        reader = reader.option(key, value)
    return reader.load(location.uri).where(F.col(GUARD_COLUMN).isNull()).drop(GUARD_COLUMN)
