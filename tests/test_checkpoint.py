"""checkpoint, abort and lock: Apache 4.9.8's golden values, byte layout, and the lock's exclusion."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from broker.store import findings as fk
from broker.store.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_path,
    inspect_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from broker.store.constants import CHECKPOINT_FILE_SIZE, LOCK_FILE_CONTENT
from broker.store.store_lock import (
    StoreAlreadyLockedError,
    StoreLock,
    abort_marker_exists,
    abort_marker_path,
    create_abort_marker,
    is_store_locked,
    lock_store,
    remove_abort_marker,
    store_session,
)


# --- checkpoint: golden ----------------------------------------------------------------------------------
def test_golden_checkpoint_matches_apache_values(golden_store: Path, golden_meta: dict) -> None:
    expected = golden_meta["checkpointAfterShutdown"]
    cp = read_checkpoint(golden_store)
    assert cp.physic_msg_timestamp == expected["physicMsgTimestamp"] == 1795240279289
    assert cp.logics_msg_timestamp == expected["logicsMsgTimestamp"] == 1795240279768
    assert cp.index_msg_timestamp == expected["indexMsgTimestamp"] == 1795240279721
    assert cp.master_flushed_offset == 0 and cp.confirm_phy_offset == 0  # 4.9.8 leaves them zero
    assert checkpoint_path(golden_store).stat().st_size == expected["size"] == CHECKPOINT_FILE_SIZE


def test_golden_checkpoint_rewritten_byte_for_byte(golden_store: Path, tmp_path: Path) -> None:
    original = checkpoint_path(golden_store).read_bytes()
    write_checkpoint(tmp_path, read_checkpoint(golden_store))
    assert checkpoint_path(tmp_path).read_bytes() == original


def test_min_timestamp_golden(golden_store: Path) -> None:
    cp = read_checkpoint(golden_store)
    assert cp.min_timestamp() == 1795240279289 - 3000
    assert cp.min_timestamp(include_index=True) == 1795240279289 - 3000  # index is later


def test_min_timestamp_rules() -> None:
    assert Checkpoint(10_000, 20_000, 5_000).min_timestamp() == 7_000
    assert Checkpoint(10_000, 20_000, 5_000).min_timestamp(include_index=True) == 5_000
    assert Checkpoint(20_000, 9_000, 50_000).min_timestamp(include_index=True) == 6_000
    assert Checkpoint(1_000, 2_000, 0).min_timestamp() == 0  # clamped, as Apache does
    assert Checkpoint(1_000, 2_000, 0).min_timestamp(include_index=True) == 0


# --- checkpoint: layout and files --------------------------------------------------------------------------
def test_layout_of_written_file(tmp_path: Path) -> None:
    cp = Checkpoint(1, 2, 3, master_flushed_offset=4, confirm_phy_offset=-5)
    path = tmp_path / "checkpoint"
    cp.write(path)
    data = path.read_bytes()
    assert len(data) == 4096
    assert struct.unpack_from(">qqqqq", data) == (1, 2, 3, 4, -5)
    assert data[40:] == bytes(4096 - 40)
    assert Checkpoint.read(path) == cp
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]  # no temp file left behind


def test_write_keeps_unknown_tail_bytes_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    page = bytearray(4096)
    page[100:104] = b"\x01\x02\x03\x04"
    path.write_bytes(bytes(page))
    path.chmod(0o640)
    Checkpoint(7, 8, 9).write(path)
    data = path.read_bytes()
    assert data[100:104] == b"\x01\x02\x03\x04"
    assert struct.unpack_from(">qqq", data) == (7, 8, 9)
    assert path.stat().st_mode & 0o777 == 0o640


def test_out_of_range_value_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="64-bit"):
        Checkpoint(1 << 63).write(tmp_path / "checkpoint")


def test_missing_checkpoint_names_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / "checkpoint"))) as info:
        read_checkpoint(tmp_path)
    assert "does not exist" in str(info.value)


def test_short_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(struct.pack(">qqq", 11, 22, 33))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))} is 24 bytes, expected 4096"):
        Checkpoint.read(path)
    assert Checkpoint.read(path, allow_short=True) == Checkpoint(11, 22, 33)
    path.write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="10 bytes"):
        Checkpoint.read(path, allow_short=True)


def test_inspect_checkpoint_reports_instead_of_raising(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    cp, found = inspect_checkpoint(path)
    assert cp == Checkpoint() and [f.kind for f in found] == [fk.WRONG_FILE_SIZE]
    path.write_bytes(struct.pack(">qq", 5, 6))
    cp, found = inspect_checkpoint(path)
    assert cp == Checkpoint(5, 6) and found[0].offset == 16 and found[0].file == str(path)
    Checkpoint(1, 2, 3).write(path)
    assert inspect_checkpoint(path) == (Checkpoint(1, 2, 3), [])


# --- abort marker ------------------------------------------------------------------------------------------
def test_abort_marker_lifecycle(tmp_path: Path) -> None:
    assert not abort_marker_exists(tmp_path)
    assert remove_abort_marker(tmp_path) is False
    path = create_abort_marker(tmp_path)
    assert path == abort_marker_path(tmp_path) == tmp_path / "abort"
    assert abort_marker_exists(tmp_path) and path.stat().st_size == 0
    create_abort_marker(tmp_path)  # already there: stays, no error
    assert remove_abort_marker(tmp_path) is True
    assert not abort_marker_exists(tmp_path)


def test_golden_store_shut_down_cleanly(golden_store: Path, golden_meta: dict) -> None:
    assert abort_marker_exists(golden_store) is golden_meta["abortFileAfterShutdown"] is False


def test_store_session_leaves_abort_only_on_failure(tmp_path: Path) -> None:
    with store_session(tmp_path) as lock:
        assert lock.held and abort_marker_exists(tmp_path)
    assert not abort_marker_exists(tmp_path) and not is_store_locked(tmp_path)

    with pytest.raises(RuntimeError, match="boom"):
        with store_session(tmp_path):
            raise RuntimeError("boom")
    assert abort_marker_exists(tmp_path)  # next broker start recovers abnormally
    assert not is_store_locked(tmp_path)


# --- lock --------------------------------------------------------------------------------------------------
def test_lock_file_written_like_apache(tmp_path: Path, golden_store: Path) -> None:
    with lock_store(tmp_path) as lock:
        assert lock.held
        assert (tmp_path / "lock").read_bytes() == LOCK_FILE_CONTENT == (golden_store / "lock").read_bytes()
    assert not lock.held
    assert (tmp_path / "lock").exists()  # Apache never deletes it either


def test_lock_twice_in_one_process(tmp_path: Path) -> None:
    first = lock_store(tmp_path)
    try:
        with pytest.raises(StoreAlreadyLockedError, match="already locked by this process") as info:
            StoreLock(tmp_path).acquire()
        assert str(tmp_path / "lock") in str(info.value)
        assert is_store_locked(tmp_path)
        assert first.held  # the failed attempt did not release ours
    finally:
        first.release()
    assert not is_store_locked(tmp_path)
    with StoreLock(tmp_path):
        pass


def _spawn_holder(lock_file: Path) -> subprocess.Popen:
    """A separate process holding byte 0 the way the JVM's FileChannel.tryLock(0, 1) does."""
    code = textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(lock_file)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        print("locked", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_held_by_another_process(tmp_path: Path) -> None:
    holder = _spawn_holder(tmp_path / "lock")
    try:
        with pytest.raises(StoreAlreadyLockedError, match="locked by another process") as info:
            lock_store(tmp_path)
        assert str(tmp_path / "lock") in str(info.value)
        assert is_store_locked(tmp_path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    with lock_store(tmp_path):
        pass


def test_our_lock_excludes_another_process(tmp_path: Path) -> None:
    probe = textwrap.dedent(f"""
        import fcntl, os
        fd = os.open({str(tmp_path / "lock")!r}, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            print("free")
        except OSError:
            print("busy")
    """)
    with lock_store(tmp_path):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "busy"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "free"

