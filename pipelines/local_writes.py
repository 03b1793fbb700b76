"""Local files written with direct I/O from a reused buffer, for the lake's data files.

Why: a write through the page cache copies every byte into a page the kernel has just allocated.
On this project's benchmark machine (a 2-core VM, where a page handed out again costs the host a
fault) that measured 1.4-2.9 system-CPU-s per GiB written, against 0.02 with ``O_DIRECT`` from a
buffer whose pages stay put: for the 16 GiB benchmark store's ~4.3 GB of Parquet, 6-12 of the
job's ~100 CPU-s. The files are read later by other processes (Spark, DuckDB, delta-rs), so the
page cache gains nothing from holding them.

How: :class:`DirectFile` is a writable file object (what ``pq.ParquetWriter`` takes): bytes are
copied into a page-aligned block (pooled per process, see :data:`BLOCK_BYTES`), and each full block
is written with ``O_DIRECT`` on a background thread while the file's other block fills (a direct
write waits for the disk; in the task's own thread that was 6-8 s of idle cores on the 16 GiB
store). At close, the last partial page goes through the page cache (``O_DIRECT`` needs whole
blocks). A filesystem that refuses ``O_DIRECT`` (tmpfs before Linux 6.6) or a
platform without it gets plain writes from the same buffers.
"""

from __future__ import annotations

import fcntl
import io
import mmap
import os
import threading
from concurrent.futures import Future

import pyarrow.fs as pafs

from pipelines.local_reads import ALIGN
from pipelines.process_thread import ProcessThread

BLOCK_BYTES = 4 * 1024 * 1024  # one direct write (a few ms at this disk's ~1.8 GB/s)
_O_DIRECT = getattr(os, "O_DIRECT", 0)

_POOL: list[mmap.mmap] = []
_POOL_LOCK = threading.Lock()
_POOL_SIZE = 8  # two per open file; a task writes a file per table partition it meets

_writes = ProcessThread("rocketlake-direct-write")  # this process's background block writes


def _acquire() -> mmap.mmap:
    with _POOL_LOCK:
        if _POOL:
            return _POOL.pop()
    return mmap.mmap(-1, BLOCK_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _release(block: mmap.mmap) -> None:
    with _POOL_LOCK:
        if len(_POOL) < _POOL_SIZE:
            _POOL.append(block)
            return
    block.close()


class DirectFile(io.RawIOBase):
    """A new local file (truncated if it exists) written in :data:`BLOCK_BYTES` blocks with direct I/O."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self.direct = False
        self._fd = -1
        if _O_DIRECT:
            try:
                self._fd = os.open(path, flags | _O_DIRECT, 0o644)
                self.direct = True
            except OSError:  # EINVAL: this filesystem takes no direct I/O
                self._fd = -1
        if self._fd < 0:
            self._fd = os.open(path, flags, 0o644)
        self._blocks = [_acquire(), _acquire()]
        self._views = [memoryview(b) for b in self._blocks]
        self._cur = 0  # the block being filled; the other one may be being written
        self._fill = 0  # bytes of the current block not yet written
        self._written = 0  # file bytes handed to the disk so far (whole blocks)
        self._pending: Future | None = None  # the other block's write, under way

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written + self._fill

    def write(self, data) -> int:
        if self.closed:
            raise ValueError("write to a closed file")
        src = memoryview(data).cast("B")
        n, done = len(src), 0
        while done < n:
            take = min(n - done, BLOCK_BYTES - self._fill)
            self._views[self._cur][self._fill:self._fill + take] = src[done:done + take]
            self._fill += take
            done += take
            if self._fill == BLOCK_BYTES:
                self._hand_off()
        return n

    def flush(self) -> None:
        """Nothing to do: a partial block can only be written at close (direct I/O needs whole blocks)."""

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._wait()
            if self._fill:
                view = self._views[self._cur]
                whole = self._fill // ALIGN * ALIGN
                if whole:
                    _write_all(self._fd, view[:whole], self._written)
                if whole < self._fill:  # the last partial page: through the page cache
                    if self.direct:
                        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_O_DIRECT)
                        self.direct = False
                    _write_all(self._fd, view[whole:self._fill], self._written + whole)
                self._written += self._fill
                self._fill = 0
        finally:
            self._release()
            super().close()

    def _hand_off(self) -> None:
        """Start writing the full block on the background thread; fill the other one meanwhile."""
        self._wait()
        self._pending = _writes.submit(_write_all, self._fd, self._views[self._cur], self._written)
        self._written += BLOCK_BYTES
        self._cur ^= 1
        self._fill = 0

    def _wait(self) -> None:
        """Wait for the write under way (its error is raised here)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _release(self) -> None:
        try:
            self._wait()
        except OSError:  # a failed write, already raised to the writer
            pass
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
        for view in self._views:
            view.release()
        blocks, self._blocks, self._views = self._blocks, [], []
        for block in blocks:
            _release(block)


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset`` (a write may take less than asked)."""
    done, n = 0, len(data)
    while done < n:
        done += os.pwrite(fd, data[done:], offset + done)


def open_output(fs: pafs.FileSystem, path: str):
    """A writable file for a new data file: a :class:`DirectFile` on the local filesystem, else the
    filesystem's own output stream (object stores)."""
    if _O_DIRECT and type(fs) is pafs.LocalFileSystem:
        return DirectFile(path)
    return fs.open_output_stream(path)
