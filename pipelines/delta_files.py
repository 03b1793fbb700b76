"""Write a Delta table's data files: Parquet through the table's filesystem, one ``add`` action each.

The first half of a Delta write, shaped as delta-rs shapes its own writer (write files, then commit;
the commit is :mod:`pipelines.delta_commit`). Files go through ``pyarrow.fs`` output streams of the
table's :class:`~pipelines.storage.Location`, so the same code writes a local directory and
``s3://…`` (and whatever else ``pyarrow.fs`` reaches); a task only needs the pickled Location.

Layout: Hive-style ``col=value`` directories for the partition columns, which are not stored in
the files (as Delta does); values percent-escaped as delta-rs escapes them, null as
``__HIVE_DEFAULT_PARTITION__``.

Statistics: each file's ``add`` carries ``numRecords`` / ``minValues`` / ``maxValues`` /
``nullCount`` read from the footer the Parquet writer just produced (its row-group statistics),
not recomputed from the rows. The rules of the Delta log are applied on top:

* string ``minValues`` keep a 32-character prefix (still a lower bound); a ``maxValues`` longer
  than 32 characters is left out (a truncated max would not be an upper bound);
* binary and nested columns get neither min/max nor nullCount;
* timestamps as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC), dates ISO, decimals as numbers;
* a float column holding NaN gets no min/max (Parquet leaves NaN out of its min/max, so the
  footer cannot say; the writer notes NaN per file while writing, float columns only);
* Parquet drops a column chunk's min/max when a value is longer than 4096 bytes; for such row
  groups (strings only) the column is read back from the file just written, so the log still
  says what it would have said.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import posixpath
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines import local_writes
from pipelines.storage import Location

log = logging.getLogger(__name__)

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
DEFAULT_ROWS_PER_FILE = 1_000_000
STATS_STRING_PREFIX = 32  # as Delta Spark: string min/max are kept up to 32 characters


# ------------------------------------------------------------------------------------ writer properties
def _is_binary(typ: pa.DataType) -> bool:
    return pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_binary_view(typ)


BODY_CODEC = "snappy"  # payload columns: ~2x zstd-1's encoding speed, ~30 % larger on JSON-like bodies
COLUMN_CODEC = "zstd"  # every other column: small, and zstd shrinks them best


def _is_string(typ: pa.DataType) -> bool:
    return pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)


def _leaf_values(array: pa.Array, path: str) -> Iterator[tuple[str, pa.Array]]:
    """(Parquet column path, values) of each leaf of ``array``, named as pyarrow names them
    (``m.key_value.key``, ``l.list.element``): a per-column option dict must name leaves, and a leaf
    it leaves out of ``compression`` would be written uncompressed."""
    typ = array.type
    if pa.types.is_map(typ):
        yield from _leaf_values(array.keys, path + ".key_value.key")
        yield from _leaf_values(array.items, path + ".key_value.value")
    elif pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        yield from _leaf_values(array.flatten(), path + ".list.element")
    elif pa.types.is_struct(typ):
        for i, child in enumerate(typ):
            yield from _leaf_values(array.field(i), path + "." + child.name)
    else:
        yield path, array


def _leaf_columns(field: pa.Field) -> Iterator[tuple[str, pa.DataType]]:
    """(Parquet column path, type) of each leaf of a column (:func:`_leaf_values` of no rows)."""
    for path, values in _leaf_values(pa.array([], field.type), field.name):
        yield path, values.type


DICTIONARY_MAX_DISTINCT_SHARE = 0.1  # a string column gets a dictionary when at most this share is distinct
# rows of the sample judged: enough to tell mostly-repeated from nearly-unique values, and a fixed
# cost per task instead of one growing with the first batch (32,768 rows of every string leaf,
# property names and values included, cost ~5 % of an ingest task's CPU)
DICTIONARY_SAMPLE_ROWS = 4096


def dictionary_columns(sample: pa.Table) -> list[str]:
    """The string leaves worth a dictionary, judged on ``sample`` (the first rows a file gets).

    Why: a dictionary pays for low-cardinality strings (topics, hosts, tags, property names) and is
    pure cost for nearly unique ones (message ids, keys, property values): every value is hashed into
    a dictionary as large as the data, then written twice. Measured on the messages table, one 128 MiB
    split: 10 % less encoding time for the non-body columns and slightly smaller files. Only the
    first :data:`DICTIONARY_SAMPLE_ROWS` rows are looked at."""
    sample = sample.slice(0, DICTIONARY_SAMPLE_ROWS)
    wanted = []
    for f in sample.schema:
        column = sample.column(f.name)
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        for path, values in _leaf_values(array, f.name):
            if pa.types.is_dictionary(values.type):  # encoded already (a task's constant)
                wanted.append(path)
                continue
            if not _is_string(values.type):
                continue
            n = len(values) - values.null_count
            # pc.unique: half count_distinct's CPU here; it counts a null as one value of its own
            distinct = len(pc.unique(values)) - (1 if values.null_count else 0)
            if n == 0 or distinct <= DICTIONARY_MAX_DISTINCT_SHARE * n:
                wanted.append(path)
    return wanted


def parquet_writer_options(file_schema: pa.Schema, sample: pa.Table | None = None) -> dict[str, Any]:
    """The Parquet writer properties of every data file (``pq.ParquetWriter`` keyword arguments):
    THE place to trade encoding speed against file size.

    Measured on 128 MiB commitlog splits of 1 KiB messages (benchmarks/ingest.py's store), one core:
    encoding was half of a task; bodies in snappy instead of zstd level 1 and dictionaries only on
    string columns (integers and timestamps are nearly unique per row, so the dictionary attempt
    was wasted) cut the messages file's encoding from ~450 to ~290 ms per split, for files ~30 %
    larger. With ``sample`` (the file's first rows), only the string columns that are mostly
    repeats get a dictionary (:func:`dictionary_columns`). Binary columns (message bodies) get
    neither a dictionary nor statistics: both cost a hash or a compare per value and never pay off
    for payloads. Statistics are written for exactly the columns the Delta log takes them for
    (:func:`footer_stats`): nested columns (properties maps, key lists) get none (a small saving,
    within this machine's noise). The ``add`` statistics come from this writer's footer, so a
    column left out of ``write_statistics`` gets no min/max/nullCount in the Delta log either. Spark 4, DuckDB and
    delta-rs read these files as any others."""
    leaves = [leaf for f in file_schema for leaf in _leaf_columns(f)]
    with_stats = [f.name for f in file_schema if _min_max_supported(f.type)]
    strings = [p for p, t in leaves if _is_string(t)]
    if sample is not None:
        chosen = set(dictionary_columns(sample.select([f.name for f in file_schema])))
        strings = [p for p in strings if p in chosen]
    return {"compression": {p: BODY_CODEC if _is_binary(t) else COLUMN_CODEC for p, t in leaves},
            "use_dictionary": strings,
            "write_statistics": with_stats}


# ------------------------------------------------------------------------------------ partitions
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
    """``col=value/…`` directory (values percent-escaped as delta-rs does)."""
    parts = []
    for col, val in zip(columns, values):
        parts.append(f"{col}={HIVE_NULL if val is None else quote(val, safe='')}")
    return "/".join(parts)


def split_by_partition(table: pa.Table, partition_by: list[str]) -> Iterator[tuple[list[str | None], pa.Table]]:
    """``(partition values as strings, rows)`` for each distinct partition-value tuple of ``table``."""
    if not partition_by:
        yield [], table
        return
    keys = table.select(partition_by).group_by(partition_by).aggregate([]).to_pylist()
    if len(keys) == 1:  # the usual case (one store_date per batch): no filter, no copy
        yield [partition_value_string(keys[0][c]) for c in partition_by], table
        return
    for row in keys:
        mask = None
        for col in partition_by:
            value = row[col]
            cond = pc.is_null(table[col]) if value is None else pc.equal(table[col], pa.scalar(
                value, type=table.schema.field(col).type))
            cond = pc.fill_null(cond, False)
            mask = cond if mask is None else pc.and_(mask, cond)
        yield [partition_value_string(row[c]) for c in partition_by], table.filter(mask)


def keep_encodings(target: pa.Schema, actual: pa.Schema) -> pa.Schema:
    """``target`` with each ``binary``/``string`` field that arrives as its ``*_view`` type, and each
    ``string`` field that arrives dictionary-encoded, kept that way: casting to the plain type
    copies every value, and Parquet stores all of them as the same column (a dictionary array is
    written as its dictionary and indices, without hashing every value)."""
    fields = []
    for f in target:
        got = actual.field(f.name).type
        if (pa.types.is_binary(f.type) and pa.types.is_binary_view(got)) or \
                (pa.types.is_string(f.type) and pa.types.is_string_view(got)) or \
                (pa.types.is_string(f.type) and pa.types.is_dictionary(got) and got.value_type == f.type):
            f = f.with_type(got)
        fields.append(f)
    return pa.schema(fields, metadata=target.metadata)


# ------------------------------------------------------------------------------------ statistics
def _min_max_supported(typ: pa.DataType) -> bool:
    return (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_string(typ)
            or pa.types.is_large_string(typ) or pa.types.is_timestamp(typ) or pa.types.is_date(typ)
            or pa.types.is_boolean(typ) or pa.types.is_decimal(typ))


def _stat_value(value: Any, typ: pa.DataType) -> Any:
    """A min/max as the Delta log's JSON stats hold it (None: leave it out)."""
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
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None  # NaN / inf are not valid JSON stats
        if value == 0.0:
            return 0.0  # Parquet writes a zero min as -0.0 (PARQUET-1222); the log says 0.0
    return value


def stats_json(num_records: int, schema: pa.Schema, mins: dict[str, Any], maxs: dict[str, Any],
               nulls: dict[str, int]) -> str:
    """The ``stats`` JSON of an ``add`` from merged per-column values (rules in the module doc)."""
    lo_out: dict[str, Any] = {}
    hi_out: dict[str, Any] = {}
    for f in schema:
        if f.name not in mins:
            continue
        lo, hi = mins[f.name], maxs[f.name]
        if isinstance(lo, str) and len(lo) > STATS_STRING_PREFIX:
            lo = lo[:STATS_STRING_PREFIX]  # a prefix is still a lower bound
        if isinstance(hi, str) and len(hi) > STATS_STRING_PREFIX:
            hi = None  # a truncated max would not be an upper bound: leave it out
        lo, hi = _stat_value(lo, f.type), _stat_value(hi, f.type)
        if lo is not None:
            lo_out[f.name] = lo
        if hi is not None:
            hi_out[f.name] = hi
    return json.dumps({"numRecords": num_records, "minValues": lo_out, "maxValues": hi_out,
                       "nullCount": dict(nulls)}, separators=(",", ":"))


def footer_stats(metadata: pq.FileMetaData, schema: pa.Schema, *, nan_columns: Iterable[str] = (),
                 read_back: Callable[[str, list[int]], pa.ChunkedArray] | None = None) -> str:
    """The ``stats`` JSON of a data file from its Parquet footer.

    ``schema``: the file's columns as declared (plain types). ``nan_columns``: float columns that
    held NaN (no min/max for them). ``read_back(column, row_groups)``: the column's values in
    those row groups, for string chunks whose min/max Parquet dropped (values > 4096 bytes);
    without it such a column gets no min/max."""
    nan = set(nan_columns)
    index: dict[str, int] = {}
    if metadata.num_row_groups:
        first = metadata.row_group(0)
        index = {first.column(j).path_in_schema: j for j in range(first.num_columns)}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}

    def merge(name: str, lo: Any, hi: Any) -> None:
        if name not in mins or lo < mins[name]:
            mins[name] = lo
        if name not in maxs or hi > maxs[name]:
            maxs[name] = hi

    for f in schema:
        if not _min_max_supported(f.type) or f.name not in index:
            continue
        j = index[f.name]
        null_count = 0
        missing: list[int] = []  # row groups with values but no min/max in the footer
        has_stats = True
        for i in range(metadata.num_row_groups):
            rg = metadata.row_group(i)
            st = rg.column(j).statistics
            if st is None or not st.has_null_count:
                has_stats = False  # statistics switched off for the column
                break
            null_count += st.null_count
            if f.name in nan:
                continue
            if st.has_min_max:
                merge(f.name, st.min, st.max)
            elif st.null_count < rg.num_rows and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)):
                missing.append(i)
        if not has_stats:
            mins.pop(f.name, None)
            maxs.pop(f.name, None)
            continue
        nulls[f.name] = null_count
        if missing:
            if read_back is None:
                mins.pop(f.name, None)
                maxs.pop(f.name, None)
                continue
            mm = pc.min_max(read_back(f.name, missing))
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is not None:
                merge(f.name, lo, hi)
    return stats_json(metadata.num_rows, schema, mins, maxs, nulls)


