"""A broker store read through a filesystem: a local directory or a URI, given as a :class:`Location`.

What the ingest needs of a store, answered with listings and ranged reads instead of local paths:

* listings (one per directory; consume queues in one recursive listing): the commitlog segments with
  their sizes, the consume queue files of every queue, the index files;
* the commitlog's file-level findings (names that are not offsets, wrong lengths, gaps), by the same
  rules as :func:`broker.store.commitlog.list_segments`;
* ``dispatched_end`` (how far the consume queues reach into the commitlog): the store's one queue
  reader (:class:`FsQueueFiles`, a :class:`broker.store.consume_queue.QueueFiles` over ranged reads)
  finds each queue's last written unit by binary search, about 20 reads of 20 bytes per queue,
  instead of reading every queue file;
* the units of one consume queue (:class:`FsConsumeQueue`: each file read whole with one request
  through the same reader, parsed by :class:`broker.store.consume_queue.ConsumeQueue`'s own rules);
* the entries of one index file (:func:`iter_index_entries`: the 40-byte header, then the entries in
  bounded ranged reads; the hash slots are never read).

Every file is named by its location's URI (an absolute path for a local store), which is how
findings and the ``corrupt_records`` table name files, so a store and its copy on S3 differ only in
that root. Nothing here copies a file to a temporary directory. The commitlog itself is read by
byte range in :mod:`pipelines.commitlog_ranges`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from broker.store import findings as fk
from broker.store.commitlog import infer_segment_size, offset_to_file_name
from broker.store.constants import (
    COMMITLOG_DIR,
    CONSUME_QUEUE_DIR,
    CONSUME_QUEUE_EXT_DIR,
    CQ_STORE_UNIT_SIZE,
    DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE,
    DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE_EXT,
    DEFAULT_MAX_HASH_SLOT_NUM,
    DEFAULT_MAX_INDEX_NUM,
    FILE_NAME_DIGITS,
    INDEX_DIR,
    INDEX_ENTRY_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
)
from broker.store.consume_queue import (
    ConsumeQueue,
    ConsumeQueueExt,
    QueueFile,
    QueueFiles,
    _infer_file_size,
)
from broker.store.findings import Finding
from broker.store.index_file import (
    INDEX_ENTRY_DTYPE,
    IndexFile,
    IndexHeader,
    infer_index_geometry,
    parse_index_file_name,
)
from pipelines.storage import Location, StorageError, as_location

INDEX_BATCH_ENTRIES = 1 << 20  # entries per ranged read of an index file (20 MiB)
_QUEUE_THREADS = 16  # concurrent queue probes on a remote store (latency, not CPU, bound)


@dataclass(frozen=True)
class StoreFile:
    """One file of the store: its name, the offset a 20-digit name encodes (-1 otherwise), its size."""

    name: str
    base: int
    size: int


@dataclass(frozen=True)
class _Entry:
    """A listed entry: path parts under the listed directory, kind, size."""

    rel: tuple[str, ...]
    is_file: bool
    is_dir: bool
    size: int


def _is_offset_name(name: str) -> bool:
    return len(name) == FILE_NAME_DIGITS and name.isdigit()


def read_padded(location: Location, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset``; what lies past the end of the file reads as zeros (a short
    file reads like a pre-sized, zero-filled mapped file, as the local readers treat it)."""
    data = location.read_range(offset, length) if length > 0 else b""
    return data if len(data) == length else data + bytes(length - len(data))


