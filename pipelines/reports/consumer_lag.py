"""Consumer lag snapshot: one row per (broker, group, topic, queue) read straight from a store.

Inputs per store, all read-only (a live broker's store works: nothing is locked or written):

* ``config/consumerOffset.json``: committed offsets (``topic@group`` -> {queue: next offset});
* ``config/subscriptionGroup.json``: the groups, and for each the topics it subscribes to from
  Apache 5.x's ``subscriptionDataSet`` (our broker records it from push consumers' heartbeats and
  from the subscription pull consumers state in each PULL), so a group that never committed still
  shows its backlog;
* ``config/topics.json``: ``readQueueNums`` of each topic, so queues without a message yet show as
  ``0/0`` rows as ``mqadmin consumerProgress`` shows them;
* each queue's ConsumeQueue (min/max logical offsets, min derived from the commitlog's first file
  like Apache's ``correctMinOffset``) and, for two units per queue, the STORETIMESTAMP of the
  commitlog record they point at (a fixed-position header field: no body is decoded).

Which topics a group gets rows for: the topics it committed on, plus the topics in its
``subscriptionDataSet``; a subscribed ``%RETRY%`` topic that has no consume queue yet (no message
was ever retried) is left out. Broker-internal groups (the ones a fresh broker creates) only get rows
when they committed offsets. A group with neither source is logged at INFO and has no rows.

Semantics of each column are those of :data:`schemas.reports.CONSUMER_LAG_COLUMNS`:
``lag_messages = max - max(offset, min)`` (clamped at 0; a never-committed queue counts from
``min``), ``lost_messages = min - offset`` when the committed offset lies below the queue's min (the
messages were deleted before they were consumed), ``lag_seconds = (newest - next unconsumed)
store timestamps / 1000``, exactly (0 when lag is 0; null when one of the two records cannot be
read yet, e.g. a unit whose record a live broker is still writing: logged, never an error).

The snapshot is small (one row per queue and group) and computed by the driver; rows come back in
``(broker, group, topic, queue)`` order so two snapshots of the same store compare row by row.

A store behind a URI (``s3://bucket/store``, with its storage options in a :class:`Location`) gives
the same rows, read through :class:`pipelines.store_files.StoreFiles`: listings, the consume queues
some group reads (each file one request), commitlog headers by ranged reads; only the small config
files are copied to a temporary directory, so that one parser (with its ``.bak`` fallback) reads them.
"""

from __future__ import annotations

import logging
import os
import struct
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from broker.store.commitlog import CommitLog
from broker.store.config_files import StoreConfig, SubscriptionGroupConfig, load_store_config
from broker.store.constants import COMMITLOG_DIR, CONFIG_DIR
from broker.store.record_layout import (
    MAGIC_V1,
    MAGIC_V2,
    POS_PHYSICAL_OFFSET,
    POS_SYS_FLAG,
    SIZE_MAGIC,
    STORE_TIMESTAMP_PROBE,
    read_store_timestamp,
)
from broker.store.consume_queue import ConsumeQueue, list_queues
from broker.store.topics import RETRY_GROUP_TOPIC_PREFIX
from pipelines.store_files import StoreFile, StoreFiles
from pipelines.storage import Location, as_location
from schemas.reports import (
    CONSUMER_LAG,
    CONSUMER_LAG_SCHEMA,
    CONSUMER_LAG_TABLE,
    OFFSET_SOURCE_FILE,
    OFFSET_SOURCE_NONE,
)

log = logging.getLogger(__name__)

SUBSCRIPTION_DATA_SET = "subscriptionDataSet"  # Apache 5.x SubscriptionGroupConfig field


def _internal_groups() -> frozenset[str]:
    """The groups a fresh broker creates (4.9.8's list, from our broker) plus 5.x's transaction
    check group: operators never consume with them, so they are noise unless they committed."""
    from broker.server.offsets import SYSTEM_GROUPS

    return frozenset(SYSTEM_GROUPS) | {"CID_SYS_RMQ_TRANS"}


