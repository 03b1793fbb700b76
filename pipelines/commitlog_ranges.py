"""Commitlog segments read by byte range: one bounded buffer per range, with the records (and, for
a walk, the findings) a whole-segment read gives.

Why: a Spark task that decodes ``[start, end)`` of a 1 GiB segment must not map or download the
whole file (memory must stay flat in the store size, and a remote segment must not be fetched
whole). A task reads ``[start, end + MAX_RECORD_BYTES)`` with ranged reads (a local file's range is
mapped when the page cache holds it and read with direct I/O when not, :mod:`pipelines.local_reads`;
``readinto`` through ``pyarrow.fs`` for a URI: one ranged GET) and decodes it in place.

How: the bytes from ``lo`` on are read into an anonymous map (:class:`RangeBuffer`) and the decoder
is told that the segment starts at ``base + lo`` and is ``segment_size - lo`` long. Every rule of the
walk (a record's PHYSICALOFFSET equals its position, a BLANK reaches the end of the segment, a size
fits what is left) holds unchanged under that shift, so :func:`broker.store.columnar.iter_decode`
and :func:`broker.store.record_scan.scan_records` run as they are; only the positions they report
are relative to ``lo`` and are shifted back here (:func:`_unshift`). The maps are reused from range
to range in a process (faulting in fresh pages for every range costs as much as a third of the
decode), so a Python worker holds about one range's worth of memory.

Where a read could end too early:

* :func:`decode_range` (records): the buffer ends where the read ends. A record longer than
  ``MAX_RECORD_BYTES`` (a broker configured with a larger ``maxMessageSize``) fails the decoder's
  size check there and ends the walk as a torn tail after the rows before it; a valid record header
  at that point makes the range go on from that record with a longer read. Damage or zeros near the
  end of the read cannot change the records: a record starting in the range lies in the bytes read.
* :func:`walk_range` (findings, the end of the log): the buffer is as long as the rest of the file,
  the unread part reading as zeros, so texts and classifications that depend on what is left of
  the file are the file's. A walk that took a record running past the bytes read reads on and
  walks again; a walk whose last steps looked past them (a search or a zero check to the end of
  the file) checks that the unread rest is zeros (a streaming read) and otherwise reads it and walks
  again. :func:`commitlog_end` skips that check: a run of zeros after the last record is the end of
  the log (as the broker's own recovery treats it), and reading on would fetch the rest of the
  segment on every run.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import re
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa

from broker.store.columnar import DecodeFilter, DecodeStats, iter_decode
from broker.store.constants import COMMITLOG_DIR, DEFAULT_MAX_MESSAGE_SIZE, MAX_RECORD_OVERHEAD
from broker.store.record_layout import POS_PHYSICAL_OFFSET, SIZE_MAGIC
from broker.store import findings as fk
from broker.store.findings import Finding
from broker.store.record_scan import ScanResult, is_record_start, scan_records
from pipelines import local_reads, worker_memory
from pipelines.process_thread import ProcessThread
from pipelines.storage import Location
from pipelines.walk_pieces import WalkPiece
from pipelines.store_files import StoreFiles

log = logging.getLogger(__name__)

# The longest record a broker with the default maxMessageSize writes (body limit plus header, topic
# and properties): a range reads this much past its end so that its last record is complete.
MAX_RECORD_BYTES = DEFAULT_MAX_MESSAGE_SIZE + MAX_RECORD_OVERHEAD
# A findings walk reads a segment in windows of this size. The walk touches one line per record of
# what was just read, and finds it still cached when the window is small: 4 GiB walked in 1.1-1.2
# CPU-s with 16 MiB windows against 1.4-1.6 with 64 MiB (the walk itself 0.21 against 0.45 s).
WALK_WINDOW_BYTES = 16 * 1024 * 1024
END_WINDOW_BYTES = 1024 * 1024  # commitlog_end starts with this window (most runs end inside it)
_HEADER_PROBE = POS_PHYSICAL_OFFSET + 8  # bytes a record-start check reads
_ZERO_CHECK_BYTES = 8 * 1024 * 1024
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class SegmentFile:
    """One commitlog file behind a :class:`Location` (pickles into Spark tasks with its options)."""

    location: Location  # the file itself
    base: int  # physical offset of its first byte (its name)
    length: int  # bytes in the file, as listed
    segment_size: int  # the configured commitlog file size

    @property
    def name(self) -> str:
        return self.location.name

    @property
    def label(self) -> str:
        """How findings name the file: its URI, or its absolute local path."""
        return self.location.uri

    @property
    def data_len(self) -> int:
        """Bytes a reader may use: the file, but never more than one segment."""
        return min(self.length, self.segment_size)

    def window_end(self, end: int, over: int | None = None) -> int:
        """Where a read for records starting before ``end`` stops: ``over`` bytes later (default
        :data:`MAX_RECORD_BYTES`). A short file (shorter than the segment size, already damaged) is
        read to its end: where its data ends is ambiguous otherwise."""
        if self.length < self.segment_size:
            return self.data_len
        return min(self.data_len, end + (MAX_RECORD_BYTES if over is None else over))


def segment_files(store: StoreFiles, segment_size: int | None = None) -> tuple[list[SegmentFile], int]:
    """The store's commitlog segments in offset order, and the segment size (inferred unless given).
    Raises :class:`pipelines.storage.StorageError` when the store lists no segment."""
    segs = store.commitlog_segments()
    size = store.segment_size(segment_size)
    return [SegmentFile(store.file(COMMITLOG_DIR, s.name), s.base, s.size, size) for s in segs], size


def _read_into(location: Location, view: memoryview, offset: int, cached: bool | None = None) -> int:
    """Fill ``view`` with the file's bytes from ``offset`` (ranged reads); returns bytes read
    (fewer at the end of the file). ``cached``: see :func:`local_reads.read_into`."""
    if location.is_local:  # direct I/O where the range is not cached (pipelines.local_reads)
        return local_reads.read_into(location.uri, view, offset, cached)
    done, n = 0, len(view)
    fs, path = location.filesystem()
    with fs.open_input_file(path) as fh:
        fh.seek(offset)
        while done < n:
            got = fh.readinto(view[done:])
            if got <= 0:
                break
            done += got
    return done


class _Map:
    """A reusable anonymous map and how far it may hold bytes of an earlier use."""

    def __init__(self, length: int) -> None:
        # private: grows with zero pages on resize, and MADV_DONTNEED really frees (a shared
        # anonymous map is a fixed-size shmem file)
        self.mm = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.dirty = 0


_POOL: list[_Map] = []
_POOL_LOCK = threading.Lock()
# three maps: the piece being decoded, the next one being read, and the one before, which the
# consumer's last batch (its bodies point into it) may still hold while the next read starts
_POOL_SIZE = 3
# A pooled map keeps its pages between uses and only grows: each use sees the first ``length``
# bytes of it. Why: a page the kernel hands out again costs a fault and zeroing, ~1 s per GiB on
# this project's benchmark VM; shrinking a map to each piece's size and growing it back faulted
# ~40,000 pages per 256 MiB split. A map larger than this (a walk to a segment's end) is not kept.
_POOL_KEEP_BYTES = 256 * 1024 * 1024


def _acquire(length: int) -> _Map:
    """A map of at least ``length`` bytes, reusing a pooled one that no Arrow array points into
    any more (its already-faulted pages are what makes reuse cheap)."""
    with _POOL_LOCK:
        for i, m in enumerate(_POOL):
            try:  # refused while buffers are exported (zero-copy bodies alive); grows if needed
                m.mm.resize(max(len(m.mm), length))
            except BufferError:
                continue
            del _POOL[i]
            return m
    return _Map(length)


@worker_memory.keeps
def release_pool() -> int:
    """Unmap the pooled maps (a map Arrow still points into is unmapped by the GC after it); the
    bytes they spanned. For a worker done with splits (:mod:`pipelines.worker_memory`)."""
    with _POOL_LOCK:
        maps = list(_POOL)
        _POOL.clear()
    freed = sum(len(m.mm) for m in maps)
    for m in maps:
        try:
            m.mm.close()
        except BufferError:
            pass
    return freed


def _release(m: _Map) -> None:
    if len(m.mm) <= _POOL_KEEP_BYTES:
        with _POOL_LOCK:
            if len(_POOL) < _POOL_SIZE:
                _POOL.append(m)
                return
    try:
        m.mm.close()
    except BufferError:  # Arrow arrays still point into it; the GC unmaps it after them
        pass


class RangeBuffer:
    """The file's bytes from ``lo`` on, as far as read so far (``buf[i]`` is file byte ``lo + i``).

    ``len(buf)`` is the rest of the file (at most one segment; the unread part reads as zeros) or,
    with ``to_file_end=False``, exactly ``[lo, hi)``. For a local file ``lo`` moves down to a page
    boundary (callers use :attr:`lo`, not the position they asked for), and reads of a range the
    page cache does not hold use direct I/O (:mod:`pipelines.local_reads`: filling the page cache
    costs more than a copy). In the second form a cached local range is mapped instead of copied
    (the copy would cost a tenth of the decode)."""

    def __init__(self, seg: SegmentFile, lo: int, hi: int, *, to_file_end: bool = True) -> None:
        self.seg = seg
        self._map: _Map | None = None
        self._file_map: mmap.mmap | None = None
        cached = None  # asked once here for a bounded local range, and told to the read below
        if seg.location.is_local:  # page-aligned: a map's offset, and direct I/O into the pooled map
            lo = lo // _PAGE * _PAGE
            if not to_file_end:
                cached = local_reads.range_cached(seg.location.uri, lo, min(hi, seg.data_len) - lo)
        if cached:
            self.lo = lo
            length = min(hi, seg.data_len) - self.lo
            if length > 0:
                with open(seg.location.uri, "rb") as fh:
                    self._file_map = mmap.mmap(fh.fileno(), length, access=mmap.ACCESS_READ, offset=self.lo)
            self.buf = self._file_map if self._file_map is not None else b""
            self.read_end = self.lo + max(length, 0)
            return
        self.lo = lo
        length = (seg.data_len if to_file_end else min(hi, seg.data_len)) - lo
        self._map = _acquire(length) if length > 0 else None
        self.buf = memoryview(self._map.mm)[:length] if self._map is not None else b""
        self.read_end = lo  # file position up to which buf holds the file's bytes
        self.fill(hi, cached)

    @property
    def base(self) -> int:
        """Physical offset of ``buf[0]`` (what the decoder is told the segment starts at)."""
        return self.seg.base + self.lo

    @property
    def size(self) -> int:
        """Segment size as seen from ``buf[0]``."""
        return self.seg.segment_size - self.lo

    def fill(self, hi: int, cached: bool | None = None) -> None:
        """Read the file up to ``hi`` (from where the buffer stops holding it); what an earlier
        use of the map left past that is cleared. ``cached``: see :func:`local_reads.read_into`."""
        if self._map is None:
            return
        hi = min(hi, self.lo + len(self.buf))
        if hi > self.read_end:
            a, b = self.read_end - self.lo, hi - self.lo
            with memoryview(self.buf) as view:
                got = _read_into(self.seg.location, view[a:b], self.read_end, cached)
                if got < b - a:  # the file shrank under us: what is missing reads as zeros
                    view[a + got:b] = bytes(b - a - got)
            self.read_end = hi
        m, b, n = self._map, self.read_end - self.lo, len(self.buf)
        if m.dirty > b:  # clear what an earlier use left in this view past the bytes read
            clear_to = min(m.dirty, n)
            page = min(-(-b // _PAGE) * _PAGE, clear_to)
            self.buf[b:page] = bytes(page - b)
            if clear_to > page:
                m.mm.madvise(mmap.MADV_DONTNEED, page, clear_to - page)
        if m.dirty <= n:  # else the map past this view still holds an earlier use's bytes
            m.dirty = b

    def rest_is_zero(self) -> bool:
        """Whether the file is all zeros from :attr:`read_end` to its data end (read in pieces, not kept)."""
        scratch = bytearray(_ZERO_CHECK_BYTES)
        pos = self.read_end
        with memoryview(scratch) as view:
            while pos < self.seg.data_len:
                n = min(len(scratch), self.seg.data_len - pos)
                got = _read_into(self.seg.location, view[:n], pos)
                if np.frombuffer(scratch, np.uint8, got).any():
                    return False
                if got < n:
                    break
                pos += n
        return True

    def close(self) -> None:
        if self._map is not None:
            m, view, self._map, self.buf = self._map, self.buf, None, b""
            try:
                view.release()
            except BufferError:  # Arrow arrays still point into it: the pool skips the map until they are gone
                pass
            _release(m)
        if self._file_map is not None:
            fm, self._file_map, self.buf = self._file_map, None, b""
            try:
                fm.close()
            except BufferError:  # Arrow arrays (zero-copy bodies) still point into it; the GC unmaps it
                pass

    def __enter__(self) -> "RangeBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_RESYNC = re.compile(r"(resynchronised at position )(\d+)")


def _unshift(f: Finding, lo: int) -> Finding:
    """A finding of a walk over a buffer that starts at segment position ``lo``, in segment
    positions (the offset, and the position a resynchronisation names in the detail)."""
    if not lo:
        return f
    detail = _RESYNC.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + lo}", f.detail)
    return dataclasses.replace(f, offset=f.offset + lo, detail=detail)


# ---- decoding a range ----------------------------------------------------------------------------------

def _merge(into: DecodeStats, part: DecodeStats, lo: int, below: int | None = None) -> None:
    """Add a decode over a buffer starting at ``lo`` to ``into`` (positions back to segment ones);
    ``below``: keep only findings before that segment position (the rest is walked again)."""
    into.findings.extend(g for g in (_unshift(f, lo) for f in part.findings) if below is None or g.offset < below)
    into.records += part.records
    into.rows += part.rows
    into.bytes_decoded += part.bytes_decoded
    into.stop, into.end_of_data = part.stop + lo, part.end_of_data
    into.blank_at = None if part.blank_at is None else part.blank_at + lo
    if into.first_at is None and part.first_at is not None:
        into.first_at = part.first_at + lo


def _torn_at(part: DecodeStats) -> int | None:
    """Buffer position of the walk's torn tail (where it found no record it could take), if any."""
    return next((f.offset for f in part.findings if f.kind == fk.TORN_TAIL), None)


