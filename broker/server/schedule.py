"""Delivery of delayed messages (4.9.8 ``ScheduleMessageService``, store-format.md 3.9).

A message put with ``DELAY=n`` waits in ``SCHEDULE_TOPIC_XXXX`` queue n-1; its CQ tagsCode is the
deliver time. For each level the service reads that queue from the level's offset in
``config/delayOffset.json``, writes a copy of every unit that is due to ``REAL_TOPIC``/``REAL_QID``
and advances the offset; it stops a level at the first unit that is not due yet (units of one level
are in deliver-time order, because every message of a level waits the same time).

The delivered copy keeps the schedule record's properties string verbatim: Apache builds it before it
removes ``DELAY`` from the map, so ``DELAY``, ``REAL_TOPIC`` and ``REAL_QID`` stay on disk (and the
copy is put with ``apply_delay=False`` so the store does not delay it again). Delivery is at-least-once:
a crash after a put but before the offset is persisted delivers that message again, as in Apache.
"""

from __future__ import annotations

import logging
import threading

from broker.engine.message_store import MessageStore
from broker.server.offsets import DelayOffsetManager
from broker.store.constants import PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC
from broker.store.message import MessageRecord, RecordError
from broker.store.topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC, delay_level_to_queue_id

log = logging.getLogger(__name__)

_READ_UNITS = 256  # units read per pread while walking a level's queue


class ScheduleService:
    """Moves due messages from ``SCHEDULE_TOPIC_XXXX`` to their real topics.

    :meth:`run_once` is the whole algorithm and takes the time to compare against, so tests drive
    it with a fake clock; :meth:`start` runs it on a thread with the store's clock. The level
    offsets (``delayOffset.json``) are the service's to advance and persist, as in Apache's
    ``ScheduleMessageService``; the broker hands it its metadata's manager, which also answers
    GET_ALL_DELAY_OFFSET and is persisted with the other tables.
    """

    def __init__(self, store: MessageStore, offsets: DelayOffsetManager) -> None:
        self.store = store
        self.offsets = offsets
        self.levels = store.settings.delay_levels
        self._lock = threading.Lock()  # one run at a time (thread and explicit calls)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the algorithm ------------------------------------------------------------------------------
    def run_once(self, now_ms: int | None = None) -> int:
        """Deliver every due message of every level; returns how many were delivered.
        The offsets are persisted to ``delayOffset.json`` when they moved."""
        now = self.store.clock() if now_ms is None else now_ms
        delivered = 0
        with self._lock:
            for level in range(1, len(self.levels) + 1):
                delivered += self._deliver_level(level, now)
            self.offsets.persist()
        return delivered

    def _deliver_level(self, level: int, now: int) -> int:
        view = self.store.consume_queue(SCHEDULE_TOPIC, delay_level_to_queue_id(level))
        offsets = self.offsets
        offset = offsets.get(level)
        start = offset
        offset = min(max(offset, view.min_offset), view.max_offset)  # queue trimmed or offset stale
        delivered = 0
        try:
            while offset < view.max_offset:
                units = view.read_units(offset, _READ_UNITS)
                if not len(units):
                    break
                for phy, size, deliver_at in zip(units["commitlog_offset"].tolist(), units["size"].tolist(),
                                                 units["tags_code"].tolist()):
                    if self._correct_deliver_time(now, deliver_at, level) > now:
                        return delivered
                    if not self._deliver(phy, level):
                        return delivered  # put failed: retry this unit on the next run
                    offset += 1
                    delivered += 1
        finally:
            if offset != start:
                offsets.set(level, offset)
        return delivered

    def _correct_deliver_time(self, now: int, deliver_at: int, level: int) -> int:
        """``correctDeliverTimestamp``: a deliver time further away than the level's delay (clock
        went back, or a bogus unit) is treated as due now."""
        return now if deliver_at > now + self.levels[level - 1] else deliver_at

    def _deliver(self, phy: int, level: int) -> bool:
        """Put the real-topic copy of the record at ``phy``; False only when the put failed."""
        try:
            rec = self.store.view_message(phy)
        except RecordError as exc:
            log.error("delay level %d: cannot read commitlog offset %d (%s); skipped", level, phy, exc)
            return True
        inner = self.message_time_up(rec)
        if inner is None:
            log.error("delay level %d: record at %d has no usable REAL_TOPIC/REAL_QID; skipped", level, phy)
            return True
        if inner.topic == TRANS_HALF_TOPIC:
            log.error("delay level %d: refusing to deliver a half message to %s", level, inner.topic)
            return True
        result = self.store.put_message(inner, apply_delay=False)
        if not result.ok:
            log.error("delay level %d: delivering %d to %s failed: %s", level, phy, inner.topic, result.status)
        return result.ok

    @staticmethod
    def message_time_up(rec: MessageRecord) -> MessageRecord | None:
        """``messageTimeup``: the copy for the real topic (properties string kept verbatim; born
        fields, flag, sysFlag and reconsume times copied)."""
        props = rec.properties
        topic = props.get(PROPERTY_REAL_TOPIC)
        qid_text = props.get(PROPERTY_REAL_QID, "")
        if not topic or not qid_text.lstrip("-").isdigit():
            return None
        return MessageRecord(topic=topic, body=rec.body, properties_raw=rec.properties_raw,
                             queue_id=int(qid_text), flag=rec.flag, sys_flag=rec.sys_flag,
                             born_timestamp=rec.born_timestamp, born_host=rec.born_host,
                             reconsume_times=rec.reconsume_times)

    # ---- background thread -------------------------------------------------------------------------
    def start(self, interval_ms: int = 100) -> None:
        """Run :meth:`run_once` every ``interval_ms`` on a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(interval_ms / 1000,), name="schedule-service",
                                        daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.run_once()
            except Exception:
                log.exception("schedule service run failed")

    def stop(self) -> None:
        """Stop the thread and persist the offsets (call before closing the store)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.offsets.persist()