# =====================================================================================================
# Store timestamps at physical offsets
# =====================================================================================================
_I64 = struct.Struct(">q")
_MAGICS = frozenset((MAGIC_V1, MAGIC_V2))


class StoreTimestampReader:
    """STORETIMESTAMP of the record at a commitlog offset, read from the header alone.

    The field sits right after BORNHOST, whose size depends on one sysFlag bit (store-format.md
    3.2). A record is trusted only when its TOTALSIZE equals the consume-queue unit's size, its
    magic is a message magic and its PHYSICALOFFSET field names its own position; anything else
    (a file not listed when the reader opened, bytes a live broker has not written yet) gives None.

    A local store's segments are opened once and kept open; a remote store's headers are ranged
    reads through ``files`` (never a whole segment).
    """

    def __init__(self, store_dir: str | os.PathLike | Location, files: StoreFiles | None = None) -> None:
        location = as_location(store_dir)
        self._remote: StoreFiles | None = None
        if location.is_local:
            commitlog = CommitLog.open(location.uri)
            self._directory = commitlog.directory
            self._segments = [StoreFile(s.name, s.base, s.size) for s in commitlog.segments]
            self._segment_size = commitlog.segment_size
        else:
            self._remote = files if files is not None else StoreFiles(location)
            self._segments = self._remote.commitlog_segments()
            self._segment_size = self._remote.segment_size()
        self._files: dict[int, BinaryIO] = {}
        self.unreadable = 0

    @property
    def min_offset(self) -> int:
        return self._segments[0].base if self._segments else 0

    def _segment_for(self, offset: int) -> StoreFile | None:
        for seg in self._segments:
            if seg.base <= offset < seg.base + self._segment_size:
                return seg
        return None

    def _read(self, seg: StoreFile, position: int, length: int) -> bytes:
        if self._remote is not None:
            return self._remote.file(COMMITLOG_DIR, seg.name).read_range(position, length)
        fh = self._files.get(seg.base)
        if fh is None:
            fh = self._files[seg.base] = open(self._directory / seg.name, "rb")
        fh.seek(position)
        return fh.read(length)

    def store_timestamp(self, physical_offset: int, size: int) -> int | None:
        seg = self._segment_for(physical_offset)
        if seg is None:
            return self._miss(physical_offset, "no commitlog file holds it")
        try:
            data = self._read(seg, physical_offset - seg.base, STORE_TIMESTAMP_PROBE)
        except OSError as exc:
            return self._miss(physical_offset, str(exc))
        if len(data) < POS_SYS_FLAG + 4:
            return self._miss(physical_offset, "past the end of its file")
        total_size, magic = SIZE_MAGIC.unpack_from(data, 0)
        if magic not in _MAGICS or total_size != size:
            return self._miss(physical_offset, f"no message record of {size} bytes there (size {total_size})")
        if _I64.unpack_from(data, POS_PHYSICAL_OFFSET)[0] != physical_offset:
            return self._miss(physical_offset, "PHYSICALOFFSET field does not match")
        try:
            return read_store_timestamp(data)
        except struct.error:
            return self._miss(physical_offset, "header cut short")

    def _miss(self, physical_offset: int, why: str) -> None:
        self.unreadable += 1
        log.warning("store timestamp at commitlog offset %d not readable (%s): left null", physical_offset, why)
        return None

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def __enter__(self) -> "StoreTimestampReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# =====================================================================================================
# Which group consumes which topic
# =====================================================================================================
def subscribed_topics(config: SubscriptionGroupConfig) -> list[str]:
    """Topics in a group's ``subscriptionDataSet`` (sorted); malformed entries are logged and skipped."""
    value = config.extra.get(SUBSCRIPTION_DATA_SET)
    if value is None:
        return []
    if not isinstance(value, list):
        log.warning("group %s: %s is not a list; ignored", config.group_name, SUBSCRIPTION_DATA_SET)
        return []
    topics = set()
    for item in value:
        topic = item.get("topic") if isinstance(item, dict) else None
        if isinstance(topic, str) and topic:
            topics.add(topic)
        else:
            log.warning("group %s: %s entry %r has no topic; ignored", config.group_name, SUBSCRIPTION_DATA_SET, item)
    return sorted(topics)