def decode_range(seg: SegmentFile, start: int, end: int, *, search_first: bool | None = None,
                 flt: DecodeFilter | None = None, verify_crc: bool = True, stats: DecodeStats | None = None,
                 body_view: bool = False, buffer: "Future[RangeBuffer] | None" = None) -> Iterator[pa.RecordBatch]:
    """RECORD_SCHEMA batches of the records that start in ``[start, end)`` of the segment: the
    records :func:`iter_decode` gives over the whole file, from one buffer of
    ``[start, end + MAX_RECORD_BYTES)``. With ``body_view`` the bodies point into that buffer (kept
    alive by the batches).

    The buffer ends where the read ends, so a record that runs past it fails the decoder's size
    check and ends the walk as a torn tail, after the rows before it were handed out; when a valid
    record header stands there, the range goes on from that record with a read long enough for it.
    (``stats`` findings describe what was left of the read, not of the file: the findings reader,
    :func:`walk_range`, gives the file's.) ``buffer``: the first read, already under way
    (:func:`decode_pieces`), of exactly ``RangeBuffer(seg, start, seg.window_end(end), to_file_end=False)``."""
    stats = stats if stats is not None else DecodeStats()
    if search_first is None:
        search_first = start != 0
    resume, first, read_to = start, search_first, seg.window_end(end)
    while True:
        rb = buffer.result() if buffer is not None else RangeBuffer(seg, resume, read_to, to_file_end=False)
        buffer = None
        lo = rb.lo
        try:
            part = DecodeStats()
            yield from iter_decode(rb.buf, rb.base, rb.size, resume - lo, max(resume, end) - lo, file_name=seg.label,
                                   flt=flt, verify_crc=verify_crc, stats=part, search_first=first, body_view=body_view)
            torn = _torn_at(part)
            longer = None
            if torn is not None and rb.read_end < seg.data_len and lo + torn < end:
                head = bytes(rb.buf[torn:torn + _HEADER_PROBE])
                if is_record_start(head, 0, rb.base + torn, rb.size - torn):
                    size = SIZE_MAGIC.unpack_from(head)[0]
                    if lo + torn + size > rb.read_end:
                        longer = lo + torn + size
        finally:
            rb.close()
        if longer is None:
            _merge(stats, part, lo)
            return
        log.info("%s: the record at %d runs to %d, past the %d bytes read; reading on",
                 seg.label, lo + torn, longer, rb.read_end)
        _merge(stats, part, lo, below=lo + torn)
        resume, first, read_to = lo + torn, False, seg.window_end(max(end, longer))


