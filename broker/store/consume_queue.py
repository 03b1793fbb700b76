"""ConsumeQueue and ConsumeQueue-ext files: read, search by time, write (store-format.md 5, 6).

A consume queue ``consumequeue/<topic>/<queueId>/`` is a stream of 20-byte units
``(commitlog offset: long, record size: int, tagsCode: long)`` cut into pre-sized, zero-filled files
named by ``firstLogicalOffset * 20``. Nothing in the files says where the data ends or where it
starts: the end is the first unit that is not ``phy >= 0 && size > 0`` and the minimum offset is
derived from the commitlog's minimum offset (5.3). Bulk reads are vectorised with a big-endian numpy
dtype over whole files; per-unit Python objects are only built by :meth:`ConsumeQueue.unit_at`.

Damaged input (wrong file lengths, bad names, garbage units) never raises while reading: it becomes
:class:`~broker.store.findings.Finding` objects on ``.findings`` and the reader stops where Apache's
recovery would stop.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import struct
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Protocol

import numpy as np
import pyarrow as pa

from broker.store import findings as fk
from broker.store.commitlog import list_segments, offset_to_file_name
from broker.store.constants import (
    CONSUME_QUEUE_DIR,
    CONSUME_QUEUE_EXT_DIR,
    CQ_EXT_ADDR_BASE,
    CQ_EXT_END_MARKER,
    CQ_EXT_MAX_ADDR,
    CQ_EXT_UNIT_HEADER_SIZE,
    CQ_FILL_UNIT_SIZE,
    CQ_STORE_UNIT_SIZE,
    DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE,
    DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE_EXT,
    PROPERTY_DELAY,
    PROPERTY_TAGS,
    is_queued,
)
from broker.store.delay import clamp_level, deliver_timestamp, parse_delay_levels
from broker.store.findings import Finding
from broker.store.java_hash import tags_code
from broker.store.message import BlankRecord, MessageRecord, RecordError
from broker.store.topics import SCHEDULE_TOPIC

log = logging.getLogger(__name__)

# One unit as stored (big-endian); a whole file is ``np.frombuffer(data, CQ_UNIT_DTYPE)``.
CQ_UNIT_DTYPE = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert CQ_UNIT_DTYPE.itemsize == CQ_STORE_UNIT_SIZE

# What :meth:`ConsumeQueue.units` returns (native byte order, one row per unit).
UNITS_DTYPE = np.dtype([
    ("logical_offset", np.int64),
    ("commitlog_offset", np.int64),
    ("size", np.int32),
    ("tags_code", np.int64),
    ("is_ext_address", np.bool_),
])

_UNIT = struct.Struct(">qiq")
_FILL_UNIT = _UNIT.pack(0, CQ_FILL_UNIT_SIZE, 0)
# put_many: fewer units than this go one by one (a block's numpy set-up costs more than it saves)
BLOCK_MIN_UNITS = 16
_EXT_HEAD = struct.Struct(">hqqh")  # size, tagsCode, store timestamp, bitmap length
_EXT_END = struct.pack(">h", CQ_EXT_END_MARKER)
_EXT_MAX_UNIT_SIZE = 32767  # the unit size is a signed short
_EXT_END_BLANK = 4  # a unit must leave this many bytes free in its file (room for the end marker)
_EXT_MAX_REAL_OFFSET = CQ_EXT_MAX_ADDR - CQ_EXT_ADDR_BASE
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_MAX_LISTED_FINDINGS = 20  # per check, so a file of garbage cannot flood the findings list

Boundary = str  # "lower" | "upper"


class RecordSource(Protocol):
    """What :meth:`ConsumeQueue.search_by_timestamp` needs from a commitlog."""

    def read_record(self, offset: int) -> MessageRecord | BlankRecord: ...


# ---- tagsCode and ext addresses ---------------------------------------------------------------------

def _parse_java_int(text: str) -> int | None:
    """``Integer.parseInt`` on ASCII input, None where Java would throw."""
    if not _JAVA_INT.fullmatch(text):
        return None
    value = int(text)
    return value if -(1 << 31) <= value < (1 << 31) else None


def tags_code_for(topic: str, properties: Mapping[str, str], store_timestamp: int,
                  delay_levels: list[int] | None = None) -> int:
    """The tagsCode the dispatcher puts in a CQ unit (store-format.md 5.2, 3.9).

    The Java hash of ``TAGS`` sign-extended (0 without tags); for ``SCHEDULE_TOPIC_XXXX`` records
    with ``DELAY > 0`` the deliver time instead (store time + the level's delay, levels above the
    highest clamped), because the schedule service polls that queue by deliver time. Only the delay
    topic gets a deliver time: a delivered copy in the real topic still carries ``DELAY`` on disk.
    ``delay_levels`` are ms per level (``parse_delay_levels``); None means Apache's default levels.

    A ``DELAY`` value Java cannot parse makes Apache drop the whole record from dispatch; here it
    falls back to the tag hash (with a warning) so a single odd record cannot stop a rebuild.
    """
    code = tags_code(properties.get(PROPERTY_TAGS))
    if topic != SCHEDULE_TOPIC:
        return code
    text = properties.get(PROPERTY_DELAY)
    if text is None:
        return code
    level = _parse_java_int(text)
    if level is None:
        log.warning("SCHEDULE_TOPIC_XXXX record with unparsable DELAY=%r; using the tag hash", text)
        return code
    levels = delay_levels if delay_levels is not None else _default_delay_levels()
    level = clamp_level(level, levels)
    if level <= 0:
        return code
    return deliver_timestamp(store_timestamp, level, levels)


_DEFAULT_LEVELS: list[int] = []


def _default_delay_levels() -> list[int]:
    if not _DEFAULT_LEVELS:
        _DEFAULT_LEVELS.extend(parse_delay_levels())
    return _DEFAULT_LEVELS


def is_ext_address(tags_code_value: int) -> bool:
    """A CQ tagsCode at or below ``CQ_EXT_MAX_ADDR`` is a CQ-ext address, never a tag hash."""
    return tags_code_value <= CQ_EXT_MAX_ADDR


def ext_address_to_offset(address: int) -> int:
    """Ext byte offset of an address (``address - Long.MIN_VALUE``)."""
    return address - CQ_EXT_ADDR_BASE


def ext_offset_to_address(offset: int) -> int:
    """Address stored in the CQ for an ext byte offset (``offset + Long.MIN_VALUE``)."""
    return offset + CQ_EXT_ADDR_BASE


# ---- paths ---------------------------------------------------------------------------------------------

def _safe_child(root: Path, name: str) -> Path:
    """``root/name`` for a topic taken from outside: refuse anything that could leave ``root``
    (separators, ``.``/``..``, NUL, or a symlink that resolves elsewhere)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise ValueError(f"topic {name!r} cannot be used as a directory name")
    path = root / name
    if path.exists() and not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"topic directory {path} resolves outside {root}")
    return path