def group_topics(config: StoreConfig, queue_topics: Iterable[str]) -> dict[str, list[str]]:
    """group -> sorted topics to report: committed topics ∪ subscribed topics (see module doc)."""
    with_queues = set(queue_topics)
    committed: dict[str, set[str]] = {}
    for topic, group, _, _ in config.consumer_offsets.entries():
        committed.setdefault(group, set()).add(topic)
    internal = _internal_groups()
    out: dict[str, set[str]] = {g: set(t) for g, t in committed.items()}
    for name, group_config in config.subscription_groups.groups.items():
        subscribed = {t for t in subscribed_topics(group_config)
                      if not (t.startswith(RETRY_GROUP_TOPIC_PREFIX) and t not in with_queues)}
        if name in committed:
            out[name] |= subscribed
        elif name in internal:
            log.debug("broker-internal group %s has no committed offsets: skipped", name)
        elif subscribed:
            out[name] = subscribed
        else:
            log.info("group %s has no committed offsets and no %s: no lag rows", name, SUBSCRIPTION_DATA_SET)
    return {g: sorted(t) for g, t in sorted(out.items())}


# =====================================================================================================
# The snapshot
# =====================================================================================================
@dataclass
class _QueueState:
    """What a queue contributes to every group reading it, computed once per snapshot."""

    min_offset: int
    max_offset: int
    cq: ConsumeQueue | None
    times: dict[int, int | None] = field(default_factory=dict)  # logical offset -> store timestamp


class _StoreQueues:
    """Consume queues of one store, opened lazily and shared by the groups that read them (a remote
    store's queue files are read when a group first needs the queue, each with one request)."""

    def __init__(self, files: StoreFiles, reader: StoreTimestampReader) -> None:
        self.files = files
        self.reader = reader
        self._remote_files = None if files.location.is_local else files.queue_files()
        queues = list_queues(files.location.uri) if self._remote_files is None else list(self._remote_files)
        self.on_disk: dict[str, set[int]] = {}
        for topic, qid in queues:
            self.on_disk.setdefault(topic, set()).add(qid)
        self._states: dict[tuple[str, int], _QueueState | None] = {}

    def _open(self, topic: str, queue_id: int) -> ConsumeQueue:
        if self._remote_files is None:
            return ConsumeQueue(self.files.location.uri, topic, queue_id, commitlog_min_offset=self.reader.min_offset)
        return self.files.consume_queue(topic, queue_id, self._remote_files[(topic, queue_id)],
                                        commitlog_min_offset=self.reader.min_offset)

    def state(self, topic: str, queue_id: int) -> _QueueState | None:
        """Offsets of a queue (0/0 when it has no directory yet); None for a queue whose files
        cannot be read at all (logged): no row beats a wrong one."""
        key = (topic, queue_id)
        if key not in self._states:
            found: _QueueState | None = _QueueState(0, 0, None)
            if queue_id in self.on_disk.get(topic, ()):
                try:
                    cq = self._open(topic, queue_id)
                    found = _QueueState(cq.min_offset, cq.max_offset, cq)
                except (OSError, ValueError) as exc:
                    log.error("consume queue %s/%d unreadable (%s): no lag rows for it", topic, queue_id, exc)
                    found = None
            self._states[key] = found
        return self._states[key]

    def store_timestamp(self, state: _QueueState, logical: int) -> int | None:
        if logical in state.times:
            return state.times[logical]
        unit = state.cq.unit_at(logical) if state.cq is not None else None
        ts = None if unit is None else self.reader.store_timestamp(unit.commitlog_offset, unit.size)
        state.times[logical] = ts
        return ts


@dataclass(frozen=True)
class QueueLag:
    """One queue's lag for one group (a row of ``consumer_lag`` without the snapshot columns)."""

    consumer_offset: int | None
    min_offset: int
    max_offset: int
    lag_messages: int
    next_store_timestamp_ms: int | None
    newest_store_timestamp_ms: int | None
    lag_seconds: float | None
    lost_messages: int


