"""Store recovery at open time (store-format.md section 9), in two steps.

:func:`repair` runs before anything is written: it walks the commitlog from a few files before its end
(from the file the checkpoint names too, after a crash), validating every record like Apache's
``checkMessageAndReturnSize`` (magic, PHYSICALOFFSET, field lengths, body CRC when
``check_crc_on_recover``), stops at the first invalid one, zeroes the torn tail and deletes later
files; then trims consume-queue units that point at or past the recovered end and rewinds an index
that got ahead of it. :func:`redispatch` then feeds everything after the largest CQ-referenced offset
(after a crash: from the file before that record's, see :func:`_torn_run_start`) through the store's
:class:`~broker.engine.dispatch.Dispatcher` (idempotent), which also covers a broker that stopped
between append and dispatch without crashing.

Apache replays abnormal recoveries from the checkpoint's file; here the queues' own tails decide
where re-dispatch starts (every byte a killed process wrote is in the page cache; after a crash the
start moves back a file, for a dispatch run the kill cut between its queues), which keeps restarts
fast. Index files are not deleted by checkpoint time; entries that point
past the recovered end are made harmless by rewinding the last file's end offset (queries verify
keys against the records anyway).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np

from broker.engine.dispatch import Dispatcher
from broker.engine.store_settings import StoreSettings
from broker.store.checkpoint import CheckpointError, read_checkpoint
from broker.store.commitlog import CommitLog, Segment, list_segments
from broker.store.constants import (
    CONSUME_QUEUE_DIR,
    CQ_STORE_UNIT_SIZE,
    INDEX_DIR,
)
from broker.store.record_check import BLANK, MESSAGE, RecordError, check_record
from broker.store.record_layout import MAGIC_V1, MAGIC_V2, POS_MAGIC, STORE_TIMESTAMP_PROBE, read_store_timestamp
from broker.store.consume_queue import QueueFiles, is_fill_unit, list_queues
from broker.store.index_file import IndexFile, IndexService, index_file_size, parse_index_file_name
from broker.store.record_scan import scan_records

log = logging.getLogger(__name__)

_I32 = struct.Struct(">i")
_NORMAL_RECOVERY_FILES = 3  # Apache's normal recovery starts at the 3rd-last commitlog file
_CHUNK = 1 << 20
_CQ_JUNK_WINDOW = 64 * 1024  # bytes after a queue's end checked for torn units


class RecoveryError(RuntimeError):
    """The store cannot be recovered safely (e.g. files of another geometry)."""


@dataclass(frozen=True, slots=True)
class QueueTail:
    """A consume queue's end after trimming: next logical offset and ``phy + size`` of its last
    unit (-1 when it has no real unit)."""

    max_offset: int
    max_phy_end: int


@dataclass
class RecoveryReport:
    """What :func:`repair` and :func:`redispatch` found and did."""

    abnormal: bool
    start_file: str | None = None
    records_checked: int = 0
    commitlog_min_offset: int = 0
    commitlog_end: int = 0
    last_store_timestamp: int = 0
    stop_reason: str | None = None  # why the walk stopped before the zeros (None: clean end)
    records_dropped: int = 0  # record starts found in the cut-off bytes (incl. the torn one)
    bytes_truncated: int = 0  # non-zero bytes zeroed or deleted after the recovered end
    files_deleted: list[str] = field(default_factory=list)
    cq_units_truncated: int = 0
    cq_files_deleted: int = 0
    index_files_deleted: int = 0
    index_rewound: bool = False
    dispatch_from: int = 0
    redispatched: int = 0
    queue_tails: dict[tuple[str, int], QueueTail] = field(default_factory=dict, repr=False)

    @property
    def changed_anything(self) -> bool:
        return bool(self.bytes_truncated or self.files_deleted or self.cq_units_truncated or self.cq_files_deleted
                    or self.index_files_deleted or self.index_rewound or self.redispatched)

    def summary(self) -> str:
        kind = "abnormal" if self.abnormal else "normal"
        parts = [f"{kind} recovery from {self.start_file or '-'}: {self.records_checked} records checked",
                 f"commitlog end {self.commitlog_end}"]
        if self.stop_reason:
            parts.append(f"stopped at {self.commitlog_end}: {self.stop_reason}")
        if self.bytes_truncated or self.files_deleted:
            parts.append(f"truncated {self.records_dropped} records / {self.bytes_truncated} bytes, "
                         f"deleted {len(self.files_deleted)} commitlog files")
        if self.cq_units_truncated or self.cq_files_deleted:
            parts.append(f"trimmed {self.cq_units_truncated} CQ units, deleted {self.cq_files_deleted} CQ files")
        if self.index_files_deleted or self.index_rewound:
            parts.append(f"index: deleted {self.index_files_deleted} files, rewound={self.index_rewound}")
        parts.append(f"re-dispatched {self.redispatched} records from {self.dispatch_from}")
        return "; ".join(parts)


# =====================================================================================================
# CommitLog
# =====================================================================================================
def _check_at(buf, pos: int, seg_base: int, seg_size: int, check_crc: bool) -> tuple[str, int, int, str]:
    """The record at ``buf[pos]`` by the store's one checker: ``(kind, size, store_timestamp, reason)``
    with kind MESSAGE, BLANK (which must fill the rest of its file), END (zeros: the normal end of
    data) or ``"bad"`` with the checker's reason."""
    try:
        found = check_record(buf, pos, seg_base + pos, min(len(buf), seg_size), check_crc=check_crc)
    except RecordError as exc:
        return "bad", 0, 0, exc.detail
    if found.kind == BLANK and found.size != seg_size - pos:
        return "bad", 0, 0, f"BLANK record size {found.size} != {seg_size - pos} bytes left"
    return found.kind, found.size, found.store_timestamp, ""