class StoreFiles:
    """The files of one store behind a :class:`Location` (listings are cached: one per directory)."""

    def __init__(self, store: "str | os.PathLike | Location") -> None:
        self.location = as_location(store)
        self._listings: dict[tuple[str, bool], list[_Entry]] = {}  # plain values: a StoreFiles pickles

    # ---- names -----------------------------------------------------------------------------------------
    def file(self, *parts: str) -> Location:
        """``<store>/<parts>`` (same storage options)."""
        return self.location.child(*parts)

    def label(self, *parts: str) -> str:
        """How findings and tables name ``<store>/<parts>``: its URI, or its absolute local path."""
        return self.file(*parts).uri

    # ---- listings --------------------------------------------------------------------------------------
    def _list(self, sub: str, recursive: bool = False) -> list[_Entry]:
        """Entries under ``<store>/<sub>`` with their path parts relative to it ([] when absent)."""
        key = (sub, recursive)
        if key not in self._listings:
            where = self.file(sub)
            _, root = where.filesystem()
            root = root.rstrip("/")
            try:
                infos = where.list(recursive=recursive)
            except OSError as exc:
                raise StorageError(f"{where.uri}: cannot list ({' '.join(str(exc).split())})") from exc
            out = []
            for info in infos:
                rel = info.path[len(root) + 1:] if info.path.startswith(root + "/") else info.base_name
                out.append(_Entry(tuple(p for p in rel.split("/") if p), info.type == pafs.FileType.File,
                                  info.type == pafs.FileType.Directory, int(info.size or 0)))
            self._listings[key] = out
        return self._listings[key]

    def commitlog_segments(self) -> list[StoreFile]:
        """The commitlog files (20-digit names) in offset order. Raises :class:`StorageError` when
        there is none: a store location without a commitlog is a wrong location, not an empty store."""
        segs = [StoreFile(e.rel[0], int(e.rel[0]), e.size) for e in self._list(COMMITLOG_DIR)
                if len(e.rel) == 1 and e.is_file and _is_offset_name(e.rel[0])]
        if not segs:
            raise StorageError(f"{self.location.uri} lists no commitlog segment ({COMMITLOG_DIR}/ holds no "
                               "20-digit file): not a broker store, or not reachable with these storage options")
        return sorted(segs, key=lambda s: s.base)

    def segment_size(self, override: int | None = None) -> int:
        """The configured commitlog file size (read off the files unless given)."""
        return override or infer_segment_size(self.commitlog_segments())  # type: ignore[arg-type]

    def commitlog_findings(self, segment_size: int | None = None) -> list[Finding]:
        """File-level findings of ``commitlog/``: names that are not offsets, wrong lengths, gaps
        (the rules of :func:`broker.store.commitlog.list_segments`, files named by :meth:`label`)."""
        found: list[Finding] = []
        for e in sorted(self._list(COMMITLOG_DIR), key=lambda e: e.rel):
            if len(e.rel) == 1 and e.is_file and not _is_offset_name(e.rel[0]):
                found.append(Finding(self.label(COMMITLOG_DIR, e.rel[0]), 0, fk.BAD_FILE_NAME,
                                     "not a 20-digit commitlog file name; ignored"))
        segs = self.commitlog_segments()
        expected = self.segment_size(segment_size)
        for i, seg in enumerate(segs):
            name = self.label(COMMITLOG_DIR, seg.name)
            if seg.size != expected:
                found.append(Finding(name, 0, fk.WRONG_FILE_SIZE, f"file is {seg.size} bytes, segment size is {expected}"))
            if i and seg.base != segs[i - 1].base + expected:
                found.append(Finding(name, 0, fk.FILE_GAP,
                                     f"starts at {seg.base}, previous file ends at {segs[i - 1].base + expected}"))
        return found

    def queue_files(self, kind: str = CONSUME_QUEUE_DIR) -> dict[tuple[str, int], list[StoreFile]]:
        """``(topic, queueId)`` → its files (20-digit names, in order), from one recursive listing of
        ``<store>/<kind>``; a queue directory without files maps to []. Queue directories must be
        decimal numbers (as :func:`broker.store.consume_queue.list_queues` requires)."""
        out: dict[tuple[str, int], list[StoreFile]] = {}
        for e in self._list(kind, recursive=True):
            rel = e.rel
            if len(rel) < 2 or not (rel[1].isascii() and rel[1].isdigit()):
                continue
            key = (rel[0], int(rel[1]))
            if len(rel) == 2 and e.is_dir:
                out.setdefault(key, [])
            elif len(rel) == 3 and e.is_file and _is_offset_name(rel[2]):
                out.setdefault(key, []).append(StoreFile(rel[2], int(rel[2]), e.size))
        for files in out.values():
            files.sort(key=lambda f: f.base)
        return dict(sorted(out.items()))

    def index_files(self) -> list[StoreFile]:
        """The index files (``yyyyMMddHHmmssSSS`` names) in name order (= creation order)."""
        return sorted((StoreFile(e.rel[0], -1, e.size) for e in self._list(INDEX_DIR)
                       if len(e.rel) == 1 and e.is_file and parse_index_file_name(e.rel[0]) is not None),
                      key=lambda f: f.name)

    def index_geometry(self) -> tuple[int, int]:
        """(maxHashSlotNum, maxIndexNum) of the store's index files, as
        :class:`broker.store.index_file.IndexService` reads it: the first file whose size fits
        Apache's 1:4 ratio, else Apache's defaults."""
        for f in self.index_files():
            geometry = infer_index_geometry(f.size)
            if geometry:
                return geometry
        return DEFAULT_MAX_HASH_SLOT_NUM, DEFAULT_MAX_INDEX_NUM

    def read_file(self, *parts: str) -> bytes | None:
        """A whole (small) file, e.g. ``read_file("config", "topics.json")``; None when absent."""
        try:
            return self.file(*parts).read_bytes()
        except FileNotFoundError:
            return None

    # ---- consume queues --------------------------------------------------------------------------------
    def queue_file_size(self, files: list[StoreFile]) -> int:
        """The queue's ``mappedFileSizeConsumeQueue`` read off its files (ConsumeQueue's rule)."""
        qfiles = [QueueFile(f.name, f.base, f.size) for f in files if f.base % CQ_STORE_UNIT_SIZE == 0]  # type: ignore[arg-type]
        return _infer_file_size(qfiles, DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE, CQ_STORE_UNIT_SIZE)

    def consume_queue(self, topic: str, queue_id: int, files: list[StoreFile], *,
                      commitlog_min_offset: int = 0) -> ConsumeQueue:
        """A reader of one queue: :class:`ConsumeQueue` itself for a local store, :class:`FsConsumeQueue`
        (same rules, files read through the filesystem) for a remote one."""
        if self.location.is_local:
            return ConsumeQueue(self.location.uri, topic, queue_id, commitlog_min_offset=commitlog_min_offset)
        return FsConsumeQueue(self, topic, queue_id, files, commitlog_min_offset=commitlog_min_offset)

    def queue_reader(self, topic: str, queue_id: int, files: list[StoreFile]) -> "FsQueueFiles":
        """The store's one consume-queue reader over this queue's files, read through the filesystem."""
        return FsQueueFiles(self, topic, queue_id, files, self.queue_file_size(files))

    def queue_reach(self, topic: str, queue_id: int, files: list[StoreFile]) -> int:
        """``phy + size`` of the queue's last real unit (-1 for none), like
        :attr:`ConsumeQueue.max_physic_offset`: :meth:`QueueFiles.reach`'s binary search over ranged
        20-byte reads of the last written file."""
        reader = self.queue_reader(topic, queue_id, files)
        try:
            return reader.reach()
        finally:
            reader.close()

    def dispatched_end(self) -> int:
        """How far the consume queues reach into the commitlog (the broker's dispatch progress):
        the largest :meth:`queue_reach` of any queue, 0 when there is none."""
        queues = [(t, q, files) for (t, q), files in self.queue_files().items() if files]
        if not queues:
            return 0
        if self.location.is_local or len(queues) == 1:
            reaches = [self.queue_reach(t, q, files) for t, q, files in queues]
        else:
            with ThreadPoolExecutor(min(_QUEUE_THREADS, len(queues)), thread_name_prefix="cq-reach") as pool:
                reaches = list(pool.map(lambda a: self.queue_reach(*a), queues))
        return max(0, *reaches)

    # ---- index files -----------------------------------------------------------------------------------
    def index_reach(self, name: str) -> int | None:
        """The commitlog offset of index file ``name``'s newest entry (its header's endPhyOffset), from
        one 40-byte ranged read; None when the header holds no entry or does not look like one."""
        header = IndexHeader.decode(read_padded(self.file(INDEX_DIR, name), 0, INDEX_HEADER_SIZE))
        if header.index_count <= 1 or header.begin_phy_offset > header.end_phy_offset:
            return None
        return header.end_phy_offset

    def iter_index_entries(self, name: str, geometry: tuple[int, int], *,
                           batch_entries: int = INDEX_BATCH_ENTRIES) -> Iterator[tuple[IndexHeader, np.ndarray]]:
        """The written entries (numbers 1 … indexCount-1) of index file ``name`` as big-endian
        :data:`INDEX_ENTRY_DTYPE` arrays of at most ``batch_entries`` rows, each with the file's header
        (sanitised as :meth:`IndexFile.open` does). The header and the entries are ranged reads."""
        slots, num = geometry
        loc = self.file(INDEX_DIR, name)
        header = IndexHeader.decode(read_padded(loc, 0, INDEX_HEADER_SIZE))
        IndexFile._sanitise(header, loc.uri, slots, num, [])  # noqa: SLF001 (Apache's load rule, one place)
        n = max(header.index_count - 1, 0)
        first = INDEX_HEADER_SIZE + slots * INDEX_HASH_SLOT_SIZE + INDEX_ENTRY_SIZE  # entry number 1
        for i in range(0, n, batch_entries):
            k = min(batch_entries, n - i)
            data = read_padded(loc, first + i * INDEX_ENTRY_SIZE, k * INDEX_ENTRY_SIZE)
            yield header, np.frombuffer(data, INDEX_ENTRY_DTYPE)


