"""Spark Python Data Sources over a RocketMQ broker store (PySpark 4 ``pyspark.sql.datasource``).

Four formats, registered together by :func:`register_sources`:

``rocketmq``
    one row per CommitLog message record, ``schemas.messages.MESSAGES_SCHEMA``::

        spark.read.format("rocketmq").option("brokerName", "broker-a").load("/data/store")

    Options: ``brokerName`` (default ``broker-a``), ``splitBytes`` (default 256 MiB; every segment
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

The store path may be a local directory or a ``pyarrow.fs`` URI (``s3://…``, ``gs://``, ``hdfs://``,
``file://``), with storage options as ``storage.<KEY>`` options (delta-rs names, e.g.
``.option("storage.AWS_ENDPOINT_URL", …)``; the driver's environment is merged under them). Either
way a task reads its byte range of a commitlog segment with ranged reads into one buffer
(:mod:`pipelines.commitlog_ranges`: ``[start, end + MAX_RECORD_BYTES)``, never the whole segment),
and consume queue and index files through the filesystem (:mod:`pipelines.store_files`).

Caveat (PySpark 4.2.0): after a query whose filters were pushed here, Spark keeps that query's
planned reader on the DataFrame's relation and reuses it for a later query on the *same*
DataFrame that pushes nothing (e.g. ``df.filter("topic = 'A'").count()`` then ``df.count()``
returns the filtered count). Pushdown is therefore off unless ``pushFilters`` is ``true``; turn it
on only where every filtered query loads a fresh DataFrame (the ingest job does). The offset range
options are always safe and always prune splits.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np
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

from broker.store.columnar import DecodeFilter, DecodeStats
from broker.store.constants import (
    CONSUME_QUEUE_EXT_DIR,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_ORIGIN_MESSAGE_ID,
)
from broker.store.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from schemas.messages import MESSAGES_SCHEMA, RECORD_SCHEMA
from schemas.spark import spark_ddl
from schemas.tables import CONSUME_QUEUE_SCHEMA, CORRUPT_RECORDS_SCHEMA, INDEX_ENTRIES_SCHEMA
from pipelines.commitlog_ranges import SegmentFile, decode_pieces, segment_files, walk_range
from pipelines.sources.options import (DEFAULT_SPLIT_BYTES, DIRECT_WRITE_OPTION, WALK_PIECES_OPTION, SideRows, opt_bool,
                                      opt_int)
from pipelines import walk_pieces
from pipelines.storage import Location, StorageError, location_from_source_options, source_options
from pipelines.store_files import StoreFile, StoreFiles
from pipelines.walk_pieces import WalkPiece

DEFAULT_BROKER_NAME = "broker-a"
_TS_US_UTC = pa.timestamp("us", tz="UTC")
_MS_PER_DAY = 86_400_000
# messages columns the reader always fills (IS NOT NULL on them is answered without Spark)
NEVER_NULL = frozenset(RECORD_SCHEMA.names) - {"tags", "uniq_key"} | {
    "born_time", "store_time", "broker_name", "store_date", "segment_file", "is_retry", "is_dlq"}


# ---- options and paths -------------------------------------------------------------------------------

def store_location(options) -> Location:
    """The ``path`` option (a local directory, ``file://`` or a remote URI) with the ``storage.*``
    options (:func:`pipelines.storage.location_from_source_options`)."""
    path = options.get("path")
    if not path:
        raise ValueError("no store path: use .load(STORE_PATH) or .option('path', STORE_PATH)")
    return location_from_source_options(str(path), options)


def store_source_options(location: Location) -> dict[str, str]:
    """Source options that name ``location`` (path and storage options) for :func:`store_location`."""
    return {"path": location.uri, **source_options(location)}


# ---- the messages source ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CommitLogSplit(InputPartition):
    """Records starting in ``[start, end)`` (segment positions) of one commitlog segment."""

    segment: SegmentFile
    start: int
    end: int

    @property
    def value(self):  # InputPartition's attribute (for repr/debugging)
        return (self.path, self.start, self.end)

    @property
    def path(self) -> str:
        """The segment's URI or absolute local path (how findings name it)."""
        return self.segment.label

    @property
    def base(self) -> int:
        return self.segment.base

    @property
    def segment_size(self) -> int:
        return self.segment.segment_size

    @property
    def file_name(self) -> str:
        return self.segment.name


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


def _splits_for(segments: list[SegmentFile], split_bytes: int, lo: int | None, hi: int | None) -> list[CommitLogSplit]:
    """Byte ranges of ``split_bytes`` over every segment, clipped to ``[lo, hi)`` (physical)."""
    out: list[CommitLogSplit] = []
    for seg in segments:
        length = seg.data_len
        if length <= 0:
            continue
        first = 0 if lo is None else max(0, lo - seg.base)
        last = length if hi is None else min(length, hi - seg.base)
        if first >= last:
            continue
        pos = (first // split_bytes) * split_bytes
        while pos < last:
            start, end = max(pos, first), min(pos + split_bytes, last)
            if start < end:
                out.append(CommitLogSplit(seg, start, end))
            pos += split_bytes
    return out


def _constant(value: str | None, n: int, encoded: bool = False) -> pa.Array:
    """``value`` repeated ``n`` times; ``encoded``: as a one-entry dictionary (see
    :data:`~pipelines.sources.options.DIRECT_WRITE_OPTION`), which costs nothing to build and lets
    Parquet write the indices instead of hashing ``n`` copies (a quarter of writing the index
    entries table, 2.5 million rows per GiB of 1 KiB messages)."""
    if value is None:
        return pa.nulls(n, pa.string())
    if encoded:
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value], pa.string()))
    return pa.repeat(pa.scalar(value, pa.string()), n)