def _check_sizes(files: list[Segment], size: int, what: str) -> list[Segment]:
    """Files must have the configured size (Apache refuses to load otherwise), except that the last
    one may be short and empty: a process killed between creating a pre-sized file and sizing it
    leaves it so. That one is sized up (zeros are "no data"); anything else is a geometry mismatch."""
    for i, f in enumerate(files):
        if f.size == size:
            continue
        if i == len(files) - 1 and f.size < size and not any(f.path.read_bytes()):
            log.warning("%s file %s is %d bytes (killed while it was created?); extending it to %d",
                        what, f.path, f.size, size)
            os.truncate(f.path, size)
            files[i] = Segment(f.path, f.base, size)
            continue
        raise RecoveryError(f"{what} file {f.path} is {f.size} bytes, the store is configured for {size}; "
                            "refusing to open (Apache refuses too)")
    return files


def _first_store_timestamp(seg: Segment, seg_size: int) -> int:
    """Store time of a file's first record, 0 if it does not start with a message."""
    try:
        with open(seg.path, "rb") as fh:
            head = fh.read(STORE_TIMESTAMP_PROBE)
    except OSError:
        return 0
    if len(head) < POS_MAGIC + 4 or _I32.unpack_from(head, POS_MAGIC)[0] not in (MAGIC_V1, MAGIC_V2):
        return 0
    try:
        return read_store_timestamp(head)
    except struct.error:
        return 0


def _start_index(segments: list[Segment], seg_size: int, store_dir: Path, abnormal: bool) -> int:
    """Normal: the 3rd-last file. Abnormal: also no later than the newest file whose first record
    is older than the checkpoint's safe time (``isMappedFileMatchedRecover``), or the first file."""
    start = max(0, len(segments) - _NORMAL_RECOVERY_FILES)
    if not abnormal:
        return start
    try:
        min_ts = read_checkpoint(store_dir, allow_short=True).min_timestamp()
    except CheckpointError:
        return 0
    for i in range(len(segments) - 1, -1, -1):
        ts = _first_store_timestamp(segments[i], seg_size)
        if 0 < ts <= min_ts:
            return min(start, i)
    return 0


def _last_nonzero(buf, start: int, stop: int) -> int:
    """Position after the last non-zero byte of ``buf[start:stop]`` (``start`` if all zero),
    scanning backwards in chunks so a zero tail costs no allocation."""
    hi = min(stop, len(buf))
    while hi > start:
        lo = max(start, hi - _CHUNK)
        chunk = np.frombuffer(buf, np.uint8, hi - lo, lo)
        nz = np.flatnonzero(chunk)
        del chunk
        if nz.size:
            return lo + int(nz[-1]) + 1
        hi = lo
    return start