def queue_lag(consumer_offset: int | None, min_offset: int, max_offset: int,
              store_timestamp) -> QueueLag:
    """The lag arithmetic of the schema, for one queue. ``store_timestamp(logical)`` answers the
    store time of the message at a logical offset (or None when it cannot be read)."""
    position = min_offset if consumer_offset is None else max(consumer_offset, min_offset)
    position = min(position, max_offset)  # an offset past the end (a truncated queue) owes nothing
    lag = max_offset - position
    lost = min_offset - consumer_offset if consumer_offset is not None and consumer_offset < min_offset else 0
    newest = store_timestamp(max_offset - 1) if max_offset > min_offset else None
    nxt = store_timestamp(position) if lag > 0 else None
    if lag == 0:
        seconds: float | None = 0.0
    elif newest is None or nxt is None:
        seconds = None
    else:
        seconds = max(newest - nxt, 0) / 1000.0  # store clocks may step back; lag never does
    return QueueLag(consumer_offset, min_offset, max_offset, lag, nxt, newest, seconds, lost)


def snapshot_id_for(snapshot_ts: datetime) -> str:
    """Deterministic run id from the snapshot time (same time, same id: reruns are recognisable)."""
    return "lag-" + snapshot_ts.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


def _load_config(files: StoreFiles) -> StoreConfig:
    """The store's config tables. A remote store's ``config/`` files (a few KB) are copied to a
    temporary directory first, so that :func:`load_store_config` reads them by its own rules
    (``.bak`` fallback included)."""
    if files.location.is_local:
        return load_store_config(files.location.uri)
    with tempfile.TemporaryDirectory(prefix="rocketlake-config-") as tmp:
        for info in files.file(CONFIG_DIR).list():
            if info.type == pafs.FileType.File:
                data = files.read_file(CONFIG_DIR, info.base_name)
                if data is not None:
                    Path(tmp, CONFIG_DIR).mkdir(exist_ok=True)
                    Path(tmp, CONFIG_DIR, info.base_name).write_bytes(data)
        return load_store_config(tmp)


def snapshot_store(broker_name: str, store_dir: str | os.PathLike | Location, snapshot_ts: datetime,
                   snapshot_id: str | None = None) -> pa.Table:
    """Lag rows of every consuming group of one store (a local directory or a :class:`Location`
    / URI), in :data:`CONSUMER_LAG_SCHEMA`. A remote store that lists no commitlog raises
    :class:`pipelines.storage.StorageError`."""
    snapshot_id = snapshot_id or snapshot_id_for(snapshot_ts)
    columns: dict[str, list] = {name: [] for name in CONSUMER_LAG_SCHEMA.names}
    files = StoreFiles(store_dir)
    reader = StoreTimestampReader(files.location, files)
    config = _load_config(files)
    with reader:
        queues = _StoreQueues(files, reader)
        for group, topics in group_topics(config, queues.on_disk).items():
            for topic in topics:
                committed = config.consumer_offsets.offsets_for(group, topic)
                topic_config = config.topics.get(topic)
                queue_ids = set(queues.on_disk.get(topic, ())) | set(committed)
                if topic_config is not None:
                    queue_ids |= set(range(topic_config.read_queue_nums))
                if not queue_ids:
                    log.info("group %s, topic %s: the topic has no queues on broker %s", group, topic,
                             broker_name)
                for qid in sorted(queue_ids):
                    offset = committed.get(qid)
                    if offset is not None and offset < 0:
                        log.warning("group %s %s/%d: committed offset %d < 0 treated as none", group, topic,
                                    qid, offset)
                        offset = None
                    state = queues.state(topic, qid)
                    if state is None:
                        continue
                    lag = queue_lag(offset, state.min_offset, state.max_offset,
                                    lambda logical, s=state: queues.store_timestamp(s, logical))
                    _append_row(columns, snapshot_ts, snapshot_id, broker_name, group, topic, qid, lag)
        if reader.unreadable:
            log.warning("broker %s: %d store timestamp(s) unreadable (live store?)", broker_name,
                        reader.unreadable)
    return pa.table(columns, schema=CONSUMER_LAG_SCHEMA)