# ---- decoding a range in pieces, each read while the one before is decoded ---------------------------

# A split is decoded in pieces of this size. Why: a task otherwise waits for its whole range to be
# read before it decodes a byte (on a cold store, ~0.15-0.25 s per 256 MiB split with two tasks
# reading, 21-25 s of idle cores on the 16 GiB benchmark store); with pieces it waits for the first
# one only, and each later piece is read on a background thread while the one before is decoded and
# written. The rows are the same: a piece starts where the self-identifying rule finds its first
# record, exactly as a split does.
PIECE_BYTES = 64 * 1024 * 1024
# The first pieces are smaller (this size, then four times the one before, up to PIECE_BYTES): the
# first read is the one a task waits for, and each later piece is read while the smaller one
# before it is decoded.
FIRST_PIECE_BYTES = 4 * 1024 * 1024

_reads = ProcessThread("rocketlake-range-read")  # this process's background reads of the next piece


def piece_bounds(start: int, end: int, piece_bytes: int = PIECE_BYTES,
                 first_bytes: int = FIRST_PIECE_BYTES) -> list[tuple[int, int]]:
    """``[start, end)`` cut into pieces: the first of ``first_bytes``, each next one four times the
    one before, up to ``piece_bytes`` (one empty piece for an empty range)."""
    if end <= start:
        return [(start, end)]
    pieces, at, size = [], start, max(1, min(first_bytes, piece_bytes))
    while at < end:
        pieces.append((at, min(end, at + size)))
        at, size = pieces[-1][1], min(max(1, piece_bytes), size * 4)
    return pieces


