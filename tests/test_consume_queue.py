"""ConsumeQueue / CQ-ext against Apache RocketMQ 4.9.8's own store: every unit, byte-exact rebuild,
time search, tagsCode rules, pre-blank fill, ext addresses, damaged files."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from broker.store import findings as fk
from broker.store.commitlog import CommitLog
from broker.store.constants import (
    CONSUME_QUEUE_DIR,
    CONSUME_QUEUE_EXT_DIR,
    CQ_EXT_ADDR_BASE,
    CQ_EXT_MAX_ADDR,
    CQ_FILL_UNIT_SIZE,
)
from broker.store.consume_queue import (
    CQ_UNIT_DTYPE,
    ConsumeQueue,
    ConsumeQueueDispatcher,
    ConsumeQueueExt,
    CqExtUnit,
    ext_address_to_offset,
    ext_offset_to_address,
    is_ext_address,
    list_queues,
    tags_code_for,
    MinOffsetRule,
    QueueFiles,
    queue_dir,
)
from broker.store.delay import parse_delay_levels
from broker.store.topics import SCHEDULE_TOPIC
from tests.conftest import load_expected

CQ_FILE_SIZE = 2000  # the golden store's mappedFileSizeConsumeQueue (100 units)
UNIT = struct.Struct(">qiq")


@pytest.fixture(scope="module")
def expected_queues(golden_expected) -> dict:
    return load_expected(golden_expected, "expected_queues.json")["queues"]


@pytest.fixture(scope="module")
def golden_log(golden_store) -> CommitLog:
    return CommitLog.open(golden_store)


@pytest.fixture(scope="module")
def rebuilt_store(tmp_path_factory, golden_log) -> Path:
    """Consume queues rebuilt from the golden commitlog by dispatching every record in offset order."""
    out = tmp_path_factory.mktemp("cq_rebuild")
    with ConsumeQueueDispatcher(out, CQ_FILE_SIZE) as dispatcher:
        queued = sum(dispatcher.dispatch(rec) for rec in golden_log.iter_records())
    assert queued == 1986  # messagesInConsumeQueues: 2001 minus 10 PREPARED and 5 ROLLBACK
    return out


def _cq_files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in (root / CONSUME_QUEUE_DIR).rglob("*") if p.is_file())


def _copy_queue(golden_store: Path, dst: Path, topic: str, queue_id: int) -> Path:
    src = golden_store / CONSUME_QUEUE_DIR / topic / str(queue_id)
    target = dst / CONSUME_QUEUE_DIR / topic / str(queue_id)
    shutil.copytree(src, target)
    for p in target.iterdir():
        p.chmod(0o644)
    return target


# ---- golden store ---------------------------------------------------------------------------------------

def test_golden_every_unit_min_max(golden_store, expected_queues):
    for topic, queues in expected_queues.items():
        for qid, exp in queues.items():
            cq = ConsumeQueue(golden_store, topic, int(qid))
            units = cq.units()
            got = np.stack([units["logical_offset"], units["commitlog_offset"],
                            units["size"], units["tags_code"]], axis=1).tolist() if len(units) else []
            assert got == exp["entries"], (topic, qid)
            assert (cq.min_offset, cq.max_offset, cq.max_physic_offset) == \
                (exp["minOffset"], exp["maxOffset"], exp["maxPhysicOffset"]), (topic, qid)
            assert not units["is_ext_address"].any()
            assert cq.findings == []
            assert cq.file_size == CQ_FILE_SIZE or not cq.files  # inferred from the files


def test_golden_unit_at(golden_store, expected_queues):
    exp = expected_queues["TopicPayments"]["1"]  # 219 units over three files
    cq = ConsumeQueue(golden_store, "TopicPayments", 1)
    for logical, phy, size, tags in exp["entries"]:
        unit = cq.unit_at(logical)
        assert (unit.logical_offset, unit.commitlog_offset, unit.size, unit.tags_code) == (logical, phy, size, tags)
        assert not unit.is_ext_address and unit.ext_address is None and not unit.is_fill
    assert cq.unit_at(219) is None and cq.unit_at(-1) is None


def test_golden_units_ranges_and_arrow(golden_store, expected_queues):
    exp = expected_queues["Topic_Events-v1"]["1"]["entries"]
    cq = ConsumeQueue.open(golden_store, "Topic_Events-v1", 1)
    part = cq.units(95, 205)  # spans all three files
    assert part["logical_offset"].tolist() == list(range(95, 205))
    assert part["commitlog_offset"].tolist() == [e[1] for e in exp[95:205]]
    assert len(cq.units(280, 10_000)) == 9  # clipped to max_offset 289
    assert len(cq.units(50, 50)) == 0
    table = cq.units_table(0, 3)
    assert table.column_names == ["logical_offset", "commitlog_offset", "size", "tags_code", "is_ext_address"]
    assert table.column("tags_code").to_pylist() == [e[3] for e in exp[:3]]


def test_golden_missing_queue_is_empty(golden_store, expected_queues):
    # expected_queues lists SCHEDULE_TOPIC_XXXX queues 0-8, which Apache never created on disk.
    assert expected_queues[SCHEDULE_TOPIC]["0"] == {"minOffset": 0, "maxOffset": 0, "maxPhysicOffset": -1,
                                                   "entries": []}
    cq = ConsumeQueue(golden_store, SCHEDULE_TOPIC, 0)
    assert (cq.min_offset, cq.max_offset, cq.max_physic_offset, len(cq.units())) == (0, 0, -1, 0)
    assert cq.unit_at(0) is None


def test_golden_list_queues(golden_store, expected_queues):
    queues = list_queues(golden_store)
    assert queues == sorted(queues)
    on_disk = [(t, int(q)) for t, qs in expected_queues.items() for q, e in qs.items() if e["entries"]]
    assert queues == sorted(on_disk)
    assert len(queues) == 22


def test_golden_min_offset_follows_commitlog_min(golden_store, expected_queues):
    entries = expected_queues["TopicOrders"]["0"]["entries"]
    cq = ConsumeQueue(golden_store, "TopicOrders", 0, commitlog_min_offset=1048576)
    first = next(e for e in entries if e[1] >= 1048576)
    assert cq.min_offset == first[0]
    assert cq.units()["logical_offset"][0] == first[0]
    assert cq.unit_at(first[0] - 1) is None
    assert cq.min_offset_for(10**12) == cq.max_offset == 135  # nothing left: empty


# ---- time search --------------------------------------------------------------------------------------------

def _brute_lower(times: list[int], ts: int, lo: int, hi: int) -> int:
    return next((lo + i for i, t in enumerate(times) if t >= ts), hi)


def _brute_upper(times: list[int], ts: int, lo: int) -> int:
    idx = [lo + i for i, t in enumerate(times) if t <= ts]
    return idx[-1] if idx else lo


def test_search_by_timestamp_matches_brute_force(golden_store, golden_log, golden_records, expected_queues):
    store_time = {r["phyOffset"]: r["storeTimestamp"] for r in golden_records}
    cq = ConsumeQueue(golden_store, "TopicPayments", 1)
    times = [store_time[e[1]] for e in expected_queues["TopicPayments"]["1"]["entries"]]
    assert times == sorted(times)
    probes = sorted({times[0] - 1, times[-1] + 1, *times[::7], *(t + 1 for t in times[::11])})
    for ts in probes:
        assert cq.search_by_timestamp(ts, golden_log, "lower") == _brute_lower(times, ts, 0, 219), ts
        assert cq.search_by_timestamp(ts, golden_log, "upper") == _brute_upper(times, ts, 0), ts
    assert cq.search_by_timestamp(times[-1] + 1, golden_log) == 219  # lower, all older: max_offset
    assert cq.search_by_timestamp(times[0] - 1, golden_log, "upper") == 0  # all newer: min_offset
    with pytest.raises(ValueError):
        cq.search_by_timestamp(0, golden_log, "closest")


def test_search_by_timestamp_equal_store_times(golden_store, golden_log, golden_records, expected_queues):
    """Batch items share one store time: lower gives the first of them, upper the last."""
    store_time = {r["phyOffset"]: r["storeTimestamp"] for r in golden_records}
    for topic, queues in expected_queues.items():
        for qid, exp in queues.items():
            times = [store_time[e[1]] for e in exp["entries"]]
            dup = next((t for a, t in zip(times, times[1:]) if a == t), None)
            if dup is None:
                continue
            cq = ConsumeQueue(golden_store, topic, int(qid))
            assert cq.search_by_timestamp(dup, golden_log, "lower") == times.index(dup)
            assert cq.search_by_timestamp(dup, golden_log, "upper") == len(times) - 1 - times[::-1].index(dup)
            return
    pytest.fail("the golden store has no two units with one store time")


def test_search_on_empty_queue(tmp_path, golden_log):
    assert ConsumeQueue(tmp_path, "T", 0).search_by_timestamp(123, golden_log, "upper") == 0


# ---- writer: byte-exact rebuild ----------------------------------------------------------------------------

def test_rebuild_is_byte_exact(golden_store, rebuilt_store):
    golden = _cq_files(golden_store)
    assert _cq_files(rebuilt_store) == golden
    assert len(golden) == 35
    for rel in golden:
        assert (rebuilt_store / rel).read_bytes() == (golden_store / rel).read_bytes(), rel


def test_dispatch_tags_codes_match_apache(golden_log, golden_records):
    by_offset = {r["phyOffset"]: r for r in golden_records}
    levels = parse_delay_levels()
    scheduled = 0
    for rec in golden_log.iter_records():
        exp = by_offset[rec.physical_offset]
        if not exp["inConsumeQueue"]:
            assert exp["transactionType"] in ("PREPARED", "ROLLBACK")
            continue
        assert (exp["cqTopic"], exp["cqQueueId"], exp["cqLogicOffset"]) == (rec.topic, rec.queue_id, rec.queue_offset)
        assert tags_code_for(rec.topic, rec.properties, rec.store_timestamp, levels) == exp["cqTagsCode"]
        scheduled += rec.topic == SCHEDULE_TOPIC
    assert scheduled == 67  # 49 delayed + 18 scheduled retries, all with a deliver-time tagsCode


def test_redispatch_is_idempotent_and_resumes(tmp_path, golden_store, golden_log, rebuilt_store):
    records = list(golden_log.iter_records())
    # Everything again into the finished rebuild: nothing is written.
    with ConsumeQueueDispatcher(rebuilt_store, CQ_FILE_SIZE) as again:
        assert sum(again.dispatch(r) for r in records) == 0
    # Half, close, reopen, everything: the reopened writer resumes mid-file and rolls files as Apache.
    half = len(records) // 2
    with ConsumeQueueDispatcher(tmp_path, CQ_FILE_SIZE) as first:
        written_first = sum(first.dispatch(r) for r in records[:half])
    with ConsumeQueueDispatcher(tmp_path) as second:  # file size inferred from the files
        written_second = sum(second.dispatch(r) for r in records)
    assert 0 < written_first < 1986 and written_first + written_second == 1986
    for rel in _cq_files(golden_store):
        assert (tmp_path / rel).read_bytes() == (golden_store / rel).read_bytes(), rel


# ---- tagsCode ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tags, code", [
    ("TagA", 2598919),
    ("标签D", 26572493),
    ("d", 100),
    ("tag with space", -1742848654),  # stored sign-extended as 0xFFFFFFFF981E3D72
    ("😀", 31 * 0xD83D + 0xDE00),  # an emoji is two UTF-16 code units
    ("a😀", (31 * (31 * ord("a") + 0xD83D) + 0xDE00) & 0xFFFFFFFF),
    ("TagA||TagB", None),
    ("", 0),
    (None, 0),
])
def test_tags_code_for_plain_topics(tags, code):
    props = {} if tags is None else {"TAGS": tags}
    value = tags_code_for("TopicOrders", props, 1_700_000_000_000)
    if code is None:  # the whole multi-tag string is hashed
        code = tags_code_for("X", {"TAGS": "TagA||TagB"}, 0)
        assert code not in (tags_code_for("X", {"TAGS": "TagA"}, 0), 0)
    assert value == code


def test_tags_code_sign_extension_in_unit_bytes(tmp_path):
    code = tags_code_for("T", {"TAGS": "tag with space"}, 0)
    with ConsumeQueue(tmp_path, "T", 0, CQ_FILE_SIZE) as cq:
        cq.put(0, 0, 100, code)
    raw = (tmp_path / CONSUME_QUEUE_DIR / "T" / "0" / "00000000000000000000").read_bytes()
    assert raw[12:20] == bytes.fromhex("FFFFFFFF981E3D72")


def test_tags_code_for_schedule_topic():
    ts = 1_795_240_278_915
    levels = parse_delay_levels()
    assert tags_code_for(SCHEDULE_TOPIC, {"DELAY": "3", "TAGS": "TagA"}, ts) == ts + 10_000
    assert tags_code_for(SCHEDULE_TOPIC, {"DELAY": "18"}, ts, levels) == ts + 7_200_000
    assert tags_code_for(SCHEDULE_TOPIC, {"DELAY": "99"}, ts, levels) == ts + 7_200_000  # clamped to 18
    assert tags_code_for(SCHEDULE_TOPIC, {"DELAY": "+2"}, ts, levels) == ts + 5_000  # Integer.parseInt
    assert tags_code_for(SCHEDULE_TOPIC, {"DELAY": "0", "TAGS": "TagA"}, ts) == 2598919
    assert tags_code_for(SCHEDULE_TOPIC, {"DELAY": "-1", "TAGS": "TagA"}, ts) == 2598919
    assert tags_code_for(SCHEDULE_TOPIC, {"DELAY": "x1", "TAGS": "TagA"}, ts) == 2598919
    assert tags_code_for(SCHEDULE_TOPIC, {"TAGS": "TagA"}, ts) == 2598919
    # A delivered copy keeps DELAY on disk but is not in the delay topic: tag hash.
    assert tags_code_for("%RETRY%groupA", {"DELAY": "3", "TAGS": "TagA"}, ts) == 2598919
    assert tags_code_for(SCHEDULE_TOPIC, {"DELAY": "2"}, ts, parse_delay_levels("1s 1m 1h")) == ts + 60_000


# ---- writer: pre-blank fill, gaps ---------------------------------------------------------------------------

def test_pre_blank_fill(tmp_path):
    with ConsumeQueue(tmp_path, "T", 3, CQ_FILE_SIZE) as cq:
        assert cq.put(150, 5000, 300, 7)
        assert cq.put(151, 5300, 200, 8)
        assert (cq.min_offset, cq.max_offset) == (150, 152)
    qdir = tmp_path / CONSUME_QUEUE_DIR / "T" / "3"
    assert [p.name for p in qdir.iterdir()] == ["00000000000000002000"]  # 150*20 - 150*20 % 2000
    raw = (qdir / "00000000000000002000").read_bytes()
    assert len(raw) == CQ_FILE_SIZE
    assert raw[:1000] == UNIT.pack(0, CQ_FILL_UNIT_SIZE, 0) * 50
    assert raw[1000:1040] == UNIT.pack(5000, 300, 7) + UNIT.pack(5300, 200, 8)
    assert raw[1040:] == bytes(960)

    reopened = ConsumeQueue(tmp_path, "T", 3)
    assert (reopened.min_offset, reopened.max_offset, reopened.max_physic_offset) == (150, 152, 5500)
    assert reopened.unit_at(149) is None
    assert reopened.units()["logical_offset"].tolist() == [150, 151]
    fills = reopened.units(100, 150)
    assert len(fills) == 50 and (fills["size"] == CQ_FILL_UNIT_SIZE).all() and (fills["commitlog_offset"] == 0).all()
    assert reopened.findings == []
    # Writing on crosses into the next file, named by its first unit × 20.
    for i in range(152, 201):
        assert reopened.put(i, 5500 + (i - 152) * 10, 10, 0)
    reopened.close()
    assert sorted(p.name for p in qdir.iterdir()) == ["00000000000000002000", "00000000000000004000"]
    assert ConsumeQueue(tmp_path, "T", 3).max_offset == 201


def test_offset_gap_is_written_at_write_position_like_apache(tmp_path):
    cq = ConsumeQueue(tmp_path, "T", 0, CQ_FILE_SIZE)
    cq.put(0, 0, 100, 1)
    assert cq.put(5, 100, 100, 2)  # a dispatcher bug: Apache logs and appends at offset 1
    assert [f.kind for f in cq.findings] == [fk.CQ_OFFSET_GAP]
    assert cq.findings[0].offset == 20
    assert cq.units()["commitlog_offset"].tolist() == [0, 100]
    assert not cq.put(1, 100, 100, 2)  # already there
    cq.close()


def test_unit_dtype_is_vectorised_layout():
    assert CQ_UNIT_DTYPE.itemsize == 20
    rows = np.frombuffer(UNIT.pack(1, 2, -3) + UNIT.pack(4, 5, 6), CQ_UNIT_DTYPE)
    assert rows["tags_code"].tolist() == [-3, 6]


# ---- ext ------------------------------------------------------------------------------------------------------

def test_ext_address_arithmetic():
    assert ext_offset_to_address(0) == CQ_EXT_ADDR_BASE == -(1 << 63)
    assert ext_address_to_offset(ext_offset_to_address(12345)) == 12345
    assert is_ext_address(CQ_EXT_MAX_ADDR) and is_ext_address(CQ_EXT_ADDR_BASE)
    assert not is_ext_address(CQ_EXT_MAX_ADDR + 1)
    assert not is_ext_address(-(1 << 31))  # Integer.MIN_VALUE is still a possible tag hash


def test_ext_write_read_roll(tmp_path):
    codes = [2598919, -1742848654, 0, 100, 26572493, 7]
    with ConsumeQueue(tmp_path, "T", 0, CQ_FILE_SIZE, enable_ext=True, ext_file_size=100) as cq:
        for i, code in enumerate(codes):
            assert cq.put(i, i * 1000, 500, code, store_timestamp=1000 + i, filter_bitmap=b"\x01\x02" if i == 1 else b"")
    # Units of 20 bytes (22 with the bitmap); a unit must leave 4 bytes: 0, 20, 42, 62 fit, then FFFF.
    ext_dir = tmp_path / CONSUME_QUEUE_EXT_DIR / "T" / "0"
    assert sorted(p.name for p in ext_dir.iterdir()) == ["00000000000000000000", "00000000000000000100"]
    first = (ext_dir / "00000000000000000000").read_bytes()
    assert first[82:84] == b"\xff\xff"
    assert first[:20] == struct.pack(">hqqh", 20, 2598919, 1000, 0)

    raw = np.frombuffer((tmp_path / CONSUME_QUEUE_DIR / "T" / "0" / "00000000000000000000").read_bytes(),
                        CQ_UNIT_DTYPE)
    stored = raw["tags_code"][:6].tolist()
    assert stored == [ext_offset_to_address(o) for o in (0, 20, 42, 62, 100, 120)]
    assert stored[0] == -(1 << 63)

    reader = ConsumeQueue(tmp_path, "T", 0)  # ext not enabled: found because the ext dir exists
    unit = reader.unit_at(1)
    assert (unit.tags_code, unit.is_ext_address, unit.ext_address) == (-1742848654, True, stored[1])
    units = reader.units()
    assert units["tags_code"].tolist() == codes and units["is_ext_address"].all()
    assert reader.ext.get(stored[1]) == CqExtUnit(-1742848654, 1001, b"\x01\x02")
    assert [u.tags_code for _, u in ConsumeQueueExt(tmp_path, "T", 0).iter_units()] == codes

    # Without the ext files the address is all there is.
    shutil.rmtree(tmp_path / CONSUME_QUEUE_EXT_DIR)
    bare = ConsumeQueue(tmp_path, "T", 0).unit_at(0)
    assert (bare.tags_code, bare.is_ext_address) == (CQ_EXT_ADDR_BASE, True)


def test_ext_writer_resumes_after_reopen(tmp_path):
    ext = ConsumeQueueExt(tmp_path, "T", 0, 100)
    a = ext.put(CqExtUnit(1, 2))
    ext.close()
    b = ConsumeQueueExt(tmp_path, "T", 0).put(CqExtUnit(3, 4))  # size inferred from the file
    assert ext_address_to_offset(b) - ext_address_to_offset(a) == 20


def test_ext_damaged_unit_is_a_finding(tmp_path):
    ext_dir = tmp_path / CONSUME_QUEUE_EXT_DIR / "T" / "0"
    ext_dir.mkdir(parents=True)
    data = bytearray(100)
    data[0:20] = struct.pack(">hqqh", 25, 1, 2, 0)  # size says a 5-byte bitmap, bitmap length says 0
    (ext_dir / "00000000000000000000").write_bytes(bytes(data))
    ext = ConsumeQueueExt(tmp_path, "T", 0)
    assert ext.get(CQ_EXT_ADDR_BASE) is None
    assert ext.get(ext_offset_to_address(500)) is None
    assert [(f.kind, f.offset) for f in ext.findings] == [(fk.CQ_EXT_BAD_UNIT, 0), (fk.CQ_EXT_BAD_UNIT, 500)]
    assert list(ext.iter_units()) == []


# ---- damaged files -------------------------------------------------------------------------------------------

def test_wrong_length_file(tmp_path, golden_store):
    qdir = _copy_queue(golden_store, tmp_path, "TopicPayments", 1)
    middle = qdir / "00000000000000002000"
    with open(middle, "r+b") as fh:
        fh.truncate(1990)  # cuts the last unit in half
    cq = ConsumeQueue(tmp_path, "TopicPayments", 1, CQ_FILE_SIZE)
    assert cq.max_offset == 199  # the half unit reads as size 0 and ends the data
    found = [(f.kind, Path(f.file).name, f.offset) for f in cq.findings]
    assert found == [
        (fk.WRONG_FILE_SIZE, "00000000000000002000", 0),
        (fk.CQ_BAD_UNIT, "00000000000000002000", 1980),
        (fk.CQ_DATA_AFTER_END, "00000000000000002000", 1980),
        (fk.CQ_DATA_AFTER_END, "00000000000000004000", 0),
    ]
    assert len(cq.units()) == 199
    cq.refresh()  # reading again does not report the same problems twice
    assert cq.max_offset == 199 and len(cq.findings) == 4


def test_bad_file_names_are_ignored(tmp_path, golden_store):
    qdir = _copy_queue(golden_store, tmp_path, "%DLQ%groupA", 0)
    (qdir / "notes.txt").write_bytes(b"x")
    (qdir / "00000000000000000010").write_bytes(bytes(CQ_FILE_SIZE))  # not a unit boundary
    cq = ConsumeQueue(tmp_path, "%DLQ%groupA", 0)  # the odd name must not spoil the size inference
    assert cq.file_size == CQ_FILE_SIZE
    assert sorted((f.kind, Path(f.file).name) for f in cq.findings) == [
        (fk.BAD_FILE_NAME, "00000000000000000010"), (fk.BAD_FILE_NAME, "notes.txt")]
    assert "consume queue" in cq.findings[0].detail
    assert cq.max_offset == 33 and [f.path.name for f in cq.files] == ["00000000000000000000"]


def test_garbage_units(tmp_path):
    qdir = tmp_path / CONSUME_QUEUE_DIR / "T" / "0"
    qdir.mkdir(parents=True)
    data = bytearray(CQ_FILE_SIZE)
    units = [UNIT.pack(100, 10, 0), UNIT.pack(200, 10, 0), UNIT.pack(150, 10, 0), UNIT.pack(0, CQ_FILL_UNIT_SIZE, 0)]
    data[:80] = b"".join(units)
    data[80:100] = b"\xff" * 20  # phy -1: not a valid unit, data ends here
    data[100:400] = os.urandom(300)  # more garbage after the end
    data[399] = 1
    (qdir / "00000000000000000000").write_bytes(bytes(data))
    cq = ConsumeQueue(tmp_path, "T", 0)
    assert cq.max_offset == 4
    assert cq.units()["commitlog_offset"].tolist() == [100, 200, 150, 0]
    kinds = [(f.kind, f.offset) for f in cq.findings]
    assert (fk.CQ_BAD_UNIT, 80) in kinds
    assert (fk.CQ_DATA_AFTER_END, 80) in kinds
    assert (fk.CQ_BAD_UNIT, 40) in kinds  # offset 150 after 200: does not increase
    assert (fk.CQ_BAD_UNIT, 60) in kinds  # a fill unit after real units
    after_end = next(f for f in cq.findings if f.kind == fk.CQ_DATA_AFTER_END)
    assert after_end.bytes_skipped == 320 and after_end.file.endswith("00000000000000000000")


def test_all_garbage_file_terminates(tmp_path):
    qdir = tmp_path / CONSUME_QUEUE_DIR / "T" / "0"
    qdir.mkdir(parents=True)
    (qdir / "00000000000000000000").write_bytes(b"\xff" * 2000)
    (qdir / "00000000000000002000").write_bytes(b"\xff" * 2000)
    cq = ConsumeQueue(tmp_path, "T", 0)
    assert (cq.min_offset, cq.max_offset, len(cq.units())) == (0, 0, 0)
    assert {f.kind for f in cq.findings} == {fk.CQ_BAD_UNIT, fk.CQ_DATA_AFTER_END}
    with pytest.raises(RuntimeError):  # data ends before the last file: no appending
        cq.put(0, 0, 1, 0)


def test_read_only_golden_queue_is_not_modified_by_reading(golden_store):
    before = (golden_store / CONSUME_QUEUE_DIR / "TopicOrders" / "0" / "00000000000000000000").stat().st_mtime_ns
    ConsumeQueue(golden_store, "TopicOrders", 0).units()
    after = (golden_store / CONSUME_QUEUE_DIR / "TopicOrders" / "0" / "00000000000000000000").stat().st_mtime_ns
    assert before == after


# ---- paths --------------------------------------------------------------------------------------------------

def test_list_queues_ignores_odd_dirs_and_escapes(tmp_path):
    store = tmp_path / "store"
    root = store / CONSUME_QUEUE_DIR
    (root / "T" / "0").mkdir(parents=True)
    (root / "T" / "12").mkdir()
    (root / "T" / "abc").mkdir()
    (root / "T" / "3").write_bytes(b"")  # a file, not a queue directory
    (root / "%RETRY%g" / "0").mkdir(parents=True)
    outside = tmp_path / "outside"
    (outside / "0").mkdir(parents=True)
    (root / "evil").symlink_to(outside, target_is_directory=True)
    (root / "T" / "7").symlink_to(outside / "0", target_is_directory=True)
    assert list_queues(store) == [("%RETRY%g", 0), ("T", 0), ("T", 12)]
    assert list_queues(tmp_path / "nowhere") == []


@pytest.mark.parametrize("topic", ["", ".", "..", "../x", "a/b", "a\\b", "nul\x00"])
def test_topic_cannot_escape_store(tmp_path, topic):
    with pytest.raises(ValueError):
        ConsumeQueue(tmp_path, topic, 0)


def test_symlinked_topic_is_refused(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / CONSUME_QUEUE_DIR).mkdir()
    (tmp_path / CONSUME_QUEUE_DIR / "evil").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(ValueError):
        ConsumeQueue(tmp_path, "evil", 0)
    with pytest.raises(ValueError):
        ConsumeQueue(tmp_path, "T", -1)


def test_refresh_sees_appends_by_another_writer(tmp_path):
    reader = ConsumeQueue(tmp_path, "T", 0, CQ_FILE_SIZE)
    assert reader.max_offset == 0
    with ConsumeQueue(tmp_path, "T", 0, CQ_FILE_SIZE) as writer:
        for i in range(3):
            writer.put(i, i * 100, 100, 0)
    assert reader.max_offset == 0  # what was read is kept until refresh
    reader.refresh()
    assert (reader.max_offset, reader.unit_at(2).commitlog_offset, reader.findings) == (3, 200, [])


# ---- the broker's reader (QueueFiles) and the inspector's agree ----------------------------------------------

def _queue_of(tmp_path: Path, units: int, per_file: int = 10) -> tuple[Path, int]:
    """A queue of ``units`` units (unit i points at commitlog offset 100 * i, 100 bytes)."""
    with ConsumeQueue(tmp_path, "G", 0, 20 * per_file) as cq:
        for i in range(units):
            assert cq.put(i, 100 * i, 100, i)
    return queue_dir(tmp_path, "G", 0), 20 * per_file


def test_deleted_middle_file_is_skipped_and_reported_not_dropped(tmp_path, caplog):
    from broker.engine.dispatch import ConsumeQueueView

    directory, size = _queue_of(tmp_path, 35)
    os.remove(directory / "00000000000000000200")  # units 10..19
    view = ConsumeQueueView(tmp_path, "G", 0, size, max_offset=35)
    assert view.read_units(5, 32)["commitlog_offset"].tolist() == [500, 600, 700, 800, 900]  # up to file end
    with caplog.at_level("WARNING"):
        assert len(view.read_units(12, 32)) == 0
        assert len(view.read_units(15, 32)) == 0
    assert [r.getMessage() for r in caplog.records if "missing" in r.getMessage()] == [
        f"consume queue {directory}: file 00000000000000000200 is missing; its units are skipped"]  # once
    assert view.read_units(20, 32)["commitlog_offset"].tolist() == [100 * i for i in range(20, 30)]
    assert view.read_units(30, 32)["commitlog_offset"].tolist() == [100 * i for i in range(30, 35)]
    inspector = ConsumeQueue(tmp_path, "G", 0, size)
    assert inspector.units()["logical_offset"].tolist() == list(range(10)) + list(range(20, 35))
    assert [f.kind for f in inspector.findings] == [fk.FILE_GAP]
    assert (inspector.min_offset, inspector.max_offset) == (view.min_offset, view.max_offset) == (0, 35)


def test_min_offset_rules(tmp_path):
    from broker.engine.dispatch import ConsumeQueueView

    directory, size = _queue_of(tmp_path, 25)
    commitlog_min = 1200  # units 0..11 point at records already deleted: the first file has none left
    view = ConsumeQueueView(tmp_path, "G", 0, size, max_offset=25, commitlog_min_offset=commitlog_min)
    inspector = ConsumeQueue(tmp_path, "G", 0, size, commitlog_min_offset=commitlog_min)
    assert view.min_offset == inspector.min_offset == 12
    apache = ConsumeQueueView(tmp_path, "G", 0, size, max_offset=25, commitlog_min_offset=commitlog_min,
                              min_offset_rule=MinOffsetRule.FIRST_FILE)
    assert apache.min_offset == 25  # Apache's first-file rule: no readable unit there, the queue looks empty
    files = QueueFiles(directory, size)
    assert files.min_offset(commitlog_min, 25) == 12
    assert files.min_offset(0, 25) == 0 and files.min_offset(10_000, 25) == 25
    assert files.unit(24) == (2400, 100, 24) and files.unit(25) == (0, 0, 0)


@pytest.mark.parametrize("units", [0, 1, 9, 10, 11, 20, 25])
def test_end_search_agrees_with_the_full_scan(tmp_path, units):
    """QueueFiles' binary search for the written end (recovery's and the remote stores') gives the
    full scan's answer, at and around file boundaries."""
    directory, size = _queue_of(tmp_path, units)
    files, scan = QueueFiles(directory, size), ConsumeQueue(tmp_path, "G", 0, size)
    last = files.bases()[-1] if files.bases() else 0
    assert last // 20 + files.written_units(last) == scan.max_offset == units
    assert files.reach() == scan.max_physic_offset == (100 * units if units else -1)