class FsQueueFiles(QueueFiles):
    """:class:`QueueFiles` (the store's one consume-queue reader) over a queue of a store behind a
    :class:`Location`: the files are the store's listing, a read is a ranged read, and findings
    name files by URI. The last file read stays open, so the ~20 reads of an end search cost one
    open (on object storage, one metadata request)."""

    def __init__(self, store: StoreFiles, topic: str, queue_id: int, files: list[StoreFile], file_size: int) -> None:
        self._store = store
        self._parts = (CONSUME_QUEUE_DIR, topic, str(queue_id))
        super().__init__(store.label(*self._parts), file_size)  # type: ignore[arg-type]
        self._bases = [f.base for f in files if f.base % CQ_STORE_UNIT_SIZE == 0]
        self._open: tuple[int, pa.NativeFile] | None = None

    def path_of(self, base: int) -> str:  # type: ignore[override]
        return self._store.label(*self._parts, offset_to_file_name(base))

    def bases(self) -> list[int]:
        return list(self._bases)

    def _read_at(self, base: int, pos: int, length: int) -> bytes | None:
        if self._open is None or self._open[0] != base:
            self.close()
            fs, path = self._store.file(*self._parts, offset_to_file_name(base)).filesystem()
            try:
                self._open = (base, fs.open_input_file(path))
            except FileNotFoundError:
                return None
        return self._open[1].read_at(length, pos)

    def close(self) -> None:
        """Close the file kept open (a read after this opens it again)."""
        if self._open is not None:
            self._open[1].close()
            self._open = None


