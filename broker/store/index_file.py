"""Hash index files ``<store>/index/<yyyyMMddHHmmssSSS>``: header, slots, entries (store-format.md 7).

Layout: a 40-byte header, ``maxHashSlotNum`` int slots, ``maxIndexNum`` 20-byte entries. A slot holds
the 1-based number of the newest entry whose key hash maps to it; each entry points to the previous
entry of the same slot, so a lookup walks a chain from newest to oldest. Only the 32-bit hash of
``topic#key`` is stored, never the key: results are candidates that the caller verifies against the
commitlog (:meth:`IndexService.query`).

Writing follows Apache's ``IndexFile.putKey``/``IndexService.buildIndex`` to the byte, so a rebuild
from a commitlog reproduces Apache's files (only the names, which are wall-clock times, differ).
Reading damaged files never raises: problems become findings, chain walks always terminate.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from broker.store import findings as fk
from broker.store.clock import now_ms
from broker.store.constants import (
    DEFAULT_MAX_HASH_SLOT_NUM,
    DEFAULT_MAX_INDEX_NUM,
    INDEX_DIR,
    INDEX_ENTRY_SIZE,
    INDEX_FILE_NAME_FORMAT,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_KEY_JOINER,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_TYPE_MASK,
    TRANSACTION_TYPE_NAMES,
    is_indexed,
)
from broker.store.consume_queue import RecordSource, to_arrow_table
from broker.store.dispatch_fields import index_key_hashes, put_index_entries
from broker.store.findings import Finding
from broker.store.java_hash import index_key_hash
from broker.store.message import MessageRecord, RecordError
from broker.store.properties import split_keys

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">qqqqii")
assert _HEADER.size == INDEX_HEADER_SIZE
_ENTRY = struct.Struct(">iqii")
assert _ENTRY.size == INDEX_ENTRY_SIZE
_SLOT = struct.Struct(">i")
_INT_MAX = (1 << 31) - 1
LONG_MAX = (1 << 63) - 1
INDEX_FILE_NAME_LENGTH = 17  # yyyyMMddHHmmssSSS

# One entry as stored, and what :meth:`IndexFile.entries` returns (native order, entry number added).
INDEX_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"),
                              ("prev_index", ">i4")])
ENTRIES_DTYPE = np.dtype([("entry", np.int32), ("key_hash", np.int32), ("phy_offset", np.int64),
                          ("time_diff", np.int32), ("prev_index", np.int32)])


def _java_div(a: int, b: int) -> int:
    """Java's long division (truncates toward zero; Python's // floors)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def index_file_size(max_hash_slot_num: int, max_index_num: int) -> int:
    """``40 + slots*4 + entries*20`` bytes."""
    return INDEX_HEADER_SIZE + max_hash_slot_num * INDEX_HASH_SLOT_SIZE + max_index_num * INDEX_ENTRY_SIZE


def infer_index_geometry(file_size: int) -> tuple[int, int] | None:
    """(maxHashSlotNum, maxIndexNum) of a file size, assuming Apache's ratio maxIndexNum = 4 × slots
    (the default 5e6/2e7, and the golden 128/512); None if the size does not fit that ratio.
    Any other geometry must be passed explicitly: a size alone cannot tell the two numbers apart."""
    body = file_size - INDEX_HEADER_SIZE
    per_slot = INDEX_HASH_SLOT_SIZE + 4 * INDEX_ENTRY_SIZE
    if body <= 0 or body % per_slot:
        return None
    slots = body // per_slot
    return slots, 4 * slots


def _existing_geometry(directory: Path) -> tuple[int, int] | None:
    """Geometry of the first index file in ``directory`` whose size fits Apache's 1:4 ratio."""
    if not directory.is_dir():
        return None
    for p in sorted(directory.iterdir()):
        if p.is_file() and parse_index_file_name(p.name) is not None:
            geometry = infer_index_geometry(p.stat().st_size)
            if geometry:
                return geometry
    return None


def build_index_key(topic: str, key: str) -> str:
    """The string that is hashed: ``topic#key`` with the stored topic."""
    return f"{topic}{INDEX_KEY_JOINER}{key}"