def _data_end(path: Path, start: int, stop: int) -> int:
    """Where the last data region of ``path`` within ``[start, stop)`` ends (``start`` if none):
    every byte from there to ``stop`` lies in a hole of the sparse file, and holes read as zeros.

    Why: a commitlog file is created sparse at its full size (1 GiB by default), so the tail after
    the last record is mostly hole; :func:`_last_nonzero` alone read all of it on every start (about
    a second of CPU per GiB). ``SEEK_DATA``/``SEEK_HOLE`` count pages still only in the page cache
    as data, as reads see them. Where the file system cannot tell holes, or the file is not sparse,
    the answer is ``stop`` and the scan covers everything, as before."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return stop
    try:
        end, pos = start, start
        while pos < stop:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data at or after pos
                    break
                return stop
            if data >= stop:
                break
            pos = os.lseek(fd, data, os.SEEK_HOLE)
            end = min(pos, stop)
        return end
    finally:
        os.close(fd)


def _zero_range(path: Path, start: int, stop: int) -> None:
    """Overwrite ``[start, stop)`` of a file with zeros and fsync."""
    fd = os.open(path, os.O_WRONLY)
    try:
        zeros = bytes(min(_CHUNK, max(stop - start, 0)))
        pos = start
        while pos < stop:
            n = min(len(zeros), stop - pos)
            os.pwrite(fd, zeros[:n], pos)
            pos += n
        os.fsync(fd)
    finally:
        os.close(fd)


def _map(path: Path) -> mmap.mmap | bytes:
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""


def _close(buf) -> None:
    if isinstance(buf, mmap.mmap):
        buf.close()


def recover_commitlog(store_dir: Path, settings: StoreSettings, abnormal: bool, report: RecoveryReport) -> int:
    """Find the end of valid data, cut everything after it; returns the recovered end offset."""
    seg_size = settings.segment_bytes
    segments = _check_sizes(list_segments(store_dir / "commitlog"), seg_size, "commitlog")
    if not segments:
        return 0
    report.commitlog_min_offset = segments[0].base
    index = _start_index(segments, seg_size, store_dir, abnormal)
    report.start_file = segments[index].name
    end = segments[index].base
    check_crc = settings.check_crc_on_recover
    stop_seg, stop_pos = None, 0
    for i in range(index, len(segments)):
        seg = segments[i]
        if seg.base != end:
            report.stop_reason = f"file {seg.name} does not start where the previous one ends ({end})"
            stop_seg, stop_pos = None, 0
            break
        buf = _map(seg.path)
        try:
            pos = 0
            while True:
                kind, size, ts, reason = _check_at(buf, pos, seg.base, seg_size, check_crc)
                if kind == MESSAGE:
                    pos += size
                    report.records_checked += 1
                    report.last_store_timestamp = ts
                    continue
                if kind == BLANK:
                    end = seg.base + seg_size
                    break
                end = seg.base + pos
                stop_seg, stop_pos = i, pos
                if kind == "bad":
                    report.stop_reason = reason
                break
        finally:
            _close(buf)
        if stop_seg is not None:
            break
    _truncate_commitlog(segments, seg_size, end, stop_seg, stop_pos, report)
    return end


def _truncate_commitlog(segments: list[Segment], seg_size: int, end: int, stop_seg: int | None,
                        stop_pos: int, report: RecoveryReport) -> None:
    """Zero the bytes after ``end`` in its file and delete every later file."""
    if stop_seg is not None:
        seg = segments[stop_seg]
        buf = _map(seg.path)
        try:
            tail = _last_nonzero(buf, stop_pos, _data_end(seg.path, stop_pos, seg_size))
            if tail > stop_pos:
                report.records_dropped += int(scan_records(buf, seg.base, seg_size, stop_pos, tail,
                                                           search_first=False).starts.size) or 1
                report.bytes_truncated += tail - stop_pos
        finally:
            _close(buf)
        if tail > stop_pos:
            log.warning("commitlog %s: zeroing %d bytes after the last valid record at %d (%s)",
                        seg.name, tail - stop_pos, end, report.stop_reason)
            _zero_range(seg.path, stop_pos, tail)
    for seg in segments:
        if seg.base > end:
            buf = _map(seg.path)
            try:
                tail = _last_nonzero(buf, 0, _data_end(seg.path, 0, seg_size))
                if tail:
                    report.records_dropped += int(scan_records(buf, seg.base, seg_size, 0, tail,
                                                               search_first=False).starts.size)
                    report.bytes_truncated += tail
            finally:
                _close(buf)
            log.warning("commitlog: deleting %s, which lies after the recovered end %d", seg.name, end)
            seg.path.unlink()
            report.files_deleted.append(seg.name)


# =====================================================================================================
# Consume queues
# =====================================================================================================
def _is_kept(unit: tuple[int, int, int], commitlog_end: int) -> bool:
    """Fill units and units whose record ends at or before the commitlog end survive a trim."""
    return is_fill_unit(*unit) or unit[0] + unit[1] <= commitlog_end


def _first_false(n: int, pred) -> int:
    """Smallest i in [0, n) with ``pred(i)`` False for a predicate that is True then False."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def trim_queue(directory: Path, file_size: int, commitlog_end: int, report: RecoveryReport) -> QueueTail:
    """Cut a queue's units that point at or past ``commitlog_end`` (and torn bytes after its end),
    delete files after its last unit, and return its tail.

    Only the last files are read, by binary search (a queue is a prefix of valid units in commitlog
    order followed by zeros), so opening a store with many long queues stays cheap.
    """
    files = _check_sizes(list_segments(directory), file_size, "consume queue")
    reader = QueueFiles(directory, file_size)
    while files:
        seg = files[-1]
        first = seg.base // CQ_STORE_UNIT_SIZE
        n = reader.written_units(seg.base)
        k = _first_false(n, lambda i: _is_kept(reader.unit(first + i), commitlog_end))
        if k == 0 and len(files) > 1:
            report.cq_units_truncated += n
            report.cq_files_deleted += 1
            log.warning("consume queue %s: deleting %s (no unit below commitlog end %d)",
                        directory, seg.name, commitlog_end)
            seg.path.unlink()
            files.pop()
            continue
        start = k * CQ_STORE_UNIT_SIZE
        with open(seg.path, "rb") as fh:
            window = os.pread(fh.fileno(), n * CQ_STORE_UNIT_SIZE - start + _CQ_JUNK_WINDOW, start)
        tail = _last_nonzero(window, 0, len(window))
        if tail:
            report.cq_units_truncated += max(n - k, 1)
            log.warning("consume queue %s/%s: zeroing %d bytes from logical offset %d (commitlog end %d)",
                        directory, seg.name, tail, first + k, commitlog_end)
            _zero_range(seg.path, start, start + tail)
        phy_end = -1
        if k > 0:
            unit = reader.unit(first + k - 1)
            phy_end = -1 if is_fill_unit(*unit) else unit[0] + unit[1]
        return QueueTail(first + k, phy_end)
    return QueueTail(0, -1)


