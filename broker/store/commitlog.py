"""CommitLog segment files: listing, reading (segment, range, from an offset, one record), appending.

Segments are pre-sized files named by the 20-digit physical offset of their first byte; a record
never spans two files and a full file ends with a BLANK record (store-format.md 3.1, 3.2).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from broker.store import findings as fk
from broker.store.constants import (
    BLANK_HEADER_SIZE,
    COMMITLOG_DIR,
    DEFAULT_MAPPED_FILE_SIZE_COMMITLOG,
    END_FILE_MIN_BLANK_LENGTH,
    FILE_NAME_DIGITS,
    PROPERTY_CRC32,
    is_queued,
)
from broker.store.dispatch_fields import STOP_BLANK, STOP_CHECK, STOP_LIMIT, STOP_PYTHON, RunFields, scan_run
from broker.store.findings import Finding
from broker.store.message import BlankRecord, MessageRecord, RecordError, decode_record
from broker.store.record_layout import (
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_ID,
    POS_QUEUE_OFFSET,
    POS_SYS_FLAG,
    store_timestamp_pos,
)
from broker.store.record_scan import is_record_start, scan_records

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# QUEUEOFFSET and PHYSICALOFFSET are adjacent in the record: one pack writes both
_QUEUE_AND_PHYSICAL_OFFSET = struct.Struct(">qq")
assert POS_PHYSICAL_OFFSET == POS_QUEUE_OFFSET + 8

log = logging.getLogger(__name__)


def offset_to_file_name(offset: int) -> str:
    """``UtilAll.offset2FileName``: the offset left-padded with zeros to 20 digits."""
    return str(offset).zfill(FILE_NAME_DIGITS)


@dataclass(frozen=True, slots=True)
class Segment:
    """One commitlog file: ``base`` is its physical start offset, ``size`` its length on disk."""

    path: Path
    base: int
    size: int

    @property
    def name(self) -> str:
        return self.path.name

    def open(self) -> mmap.mmap | bytes:
        """Read-only map of the file (empty files cannot be mapped: they read as b"")."""
        return b"" if self.size == 0 else _map_file(self.path)


def _map_file(path: Path) -> mmap.mmap | bytes:
    """Read-only map of a file at its current size (b"" when empty or gone)."""
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                return b""
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        return b""


def list_segments(commitlog_dir: str | os.PathLike, segment_size: int | None = None,
                  findings: list[Finding] | None = None) -> list[Segment]:
    """The segment files in offset order. Files that are not 20-digit names are reported and
    skipped; wrong lengths and gaps between files are reported (Apache refuses to load those)."""
    d = Path(commitlog_dir)
    out: list[Segment] = []
    if not d.is_dir():
        return out
    for p in sorted(d.iterdir()):
        if not p.is_file():
            continue
        if len(p.name) != FILE_NAME_DIGITS or not p.name.isdigit():
            if findings is not None:
                findings.append(Finding(str(p), 0, fk.BAD_FILE_NAME, "not a 20-digit commitlog file name; ignored"))
            continue
        out.append(Segment(p, int(p.name), p.stat().st_size))
    out.sort(key=lambda s: s.base)
    if findings is not None and out:
        expected = segment_size or infer_segment_size(out)
        for i, seg in enumerate(out):
            if seg.size != expected:
                findings.append(Finding(str(seg.path), 0, fk.WRONG_FILE_SIZE,
                                        f"file is {seg.size} bytes, segment size is {expected}"))
            if i and seg.base != out[i - 1].base + expected:
                findings.append(Finding(str(seg.path), 0, fk.FILE_GAP,
                                        f"starts at {seg.base}, previous file ends at {out[i - 1].base + expected}"))
    return out


def infer_segment_size(segments: list[Segment]) -> int:
    """The configured file size, read off the files: the distance between consecutive names,
    else the most common file length, else Apache's default."""
    if len(segments) >= 2:
        gaps = [b.base - a.base for a, b in zip(segments, segments[1:]) if b.base > a.base]
        if gaps:
            return min(gaps)
    sizes = [s.size for s in segments if s.size]
    if sizes:
        return max(set(sizes), key=sizes.count)
    return DEFAULT_MAPPED_FILE_SIZE_COMMITLOG


