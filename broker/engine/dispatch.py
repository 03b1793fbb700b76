"""Dispatch: the consume queues and the index built from the commitlog, and their read side.

:class:`Dispatcher` writes CQ units and index entries for records in commitlog order (Apache's
``CommitLogDispatcherBuildConsumeQueue`` + ``BuildIndex``); :class:`QueueRegistry` /
:class:`ConsumeQueueView` serve the queues' read side in the broker. Two modes share one interface
(:class:`DispatchMode`): :class:`InlineDispatch` dispatches in the putting thread, under the put
lock (tools, tests, a single-process store); :class:`ExternalDispatch` leaves the writing to a
dispatcher process (:mod:`broker.server.dispatch_process`, Apache's ReputMessageService) and only
follows its progress — the mode the multiprocess broker runs.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import threading
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

from broker.engine.store_settings import StoreSettings
from broker.store.clock import now_ms
from broker.store.commitlog import CommitLog
from broker.store.constants import CONSUME_QUEUE_DIR, indexed_mask, is_indexed, is_queued, queued_mask
from broker.store.consume_queue import (
    BLOCK_MIN_UNITS,
    CQ_UNIT_DTYPE,
    ConsumeQueueDispatcher,
    MinOffsetRule,
    QueueFiles,
    tags_code_for,
)
from broker.store.dispatch_fields import RunFields
from broker.store.index_file import IndexService
from broker.store.message import MessageRecord, decode_record
from broker.store.topics import SCHEDULE_TOPIC

log = logging.getLogger(__name__)


# =====================================================================================================
# Consume queue read side
# =====================================================================================================
class ConsumeQueueView:
    """Read side of one consume queue in the running broker: units are read on demand through
    :class:`~broker.store.consume_queue.QueueFiles` (the store's one random-access queue reader).

    Nothing is cached but the queue's written end (advanced by the dispatcher after its ``pwrite``)
    and the derived min offset, so a pull costs one small read per CQ file it touches, whatever
    the queue's length.
    """

    def __init__(self, store_dir: Path, topic: str, queue_id: int, file_size: int, max_offset: int = 0,
                 max_phy_end: int = -1, commitlog_min_offset: int = 0,
                 min_offset_rule: MinOffsetRule = MinOffsetRule.ALL_FILES) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.files = QueueFiles(store_dir / CONSUME_QUEUE_DIR / topic / str(queue_id), file_size)
        self.directory = self.files.directory
        self.file_size = file_size
        self.max_offset = max_offset  # logical offset just past the last unit
        self.max_phy_end = max_phy_end  # phy + size of the last unit (-1: none)
        self._commitlog_min = commitlog_min_offset
        self._min_rule = min_offset_rule
        self._min_offset: int | None = None

    def read_units(self, start: int, count: int) -> np.ndarray:
        """Up to ``count`` units from logical ``start`` (big-endian :data:`CQ_UNIT_DTYPE` rows),
        never past the written end nor across a file boundary (Apache's ``getIndexBuffer``)."""
        end = self.max_offset
        if start < 0 or start >= end or count <= 0:
            return np.empty(0, CQ_UNIT_DTYPE)
        return self.files.read(start, min(count, end - start))

    def unit(self, offset: int) -> tuple[int, int, int] | None:
        """``(phy, size, tagsCode)`` at a logical offset, None outside the written range."""
        rows = self.read_units(offset, 1)
        if not len(rows):
            return None
        return int(rows["commitlog_offset"][0]), int(rows["size"][0]), int(rows["tags_code"][0])

    @property
    def min_offset(self) -> int:
        """First readable unit (not a pre-blank fill, its record still in the commitlog:
        ``correctMinOffset``), by the view's :class:`MinOffsetRule`; the written end for an empty
        queue. Derived once, then cached."""
        if self._min_offset is None:
            found = self.files.min_offset(self._commitlog_min, self.max_offset, self._min_rule)
            if found == self.max_offset:
                return found  # nothing readable yet: ask again once the queue grows
            self._min_offset = found
        return self._min_offset


class QueueRegistry:
    """All :class:`ConsumeQueueView` objects of a store, created on first write (reads of unknown
    queues get a throw-away empty view, so clients cannot grow the table)."""

    def __init__(self, store_dir: Path, file_size: int, commitlog_min_offset: int = 0) -> None:
        self.store_dir = store_dir
        self.file_size = file_size
        self.commitlog_min_offset = commitlog_min_offset
        self._views: dict[tuple[str, int], ConsumeQueueView] = {}
        self._lock = threading.Lock()

    def seed(self, topic: str, queue_id: int, max_offset: int, max_phy_end: int) -> ConsumeQueueView:
        with self._lock:
            view = ConsumeQueueView(self.store_dir, topic, queue_id, self.file_size, max_offset, max_phy_end,
                                    self.commitlog_min_offset)
            self._views[(topic, queue_id)] = view
            return view

    def get(self, topic: str, queue_id: int) -> ConsumeQueueView | None:
        return self._views.get((topic, queue_id))

    def view(self, topic: str, queue_id: int) -> ConsumeQueueView:
        existing = self._views.get((topic, queue_id))
        if existing is not None:
            return existing
        return ConsumeQueueView(self.store_dir, topic, queue_id, self.file_size, 0, -1, self.commitlog_min_offset)

    def advance(self, topic: str, queue_id: int, max_offset: int, max_phy_end: int) -> None:
        """Publish a queue's new end (called after the units reached the file)."""
        view = self._views.get((topic, queue_id))
        if view is None:
            view = self.seed(topic, queue_id, 0, -1)
        if max_offset > view.max_offset:
            view.max_phy_end = max_phy_end
            view.max_offset = max_offset

    def items(self) -> list[tuple[tuple[str, int], ConsumeQueueView]]:
        with self._lock:
            return list(self._views.items())

    def drop_topic(self, topic: str) -> None:
        """Forget every queue of a deleted topic (reads then see empty queues)."""
        with self._lock:
            for key in [k for k in self._views if k[0] == topic]:
                del self._views[key]


# =====================================================================================================
# Dispatch
# =====================================================================================================
def _index_watermark(index: IndexService) -> int:
    """Physical offset of the last indexed record (-1 when nothing ever was). The seed of a new
    index file is the previous file's end, so the last file's ``endPhyOffset`` is right either way."""
    if not index.files:
        return -1
    if len(index.files) == 1 and index.files[0].header.index_count <= 1:
        return -1
    return index.files[-1].header.end_phy_offset


class Dispatcher:
    """Builds the consume queues and the index from commitlog records, in commitlog order
    (Apache's ``CommitLogDispatcherBuildConsumeQueue`` + ``CommitLogDispatcherBuildIndex``).

    Idempotent, so it can be driven again over records it already saw (recovery, or a commitlog tail
    follower in another process): a CQ unit is skipped when its queue already holds it (the
    ``ConsumeQueue.put`` rules), an index entry when the record is at or below the last indexed
    offset. The index is written *before* the queue, so after a crash between the two the queue is
    the one behind, and re-dispatching from the queues' end never indexes a record twice.
    """

    def __init__(self, store_dir: Path, settings: StoreSettings, queues: QueueRegistry,
                 clock: Callable[[], int] = now_ms) -> None:
        self.store_dir = store_dir
        self.settings = settings
        self.queues = queues
        self.next_offset = 0  # just past the last record handed to dispatch (a tail follower's cursor)
        self.cq = ConsumeQueueDispatcher(store_dir, file_size=settings.cq_file_bytes,
                                         delay_levels=settings.delay_levels)
        self.index = IndexService(store_dir, settings.index_slots, settings.index_entries, clock=clock)
        self.index_lock = threading.Lock()  # IndexService is not thread-safe; queries take it too
        self._index_watermark = _index_watermark(self.index)
        if self._index_watermark >= 0:
            self._complete_last_indexed()
        self._sync_lock = threading.Lock()
        self._dirty_files: set[Path] = set()
        # (topic, queue id, file base) -> the file's path: built once, not with pathlib on every pass
        self._cq_file_paths: dict[tuple[str, int, int], Path] = {}
        self.last_store_timestamp = 0
        self._listeners: list[Callable[[str, int, int], None]] = []
        self.released = False  # writers handed to an external dispatcher process
        self.topic_fences: dict[str, int] = {}  # deleted topic -> fence: its records below are not queued

    def _complete_last_indexed(self) -> None:
        """A crash between two index puts of one record leaves it half indexed at the watermark,
        which re-dispatch never revisits: finish it now (see IndexService.complete_record)."""
        try:
            rec = CommitLog.open(self.store_dir, self.settings.segment_bytes).read_record(self._index_watermark)
        except Exception as exc:  # recovery already cut the index back to the commitlog's end
            log.warning("index: cannot read the last indexed record at %d to check it: %s", self._index_watermark, exc)
            return
        if isinstance(rec, MessageRecord):
            with self.index_lock:
                self.index.complete_record(rec)

    def add_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """``fn(topic, queue_id, max_offset)`` after new units are readable (long polling hook)."""
        self._listeners.append(fn)

    def dispatch(self, records: Sequence[MessageRecord]) -> int:
        """Dispatch records (in commitlog order); returns how many changed a queue or the index."""
        touched: dict[tuple[str, int], list[int]] = {}  # queue -> [first offset, next offset, phy end]
        changed = 0
        for rec in records:
            did = False
            if is_indexed(rec.sys_flag) and rec.physical_offset > self._index_watermark:
                with self.index_lock:
                    did = self.index.dispatch(rec) > 0
                    self._index_watermark = rec.physical_offset
            if is_queued(rec.sys_flag) and self._queued_topic(rec) and self.cq.dispatch(rec):
                did = True
                span = touched.setdefault((rec.topic, rec.queue_id), [rec.queue_offset, 0, 0])
                span[1:] = [rec.queue_offset + 1, rec.physical_offset + rec.total_size]
            changed += did
        if records:
            self.next_offset = records[-1].physical_offset + records[-1].total_size
        self._publish(touched, records[-1].store_timestamp if records else None)
        return changed

    def dispatch_run(self, run: RunFields, raw: bytes | mmap.mmap) -> int:
        """:meth:`dispatch` for a run of records read by the compiled walk
        (:meth:`CommitLog.follow_runs`; ``raw`` the file they lie in, for their topics): the same
        rules and order (index, then queues), per index file and per queue instead of per record."""
        n = run.n
        if not n:
            return 0
        did = np.zeros(n, np.bool_)
        indexed = np.flatnonzero(indexed_mask(run.sys_flag) & (run.phy > self._index_watermark))
        if len(indexed):
            with self.index_lock:
                did[indexed] = self.index.dispatch_rows(run.phy[indexed], run.store_ts[indexed],
                                                        run.key_first[indexed], run.key_count[indexed], run.key_hash)
                self._index_watermark = int(run.phy[indexed[-1]])
        groups: dict[tuple[str, int], list[int]] = {}
        names: dict[bytes, str] = {}
        queued = np.flatnonzero(queued_mask(run.sys_flag))
        for i, at, ln, qid in zip(queued.tolist(), run.topic_at[queued].tolist(), run.topic_len[queued].tolist(),
                                  run.queue_id[queued].tolist()):
            raw_topic = raw[at:at + ln]
            topic = names.get(raw_topic)
            if topic is None:  # the walk passes well-formed UTF-8 topics only
                topic = names[raw_topic] = raw_topic.decode("utf-8")
            groups.setdefault((topic, qid), []).append(i)
        touched: dict[tuple[str, int], list[int]] = {}
        did_l = did.tolist()
        phy_l, size_l, qoff_l, tags_l, ts_l = (a.tolist() for a in (run.phy, run.size, run.queue_offset,
                                                                    run.tags_code, run.store_ts))
        for (topic, qid), rows in groups.items():
            fence = self.topic_fences.get(topic) if self.topic_fences else None
            if fence is not None:
                rows = [i for i in rows if phy_l[i] >= fence]
                if not rows:
                    continue
            if topic == SCHEDULE_TOPIC:
                for i in rows:
                    tags_l[i] = self._delay_tags_code(raw, run.base, phy_l[i])
            cq = self.cq.queue(topic, qid)
            if len(rows) < BLOCK_MIN_UNITS:  # a small pass: numpy's set-up would cost more than the units
                done = [i for i in rows if cq.put(qoff_l[i], phy_l[i], size_l[i], tags_l[i], ts_l[i])]
            else:
                idx = np.asarray(rows, np.int64)
                written = cq.put_many(run.queue_offset[idx], run.phy[idx], run.size[idx],
                                      np.asarray([tags_l[i] for i in rows], np.int64), run.store_ts[idx])
                done = idx[written].tolist()
            if done:
                for i in done:
                    did_l[i] = True
                last = done[-1]
                touched[(topic, qid)] = [qoff_l[done[0]], qoff_l[last] + 1, phy_l[last] + size_l[last]]
        self.next_offset = phy_l[-1] + size_l[-1]
        self._publish(touched, ts_l[-1])
        return sum(did_l)

    def _delay_tags_code(self, raw: bytes | mmap.mmap, base: int, phy: int) -> int:
        """tagsCode of a delay-topic record (a deliver time: ``tags_code_for``), from its
        properties decoded by the per-record codec."""
        rec = decode_record(raw, phy - base, phy)
        return tags_code_for(rec.topic, rec.properties, rec.store_timestamp, self.cq.delay_levels)

    def _publish(self, touched: dict[tuple[str, int], list[int]], last_store_timestamp: int | None) -> None:
        """After a dispatch: make the new units readable (``pwrite``), note the files to sync and
        the store time, move the queue views' ends and wake the listeners."""
        dirty: set[Path] = set()
        paths = self._cq_file_paths
        for (topic, qid), (first, nxt, _) in touched.items():
            cq = self.cq.queue(topic, qid)
            cq.flush()  # pwrite: readable from here on
            for base in range(cq.reader.locate(first)[0], cq.reader.locate(nxt - 1)[0] + 1, cq.file_size):
                path = paths.get((topic, qid, base))
                if path is None:
                    path = paths[(topic, qid, base)] = cq.reader.path_of(base)
                dirty.add(path)
        with self._sync_lock:
            if last_store_timestamp is not None:
                self.last_store_timestamp = max(self.last_store_timestamp, last_store_timestamp)
            self._dirty_files |= dirty
        for (topic, qid), (_, nxt, phy_end) in touched.items():
            self.queues.advance(topic, qid, nxt, phy_end)
            for fn in self._listeners:
                try:
                    fn(topic, qid, nxt)
                except Exception:  # a listener must not break the write path
                    log.exception("dispatch listener failed")

    def _queued_topic(self, rec: MessageRecord) -> bool:
        """False for a record of a deleted topic stored before the deletion (see ``topic_fences``)."""
        fence = self.topic_fences.get(rec.topic) if self.topic_fences else None
        return fence is None or rec.physical_offset >= fence

    def drop_topic(self, topic: str, fence: int) -> None:
        """Delete a topic's consume queues: close this dispatcher's files of the topic, remove its
        directory, and never queue its records below ``fence`` again. The caller guarantees nothing
        dispatches meanwhile (the store holds its put lock; the dispatcher process runs this between
        batches)."""
        self.topic_fences[topic] = max(fence, self.topic_fences.get(topic, 0))
        for key in [k for k in self.cq.queues if k[0] == topic]:
            self.cq.queues.pop(key).close()
        directory = self.store_dir / CONSUME_QUEUE_DIR / topic
        with self._sync_lock:
            self._dirty_files = {p for p in self._dirty_files if directory not in p.parents}
        self._cq_file_paths = {k: p for k, p in self._cq_file_paths.items() if k[0] != topic}
        self.queues.drop_topic(topic)
        if directory.is_dir():
            shutil.rmtree(directory)
        log.info("deleted the consume queues of %s (records below commitlog offset %d stay unqueued)", topic, fence)

    def catch_up(self, from_offset: int, to_offset: int | None = None, commitlog: CommitLog | None = None,
                 batch: int = 1024) -> int:
        """Dispatch every record starting in ``[from_offset, to_offset)`` (``from_offset`` a record
        boundary; no bound = to the end of data), read back in runs by ``CommitLog.follow_runs``
        (:meth:`dispatch_run`; the records it leaves to the per-record path, :meth:`dispatch`);
        returns how many records changed something. Safe to repeat (idempotent). A follower of a
        live commitlog must pass the writer's published end as ``to_offset``, so it never reads a
        record that is still being written."""
        own = commitlog is None
        if commitlog is None:
            commitlog = CommitLog.open(self.store_dir, self.settings.segment_bytes)
        changed = 0
        try:
            for part in commitlog.follow_runs(from_offset, to_offset, batch=batch):
                if isinstance(part, list):  # records the compiled walk leaves to the per-record path
                    changed += self.dispatch(part)
                else:
                    changed += self.dispatch_run(*part)
        finally:
            if own:
                commitlog.close()  # the file the walk kept mapped
        return changed

    def catch_up_per_record(self, from_offset: int, to_offset: int | None = None,
                            commitlog: CommitLog | None = None, batch: int = 1024) -> int:
        """:meth:`catch_up` one decoded record at a time (the path before the compiled walk; kept
        as the reference the tests and the benchmark compare against)."""
        if commitlog is None:
            commitlog = CommitLog.open(self.store_dir, self.settings.segment_bytes)
        changed = 0
        pending: list[MessageRecord] = []
        records = commitlog.iter_records(from_offset) if to_offset is None else commitlog.follow(from_offset, to_offset)
        for rec in records:
            pending.append(rec)
            if len(pending) >= batch:
                changed += self.dispatch(pending)
                pending = []
        if pending:
            changed += self.dispatch(pending)
        return changed

    def sync(self) -> int:
        """fsync the CQ files written since the last call and msync the index; returns the store
        timestamp everything up to which is now durable (the checkpoint's logics/index time)."""
        with self._sync_lock:
            files, self._dirty_files = self._dirty_files, set()
            ts = self.last_store_timestamp
        for path in sorted(files):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        with self.index_lock:
            if not self.released:
                self.index.flush()
        return ts

    def release_writers(self) -> None:
        """Hand the consume-queue and index files over to another process: flush and close ours,
        so nothing here writes them again (a stale in-memory index header must never be flushed
        over the other process's). Progress then arrives through ``MessageStore.external_advance``."""
        with self.index_lock:
            if self.released:
                return
            self.cq.close()
            self.index.close()
            self.released = True

    def close(self) -> None:
        self.release_writers()  # the same: nothing of ours is written any more


# =====================================================================================================
# The two dispatch modes
# =====================================================================================================
def index_progress(index: IndexService) -> tuple[int, int]:
    """(end timestamp, end commitlog offset) of the newest index file, read before a query."""
    if not index.files:
        return 0, 0
    header = index.files[-1].header
    return header.end_timestamp, header.end_phy_offset


class DispatchMode(Protocol):
    """What the store needs from whoever builds its consume queues and index."""

    # whether :meth:`appended` reads the records as they were written (the putting side then keeps
    # their bytes); a mode that reads the commitlog files itself does not need them
    reads_appended_records: bool
    deleter: Callable[[str, int], None] | None  # removes a topic's queues in the process that writes them

    def opened(self, committed_end: int) -> None:
        """The store finished recovery (which dispatched everything up to ``committed_end``)."""

    def appended(self, records: Sequence[MessageRecord]) -> None:
        """Records were appended (under the put lock, in commitlog order)."""

    def behind_bytes(self, committed_end: int) -> int:
        """Commitlog bytes appended but not dispatched yet (``dispatchBehindBytes``)."""

    def query_index(self, topic: str, key: str, begin_ms: int, end_ms: int,
                    max_num: int) -> tuple[tuple[int, int], list[int]]:
        """``(index progress, commitlog offsets)`` of the entries for ``topic#key``."""

    def drop_topic_locked(self, topic: str, fence: int) -> None:
        """A topic is being deleted (called under the put lock, so no put is dispatched meanwhile):
        remove its consume queues if they are written here, and never queue its records below
        ``fence`` again."""

    def drop_topic_after(self, topic: str, fence: int) -> None:
        """The same, after the put lock was released (for removal in another process, which may take
        a while); returns once the files are gone."""


class InlineDispatch:
    """The putting thread dispatches, under the put lock: every stored record is pullable and
    findable by key when the put returns (tools, tests, a single-process store)."""

    reads_appended_records = True

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.deleter: Callable[[str, int], None] | None = None  # not used: the queues are removed here

    def opened(self, committed_end: int) -> None:
        pass

    def appended(self, records: Sequence[MessageRecord]) -> None:
        self.dispatcher.dispatch(records)

    def behind_bytes(self, committed_end: int) -> int:
        return 0  # dispatched with the append

    def query_index(self, topic: str, key: str, begin_ms: int, end_ms: int,
                    max_num: int) -> tuple[tuple[int, int], list[int]]:
        with self.dispatcher.index_lock:
            index = self.dispatcher.index
            return index_progress(index), index.query_offsets(topic, key, begin_ms, end_ms, max_num)

    def drop_topic_locked(self, topic: str, fence: int) -> None:
        self.dispatcher.drop_topic(topic, fence)

    def drop_topic_after(self, topic: str, fence: int) -> None:
        pass


class ExternalDispatch:
    """A dispatcher process writes the queues and the index (the multiprocess broker): this side
    hands its writers over after recovery, follows the process's progress (``next_offset``, moved by
    :meth:`~broker.engine.message_store.MessageStore.external_advance`), reads the index files as they
    are on disk, and sends topic deletions to the process through ``deleter``."""

    reads_appended_records = False

    def __init__(self, dispatcher: Dispatcher, store_dir: Path, settings: StoreSettings) -> None:
        self.dispatcher = dispatcher
        self.store_dir = store_dir
        self.settings = settings
        self.deleter: Callable[[str, int], None] | None = None  # set by the process manager

    def opened(self, committed_end: int) -> None:
        self.dispatcher.next_offset = committed_end  # recovery dispatched everything
        self.dispatcher.release_writers()

    def appended(self, records: Sequence[MessageRecord]) -> None:
        pass  # the store's commit listener wakes the process

    def behind_bytes(self, committed_end: int) -> int:
        return max(0, committed_end - self.dispatcher.next_offset)

    def query_index(self, topic: str, key: str, begin_ms: int, end_ms: int,
                    max_num: int) -> tuple[tuple[int, int], list[int]]:
        index = IndexService(self.store_dir, self.settings.index_slots, self.settings.index_entries)
        try:
            return index_progress(index), index.query_offsets(topic, key, begin_ms, end_ms, max_num)
        finally:
            index.close()

    def drop_topic_locked(self, topic: str, fence: int) -> None:
        pass  # this process ignores the old records' progress already (the store's fences)

    def drop_topic_after(self, topic: str, fence: int) -> None:
        if self.deleter is None:
            raise RuntimeError(f"no dispatcher process to delete the consume queues of {topic}")
        self.deleter(topic, fence)