# ------------------------------------------------------------------------------------ files
@dataclass
class AddInfo:
    """What the commit needs to build a Delta ``add`` action for one written file."""
    path: str                      # relative to the table root, "/"-separated (delta-rs URI-encodes it)
    size: int
    partition_values: dict[str, str | None]
    modification_time: int         # epoch milliseconds
    stats: str
    num_records: int


def _fs_path(root: str, rel: str) -> str:
    """A file of the table as a path of its pyarrow filesystem (always "/"-separated)."""
    return posixpath.join(root, rel)


class _DataFile:
    """One Parquet file being written through an output stream of the table's filesystem."""

    def __init__(self, fs: pafs.FileSystem, path: str, rel: str, file_schema: pa.Schema,
                 declared: pa.Schema, partition_values: dict[str, str | None],
                 options: dict[str, Any]) -> None:
        self.fs, self.path, self.rel = fs, path, rel
        self.declared = declared
        self.partition_values = partition_values
        self.num_records = 0
        self.nan_columns: set[str] = set()
        self._float_columns = [f.name for f in declared if pa.types.is_floating(f.type)]
        self._metadata: list[pq.FileMetaData] = []
        self._stream = local_writes.open_output(fs, path)
        try:
            # a view column is stored as the same Parquet column as its plain type; the embedded
            # Arrow schema would name the view type, so it is left out then
            self.writer = pq.ParquetWriter(self._stream, file_schema, store_schema=file_schema == declared,
                                           metadata_collector=self._metadata, **options)
        except BaseException:
            self._stream.close()
            raise

    def write(self, data: pa.Table) -> None:
        if data.schema != self.writer.schema:
            data = data.cast(self.writer.schema)
        self.writer.write_table(data)
        self.num_records += data.num_rows
        for name in self._float_columns:
            if name not in self.nan_columns and pc.any(pc.is_nan(data.column(name))).as_py():
                self.nan_columns.add(name)

    def close(self) -> AddInfo:
        self.writer.close()
        self._stream.close()
        info = self.fs.get_file_info(self.path)
        mtime_ns = info.mtime_ns if info.mtime_ns is not None else time.time_ns()
        stats = footer_stats(self._metadata[0], self.declared, nan_columns=self.nan_columns,
                             read_back=self._read_back)
        return AddInfo(path=self.rel, size=int(info.size), partition_values=self.partition_values,
                       modification_time=mtime_ns // 1_000_000, stats=stats,
                       num_records=self.num_records)

    def close_quietly(self) -> None:
        for closer in (self.writer.close, self._stream.close):
            try:
                closer()
            except Exception:
                pass

    def _read_back(self, column: str, row_groups: list[int]) -> pa.ChunkedArray:
        log.info("%s: reading back %s for statistics Parquet left out (a value > 4 KiB)", self.path, column)
        with self.fs.open_input_file(self.path) as fh:
            return pq.ParquetFile(fh).read_row_groups(row_groups, columns=[column])[column]