def test_end_search_on_a_queue_of_fill_units_only(tmp_path):
    with ConsumeQueue(tmp_path, "F", 0, 200) as cq:
        cq.put(13, 5000, 100, 0)  # a queue that starts at 13: fill units up to it
    directory = queue_dir(tmp_path, "F", 0)
    with open(directory / "00000000000000000200", "r+b") as fh:
        fh.truncate(3 * 20)  # keep only fill units 10..12 in the file holding the real unit
    files, scan = QueueFiles(directory, 200), ConsumeQueue(tmp_path, "F", 0, 200)
    assert (files.written_units(200), files.reach()) == (3, -1)
    assert (scan.max_offset, scan.max_physic_offset) == (13, -1)


def test_geometry_names_the_file_and_position_of_a_unit(tmp_path):
    files = QueueFiles(tmp_path, 200)
    assert files.locate(0) == (0, 0) and files.locate(9) == (0, 180) and files.locate(23) == (400, 60)
    assert files.next_file_offset(0) == files.next_file_offset(9) == 10 and files.next_file_offset(10) == 20
    assert files.path_of(200) == tmp_path / "00000000000000000200"


def test_whole_file_reads_go_through_the_queues_reader(tmp_path):
    """ConsumeQueue reads its files only through its reader (the seam a remote store swaps)."""
    _queue_of(tmp_path, 15)
    cq = ConsumeQueue(tmp_path, "G", 0, 200)
    seen: list[tuple[int, int, int]] = []
    plain = cq.reader._read_at

    def counting(base: int, pos: int, length: int) -> bytes | None:
        seen.append((base, pos, length))
        return plain(base, pos, length)

    cq.reader._read_at = counting  # type: ignore[method-assign]
    assert cq.units()["commitlog_offset"].tolist() == [100 * i for i in range(15)]
    assert seen == [(0, 0, 200), (200, 0, 200)]
    assert len(cq.reader.read_file(200)) == 200
    with pytest.raises(FileNotFoundError):
        cq.reader.read_file(400)
