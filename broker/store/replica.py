"""Offline comparison of a master's store and its slave's (4.x master/slave replication).

An Apache 4.x slave appends exactly the master's commitlog bytes at the same physical offsets
(``HAService`` ships byte ranges, not records) and builds its own ConsumeQueue and IndexFile from
them. So a healthy slave's commitlog is a byte-for-byte copy of a *prefix* of its master's, and the
comparison is a byte comparison, not a record-by-record one: the overlapping files are compared in
large chunks (C-level ``bytes`` equality, numpy only inside a chunk that differs), and the record
walker (:func:`broker.store.record_scan.scan_records`, compiled) and decoder
(:func:`broker.store.inspect.message_at`) are used only to name the records at the few offsets that
matter: where the slave ends, where it first differs, where it runs past the master.

What counts as normal: a slave whose first file starts above the master's (it began replicating at
the master's newest file), a master whose oldest files expired (only the overlap is compared), a
slave behind its master (lag), and a slave holding part of the master's next record (a torn tail: HA
ships byte ranges, so the slave's end may fall inside a record; Apache's recovery cuts it off). What
is not: bytes that differ inside the overlap (divergence) and a slave holding data past the master's
end (a slave ahead of its master: Apache truncates it when it reconnects).

The slave's end is measured in whole records (the end of its last complete record, whose bytes equal
the master's), and lag in bytes is ``master end - slave end``.
"""

from __future__ import annotations

import logging
import mmap
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from broker.store.commitlog import CommitLog, Segment, offset_to_file_name
from broker.store.constants import COMMITLOG_DIR
from broker.store.consume_queue import ConsumeQueue, list_queues
from broker.store.inspect import message_at
from broker.store.record_scan import last_nonzero, scan_records

log = logging.getLogger(__name__)

COMPARE_CHUNK = 16 << 20  # bytes compared per step: large enough for memcmp speed, small enough to stay cheap

IN_SYNC, LAGGING, DIVERGENT, AHEAD = "in_sync", "lagging", "divergent", "ahead"


class ReplicaError(ValueError):
    """The two stores cannot be compared (which store, which file, what)."""


@dataclass(frozen=True, slots=True)
class RecordRef:
    """A record named the way an operator looks it up: where it is and what it is."""

    commitlog_offset: int
    file: str
    file_offset: int
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    store_timestamp: int | None = None
    msg_id: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}@{self.file_offset} (commitlog {self.commitlog_offset})"
        if self.topic is None:
            return f"{where}: no message record decodes here"
        return (f"{where}: {self.topic}/{self.queue_id} queue offset {self.queue_offset}, "
                f"store time {self.store_timestamp}, msgId {self.msg_id}")