def queue_dir(store_dir: str | os.PathLike, topic: str, queue_id: int, kind: str = CONSUME_QUEUE_DIR) -> Path:
    """``<store>/<kind>/<topic>/<queueId>``, refusing topics that would escape the store."""
    if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
        raise ValueError(f"queue id must be a non-negative int, got {queue_id!r}")
    return _safe_child(Path(store_dir) / kind, topic) / str(queue_id)


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except OSError:
        return False


def list_queues(store_dir: str | os.PathLike) -> list[tuple[str, int]]:
    """Every ``(topic, queueId)`` with a directory under ``<store>/consumequeue``, sorted.

    Queue directories must be decimal numbers (anything else is not Apache's and is ignored), and a
    topic or queue directory that resolves outside the store (a symlink) is skipped with a warning.
    """
    root = Path(store_dir) / CONSUME_QUEUE_DIR
    if not root.is_dir():
        return []
    real_root = root.resolve()
    out: list[tuple[str, int]] = []
    for topic_dir in root.iterdir():
        if not topic_dir.is_dir():
            continue
        if not _inside(topic_dir, real_root):
            log.warning("skipping %s: it resolves outside %s", topic_dir, root)
            continue
        for qdir in topic_dir.iterdir():
            name = qdir.name
            if not (name.isascii() and name.isdigit()) or not qdir.is_dir():
                continue
            if not _inside(qdir, real_root):
                log.warning("skipping %s: it resolves outside %s", qdir, root)
                continue
            out.append((topic_dir.name, int(name)))
    return sorted(out)


# ---- file lists -----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class QueueFile:
    """One file of a queue: ``base`` is the byte position of its first byte in the queue's stream."""

    path: Path
    base: int
    size: int


def _infer_file_size(files: list[QueueFile], default: int, multiple: int) -> int:
    """The configured file size, read off the files: the smallest distance between consecutive
    names, else the most common length that is a whole number of units, else ``default``."""
    gaps = [b.base - a.base for a, b in zip(files, files[1:]) if b.base > a.base]
    if gaps:
        return min(gaps)
    sizes = [f.size for f in files if f.size and f.size % multiple == 0]
    if sizes:
        return max(set(sizes), key=sizes.count)
    return default


def _list_files(directory: Path, file_size: int | None, default: int, multiple: int, what: str,
                findings: list[Finding]) -> tuple[list[QueueFile], int]:
    """The files of one queue directory in order, plus the file size in use.

    Listing and the length/gap checks are the commitlog's (same naming rule, same Apache refusal
    to load a file of the wrong length); a name that is not a multiple of ``multiple`` cannot be the
    start of a unit and is reported and skipped.
    """
    if not directory.is_dir():
        return [], file_size or default
    if file_size is None:
        raw = [QueueFile(s.path, s.base, s.size) for s in list_segments(directory) if s.base % multiple == 0]
        file_size = _infer_file_size(raw, default, multiple)
    found: list[Finding] = []
    segs = list_segments(directory, file_size, found)
    for f in found:
        if f.kind == fk.BAD_FILE_NAME:
            f = Finding(f.file, f.offset, f.kind, f"not a 20-digit {what} file name; ignored")
        if f.kind != fk.FILE_GAP:  # gaps are checked below, among the files actually used
            findings.append(f)
    files: list[QueueFile] = []
    for s in segs:
        if s.base % multiple:
            findings.append(Finding(str(s.path), 0, fk.BAD_FILE_NAME,
                                    f"{what} file name {s.base} is not a multiple of {multiple}; ignored"))
            continue
        if files and s.base != files[-1].base + file_size:
            findings.append(Finding(str(s.path), 0, fk.FILE_GAP,
                                    f"starts at {s.base}, previous file ends at {files[-1].base + file_size}"))
        files.append(QueueFile(s.path, s.base, s.size))
    return files, file_size


# ---- what a unit means: the rules every reader of a queue applies ------------------------------------------

def is_data_unit(phy: int, size: int) -> bool:
    """Apache's end-of-queue rule: a unit is data while ``phy >= 0 and size > 0`` (zeros end it)."""
    return phy >= 0 and size > 0


def is_fill_unit(phy: int, size: int, tags: int) -> bool:
    """A pre-blank fill unit ``(0, 0x7FFFFFFF, 0)``: looks like data, points at nothing."""
    return phy == 0 and size == CQ_FILL_UNIT_SIZE and tags == 0


def data_mask(rows: np.ndarray) -> np.ndarray:
    """:func:`is_data_unit` over :data:`CQ_UNIT_DTYPE` rows."""
    return (rows["commitlog_offset"] >= 0) & (rows["size"] > 0)


def fill_mask(rows: np.ndarray) -> np.ndarray:
    """:func:`is_fill_unit` over :data:`CQ_UNIT_DTYPE` rows."""
    return (rows["commitlog_offset"] == 0) & (rows["size"] == CQ_FILL_UNIT_SIZE) & (rows["tags_code"] == 0)


def readable_mask(rows: np.ndarray, commitlog_min_offset: int) -> np.ndarray:
    """Units a consumer can read: not a fill unit, and their record still in the commitlog."""
    return (rows["commitlog_offset"] >= commitlog_min_offset) & ~fill_mask(rows)


class MinOffsetRule(enum.Enum):
    """Where a queue's minimum offset is looked for.

    ``ALL_FILES`` (the default, for the broker and the inspector alike): the first readable unit
    of the queue, in whichever file it is. ``FIRST_FILE``: Apache's ``correctMinOffset``, which
    looks at the first file only (Apache deletes expired queue files whole, so there the first
    file holds it); a first file without a readable unit then makes the queue look empty."""

    ALL_FILES = "all_files"
    FIRST_FILE = "first_file"