def index_file_name(epoch_ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` of a time in the local time zone (Apache's ``timeMillisToHumanString``)."""
    seconds, millis = divmod(epoch_ms, 1000)
    return datetime.fromtimestamp(seconds).strftime(INDEX_FILE_NAME_FORMAT) + f"{millis:03d}"


def parse_index_file_name(name: str) -> int | None:
    """Epoch ms of an index file name (local time), None if it is not one."""
    if len(name) != INDEX_FILE_NAME_LENGTH or not (name.isascii() and name.isdigit()):
        return None
    try:
        dt = datetime.strptime(name[:14], INDEX_FILE_NAME_FORMAT)
    except ValueError:
        return None
    return int(dt.timestamp()) * 1000 + int(name[14:])


# ---- header ---------------------------------------------------------------------------------------------

@dataclass(slots=True)
class IndexHeader:
    """The 40-byte header. ``index_count`` is the next entry number (entries start at 1)."""

    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    def encode(self) -> bytes:
        return _HEADER.pack(self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                            self.end_phy_offset, self.hash_slot_count, self.index_count)

    @classmethod
    def decode(cls, data: bytes | memoryview | mmap.mmap) -> "IndexHeader":
        """The header as stored (a never-flushed new file has ``index_count`` 0 on disk; see
        :meth:`IndexFile.open` for the ``<= 0 → 1`` rule)."""
        return cls(*_HEADER.unpack_from(data, 0))


# ---- one file ---------------------------------------------------------------------------------------------

class IndexFile:
    """One index file, mapped. Open existing files with :meth:`open`, make new ones with :meth:`create`."""

    def __init__(self, path: Path, max_hash_slot_num: int, max_index_num: int, buf: mmap.mmap | bytearray,
                 header: IndexHeader, writable: bool, findings: list[Finding] | None = None) -> None:
        self.path = path
        self.max_hash_slot_num = max_hash_slot_num
        self.max_index_num = max_index_num
        self._buf = buf
        self.header = header
        self.writable = writable
        self.findings: list[Finding] = findings if findings is not None else []
        self._entries_at = INDEX_HEADER_SIZE + max_hash_slot_num * INDEX_HASH_SLOT_SIZE

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def file_size(self) -> int:
        return index_file_size(self.max_hash_slot_num, self.max_index_num)

    # ---- opening -------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, max_hash_slot_num: int | None = None, max_index_num: int | None = None,
             writable: bool = False) -> "IndexFile":
        """Map an existing file. Without a geometry it is inferred from the length
        (:func:`infer_index_geometry`), else Apache's defaults are assumed. A length that does not
        match, or a header that cannot be right, is reported in ``findings`` and clamped so that
        every later read stays inside the file."""
        path = Path(path)
        findings: list[Finding] = []
        actual = path.stat().st_size
        if max_hash_slot_num is None or max_index_num is None:
            guess = infer_index_geometry(actual) or (DEFAULT_MAX_HASH_SLOT_NUM, DEFAULT_MAX_INDEX_NUM)
            max_hash_slot_num = max_hash_slot_num or guess[0]
            max_index_num = max_index_num or guess[1]
        size = index_file_size(max_hash_slot_num, max_index_num)
        if actual != size:
            findings.append(Finding(str(path), 0, fk.WRONG_FILE_SIZE,
                                    f"file is {actual} bytes, {max_hash_slot_num} slots and {max_index_num} "
                                    f"entries need {size}"))
        buf = cls._map(path, size, actual, writable)
        header = IndexHeader.decode(buf)
        cls._sanitise(header, path, max_hash_slot_num, max_index_num, findings)
        return cls(path, max_hash_slot_num, max_index_num, buf, header, writable, findings)

    @staticmethod
    def _map(path: Path, size: int, actual: int, writable: bool) -> mmap.mmap | bytearray:
        """A map of exactly ``size`` bytes; a file of another length is read into a zero-padded copy
        (only when reading: a writer refuses it, as Apache's store refuses to load it)."""
        if actual == size and size:
            with open(path, "r+b" if writable else "rb") as fh:
                return mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        if writable:
            raise ValueError(f"{path}: {actual} bytes, expected {size}; not writing to it")
        with open(path, "rb") as fh:
            data = fh.read(size)
        out = bytearray(size)
        out[: len(data)] = data
        return out

    @staticmethod
    def _sanitise(header: IndexHeader, path: Path, slots: int, num: int, findings: list[Finding]) -> None:
        """Apache's load rule (``indexCount <= 0`` means 1) plus bounds a corrupt header cannot pass."""
        if header.index_count <= 0:
            header.index_count = 1
        if header.index_count > num:
            findings.append(Finding(str(path), 36, fk.INDEX_BAD_HEADER,
                                    f"indexCount {header.index_count} exceeds maxIndexNum {num}; clamped"))
            header.index_count = num
        if not 0 <= header.hash_slot_count <= slots:
            findings.append(Finding(str(path), 32, fk.INDEX_BAD_HEADER,
                                    f"hashSlotCount {header.hash_slot_count} is not in [0, {slots}]"))
        if header.end_timestamp < header.begin_timestamp or header.end_phy_offset < header.begin_phy_offset:
            findings.append(Finding(str(path), 0, fk.INDEX_BAD_HEADER,
                                    f"end ({header.end_timestamp} ms, offset {header.end_phy_offset}) is before "
                                    f"begin ({header.begin_timestamp} ms, offset {header.begin_phy_offset})"))

    @classmethod
    def create(cls, path: str | os.PathLike, max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM,
               max_index_num: int = DEFAULT_MAX_INDEX_NUM, end_phy_offset: int = 0,
               end_timestamp: int = 0) -> "IndexFile":
        """A new pre-sized, zero-filled file seeded with the previous file's end (begin = end =
        ``end_phy_offset``/``end_timestamp``; 0/0 for the first file). As in Apache only the seeded
        fields reach the disk now; the counters are written by the first put or by :meth:`flush`."""
        if max_hash_slot_num < 1 or max_index_num < 2:
            raise ValueError("an index file needs at least 1 slot and 2 entries (entry 0 is never used)")
        path = Path(path)
        size = index_file_size(max_hash_slot_num, max_index_num)
        with open(path, "x+b") as fh:
            fh.truncate(size)
            buf = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_WRITE)
        header = IndexHeader()
        if end_phy_offset > 0:
            header.begin_phy_offset = header.end_phy_offset = end_phy_offset
        if end_timestamp > 0:
            header.begin_timestamp = header.end_timestamp = end_timestamp
        on_disk = IndexHeader(header.begin_timestamp, header.end_timestamp, header.begin_phy_offset,
                              header.end_phy_offset, 0, 0)
        buf[:INDEX_HEADER_SIZE] = on_disk.encode()
        return cls(path, max_hash_slot_num, max_index_num, buf, header, True)

    # ---- writing -----------------------------------------------------------------------------------
    @property
    def is_full(self) -> bool:
        """Capacity is ``maxIndexNum - 1`` entries because entry 0 is never used."""
        return self.header.index_count >= self.max_index_num

    def _slot_pos(self, key_hash: int) -> int:
        return INDEX_HEADER_SIZE + (key_hash % self.max_hash_slot_num) * INDEX_HASH_SLOT_SIZE

    def _entry_pos(self, number: int) -> int:
        return self._entries_at + number * INDEX_ENTRY_SIZE

    def _slot_value(self, key_hash: int) -> int:
        """The slot's entry number, 0 when empty or out of range (then it is treated as empty)."""
        (value,) = _SLOT.unpack_from(self._buf, self._slot_pos(key_hash))
        return value if 0 < value <= self.header.index_count else 0

    def _chain_head(self, key_hash: int) -> int:
        """The entry a new put with this hash links back to (its ``prevIndex``).

        Normally the slot's value. A put writes its entry, then the slot, then the header; a process
        killed between the slot and the header leaves the slot pointing at entry ``indexCount``,
        which the header does not count. The next put is written over that very entry, so linking to
        it would make a self-loop and cut every older entry of the chain off the queries; the chain
        goes on from that entry's own ``prevIndex`` instead (the entry was complete before the slot
        was written)."""
        (value,) = _SLOT.unpack_from(self._buf, self._slot_pos(key_hash))
        count = self.header.index_count
        if value == count:
            value = _ENTRY.unpack_from(self._buf, self._entry_pos(value))[3]
        return value if 0 < value < count else 0

    def put_key(self, index_key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Add one entry (``IndexFile.putKey``); False when the file is full.

        timeDiff is in seconds relative to the header's begin time *before* this put updates the
        header, so the first entry of a later file is relative to the seed (the previous file's end
        time); 0 if there is no begin time yet, clamped to [0, Integer.MAX_VALUE].
        """
        if not self.writable:
            raise ValueError(f"{self.path} is open read-only")
        header = self.header
        if self.is_full:
            return False
        key_hash = index_key_hash(index_key)
        prev = self._chain_head(key_hash)
        diff = _java_div(store_timestamp - header.begin_timestamp, 1000)
        if header.begin_timestamp <= 0:
            diff = 0
        diff = min(max(diff, 0), _INT_MAX)
        number = header.index_count
        _ENTRY.pack_into(self._buf, self._entry_pos(number), key_hash, phy_offset, diff, prev)
        _SLOT.pack_into(self._buf, self._slot_pos(key_hash), number)
        if number <= 1:
            header.begin_phy_offset = phy_offset
            header.begin_timestamp = store_timestamp
        if prev == 0:
            header.hash_slot_count += 1
        header.index_count += 1
        header.end_phy_offset = phy_offset
        header.end_timestamp = store_timestamp
        self._buf[:INDEX_HEADER_SIZE] = header.encode()
        return True

    def flush(self) -> None:
        """Write the whole header (Apache's ``updateByteBuffer``) and sync the map."""
        if self.writable and isinstance(self._buf, mmap.mmap):
            self._buf[:INDEX_HEADER_SIZE] = self.header.encode()
            self._buf.flush()

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap) and not self._buf.closed:
            self.flush()
            self._buf.close()

    # ---- reading -----------------------------------------------------------------------------------
    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """Whether ``[begin_ms, end_ms]`` overlaps the file's ``[begin, end]`` (``isTimeMatched``)."""
        b, e = self.header.begin_timestamp, self.header.end_timestamp
        return (begin_ms < b and end_ms > e) or b <= begin_ms <= e or b <= end_ms <= e

    def select_phy_offsets(self, key_hash: int, begin_ms: int, end_ms: int, max_num: int | None = None) -> list[int]:
        """Commitlog offsets of the entries with this hash and a time in ``[begin_ms, end_ms]``,
        newest first (``selectPhyOffset``), at most ``max_num``.

        The walk stops at the end of the chain (prevIndex <= 0 or > indexCount), at an entry older
        than ``begin_ms``, or at a negative timeDiff, as in Apache; and also when a prevIndex does
        not point backwards (Apache only catches a self-loop, so a forward pointer in a corrupt file
        would loop forever there) — reported as ``index_bad_chain``.
        """
        out: list[int] = []
        count = self.header.index_count
        current = self._slot_value(key_hash)
        if current == 0 or count <= 1:
            return out
        while max_num is None or len(out) < max_num:
            kh, phy, diff, prev = _ENTRY.unpack_from(self._buf, self._entry_pos(current))
            if diff < 0:
                break
            when = self.header.begin_timestamp + diff * 1000
            if kh == key_hash and begin_ms <= when <= end_ms:
                out.append(phy)
            if prev <= 0 or prev > count or prev == current or when < begin_ms:
                break
            if prev > current:
                self.findings.append(Finding(str(self.path), self._entry_pos(current) + 16, fk.INDEX_BAD_CHAIN,
                                             f"entry {current} points forward to {prev}; chain walk stopped"))
                break
            current = prev
        return out

    def entries(self) -> np.ndarray:
        """Every written entry (numbers 1 … indexCount-1) as an :data:`ENTRIES_DTYPE` array, copied
        out of the map in one vectorised read."""
        n = max(self.header.index_count - 1, 0)
        start = self._entry_pos(1)
        raw = np.frombuffer(self._buf, INDEX_ENTRY_DTYPE, count=n, offset=start)
        out = np.empty(n, ENTRIES_DTYPE)
        out["entry"] = np.arange(1, n + 1, dtype=np.int32)
        for name in INDEX_ENTRY_DTYPE.names:
            out[name] = raw[name]
        del raw  # release the export of the map before anyone closes it
        return out

    def entries_table(self) -> pa.Table:
        """:meth:`entries` as a pyarrow Table (what the Spark job ingests as ``index_entries``)."""
        return to_arrow_table(self.entries())

    def slots(self) -> np.ndarray:
        """All hash slots (int32, native order); 0 = empty."""
        raw = np.frombuffer(self._buf, ">i4", count=self.max_hash_slot_num, offset=INDEX_HEADER_SIZE)
        out = raw.astype(np.int32)
        del raw
        return out


# ---- the service ------------------------------------------------------------------------------------------

def _transaction_bits(transaction_type: str | int) -> int:
    """A transaction type given as a name (``"NOT"`` …) or as sysFlag bits (any int; masked)."""
    if isinstance(transaction_type, str):
        try:
            return TRANSACTION_TYPE_NAMES.index(transaction_type.upper()) << 2
        except ValueError:
            raise ValueError(f"unknown transaction type {transaction_type!r}") from None
    return transaction_type & TRANSACTION_TYPE_MASK


class IndexService:
    """The index files of a store (``<store>/index``): build like Apache's ``IndexService``, query.

    Existing files are loaded sorted by name (= creation time) and mapped read-only; the last one is
    remapped writable only when something is indexed. ``clock`` returns epoch ms and names new files.
    """

    def __init__(self, store_dir: str | os.PathLike, max_hash_slot_num: int | None = None,
                 max_index_num: int | None = None, *, clock: Callable[[], int] | None = None) -> None:
        if max_hash_slot_num is None or max_index_num is None:
            # Read the geometry off existing files (a store written with non-default settings must
            # still open); a new store gets Apache's defaults.
            geometry = _existing_geometry(Path(store_dir) / INDEX_DIR)
            max_hash_slot_num = max_hash_slot_num or (geometry[0] if geometry else DEFAULT_MAX_HASH_SLOT_NUM)
            max_index_num = max_index_num or (geometry[1] if geometry else DEFAULT_MAX_INDEX_NUM)
        if max_hash_slot_num < 1 or max_index_num < 2:
            raise ValueError("an index file needs at least 1 slot and 2 entries (entry 0 is never used)")
        self.directory = Path(store_dir) / INDEX_DIR
        self.max_hash_slot_num = max_hash_slot_num
        self.max_index_num = max_index_num
        self.clock = clock or now_ms
        self.findings: list[Finding] = []
        self.files: list[IndexFile] = self._load()

    def _load(self) -> list[IndexFile]:
        if not self.directory.is_dir():
            return []
        files = []
        for p in sorted(self.directory.iterdir()):
            if not p.is_file():
                continue
            if parse_index_file_name(p.name) is None:
                self.findings.append(Finding(str(p), 0, fk.BAD_FILE_NAME,
                                             "not a yyyyMMddHHmmssSSS index file name; ignored"))
                continue
            f = IndexFile.open(p, self.max_hash_slot_num, self.max_index_num)
            self.findings.extend(f.findings)
            f.findings = self.findings  # chain-walk findings go to the service's list too
            files.append(f)
        return files

    # ---- building ----------------------------------------------------------------------------------
    def _writable_last(self) -> IndexFile:
        """The file new keys go to: the last one (remapped writable), or a new one if full or none."""
        if not self.files or self.files[-1].is_full:
            return self._new_file()
        last = self.files[-1]
        if not last.writable:
            last.close()
            reopened = IndexFile.open(last.path, self.max_hash_slot_num, self.max_index_num, writable=True)
            reopened.findings = self.findings
            self.files[-1] = last = reopened
        return last

    def _new_file_name(self) -> str:
        """A name for a new file: now, in local time, to the millisecond.

        Two files created in the same millisecond would get the same name, and Apache would then
        map the existing file and write over it; the loader also orders files by name. So the name
        is moved on by 1 ms while it exists, and never goes below the newest file's time + 1 ms
        (a clock stepping back must not sort a new file before older ones).
        """
        now = self.clock()
        if self.files:
            newest = parse_index_file_name(self.files[-1].name)
            if newest is not None:
                now = max(now, newest + 1)
        name = index_file_name(now)
        while (self.directory / name).exists():
            now += 1
            name = index_file_name(now)
        return name

    def _new_file(self) -> IndexFile:
        """Create the next file, seeded with the previous file's end, and flush the previous one."""
        end_phy, end_ts = 0, 0
        if self.files:
            prev = self.files[-1]
            end_phy, end_ts = prev.header.end_phy_offset, prev.header.end_timestamp
            prev.flush()
        self.directory.mkdir(parents=True, exist_ok=True)
        f = IndexFile.create(self.directory / self._new_file_name(), self.max_hash_slot_num,
                             self.max_index_num, end_phy, end_ts)
        f.findings = self.findings
        self.files.append(f)
        log.debug("new index file %s", f.path)
        return f

    def _put(self, f: IndexFile, index_key: str, phy_offset: int, store_timestamp: int) -> IndexFile:
        while not f.put_key(index_key, phy_offset, store_timestamp):
            log.info("index file %s is full, creating another one", f.name)
            f = self._new_file()
        return f

    def build_index(self, topic: str, keys: str | Iterable[str] | None, uniq_key: str | None, phy_offset: int,
                    store_timestamp: int, transaction_type: str | int = "NOT") -> int:
        """Index one dispatched message (``buildIndex``); returns the number of entries written.

        ROLLBACK records are not indexed; a message below the current file's endPhyOffset is taken
        as already indexed (re-dispatch). Then ``UNIQ_KEY`` (if not None), then each non-empty token
        of ``keys`` (the KEYS string split on spaces, or the tokens themselves), each as
        ``topic#key``; duplicates are indexed twice. A full file rolls to a new one mid-message.
        ``transaction_type`` is a name (``"NOT"``, ``"PREPARED"``, ``"COMMIT"``, ``"ROLLBACK"``) or
        sysFlag bits.
        """
        if not is_indexed(_transaction_bits(transaction_type)):
            return 0
        f = self._writable_last()
        if phy_offset < f.header.end_phy_offset:
            return 0
        tokens = split_keys(keys) if isinstance(keys, str) or keys is None else [k for k in keys if k]
        written = 0
        if uniq_key is not None:
            f = self._put(f, build_index_key(topic, uniq_key), phy_offset, store_timestamp)
            written += 1
        for key in tokens:
            f = self._put(f, build_index_key(topic, key), phy_offset, store_timestamp)
            written += 1
        return written

    def dispatch_rows(self, phy: np.ndarray, store_ts: np.ndarray, key_first: np.ndarray, key_count: np.ndarray,
                      java_hashes: np.ndarray) -> np.ndarray:
        """:meth:`build_index` for many indexed records at once (commitlog order); which records got
        an entry. Record ``i``'s keys are the ``topic#key`` Java hashes
        ``java_hashes[key_first[i]:key_first[i] + key_count[i]]`` (UNIQ_KEY first, then each KEYS
        token: :func:`~broker.store.dispatch_fields.scan_run`). The entries are written by the
        compiled twin of :meth:`IndexFile.put_key`; a full file rolls here, as in :meth:`_put`."""
        n = len(phy)
        wrote = np.zeros(n, np.bool_)
        hashes = index_key_hashes(java_hashes)
        rec, key = 0, 0
        while rec < n:
            f = self._writable_last()
            h = f.header
            header = np.array([h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset,
                               h.hash_slot_count, h.index_count], np.int64)
            buf = np.frombuffer(f._buf, np.uint8)
            try:
                rec, key = put_index_entries(buf, header, f.max_hash_slot_num, f.max_index_num, f._entries_at,
                                             phy, store_ts, key_first, key_count, hashes, wrote, rec, key,
                                             key == 0)
            finally:
                del buf  # an exported map cannot be closed
                (h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset, h.hash_slot_count,
                 h.index_count) = (int(v) for v in header)
            if rec < n and key:
                log.info("index file %s is full, creating another one", f.name)
        return wrote

    def complete_record(self, record: MessageRecord) -> int:
        """Write the entries of ``record`` that are missing; returns how many were written.

        For the last indexed record after a crash: the process may have died between two of its
        puts (UNIQ_KEY written, a KEYS token not), and the dispatcher's "at or below the last
        indexed offset" rule would then skip the record for good. Entries go in a fixed order
        (UNIQ_KEY, then each KEYS token), so the ones on disk are a prefix of that order; counted
        over the last two files, as a full file rolls over mid-record."""
        if not is_indexed(record.sys_flag):
            return 0
        props = record.properties
        uniq = props.get(PROPERTY_UNIQ_KEY)
        expected = ([uniq] if uniq is not None else []) + split_keys(props.get(PROPERTY_KEYS))
        have = sum(int(np.count_nonzero(f.entries()["phy_offset"] == record.physical_offset))
                   for f in self.files[-2:])
        missing = expected[have:]
        if not missing:
            return 0
        f = self._writable_last()
        for key in missing:
            f = self._put(f, build_index_key(record.topic, key), record.physical_offset, record.store_timestamp)
        log.warning("index: completed the last indexed record at %d (%d of %d entries were missing)",
                    record.physical_offset, len(missing), len(expected))
        return len(missing)

    def dispatch(self, record: MessageRecord) -> int:
        """:meth:`build_index` for a commitlog record (stored topic, KEYS, UNIQ_KEY, sysFlag)."""
        props = record.properties
        return self.build_index(record.topic, props.get(PROPERTY_KEYS), props.get(PROPERTY_UNIQ_KEY),
                                record.physical_offset, record.store_timestamp, record.sys_flag)

    # ---- querying ----------------------------------------------------------------------------------
    def query_offsets(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = LONG_MAX,
                      max_num: int | None = None) -> list[int]:
        """Hash-matched commitlog offsets for ``topic#key``, sorted ascending (``queryOffset`` +
        the sort in ``queryMessage``).

        Files are visited newest first; a file is searched when its time range overlaps the query;
        the walk stops after a file that begins before ``begin_ms`` or once ``max_num`` offsets were
        found (so a cap keeps the newest). Apache caps ``max_num`` at 64 (``maxMsgsNumBatch``);
        here None means no cap. Offsets of other keys with the same hash are included.
        """
        key_hash = index_key_hash(build_index_key(topic, key))
        found: list[int] = []
        for f in reversed(self.files):
            if f.is_time_matched(begin_ms, end_ms):
                left = None if max_num is None else max_num - len(found)
                found += f.select_phy_offsets(key_hash, begin_ms, end_ms, left)
            if f.header.begin_timestamp < begin_ms:
                break
            if max_num is not None and len(found) >= max_num:
                break
        return sorted(found)

    def query(self, topic: str, key: str, begin_ms: int, end_ms: int, commitlog: RecordSource,
              max_num: int | None = None) -> list[int]:
        """:meth:`query_offsets` keeping only records that really carry the key: same stored topic
        and the key is a KEYS token or the UNIQ_KEY. Unreadable offsets are dropped with a warning.
        The time filter is the index's (second resolution), as in Apache."""
        out = []
        for offset in self.query_offsets(topic, key, begin_ms, end_ms, max_num):
            try:
                rec = commitlog.read_record(offset)
            except (RecordError, OSError) as exc:
                log.warning("index points at unreadable commitlog offset %d: %s", offset, exc)
                continue
            if isinstance(rec, MessageRecord) and rec.topic == topic and (rec.uniq_key == key or key in rec.keys):
                out.append(offset)
        return out

    def iter_entries(self) -> Iterator[tuple[str, np.ndarray]]:
        """``(file name, entries)`` per file, oldest first."""
        for f in self.files:
            yield f.name, f.entries()

    def entries_table(self) -> pa.Table:
        """Every entry of every file as one pyarrow Table with a ``file`` column."""
        tables = []
        for name, rows in self.iter_entries():
            t = to_arrow_table(rows)
            tables.append(t.add_column(0, "file", pa.array([name] * len(rows), pa.string())))
        if not tables:
            empty = to_arrow_table(np.empty(0, ENTRIES_DTYPE))
            return empty.add_column(0, "file", pa.array([], pa.string()))
        return pa.concat_tables(tables)

    def flush(self) -> None:
        for f in self.files:
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self) -> "IndexService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