@dataclass(frozen=True, slots=True)
class StoreRange:
    """One side's commitlog: its directory, ``[min_offset, max_offset)`` of data and its newest record."""

    store: str
    min_offset: int
    max_offset: int
    files: int
    last_record: RecordRef | None


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first byte where the slave differs from the master, and the record around it on both sides."""

    commitlog_offset: int
    master_file: str
    master_file_offset: int
    slave_file: str
    slave_file_offset: int
    master_record: RecordRef | None
    slave_record: RecordRef | None

    def __str__(self) -> str:
        return (f"first differing byte at commitlog {self.commitlog_offset}: master {self.master_file}@"
                f"{self.master_file_offset}, slave {self.slave_file}@{self.slave_file_offset}; master record "
                f"{self.master_record}; slave record {self.slave_record}")


@dataclass(frozen=True, slots=True)
class QueueMismatch:
    """The first ConsumeQueue unit of a queue where master and slave disagree (within the records both hold)."""

    topic: str
    queue_id: int
    queue_offset: int
    master_unit: tuple[int, int, int] | None  # (commitlog offset, size, tagsCode)
    slave_unit: tuple[int, int, int] | None
    slave_file: str
    slave_file_offset: int

    def __str__(self) -> str:
        return (f"{self.topic}/{self.queue_id} queue offset {self.queue_offset}: master unit {self.master_unit}, "
                f"slave unit {self.slave_unit} ({self.slave_file}@{self.slave_file_offset})")


@dataclass(slots=True)
class ReplicaReport:
    master: StoreRange
    slave: StoreRange
    segment_size: int
    slave_end: int                 # end of the slave's last complete record that equals the master's bytes
    lag_bytes: int                 # master end - slave end (0 when in sync or ahead)
    lag_ms: int | None             # master's newest store time - slave's newest (None: the slave has none)
    missing_records: int           # master message records at or after the slave's end
    first_missing: RecordRef | None
    partial_bytes: int = 0         # bytes of the master's next record the slave holds (a torn tail)
    compared_from: int = 0
    compared_to: int = 0           # [from, to): the bytes compared
    divergence: Divergence | None = None
    ahead_bytes: int = 0           # slave data past the master's end
    first_ahead: RecordRef | None = None
    queue_mismatches: list[QueueMismatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.divergence is not None or self.queue_mismatches:
            return DIVERGENT
        if self.ahead_bytes:
            return AHEAD
        return LAGGING if self.lag_bytes else IN_SYNC

    @property
    def ok(self) -> bool:
        """True when the slave is a prefix of its master (in sync or only lagging)."""
        return self.status in (IN_SYNC, LAGGING)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["status"] = self.status
        return out

    def lines(self) -> list[str]:
        """One fact per line, for the CLI."""
        m, s = self.master, self.slave
        out = [f"status: {self.status}",
               f"master: {m.store} commitlog [{m.min_offset}, {m.max_offset}) in {m.files} files",
               f"slave: {s.store} commitlog [{s.min_offset}, {s.max_offset}) in {s.files} files",
               f"segment size: {self.segment_size}",
               f"compared: [{self.compared_from}, {self.compared_to}) ({self.compared_to - self.compared_from} bytes)",
               f"lag: {self.lag_bytes} bytes, "
               + (f"{self.lag_ms} ms" if self.lag_ms is not None else "ms unknown (the slave holds no record)"),
               f"missing records: {self.missing_records}"]
        if self.first_missing is not None:
            out.append(f"first missing record: {self.first_missing}")
        if self.partial_bytes:
            out.append(f"torn tail: the slave holds {self.partial_bytes} bytes of the next record")
        if self.divergence is not None:
            out.append(f"divergence: {self.divergence}")
        if self.ahead_bytes:
            out.append(f"ahead: the slave holds {self.ahead_bytes} bytes past the master's end "
                       f"(Apache truncates them); first: {self.first_ahead}")
        out += [f"consume queue mismatch: {q}" for q in self.queue_mismatches]
        out += [f"note: {n}" for n in self.notes]
        return out


# ---- reading one side ----------------------------------------------------------------------------------

def _open_side(store: str | os.PathLike, role: str, segment_size: int | None) -> CommitLog:
    path = Path(store)
    if not path.is_dir():
        raise ReplicaError(f"{role} store {store}: no such directory")
    if not (path / COMMITLOG_DIR).is_dir():
        raise ReplicaError(f"{role} store {store}: no {COMMITLOG_DIR}/ directory (not a RocketMQ store)")
    try:
        log_ = CommitLog.open(path, segment_size)
    except OSError as exc:
        raise ReplicaError(f"{role} store {store}: cannot list {path / COMMITLOG_DIR}: {exc}") from None
    for f in log_.findings:  # wrong lengths, gaps, foreign names: the files are not one log
        raise ReplicaError(f"{role} store {store}: {f}")
    for seg in log_.segments:
        if not os.access(seg.path, os.R_OK):
            raise ReplicaError(f"{role} store {store}: cannot read {seg.path}")
    return log_


def _close(buf) -> None:
    if isinstance(buf, mmap.mmap):
        try:
            buf.close()
        except BufferError:  # a decoded row still references it; it closes when the row goes
            pass


def _extent(log_: CommitLog) -> int:
    """Offset just past the last non-zero byte of the log (its written extent, torn bytes included)."""
    for seg in reversed(log_.segments):
        buf = seg.open()
        try:
            end = last_nonzero(buf, 0, min(len(buf), log_.segment_size))
        finally:
            _close(buf)
        if end:
            return seg.base + end
    return log_.min_offset


def _starts(log_: CommitLog, seg: Segment, start: int = 0, end: int | None = None) -> np.ndarray:
    """Absolute offsets of the message records starting in ``[start, end)`` of a segment (file positions)."""
    buf = seg.open()
    try:
        scan = scan_records(buf, seg.base, log_.segment_size, start, end, str(seg.path), search_first=False)
        return scan.starts + seg.base
    finally:
        _close(buf)


def _record(log_: CommitLog, offset: int) -> RecordRef:
    """The record at ``offset``, named by file and position (fields left None when none decodes there)."""
    base = offset - offset % log_.segment_size  # files sit at multiples of the segment size
    seg = log_.segment_for(offset)
    file = str(seg.path) if seg else str(log_.directory / offset_to_file_name(base))
    row = message_at(log_, offset) if seg else None
    if row is None:
        return RecordRef(offset, file, offset - base)
    return RecordRef(offset, file, offset - base, row["topic"], row["queue_id"], row["queue_offset"],
                     row["store_timestamp"], row["offset_msg_id"])


def _last_record_before(log_: CommitLog, end: int) -> RecordRef | None:
    """The newest message record starting below ``end`` (segments walked from the end, compiled walk)."""
    for seg in reversed(log_.segments):
        if seg.base >= end:
            continue
        starts = _starts(log_, seg, 0, min(end - seg.base, log_.segment_size))
        if starts.size:
            return _record(log_, int(starts[-1]))
    return None


def _record_start_at_or_below(log_: CommitLog, offset: int) -> int | None:
    """Start of the last message record of ``offset``'s file that starts at or below it (None: none does)."""
    seg = log_.segment_for(offset)
    if seg is None:
        return None
    starts = _starts(log_, seg, 0, offset - seg.base + 1)
    return int(starts[-1]) if starts.size else None