class FileSetWriter:
    """The data files one task writes into a table: rows split by partition, a new file per
    partition every ``rows_per_file`` rows, file names ``<name_prefix>-cNNN.<codec>.parquet``.

    ``on_new_file`` runs right after each file is created (the Spark writer checks there whether
    its job was aborted). :meth:`close` returns the ``add`` infos; :meth:`discard` removes every
    file written so far (a failed task leaves nothing behind)."""

    def __init__(self, table: Location, schema: pa.Schema, partition_by: list[str], name_prefix: str, *,
                 rows_per_file: int = DEFAULT_ROWS_PER_FILE,
                 on_new_file: Callable[[], None] | None = None) -> None:
        self.table = table
        self.schema = schema
        self.partition_by = partition_by
        self.name_prefix = name_prefix
        self.rows_per_file = max(1, rows_per_file)
        self.on_new_file = on_new_file
        self.file_schema = pa.schema([f for f in schema if f.name not in partition_by])
        self.options: dict[str, Any] | None = None
        self.fs, self.root = table.filesystem()
        self.open_files: dict[tuple, _DataFile] = {}
        self.done: list[AddInfo] = []
        self.written: list[str] = []
        self.counter = 0

    def write(self, table: pa.Table) -> None:
        """Append rows (any column order, types castable to the schema)."""
        if table.num_rows == 0:
            return
        table = table.select(self.schema.names)
        table = table.cast(keep_encodings(self.schema, table.schema))
        for values, piece in split_by_partition(table, self.partition_by):
            key = tuple(values)
            file = self.open_files.get(key)
            if file is None:
                file = self._new_file(values, piece.schema, piece)
            file.write(piece.drop_columns(self.partition_by) if self.partition_by else piece)
            if file.num_records >= self.rows_per_file:
                self.done.append(self.open_files.pop(key).close())

    def close(self) -> list[AddInfo]:
        for key in list(self.open_files):
            self.done.append(self.open_files.pop(key).close())
        return self.done

    def discard(self) -> None:
        for file in self.open_files.values():
            file.close_quietly()
        self.open_files.clear()
        for path in self.written:
            _delete_quietly(self.fs, path)

    def _new_file(self, values: list[str | None], piece_schema: pa.Schema, sample: pa.Table) -> _DataFile:
        pdir = partition_dir(self.partition_by, values) if self.partition_by else ""
        name = f"{self.name_prefix}-c{self.counter:03d}.{COLUMN_CODEC}.parquet"
        self.counter += 1
        rel = f"{pdir}/{name}" if pdir else name
        path = _fs_path(self.root, rel)
        if self.table.is_local:  # object stores have no directories to create
            self.fs.create_dir(posixpath.dirname(path), recursive=True)
        self.written.append(path)
        file_schema = pa.schema([f for f in piece_schema if f.name not in self.partition_by])
        if self.options is None:  # judged on the task's first rows, then the same for all its files
            self.options = parquet_writer_options(self.file_schema, sample)
        file = _DataFile(self.fs, path, rel, file_schema, self.file_schema,
                         dict(zip(self.partition_by, values)), self.options)
        self.open_files[tuple(values)] = file
        if self.on_new_file is not None:
            self.on_new_file()
        return file