# =====================================================================================================
# Index
# =====================================================================================================
def rewind_index(store_dir: Path, settings: StoreSettings, commitlog_end: int, report: RecoveryReport) -> None:
    """Make the index forget records at or past ``commitlog_end``: delete files that only hold such
    entries, and set the last file's ``endPhyOffset`` back to the last entry below the end, so the
    dispatcher's "already indexed" rule does not skip the records that will be written there."""
    expected = index_file_size(settings.index_slots, settings.index_entries)
    directory = store_dir / INDEX_DIR
    names = sorted(p.name for p in directory.iterdir() if parse_index_file_name(p.name) is not None) \
        if directory.is_dir() else []
    for i, name in enumerate(names):
        path = directory / name
        size = path.stat().st_size
        if size == expected:
            continue
        if i == len(names) - 1 and size < expected and not any(path.read_bytes()):
            log.warning("index file %s is %d bytes and empty (killed while it was created); deleting it", path, size)
            path.unlink()
            report.index_files_deleted += 1
            continue
        raise RecoveryError(f"index file {path} is {size} bytes, the store is configured for {expected} "
                            f"({settings.index_slots} slots, {settings.index_entries} entries)")
    index = IndexService(store_dir, settings.index_slots, settings.index_entries)
    try:
        while index.files:
            last = index.files[-1]
            if last.header.index_count > 1 and last.header.begin_phy_offset >= commitlog_end:
                log.warning("index: deleting %s, all its entries lie past commitlog end %d", last.name,
                            commitlog_end)
                last.close()
                last.path.unlink()
                index.files.pop()
                report.index_files_deleted += 1
                continue
            break
        if not index.files or index.files[-1].header.end_phy_offset < commitlog_end:
            return
        last = index.files.pop()
        entries = last.entries()
        below = entries["phy_offset"][entries["phy_offset"] < commitlog_end]
        new_end = int(below.max()) if below.size else min(last.header.begin_phy_offset, max(commitlog_end - 1, 0))
        last.close()
        writable = IndexFile.open(last.path, settings.index_slots, settings.index_entries, writable=True)
        log.warning("index %s: end offset %d is past commitlog end %d; rewinding it to %d", last.name,
                    writable.header.end_phy_offset, commitlog_end, new_end)
        writable.header.end_phy_offset = new_end
        writable.close()  # writes the header
        report.index_rewound = True
    finally:
        index.close()