def decode_pieces(seg: SegmentFile, start: int, end: int, *, search_first: bool | None = None,
                  piece_bytes: int = PIECE_BYTES, first_bytes: int = FIRST_PIECE_BYTES,
                  stats: DecodeStats | None = None, walked: list[WalkPiece] | None = None,
                  **decode) -> Iterator[pa.RecordBatch]:
    """:func:`decode_range` of ``[start, end)`` in the pieces of :func:`piece_bounds`, the next piece's buffer
    read in the background while a piece is decoded (see :data:`PIECE_BYTES`); ``walked`` gets each
    decoded piece's :class:`~pipelines.walk_pieces.WalkPiece`; ``decode``: :func:`decode_range`'s
    other keywords."""
    pieces = piece_bounds(start, end, piece_bytes, first_bytes)
    first = (start != 0) if search_first is None else search_first
    stats = stats if stats is not None else DecodeStats()
    pending: Future[RangeBuffer] | None = None
    try:
        for n, (a, b) in enumerate(pieces):
            current, pending = pending, None
            if n + 1 < len(pieces):
                na, nb = pieces[n + 1]
                pending = _reads.submit(RangeBuffer, seg, na, seg.window_end(nb), to_file_end=False)
            piece = DecodeStats()
            yield from decode_range(seg, a, b, search_first=first if n == 0 else True, buffer=current,
                                    stats=piece, **decode)
            _merge(stats, piece, 0)
            if walked is not None:
                walked.append(WalkPiece.of(seg.base, a, b, piece))
    finally:
        if pending is not None:  # a consumer that stopped early: the read under way is let go
            pending.add_done_callback(_close_read)