def _boundary_at_or_below(log_: CommitLog, offset: int) -> int:
    """The largest record boundary (a record's start or end, a file's start) at or below ``offset``."""
    seg = log_.segment_for(offset)
    if seg is None or offset == seg.base:
        return offset
    last = _record_start_at_or_below(log_, offset)
    if last is None:
        return seg.base
    if last == offset:
        return last
    end = last + log_.read_record(last).total_size
    return end if end <= offset else last


def _count_records(log_: CommitLog, start: int, end: int) -> tuple[int, int | None]:
    """Message records starting in ``[start, end)`` and the first one's offset (compiled walks, no
    Python per record). ``start`` must be a record boundary."""
    count, first = 0, None
    for seg in log_.segments:
        seg_end = seg.base + log_.segment_size
        if seg_end <= start or seg.base >= end:
            continue
        starts = _starts(log_, seg, max(0, start - seg.base), min(log_.segment_size, end - seg.base))
        if starts.size and first is None:
            first = int(starts[0])
        count += int(starts.size)
    return count, first


# ---- the byte comparison --------------------------------------------------------------------------------

def _first_difference(master: CommitLog, slave: CommitLog, start: int, stop: int) -> int | None:
    """First offset in ``[start, stop)`` whose byte differs between the two logs, else None.

    File by file, chunk by chunk: equal chunks cost one memcmp; only a differing chunk is looked at
    with numpy to find the byte."""
    pos = start
    while pos < stop:
        m_seg, s_seg = master.segment_for(pos), slave.segment_for(pos)
        if m_seg is None or s_seg is None:
            missing = "master" if m_seg is None else "slave"
            raise ReplicaError(f"{missing} store has no commitlog file holding offset {pos} "
                               f"(expected {offset_to_file_name(pos - pos % master.segment_size)})")
        seg_stop = min(stop, m_seg.base + master.segment_size)
        m_buf, s_buf = m_seg.open(), s_seg.open()
        try:
            while pos < seg_stop:
                a, b = pos - m_seg.base, min(seg_stop, pos + COMPARE_CHUNK) - m_seg.base
                if len(m_buf) < b or len(s_buf) < b:  # a short file: compare what both hold
                    b = max(a, min(len(m_buf), len(s_buf), b))
                    if a == b:
                        return pos
                if m_buf[a:b] != s_buf[a:b]:
                    diff = np.frombuffer(m_buf, np.uint8, b - a, a) != np.frombuffer(s_buf, np.uint8, b - a, a)
                    return m_seg.base + a + int(np.argmax(diff))
                pos = m_seg.base + b
        finally:
            _close(m_buf)
            _close(s_buf)
    return None