@dataclass(slots=True)
class CommitLog:
    """Read access to a store's commitlog (``<store>/commitlog``)."""

    directory: Path
    segment_size: int = 0
    findings: list[Finding] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    _maps: dict[int, mmap.mmap | bytes] = field(default_factory=dict, repr=False)  # by base, for follow()

    @classmethod
    def open(cls, store_dir: str | os.PathLike, segment_size: int | None = None) -> "CommitLog":
        d = Path(store_dir) / COMMITLOG_DIR
        found: list[Finding] = []
        segs = list_segments(d, segment_size, found)
        size = segment_size or (infer_segment_size(segs) if segs else DEFAULT_MAPPED_FILE_SIZE_COMMITLOG)
        return cls(d, size, found, segs)

    @property
    def min_offset(self) -> int:
        return self.segments[0].base if self.segments else 0

    def segment_for(self, offset: int) -> Segment | None:
        for seg in self.segments:
            if seg.base <= offset < seg.base + self.segment_size:
                return seg
        return None

    def read_record(self, offset: int) -> MessageRecord | BlankRecord:
        """The record at a physical offset; raises :class:`RecordError` naming file and offset."""
        seg = self.segment_for(offset)
        if seg is None:
            raise RecordError(fk.BAD_SIZE, offset, "no commitlog file holds this offset")
        with open(seg.path, "rb") as fh:
            fh.seek(offset - seg.base)
            head = fh.read(4)
            if len(head) < 4:
                raise RecordError(fk.TRUNCATED_RECORD, offset, f"past the end of {seg.path}")
            size = int.from_bytes(head, "big", signed=True)
            size = max(size, BLANK_HEADER_SIZE)
            data = head + fh.read(min(size, self.segment_size) - 4)
        try:
            return decode_record(data, 0, offset, limit=len(data))
        except RecordError as exc:
            raise RecordError(exc.kind, offset, f"{seg.path}: {exc.detail}") from None

    def iter_records(self, from_offset: int = 0, to_offset: int | None = None,
                     findings: list[Finding] | None = None) -> Iterator[MessageRecord]:
        """Message records (BLANKs skipped) whose start lies in ``[from_offset, to_offset)``, one
        object each. Corrupt regions are skipped and reported to ``findings``."""
        for seg in self.segments:
            seg_end = seg.base + self.segment_size
            if seg_end <= from_offset or (to_offset is not None and seg.base >= to_offset):
                continue
            buf = seg.open()
            try:
                start = max(0, from_offset - seg.base)
                end = None if to_offset is None else max(0, min(self.segment_size, to_offset - seg.base))
                scan = scan_records(buf, seg.base, self.segment_size, start, end, str(seg.path))
                if findings is not None:
                    findings.extend(scan.findings)
                for pos in scan.starts.tolist():
                    try:
                        rec = decode_record(buf, pos, seg.base + pos)
                    except RecordError as exc:
                        if findings is not None:
                            findings.append(Finding(str(seg.path), pos, exc.kind, exc.detail,
                                                    physical_offset=seg.base + pos))
                        continue
                    if isinstance(rec, MessageRecord):
                        yield rec
            finally:
                if isinstance(buf, mmap.mmap):
                    buf.close()

    def follow(self, from_offset: int, to_offset: int) -> Iterator[MessageRecord]:
        """Message records from ``from_offset`` — a record boundary — to ``to_offset``, for a
        follower of the live log (the dispatcher, batch after small batch).

        Why not :meth:`iter_records`: that one maps the file, searches for the first record and
        walks with numpy on every call, which costs a few hundred microseconds — per message when
        the broker is lightly loaded. Here the segment stays mapped (until :meth:`close`) and the
        records are read one after the other, each checked as it is decoded; a record that fails
        its check hands the rest of the range to :meth:`iter_records`, which finds where records
        resume (its findings are not collected here either)."""
        pos = from_offset
        while pos < to_offset:
            seg = self.segment_for(pos)
            if seg is None:
                return
            buf = self._mapped(seg)
            try:
                rec = decode_record(buf, pos - seg.base, pos)
            except RecordError as exc:  # never expected on a log this process's peers write: say so
                log.warning("%s: record at commitlog offset %d (file offset %d) fails its check (%s); "
                            "following from the next record that passes", seg.path, pos, pos - seg.base, exc)
                yield from self.iter_records(pos, to_offset)
                return
            if isinstance(rec, BlankRecord):  # the rest of this file is padding
                pos = seg.base + self.segment_size
                continue
            yield rec
            pos += rec.total_size

    def _mapped(self, seg: Segment) -> mmap.mmap | bytes:
        """The follower's map of a segment, kept while it is complete (see :meth:`follow`)."""
        buf = self._maps.get(seg.base)
        if buf is None:
            for base in [b for b in self._maps if b < seg.base]:  # passed for good (and maybe deleted:
                old = self._maps.pop(base)                         # a map would keep its disk space)
                if isinstance(old, mmap.mmap):
                    old.close()
            # mapped at the size the file has now, not the listing's: a file listed in the instant
            # between its creation and its pre-sizing would read as empty, and its records be lost
            buf = _map_file(seg.path)
            if len(buf) >= self.segment_size:  # complete: keep it; a short one is mapped again next time
                self._maps[seg.base] = buf
        return buf

    def follow_runs(self, from_offset: int, to_offset: int | None = None, *, check_crc: bool = False,
                    batch: int = 1024) -> Iterator[tuple[RunFields, mmap.mmap | bytes] | list[MessageRecord]]:
        """The records of :meth:`follow` (``to_offset`` given) or :meth:`iter_records` (None: to the
        end of data), as runs of contiguous records whose dispatch fields the compiled walk read
        (:func:`~broker.store.dispatch_fields.scan_run`; with the file they lie in, for their
        topics), and, where the walk stops at a record it cannot do, lists of decoded records.

        A record the walk cannot dispatch bit-identically (non-ASCII keys, the delay topic) comes
        alone, decoded; at a record that fails a check the rest of the range is handed to the
        per-record reader that the caller used before (same warning, same resumption), in lists of
        up to ``batch``."""
        pos = from_offset
        while to_offset is None or pos < to_offset:
            seg = self.segment_for(pos)
            if seg is None:
                return
            buf = self._mapped(seg)
            file_pos = pos - seg.base
            limit = self.segment_size if to_offset is None else min(self.segment_size, to_offset - seg.base)
            if len(buf) <= file_pos:
                fields = None
            else:
                fields = scan_run(np.frombuffer(buf, np.uint8), seg.base, file_pos, limit, check_crc=check_crc)
            if fields is not None and fields.n:
                yield fields, buf
            if fields is None or fields.stop == STOP_CHECK:
                pos = seg.base + (fields.stop_pos if fields is not None else file_pos)
                rest = self.iter_records(pos) if to_offset is None else self.follow(pos, to_offset)
                pending: list[MessageRecord] = []
                for rec in rest:
                    pending.append(rec)
                    if len(pending) >= batch:
                        yield pending
                        pending = []
                if pending:
                    yield pending
                return
            pos = seg.base + fields.stop_pos
            if fields.stop == STOP_BLANK:
                pos = seg.base + self.segment_size
            elif fields.stop == STOP_PYTHON:
                rec = decode_record(buf, fields.stop_pos, pos)
                assert isinstance(rec, MessageRecord)
                yield [rec]
                pos += rec.total_size
            elif fields.stop == STOP_LIMIT:
                return

    def close(self) -> None:
        """Unmap the files :meth:`follow` kept mapped."""
        maps, self._maps = self._maps, {}
        for buf in maps.values():
            if isinstance(buf, mmap.mmap):
                buf.close()

    def data_end(self, known_end: int | None = None) -> int:
        """Physical offset just past the last record of the last non-empty segment.

        ``known_end``: an offset already known to end a complete record (e.g. how far the consume
        queues reach). When it lies in the last segment and a record or the segment's end-of-data
        starts there, only the tail after it is walked instead of the whole segment — a 1 GiB
        segment walk costs seconds of Python per call."""
        for seg in reversed(self.segments):
            buf = seg.open()
            try:
                start = 0
                if known_end is not None and seg.base < known_end < seg.base + self.segment_size:
                    pos = known_end - seg.base
                    if pos <= len(buf) and (pos == len(buf) or is_record_start(buf, pos, seg.base, self.segment_size)
                                            or not any(buf[pos:pos + 8])):
                        start = pos
                scan = scan_records(buf, seg.base, self.segment_size, start, None, str(seg.path), search_first=False)
                if scan.blank_at is not None:
                    return seg.base + self.segment_size
                if scan.starts.size:
                    return seg.base + int(scan.starts[-1] + scan.sizes[-1])
                if start:
                    return known_end
            finally:
                if isinstance(buf, mmap.mmap):
                    buf.close()
        return self.segments[0].base if self.segments else 0


