"""Crash recovery of broker.server.MessageStore: torn commitlog tails, queues behind or ahead of the
commitlog, and real ``kill -9`` of a process putting with SYNC_FLUSH. After every reopen each complete
record is readable exactly once and ``verify_store`` finds nothing."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from broker.engine import MessageStore, RecoveryError, StoreSettings, recovery
from broker.store.commitlog import CommitLogWriter, offset_to_file_name
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from broker.store.properties import encode_properties
from broker.store.store_lock import abort_marker_exists, remove_abort_marker
from broker.store.verify import verify_store

REPO_ROOT = Path(__file__).resolve().parents[1]
T0 = 1_790_000_000_000
STORE_HOST = Host(bytes([10, 9, 8, 7]), 10911)
BORN_HOST = Host(bytes([192, 168, 1, 20]), 40001)
SEG = 16 * 1024


def settings(**kw) -> StoreSettings:
    base = dict(segment_bytes=SEG, cq_file_bytes=20 * 16, index_slots=64, index_entries=256,
                message_delay_level="1s 2s", store_host=STORE_HOST, fsync_metadata=False)
    base.update(kw)
    return StoreSettings(**base)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        self.now += 7
        return self.now


def msg(i: int, queue_id: int = 0, topic: str = "TopicA") -> MessageRecord:
    return MessageRecord(topic=topic, body=f"m{i}".encode() * 3, queue_id=queue_id, born_timestamp=T0,
                         born_host=BORN_HOST,
                         properties_raw=encode_properties({"KEYS": f"k{i}", "UNIQ_KEY": f"U{i:05d}", "TAGS": "T"}))


def open_store(root: Path, s: StoreSettings | None = None) -> MessageStore:
    st = MessageStore(root, s or settings(), clock=Clock())
    st.open()
    return st


def pull_all(st: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    """Every record of a queue, as stored."""
    out, offset = [], st.min_offset(topic, queue_id)
    while offset < st.max_offset(topic, queue_id):
        got = st.get_messages(topic, queue_id, offset)
        body, pos = got.body, 0
        while pos < len(body):
            size = int.from_bytes(body[pos:pos + 4], "big")
            out.append(body[pos:pos + size])
            pos += size
        offset = got.next_begin_offset
    return out


def bodies(st: MessageStore, topic: str, queues: range) -> list[bytes]:
    out = []
    for qid in queues:
        for raw in pull_all(st, topic, qid):
            out.append(st.view_message(int.from_bytes(raw[28:36], "big")).body)
    return out


def assert_clean(root: Path, s: StoreSettings | None = None) -> None:
    s = s or settings()
    report = verify_store(root, segment_size=s.segment_bytes, message_delay_level=s.message_delay_level)
    assert report.findings == [], report.summary()


def segment_path(root: Path, phy: int) -> Path:
    return root / "commitlog" / offset_to_file_name(phy - phy % SEG)


def write_at(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


def read_at(path: Path, pos: int, n: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(pos)
        return fh.read(n)


def crashed_store(root: Path, n: int = 20, queues: int = 2):
    """A store that was killed after ``n`` puts (abort left behind)."""
    st = open_store(root)
    puts = [st.put_message(msg(i, i % queues)) for i in range(n)]
    assert all(p.ok for p in puts)
    st.abandon()
    assert abort_marker_exists(root)
    return puts


# ---- (a) torn / corrupt commitlog tails -----------------------------------------------------------------
def test_torn_last_record_is_cut_and_everything_else_survives(tmp_path):
    root = tmp_path / "s"
    puts = crashed_store(root)
    last = puts[-1]
    phy, size = last.physical_offsets[0], last.wrote_bytes
    seg = segment_path(root, phy)
    pos = phy % SEG
    partial = read_at(seg, pos, 30)
    write_at(seg, pos + 30, bytes(size - 30))  # only the first 30 bytes reached the disk
    torn = max(i for i, b in enumerate(partial) if b) + 1

    st = open_store(root)
    rep = st.recovery
    assert rep.abnormal and rep.stop_reason
    assert (rep.commitlog_end, rep.bytes_truncated, rep.records_dropped) == (phy, torn, 1)
    assert (rep.cq_units_truncated, rep.index_rewound, rep.redispatched) == (1, True, 0)
    assert read_at(seg, pos, SEG - pos) == bytes(SEG - pos)
    assert (st.max_offset("TopicA", 0), st.max_offset("TopicA", 1)) == (10, 9)
    assert sorted(bodies(st, "TopicA", range(2))) == sorted(f"m{i}".encode() * 3 for i in range(19))
    assert st.query_by_key("TopicA", "k19").physical_offsets == ()
    assert st.query_by_key("TopicA", "k18").physical_offsets == puts[18].physical_offsets
    again = st.put_message(msg(19, 1))
    assert (again.physical_offsets[0], again.queue_offset) == (phy, 9)
    assert st.query_by_key("TopicA", "U00019").physical_offsets == (phy,)
    st.close()
    assert_clean(root)


def test_garbage_after_the_last_record_is_zeroed(tmp_path):
    root = tmp_path / "s"
    puts = crashed_store(root, n=5)
    end = puts[-1].physical_offsets[0] + puts[-1].wrote_bytes
    junk = bytes(random.Random(3).randrange(1, 256) for _ in range(100))
    write_at(segment_path(root, end), end % SEG, junk)
    st = open_store(root)
    rep = st.recovery
    assert (rep.commitlog_end, rep.bytes_truncated, rep.records_dropped, rep.cq_units_truncated) == (end, 100, 1, 0)
    assert len(bodies(st, "TopicA", range(2))) == 5
    st.close()
    assert_clean(root)


def test_garbage_past_a_hole_of_the_sparse_file_is_zeroed_too(tmp_path):
    """Recovery skips the holes of a sparse commitlog file (SEEK_DATA/SEEK_HOLE) instead of reading
    them; bytes written past a hole still count and are zeroed."""
    root = tmp_path / "s"
    puts = crashed_store(root, n=5)
    end = puts[-1].physical_offsets[0] + puts[-1].wrote_bytes
    path = segment_path(root, end)
    assert end % SEG < 4096 and recovery._data_end(path, end % SEG, SEG) <= 4096  # records, then a hole
    junk = bytes(random.Random(4).randrange(1, 256) for _ in range(64))
    write_at(path, SEG - 100, junk)
    st = open_store(root)
    rep = st.recovery
    assert (rep.commitlog_end, rep.bytes_truncated) == (end, SEG - 100 + 64 - end % SEG)
    assert read_at(path, end % SEG, SEG - end % SEG) == bytes(SEG - end % SEG)
    assert len(bodies(st, "TopicA", range(2))) == 5
    st.close()
    assert_clean(root)


def test_data_end_follows_the_holes_of_a_sparse_file(tmp_path):
    path = tmp_path / "sparse"
    with open(path, "wb") as fh:
        fh.truncate(1 << 20)
    assert recovery._data_end(path, 0, 1 << 20) == 0  # all hole
    write_at(path, 100_000, b"x")
    write_at(path, 700_000, b"y")
    end = recovery._data_end(path, 0, 1 << 20)
    assert 700_001 <= end <= 700_000 + 64 * 1024  # the end of the block written last
    assert recovery._data_end(path, 0, 300_000) <= 300_000  # never past stop
    assert recovery._data_end(path, 800_000, 1 << 20) == 800_000  # nothing from there on
    assert recovery._data_end(tmp_path / "missing", 5, 10) == 10  # cannot tell: scan everything
    full = tmp_path / "full"
    full.write_bytes(bytes(8192))  # written zeros are data, not holes
    assert recovery._data_end(full, 0, 8192) == 8192


def test_crc_mismatch_ends_the_log_there(tmp_path):
    root = tmp_path / "s"
    puts = crashed_store(root)
    bad = puts[10]
    phy = bad.physical_offsets[0]
    seg = segment_path(root, phy)
    body_at = phy % SEG + read_at(seg, phy % SEG, bad.wrote_bytes).index(b"m10m10m10")
    write_at(seg, body_at, b"X")  # one flipped body byte: the record is intact but its CRC is wrong
    data_end = puts[-1].physical_offsets[0] + puts[-1].wrote_bytes

    copy = tmp_path / "nocrc"
    shutil.copytree(root, copy)

    st = open_store(root)
    rep = st.recovery
    assert (rep.commitlog_end, rep.records_dropped, rep.bytes_truncated) == (phy, 10, data_end - phy)
    assert "BODYCRC" in rep.stop_reason
    assert rep.cq_units_truncated == 10
    assert sorted(bodies(st, "TopicA", range(2))) == sorted(f"m{i}".encode() * 3 for i in range(10))
    st.close()
    assert_clean(root)

    s = settings(check_crc_on_recover=False)  # then the damaged record is kept, as Apache would
    st = open_store(copy, s)
    assert (st.recovery.commitlog_end, st.recovery.bytes_truncated) == (data_end, 0)
    assert len(bodies(st, "TopicA", range(2))) == 20
    st.close()
    kinds = {f.kind for f in verify_store(copy, segment_size=SEG, message_delay_level="1s 2s").findings}
    assert kinds == {"crc_mismatch"}


# ---- (b) consume queues behind the commitlog ------------------------------------------------------------
def _append_undispatched(root: Path, start: int, n: int, queue_offsets: dict) -> None:
    """Records that reached the commitlog but were never dispatched (no CQ unit, no index entry)."""
    writer = CommitLogWriter(root, SEG, queue_offsets)
    for i in range(start, start + n):
        writer.append(MessageRecord(**{**_fields(msg(i, 0)), "store_host": STORE_HOST}), T0 + i)
    writer.close()


def _fields(rec: MessageRecord) -> dict:
    return {name: getattr(rec, name) for name in MessageRecord.__dataclass_fields__}


@pytest.mark.parametrize("crashed", [False, True])
def test_undispatched_records_are_redispatched(tmp_path, crashed):
    root = tmp_path / "s"
    st = open_store(root)
    puts = [st.put_message(msg(i, 0)) for i in range(10)]
    if crashed:
        st.abandon()
    else:
        st.close()  # e.g. stopped between append and dispatch without a crash
    _append_undispatched(root, 10, 5, {("TopicA", 0): 10})
    st = open_store(root)
    rep = st.recovery
    assert rep.abnormal is crashed
    # after a crash re-dispatch starts a file before the last queued record (here: the store's start)
    last_end = puts[-1].physical_offsets[0] + puts[-1].wrote_bytes
    assert (rep.dispatch_from, rep.redispatched, rep.bytes_truncated) == (0 if crashed else last_end, 5, 0)
    assert st.max_offset("TopicA", 0) == 15
    assert bodies(st, "TopicA", range(1)) == [f"m{i}".encode() * 3 for i in range(15)]
    assert len(st.query_by_key("TopicA", "k12").physical_offsets) == 1
    assert st.put_message(msg(15, 0)).queue_offset == 15
    st.close()
    assert_clean(root)


def test_lost_queue_units_are_rebuilt_without_duplicate_index_entries(tmp_path):
    root = tmp_path / "s"
    puts = crashed_store(root, n=12, queues=1)
    cq = root / "consumequeue" / "TopicA" / "0" / offset_to_file_name(0)
    write_at(cq, 9 * 20, bytes(3 * 20))  # the last 3 units never reached the file
    st = open_store(root)
    assert (st.recovery.dispatch_from, st.recovery.redispatched) == (0, 3)  # crashed: from a file back
    assert bodies(st, "TopicA", range(1)) == [f"m{i}".encode() * 3 for i in range(12)]
    for i in (9, 10, 11):  # already indexed before the crash: not indexed twice
        assert st.dispatcher.index.query_offsets("TopicA", f"k{i}") == [puts[i].physical_offsets[0]]
    st.close()
    assert_clean(root)


def test_a_run_killed_between_its_queues_loses_no_unit_and_no_queue_offset(tmp_path):
    """The dispatcher writes a run queue by queue: a kill can leave queue 0's unit for a later record
    written and queue 1's units for earlier ones not (seen in the SIGKILL crash suite: a queue offset
    given twice). Recovery re-dispatches from a file back, so queue 1 gets its units, in order, and
    the next message to it the next offset."""
    root = tmp_path / "s"
    puts = crashed_store(root, n=12, queues=2)  # queue 0: m0, m2, ... m10; queue 1: m1, m3, ... m11
    cq1 = root / "consumequeue" / "TopicA" / "1" / offset_to_file_name(0)
    write_at(cq1, 4 * 20, bytes(2 * 20))  # m9 and m11 never reached queue 1; m10 reached queue 0
    assert puts[9].physical_offsets[0] < puts[10].physical_offsets[0]
    st = open_store(root)
    assert (st.recovery.dispatch_from, st.recovery.redispatched) == (0, 2)
    assert st.max_offset("TopicA", 1) == 6
    assert bodies(st, "TopicA", range(2)) == [f"m{i}".encode() * 3 for i in [*range(0, 12, 2), *range(1, 12, 2)]]
    assert st.put_message(msg(13, 1)).queue_offset == 6
    st.close()
    assert_clean(root)


# ---- (c) consume queues ahead of the commitlog ------------------------------------------------------------
def test_queue_units_past_the_commitlog_end_are_trimmed(tmp_path):
    root = tmp_path / "s"
    st = open_store(root)
    puts = [st.put_message(msg(i, 0)) for i in range(10)]
    st.close()
    cut = puts[7].physical_offsets[0]
    end = puts[-1].physical_offsets[0] + puts[-1].wrote_bytes
    write_at(segment_path(root, cut), cut % SEG, bytes(end - cut))  # the commitlog lost its last 3 records
    assert not abort_marker_exists(root)

    st = open_store(root)
    rep = st.recovery
    assert not rep.abnormal
    assert (rep.commitlog_end, rep.cq_units_truncated, rep.index_rewound, rep.bytes_truncated) == (cut, 3, True, 0)
    assert st.max_offset("TopicA", 0) == 7
    again = st.put_message(msg(100, 0))
    assert (again.physical_offsets[0], again.queue_offset) == (cut, 7)
    assert st.query_by_key("TopicA", "k8").physical_offsets == ()
    assert st.query_by_key("TopicA", "k100").physical_offsets == (cut,)
    st.close()
    assert_clean(root)


def test_fake_units_pointing_past_the_end_and_extra_queue_files(tmp_path):
    root = tmp_path / "s"
    puts = crashed_store(root, n=3, queues=1)
    end = puts[-1].physical_offsets[0] + puts[-1].wrote_bytes
    qdir = root / "consumequeue" / "TopicA" / "0"
    unit = (end + 500).to_bytes(8, "big") + (200).to_bytes(4, "big") + (0).to_bytes(8, "big")
    write_at(qdir / offset_to_file_name(0), 3 * 20, unit * 2)
    (qdir / offset_to_file_name(320)).write_bytes(unit + bytes(300))  # a later file, all past the end
    st = open_store(root)
    rep = st.recovery
    assert (rep.cq_units_truncated, rep.cq_files_deleted, rep.redispatched) == (3, 1, 0)
    assert not (qdir / offset_to_file_name(320)).exists()
    assert st.max_offset("TopicA", 0) == 3
    assert st.put_message(msg(3, 0)).queue_offset == 3
    st.close()
    assert_clean(root)


def test_empty_store_and_missing_queues_recover_from_the_commitlog(tmp_path):
    root = tmp_path / "s"
    crashed_store(root, n=40, queues=3)  # spans several commitlog files
    shutil.rmtree(root / "consumequeue")
    shutil.rmtree(root / "index")
    remove_abort_marker(root)
    st = open_store(root)
    assert (st.recovery.dispatch_from, st.recovery.redispatched) == (0, 40)
    assert sorted(bodies(st, "TopicA", range(3))) == sorted(f"m{i}".encode() * 3 for i in range(40))
    assert len(st.query_by_key("TopicA", "k33").physical_offsets) == 1
    st.close()
    assert_clean(root)


def test_files_a_kill_left_unsized_are_accepted(tmp_path):
    """Pre-sized files are created then sized: a kill in between leaves 0-byte files."""
    root = tmp_path / "s"
    st = open_store(root)
    puts = [st.put_message(MessageRecord(**{**_fields(msg(i, i % 2)), "body": bytes([i]) * 1500}))
            for i in range(40)]  # 4 commitlog files, queue files of 16 units
    st.abandon()
    segments = sorted((root / "commitlog").iterdir())
    assert len(segments) == 4
    last = segments[-1]
    lost = [p for p in puts if p.physical_offsets[0] >= int(last.name)]
    os.truncate(last, 0)  # rolled to a new file, died before sizing it (and before writing to it)
    (root / "consumequeue" / "TopicA" / "0" / offset_to_file_name(640)).write_bytes(b"")
    (root / "consumequeue" / "Fresh" / "0").mkdir(parents=True)
    (root / "consumequeue" / "Fresh" / "0" / offset_to_file_name(0)).write_bytes(b"")
    (root / "index" / "29991231235959999").write_bytes(b"")

    st = open_store(root)
    rep = st.recovery
    assert rep.commitlog_end == int(last.name) and last.stat().st_size == SEG
    assert (rep.cq_units_truncated, rep.index_files_deleted) == (len(lost), 1)
    assert not (root / "consumequeue" / "TopicA" / "0" / offset_to_file_name(640)).exists()
    assert st.max_offset("Fresh", 0) == 0
    assert len(bodies(st, "TopicA", range(2))) == 40 - len(lost)
    assert st.put_message(msg(99, 1)).physical_offsets == (int(last.name),)
    assert st.put_message(msg(100, 0, topic="Fresh")).queue_offset == 0
    st.close()
    assert_clean(root)


def test_store_of_another_geometry_is_refused(tmp_path):
    root = tmp_path / "s"
    crashed_store(root, n=3)
    for kw in (dict(segment_bytes=2 * SEG), dict(cq_file_bytes=20 * 32), dict(index_entries=512)):
        with pytest.raises(RecoveryError):
            open_store(root, settings(**kw))
    st = open_store(root)  # the lock was released after each refusal; nothing was damaged
    assert len(bodies(st, "TopicA", range(2))) == 3
    st.close()
    assert_clean(root)


# ---- kill -9 of a process putting with SYNC_FLUSH ------------------------------------------------------------
CHILD = r"""
import sys
from broker.engine import MessageStore, RecoveryError, StoreSettings
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from broker.store.properties import encode_properties

