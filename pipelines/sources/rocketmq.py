"""Spark Python Data Sources over a RocketMQ broker store (PySpark 4 ``pyspark.sql.datasource``).

Four formats, registered together by :func:`register_sources`:

``rocketmq``
    one row per CommitLog message record, ``schemas.messages.MESSAGES_SCHEMA``::

        spark.read.format("rocketmq").option("brokerName", "broker-a").load("/data/store")

    Options: ``brokerName`` (default ``broker-a``), ``splitBytes`` (default 128 MiB; every segment
    is cut into byte ranges of this size, one Spark task each), ``fromOffset`` / ``untilOffset``
    (only records that *start* in ``[fromOffset, untilOffset)``), ``ingestRunId`` (the
    ``ingest_run_id`` column; null when not given), ``segmentSize`` (override the inferred
    commitlog file size), ``verifyCrc`` (default true), ``pushFilters`` (default false; see the
    caveat below).

    Filters pushed into the decoder (and not evaluated again by Spark): ``=``/``IN`` on ``topic``
    and ``real_topic``, ``=``/``<``/``<=``/``>``/``>=`` on ``store_timestamp`` and
    ``commitlog_offset``, ``=``/``IN`` on ``broker_name``. Offset bounds also drop whole splits.
    Comparisons on ``store_time`` narrow the decode too but are handed back to Spark.

``rocketmq_consume_queue``
    the units of every ``consumequeue/<topic>/<queueId>`` (``CONSUME_QUEUE_SCHEMA``), one task
    per queue.

``rocketmq_index``
    the entries of every index file (``INDEX_ENTRIES_SCHEMA``), one task per file;
    ``store_timestamp`` = header beginTimestamp + timeDiff seconds.

``rocketmq_findings``
    structural findings of the commitlog walk (``CORRUPT_RECORDS_SCHEMA``), one task per segment.

The store path may be a local directory (segments are mmapped) or a ``pyarrow.fs`` URI
(``s3://…``, ``gs://``, ``hdfs://``, ``file://``): such commitlog segments are read whole into
memory by the task that decodes them, consume queue and index files are copied to a temporary
directory first.

Caveat (PySpark 4.2.0): after a query whose filters were pushed here, Spark keeps that query's
planned reader on the DataFrame's relation and reuses it for a later query on the *same*
DataFrame that pushes nothing (e.g. ``df.filter("topic = 'A'").count()`` then ``df.count()``
returns the filtered count). Pushdown is therefore off unless ``pushFilters`` is ``true``; turn it
on only where every filtered query loads a fresh DataFrame (the ingest job does). The offset range
options are always safe and always prune splits.
"""

from __future__ import annotations

import datetime as _dt
import mmap
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from broker.store.columnar import DecodeFilter, DecodeStats, iter_decode
from broker.store.commitlog import infer_segment_size, list_segments, Segment
from broker.store.record_scan import scan_records
from broker.store.constants import (
    COMMITLOG_DIR,
    CONSUME_QUEUE_DIR,
    FILE_NAME_DIGITS,
    INDEX_DIR,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_ORIGIN_MESSAGE_ID,
)
from broker.store.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from schemas.messages import MESSAGES_SCHEMA, RECORD_SCHEMA, body_as_view
from schemas.spark import spark_ddl
from schemas.tables import CONSUME_QUEUE_SCHEMA, CORRUPT_RECORDS_SCHEMA, INDEX_ENTRIES_SCHEMA
from pipelines.sources.options import opt_bool, opt_int

DEFAULT_BROKER_NAME = "broker-a"
DEFAULT_SPLIT_BYTES = 128 * 1024 * 1024
_TS_US_UTC = pa.timestamp("us", tz="UTC")
_MESSAGES_SCHEMA_BODY_VIEW = body_as_view(MESSAGES_SCHEMA)
# messages columns the reader always fills (IS NOT NULL on them is answered without Spark)
NEVER_NULL = frozenset(RECORD_SCHEMA.names) - {"tags", "uniq_key"} | {
    "born_time", "store_time", "broker_name", "store_date", "segment_file", "is_retry", "is_dlq"}


# ---- options and paths -------------------------------------------------------------------------------