class FsConsumeQueue(ConsumeQueue):
    """A consume queue of a remote store: :class:`ConsumeQueue`'s parsing (end of data, fill units,
    minimum offset, ext addresses) over its files read through :class:`FsQueueFiles`, each whole
    with one request (what the local reader reads too). Read-only."""

    def __init__(self, store: StoreFiles, topic: str, queue_id: int, files: list[StoreFile], *,
                 commitlog_min_offset: int = 0) -> None:
        self._store = store
        file_size = store.queue_file_size(files)
        # the store is a URI: the local directory ConsumeQueue looks for does not exist, so it lists
        # nothing; the files come from the store's listing instead
        super().__init__(store.location.uri, topic, queue_id, file_size, commitlog_min_offset=commitlog_min_offset)
        self.reader = FsQueueFiles(store, topic, queue_id, files, file_size)
        self.directory = self.reader.directory
        self.files = [QueueFile(self.reader.path_of(f.base), f.base, f.size)  # type: ignore[arg-type]
                      for f in files if f.base % CQ_STORE_UNIT_SIZE == 0]
        self._ext_files = store.queue_files(CONSUME_QUEUE_EXT_DIR).get((topic, queue_id))

    def refresh(self) -> None:
        self._chunks = None

    @property
    def ext(self) -> "ConsumeQueueExt | None":
        if self._ext is None and self._ext_files:
            self._ext = FsConsumeQueueExt(self._store, self.topic, self.queue_id, self._ext_files)
        return self._ext


class FsConsumeQueueExt(ConsumeQueueExt):
    """The ext units of a remote store's queue: :class:`ConsumeQueueExt` with ranged reads."""

    def __init__(self, store: StoreFiles, topic: str, queue_id: int, files: list[StoreFile]) -> None:
        self._store = store
        sizes = [QueueFile(f.name, f.base, f.size) for f in files]  # type: ignore[arg-type]
        file_size = _infer_file_size(sizes, DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE_EXT, 1)
        super().__init__(store.location.uri, topic, queue_id, file_size)
        self.directory = store.label(CONSUME_QUEUE_EXT_DIR, topic, str(queue_id))  # type: ignore[assignment]
        self.files = [QueueFile(store.label(CONSUME_QUEUE_EXT_DIR, topic, str(queue_id), f.name), f.base, f.size)  # type: ignore[arg-type]
                      for f in files]

    def _read_at(self, qf: QueueFile, pos: int, length: int) -> bytes:
        return read_padded(Location(str(qf.path), self._store.location.options), pos, length)