root, rnd = sys.argv[1], sys.argv[2]
settings = StoreSettings(segment_bytes=32 * 1024, cq_file_bytes=20 * 64, index_slots=64, index_entries=256,
                         flush_disk_type="SYNC_FLUSH", message_delay_level="1s 2s", fsync_metadata=False,
                         store_host=Host(bytes([127, 0, 0, 1]), 10911))
store = MessageStore(root, settings)
store.open()
i = 0
while True:
    name = f"{rnd}-{i}"
    res = store.put_message(MessageRecord(topic="Crash", body=name.encode() * 5, queue_id=i % 3,
                                          properties_raw=encode_properties({"KEYS": name, "TAGS": "t"})))
    if res.ok:
        sys.stdout.write(f"{res.physical_offsets[0]} {res.queue_id} {res.queue_offset} {name}\n")
        sys.stdout.flush()
    i += 1
"""
KILL_SETTINGS = dict(segment_bytes=32 * 1024, cq_file_bytes=20 * 64, index_slots=64, index_entries=256,
                     flush_disk_type="SYNC_FLUSH", message_delay_level="1s 2s", fsync_metadata=False,
                     store_host=Host(bytes([127, 0, 0, 1]), 10911))


def _run_and_kill(root: Path, rnd: int, want: int, err: Path, rng: random.Random) -> list[tuple[int, int, int, str]]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with open(err, "wb") as errf:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(rnd)], stdout=subprocess.PIPE,
                                stderr=errf, cwd=REPO_ROOT, env=env)
        lines: list[bytes] = []
        deadline = time.monotonic() + 60
        try:
            while len(lines) < want and time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
            time.sleep(rng.random() * 0.005)  # land somewhere inside a put
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert len(lines) >= want, err.read_text()[-2000:]
    out = []
    for line in lines:
        phy, qid, qoff, name = line.decode().split()
        out.append((int(phy), int(qid), int(qoff), name))
    return out


def test_kill_9_during_sync_flush_puts(tmp_path):
    root = tmp_path / "s"
    rng = random.Random(98)
    reported: list[tuple[int, int, int, str]] = []
    for rnd in range(3):
        reported += _run_and_kill(root, rnd, 150 + 60 * rnd, tmp_path / f"child{rnd}.err", rng)
    s = StoreSettings(**KILL_SETTINGS)
    st = MessageStore(root, s)
    st.open()
    assert st.recovery.abnormal
    counts = Counter(bodies(st, "Crash", range(3)))
    assert all(n == 1 for n in counts.values())  # nothing stored twice
    for phy, qid, qoff, name in reported:
        assert counts[name.encode() * 5] == 1, name
        rec = st.view_message(phy)
        assert (rec.body, rec.queue_id, rec.queue_offset) == (name.encode() * 5, qid, qoff)
        assert st.query_by_key("Crash", name).physical_offsets == (phy,)
    for qid in range(3):  # queue offsets are dense and match the records
        raws = pull_all(st, "Crash", qid)
        assert [int.from_bytes(r[20:28], "big") for r in raws] == list(range(len(raws)))
    st.close()
    report = verify_store(root, segment_size=s.segment_bytes, message_delay_level=s.message_delay_level)
    assert report.findings == [], report.summary()