def _close_read(read: "Future[RangeBuffer]") -> None:
    if read.exception() is None:
        read.result().close()


# ---- walking a range (findings, the end of the log) --------------------------------------------------------

@dataclass
class Walk:
    """What a walk over a range found (positions are segment positions)."""

    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    last_end: int | None = None  # just past the last record walked
    stop: int = 0
    end_of_data: bool = False
    blank_at: int | None = None


def _looked_past(scan: ScanResult, read_to: int) -> bool:
    """The walk's last steps depended on bytes past buffer position ``read_to`` (a search or zero
    check to the end of the file, or a resynchronisation target at the edge of what was read)."""
    if scan.end_of_data and scan.blank_at is None:
        return True
    return any(f.bytes_skipped and f.offset + f.bytes_skipped + _HEADER_PROBE > read_to for f in scan.findings)


def walk_range(seg: SegmentFile, start: int = 0, end: int | None = None, *, search_first: bool | None = None,
               window: int = WALK_WINDOW_BYTES, max_window: int | None = None, exact_tail: bool = True,
               over: int | None = None) -> Walk:
    """Walk the records that start in ``[start, end)`` (default: to the end of the file) as
    :func:`scan_records` would over the whole file, in windows of ``window`` bytes (doubling up to
    ``max_window``), each read once. ``exact_tail=False`` takes zeros past what was read as the end
    of the data without reading on (see the module docstring)."""
    data_len = seg.data_len
    end = data_len if end is None else min(end, data_len)
    if search_first is None:
        search_first = start != 0
    max_window = max_window or window
    walk = Walk(stop=start)
    pos, first = start, search_first
    while True:
        w_end = max(pos, min(end, pos + window))
        with RangeBuffer(seg, pos, seg.window_end(w_end, over)) as rb:
            lo = rb.lo  # at or below pos: buffer positions are file positions - lo
            while True:
                scan = scan_records(rb.buf, rb.base, rb.size, pos - lo, w_end - lo, seg.label, first)
                read_to = rb.read_end - lo
                if scan.stop > read_to and not scan.end_of_data:  # a record runs past what was read
                    rb.fill(lo + scan.stop)
                    continue
                if exact_tail and rb.read_end < data_len and _looked_past(scan, read_to) and not rb.rest_is_zero():
                    rb.fill(data_len)
                    continue
                break
        walk.findings += [_unshift(f, lo) for f in scan.findings]
        walk.records += int(scan.starts.size)
        if scan.starts.size:
            walk.last_end = lo + int(scan.starts[-1] + scan.sizes[-1])
        walk.stop, walk.end_of_data = lo + scan.stop, scan.end_of_data
        walk.blank_at = None if scan.blank_at is None else lo + scan.blank_at
        if scan.end_of_data or walk.stop >= end:
            return walk
        # a first-record search that found nothing in this window goes on searching in the next
        first = bool(first and not scan.starts.size and not scan.findings)
        pos = walk.stop
        window = min(window * 2, max_window)