def _utc_dates(epoch_ms: pa.Array, times: pa.Array) -> pa.Array:
    """The UTC date of each epoch-millisecond time: a floor division, where Arrow's cast of a
    zoned timestamp to date32 goes through the time zone (a sixth of the derived columns' time)."""
    if epoch_ms.null_count:
        return pc.cast(times, pa.date32())
    return pa.array(np.floor_divide(np.asarray(epoch_ms), _MS_PER_DAY).astype(np.int32), pa.date32())


def _batch(arrays: list[pa.Array], schema: pa.Schema, encoded: bool) -> pa.RecordBatch:
    """``schema``'s batch; ``encoded`` arrays keep their own types (views, dictionaries), which the
    direct writer's cast to the table schema keeps too (:func:`pipelines.delta_files.keep_encodings`)."""
    if encoded:
        return pa.RecordBatch.from_arrays(arrays, names=schema.names)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def lake_columns(batch: pa.RecordBatch, broker_name: str, segment_file: str,
                 ingest_run_id: str | None, encoded: bool = False) -> pa.RecordBatch:
    """A RECORD_SCHEMA batch → a MESSAGES_SCHEMA batch (derived columns, all vectorised).
    ``encoded``: the per-task constants as dictionaries (for the direct Parquet writer only)."""
    n = batch.num_rows
    born_ms = batch.column("born_timestamp")
    store_ms = batch.column("store_timestamp")
    topic = batch.column("topic")
    props = batch.column("properties")
    is_retry = pc.starts_with(topic, RETRY_GROUP_TOPIC_PREFIX)
    is_dlq = pc.starts_with(topic, DLQ_GROUP_TOPIC_PREFIX)
    null_str = pa.scalar(None, pa.string())
    if pc.any(pc.or_(is_retry, is_dlq)).as_py():  # most batches hold neither: skip two slices of every topic
        group = pc.if_else(is_retry, pc.utf8_slice_codeunits(topic, len(RETRY_GROUP_TOPIC_PREFIX)),
                           pc.if_else(is_dlq, pc.utf8_slice_codeunits(topic, len(DLQ_GROUP_TOPIC_PREFIX)), null_str))
    else:
        group = pa.nulls(n, pa.string())
    keys = props.keys  # every map's keys (of a sliced batch: a superset), checked once before two lookups
    if pc.any(pc.or_(pc.equal(keys, PROPERTY_ORIGIN_MESSAGE_ID), pc.equal(keys, PROPERTY_DLQ_ORIGIN_MESSAGE_ID))).as_py():
        origin = pc.coalesce(pc.map_lookup(props, PROPERTY_ORIGIN_MESSAGE_ID, "first"),
                             pc.map_lookup(props, PROPERTY_DLQ_ORIGIN_MESSAGE_ID, "first"))
    else:  # most batches: no retried or dead-lettered copy in them
        origin = pa.nulls(n, pa.string())
    store_time = pc.multiply(store_ms, 1000).view(_TS_US_UTC)
    extra = {
        "born_time": pc.multiply(born_ms, 1000).view(_TS_US_UTC),
        "store_time": store_time,
        "broker_name": _constant(broker_name, n, encoded),
        "store_date": _utc_dates(store_ms, store_time),
        "segment_file": _constant(segment_file, n, encoded),
        "ingest_run_id": _constant(ingest_run_id, n, encoded),
        "is_retry": is_retry,
        "is_dlq": is_dlq,
        "consumer_group": group,
        "origin_msg_id": origin,
    }
    arrays = list(batch.columns) + [extra[f.name] for f in MESSAGES_SCHEMA if f.name not in RECORD_SCHEMA.names]
    return _batch(arrays, MESSAGES_SCHEMA, encoded or pa.types.is_binary_view(batch.schema.field("body").type))


class RocketMQReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.location = store_location(options)
        self.broker_name = options.get("brokerName") or DEFAULT_BROKER_NAME
        self.split_bytes = opt_int(options, "splitBytes", DEFAULT_SPLIT_BYTES)
        if self.split_bytes <= 0:
            raise ValueError("splitBytes must be positive")
        self.from_offset = opt_int(options, "fromOffset", None)
        self.until_offset = opt_int(options, "untilOffset", None)
        self.segment_size = opt_int(options, "segmentSize", None)
        self.ingest_run_id = options.get("ingestRunId")
        self.verify_crc = opt_bool(options, "verifyCrc", True)
        self.direct_write = opt_bool(options, DIRECT_WRITE_OPTION, False)
        self.walk_pieces = self.direct_write and opt_bool(options, WALK_PIECES_OPTION, False)
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
        segments, _ = segment_files(StoreFiles(self.location), self.segment_size)
        splits = _splits_for(segments, self.split_bytes, self.pushed.min_offset, self.pushed.max_offset)
        return list(splits) or [InputPartition(None)]

    # -- reading (executor-side Python worker) -------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, CommitLogSplit):
            return iter(())
        return self._read_split(partition)

    def _read_split(self, split: CommitLogSplit) -> Iterator[pa.RecordBatch | SideRows]:
        walked: list[WalkPiece] | None = [] if self.walk_pieces else None
        for batch in decode_split(split, self.pushed, verify_crc=self.verify_crc, body_view=self.direct_write,
                                  walked=walked):
            yield lake_columns(batch, self.broker_name, split.file_name, self.ingest_run_id, self.direct_write)
        if walked is not None:
            yield SideRows(walk_pieces.to_batch(walked))


def decode_split(split: CommitLogSplit, pushed: PushedFilters | None = None, *, verify_crc: bool = True,
                 stats: DecodeStats | None = None, body_view: bool = False,
                 walked: list[WalkPiece] | None = None) -> Iterator[pa.RecordBatch]:
    """RECORD_SCHEMA batches of the records starting in the split (pushed filters applied exactly),
    read with ranged reads in pieces, each into a buffer of its size plus one maximum record, the
    next read while one is decoded (:func:`pipelines.commitlog_ranges.decode_pieces`, which also
    fills ``walked``)."""
    pushed = pushed or PushedFilters()
    for batch in decode_pieces(split.segment, split.start, split.end, search_first=split.start != 0,
                               flt=pushed.decode_filter(), verify_crc=verify_crc, stats=stats, body_view=body_view,
                               walked=walked):
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
    files: tuple[StoreFile, ...] = ()  # the queue's files as listed (read by a remote store's task)

    @property
    def value(self):
        return (self.topic, self.queue_id)


class ConsumeQueueReader(DataSourceReader):
    """Option ``fromOffset``: a queue's leading files whose units all point below it are not read
    (:meth:`ConsumeQueue.skip_files_below`; an incremental or streaming run keeps only newer units)."""

    def __init__(self, options) -> None:
        self.location = store_location(options)
        self.broker_name = options.get("brokerName") or DEFAULT_BROKER_NAME
        self.from_offset = opt_int(options, "fromOffset", 0)
        self.direct_write = opt_bool(options, DIRECT_WRITE_OPTION, False)
        self.store: StoreFiles | None = None

    def partitions(self) -> list[InputPartition]:
        from broker.store.consume_queue import list_queues

        self.store = StoreFiles(self.location)  # travels to the tasks with its listings
        try:
            min_offset = self.store.commitlog_segments()[0].base
        except StorageError:
            min_offset = 0  # no commitlog: every unit is above the (nonexistent) minimum
        if self.location.is_local:
            # the local reader's own rules (symlinks leaving the store are skipped)
            parts = [QueuePartition(t, q, min_offset) for t, q in list_queues(self.location.uri)]
        else:
            queues = self.store.queue_files()
            self.store.queue_files(CONSUME_QUEUE_EXT_DIR)  # listed once here, not by every task
            parts = [QueuePartition(t, q, min_offset, tuple(files)) for (t, q), files in queues.items()]
        return list(parts) or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueuePartition):
            return iter(())
        return self._read(partition)

    def _read(self, part: QueuePartition) -> Iterator[pa.RecordBatch]:
        """One batch per queue file's units: a task's memory is bounded by the file size, not by
        the queue's length (one batch for the whole queue took ~270 MiB for a 2.6M-unit queue of
        the 16 GiB benchmark store, four times what it took at 4 GiB)."""
        store = self.store or StoreFiles(self.location)
        cq = store.consume_queue(part.topic, part.queue_id, list(part.files),
                                 commitlog_min_offset=part.commitlog_min_offset)
        try:
            if self.from_offset > 0:
                cq.skip_files_below(self.from_offset)
            start, end = cq.min_offset, cq.max_offset
            while start < end:
                stop = min(end, cq.reader.next_file_offset(start))
                units = cq.units(start, stop)
                start = stop
                n = len(units)
                if n == 0:
                    continue
                yield _batch([
                    _constant(self.broker_name, n, self.direct_write),
                    _constant(part.topic, n, self.direct_write),
                    pa.repeat(pa.scalar(part.queue_id, pa.int32()), n),
                    pa.array(units["logical_offset"]),
                    pa.array(units["commitlog_offset"]),
                    pa.array(units["size"]),
                    pa.array(units["tags_code"]),
                ], CONSUME_QUEUE_SCHEMA, self.direct_write)
        finally:
            cq.close()


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
    file_name: str
    max_hash_slot_num: int
    max_index_num: int

    @property
    def value(self):
        return self.file_name