# =====================================================================================================
# Entry points
# =====================================================================================================
def repair(store_dir: str | os.PathLike, settings: StoreSettings, abnormal: bool) -> RecoveryReport:
    """Bring the files back to a consistent prefix (see the module docstring); nothing is
    dispatched yet. The caller must hold the store lock."""
    store_dir = Path(store_dir)
    report = RecoveryReport(abnormal=abnormal)
    end = recover_commitlog(store_dir, settings, abnormal, report)
    report.commitlog_end = end
    for topic, qid in list_queues(store_dir):
        directory = store_dir / CONSUME_QUEUE_DIR / topic / str(qid)
        report.queue_tails[(topic, qid)] = trim_queue(directory, settings.cq_file_bytes, end, report)
    rewind_index(store_dir, settings, end, report)
    ends = [t.max_phy_end for t in report.queue_tails.values() if t.max_phy_end >= 0]
    if not ends:
        report.dispatch_from = report.commitlog_min_offset
    elif abnormal:
        report.dispatch_from = _torn_run_start(max(ends), settings.segment_bytes, report.commitlog_min_offset)
    else:
        report.dispatch_from = max(ends)
    return report


def _torn_run_start(last_end: int, seg_size: int, min_offset: int) -> int:
    """Where re-dispatch starts after a crash: the start of the commitlog file before the one that
    holds the last queued record (a record boundary), not just past that record.

    Why: the dispatcher writes a run of records queue by queue (``Dispatcher.dispatch_run``; a run
    lies within one file, and a batch of the in-process path may just cross into the next one), so a
    kill in the middle of a run can leave one queue's unit for a later record written and another
    queue's unit for an earlier record not. Starting after the latest unit of any queue would skip
    that record for good: its queue would lack it and give its queue offset to the next message.
    Every run before the interrupted one had finished, so nothing before this start is missing;
    what lies between is dispatched again, which the dispatcher skips (idempotent)."""
    file_of_last = (last_end - 1) // seg_size
    return max(min_offset, (file_of_last - 1) * seg_size)


def redispatch(report: RecoveryReport, dispatcher: Dispatcher, store_dir: str | os.PathLike,
               settings: StoreSettings) -> int:
    """Dispatch every record from ``report.dispatch_from`` (see :func:`repair`), then log the report."""
    if report.dispatch_from < report.commitlog_end:
        commitlog = CommitLog.open(store_dir, settings.segment_bytes)
        report.redispatched = dispatcher.catch_up(report.dispatch_from, report.commitlog_end, commitlog)
    level = logging.WARNING if report.abnormal or report.changed_anything else logging.INFO
    log.log(level, "store %s: %s", store_dir, report.summary())
    return report.redispatched