def _divergence(master: CommitLog, slave: CommitLog, diff: int) -> Divergence:
    """Name the first differing byte and the record around it on both sides (bytes before ``diff``
    are equal, so the record starts at the same offset in both)."""
    start = _record_start_at_or_below(master, diff)
    if start is not None and start + master.read_record(start).total_size <= diff:
        start = None  # past the file's last record: in its BLANK or padding
    at = diff if start is None else start
    m_seg, s_seg = master.segment_for(diff), slave.segment_for(diff)
    return Divergence(diff, str(m_seg.path), diff - m_seg.base, str(s_seg.path), diff - s_seg.base,
                      _record(master, at), _record(slave, at))


# ---- consume queues --------------------------------------------------------------------------------------

def _queue_mismatches(master_dir: Path, slave_dir: Path, master: CommitLog, slave: CommitLog,
                      lo: int, hi: int) -> list[QueueMismatch]:
    """Per queue, the units of records in ``[lo, hi)`` that both stores dispatched must be equal."""
    queues = sorted(set(list_queues(master_dir)) | set(list_queues(slave_dir)))
    cqs, last = {}, {}
    for side, root, log_ in (("master", master_dir, master), ("slave", slave_dir, slave)):
        newest = -1
        for topic, qid in queues:
            cq = ConsumeQueue(root, topic, qid, commitlog_min_offset=log_.min_offset)
            units = cq.units()
            cqs[(side, topic, qid)] = (cq, units)
            if len(units):
                newest = max(newest, int(units["commitlog_offset"].max()))
        last[side] = newest
    # only records both dispatchers reached: the rest is dispatch backlog, not disagreement
    hi = min(hi, min(last.values()) + 1)
    out = []
    fields = ["logical_offset", "commitlog_offset", "size", "tags_code"]
    for topic, qid in queues:
        cq_s, s_units = cqs[("slave", topic, qid)]
        _, m_units = cqs[("master", topic, qid)]
        m = m_units[(m_units["commitlog_offset"] >= lo) & (m_units["commitlog_offset"] < hi)][fields]
        s = s_units[(s_units["commitlog_offset"] >= lo) & (s_units["commitlog_offset"] < hi)][fields]
        n = min(len(m), len(s))
        differ = np.flatnonzero(m[:n] != s[:n])
        if differ.size:
            i = int(differ[0])
        elif len(m) != len(s):
            i = n
        else:
            continue
        mu = tuple(int(v) for v in m[i].tolist()) if i < len(m) else None
        su = tuple(int(v) for v in s[i].tolist()) if i < len(s) else None
        logical = (mu or su)[0]
        base, pos = cq_s.reader.locate(logical)
        out.append(QueueMismatch(topic, qid, logical, mu[1:] if mu else None, su[1:] if su else None,
                                 str(cq_s.reader.path_of(base)), pos))
    return out


# ---- the entry point -------------------------------------------------------------------------------------