class IndexReader(DataSourceReader):
    """Option ``fromOffset``: index files whose header says every entry points below it are not read
    (an incremental or streaming run would otherwise re-read every index file, ~420 MB each at
    Apache's default geometry, to keep a few new entries)."""

    def __init__(self, options) -> None:
        self.location = store_location(options)
        self.broker_name = options.get("brokerName") or DEFAULT_BROKER_NAME
        self.from_offset = opt_int(options, "fromOffset", 0)
        self.direct_write = opt_bool(options, DIRECT_WRITE_OPTION, False)

    def partitions(self) -> list[InputPartition]:
        store = StoreFiles(self.location)
        slots, num = store.index_geometry()
        files = store.index_files()
        if self.from_offset > 0:
            files = [f for f in files if (reach := store.index_reach(f.name)) is None or reach >= self.from_offset]
        return [IndexPartition(f.name, slots, num) for f in files] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, IndexPartition):
            return iter(())
        return self._read(partition)

    def _read(self, part: IndexPartition) -> Iterator[pa.RecordBatch]:
        """The entries in batches of bounded size, each one ranged read of the file."""
        geometry = (part.max_hash_slot_num, part.max_index_num)
        for header, rows in StoreFiles(self.location).iter_index_entries(part.file_name, geometry):
            n = len(rows)
            time_diff = pa.array(rows["time_diff"].astype(np.int64))
            yield _batch([
                _constant(self.broker_name, n, self.direct_write),
                _constant(part.file_name, n, self.direct_write),
                pa.array(rows["key_hash"].astype(np.int32)),
                pa.array(rows["phy_offset"].astype(np.int64)),
                pc.add(pc.multiply(time_diff, 1000), header.begin_timestamp),
                pa.array(rows["prev_index"].astype(np.int32)),
            ], INDEX_ENTRIES_SCHEMA, self.direct_write)


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
    walk reports each corrupt region exactly once without any rule for regions crossing splits. The
    task still reads the segment in bounded windows (:func:`pipelines.commitlog_ranges.walk_range`)."""

    def __init__(self, options) -> None:
        self.location = store_location(options)
        self.broker_name = options.get("brokerName") or DEFAULT_BROKER_NAME
        self.from_offset = opt_int(options, "fromOffset", None)
        self.until_offset = opt_int(options, "untilOffset", None)
        self.segment_size = opt_int(options, "segmentSize", None)
        self.ingest_run_id = options.get("ingestRunId")

    def partitions(self) -> list[InputPartition]:
        segments, segment_size = segment_files(StoreFiles(self.location), self.segment_size)
        splits = _splits_for(segments, segment_size, self.from_offset, self.until_offset)
        return list(splits) or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, CommitLogSplit):
            return iter(())
        return self._read(partition)

    def _read(self, split: CommitLogSplit) -> Iterator[pa.RecordBatch]:
        walk = walk_range(split.segment, split.start, split.end, search_first=split.start != 0)
        if walk.findings:
            yield pa.RecordBatch.from_pylist([
                {"broker_name": self.broker_name, "file": f.file, "offset": f.offset,
                 "reason": f"{f.kind}: {f.detail}", "bytes_skipped": f.bytes_skipped,
                 "ingest_run_id": self.ingest_run_id} for f in walk.findings], schema=CORRUPT_RECORDS_SCHEMA)


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
