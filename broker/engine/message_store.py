"""The broker's storage engine: a thread-safe ``DefaultMessageStore`` (append, flush, read, query).

Writes append to the commitlog with :class:`~broker.store.commitlog.CommitLogWriter`; the consume
queues and the index are built by the :mod:`broker.engine.dispatch` mode the store runs in (inline:
same call, same lock; external: the dispatcher process). Reads serve pulls straight from the files
with ``pread`` (CQ units, then record bytes exactly as stored, which is the PULL_MESSAGE body).
Settings are :class:`~broker.engine.store_settings.StoreSettings`; what to do with a message a consumer
sends back is the request layer's (:mod:`broker.server.send_back`), and so are the topic, group
and offset tables (:mod:`broker.server.metadata`): the store asks only whether a topic has a config
(``set_topic_config_check``). Behaviour follows Apache
RocketMQ 4.9.8 as summarised in ``store-format.md`` (3.9 special topics, 4 dispatch, 8
checkpoint/abort, 9 recovery) and ``remoting-protocol.md`` (9.2 pull statuses, 9.3 store-side send
checks, 9.5 offsets).

Threading. One ``_put_lock`` serialises append + dispatch, so commitlog order, queue offsets and CQ order
agree. Reads take no store-wide lock: a queue's written end (``ConsumeQueueView.max_offset``) is
published only after its units were ``pwrite``-n, and the commitlog bytes before that, so a reader that
snapshots the end never sees a unit without its record. ``SYNC_FLUSH`` is a group commit: a put
waits on ``_flush_lock``; whoever holds it fsyncs everything appended so far and advances
``_flushed_offset``, so concurrent puts share one fsync. Lock order is ``_flush_lock`` → ``_put_lock``
→ dispatcher locks; a put never holds ``_put_lock`` while waiting for ``_flush_lock``.
"""

from __future__ import annotations

import enum
import logging
import os
import struct
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from broker.engine import recovery
from broker.engine.dispatch import (
    ConsumeQueueView,
    Dispatcher,
    DispatchMode,
    ExternalDispatch,
    InlineDispatch,
    QueueRegistry,
)
from broker.engine.periodic import Periodic
from broker.store.checkpoint import Checkpoint, CheckpointError, checkpoint_path, read_checkpoint
from broker.engine.store_settings import StoreSettings
from broker.store.clock import now_ms
from broker.store.commitlog import AppendResult, CommitLogWriter, EncodedAppend, offset_to_file_name
from broker.store.config_files import ConfigFileError, load_topic_fences, save_topic_fences
from broker.store.constants import (
    ASYNC_FLUSH,
    CQ_STORE_UNIT_SIZE,
    MAX_MSGS_NUM_BATCH,
    MAX_PROPERTIES_LENGTH,
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    SYNC_FLUSH,
    TOPIC_NAME_PATTERN,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
    is_queued,
)
from broker.store.delay import delay_level_of
from broker.store.index_file import LONG_MAX
from broker.store.java_hash import tags_code
from broker.store.message import MessageRecord, RecordError, decode_record
from broker.store.message_id import encode_offset_msg_id
from broker.store.properties import encode_properties
from broker.store.record_layout import (
    MAGIC_BLANK,
    MAGIC_V1,
    MAGIC_V2,
    SIZE_MAGIC,
    STORE_TIMESTAMP_PROBE,
    read_store_timestamp,
)
from broker.store.store_lock import StoreLock, abort_marker_exists, create_abort_marker, remove_abort_marker
from broker.store.topics import SCHEDULE_TOPIC, InvalidTopicError, delay_level_to_queue_id, validate_topic

log = logging.getLogger(__name__)

# Apache scans at most max(16000 bytes of CQ, maxMsgNums units) per pull (maxFilterMessageCount).
_MAX_FILTER_SCAN_BYTES = 16000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# =====================================================================================================
# Settings and results
# =====================================================================================================
class PutStatus(enum.Enum):
    """``PutMessageStatus`` names (remoting-protocol.md 9.3 maps them to response codes)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"  # SYNC_MASTER: no slave acknowledged in syncFlushTimeout
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"  # SYNC_MASTER: no slave, or one too far behind
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    # ours: the topic is being deleted, or was deleted by this process and has no config again
    # (a send that checked the topic just before DELETE_TOPIC_IN_BROKER must not recreate its queue)
    TOPIC_NOT_EXIST = "TOPIC_NOT_EXIST"


class GetStatus(enum.Enum):
    """``GetMessageStatus`` names; the pull processor puts the name in ``remark``."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(frozen=True, slots=True)
class EncodedPut:
    """A single message whose record bytes were built before the store saw it (a plain send drafted
    in a network process, :mod:`broker.server.send_draft`): the store only places it — queue id,
    offsets, store time — and appends the bytes (:meth:`CommitLogWriter.append_encoded`)."""

    data: bytes
    topic: str
    queue_id: int


_STORED = frozenset({PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.FLUSH_SLAVE_TIMEOUT,
                     PutStatus.SLAVE_NOT_AVAILABLE})


