"""The store ``checkpoint`` file: flush timestamps that drive Apache's crash recovery.

Layout (store-format.md section 8): a 4096-byte (one OS page) file, big-endian longs at
0 physicMsgTimestamp, 8 logicsMsgTimestamp, 16 indexMsgTimestamp, 24 masterFlushedOffset (5.0.0+),
32 confirmPhyOffset (5.1.1+); everything else is zero. Older brokers simply ignore the later longs,
so one layout serves 4.9.x and 5.x.

Writing strategy: **atomic replace** (write a temporary file in the same directory, fsync, rename
over ``checkpoint``, fsync the directory). Apache updates the file in place through a memory map,
which is fine for a process that owns the page for its whole life; an offline tool that dies in
the middle of a plain ``write`` could instead leave a torn or short file, and recovery would then
replay from the wrong commitlog file. No broker can have the file mapped while we write it (we are
expected to hold the store ``lock``), so replacing the inode costs nothing. Bytes after the known
fields are carried over from the existing file, so a field added by a future version survives.
"""

from __future__ import annotations

import logging
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from broker.store import findings as fk
from broker.store.constants import CHECKPOINT_FILE, CHECKPOINT_FILE_SIZE
from broker.store.findings import Finding

log = logging.getLogger(__name__)

# Five big-endian signed longs at the start of the page.
_FIELDS = struct.Struct(">qqqqq")
# The three timestamps every version writes; a file shorter than this holds no usable checkpoint.
MIN_USEFUL_CHECKPOINT_SIZE = 24
# StoreCheckpoint.getMinTimestamp steps back this far so records flushed "just before" the
# checkpoint are replayed too (Apache issue 467).
RECOVERY_SAFETY_MARGIN_MS = 3000
# What a JVM with the usual 022 umask gives new store files.
DEFAULT_FILE_MODE = 0o644


class CheckpointError(Exception):
    """The checkpoint file cannot be read or written; the message names the file."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The values of one checkpoint file (Java epoch milliseconds for the timestamps).

    ``master_flushed_offset`` (5.0.0+) and ``confirm_phy_offset`` (5.1.1+) read as 0 from a 4.x file
    and are written as given; 4.x brokers never look at them.
    """

    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    # --- codec ------------------------------------------------------------------------------------
    @classmethod
    def from_bytes(cls, data: bytes) -> Checkpoint:
        """Decode the page; missing trailing bytes count as zero (as Apache's mmap would see them)."""
        head = bytes(data[: _FIELDS.size]).ljust(_FIELDS.size, b"\0")
        return cls(*_FIELDS.unpack(head))

    def to_bytes(self, base: bytes | None = None) -> bytes:
        """The full 4096-byte page; ``base`` supplies the bytes after our fields (default zeros)."""
        page = bytearray(base if base is not None and len(base) == CHECKPOINT_FILE_SIZE
                         else bytes(CHECKPOINT_FILE_SIZE))
        try:
            page[: _FIELDS.size] = _FIELDS.pack(
                self.physic_msg_timestamp,
                self.logics_msg_timestamp,
                self.index_msg_timestamp,
                self.master_flushed_offset,
                self.confirm_phy_offset,
            )
        except struct.error as exc:
            raise ValueError(f"checkpoint value out of signed 64-bit range: {self}") from exc
        return bytes(page)

    # --- recovery ---------------------------------------------------------------------------------
    def min_timestamp(self, include_index: bool = False) -> int:
        """Where abnormal recovery starts looking (``getMinTimestamp`` / ``getMinTimestampIndex``).

        ``min(physic, logics) - 3000 ms`` clamped at 0; with ``include_index`` (Apache's
        ``messageIndexSafe``) the index timestamp can pull it further back. Apache subtracts the margin
        before taking the index into account, and so do we.
        """
        lowest = min(self.physic_msg_timestamp, self.logics_msg_timestamp) - RECOVERY_SAFETY_MARGIN_MS
        lowest = max(lowest, 0)
        if include_index:
            lowest = min(lowest, self.index_msg_timestamp)
        return lowest

    # --- files ------------------------------------------------------------------------------------
    @classmethod
    def read(cls, path: str | os.PathLike, *, allow_short: bool = False) -> Checkpoint:
        """Read a checkpoint file.

        A missing file, or one shorter than 4096 bytes, raises :class:`CheckpointError` naming it:
        Apache always leaves a full page, so a short file means damage or a copy gone wrong. With
        ``allow_short`` a file holding at least the three timestamps is accepted and zero-padded
        (what Apache's mmap does when it opens such a file).
        """
        path = Path(path)
        data = _read_bytes(path)
        if len(data) != CHECKPOINT_FILE_SIZE:
            if not allow_short or len(data) < MIN_USEFUL_CHECKPOINT_SIZE:
                raise CheckpointError(
                    f"checkpoint file {path} is {len(data)} bytes, expected {CHECKPOINT_FILE_SIZE}"
                )
            log.warning("checkpoint file %s is %d bytes (expected %d); reading it zero-padded",
                        path, len(data), CHECKPOINT_FILE_SIZE)
        return cls.from_bytes(data)

    def write(self, path: str | os.PathLike, *, fsync: bool = True) -> None:
        """Atomically replace ``path`` with this checkpoint (see the module docstring for why)."""
        path = Path(path)
        base = _existing_page(path)
        _atomic_write(path, self.to_bytes(base), fsync=fsync)
        log.info("wrote checkpoint %s: %s", path, self)