@dataclass(frozen=True, slots=True)
class AppendResult:
    physical_offset: int
    size: int
    queue_offset: int
    store_timestamp: int
    record: MessageRecord


@dataclass(frozen=True, slots=True)
class EncodedAppend:
    """Where :meth:`CommitLogWriter.append_encoded` put a record, and its bytes as written."""

    physical_offset: int
    size: int
    queue_offset: int
    data: bytearray | None  # None when the caller asked for no copy (keep_bytes=False)


class CommitLogWriter:
    """Appends records like Apache's ``DefaultAppendMessageCallback``.

    Fills in PHYSICALOFFSET, QUEUEOFFSET (per topic-queue counters; PREPARED/ROLLBACK get 0 and do
    not advance them) and STORETIMESTAMP, rolls to a new pre-sized file with a BLANK when a record
    plus 8 bytes does not fit, and writes a batch all-or-nothing per file. Writes are buffered and
    reach the file on :meth:`flush` (``fsync=True`` also syncs to disk).
    """

    def __init__(self, store_dir: str | os.PathLike, segment_size: int = DEFAULT_MAPPED_FILE_SIZE_COMMITLOG,
                 queue_offsets: dict[tuple[str, int], int] | None = None, buffer_bytes: int = 4 << 20) -> None:
        if segment_size < 4096:
            raise ValueError("segment size must be at least 4096 bytes")
        self.directory = Path(store_dir) / COMMITLOG_DIR
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_size = segment_size
        self.queue_offsets: dict[tuple[str, int], int] = dict(queue_offsets or {})
        self._buffer_bytes = buffer_bytes
        self._pending = bytearray()
        self._pending_pos = 0
        self._fd: int | None = None
        self._base = 0
        self._pos = 0
        self._open_tail()

    # ---- files -------------------------------------------------------------------------------------
    def _open_tail(self) -> None:
        log_ = CommitLog.open(self.directory.parent, self.segment_size)
        if not log_.segments:
            self._new_file(0)
            return
        end = log_.data_end()
        last = log_.segments[-1]
        if end >= last.base + self.segment_size:
            self._new_file(last.base + self.segment_size)
        else:
            self._fd = os.open(last.path, os.O_RDWR)
            if os.fstat(self._fd).st_size < self.segment_size:
                os.ftruncate(self._fd, self.segment_size)
            self._base, self._pos = last.base, end - last.base
            self._pending_pos = self._pos

    def _new_file(self, base: int) -> None:
        self._close_file()
        path = self.directory / offset_to_file_name(base)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(self._fd, self.segment_size)  # pre-sized and zero-filled, like a mapped file
        self._base, self._pos, self._pending_pos = base, 0, 0

    def _close_file(self, fsync: bool = False) -> None:
        if self._fd is not None:
            self._write_pending(fsync)
            os.close(self._fd)
            self._fd = None

    def _write_pending(self, fsync: bool = False) -> None:
        if self._pending:
            os.pwrite(self._fd, self._pending, self._pending_pos)
            self._pending_pos += len(self._pending)
            self._pending.clear()
        if fsync:
            os.fsync(self._fd)

    # ---- appending -------------------------------------------------------------------------------
    @property
    def write_offset(self) -> int:
        """Physical offset the next record will get (if it fits the current file)."""
        return self._base + self._pos

    def _roll(self) -> None:
        remaining = self.segment_size - self._pos
        self._pending += BlankRecord(self.write_offset, remaining).encode()
        self._pos = self.segment_size
        self._new_file(self._base + self.segment_size)

    def _place(self, rec: MessageRecord, store_timestamp: int) -> MessageRecord:
        key = (rec.topic, rec.queue_id)
        if not is_queued(rec.sys_flag):
            queue_offset = 0
        else:
            queue_offset = self.queue_offsets.get(key, 0)
            self.queue_offsets[key] = queue_offset + 1
        placed = rec.with_position(self.write_offset, queue_offset, store_timestamp)
        if PROPERTY_CRC32 in rec.properties_raw and PROPERTY_CRC32 in placed.properties:
            # 5.2+ property CRC covers the fields filled in just now: recompute it (store-format 3.6)
            placed = placed.with_property_crc()
        return placed

    def append(self, rec: MessageRecord, store_timestamp: int | None = None) -> AppendResult:
        return self.append_batch([rec], store_timestamp)[0]

    def append_batch(self, records: Iterable[MessageRecord], store_timestamp: int | None = None) -> list[AppendResult]:
        """Append records that must land in one file (a 4.x batch); all share one store timestamp."""
        records = list(records)
        ts = int(time.time() * 1000) if store_timestamp is None else store_timestamp
        sizes = [r.total_size for r in records]
        total = sum(sizes)
        if total + END_FILE_MIN_BLANK_LENGTH > self.segment_size:
            raise ValueError(f"{total} bytes of records cannot fit a {self.segment_size}-byte commitlog file")
        if total + END_FILE_MIN_BLANK_LENGTH > self.segment_size - self._pos:
            self._roll()
        saved = dict(self.queue_offsets)
        out: list[AppendResult] = []
        encoded = []
        try:
            for rec in records:
                placed = self._place(rec, ts)
                data = placed.encode()
                encoded.append(data)
                out.append(AppendResult(placed.physical_offset, len(data), placed.queue_offset, ts, placed))
                self._pos += len(data)
        except Exception:
            self.queue_offsets = saved
            self._pos -= sum(len(d) for d in encoded)
            raise
        self._pending += b"".join(encoded)
        if len(self._pending) >= self._buffer_bytes:
            self._write_pending()
        return out

    def append_encoded(self, data: bytes, topic: str, queue_id: int, store_timestamp: int,
                       keep_bytes: bool = True) -> EncodedAppend:
        """Append one record encoded elsewhere (a network process builds a plain send's record):
        only the fields the store owns are written into it here — QUEUEID (the queue the store
        chose), QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP — at the positions the record layout
        gives, so the bytes are exactly what :meth:`append_batch` would have written for the same
        record. The record must not carry a 5.2+ property CRC (that covers these fields).
        ``keep_bytes=False``: the result's ``data`` is None (a caller whose dispatch reads the file
        back needs no copy of the record; the fields are then written straight into the buffer)."""
        size = len(data)
        if size + END_FILE_MIN_BLANK_LENGTH > self.segment_size:
            raise ValueError(f"{size} bytes of records cannot fit a {self.segment_size}-byte commitlog file")
        if size + END_FILE_MIN_BLANK_LENGTH > self.segment_size - self._pos:
            self._roll()
        pending = self._pending
        at = len(pending)
        pending += data
        try:
            _I32.pack_into(pending, at + POS_QUEUE_ID, queue_id)
            (sys_flag,) = _I32.unpack_from(pending, at + POS_SYS_FLAG)
            _I64.pack_into(pending, at + store_timestamp_pos(sys_flag), store_timestamp)
        except Exception:  # a field out of range: nothing appended
            del pending[at:]
            raise
        if is_queued(sys_flag):
            key = (topic, queue_id)
            queue_offset = self.queue_offsets.get(key, 0)
            self.queue_offsets[key] = queue_offset + 1
        else:
            queue_offset = 0
        physical_offset = self._base + self._pos
        _QUEUE_AND_PHYSICAL_OFFSET.pack_into(pending, at + POS_QUEUE_OFFSET, queue_offset, physical_offset)
        record = pending[at:] if keep_bytes else None
        self._pos += size
        if len(pending) >= self._buffer_bytes:
            self._write_pending()
        return EncodedAppend(physical_offset, size, queue_offset, record)

    def append_raw(self, offset: int, data: bytes) -> None:
        """A slave's append of bytes its master wrote (records, BLANK, padding), byte for byte at
        ``offset``, which must be this log's end; the bytes must fit the file ``offset`` is in. At a
        file's end the next file is created, as the master did."""
        if offset != self.write_offset:
            raise ValueError(f"raw append at {offset}, the log ends at {self.write_offset}")
        if self._pos == self.segment_size:
            self._new_file(self._base + self.segment_size)
        if len(data) > self.segment_size - self._pos:
            raise ValueError(f"{len(data)} bytes at {offset} run past the end of the commitlog file at {self._base}")
        self._pending += data
        self._pos += len(data)
        if len(self._pending) >= self._buffer_bytes:
            self._write_pending()

    def restart_empty_at(self, base: int) -> None:
        """An empty log (nothing written) starts over at file ``base`` instead: its empty files go."""
        if self.write_offset != self._base or self._pos or self._pending:
            raise ValueError("only an empty commitlog can start at another offset")
        old = self._base
        self._close_file()
        (self.directory / offset_to_file_name(old)).unlink(missing_ok=True)
        self._new_file(base)

    def flush(self, fsync: bool = False) -> None:
        if self._fd is not None:
            self._write_pending(fsync)

    def close(self) -> None:
        self._close_file(fsync=True)

    def __enter__(self) -> "CommitLogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