@dataclass(frozen=True)
class PutResult:
    """Outcome of a put. ``topic``/``queue_id`` are where the record was *stored* (the delay topic
    for a delayed message); ``queue_offset`` is the first record's; ``msg_id`` joins the
    offsetMsgIds with ``,`` for a batch, as the SEND response does."""

    status: PutStatus
    msg_id: str = ""
    topic: str = ""
    queue_id: int = 0
    queue_offset: int = 0
    physical_offsets: tuple[int, ...] = ()
    wrote_bytes: int = 0
    store_timestamp: int = 0
    records: tuple[MessageRecord, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        """Stored (a flush or replica timeout still means the record is in the log, as in Apache)."""
        return self.status in _STORED

    @property
    def msg_ids(self) -> list[str]:
        return self.msg_id.split(",") if self.msg_id else []


@dataclass(frozen=True)
class GetResult:
    """Outcome of a pull: ``body`` is the matched records back to back, byte-exact as stored."""

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    body: bytes = b""
    queue_offsets: tuple[int, ...] = ()
    physical_offsets: tuple[int, ...] = ()

    @property
    def message_count(self) -> int:
        return len(self.queue_offsets)


@dataclass(frozen=True)
class QueryResult:
    """QUERY_MESSAGE by key: matching records (verified against KEYS/UNIQ_KEY), oldest first."""

    physical_offsets: tuple[int, ...]
    body: bytes
    # how far the index had got when it was asked (newest file's header; 0/0: no index yet). Apache
    # answers these as indexLastUpdateTimestamp/-Phyoffset, so a client can tell "not found" from
    # "not indexed yet" (the replay's UNKNOWN resolution relies on it)
    index_end_timestamp: int = 0
    index_end_offset: int = 0


class StoreError(RuntimeError):
    """The store cannot be opened or used (wrong geometry, not open)."""


class ReplicaError(StoreError):
    """A slave was sent commitlog bytes it cannot place (not at its end): it drops the link."""


# =====================================================================================================
# Commitlog read side
# =====================================================================================================
class _SegmentFiles:
    """Read-only descriptors of commitlog segments, opened once and shared by all readers
    (``pread`` needs no seek, so one descriptor serves every thread) and by the fsyncs."""

    def __init__(self, directory: Path, segment_size: int) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def fd(self, base: int) -> int:
        fd = self._fds.get(base)
        if fd is not None:
            return fd
        with self._lock:
            fd = self._fds.get(base)
            if fd is None:
                fd = os.open(self.directory / offset_to_file_name(base), os.O_RDONLY)
                self._fds[base] = fd
            return fd

    def pread(self, offset: int, size: int) -> bytes:
        base = offset - offset % self.segment_size
        return os.pread(self.fd(base), size, offset - base)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


# =====================================================================================================
# The store
# =====================================================================================================
class MessageStore:
    """One broker store directory, opened for writing (see the module docstring for threading).

    ``clock`` returns epoch ms; it stamps STORETIMESTAMP (tests pass a fake one to drive delays).
    """

    def __init__(self, store_dir: str | os.PathLike, config: StoreSettings | None = None, *,
                 clock: Callable[[], int] | None = None) -> None:
        self.store_dir = Path(store_dir)
        self.settings = config or StoreSettings()
        self.clock = clock or now_ms
        self._delay_levels = self.settings.delay_levels
        self._put_lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._open = False
        self._lock: StoreLock | None = None
        self._writer: CommitLogWriter | None = None
        self._dispatcher: Dispatcher | None = None
        self._dispatch: DispatchMode | None = None  # inline or external (StoreSettings.external_dispatch)
        self._segments: _SegmentFiles | None = None
        self.queues: QueueRegistry | None = None
        self._committed_end = 0  # commitlog bytes readable by others
        self._flushed_offset = 0  # commitlog bytes fsynced
        self._dirty_segments: set[int] = set()
        self._last_store_ts = 0
        self._flushed_store_ts = 0
        self._commitlog_min = 0
        self._written_checkpoint: Checkpoint | None = None
        self._threads: list[Periodic] = []
        self.recovery: recovery.RecoveryReport | None = None  # what the last open() did
        # whether a topic has a config (the request layer's topic table: set_topic_config_check);
        # until one is given no topic has one, so a deleted topic takes no client put
        self._topic_configured: Callable[[str], bool] = lambda topic: False
        self._commit_listener: Callable[[int], None] | None = None
        self._commit_watchers: list[Callable[[int], None]] = []  # the HA master's wake-up
        # replication (set by the broker after open): a SYNC_MASTER's wait for its slave, given the
        # commitlog end a put needs replicated (CommitLog.handleHA); a slave refuses every put
        self.replica_gate: Callable[[int], PutStatus] | None = None
        self.slave_mode = False
        # notified when an external dispatcher's progress was applied (``wait_dispatched`` waits on it)
        self._dispatch_progress = threading.Condition()
        self._topic_fences: dict[str, int] = {}  # persisted in config/DELETED_TOPICS_FILE
        self._deleting: set[str] = set()  # topics whose queues are being removed: every put refused
        self._deleted: set[str] = set()  # deleted by this process: client puts refused while config-less
        self._delete_lock = threading.Lock()  # one topic deletion at a time (Apache's is synchronized)

    # ---- lifecycle ---------------------------------------------------------------------------------
    def open(self) -> recovery.RecoveryReport:
        """Lock the store, recover (abnormally if ``abort`` exists), re-dispatch what the queues
        miss, rebuild the queue offset counters from the queues and create ``abort``. Returns the
        :class:`~broker.engine.recovery.RecoveryReport`. Nothing runs in the background until
        :meth:`start_background`."""
        if self._open:
            raise StoreError(f"store {self.store_dir} is already open")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        lock = StoreLock(self.store_dir).acquire()
        try:
            abnormal = abort_marker_exists(self.store_dir)
            report = recovery.repair(self.store_dir, self.settings, abnormal)
            self._commitlog_min = report.commitlog_min_offset
            self.queues = QueueRegistry(self.store_dir, self.settings.cq_file_bytes, self._commitlog_min)
            for (topic, qid), tail in report.queue_tails.items():
                self.queues.seed(topic, qid, tail.max_offset, tail.max_phy_end)
            self._dispatcher = Dispatcher(self.store_dir, self.settings, self.queues, self.clock)
            self._dispatcher.topic_fences = self._load_topic_fences(report)
            self._dispatch = (ExternalDispatch(self._dispatcher, self.store_dir, self.settings)
                              if self.settings.external_dispatch else InlineDispatch(self._dispatcher))
            recovery.redispatch(report, self._dispatcher, self.store_dir, self.settings)
            create_abort_marker(self.store_dir)  # as start() does: from here on a crash is abnormal
            counters = {key: view.max_offset for key, view in self.queues.items() if view.max_offset > 0}
            self._writer = CommitLogWriter(self.store_dir, self.settings.segment_bytes, counters)
            self._segments = _SegmentFiles(self.store_dir / "commitlog", self.settings.segment_bytes)
            self._committed_end = self._writer.write_offset
            # what a crashed run wrote may not be on disk yet: the first flush fsyncs the tail file
            self._flushed_offset = self._commitlog_min
            self._dirty_segments = {self._segment_base(self._committed_end)}
            self._load_checkpoint(report.last_store_timestamp)
            self._dispatch.opened(self._committed_end)
        except BaseException:
            for resource in (self._writer, self._dispatcher, self._segments):
                if resource is not None:
                    resource.close()
            self._writer = self._dispatcher = self._segments = None
            lock.release()
            raise
        self._lock = lock
        self.recovery = report
        self._open = True
        log.info("opened store %s (%s, commitlog end %d)", self.store_dir, self.settings.flush_disk_type,
                 self._committed_end)
        return report

    def _load_topic_fences(self, report: recovery.RecoveryReport) -> dict[str, int]:
        """Fences of deleted topics, as far as they still matter: one at or below the commitlog's
        first offset guards nothing any more, and one past a recovered (cut) end is lowered to it,
        so records written after the restart are queued whatever their topic."""
        try:
            stored = load_topic_fences(self.store_dir)
        except ConfigFileError as exc:
            raise StoreError(f"cannot read the deleted topics' fences: {exc}") from exc
        fences = {t: min(f, report.commitlog_end) for t, f in stored.items() if f > report.commitlog_min_offset}
        self._topic_fences = dict(fences)
        if fences != stored:
            self._save_topic_fences()
        return fences

    def _save_topic_fences(self) -> None:
        save_topic_fences(self.store_dir, self._topic_fences, fsync=self.settings.fsync_metadata)

    def _load_checkpoint(self, recovered_ts: int) -> None:
        try:
            self._written_checkpoint = read_checkpoint(self.store_dir, allow_short=True)
        except CheckpointError:
            self._written_checkpoint = None
        last = max(recovered_ts, self._dispatcher.last_store_timestamp)
        self._last_store_ts = self._flushed_store_ts = last

    def start_background(self) -> None:
        """Start the async-flush thread (ASYNC_FLUSH only) and the checkpoint thread."""
        self._require_open()
        if self._threads:
            return
        if self.settings.flush_disk_type == ASYNC_FLUSH:
            self._threads.append(Periodic("commitlog-flush", self.settings.flush_interval_ms, self.flush))
        self._threads.append(Periodic("store-checkpoint", self.settings.checkpoint_interval_ms,
                                      self._checkpoint_tick))
        for t in self._threads:
            t.start()

    def close(self) -> None:
        """Clean shutdown: stop the threads, flush and fsync everything, write the checkpoint,
        remove ``abort`` and release the lock. The request layer's metadata (``config/*.json``,
        :class:`~broker.server.metadata.BrokerMetadata`) is persisted by its owner, before this."""
        if not self._open:
            return
        self._stop_puts()
        self.flush()
        self._writer.close()
        logics = self._dispatcher.sync()
        self._dispatcher.close()
        last = max(self._last_store_ts, logics)
        self._write_checkpoint(Checkpoint(last, last, last))
        self._segments.close()
        remove_abort_marker(self.store_dir)
        self._lock.release()
        self._lock = None
        log.info("closed store %s cleanly (commitlog end %d)", self.store_dir, self._committed_end)

    def _stop_puts(self) -> None:
        """The first step of both endings: the periodic threads stopped, and no new put (in-flight
        ones have finished once we hold the put lock)."""
        for t in self._threads:
            t.stop()
        self._threads = []
        with self._put_lock:
            self._open = False

    def abandon(self) -> None:
        """Let go of the store the way a killed process does: ``abort`` stays, no checkpoint. Every
        put already ``pwrite``-d its bytes, so the files are exactly what a ``kill -9`` at this point
        leaves (only fsync is skipped). For tests and fault injection."""
        if not self._open:
            return
        self._stop_puts()
        self._writer.close()
        self._dispatcher.close()
        self._segments.close()
        self._lock.release()
        self._lock = None
        log.warning("abandoned store %s without a clean shutdown", self.store_dir)

    def __enter__(self) -> "MessageStore":
        if not self._open:
            self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher feeding the consume queues and the index (its ``index`` is guarded by
        ``index_lock``)."""
        self._require_open()
        return self._dispatcher

    def _require_open(self) -> None:
        if not self._open:
            raise StoreError(f"store {self.store_dir} is not open")

    # ---- flushing and checkpoint ---------------------------------------------------------------
    def _segment_base(self, offset: int) -> int:
        return offset - offset % self.settings.segment_bytes

    def flush(self) -> bool:
        """fsync the commitlog up to everything appended so far (the async flush tick)."""
        return self._sync_to(self._committed_end)

    def _sync_to(self, offset: int) -> bool:
        """Group commit: make ``[0, offset)`` durable; False if fsync failed or took longer than
        ``sync_flush_timeout_ms`` (the put then answers FLUSH_DISK_TIMEOUT: stored, not confirmed)."""
        started = time.monotonic()
        with self._flush_lock:
            if self._flushed_offset < offset:
                with self._put_lock:
                    target = self._committed_end
                    dirty, self._dirty_segments = self._dirty_segments, set()
                    ts = self._last_store_ts
                try:
                    for base in sorted(dirty):
                        os.fsync(self._segments.fd(base))
                except OSError:
                    log.exception("commitlog fsync failed")
                    with self._put_lock:
                        self._dirty_segments |= dirty  # retried by the next flush
                    return False
                self._flushed_offset = max(self._flushed_offset, target)
                self._flushed_store_ts = max(self._flushed_store_ts, ts)
        return (time.monotonic() - started) * 1000 <= self.settings.sync_flush_timeout_ms

    def _checkpoint_tick(self) -> None:
        logics = self._dispatcher.sync()
        self._write_checkpoint(Checkpoint(self._flushed_store_ts, logics, logics))

    def _write_checkpoint(self, cp: Checkpoint) -> None:
        old = self._written_checkpoint
        if old is not None:  # never move a timestamp backwards
            cp = Checkpoint(max(cp.physic_msg_timestamp, old.physic_msg_timestamp),
                            max(cp.logics_msg_timestamp, old.logics_msg_timestamp),
                            max(cp.index_msg_timestamp, old.index_msg_timestamp),
                            old.master_flushed_offset, old.confirm_phy_offset)
            if cp == old and checkpoint_path(self.store_dir).exists():
                return
        cp.write(checkpoint_path(self.store_dir))
        self._written_checkpoint = cp

    # ---- writing ---------------------------------------------------------------------------------
    def put_message(self, rec: MessageRecord, *, apply_delay: bool = True) -> PutResult:
        """Store one message (``putMessage``).

        Store-side rules of 4.9.8: topic valid and ≤ 127 chars, body ≤ ``max_message_size``
        (MESSAGE_ILLEGAL), properties ≤ 32767 bytes (PROPERTIES_SIZE_EXCEEDED); ``DELAY=n>0`` on a
        NOT/COMMIT message moves it to ``SCHEDULE_TOPIC_XXXX`` queue n-1 with ``REAL_TOPIC`` and
        ``REAL_QID`` added (n clamped to the highest level). The store host, store timestamp,
        offsets and body CRC are filled in here; the broker's own properties (``CLUSTER``) are the
        request layer's business. ``apply_delay=False`` is for the schedule service's delivery, whose
        properties still say ``DELAY`` (store-format.md 3.9) but must not be delayed again.
        """
        return self._put([rec], batch=False, apply_delay=apply_delay)

    def put_messages(self, records: Iterable[MessageRecord]) -> PutResult:
        """Store a 4.x batch (``putMessages``): one record per inner message, same topic and queue,
        one store timestamp, consecutive queue offsets, all in one commitlog file. Delayed or
        transactional batches are MESSAGE_ILLEGAL, as in Apache."""
        return self._put(list(records), batch=True, apply_delay=False)

    def _put(self, records: list[MessageRecord], batch: bool, apply_delay: bool) -> PutResult:
        return self.put_many([(records, batch, apply_delay)])[0]

    def put_many(self, puts: Sequence[tuple[list[MessageRecord], bool, bool] | EncodedPut],
                 waits: Sequence[bool] | None = None) -> list[PutResult]:
        """Several independent puts ``(records, batch, apply_delay)`` or :class:`EncodedPut` under
        one lock, with one write to the file, one dispatch wake-up and (SYNC_FLUSH) one fsync: the
        broker hands all the sends that arrived together to this call, which is what makes group
        commit pay off. ``waits[i]`` false: put i does not wait for a slave (the send's ``WAIT=false``;
        the request layer reads it, the stored properties no longer hold it)."""
        results: list[PutResult | None] = [None] * len(puts)
        prepared: list[tuple[int, list[MessageRecord] | EncodedPut]] = []
        for i, put in enumerate(puts):
            if not self._open or self.slave_mode:  # a slave's log is its master's, byte for byte
                results[i] = PutResult(PutStatus.SERVICE_NOT_AVAILABLE)
                continue
            if isinstance(put, EncodedPut):
                prepared.append((i, put))
                continue
            records, batch, apply_delay = put
            if not records:
                results[i] = PutResult(PutStatus.MESSAGE_ILLEGAL)
            else:
                ready = self._prepare(records, batch, apply_delay)
                if isinstance(ready, PutStatus):
                    results[i] = PutResult(ready)
                else:
                    prepared.append((i, ready))
        appended: list[tuple[int, list, int]] = []
        end = None
        if prepared:
            with self._put_lock:
                if not self._open:
                    for i, _ in prepared:
                        results[i] = PutResult(PutStatus.SERVICE_NOT_AVAILABLE)
                    prepared = []
                writer, clock = self._writer, self.clock
                keep = self._dispatch.reads_appended_records
                refusing = bool(self._deleting or self._deleted)
                start = writer.write_offset
                for i, ready in prepared:
                    encoded = type(ready) is EncodedPut
                    if refusing:
                        client_put = True if encoded else puts[i][1] or puts[i][2]
                        if self._refused_topic(ready.topic if encoded else ready[0].topic, client_put):
                            results[i] = PutResult(PutStatus.TOPIC_NOT_EXIST)
                            continue
                    ts = clock()
                    try:
                        if encoded:
                            placed = writer.append_encoded(ready.data, ready.topic, ready.queue_id, ts, keep)
                        else:
                            placed = writer.append_batch(ready, ts)
                    except ValueError as exc:  # cannot fit a commitlog file
                        log.warning("rejected put to %s: %s", ready.topic if encoded else ready[0].topic, exc)
                        results[i] = PutResult(PutStatus.MESSAGE_ILLEGAL)
                        continue
                    self._last_store_ts = ts
                    appended.append((i, placed, ts))
                if appended:  # every file from the first put's (a roll leaves a BLANK there) to the last's
                    seg = self.settings.segment_bytes
                    self._dirty_segments.update(range(self._segment_base(start),
                                                      self._segment_base(writer.write_offset) + 1, seg))
                if appended:
                    try:
                        self._writer.flush()  # pwrite: visible to readers and to the dispatcher
                    except OSError:
                        log.exception("commitlog append failed")
                        for i, _, _ in appended:
                            results[i] = PutResult(PutStatus.UNKNOWN_ERROR)
                        return results  # type: ignore[return-value]
                    self._committed_end = self._writer.write_offset
                    if keep:  # in-process dispatch needs the records themselves
                        self._dispatch.appended([_placed_record(r) for _, placed, _ in appended
                                                 for r in ((placed,) if type(placed) is EncodedAppend else placed)])
                    end = self._committed_end
        if end is not None:
            self._notify_committed(end)
            status = PutStatus.PUT_OK
            if self.settings.flush_disk_type == SYNC_FLUSH and not self._sync_to(end):
                status = PutStatus.FLUSH_DISK_TIMEOUT
            replica_status = self._replicate(end, appended, waits)
            # offsetMsgId = store host + port, then the offset as 16 hex digits: the host part once a batch
            msg_id_prefix = encode_offset_msg_id(self.settings.store_host, 0)[:-16]
            for i, placed_results, ts in appended:
                if i in replica_status:  # a replica's status overrides the flush's (asyncPutMessage)
                    status_i = replica_status[i]
                else:
                    status_i = status
                if type(placed_results) is EncodedAppend:
                    one, put = placed_results, puts[i]
                    results[i] = PutResult(status_i, msg_id_prefix + "%016X" % one.physical_offset, put.topic,
                                           put.queue_id, one.queue_offset, (one.physical_offset,), one.size, ts)
                    continue
                placed = tuple(r.record for r in placed_results)
                results[i] = PutResult(status_i, ",".join(r.offset_msg_id for r in placed), placed[0].topic,
                                       placed[0].queue_id, placed[0].queue_offset,
                                       tuple(r.physical_offset for r in placed),
                                       sum(r.size for r in placed_results), ts, placed)
        return results  # type: ignore[return-value]

    def _notify_committed(self, end: int) -> None:
        if self._commit_listener is not None:
            self._commit_listener(end)
        for fn in self._commit_watchers:
            fn(end)

    def _replicate(self, end: int, appended: list, waits: Sequence[bool] | None) -> dict[int, PutStatus]:
        """SYNC_MASTER (``CommitLog.handleHA``): the replica status of the appended puts (by index)
        that had to wait until a slave holds the commitlog up to ``end`` and did not get there; empty
        when there is no gate (no per-send work then). The puts appended together wait once, for the
        end of them all."""
        if self.replica_gate is None:
            return {}
        waiting = [i for i, _, _ in appended if waits is None or waits[i]]
        if not waiting:
            return {}
        status = self.replica_gate(end)
        return {} if status is PutStatus.PUT_OK else {i: status for i in waiting}

    def _refused_topic(self, topic: str, client_put: bool) -> bool:
        """Under ``_put_lock``: a topic being deleted takes no put; one deleted by this process takes
        no client put until it has a config again. Deliveries of the schedule service (not client
        puts) are let through once the deletion is over: Apache delivers them too, into a new queue."""
        if topic in self._deleting:
            return True
        return client_put and topic in self._deleted and not self._topic_configured(topic)

    def _prepare(self, records: list[MessageRecord], batch: bool, apply_delay: bool) -> list[MessageRecord] | PutStatus:
        """Validate and rewrite records as the store does before appending (``checkMessage``,
        the delay rewrite, the batch rules)."""
        out = []
        first = records[0]
        for rec in records:
            try:
                validate_topic(rec.topic)
            except InvalidTopicError as exc:
                log.warning("rejected message: %s", exc)
                return PutStatus.MESSAGE_ILLEGAL
            if rec.queue_id < 0 or len(rec.body) > self.settings.max_message_size:
                return PutStatus.MESSAGE_ILLEGAL
            if len(rec.properties_bytes) > MAX_PROPERTIES_LENGTH:
                return PutStatus.PROPERTIES_SIZE_EXCEEDED
            if batch:
                level = delay_level_of(rec.properties)
                if (rec.topic, rec.queue_id) != (first.topic, first.queue_id) or level is None or level > 0 \
                        or rec.sys_flag & TRANSACTION_TYPE_MASK != TRANSACTION_NOT_TYPE:
                    return PutStatus.MESSAGE_ILLEGAL
            elif apply_delay:
                rewritten = self._apply_delay(rec)
                if rewritten is None:
                    return PutStatus.MESSAGE_ILLEGAL
                rec = rewritten
                if len(rec.properties_bytes) > MAX_PROPERTIES_LENGTH:
                    return PutStatus.PROPERTIES_SIZE_EXCEEDED
            if rec.store_host != self.settings.store_host or rec.body_crc is not None or rec.magic_code is not None:
                rec = replace(rec, store_host=self.settings.store_host, body_crc=None, magic_code=None)
            out.append(rec)
        return out

    def _apply_delay(self, rec: MessageRecord) -> MessageRecord | None:
        """``CommitLog.asyncPutMessage``'s delay rewrite (4.x does it in the store); None if
        ``DELAY`` is not a number (Java's parseInt would throw)."""
        if not is_queued(rec.sys_flag) or _DELAY_KEY not in rec.properties_raw:
            return rec  # (the substring test only rules out; the parse below decides)
        props = rec.properties
        level = delay_level_of(props)
        if level is None:
            return None
        if level <= 0:
            return rec
        if level > len(self._delay_levels):
            level = len(self._delay_levels)
            props[PROPERTY_DELAY] = str(level)
        props[PROPERTY_REAL_TOPIC] = rec.topic
        props[PROPERTY_REAL_QID] = str(rec.queue_id)
        return replace(rec, topic=SCHEDULE_TOPIC, queue_id=delay_level_to_queue_id(level),
                       properties_raw=encode_properties(props))

    # ---- reading -----------------------------------------------------------------------------------
    @property
    def commitlog_max_offset(self) -> int:
        """Physical offset just past the last appended record."""
        return self._committed_end

    @property
    def dispatch_behind_bytes(self) -> int:
        """Commitlog bytes appended but not yet in the ConsumeQueue/IndexFile (Apache's
        ``dispatchBehindBytes``): 0 means every stored message can be pulled and found by key."""
        return self._dispatch.behind_bytes(self._committed_end)

    @property
    def commitlog_min_offset(self) -> int:
        return self._commitlog_min

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueueView:
        """The read view of a queue (an empty one if the queue does not exist)."""
        self._require_open()
        return self.queues.view(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """GET_MAX_OFFSET: logical offset the next message of the queue will get."""
        return self.consume_queue(topic, queue_id).max_offset

    def min_offset(self, topic: str, queue_id: int) -> int:
        """GET_MIN_OFFSET: first readable logical offset."""
        return self.consume_queue(topic, queue_id).min_offset

    def check_in_disk_by_consume_offset(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether the message at a queue offset is older than the in-memory window (4.9.8's
        ``checkInDiskByConsumeOffset``: more than ``access_message_in_memory_max_ratio`` % of RAM
        behind the commitlog end); False when there is no such message."""
        unit = self.consume_queue(topic, queue_id).unit(offset)
        if unit is None:
            return False
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return self._committed_end - unit[0] > ram * self.settings.access_message_in_memory_max_ratio // 100

    def read_record_bytes(self, phy_offset: int, size: int | None = None) -> bytes:
        """The stored bytes of the message record at ``phy_offset``; raises :class:`RecordError`
        when no message record starts there."""
        self._require_open()
        if phy_offset < self._commitlog_min or phy_offset + SIZE_MAGIC.size > self._committed_end:
            raise RecordError("bad_size", phy_offset, "outside the commitlog's data")
        if size is None:
            total, magic = SIZE_MAGIC.unpack(self._segments.pread(phy_offset, SIZE_MAGIC.size))
            if magic not in (MAGIC_V1, MAGIC_V2):
                raise RecordError("bad_magic", phy_offset, "no message record starts here")
            size = total
        if size <= 0 or phy_offset + size > self._committed_end:
            raise RecordError("bad_size", phy_offset, f"record of {size} bytes runs past the commitlog's data")
        data = self._segments.pread(phy_offset, size)
        if len(data) != size:
            raise RecordError("truncated_record", phy_offset, "short read")
        return data

    def view_message(self, phy_offset: int) -> MessageRecord:
        """VIEW_MESSAGE_BY_ID / ``lookMessageByOffset``: the decoded record at ``phy_offset``."""
        data = self.read_record_bytes(phy_offset)
        rec = decode_record(data, 0, phy_offset)
        if not isinstance(rec, MessageRecord):
            raise RecordError("bad_magic", phy_offset, "a BLANK record, not a message")
        return rec

    read_record = view_message  # the RecordSource protocol used by the index and time searches

    def _store_time(self, phy_offset: int) -> int:
        """STORETIMESTAMP of the record at ``phy_offset`` (-1 if unreadable), from its header only."""
        try:
            return read_store_timestamp(self._segments.pread(phy_offset, STORE_TIMESTAMP_PROBE))
        except (OSError, struct.error):
            return -1

    def get_messages(self, topic: str, queue_id: int, offset: int, max_msgs: int = 32,
                     max_bytes: int = 256 * 1024, tag_filter: set[str] | None = None,
                     property_filter: Callable[[dict[str, str]], bool] | None = None) -> GetResult:
        """PULL_MESSAGE's store read (``DefaultMessageStore.getMessage``, 4.9.8).

        Statuses: empty queue → NO_MESSAGE_IN_QUEUE (next 0); offset < min → OFFSET_TOO_SMALL
        (next min); offset == max → OFFSET_OVERFLOW_ONE (next offset); offset > max →
        OFFSET_OVERFLOW_BADLY (next min if min is 0, else max); otherwise FOUND, or
        NO_MATCHED_MESSAGE when the filter rejected every scanned unit. A topic that cannot exist
        answers NO_MATCHED_LOGIC_QUEUE. At most ``max(800, max_msgs)`` units of one CQ file are
        scanned; the first message is always returned, then the batch stops at ``max_msgs`` or
        when the next record would pass ``max_bytes``. ``tag_filter`` (tag strings; ``*`` or None =
        all) is matched on the CQ tag hash, then on the record's TAGS (hash collisions);
        ``property_filter`` (SQL92 subscriptions) is asked with each candidate's properties. Units
        either filter rejects are skipped, and ``next_begin_offset`` still moves past them.
        """
        self._require_open()
        try:
            validate_topic(topic)
        except InvalidTopicError:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        if queue_id < 0:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        view = self.queues.view(topic, queue_id)
        max_off = view.max_offset
        min_off = view.min_offset
        if max_off == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, min_off, max_off)
        if offset < min_off:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, min_off, min_off, max_off)
        if offset == max_off:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
        if offset > max_off:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, min_off if min_off == 0 else max_off, min_off, max_off)
        units = view.read_units(offset, max(_MAX_FILTER_SCAN_BYTES // CQ_STORE_UNIT_SIZE, max_msgs))
        if not len(units):
            return GetResult(GetStatus.OFFSET_FOUND_NULL, view.files.next_file_offset(offset), min_off, max_off)
        tags_wanted = None if not tag_filter or "*" in tag_filter else set(tag_filter)
        phys = units["commitlog_offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        candidate = np.ones(len(units), bool)
        if tags_wanted is not None:
            codes = np.array(sorted({tags_code(t) for t in tags_wanted}), np.int64)
            candidate = np.isin(units["tags_code"].astype(np.int64), codes)
        status = GetStatus.NO_MATCHED_MESSAGE
        parts: list[bytes] = []
        queue_offsets: list[int] = []
        phy_out: list[int] = []
        total = 0
        i = 0
        for i in range(len(units)):
            size = int(sizes[i])
            if parts and (len(parts) >= max_msgs or total + size > max_bytes):
                break  # isTheBatchFull: unit i is not consumed
            if not candidate[i]:
                continue
            phy = int(phys[i])
            try:
                data = self.read_record_bytes(phy, size)
            except RecordError as exc:
                log.warning("%s/%d offset %d: %s", topic, queue_id, offset + i, exc)
                if not parts:
                    status = GetStatus.MESSAGE_WAS_REMOVING
                continue
            if tags_wanted is not None or property_filter is not None:
                rec = decode_record(data, 0, phy)
                if not isinstance(rec, MessageRecord) or (tags_wanted is not None and rec.tags not in tags_wanted):
                    continue
                if property_filter is not None and not property_filter(rec.properties):
                    continue
            parts.append(data)
            queue_offsets.append(offset + i)
            phy_out.append(phy)
            total += size
            status = GetStatus.FOUND
        else:
            i = len(units)
        return GetResult(status, offset + i, min_off, max_off, b"".join(parts), tuple(queue_offsets), tuple(phy_out))

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """GET_EARLIEST_MSG_STORETIME: store time of the queue's first readable message, -1 if none."""
        view = self.consume_queue(topic, queue_id)
        unit = view.unit(view.min_offset)
        return -1 if unit is None else self._store_time(unit[0])

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        """Store time of the message at queue ``offset`` (``getMessageStoreTimeStamp``), -1 if none."""
        view = self.consume_queue(topic, queue_id)
        unit = view.unit(offset) if view.min_offset <= offset < view.max_offset else None
        return -1 if unit is None else self._store_time(unit[0])

    def earliest_message_time(self) -> int:
        """Store time of the first record in the CommitLog (``getEarliestMessageTime()``), -1 if empty."""
        if self.commitlog_max_offset <= self.commitlog_min_offset:
            return -1
        return self._store_time(self.commitlog_min_offset)

    def search_offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int, boundary: str = "lower") -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP by binary search over the queue, reading store times from
        record headers: ``lower`` = first message stored at or after the time (max offset if all are
        older), ``upper`` = last message stored at or before it (min offset if all are newer) —
        the same rules as :meth:`broker.store.consume_queue.ConsumeQueue.search_by_timestamp`."""
        if boundary not in ("lower", "upper"):
            raise ValueError(f"boundary must be 'lower' or 'upper', got {boundary!r}")
        view = self.consume_queue(topic, queue_id)
        lo, hi = view.min_offset, view.max_offset
        if lo >= hi:
            return lo

        def store_time(logical: int) -> int:
            unit = view.unit(logical)
            return -1 if unit is None else self._store_time(unit[0])

        if boundary == "lower":
            return bisect_left(range(lo, hi), timestamp_ms, key=store_time) + lo
        return max(bisect_left(range(lo, hi), timestamp_ms + 1, key=store_time) + lo - 1, lo)

    def query_by_key(self, topic: str, key: str, max_num: int = MAX_MSGS_NUM_BATCH, begin_ms: int = 0,
                     end_ms: int = LONG_MAX) -> QueryResult:
        """QUERY_MESSAGE: records of ``topic`` whose KEYS or UNIQ_KEY is ``key``, found through the
        index (newest ``max_num``, capped at 64 like ``maxMsgsNumBatch``) and verified against the
        records, returned oldest first. Entries left by a recovered crash are filtered out by the
        verification (and de-duplicated when a new record took the old one's offset and key)."""
        self._require_open()
        progress, offsets = self._dispatch.query_index(topic, key, begin_ms, end_ms, min(max_num, MAX_MSGS_NUM_BATCH))
        found, parts = [], []
        for phy in sorted(set(offsets)):  # a stale entry (recovered crash) may repeat an offset
            try:
                data = self.read_record_bytes(phy)
                rec = decode_record(data, 0, phy)
            except RecordError as exc:  # stale entry past a recovered end, or a hash collision
                log.debug("index points at unreadable commitlog offset %d: %s", phy, exc)
                continue
            if isinstance(rec, MessageRecord) and rec.topic == topic and (rec.uniq_key == key or key in rec.keys):
                found.append(phy)
                parts.append(data)
        return QueryResult(tuple(found), b"".join(parts), *progress)

    def add_commit_watcher(self, fn: Callable[[int], None]) -> None:
        """``fn(committed_end)`` after every append, besides the commit listener (the HA master)."""
        self._commit_watchers.append(fn)

    def read_committed(self, offset: int, max_bytes: int) -> bytes:
        """Raw commitlog bytes from ``offset`` for a slave (``getCommitLogData``): at most
        ``max_bytes``, never past the committed end (no record still being written) nor past the end
        of ``offset``'s file (a transfer never spans two files). b"" when nothing is there yet."""
        self._require_open()
        if offset < self._commitlog_min:
            raise StoreError(f"commitlog offset {offset} is below the first file ({self._commitlog_min})")
        file_end = self._segment_base(offset) + self.settings.segment_bytes
        size = min(self._committed_end, file_end, offset + max_bytes) - offset
        return self._segments.pread(offset, size) if size > 0 else b""

    @property
    def replica_end(self) -> int:
        """A slave's max offset (``getMaxPhyOffset``): just past the last byte received, which may be
        inside a record (the committed end, what readers and the dispatcher see, stops before it)."""
        self._require_open()
        return self._writer.write_offset

    def append_replica(self, offset: int, data: bytes) -> None:
        """A slave appends bytes its master sent (``appendToCommitLog``): at ``offset``, which must be
        this log's end (or anywhere, while this log is empty: a master starts a new slave at the
        first byte of its newest file). Readers and the dispatcher see the bytes up to the last
        complete record. Raises :class:`ReplicaError` on a wrong offset."""
        self._require_open()
        with self._put_lock:
            if not self._open:
                raise StoreError(f"store {self.store_dir} is not open")
            end = self._writer.write_offset
            if offset != end:
                if end != 0 or self._committed_end != 0:
                    raise ReplicaError(f"master sent commitlog bytes for offset {offset}, this slave's log ends "
                                       f"at {end}")
                self._start_log_at(offset)
            pos = offset
            while pos < offset + len(data):  # a master never spans files, but a stream is not trusted
                base = self._segment_base(pos)
                chunk = data[pos - offset:base + self.settings.segment_bytes - offset]
                self._writer.append_raw(pos, chunk)
                self._dirty_segments.add(base)
                pos += len(chunk)
            self._writer.flush()
            committed, last = self._complete_records_end(self._committed_end, self._writer.write_offset)
            grew = committed > self._committed_end
            self._committed_end = committed
            if last is not None:  # the checkpoint's physical time: the newest complete record's
                self._last_store_ts = max(self._last_store_ts, self._store_time(last))
        if grew:
            self._notify_committed(committed)

    def _start_log_at(self, offset: int) -> None:
        """An empty slave's first transfer starts at ``offset``, a file boundary: its files begin there."""
        if offset % self.settings.segment_bytes:
            raise ReplicaError(f"an empty slave's first transfer must start a commitlog file, not offset {offset}")
        self._writer.restart_empty_at(offset)
        self._commitlog_min = self._committed_end = self._flushed_offset = offset
        self.queues.commitlog_min_offset = offset
        self._dirty_segments = {offset}
        log.info("empty slave log starts at the master's commitlog offset %d", offset)

    def _complete_records_end(self, start: int, limit: int) -> tuple[int, int | None]:
        """Walk record headers from ``start`` (a record boundary) and return the end of the last
        record wholly below ``limit`` and where that record starts (None: no record passed); a
        BLANK jumps to the end of its file."""
        size = self.settings.segment_bytes
        pos = start
        last = None
        while pos + SIZE_MAGIC.size <= limit:
            total, magic = SIZE_MAGIC.unpack(self._segments.pread(pos, SIZE_MAGIC.size))
            if magic == MAGIC_BLANK:
                pos = self._segment_base(pos) + size
                continue
            if magic not in (MAGIC_V1, MAGIC_V2) or total <= 0 or pos + total > limit:
                break
            last = pos
            pos += total
        return pos, last

    def set_commit_listener(self, fn: Callable[[int], None]) -> None:
        """``fn(committed_end)`` after every append (wakes an external dispatcher)."""
        self._commit_listener = fn

    @property
    def dispatched_offset(self) -> int:
        """Where this process's own dispatch stopped (the external dispatcher starts here)."""
        self._require_open()
        return self._dispatcher.next_offset if self._dispatcher.next_offset else self._committed_end

    def external_advance(self, queues: Sequence[tuple[str, int, int, int]], last_store_ts: int,
                         dispatched_end: int | None = None) -> None:
        """Progress of the external dispatcher: ``(topic, queue_id, max_offset, max_phy_end)`` per
        queue that grew, and the commitlog offset dispatched up to; makes the new units readable here
        and wakes long-polling listeners."""
        self._require_open()
        d = self._dispatcher
        with d._sync_lock:
            d.last_store_timestamp = max(d.last_store_timestamp, last_store_ts)
        for topic, qid, nxt, phy_end in queues:
            fence = self._topic_fences.get(topic) if self._topic_fences else None
            if fence is not None and phy_end <= fence:
                continue  # progress reported before the topic's deletion reached the dispatcher
            self.queues.advance(topic, qid, nxt, phy_end)
            for fn in d._listeners:
                try:
                    fn(topic, qid, nxt)
                except Exception:
                    log.exception("dispatch listener failed")
        # the dispatched end moves only now, after the queues: whoever sees ``dispatch_behind_bytes``
        # at 0 (``wait_dispatched``) must find every unit up to it readable
        with self._dispatch_progress:
            if dispatched_end is not None:
                d.next_offset = max(d.next_offset, dispatched_end)
            self._dispatch_progress.notify_all()

    def wait_dispatched(self, timeout: float) -> None:
        """Return once the consume queues and the index hold every record appended before this call
        (``dispatch_behind_bytes`` reached 0 for it): what a reader that must see its own puts
        waits for with an external dispatcher, whose progress arrives on another thread. Immediate
        with inline dispatch. Raises TimeoutError when dispatch did not get there within
        ``timeout`` seconds (a dispatcher process that died or never started)."""
        self._require_open()
        target = self._committed_end
        with self._dispatch_progress:
            if self._dispatch_progress.wait_for(lambda: self._dispatch.behind_bytes(target) == 0, timeout):
                return
            behind = self._dispatch.behind_bytes(target)
        raise TimeoutError(f"dispatch of {self.store_dir} is still {behind} bytes behind commitlog offset "
                           f"{target} after {timeout:g} s (is the dispatcher process running?)")

    def set_topic_deleter(self, fn: Callable[[str, int], None]) -> None:
        """``fn(topic, fence)`` removes a topic's consume queues in the process that writes them (the
        external dispatcher) and returns once they are gone; it raises when it cannot."""
        self._require_open()
        self._dispatch.deleter = fn

    def set_topic_config_check(self, fn: Callable[[str], bool]) -> None:
        """``fn(topic)`` tells whether a topic has a config. The topic table belongs to the request
        layer (:class:`~broker.server.metadata.BrokerMetadata`); the store asks only this, to let
        client puts to a topic it deleted through again once the topic was created anew."""
        self._topic_configured = fn

    def delete_topic_queues(self, topic: str) -> int:
        """The store side of DELETE_TOPIC_IN_BROKER (``DefaultMessageStore.deleteTopics``): the
        topic's consume queues are removed, its queue offset counters restart at 0, and its records
        stored so far (below the returned fence, the commitlog end at deletion) are never queued
        again, not even by a restart's re-dispatch. The commitlog and the index are not touched.

        While it runs, puts to the topic are refused (TOPIC_NOT_EXIST), so no unit is appended to a
        file being removed; afterwards client puts stay refused until the topic has a config again.
        With an external dispatcher the files are removed there (``set_topic_deleter``), between
        two of its batches, while this process already ignores its progress for the old records."""
        self._require_open()
        if not TOPIC_NAME_PATTERN.fullmatch(topic):  # it names a directory: never anything outside consumequeue/
            raise InvalidTopicError(f"topic {topic[:300]!r} has characters outside [%|a-zA-Z0-9_-]")
        with self._delete_lock:
            return self._delete_topic_queues(topic)

    def _delete_topic_queues(self, topic: str) -> int:
        with self._put_lock:
            fence = max(self._committed_end, self._topic_fences.get(topic, 0))
            self._deleting.add(topic)
            self._deleted.add(topic)
            self._topic_fences[topic] = fence
            try:
                self._save_topic_fences()
                for key in [k for k in self._writer.queue_offsets if k[0] == topic]:
                    del self._writer.queue_offsets[key]
                self.queues.drop_topic(topic)
                self._dispatch.drop_topic_locked(topic, fence)
            except BaseException:
                self._deleting.discard(topic)
                raise
        try:
            self._dispatch.drop_topic_after(topic, fence)
        finally:
            with self._put_lock:
                self._deleting.discard(topic)
        return fence

    def add_dispatch_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """``fn(topic, queue_id, max_offset)`` whenever a queue grows (for long polling)."""
        self._require_open()
        self._dispatcher.add_listener(fn)


_DELAY_KEY = PROPERTY_DELAY + NAME_VALUE_SEPARATOR


def _placed_record(placed: AppendResult | EncodedAppend) -> MessageRecord:
    if isinstance(placed, EncodedAppend):
        return decode_record(placed.data, 0, placed.physical_offset)
    return placed.record