# ------------------------------------------------------------------------------------ clean-up
def _delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


def _walk_files(fs: pafs.FileSystem, top: str, skip_dirs: frozenset[str]) -> Iterator[pafs.FileInfo]:
    """Files under ``top``, not descending into directories named in ``skip_dirs`` (the Delta log
    can be large: one listing per directory rather than a recursive listing of everything)."""
    pending = [top]
    while pending:
        d = pending.pop()
        for info in fs.get_file_info(pafs.FileSelector(d, allow_not_found=True)):
            if info.type == pafs.FileType.Directory:
                if info.base_name not in skip_dirs:
                    pending.append(info.path)
            elif info.type == pafs.FileType.File:
                yield info


def delete_job_files(table: Location, job_id: str, known: Iterable[AddInfo] = (), *,
                     skip_dirs: Iterable[str] = ("_delta_log",)) -> None:
    """Remove the ``known`` files and every other data file whose name carries ``job_id`` (from
    tasks that never reported), through the filesystem API.

    Locally, partition directories the job left empty are removed too (``rmdir`` refuses a
    directory another writer has just put a file in). Object stores have no directories; pyarrow
    may leave an empty ``dir/`` marker object where the last file of a prefix was deleted."""
    fs, root = table.filesystem()
    touched: set[str] = set()
    for info in known:
        path = _fs_path(root, info.path)
        _delete_quietly(fs, path)
        touched.add(posixpath.dirname(path))
    for info in _walk_files(fs, root, frozenset(skip_dirs)):
        if job_id in info.base_name:
            _delete_quietly(fs, info.path)
            touched.add(posixpath.dirname(info.path))
    if table.is_local:
        top = os.path.abspath(root)
        for d in sorted(touched, key=len, reverse=True):
            d = os.path.abspath(d)
            while d.startswith(top + os.sep):
                try:
                    os.rmdir(d)
                except OSError:
                    break
                d = os.path.dirname(d)