def _continues_at(seg: SegmentFile, pos: int) -> bool:
    """A record or the zeros after the last one start at ``pos`` (CommitLog.data_end's test)."""
    if pos == seg.data_len:
        return True
    head = seg.location.read_range(pos, _HEADER_PROBE)
    return is_record_start(head, 0, seg.base + pos, seg.segment_size - pos) or not any(head[:8])


def commitlog_end(segments: list[SegmentFile], known_end: int | None = None) -> int:
    """Physical offset just past the last complete record (a torn or in-progress tail is left
    out), as :meth:`broker.store.commitlog.CommitLog.data_end` answers it, read by range.

    ``known_end`` (how far the consume queues reach: the end of a complete record) lets the walk
    start there, so a run reads from the dispatcher's position to the end of the data (windows of
    1 MiB, doubling), not the segment."""
    for seg in reversed(segments):
        start = 0
        if known_end is not None and seg.base < known_end < seg.base + seg.segment_size:
            pos = known_end - seg.base
            if pos <= seg.data_len and _continues_at(seg, pos):
                start = pos
        walk = walk_range(seg, start, None, search_first=False, window=END_WINDOW_BYTES,
                          max_window=WALK_WINDOW_BYTES, exact_tail=False, over=END_WINDOW_BYTES // 16)
        if walk.blank_at is not None:
            return seg.base + seg.segment_size
        if walk.records:
            return seg.base + int(walk.last_end)  # type: ignore[arg-type]
        if start:
            return known_end  # type: ignore[return-value]
    return segments[0].base if segments else 0