def _store_path(options) -> str:
    path = options.get("path")
    if not path:
        raise ValueError("no store path: use .load(STORE_PATH) or .option('path', STORE_PATH)")
    return str(path)


def _is_remote(path: str) -> bool:
    """True for a URI (``s3://…``, also ``file://…``): read through ``pyarrow.fs``, not mmap.
    A Windows drive letter is not a scheme."""
    return len(urlparse(path).scheme) > 1


def _remote_fs(uri: str):
    from pyarrow import fs as pafs

    return pafs.FileSystem.from_uri(uri)  # (filesystem, path inside it)


def _remote_listing(uri: str, sub: str, recursive: bool = False) -> tuple[object, str, list]:
    """(filesystem, root path, FileInfo list of ``<store>/<sub>``) for a remote store."""
    from pyarrow import fs as pafs

    filesystem, root = _remote_fs(uri)
    base = f"{root.rstrip('/')}/{sub}"
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=recursive))
    except FileNotFoundError:
        infos = []
    return filesystem, root.rstrip("/"), infos


def _read_remote(uri: str, path: str) -> bytes:
    filesystem, _ = _remote_fs(uri)
    with filesystem.open_input_file(path) as fh:
        return fh.readall()


# ---- the messages source ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CommitLogSplit(InputPartition):
    """Records starting in ``[start, end)`` (segment positions) of one commitlog segment."""

    path: str  # local path, or the path inside the remote filesystem
    base: int  # physical offset of the segment's first byte
    segment_size: int  # configured commitlog file size (what iter_decode calls seg_size)
    start: int
    end: int
    remote_uri: str | None = None  # store URI when the segment is remote

    @property
    def value(self):  # InputPartition's attribute (for repr/debugging)
        return (self.path, self.start, self.end)

    @property
    def file_name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass
class PushedFilters:
    """What pushFilters took over, in decoder terms (all bounds inclusive except max_offset)."""

    topics: frozenset[str] | None = None  # exact stored topic set
    real_topics: frozenset[str] | None = None  # exact real topic set
    min_offset: int | None = None
    max_offset: int | None = None  # exclusive
    min_store_timestamp: int | None = None
    max_store_timestamp: int | None = None
    broker_names: frozenset[str] | None = None
    described: list[str] = field(default_factory=list)

    def _narrow(self, attr: str, values: Iterable) -> None:
        new = frozenset(v for v in values if v is not None)
        old = getattr(self, attr)
        setattr(self, attr, new if old is None else old & new)

    def _lower(self, attr: str, value: int) -> None:
        old = getattr(self, attr)
        setattr(self, attr, value if old is None else max(old, value))

    def _upper(self, attr: str, value: int) -> None:
        old = getattr(self, attr)
        setattr(self, attr, value if old is None else min(old, value))

    @property
    def empty(self) -> bool:
        """True when the pushed conditions cannot all hold for any row."""
        return (any(s is not None and not s for s in (self.topics, self.real_topics, self.broker_names))
                or (self.min_offset is not None and self.max_offset is not None
                    and self.min_offset >= self.max_offset)
                or (self.min_store_timestamp is not None and self.max_store_timestamp is not None
                    and self.min_store_timestamp > self.max_store_timestamp))

    def decode_filter(self) -> DecodeFilter | None:
        # DecodeFilter.topics keeps rows whose stored OR real topic is in the set: a superset of
        # either exact condition, tightened again in read().
        topics = self.topics if self.topics is not None else self.real_topics
        flt = DecodeFilter(topics=topics, min_store_timestamp=self.min_store_timestamp,
                           max_store_timestamp=self.max_store_timestamp,
                           min_offset=self.min_offset, max_offset=self.max_offset)
        if all(v is None for v in (flt.topics, flt.min_store_timestamp, flt.max_store_timestamp,
                                    flt.min_offset, flt.max_offset)):
            return None
        return flt


