"""The store's ``lock`` file and ``abort`` marker: who may write a store, and did the last run crash.

``lock`` (store-format.md sections 1 and 8): Apache's ``DefaultMessageStore.start()`` opens
``<root>/lock``, takes ``FileChannel.tryLock(0, 1, false)`` (an exclusive lock on byte 0, length 1)
and writes the 4 ASCII bytes ``lock`` at position 0. On Linux the JVM implements that lock with
``fcntl(F_SETLK)`` record locks, the same family ``fcntl.lockf`` uses, so a broker and this module
exclude each other. The file is never deleted; only the lock matters.

Two POSIX record-lock quirks shape :class:`StoreLock`:

* locks belong to the *process*: a second ``lockf`` from the same process always succeeds, so an
  in-process registry (by device and inode) reports a double acquisition instead;
* closing *any* descriptor of the file releases the process's lock, so we never open the file
  again while we hold it (the registry is checked by ``stat`` before opening).

``abort``: an empty file created by ``start()`` and deleted by a clean ``shutdown()``; finding it at
load time tells Apache the previous run crashed, which triggers abnormal recovery (section 9).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import threading
from pathlib import Path
from typing import Iterator

from broker.store.checkpoint import fsync_directory
from broker.store.constants import ABORT_FILE, LOCK_FILE, LOCK_FILE_CONTENT

log = logging.getLogger(__name__)

# Apache locks one byte at position 0.
_LOCK_START = 0
_LOCK_LENGTH = 1
_FLOCK = "hh4xqqi4x"  # struct flock on Linux x86-64: l_type, l_whence, l_start, l_len, l_pid

_held_lock = threading.Lock()
_held: dict[tuple[int, int], Path] = {}  # (st_dev, st_ino) of lock files this process holds


class StoreLockError(RuntimeError):
    """The lock file could not be opened or locked for a reason other than contention."""


class StoreAlreadyLockedError(StoreLockError):
    """Another process (or another holder in this process) already has the store locked."""


class StoreLock:
    """Exclusive advisory lock on ``<store>/lock``; use as a context manager or acquire/release.

    Holding it means no broker and no other job is running on the store, which is what makes
    in-place edits (checkpoint, config files, truncation) safe.
    """

    def __init__(self, store_dir: str | os.PathLike) -> None:
        self.store_dir = Path(store_dir)
        self.path = self.store_dir / LOCK_FILE
        self._fd: int | None = None
        self._key: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> StoreLock:
        """Take the lock without waiting; raise :class:`StoreAlreadyLockedError` if someone has it.

        The whole sequence runs under the in-process mutex so no thread of ours can open (and, by
        closing, silently release) a lock file another thread is holding.
        """
        if self._fd is not None:
            raise StoreAlreadyLockedError(f"store lock {self.path} is already held by this StoreLock")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        with _held_lock:
            self._refuse_if_held_in_process()
            fd = self._open()
            try:
                self._lock(fd)
                key = _file_key(os.fstat(fd))
            except BaseException:
                os.close(fd)
                raise
            _held[key] = self.path
        self._fd, self._key = fd, key
        try:
            self._stamp()
        except BaseException:
            self.release()
            raise
        log.info("locked store %s", self.store_dir)
        return self

    def release(self) -> None:
        """Drop the lock (the file stays, as Apache leaves it)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with _held_lock:
            try:
                fcntl.lockf(fd, fcntl.LOCK_UN, _LOCK_LENGTH, _LOCK_START)
            finally:
                os.close(fd)
                _held.pop(self._key, None)
                self._key = None
        log.info("unlocked store %s", self.store_dir)

    def __enter__(self) -> StoreLock:
        """Acquires unless already held, so ``with lock_store(d):`` works as well as ``with StoreLock(d):``."""
        return self if self.held else self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    # --- steps ------------------------------------------------------------------------------------
    def _refuse_if_held_in_process(self) -> None:
        """Caller holds ``_held_lock``; checked by stat so we never open a file we hold."""
        try:
            key = _file_key(self.path.stat())
        except FileNotFoundError:
            return
        if key in _held:
            raise StoreAlreadyLockedError(
                f"store {self.store_dir} is already locked by this process (lock file {self.path})"
            )

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreLockError(f"cannot open store lock file {self.path}: {exc}") from exc

    def _lock(self, fd: int) -> None:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, _LOCK_LENGTH, _LOCK_START)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise StoreAlreadyLockedError(
                    f"store {self.store_dir} is locked by another process (lock file {self.path}); "
                    "is a broker or another job running on it?"
                ) from exc
            raise StoreLockError(f"cannot lock store lock file {self.path}: {exc}") from exc

    def _stamp(self) -> None:
        """Write ``lock`` at position 0 like Apache; the content is informational only."""
        assert self._fd is not None
        os.pwrite(self._fd, LOCK_FILE_CONTENT, 0)
        os.fsync(self._fd)


def lock_store(store_dir: str | os.PathLike) -> StoreLock:
    """Acquire and return the lock of ``store_dir`` (release it, or use ``with lock_store(...)``)."""
    return StoreLock(store_dir).acquire()


def is_store_locked(store_dir: str | os.PathLike) -> bool:
    """Whether some process (including this one) holds the store lock right now.

    Probes by briefly taking the lock; it never opens the file while this process holds it, since
    closing that descriptor would drop our own lock.
    """
    probe = StoreLock(store_dir)
    if not probe.path.exists():
        return False
    try:
        probe.acquire()
    except StoreAlreadyLockedError:
        return True
    probe.release()
    return False


def held_by_another_process(store_dir: str | os.PathLike) -> bool:
    """Whether another process (a live broker) holds the store lock, asked with ``F_GETLK``, which
    only looks: :func:`is_store_locked` takes the lock for a moment, and a broker starting in that
    moment would fail to lock its store. A lock this process holds does not count (its file is then
    not opened at all: closing any descriptor of it would drop that lock)."""
    path = Path(store_dir) / LOCK_FILE
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    with _held_lock:
        if (st.st_dev, st.st_ino) in _held:
            return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, _LOCK_START, _LOCK_LENGTH, 0)
        l_type = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query))[0]
    finally:
        os.close(fd)
    return l_type != fcntl.F_UNLCK


# --- abort marker ---------------------------------------------------------------------------------------
def abort_marker_path(store_dir: str | os.PathLike) -> Path:
    return Path(store_dir) / ABORT_FILE


def create_abort_marker(store_dir: str | os.PathLike) -> Path:
    """Create the empty ``abort`` file (as ``start()`` does) so a crash leads to abnormal recovery."""
    path = abort_marker_path(store_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        log.warning("abort marker %s already exists: the previous run did not shut down cleanly", path)
    else:
        path.touch()
        fsync_directory(path.parent)
    return path


def abort_marker_exists(store_dir: str | os.PathLike) -> bool:
    """True when the last run did not shut down cleanly."""
    return abort_marker_path(store_dir).exists()


def remove_abort_marker(store_dir: str | os.PathLike) -> bool:
    """Delete ``abort`` (as a clean ``shutdown()`` does); returns whether it existed."""
    path = abort_marker_path(store_dir)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_directory(path.parent)
    return True


@contextlib.contextmanager
def store_session(store_dir: str | os.PathLike) -> Iterator[StoreLock]:
    """Lock the store and mirror Apache's start/shutdown around the body.

    The ``abort`` marker exists while the body runs and is removed only if it finishes without an
    exception, so a store we left half-written makes the next broker start recover abnormally.
    """
    with StoreLock(store_dir) as lock:
        create_abort_marker(store_dir)
        yield lock
        remove_abort_marker(store_dir)


def _file_key(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino
