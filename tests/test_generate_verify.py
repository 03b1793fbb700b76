"""The store generator and the verifier: a generated store is clean, deterministic and realistic;
every planted defect is found with the right kind, file and offset."""

from __future__ import annotations

import shutil
import struct
import time
from collections import Counter
from pathlib import Path

import pytest

from broker.store import findings as fk
from broker.store.commitlog import CommitLog
from broker.store.constants import BLANK_MAGIC_CODE, CQ_STORE_UNIT_SIZE, signed32
from broker.store.consume_queue import ConsumeQueue, list_queues, queue_dir
from broker.store.generate import GenerateSpec, generate_store
from broker.store.index_file import IndexService
from broker.store.message import BlankRecord, MessageRecord
from broker.store.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, SCHEDULE_TOPIC, TRANS_HALF_TOPIC
from broker.store.verify import verify_store
from tests.store_harness import decoded_rows

MESSAGES = 3000
SEG = 256 * 1024
CQ_FILE = 6000  # 300 units per consume-queue file: the busy queues need two files


def _spec(seed: int = 11) -> GenerateSpec:
    return GenerateSpec(messages=MESSAGES, segment_bytes=SEG, index_slots=1000, index_entries=4000,
                        cq_file_bytes=CQ_FILE, seed=seed)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("gen") / "store"
    result = generate_store(store, _spec())
    assert result.messages == MESSAGES
    return store


@pytest.fixture(scope="module")
def rows(generated) -> list[dict]:
    return decoded_rows(generated)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _copy(store: Path, tmp_path: Path, name: str = "copy") -> Path:
    dst = tmp_path / name
    shutil.copytree(store, dst)
    return dst