class QueueFiles:
    """The one reader of a queue's files: units by logical offset, whole files, and the end of the
    written units, each a ranged read.

    Every consume-queue read goes through here: the running broker's pulls and queue views, its
    recovery's end search, the inspector's and the ingest's bulk reads (:class:`ConsumeQueue`) and
    the remote stores' end search (``pipelines.store_files``). Only :meth:`_read_at` and
    :meth:`bases` touch a filesystem, so a reader over object storage overrides those two (and
    :meth:`path_of`, for the names findings carry) and nothing else.

    Nothing is cached, so what another process appends is seen at once, and a read costs one small
    system call whatever the queue's length. A read never crosses a file boundary (as Apache's
    ``getIndexBuffer``); a missing file reads as no units and is logged once, so a consumer moves
    on to the next file (Apache's ``rollNextFile``) and the gap is on record."""

    def __init__(self, directory: Path, file_size: int) -> None:
        if file_size <= 0 or file_size % CQ_STORE_UNIT_SIZE:
            raise ValueError(f"consume queue file size must be a positive multiple of 20, got {file_size}")
        self.directory = directory
        self.file_size = file_size
        self.units_per_file = file_size // CQ_STORE_UNIT_SIZE
        self._missing_logged: set[int] = set()

    # ---- the filesystem seam ----------------------------------------------------------------------
    def path_of(self, base: int) -> Path:
        """The file starting at byte ``base`` of the queue's stream (how findings name it)."""
        return self.directory / offset_to_file_name(base)

    def bases(self) -> list[int]:
        """Byte bases of the queue's files, in order (20-digit names only)."""
        try:
            names = [p.name for p in self.directory.iterdir()]
        except (FileNotFoundError, NotADirectoryError):  # none yet, or its topic was just deleted
            return []
        return sorted(int(n) for n in names if len(n) == 20 and n.isdigit() and int(n) % CQ_STORE_UNIT_SIZE == 0)

    def _read_at(self, base: int, pos: int, length: int) -> bytes | None:
        """Up to ``length`` bytes at ``pos`` of the file at ``base`` (fewer past its end); None when
        the file does not exist."""
        try:
            fd = os.open(self.path_of(base), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return os.pread(fd, length, pos)
        finally:
            os.close(fd)

    # ---- geometry ---------------------------------------------------------------------------------
    def locate(self, logical: int) -> tuple[int, int]:
        """``(base, position)``: the file that holds (or would hold) unit ``logical``, and where."""
        byte = logical * CQ_STORE_UNIT_SIZE
        return byte - byte % self.file_size, byte % self.file_size

    def next_file_offset(self, logical: int) -> int:
        """The first logical offset of the file after the one holding ``logical``."""
        return (logical // self.units_per_file + 1) * self.units_per_file

    # ---- reads ------------------------------------------------------------------------------------
    def read(self, start: int, count: int) -> np.ndarray:
        """Up to ``count`` units from logical ``start`` (big-endian :data:`CQ_UNIT_DTYPE` rows),
        stopping at the end of ``start``'s file; a short file's missing tail reads as nothing."""
        if start < 0 or count <= 0:
            return np.empty(0, CQ_UNIT_DTYPE)
        base, pos = self.locate(start)
        n = min(count, (self.file_size - pos) // CQ_STORE_UNIT_SIZE)
        data = self._read_at(base, pos, n * CQ_STORE_UNIT_SIZE)
        if data is None:
            if base not in self._missing_logged:
                self._missing_logged.add(base)
                log.warning("consume queue %s: file %s is missing; its units are skipped",
                            self.directory, offset_to_file_name(base))
            return np.empty(0, CQ_UNIT_DTYPE)
        usable = len(data) - len(data) % CQ_STORE_UNIT_SIZE
        return np.frombuffer(data[:usable], CQ_UNIT_DTYPE)

    def close(self) -> None:
        """Release what a reader over another filesystem keeps open (a local reader keeps nothing)."""

    def read_file(self, base: int) -> bytes:
        """The whole file at ``base`` in one read, zero-padded to the file size (a short file reads
        like a fresh mapped file). Raises FileNotFoundError for a file that is not there."""
        data = self._read_at(base, 0, self.file_size)
        if data is None:
            raise FileNotFoundError(str(self.path_of(base)))
        return data if len(data) == self.file_size else data + bytes(self.file_size - len(data))

    def unit(self, logical: int) -> tuple[int, int, int]:
        """``(phy, size, tagsCode)`` at a logical offset; zeros where nothing is written."""
        rows = self.read(logical, 1)
        if not len(rows):
            return 0, 0, 0
        return int(rows["commitlog_offset"][0]), int(rows["size"][0]), int(rows["tags_code"][0])

    # ---- where the data is ------------------------------------------------------------------------
    def written_units(self, base: int) -> int:
        """How many units of the file at ``base`` are written: Apache's end rule
        (:func:`is_data_unit`) found by binary search, about 20 reads of one unit.

        Relies on what a broker writes: a file holds its units from its start, then zeros. A full
        scan that checks this, with findings, is :class:`ConsumeQueue`'s."""
        first = base // CQ_STORE_UNIT_SIZE
        lo, hi = 0, self.units_per_file
        while lo < hi:
            mid = (lo + hi) // 2
            phy, size, _ = self.unit(first + mid)
            if is_data_unit(phy, size):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def reach(self) -> int:
        """``phy + size`` of the queue's last real unit, -1 for none (Apache's ``maxPhysicOffset``),
        from the last file that holds a unit: a queue's files are written in order."""
        for base in reversed(self.bases()):
            n = self.written_units(base)
            if n:
                phy, size, tags = self.unit(base // CQ_STORE_UNIT_SIZE + n - 1)
                return -1 if is_fill_unit(phy, size, tags) else phy + size
        return -1

    def min_offset(self, commitlog_min_offset: int, end: int, rule: MinOffsetRule = MinOffsetRule.ALL_FILES,
                   chunk: int = 4096) -> int:
        """First readable unit below ``end`` (:func:`readable_mask`), files in order as ``rule``
        says; ``end`` when there is none (an empty queue)."""
        bases = self.bases()
        if rule is MinOffsetRule.FIRST_FILE:
            bases = bases[:1]
        for base in bases:
            offset = base // CQ_STORE_UNIT_SIZE
            stop = min(end, offset + self.units_per_file)
            while offset < stop:
                rows = self.read(offset, min(chunk, stop - offset))
                if not len(rows):
                    break
                ok = readable_mask(rows, commitlog_min_offset)
                if ok.any():
                    return offset + int(np.argmax(ok))
                offset += len(rows)
        return end


# ---- ConsumeQueue ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ConsumeQueueUnit:
    """One CQ unit. ``tags_code`` is the real tag code when an ext address could be resolved;
    ``ext_address`` keeps the stored address in that case (None for plain units)."""

    logical_offset: int
    commitlog_offset: int
    size: int
    tags_code: int
    is_ext_address: bool
    ext_address: int | None = None

    @property
    def is_fill(self) -> bool:
        """A pre-blank fill unit ``(0, 0x7FFFFFFF, 0)``: looks valid, points at nothing."""
        return is_fill_unit(self.commitlog_offset, self.size, self.tags_code)


@dataclass(slots=True)
class _Chunk:
    """Valid units of one file (big-endian rows), starting at ``first`` (logical offset)."""

    first: int
    rows: np.ndarray

    @property
    def stop(self) -> int:
        return self.first + len(self.rows)


class ConsumeQueue:
    """One queue ``<store>/consumequeue/<topic>/<queueId>/``: reader and Apache-compatible writer.

    ``file_size`` is ``mappedFileSizeConsumeQueue`` in bytes; None infers it from the files (or
    uses Apache's default for a new queue). ``commitlog_min_offset`` is what :attr:`min_offset`
    is derived from (Apache uses the commitlog's minimum offset). ``enable_ext`` makes :meth:`put`
    store tag codes in a ``consumequeue_ext`` file, as ``enableConsumeQueueExt`` does.
    """

    def __init__(self, store_dir: str | os.PathLike, topic: str, queue_id: int, file_size: int | None = None,
                 *, commitlog_min_offset: int = 0, enable_ext: bool = False,
                 ext_file_size: int | None = None) -> None:
        if file_size is not None and (file_size <= 0 or file_size % CQ_STORE_UNIT_SIZE):
            raise ValueError(f"consume queue file size must be a positive multiple of 20, got {file_size}")
        self.store_dir = Path(store_dir)
        self.topic = topic
        self.queue_id = queue_id
        self.directory = queue_dir(store_dir, topic, queue_id)
        self.commitlog_min_offset = commitlog_min_offset
        self.findings: list[Finding] = []
        self.files, self.file_size = _list_files(self.directory, file_size, DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE,
                                                 CQ_STORE_UNIT_SIZE, "consume queue", self.findings)
        if self.file_size % CQ_STORE_UNIT_SIZE:
            raise ValueError(f"inferred file size {self.file_size} is not a multiple of 20; pass file_size")
        self.reader = QueueFiles(self.directory, self.file_size)  # every read of the files goes here
        self._enable_ext = enable_ext
        self._ext_file_size = ext_file_size
        self._ext: ConsumeQueueExt | None = None
        self._chunks: list[_Chunk] | None = None
        self._end = 0  # logical offset just past the data
        self._min_cache: dict[int, int] = {}
        self._scan_findings: list[Finding] = []
        self._writer: _CqWriter | None = None

    @classmethod
    def open(cls, store_dir: str | os.PathLike, topic: str, queue_id: int, file_size: int | None = None,
             **kwargs) -> "ConsumeQueue":
        """Open a queue (same arguments as the constructor); the directory need not exist yet."""
        return cls(store_dir, topic, queue_id, file_size, **kwargs)

    # ---- reading -----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Forget what was read, so the next read sees the files as they are now (another process,
        e.g. a running broker, may have appended). Without a writer open the directory is listed
        again too; findings are re-derived either way."""
        if self._writer is None:
            self.findings.clear()
            self._scan_findings = []
            self.files, self.file_size = _list_files(self.directory, self.file_size,
                                                     DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE, CQ_STORE_UNIT_SIZE,
                                                     "consume queue", self.findings)
        self._chunks = None

    @property
    def ext(self) -> "ConsumeQueueExt | None":
        """The queue's ext file set, if the store has one for this queue (or ext writing is on)."""
        if self._ext is None:
            ext_dir = queue_dir(self.store_dir, self.topic, self.queue_id, CONSUME_QUEUE_EXT_DIR)
            if self._enable_ext or ext_dir.is_dir():
                self._ext = ConsumeQueueExt(self.store_dir, self.topic, self.queue_id, self._ext_file_size)
        return self._ext

    def _scan(self) -> list[_Chunk]:
        """Parse the files once: valid units per file up to the first invalid unit (the end)."""
        if self._chunks is not None:
            return self._chunks
        if self._writer is not None:
            self._writer.flush()
        self._min_cache.clear()
        # A rescan (after writes) re-derives its findings: drop the previous scan's, keep the rest.
        previous = {id(f) for f in self._scan_findings}
        self.findings[:] = [f for f in self.findings if id(f) not in previous]
        before = len(self.findings)
        chunks: list[_Chunk] = []
        end_byte = self.files[0].base if self.files else 0
        for i, qf in enumerate(self.files):
            rows = np.frombuffer(self._read(qf), CQ_UNIT_DTYPE)
            valid = data_mask(rows)
            n = len(rows) if valid.all() else int(np.argmin(valid))
            if n:
                chunks.append(_Chunk(qf.base // CQ_STORE_UNIT_SIZE, rows[:n]))
            end_byte = qf.base + n * CQ_STORE_UNIT_SIZE
            if n < len(rows):
                self._report_end(qf, rows, n, self.files[i + 1:])
                break
        self._end = end_byte // CQ_STORE_UNIT_SIZE
        self._check_units(chunks)
        self._scan_findings = self.findings[before:]
        self._chunks = chunks
        return chunks

    def _read(self, qf: QueueFile) -> bytes:
        """One queue file's bytes, zero-padded to the file size, through :attr:`reader` (a queue
        on another filesystem swaps the reader, not this)."""
        return self.reader.read_file(qf.base)

    def skip_files_below(self, commitlog_offset: int) -> int:
        """Leave out the leading files whose units all point below ``commitlog_offset`` (a reader
        that only wants newer units, e.g. an incremental ingest, then reads the newest files only).
        A file's units point below its successor's first unit, so a file goes when its successor's
        first unit is valid and not above ``commitlog_offset``: one 20-byte read per file. The
        queue's findings and minimum offset then describe the files kept. Returns how many went."""
        if self._writer is not None:
            raise RuntimeError("skip_files_below is for readers")
        dropped = 0
        while dropped + 1 < len(self.files):
            phy, size, _ = self.reader.unit(self.files[dropped + 1].base // CQ_STORE_UNIT_SIZE)
            if not is_data_unit(phy, size) or phy > commitlog_offset:
                break
            dropped += 1
        if dropped:
            self.files = self.files[dropped:]
            self._chunks = None
        return dropped

    def _report_end(self, qf: QueueFile, rows: np.ndarray, n: int, later: list[QueueFile]) -> None:
        """Findings for what lies at and after the end of data: a clean end is all zeros."""
        tail = np.ascontiguousarray(rows[n:]).view(np.uint8)  # no copy: rows come from one buffer
        if tail[:CQ_STORE_UNIT_SIZE].any():
            phy, size, tags = (int(v) for v in rows[n].tolist())
            self.findings.append(Finding(
                str(qf.path), n * CQ_STORE_UNIT_SIZE, fk.CQ_BAD_UNIT,
                f"unit (phy={phy}, size={size}, tags={tags}) is not valid (phy >= 0 and size > 0): data ends here"))
        nonzero = np.flatnonzero(tail)
        if nonzero.size:
            skipped = int(nonzero[-1]) + 1
            self.findings.append(Finding(str(qf.path), n * CQ_STORE_UNIT_SIZE, fk.CQ_DATA_AFTER_END,
                                         f"{skipped} bytes after the end of data are not zero", skipped))
        for other in later:
            data = np.frombuffer(self._read(other), np.uint8)
            nz = np.flatnonzero(data)
            if nz.size:
                self.findings.append(Finding(str(other.path), 0, fk.CQ_DATA_AFTER_END,
                                             "file lies after the end of the queue's data but is not empty",
                                             int(nz[-1]) + 1))

    def _check_units(self, chunks: list[_Chunk]) -> None:
        """Valid-looking units that cannot be right: fill units after real ones, and commitlog
        offsets that do not increase (a queue is written in commitlog order)."""
        if not chunks:
            return
        rows = np.concatenate([c.rows for c in chunks])
        logical = np.concatenate([np.arange(c.first, c.stop, dtype=np.int64) for c in chunks])
        fill = fill_mask(rows)
        real = ~fill
        if real.any():
            first_real = int(np.argmax(real))
            bad = np.flatnonzero(fill[first_real:]) + first_real
            self._unit_findings(logical[bad], "pre-blank fill unit after real units")
            idx = np.flatnonzero(real)
            phy = rows["commitlog_offset"][idx].astype(np.int64)
            back = idx[1:][np.diff(phy) <= 0]
            self._unit_findings(logical[back], "commitlog offset does not increase")

    def _unit_findings(self, logical: np.ndarray, what: str) -> None:
        for off in logical[:_MAX_LISTED_FINDINGS].tolist():
            self.findings.append(Finding(*self._locate(off), fk.CQ_BAD_UNIT,
                                         f"logical offset {off}: {what}"))
        if len(logical) > _MAX_LISTED_FINDINGS:
            self.findings.append(Finding(str(self.directory), 0, fk.CQ_BAD_UNIT,
                                         f"{len(logical) - _MAX_LISTED_FINDINGS} more units: {what}"))

    def _locate(self, logical: int) -> tuple[str, int]:
        """The file (as findings name it) and position of unit ``logical``."""
        base, pos = self.reader.locate(logical)
        return str(self.reader.path_of(base)), pos

    @property
    def max_offset(self) -> int:
        """Logical offset just past the last unit (the next offset to be written)."""
        self._scan()
        return self._end

    def min_offset_for(self, commitlog_min_offset: int) -> int:
        """First unit whose commitlog offset is ``>= commitlog_min_offset``, fill units skipped.

        Apache (``correctMinOffset``) only looks at the first file because it deletes expired files
        whole; this looks through all of them, and answers :attr:`max_offset` (an empty queue)
        when no unit qualifies.
        """
        chunks = self._scan()
        cached = self._min_cache.get(commitlog_min_offset)
        if cached is not None:
            return cached
        answer = None
        for chunk in chunks:
            ok = readable_mask(chunk.rows, commitlog_min_offset)
            if ok.any():
                answer = chunk.first + int(np.argmax(ok))
                break
        if answer is None:
            answer = self._end
        self._min_cache[commitlog_min_offset] = answer
        return answer

    @property
    def min_offset(self) -> int:
        """First readable logical offset for ``commitlog_min_offset`` (see :meth:`min_offset_for`)."""
        return self.min_offset_for(self.commitlog_min_offset)

    @property
    def max_physic_offset(self) -> int:
        """``phy + size`` of the last real unit, -1 for none (Apache's ``maxPhysicOffset``)."""
        for chunk in reversed(self._scan()):
            real = np.flatnonzero(~fill_mask(chunk.rows))
            if real.size:
                row = chunk.rows[int(real[-1])]
                return int(row["commitlog_offset"]) + int(row["size"])
        return -1

    def _raw_units(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Big-endian rows and their logical offsets for ``[start, stop)`` (clipped to the data)."""
        parts, offsets = [], []
        for chunk in self._scan():
            lo, hi = max(start, chunk.first), min(stop, chunk.stop)
            if lo < hi:
                parts.append(chunk.rows[lo - chunk.first: hi - chunk.first])
                offsets.append(np.arange(lo, hi, dtype=np.int64))
        if not parts:
            return np.empty(0, CQ_UNIT_DTYPE), np.empty(0, np.int64)
        return np.concatenate(parts), np.concatenate(offsets)

    def units(self, from_offset: int | None = None, to_offset: int | None = None,
              resolve_ext: bool = True) -> np.ndarray:
        """Units with logical offsets in ``[from_offset, to_offset)`` as a :data:`UNITS_DTYPE` array.

        Defaults to ``[min_offset, max_offset)``; asking below ``min_offset`` explicitly returns the
        fill units too. With ``resolve_ext`` ext addresses are replaced by the real tag codes when
        the ext files hold them (``is_ext_address`` still says which rows were addresses).
        """
        start = self.min_offset if from_offset is None else from_offset
        stop = self.max_offset if to_offset is None else to_offset
        rows, logical = self._raw_units(start, stop)
        out = np.empty(len(rows), UNITS_DTYPE)
        out["logical_offset"] = logical
        out["commitlog_offset"] = rows["commitlog_offset"]
        out["size"] = rows["size"]
        out["tags_code"] = rows["tags_code"]
        out["is_ext_address"] = rows["tags_code"] <= CQ_EXT_MAX_ADDR
        if resolve_ext and out["is_ext_address"].any() and self.ext is not None:
            for i in np.flatnonzero(out["is_ext_address"]).tolist():
                unit = self.ext.get(int(out["tags_code"][i]))
                if unit is not None:
                    out["tags_code"][i] = unit.tags_code
        return out

    def units_table(self, from_offset: int | None = None, to_offset: int | None = None) -> pa.Table:
        """:meth:`units` as a pyarrow Table (for the Spark/Delta jobs)."""
        return to_arrow_table(self.units(from_offset, to_offset))

    def unit_at(self, logical_offset: int) -> ConsumeQueueUnit | None:
        """The unit at a logical offset, or None outside ``[min_offset, max_offset)`` (like Apache's
        ``getIndexBuffer``, which refuses offsets below the minimum)."""
        if not self.min_offset <= logical_offset < self.max_offset:
            return None
        rows, _ = self._raw_units(logical_offset, logical_offset + 1)
        if not len(rows):
            return None
        phy, size, tags = (int(v) for v in rows[0].tolist())
        if not is_ext_address(tags):
            return ConsumeQueueUnit(logical_offset, phy, size, tags, False)
        ext_unit = self.ext.get(tags) if self.ext is not None else None
        real = ext_unit.tags_code if ext_unit is not None else tags
        return ConsumeQueueUnit(logical_offset, phy, size, real, True, tags)

    def search_by_timestamp(self, timestamp_ms: int, commitlog: RecordSource, boundary: Boundary = "lower") -> int:
        """Logical offset for a store time, by binary search reading store times from the commitlog.

        Like Apache's ``getOffsetInQueueByTime(timestamp, boundaryType)`` (5.x; 4.9.8 only has the
        "closest unit" variant): ``lower`` = the first unit with ``storeTimestamp >= timestamp_ms``,
        ``upper`` = the last unit with ``storeTimestamp <= timestamp_ms``. Both search
        ``[min_offset, max_offset)``, relying on store times being non-decreasing along a queue.
        Clamping: ``lower`` answers ``max_offset`` when every unit is older (where the next message
        will go; Apache does the same); ``upper`` answers ``min_offset`` when every unit is newer
        (Apache answers the file start or 0, which may point below the readable range). An empty
        queue answers ``min_offset``. A unit whose record cannot be read counts as older than any
        time (Apache treats offsets below the commitlog minimum that way) and is reported as a
        ``cq_dangling_unit`` finding.
        """
        if boundary not in ("lower", "upper"):
            raise ValueError(f"boundary must be 'lower' or 'upper', got {boundary!r}")
        lo, hi = self.min_offset, self.max_offset
        if lo >= hi:
            return lo
        store_time = self._store_time_reader(commitlog)
        if boundary == "lower":
            return bisect_left(range(lo, hi), timestamp_ms, key=store_time) + lo
        first_newer = bisect_left(range(lo, hi), timestamp_ms + 1, key=store_time) + lo
        return max(first_newer - 1, lo)

    def _store_time_reader(self, commitlog: RecordSource) -> Callable[[int], int]:
        def store_time(logical: int) -> int:
            rows, _ = self._raw_units(logical, logical + 1)
            phy = int(rows["commitlog_offset"][0])
            try:
                rec = commitlog.read_record(phy)
            except (RecordError, OSError) as exc:
                rec = exc
            if isinstance(rec, MessageRecord):
                return rec.store_timestamp
            self.findings.append(Finding(*self._locate(logical), fk.CQ_DANGLING,
                                         f"logical offset {logical}: no message at commitlog offset {phy} ({rec})"))
            return -1
        return store_time

    # ---- writing ------------------------------------------------------------------------------------
    def put(self, logical_offset: int, commitlog_offset: int, size: int, tags_code: int,
            store_timestamp: int = 0, filter_bitmap: bytes = b"") -> bool:
        """Write one unit like Apache's ``putMessagePositionInfo``; True if written, False if skipped.

        Re-dispatch is idempotent: a unit whose ``commitlog_offset + size`` is not beyond the last
        written unit's end, or whose logical offset is already written, is skipped. The first file
        of a queue created at a non-zero offset is pre-filled with fill units up to it (pre-blank
        fill). An offset beyond the write position is written *at the write position*, as Apache
        does, and reported as a ``cq_offset_gap`` finding (the queue offsets are then out of step
        with the commitlog: a dispatcher bug). With ``enable_ext`` the tag code goes to the ext file
        (with ``store_timestamp`` and ``filter_bitmap``) and the CQ gets its address.
        """
        if self._writer is None:
            self._writer = _CqWriter(self)
        self._chunks = None
        if self._writer.already_written(logical_offset, commitlog_offset, size):
            return False
        if self._enable_ext:
            address = self.ext.put(CqExtUnit(tags_code, store_timestamp, filter_bitmap))
            if address is not None:
                tags_code = address
        return self._writer.put(logical_offset, commitlog_offset, size, tags_code)

    def put_many(self, logical: np.ndarray, phy: np.ndarray, size: np.ndarray, tags: np.ndarray,
                 store_timestamp: np.ndarray) -> np.ndarray:
        """:meth:`put` for many units in commitlog order; which were written (bool per unit).

        Units that continue the queue exactly (the next logical offset, a commitlog end beyond the
        previous unit's) are appended as one block per file — one encode, one ``pwrite`` at the
        flush —; anything else (a first unit, a gap, a re-dispatched unit, the ext file) goes
        through :meth:`put`, so the rules live there only."""
        n = len(logical)
        if self._enable_ext or n < BLOCK_MIN_UNITS:
            return np.array([self.put(lo, p, sz, t, ts) for lo, p, sz, t, ts in zip(
                logical.tolist(), phy.tolist(), size.tolist(), tags.tolist(), store_timestamp.tolist())], np.bool_)
        written = np.zeros(n, np.bool_)
        if self._writer is None:
            self._writer = _CqWriter(self)
        self._chunks = None
        w = self._writer
        ends = phy + size
        # unit i continues unit i-1 when the offsets follow and the commitlog end grows
        follows = np.empty(n, np.bool_)
        follows[0] = False
        follows[1:] = (logical[1:] == logical[:-1] + 1) & (ends[1:] > ends[:-1])
        breaks = np.flatnonzero(~follows).tolist() + [n]
        i = 0
        while i < n:
            if (w.fd is not None and w.pos < w.fs and not w.first_create
                    and int(logical[i]) * CQ_STORE_UNIT_SIZE == w.base + w.pos and int(ends[i]) > w.max_physic_offset):
                run_end = breaks[bisect_left(breaks, i + 1)]
                m = min(run_end - i, (w.fs - w.pos) // CQ_STORE_UNIT_SIZE)
                units = np.empty(m, CQ_UNIT_DTYPE)
                units["commitlog_offset"] = phy[i:i + m]
                units["size"] = size[i:i + m]
                units["tags_code"] = tags[i:i + m]
                w.pending += units.tobytes()
                w.pos += m * CQ_STORE_UNIT_SIZE
                w.max_physic_offset = int(ends[i + m - 1])
                written[i:i + m] = True
                if len(w.pending) >= 1 << 20:
                    w.flush()
                i += m
            else:
                written[i] = w.put(int(logical[i]), int(phy[i]), int(size[i]), int(tags[i]))
                i += 1
        return written

    def flush(self) -> None:
        """Write buffered units to the files."""
        if self._writer is not None:
            self._writer.flush()
        if self._ext is not None:
            self._ext.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._ext is not None:
            self._ext.close()
        self.reader.close()
        self._chunks = None

    def __enter__(self) -> "ConsumeQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _CqWriter:
    """Append state of one queue: the file being written, its write position, the last unit's end.

    Units are buffered and written with one ``pwrite`` per flush; files are created pre-sized and
    zero-filled like Apache's mapped files, so a crash leaves a valid (shorter) queue.
    """

    def __init__(self, cq: ConsumeQueue) -> None:
        self.cq = cq
        self.fs = cq.file_size
        cq._scan()
        end_byte = cq._end * CQ_STORE_UNIT_SIZE
        self.max_physic_offset = cq.max_physic_offset
        self.fd: int | None = None
        self.base = 0
        self.pos = 0
        self.pending = bytearray()
        self.pending_pos = 0
        self.first_create = not cq.files
        if cq.files:
            last = cq.files[-1]
            if end_byte == last.base + self.fs:
                self.base, self.pos = last.base, self.fs  # full: the next put rolls
            elif last.base <= end_byte < last.base + self.fs:
                self._open(last.path, last.base, end_byte - last.base)
            else:
                raise RuntimeError(f"{cq.directory}: data ends at logical offset {cq._end}, before the last "
                                   f"file {last.path.name}; refusing to append to a damaged queue")

    def _open(self, path: Path, base: int, pos: int) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size != self.fs:
            os.ftruncate(self.fd, self.fs)  # pre-sized and zero-filled, like a mapped file
        self.base, self.pos, self.pending_pos = base, pos, pos

    def _new_file(self, base: int) -> None:
        self.close()
        self.cq.directory.mkdir(parents=True, exist_ok=True)
        path = self.cq.directory / offset_to_file_name(base)
        self._open(path, base, 0)
        self.cq.files.append(QueueFile(path, base, self.fs))

    def already_written(self, logical_offset: int, phy: int, size: int) -> bool:
        """Apache's two re-dispatch checks: the commitlog range is not beyond the last unit's end,
        or (for offsets other than 0) the logical offset is below the write position."""
        if phy + size <= self.max_physic_offset:
            log.debug("%s: unit for commitlog offset %d already written", self.cq.directory, phy)
            return True
        if logical_offset != 0 and not self.first_create \
                and logical_offset * CQ_STORE_UNIT_SIZE < self.base + self.pos:
            log.debug("%s: logical offset %d already written", self.cq.directory, logical_offset)
            return True
        return False

    def put(self, logical_offset: int, phy: int, size: int, tags: int) -> bool:
        if self.already_written(logical_offset, phy, size):
            return False
        expect = logical_offset * CQ_STORE_UNIT_SIZE
        if self.fd is None or self.pos >= self.fs:
            if self.first_create:
                self._new_file(expect - expect % self.fs)
                if logical_offset:
                    self._fill_pre_blank(expect % self.fs)
            else:
                self._new_file(self.base + self.fs)
            self.first_create = False
        current = self.base + self.pos
        if logical_offset != 0 and expect != current:
            log.error("%s: logical offset %d expected, writing at %d (as Apache does)",
                      self.cq.directory, logical_offset, current // CQ_STORE_UNIT_SIZE)
            self.cq.findings.append(Finding(
                str(self.cq.directory / offset_to_file_name(self.base)), self.pos, fk.CQ_OFFSET_GAP,
                f"unit for logical offset {logical_offset} written at {current // CQ_STORE_UNIT_SIZE}"))
        self.pending += _UNIT.pack(phy, size, tags)
        self.pos += CQ_STORE_UNIT_SIZE
        self.max_physic_offset = phy + size
        if len(self.pending) >= 1 << 20:
            self.flush()
        return True

    def _fill_pre_blank(self, until: int) -> None:
        """Units before the first offset of a queue's first file are ``(0, MAX_INT, 0)`` fill."""
        self.pending += _FILL_UNIT * (until // CQ_STORE_UNIT_SIZE)
        self.pos = until

    def flush(self) -> None:
        if self.fd is not None and self.pending:
            os.pwrite(self.fd, self.pending, self.pending_pos)
            self.pending_pos += len(self.pending)
            self.pending.clear()

    def close(self) -> None:
        if self.fd is not None:
            self.flush()
            os.close(self.fd)
            self.fd = None


class ConsumeQueueDispatcher:
    """Builds the consume queues of a store from commitlog records, in commitlog order, as
    Apache's ``CommitLogDispatcherBuildConsumeQueue``: only transaction types NOT and COMMIT are
    queued (PREPARED and ROLLBACK never are), at the record's topic, queue id and queue offset."""

    def __init__(self, store_dir: str | os.PathLike, file_size: int | None = None,
                 delay_levels: list[int] | None = None, *, enable_ext: bool = False,
                 ext_file_size: int | None = None) -> None:
        self.store_dir = Path(store_dir)
        self.file_size = file_size
        self.delay_levels = delay_levels if delay_levels is not None else _default_delay_levels()
        self.enable_ext = enable_ext
        self.ext_file_size = ext_file_size
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.store_dir, topic, queue_id, self.file_size, enable_ext=self.enable_ext,
                              ext_file_size=self.ext_file_size)
            self.queues[key] = cq
        return cq

    def dispatch(self, record: MessageRecord) -> bool:
        """Queue one record; False when it is not queued (transaction type) or already was."""
        if not is_queued(record.sys_flag):
            return False
        code = tags_code_for(record.topic, record.properties, record.store_timestamp, self.delay_levels)
        return self.queue(record.topic, record.queue_id).put(
            record.queue_offset, record.physical_offset, record.total_size, code, record.store_timestamp)

    def flush(self) -> None:
        for cq in self.queues.values():
            cq.flush()

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()

    def __enter__(self) -> "ConsumeQueueDispatcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def to_arrow_table(rows: np.ndarray) -> pa.Table:
    """A numpy structured array as a pyarrow Table, one column per field (no per-row Python)."""
    return pa.table({name: pa.array(np.ascontiguousarray(rows[name])) for name in rows.dtype.names})


# ---- ConsumeQueue ext ----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CqExtUnit:
    """A CQ-ext unit: the real tag code, the store time and an optional filter bitmap."""

    tags_code: int
    store_timestamp: int
    filter_bitmap: bytes = b""

    @property
    def size(self) -> int:
        return CQ_EXT_UNIT_HEADER_SIZE + len(self.filter_bitmap)

    def encode(self) -> bytes:
        return _EXT_HEAD.pack(self.size, self.tags_code, self.store_timestamp, len(self.filter_bitmap)) \
            + self.filter_bitmap


@dataclass
class ConsumeQueueExt:
    """``<store>/consumequeue_ext/<topic>/<queueId>/``: variable-length units addressed from the
    CQ by ``extByteOffset + Long.MIN_VALUE`` (store-format.md 6). Reading one unit is a seek;
    :meth:`put` appends like Apache's ``ConsumeQueueExt.put`` (end marker ``0xFFFF`` and a new file
    when a unit would leave fewer than 4 bytes in the current one)."""

    store_dir: str | os.PathLike
    topic: str
    queue_id: int
    file_size: int | None = None
    findings: list[Finding] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.directory = queue_dir(self.store_dir, self.topic, self.queue_id, CONSUME_QUEUE_EXT_DIR)
        self.files, self.file_size = _list_files(self.directory, self.file_size,
                                                 DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE_EXT, 1, "consume queue ext",
                                                 self.findings)
        self._fd: int | None = None
        self._base = 0
        self._pos = 0
        self._writing = False

    def _file_for(self, offset: int) -> QueueFile | None:
        i = bisect_left([f.base for f in self.files], offset + 1) - 1
        if i >= 0 and offset < self.files[i].base + self.file_size:
            return self.files[i]
        return None

    def _read_at(self, qf: QueueFile, pos: int, length: int) -> bytes:
        with open(qf.path, "rb") as fh:
            fh.seek(pos)
            data = fh.read(length)
        return data + bytes(length - len(data))

    def get(self, address: int) -> CqExtUnit | None:
        """The unit at a CQ ext address; None (and a finding when it is damaged) if there is none."""
        if not is_ext_address(address):
            return None
        offset = ext_address_to_offset(address)
        qf = self._file_for(offset)
        if qf is None:
            self.findings.append(Finding(str(self.directory), offset, fk.CQ_EXT_BAD_UNIT,
                                         f"no ext file holds ext offset {offset}"))
            return None
        return self._unit_at(qf, offset - qf.base)

    def _unit_at(self, qf: QueueFile, pos: int) -> CqExtUnit | None:
        room = self.file_size - pos
        if room < 2:
            return None
        head = self._read_at(qf, pos, min(CQ_EXT_UNIT_HEADER_SIZE, room))
        (size,) = struct.unpack_from(">h", head)
        if size < 1:
            return None  # zeros or the end marker: nothing here
        if size < CQ_EXT_UNIT_HEADER_SIZE or size > room:
            self.findings.append(Finding(str(qf.path), pos, fk.CQ_EXT_BAD_UNIT,
                                         f"unit size {size} is not in [20, {room}]"))
            return None
        _, tags, ts, bitmap_len = _EXT_HEAD.unpack_from(head)
        if bitmap_len < 0 or CQ_EXT_UNIT_HEADER_SIZE + bitmap_len != size:
            self.findings.append(Finding(str(qf.path), pos, fk.CQ_EXT_BAD_UNIT,
                                         f"bitmap length {bitmap_len} does not match unit size {size}"))
            return None
        bitmap = self._read_at(qf, pos + CQ_EXT_UNIT_HEADER_SIZE, bitmap_len) if bitmap_len else b""
        return CqExtUnit(tags, ts, bitmap)

    def iter_units(self) -> Iterator[tuple[int, CqExtUnit]]:
        """``(address, unit)`` for every unit, file by file (a size < 1 ends a file, as in recovery).
        Units are variable-length, so this walks them one by one."""
        for qf in self.files:
            pos = 0
            while True:
                unit = self._unit_at(qf, pos)
                if unit is None:
                    break
                yield ext_offset_to_address(qf.base + pos), unit
                pos += unit.size

    def _data_end(self) -> tuple[int, int]:
        """(file base, position) just past the last unit of the last file."""
        if not self.files:
            return 0, 0
        last = self.files[-1]
        pos = 0
        while (unit := self._unit_at(last, pos)) is not None:
            pos += unit.size
        return last.base, pos

    def put(self, unit: CqExtUnit) -> int | None:
        """Append a unit; its CQ address, or None if it cannot be stored (too big, address space
        exhausted), in which case the caller keeps the plain tag code (as Apache does)."""
        size = unit.size
        if size > _EXT_MAX_UNIT_SIZE:
            log.error("%s: ext unit of %d bytes exceeds %d", self.directory, size, _EXT_MAX_UNIT_SIZE)
            return None
        if size > self.file_size - _EXT_END_BLANK:
            log.error("%s: ext unit of %d bytes cannot fit a %d-byte file", self.directory, size, self.file_size)
            return None
        if not self._writing:
            self._start_writing()
        if self._base + self._pos + size > _EXT_MAX_REAL_OFFSET:
            log.warning("%s: ext address space exhausted", self.directory)
            return None
        if self._fd is None or size > self.file_size - self._pos - _EXT_END_BLANK:
            self._roll()
        os.pwrite(self._fd, unit.encode(), self._pos)
        address = ext_offset_to_address(self._base + self._pos)
        self._pos += size
        return address

    def _start_writing(self) -> None:
        self._writing = True
        base, pos = self._data_end()
        if self.files:
            self._open(self.files[-1].path, base, pos)

    def _open(self, path: Path, base: int, pos: int) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size != self.file_size:
            os.ftruncate(self._fd, self.file_size)
        self._base, self._pos = base, pos

    def _roll(self) -> None:
        """End the current file with the ``0xFFFF`` marker and start the next one."""
        base = 0
        if self._fd is not None:
            if self._pos + 2 <= self.file_size:
                os.pwrite(self._fd, _EXT_END, self._pos)
            base = self._base + self.file_size
            self.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / offset_to_file_name(base)
        self._open(path, base, 0)
        self.files.append(QueueFile(path, base, self.file_size))

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        """Close the file being written; a later :meth:`put` finds the end of data again."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._writing = False