def compare_stores(master_dir: str | os.PathLike, slave_dir: str | os.PathLike, *,
                   segment_size: int | None = None, check_queues: bool = True) -> ReplicaReport:
    """Compare a slave's store with its master's (both read-only; broker down or a copy).

    Raises :class:`ReplicaError` when a store is missing or unreadable, its files are not one log,
    or the two use different commitlog file sizes."""
    master = _open_side(master_dir, "master", segment_size)
    slave = _open_side(slave_dir, "slave", segment_size)
    if not master.segments:
        raise ReplicaError(f"master store {master_dir}: {master.directory} holds no commitlog file")
    if slave.segments and master.segment_size != slave.segment_size:
        raise ReplicaError(f"different commitlog file sizes: master {master_dir} uses {master.segment_size} bytes, "
                           f"slave {slave_dir} uses {slave.segment_size} bytes (mappedFileSizeCommitLog must match)")
    if slave.segments and slave.min_offset % master.segment_size:
        raise ReplicaError(f"slave store {slave_dir}: first commitlog file {slave.segments[0].path} does not start "
                           f"at a multiple of the segment size {master.segment_size}")
    seg_size = master.segment_size
    notes: list[str] = []
    master_end = master.data_end()
    if slave.segments:
        slave_walk_end = slave.data_end()
        raw_extent = _extent(slave)
        lo = max(master.min_offset, slave.min_offset)
    else:
        slave_walk_end = raw_extent = lo = master.min_offset
        notes.append("the slave holds no commitlog file yet")
    if slave.segments and slave.min_offset > master.min_offset:
        notes.append(f"the slave's first file starts at {slave.min_offset}, above the master's {master.min_offset} "
                     "(it began replicating at a newer file)")
    if slave.segments and master.min_offset > slave.min_offset:
        notes.append(f"the master's files below {master.min_offset} expired; compared from there")
    hi = min(max(raw_extent, slave_walk_end), master_end)
    divergence, partial = None, 0
    if hi <= lo:  # nothing both hold
        slave_end = min(max(raw_extent, slave_walk_end), master_end) if slave.segments else master.min_offset
        if slave.segments and slave_end <= master.min_offset:
            notes.append(f"nothing to compare: the slave's data ends at {slave_end}, at or below the master's "
                         f"first file at {master.min_offset}")
        hi = lo
    else:
        diff = _first_difference(master, slave, lo, hi)
        if diff is None:
            slave_end = _boundary_at_or_below(master, hi)
            partial = hi - slave_end
        elif diff >= raw_extent:
            # only zeros on the slave from here: an incomplete copy of the master's record (a torn tail)
            slave_end = _boundary_at_or_below(master, diff)
            partial = max(0, raw_extent - slave_end)
        else:
            divergence = _divergence(master, slave, diff)
            slave_end = _boundary_at_or_below(master, hi)  # how far the slave got, wrong bytes or not
            hi = diff
    lag_bytes = max(0, master_end - slave_end)
    missing, first_missing_at = _count_records(master, slave_end, master_end) if lag_bytes else (0, None)
    first_missing = _record(master, first_missing_at) if first_missing_at is not None else None
    ahead, first_ahead = 0, None
    if slave.segments and slave_walk_end > master_end:
        ahead = slave_walk_end - master_end
        _, first_at = _count_records(slave, master_end, slave_walk_end)
        first_ahead = _record(slave, first_at) if first_at is not None else None
    master_last = _last_record_before(master, master_end)
    slave_last = _last_record_before(slave, slave_end) if slave.segments else None
    lag_ms = None
    if master_last is not None and slave_last is not None:
        lag_ms = master_last.store_timestamp - slave_last.store_timestamp
    report = ReplicaReport(
        StoreRange(str(master_dir), master.min_offset, master_end, len(master.segments), master_last),
        StoreRange(str(slave_dir), slave.min_offset if slave.segments else 0, slave_walk_end,
                   len(slave.segments), slave_last),
        seg_size, slave_end, lag_bytes, lag_ms, missing, first_missing, partial, lo, max(lo, hi),
        divergence, ahead, first_ahead, notes=notes)
    if check_queues and slave.segments:
        report.queue_mismatches = _queue_mismatches(Path(master_dir), Path(slave_dir), master, slave,
                                                    lo, min(hi, slave_end))
    log.info("compared %s (master) with %s (slave): %s", master_dir, slave_dir, report.status)
    return report