def _write(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


def _where(findings) -> list[tuple]:
    return [(f.file, f.offset, f.kind) for f in findings]


def _cq_unit_path(store: Path, topic: str, qid: int, logical: int) -> tuple[Path, int]:
    byte = logical * CQ_STORE_UNIT_SIZE
    return queue_dir(store, topic, qid) / str(byte - byte % CQ_FILE).zfill(20), byte % CQ_FILE


# ---- a clean generated store ---------------------------------------------------------------------------

def test_generated_store_verifies_clean(generated, rows):
    report = verify_store(generated)
    assert report.findings == []
    assert report.ok
    assert report.records == MESSAGES == len(rows)
    assert report.cq_units == MESSAGES  # no PREPARED/ROLLBACK: every record is in a queue
    assert report.segments == len(CommitLog.open(generated).segments) > 1
    assert report.index_files > 1  # 4000 entries per file are not enough for all keys
    assert report.data_end == rows[-1]["commitlog_offset"] + rows[-1]["store_size"]
    assert all(r["body_crc_ok"] for r in rows)


def test_generated_store_layout(generated, rows):
    log = CommitLog.open(generated)
    assert log.segment_size == SEG
    assert log.findings == []
    assert all(seg.size == SEG for seg in log.segments)
    assert [seg.base for seg in log.segments] == [i * SEG for i in range(len(log.segments))]
    # every file but the last ends with a BLANK that reaches the file end
    for seg in log.segments[:-1]:
        data = seg.path.read_bytes()
        last = max(r["commitlog_offset"] + r["store_size"] for r in rows
                   if seg.base <= r["commitlog_offset"] < seg.base + SEG) - seg.base
        assert struct.unpack_from(">ii", data, last) == (SEG - last, signed32(BLANK_MAGIC_CODE))
        assert log.read_record(seg.base + last) == BlankRecord(seg.base + last, SEG - last)
    # queues: ordered, increasing, and two CQ files where a queue holds more than 300 units
    multi = [(t, q) for t, q in list_queues(generated) if len(ConsumeQueue(generated, t, q).files) > 1]
    assert multi
    for topic, qid in list_queues(generated):
        cq = ConsumeQueue(generated, topic, qid)
        units = cq.units()
        assert cq.findings == []
        assert units["logical_offset"].tolist() == list(range(cq.max_offset))
        assert len(cq.files) == -(-cq.max_offset // 300)
    assert (generated / "checkpoint").stat().st_size == 4096
    assert {p.name for p in (generated / "config").iterdir()} >= {"topics.json", "consumerOffset.json",
                                                                   "subscriptionGroup.json", "delayOffset.json"}


def test_exactly_the_requested_number_of_messages(tmp_path):
    for n in (0, 1, 41, 250):
        store = tmp_path / f"n{n}"
        result = generate_store(store, GenerateSpec(messages=n, segment_bytes=SEG, index_slots=100,
                                                    index_entries=400, cq_file_bytes=CQ_FILE, seed=n))
        assert result.messages == n
        report = verify_store(store)
        assert (report.records, report.findings) == (n, [])
        assert sum(1 for _ in CommitLog.open(store).iter_records()) == n


def test_same_seed_same_bytes_other_seed_differs(generated, tmp_path, monkeypatch):
    again = tmp_path / "again"
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)  # a later run: the wall clock must not leak in
    generate_store(again, _spec())
    monkeypatch.undo()
    a, b = _files(generated), _files(again)
    assert sorted(a) == sorted(b)
    assert any(k.startswith("index/") for k in a) and any(k.startswith("consumequeue/") for k in a)
    assert any(k.startswith("config/") for k in a) and "checkpoint" in a
    for name in a:
        assert a[name] == b[name], name
    other = tmp_path / "other"
    generate_store(other, _spec(seed=12))
    c = _files(other)
    assert c["commitlog/" + "0" * 20] != a["commitlog/" + "0" * 20]
    assert any(c.get(k) != v for k, v in a.items() if k.startswith("consumequeue/"))
    assert sum(1 for _ in CommitLog.open(other).iter_records()) == MESSAGES


def test_generate_refuses_an_existing_commitlog(generated):
    with pytest.raises(FileExistsError):
        generate_store(generated, _spec())


@pytest.mark.parametrize("kwargs", [dict(messages=-1), dict(messages=1, body_bytes=4 * 1024 * 1024 + 1),
                                    dict(messages=1, topics=0), dict(messages=1, segment_bytes=1024),
                                    dict(messages=1, body_bytes=100_000, segment_bytes=256 * 1024)])
def test_spec_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        GenerateSpec(**kwargs)


def test_generated_store_has_the_special_kinds(generated, rows):
    by_offset = {r["commitlog_offset"]: r for r in rows}
    topics = Counter(r["topic"] for r in rows)
    # delayed messages: stored under SCHEDULE_TOPIC_XXXX with REAL_TOPIC/REAL_QID, queue = level - 1
    sched = [r for r in rows if r["topic"] == SCHEDULE_TOPIC]
    assert sched
    for r in sched:
        props = dict(r["properties"])
        assert r["real_topic"] == props["REAL_TOPIC"] != SCHEDULE_TOPIC
        assert r["queue_id"] == int(props["DELAY"]) - 1
        assert "REAL_QID" in props
    # consumer retries and the dead-letter queue
    retry = [r for r in rows if r["topic"].startswith(RETRY_GROUP_TOPIC_PREFIX)]
    dlq = [r for r in rows if r["topic"].startswith(DLQ_GROUP_TOPIC_PREFIX)]
    assert retry and dlq
    assert all(r["queue_id"] == 0 and r["reconsume_times"] == 17 for r in dlq)
    assert all("RETRY_TOPIC" in dict(r["properties"]) for r in retry + dlq)
    assert any(r["real_topic"].startswith(RETRY_GROUP_TOPIC_PREFIX) for r in sched)
    # transactions: a COMMIT record points at its half message
    commits = [r for r in rows if r["transaction_type"] == "COMMIT"]
    assert commits and topics[TRANS_HALF_TOPIC] == len(commits)
    for c in commits:
        half = by_offset[c["prepared_transaction_offset"]]
        assert half["topic"] == TRANS_HALF_TOPIC
        assert half["real_topic"] == c["topic"] and dict(half["properties"])["TRAN_MSG"] == "true"
        assert half["body"] == c["body"]
    # compressed bodies of all three codecs, decompressed by the decoder
    assert {r["compression"] for r in rows} == {"NONE", "ZLIB", "LZ4", "ZSTD"}
    for r in rows:
        if r["compression"] != "NONE":
            assert len(r["body"]) >= 4096 and r["sys_flag"] & 1
    # producers on IPv6 hosts
    v6 = [r for r in rows if r["born_host"].startswith("[2001:db8::")]
    assert v6 and all(r["sys_flag"] & 0x10 for r in v6)
    assert {r["store_host"] for r in rows} == {"192.168.0.10:10911"}
    # 4.x batches: consecutive records, one store timestamp, consecutive queue offsets
    batches = 0
    for i in range(len(rows) - 3):
        run = rows[i:i + 4]
        if all(dict(r["properties"]).get("WAIT") == "true" for r in run) and len(
                {(r["topic"], r["queue_id"], r["store_timestamp"]) for r in run}) == 1:
            assert [r["commitlog_offset"] for r in run[1:]] == [r["commitlog_offset"] + r["store_size"]
                                                                for r in run[:-1]]
            assert [r["queue_offset"] for r in run] == list(range(run[0]["queue_offset"], run[0]["queue_offset"] + 4))
            batches += 1
    assert batches >= 5


def test_generated_keys_are_found_through_the_index(generated, rows):
    log = CommitLog.open(generated)
    index = IndexService(generated)
    try:
        for r in rows[::397]:
            assert r["commitlog_offset"] in index.query(r["topic"], r["uniq_key"], 0, 1 << 62, log)
            assert r["commitlog_offset"] in index.query(r["topic"], r["keys"][0], 0, 1 << 62, log)
    finally:
        index.close()


def test_golden_store_verifies_clean(golden_store, golden_meta):
    report = verify_store(golden_store)
    assert report.findings == []
    assert report.records == golden_meta["messagesInCommitLog"] == 2001
    assert report.cq_units == golden_meta["messagesInConsumeQueues"] == 1986
    assert report.segments == 5 and report.index_files == 13
    assert report.data_end == golden_meta["maxPhyOffset"]


# ---- planted defects -----------------------------------------------------------------------------------

def _segment_of(store: Path, offset: int):
    seg = CommitLog.open(store).segment_for(offset)
    return seg, offset - seg.base


def _body_position(store: Path, offset: int) -> tuple[int, int]:
    rec = CommitLog.open(store).read_record(offset)
    assert isinstance(rec, MessageRecord)
    return offset + 72 + rec.born_host.size + rec.store_host.size, len(rec.body)


def test_flipped_body_byte_is_a_crc_mismatch(generated, rows, tmp_path):
    victim = next(r for r in rows[1500:] if r["compression"] == "NONE" and len(r["body"]) > 100)
    store = _copy(generated, tmp_path)
    body_at, body_len = _body_position(store, victim["commitlog_offset"])
    seg, pos = _segment_of(store, body_at + body_len // 2)
    byte = seg.path.read_bytes()[pos]
    _write(seg.path, pos, bytes([byte ^ 0xFF]))
    found = verify_store(store).findings
    seg, rec_pos = _segment_of(store, victim["commitlog_offset"])
    assert _where(found) == [(str(seg.path), rec_pos, fk.CRC_MISMATCH)]
    assert found[0].physical_offset == victim["commitlog_offset"]


def _multi_file_queue(store: Path) -> tuple[str, int, ConsumeQueue]:
    for topic, qid in list_queues(store):
        cq = ConsumeQueue(store, topic, qid)
        if len(cq.files) > 1:
            return topic, qid, cq
    raise AssertionError("no queue spans two files")


def test_cq_unit_pointing_nowhere_is_dangling(generated, tmp_path):
    store = _copy(generated, tmp_path)
    topic, qid, cq = _multi_file_queue(store)
    logical = 305  # in the queue's second file
    unit = cq.unit_at(logical)
    path, pos = _cq_unit_path(store, topic, qid, logical)
    assert path == cq.files[1].path and pos == 100
    _write(path, pos, struct.pack(">q", unit.commitlog_offset + 1))
    found = verify_store(store).findings
    assert _where(found) == [(str(path), pos, fk.CQ_DANGLING), (str(path), pos, fk.CQ_MISSING)]
    assert str(unit.commitlog_offset + 1) in found[0].detail
    assert found[1].physical_offset == unit.commitlog_offset  # the record that lost its unit


def test_cq_unit_with_wrong_size_is_a_mismatch(generated, tmp_path):
    store = _copy(generated, tmp_path)
    topic, qid, cq = _multi_file_queue(store)
    logical = 17
    unit = cq.unit_at(logical)
    path, pos = _cq_unit_path(store, topic, qid, logical)
    _write(path, pos + 8, struct.pack(">i", unit.size + 1))
    found = verify_store(store).findings
    assert _where(found) == [(str(path), pos, fk.CQ_MISMATCH)]
    assert f"size {unit.size + 1} != record size {unit.size}" in found[0].detail


def test_zeroed_last_unit_leaves_a_record_without_unit(generated, tmp_path):
    store = _copy(generated, tmp_path)
    topic, qid = "demo-topic-1", 0
    cq = ConsumeQueue(store, topic, qid)
    logical = cq.max_offset - 1
    unit = cq.unit_at(logical)
    path, pos = _cq_unit_path(store, topic, qid, logical)
    _write(path, pos, bytes(CQ_STORE_UNIT_SIZE))
    found = verify_store(store).findings
    assert _where(found) == [(str(path), pos, fk.CQ_MISSING)]
    assert found[0].physical_offset == unit.commitlog_offset


def test_torn_tail(generated, rows, tmp_path):
    store = _copy(generated, tmp_path)
    last = rows[-1]
    seg, pos = _segment_of(store, last["commitlog_offset"])
    half = last["store_size"] // 2
    _write(seg.path, pos + half, bytes(last["store_size"] - half))
    found = verify_store(store).findings
    torn = [f for f in found if f.kind == fk.TORN_TAIL]
    assert _where(torn) == [(str(seg.path), pos, fk.TORN_TAIL)]
    assert torn[0].physical_offset == last["commitlog_offset"]
    assert 0 < torn[0].bytes_skipped <= half
    # its consume-queue unit now points at nothing
    cq = ConsumeQueue(store, last["topic"], last["queue_id"])
    path, upos = _cq_unit_path(store, last["topic"], last["queue_id"], last["queue_offset"])
    assert cq.unit_at(last["queue_offset"]).commitlog_offset == last["commitlog_offset"]
    assert sorted(_where(found)) == sorted([(str(seg.path), pos, fk.TORN_TAIL), (str(path), upos, fk.CQ_DANGLING)])


def test_last_file_of_wrong_length(generated, rows, tmp_path):
    store = _copy(generated, tmp_path)
    seg = CommitLog.open(store).segments[-1]
    end = rows[-1]["commitlog_offset"] + rows[-1]["store_size"] - seg.base
    with open(seg.path, "r+b") as fh:
        fh.truncate(end + 1000)  # no data lost, but Apache refuses a file of the wrong length
    report = verify_store(store)
    assert _where(report.findings) == [(str(seg.path), 0, fk.WRONG_FILE_SIZE)]
    assert report.records == MESSAGES


def test_middle_file_truncated(generated, rows, tmp_path):
    store = _copy(generated, tmp_path)
    seg = CommitLog.open(store).segments[1]
    in_seg = [r for r in rows if seg.base <= r["commitlog_offset"] < seg.base + SEG]
    cut_at = in_seg[len(in_seg) // 2]
    cut = cut_at["commitlog_offset"] - seg.base + 40  # keep 40 bytes of this record's header
    with open(seg.path, "r+b") as fh:
        fh.truncate(cut)
    report = verify_store(store)
    lost = [r for r in in_seg if r["commitlog_offset"] >= cut_at["commitlog_offset"]]
    lost_units = sorted(_cq_unit_path(store, r["topic"], r["queue_id"], r["queue_offset"]) for r in lost)
    log_findings = [f for f in report.findings if f.kind != fk.CQ_DANGLING]
    pos = cut_at["commitlog_offset"] - seg.base
    assert sorted(_where(log_findings)) == sorted([
        (str(seg.path), 0, fk.WRONG_FILE_SIZE),
        (str(seg.path), pos, fk.TORN_TAIL),
        (str(seg.path), pos, fk.MISSING_BLANK),
    ])
    assert sorted((Path(f.file), f.offset) for f in report.findings if f.kind == fk.CQ_DANGLING) == lost_units
    assert report.records == MESSAGES - len(lost)


def test_zeroed_blank_of_a_middle_file(generated, rows, tmp_path):
    store = _copy(generated, tmp_path)
    seg = CommitLog.open(store).segments[2]
    blank_at = max(r["commitlog_offset"] + r["store_size"] for r in rows
                   if seg.base <= r["commitlog_offset"] < seg.base + SEG) - seg.base
    assert seg.path.read_bytes()[blank_at + 4:blank_at + 8] == struct.pack(">I", BLANK_MAGIC_CODE)
    _write(seg.path, blank_at, bytes(8))
    report = verify_store(store)
    assert _where(report.findings) == [(str(seg.path), blank_at, fk.MISSING_BLANK)]
    assert report.findings[0].physical_offset == seg.base + blank_at
    assert report.records == MESSAGES


def test_deleted_queue_directory_reports_where_each_unit_belongs(generated, rows, tmp_path):
    store = _copy(generated, tmp_path)
    topic, qid = "demo-topic-2", 1
    shutil.rmtree(queue_dir(store, topic, qid))
    found = verify_store(store).findings
    records = [r for r in rows if (r["topic"], r["queue_id"]) == (topic, qid)]
    assert records
    want = [(str(p), pos, fk.CQ_MISSING) for p, pos in
            (_cq_unit_path(store, topic, qid, r["queue_offset"]) for r in records)]
    assert _where(found) == want
    assert [f.physical_offset for f in found] == [r["commitlog_offset"] for r in records]