def checkpoint_path(store_dir: str | os.PathLike) -> Path:
    return Path(store_dir) / CHECKPOINT_FILE


def read_checkpoint(store_dir: str | os.PathLike, *, allow_short: bool = False) -> Checkpoint:
    """The checkpoint of a store root directory."""
    return Checkpoint.read(checkpoint_path(store_dir), allow_short=allow_short)


def write_checkpoint(store_dir: str | os.PathLike, checkpoint: Checkpoint, *, fsync: bool = True) -> None:
    checkpoint.write(checkpoint_path(store_dir), fsync=fsync)


def inspect_checkpoint(path: str | os.PathLike) -> tuple[Checkpoint, list[Finding]]:
    """Never-raising variant for the inspector: what Apache would load, plus what is wrong.

    A missing file loads as all zeros (a fresh store) and a wrong-sized file zero-padded or cut at
    one page, both reported as ``wrong_file_size`` findings.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Checkpoint(), [Finding(str(path), 0, fk.WRONG_FILE_SIZE,
                                      "checkpoint file missing; Apache would start from all-zero timestamps")]
    found: list[Finding] = []
    if len(data) != CHECKPOINT_FILE_SIZE:
        found.append(Finding(str(path), len(data), fk.WRONG_FILE_SIZE,
                             f"checkpoint is {len(data)} bytes, expected {CHECKPOINT_FILE_SIZE}"))
    return Checkpoint.from_bytes(data), found


# --- helpers ------------------------------------------------------------------------------------------
def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint file {path} does not exist") from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from exc


def _existing_page(path: Path) -> bytes | None:
    """The current page, to carry over bytes we do not interpret; None if absent or odd-sized."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return data if len(data) == CHECKPOINT_FILE_SIZE else None


def _atomic_write(path: Path, data: bytes, *, fsync: bool) -> None:
    """Temp file in the same directory + rename, so readers see the old or the new page, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _mode_of(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600; keep what the replaced file (or a broker) would have
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        _unlink_quietly(Path(tmp_name))
        raise
    if fsync:
        fsync_directory(path.parent)


def _mode_of(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        return DEFAULT_FILE_MODE


def fsync_directory(directory: Path) -> None:
    """Make a rename durable; some filesystems do not support fsync on directories, which is fine."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