def _append_row(columns: dict[str, list], snapshot_ts: datetime, snapshot_id: str, broker: str, group: str,
                topic: str, queue_id: int, lag: QueueLag) -> None:
    row = {
        "snapshot_ts": snapshot_ts, "snapshot_id": snapshot_id, "broker_name": broker,
        "consumer_group": group, "topic": topic, "queue_id": queue_id,
        "consumer_offset": lag.consumer_offset, "min_offset": lag.min_offset, "max_offset": lag.max_offset,
        "lag_messages": lag.lag_messages, "next_store_timestamp_ms": lag.next_store_timestamp_ms,
        "newest_store_timestamp_ms": lag.newest_store_timestamp_ms, "lag_seconds": lag.lag_seconds,
        "lost_messages": lag.lost_messages,
        "offset_source": OFFSET_SOURCE_NONE if lag.consumer_offset is None else OFFSET_SOURCE_FILE,
    }
    for name, value in row.items():
        columns[name].append(value)


def snapshot_stores(stores: Iterable[tuple[str, str | os.PathLike | Location]], snapshot_ts: datetime,
                    snapshot_id: str | None = None) -> pa.Table:
    """One snapshot over several stores ``(broker_name, path or Location)``: one ``snapshot_ts`` for all."""
    snapshot_id = snapshot_id or snapshot_id_for(snapshot_ts)
    tables = [snapshot_store(name, path, snapshot_ts, snapshot_id) for name, path in stores]
    if not tables:
        return CONSUMER_LAG_SCHEMA.empty_table()
    return pa.concat_tables(tables).sort_by(
        [("broker_name", "ascending"), ("consumer_group", "ascending"), ("topic", "ascending"),
         ("queue_id", "ascending")])


# =====================================================================================================
# The Delta table
# =====================================================================================================
def recorded_brokers(lake: str | os.PathLike | Location, snapshot_ts: datetime, brokers: Iterable[str]) -> set[str]:
    """Brokers that already have rows at exactly ``snapshot_ts`` (a rerun of the same snapshot)."""
    from pipelines.lake import scan_arrow, table_exists

    brokers = sorted(set(brokers))
    if not brokers or not table_exists(lake, CONSUMER_LAG_TABLE):
        return set()
    ts = pa.scalar(snapshot_ts, type=CONSUMER_LAG_SCHEMA.field("snapshot_ts").type)
    found = scan_arrow(lake, CONSUMER_LAG_TABLE, columns=["broker_name"],
                       filter=(pc.field("snapshot_ts") == ts) & pc.field("broker_name").isin(brokers))
    return set(found.column("broker_name").to_pylist())


def append_snapshot(lake: str | os.PathLike | Location, snapshot: pa.Table) -> list[str]:
    """Append the snapshot to ``consumer_lag`` (one small delta-rs commit, partitioned by broker),
    leaving out brokers whose rows for this ``snapshot_ts`` are already there. Returns the brokers
    written. Idempotent per (broker, snapshot_ts), so a retried run does not double-count lag."""
    from pipelines.lake import append_arrow

    if snapshot.num_rows == 0:
        return []
    times = pc.unique(snapshot.column("snapshot_ts")).to_pylist()
    if len(times) != 1:
        raise ValueError(f"a snapshot has one snapshot_ts, this one has {len(times)}")
    brokers = set(snapshot.column("broker_name").to_pylist())
    already = recorded_brokers(lake, times[0], brokers)
    for broker in sorted(already):
        log.warning("consumer_lag already has broker %s at %s: not appended again", broker, times[0])
    keep = sorted(brokers - already)
    if not keep:
        return []
    rows = snapshot.filter(pc.field("broker_name").isin(keep)).cast(CONSUMER_LAG_SCHEMA)
    append_arrow(lake, CONSUMER_LAG_TABLE, rows, partition_by=CONSUMER_LAG.partition_by)
    return keep