def _column(f: Filter) -> str | None:
    attr = getattr(f, "attribute", None)
    return attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _epoch_us(value) -> int | None:
    """A pushed timestamp literal as epoch µs (Spark sends aware or naive-UTC datetimes)."""
    if not isinstance(value, _dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    delta = value - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _push_int_bound(p: PushedFilters, f: Filter, lo_attr: str, hi_attr: str, hi_exclusive: bool) -> bool:
    """Offsets (exclusive upper bound) and store timestamps (inclusive upper bound)."""
    v = getattr(f, "value", None)
    if isinstance(f, EqualTo):
        if not _is_int(v):
            return False
        p._lower(lo_attr, v)
        p._upper(hi_attr, v + 1 if hi_exclusive else v)
        return True
    if isinstance(f, In):
        ints = [x for x in f.value if x is not None]
        if not ints or not all(_is_int(x) for x in ints):
            return False
        # IN keeps its exact semantics only as a range when it is a single value
        if len(set(ints)) != 1:
            return False
        p._lower(lo_attr, ints[0])
        p._upper(hi_attr, ints[0] + 1 if hi_exclusive else ints[0])
        return True
    if not _is_int(v):
        return False
    if isinstance(f, GreaterThan):
        p._lower(lo_attr, v + 1)
    elif isinstance(f, GreaterThanOrEqual):
        p._lower(lo_attr, v)
    elif isinstance(f, LessThan):
        p._upper(hi_attr, v if hi_exclusive else v - 1)
    elif isinstance(f, LessThanOrEqual):
        p._upper(hi_attr, v + 1 if hi_exclusive else v)
    else:
        return False
    return True


def _push_store_time(p: PushedFilters, f: Filter) -> None:
    """store_time (µs) comparisons as conservative store_timestamp (ms) bounds (Spark re-checks)."""
    if isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual, EqualTo)):
        us = _epoch_us(f.value)
        if us is None:
            return
        if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo)):
            p._lower("min_store_timestamp", us // 1000)  # ts_ms*1000 >= us ⇒ ts_ms >= floor(us/1000)
        if isinstance(f, (LessThan, LessThanOrEqual, EqualTo)):
            p._upper("max_store_timestamp", -(-us // 1000))  # ts_ms <= ceil(us/1000)


def _splits_for(segments: list[tuple[str, int, int]], segment_size: int, split_bytes: int,
                lo: int | None, hi: int | None, remote_uri: str | None) -> list[CommitLogSplit]:
    """Byte ranges of ``split_bytes`` over every segment, clipped to ``[lo, hi)`` (physical)."""
    out: list[CommitLogSplit] = []
    for path, base, size in segments:
        length = min(size, segment_size)
        if length <= 0:
            continue
        first = 0 if lo is None else max(0, lo - base)
        last = length if hi is None else min(length, hi - base)
        if first >= last:
            continue
        pos = (first // split_bytes) * split_bytes
        while pos < last:
            start, end = max(pos, first), min(pos + split_bytes, last)
            if start < end:
                out.append(CommitLogSplit(path, base, segment_size, start, end, remote_uri))
            pos += split_bytes
    return out


def list_commitlog(store_path: str, segment_size: int | None = None) -> tuple[list[tuple[str, int, int]], int]:
    """``([(path, base, size), …], segment_size)`` of a local or remote store, in offset order."""
    if not _is_remote(store_path):
        segs = list_segments(Path(store_path) / COMMITLOG_DIR, segment_size)
        size = segment_size or infer_segment_size(segs)
        return [(str(s.path), s.base, s.size) for s in segs], size
    from pyarrow import fs as pafs

    _, _, infos = _remote_listing(store_path, COMMITLOG_DIR)
    segs = [Segment(Path(i.path), int(i.base_name), i.size or 0) for i in infos
            if i.type == pafs.FileType.File and len(i.base_name) == FILE_NAME_DIGITS and i.base_name.isdigit()]
    segs.sort(key=lambda s: s.base)
    size = segment_size or infer_segment_size(segs)
    # keep the remote path exactly as listed (Path() would be fine for "bucket/key" but not for "//")
    by_base = {int(i.base_name): i.path for i in infos if i.base_name.isdigit()}
    return [(by_base[s.base], s.base, s.size) for s in segs], size


def _constant(value: str | None, n: int) -> pa.Array:
    if value is None:
        return pa.nulls(n, pa.string())
    return pa.repeat(pa.scalar(value, pa.string()), n)


def lake_columns(batch: pa.RecordBatch, broker_name: str, segment_file: str,
                 ingest_run_id: str | None) -> pa.RecordBatch:
    """A RECORD_SCHEMA batch → a MESSAGES_SCHEMA batch (derived columns, all vectorised)."""
    n = batch.num_rows
    born_ms = batch.column("born_timestamp")
    store_ms = batch.column("store_timestamp")
    topic = batch.column("topic")
    props = batch.column("properties")
    is_retry = pc.starts_with(topic, RETRY_GROUP_TOPIC_PREFIX)
    is_dlq = pc.starts_with(topic, DLQ_GROUP_TOPIC_PREFIX)
    null_str = pa.scalar(None, pa.string())
    group = pc.if_else(is_retry, pc.utf8_slice_codeunits(topic, len(RETRY_GROUP_TOPIC_PREFIX)),
                       pc.if_else(is_dlq, pc.utf8_slice_codeunits(topic, len(DLQ_GROUP_TOPIC_PREFIX)), null_str))
    origin = pc.coalesce(pc.map_lookup(props, PROPERTY_ORIGIN_MESSAGE_ID, "first"),
                         pc.map_lookup(props, PROPERTY_DLQ_ORIGIN_MESSAGE_ID, "first"))
    store_time = pc.multiply(store_ms, 1000).view(_TS_US_UTC)
    extra = {
        "born_time": pc.multiply(born_ms, 1000).view(_TS_US_UTC),
        "store_time": store_time,
        "broker_name": _constant(broker_name, n),
        "store_date": pc.cast(store_time, pa.date32()),
        "segment_file": _constant(segment_file, n),
        "ingest_run_id": _constant(ingest_run_id, n),
        "is_retry": is_retry,
        "is_dlq": is_dlq,
        "consumer_group": group,
        "origin_msg_id": origin,
    }
    arrays = list(batch.columns) + [extra[f.name] for f in MESSAGES_SCHEMA if f.name not in RECORD_SCHEMA.names]
    view = pa.types.is_binary_view(batch.schema.field("body").type)
    return pa.RecordBatch.from_arrays(arrays, schema=_MESSAGES_SCHEMA_BODY_VIEW if view else MESSAGES_SCHEMA)


class RocketMQReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.store_path = _store_path(options)
        self.broker_name = options.get("brokerName") or DEFAULT_BROKER_NAME
        self.split_bytes = opt_int(options, "splitBytes", DEFAULT_SPLIT_BYTES)
        if self.split_bytes <= 0:
            raise ValueError("splitBytes must be positive")
        self.from_offset = opt_int(options, "fromOffset", None)
        self.until_offset = opt_int(options, "untilOffset", None)
        self.segment_size = opt_int(options, "segmentSize", None)
        self.ingest_run_id = options.get("ingestRunId")
        self.verify_crc = opt_bool(options, "verifyCrc", True)
        # bodies as binary_view into the mapped segment (no copy): only for Python consumers of
        # read() such as pipelines.partition_writer; Spark itself needs the declared BINARY type
        self.body_view = opt_bool(options, "bodyView", False)
        # Off unless asked for: PySpark 4.2.0 keeps the reader planned for a pushed-down query on
        # the DataFrame and reuses it for later queries on the same DataFrame (wrong row counts).
        # Jobs that build a fresh DataFrame per query turn it on with .option("pushFilters", "true").
        self.push_enabled = opt_bool(options, "pushFilters", False)
        self.pushed = PushedFilters()
        if self.from_offset is not None:
            self.pushed._lower("min_offset", self.from_offset)
        if self.until_offset is not None:
            self.pushed._upper("max_offset", self.until_offset)

    # -- planning (driver-side Python worker) --------------------------------------------------------
    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        if not self.push_enabled:
            yield from filters
            return
        p = self.pushed
        for f in filters:
            col = _column(f)
            handled = False
            if isinstance(f, IsNotNull):
                handled = col in NEVER_NULL  # the decoder never produces a null there
            elif col in ("topic", "real_topic", "broker_name") and isinstance(f, (EqualTo, In)):
                values = [f.value] if isinstance(f, EqualTo) else list(f.value)
                if all(v is None or isinstance(v, str) for v in values):
                    attr = {"topic": "topics", "real_topic": "real_topics", "broker_name": "broker_names"}[col]
                    p._narrow(attr, values)
                    handled = True
            elif col == "commitlog_offset":
                handled = _push_int_bound(p, f, "min_offset", "max_offset", hi_exclusive=True)
            elif col == "store_timestamp":
                handled = _push_int_bound(p, f, "min_store_timestamp", "max_store_timestamp", hi_exclusive=False)
            elif col == "store_time":
                _push_store_time(p, f)  # narrows the decode; Spark still evaluates it
            if handled:
                p.described.append(repr(f))
            else:
                yield f

    def partitions(self) -> list[InputPartition]:
        if self.pushed.empty or (self.pushed.broker_names is not None
                                 and self.broker_name not in self.pushed.broker_names):
            return [InputPartition(None)]
        segments, segment_size = list_commitlog(self.store_path, self.segment_size)
        splits = _splits_for(segments, segment_size, self.split_bytes, self.pushed.min_offset,
                             self.pushed.max_offset, self.store_path if _is_remote(self.store_path) else None)
        return list(splits) or [InputPartition(None)]

    # -- reading (executor-side Python worker) -------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, CommitLogSplit):
            return iter(())
        return self._read_split(partition)

    def _read_split(self, split: CommitLogSplit) -> Iterator[pa.RecordBatch]:
        for batch in decode_split(split, self.pushed, verify_crc=self.verify_crc, body_view=self.body_view):
            yield lake_columns(batch, self.broker_name, split.file_name, self.ingest_run_id)


def _open_segment(split: CommitLogSplit):
    if split.remote_uri is not None:
        return _read_remote(split.remote_uri, split.path)
    with open(split.path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return b""
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def decode_split(split: CommitLogSplit, pushed: PushedFilters | None = None, *, verify_crc: bool = True,
                 stats: DecodeStats | None = None, body_view: bool = False) -> Iterator[pa.RecordBatch]:
    """RECORD_SCHEMA batches of the records starting in the split (pushed filters applied exactly)."""
    pushed = pushed or PushedFilters()
    flt = pushed.decode_filter()
    buf = _open_segment(split)
    try:
        for batch in iter_decode(buf, split.base, split.segment_size, split.start, split.end,
                                 file_name=split.file_name, flt=flt, verify_crc=verify_crc, stats=stats,
                                 search_first=split.start != 0, body_view=body_view):
            mask = None
            if pushed.topics is not None:
                mask = pc.is_in(batch.column("topic"), value_set=pa.array(sorted(pushed.topics), pa.string()))
            if pushed.real_topics is not None:
                m = pc.is_in(batch.column("real_topic"), value_set=pa.array(sorted(pushed.real_topics), pa.string()))
                mask = m if mask is None else pc.and_(mask, m)
            if mask is not None:
                batch = batch.filter(mask)
            if batch.num_rows:
                yield batch
    finally:
        if isinstance(buf, mmap.mmap):
            try:
                buf.close()
            except BufferError:  # an Arrow buffer still points into the map; GC closes it later
                pass


class RocketMQDataSource(DataSource):
    """``spark.read.format("rocketmq")``: CommitLog message records (MESSAGES_SCHEMA)."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> str:
        return spark_ddl(MESSAGES_SCHEMA)

    def reader(self, schema) -> DataSourceReader:
        return RocketMQReader(self.options)


# ---- consume queues ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class QueuePartition(InputPartition):
    topic: str
    queue_id: int
    commitlog_min_offset: int

    @property
    def value(self):
        return (self.topic, self.queue_id)


@dataclass(frozen=True)
class _RemoteCopy:
    """Copy ``<store>/<sub>`` files of a remote store into a temporary local store directory."""

    uri: str

    def fetch(self, sub: str) -> str:
        from pyarrow import fs as pafs

        filesystem, root, infos = _remote_listing(self.uri, sub, recursive=True)
        tmp = tempfile.mkdtemp(prefix="rocketlake-")
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            rel = info.path[len(root) + 1:]
            dst = Path(tmp) / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            with filesystem.open_input_file(info.path) as src, open(dst, "wb") as out:
                out.write(src.readall())
        return tmp


def _local_store(store_path: str, sub: str) -> tuple[str, str | None]:
    """A local directory holding ``<sub>`` of the store, and a temp dir to delete afterwards."""
    if not _is_remote(store_path):
        return store_path, None
    tmp = _RemoteCopy(store_path).fetch(sub)
    return tmp, tmp


class ConsumeQueueReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.store_path = _store_path(options)
        self.broker_name = options.get("brokerName") or DEFAULT_BROKER_NAME

    def partitions(self) -> list[InputPartition]:
        from broker.store.consume_queue import list_queues

        segments, _ = list_commitlog(self.store_path)
        min_offset = next((base for _, base, size in segments), 0)
        if _is_remote(self.store_path):
            from pyarrow import fs as pafs

            _, root, infos = _remote_listing(self.store_path, CONSUME_QUEUE_DIR, recursive=True)
            queues = set()
            for i in infos:
                parts = i.path[len(root) + 1:].split("/")
                if i.type == pafs.FileType.Directory and len(parts) == 3 and parts[2].isascii() and parts[2].isdigit():
                    queues.add((parts[1], int(parts[2])))
            queues = sorted(queues)
        else:
            queues = list_queues(self.store_path)
        return [QueuePartition(t, q, min_offset) for t, q in queues] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueuePartition):
            return iter(())
        return self._read(partition)

    def _read(self, part: QueuePartition) -> Iterator[pa.RecordBatch]:
        from broker.store.consume_queue import ConsumeQueue

        store, tmp = _local_store(self.store_path, f"{CONSUME_QUEUE_DIR}/{part.topic}/{part.queue_id}")
        try:
            cq = ConsumeQueue(store, part.topic, part.queue_id, commitlog_min_offset=part.commitlog_min_offset)
            units = cq.units()
            cq.close()
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
        n = len(units)
        if n == 0:
            return
        yield pa.RecordBatch.from_arrays([
            _constant(self.broker_name, n),
            _constant(part.topic, n),
            pa.repeat(pa.scalar(part.queue_id, pa.int32()), n),
            pa.array(units["logical_offset"]),
            pa.array(units["commitlog_offset"]),
            pa.array(units["size"]),
            pa.array(units["tags_code"]),
        ], schema=CONSUME_QUEUE_SCHEMA)


class RocketMQConsumeQueueDataSource(DataSource):
    """``spark.read.format("rocketmq_consume_queue")``: ConsumeQueue units (CONSUME_QUEUE_SCHEMA)."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq_consume_queue"

    def schema(self) -> str:
        return spark_ddl(CONSUME_QUEUE_SCHEMA)

    def reader(self, schema) -> DataSourceReader:
        return ConsumeQueueReader(self.options)


# ---- index files ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexPartition(InputPartition):
    path: str  # local path, or the path inside the remote filesystem
    max_hash_slot_num: int | None
    max_index_num: int | None

    @property
    def value(self):
        return self.path

    @property
    def file_name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class IndexReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.store_path = _store_path(options)
        self.broker_name = options.get("brokerName") or DEFAULT_BROKER_NAME

    def partitions(self) -> list[InputPartition]:
        from broker.store.index_file import IndexService, parse_index_file_name

        if _is_remote(self.store_path):
            from pyarrow import fs as pafs

            _, _, infos = _remote_listing(self.store_path, INDEX_DIR)
            paths = sorted((i.path for i in infos if i.type == pafs.FileType.File
                            and parse_index_file_name(i.base_name) is not None),
                           key=lambda p: p.rsplit("/", 1)[-1])
            return [IndexPartition(p, None, None) for p in paths] or [InputPartition(None)]
        service = IndexService(self.store_path)
        try:
            parts = [IndexPartition(str(f.path), service.max_hash_slot_num, service.max_index_num)
                     for f in service.files]
        finally:
            service.close()
        return parts or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, IndexPartition):
            return iter(())
        return self._read(partition)

    def _read(self, part: IndexPartition) -> Iterator[pa.RecordBatch]:
        from broker.store.index_file import IndexFile

        tmp = None
        path = part.path
        if _is_remote(self.store_path):
            tmp = tempfile.mkdtemp(prefix="rocketlake-")
            path = os.path.join(tmp, part.file_name)
            with open(path, "wb") as out:
                out.write(_read_remote(self.store_path, part.path))
        try:
            f = IndexFile.open(path, part.max_hash_slot_num, part.max_index_num)
            try:
                rows = f.entries()
                begin = f.header.begin_timestamp
            finally:
                f.close()
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
        n = len(rows)
        if n == 0:
            return
        time_diff = pa.array(rows["time_diff"]).cast(pa.int64())
        yield pa.RecordBatch.from_arrays([
            _constant(self.broker_name, n),
            _constant(part.file_name, n),
            pa.array(rows["key_hash"]),
            pa.array(rows["phy_offset"]),
            pc.add(pc.multiply(time_diff, 1000), begin),
            pa.array(rows["prev_index"]),
        ], schema=INDEX_ENTRIES_SCHEMA)


class RocketMQIndexDataSource(DataSource):
    """``spark.read.format("rocketmq_index")``: index file entries (INDEX_ENTRIES_SCHEMA)."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq_index"

    def schema(self) -> str:
        return spark_ddl(INDEX_ENTRIES_SCHEMA)

    def reader(self, schema) -> DataSourceReader:
        return IndexReader(self.options)


# ---- commitlog findings ------------------------------------------------------------------------------

class CommitLogFindingsReader(DataSourceReader):
    """Structural findings of the commitlog walk (corrupt regions, torn tails, bad sizes), one task
    per segment, as CORRUPT_RECORDS_SCHEMA rows. Options: ``brokerName``, ``fromOffset`` /
    ``untilOffset`` (walk only records starting there), ``ingestRunId``, ``segmentSize``.

    Why per segment and not per split: the walk is cheap (no column building), and a segment's
    walk reports each corrupt region exactly once without any rule for regions crossing splits."""

    def __init__(self, options) -> None:
        self.store_path = _store_path(options)
        self.broker_name = options.get("brokerName") or DEFAULT_BROKER_NAME
        self.from_offset = opt_int(options, "fromOffset", None)
        self.until_offset = opt_int(options, "untilOffset", None)
        self.segment_size = opt_int(options, "segmentSize", None)
        self.ingest_run_id = options.get("ingestRunId")

    def partitions(self) -> list[InputPartition]:
        segments, segment_size = list_commitlog(self.store_path, self.segment_size)
        splits = _splits_for(segments, segment_size, segment_size, self.from_offset, self.until_offset,
                             self.store_path if _is_remote(self.store_path) else None)
        return list(splits) or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, CommitLogSplit):
            return iter(())
        return self._read(partition)

    def _read(self, split: CommitLogSplit) -> Iterator[pa.RecordBatch]:
        buf = _open_segment(split)
        try:
            scan = scan_records(buf, split.base, split.segment_size, split.start, split.end, split.path,
                                search_first=split.start != 0)
        finally:
            if isinstance(buf, mmap.mmap):
                buf.close()
        if scan.findings:
            yield pa.RecordBatch.from_pylist([
                {"broker_name": self.broker_name, "file": f.file, "offset": f.offset,
                 "reason": f"{f.kind}: {f.detail}", "bytes_skipped": f.bytes_skipped,
                 "ingest_run_id": self.ingest_run_id} for f in scan.findings], schema=CORRUPT_RECORDS_SCHEMA)


class RocketMQFindingsDataSource(DataSource):
    """``spark.read.format("rocketmq_findings")``: structural findings of the commitlog walk."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq_findings"

    def schema(self) -> str:
        return spark_ddl(CORRUPT_RECORDS_SCHEMA)

    def reader(self, schema) -> DataSourceReader:
        return CommitLogFindingsReader(self.options)


SOURCES = (RocketMQDataSource, RocketMQConsumeQueueDataSource, RocketMQIndexDataSource, RocketMQFindingsDataSource)


def register_sources(spark) -> None:
    """Register ``rocketmq``, ``rocketmq_consume_queue`` and ``rocketmq_index`` with a session."""
    from pipelines.session import register_data_source

    for source in SOURCES:
        register_data_source(spark, source)
