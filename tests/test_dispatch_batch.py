"""The dispatcher's compiled run path (``Dispatcher.catch_up`` over ``CommitLog.follow_runs``)
against Apache's own store and against the per-record path it replaces: byte-identical consume
queues and index files, on the golden store and on generated stores with file rolls, full index
files, transactions, multi-byte text, a torn tail and a corrupt record."""

from __future__ import annotations

import filecmp
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from broker.engine.dispatch import Dispatcher, QueueRegistry
from broker.engine.store_settings import StoreSettings
from broker.store import findings as fk
from broker.store.commitlog import CommitLog, CommitLogWriter
from broker.store.constants import COMMITLOG_DIR, CONSUME_QUEUE_DIR, INDEX_DIR, TRANSACTION_PREPARED_TYPE
from broker.store.consume_queue import tags_code_for
from broker.store.dispatch_fields import STOP_BLANK, STOP_CHECK, STOP_LIMIT, STOP_PYTHON, scan_run
from broker.store.generate import GenerateSpec, generate_store
from broker.store.index_file import build_index_key
from broker.store.java_hash import java_string_hash
from broker.store.message import MessageRecord
from broker.store.properties import encode_properties, split_keys
from broker.store.record_check import BLANK, RecordError, check_record
from broker.store.topics import SCHEDULE_TOPIC

CLOCK_MS = 1_700_000_000_000
SMALL = StoreSettings(segment_bytes=96 * 1024, cq_file_bytes=20 * 50, index_slots=64, index_entries=300,
                      fsync_metadata=False)


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for kind in (CONSUME_QUEUE_DIR, INDEX_DIR) if (root / kind).exists()
                  for p in (root / kind).rglob("*") if p.is_file())


def _assert_same_files(a: Path, b: Path) -> None:
    assert _files(a) == _files(b)
    for rel in _files(a):
        assert filecmp.cmp(a / rel, b / rel, shallow=False), rel


def _dispatch(source: Path, target: Path, settings: StoreSettings, *, per_record: bool,
              to_end: bool = True, steps: int = 1) -> int:
    """Dispatch ``source``'s commitlog into a fresh ``target`` (to the data end like the live
    follower, or to None like recovery; in ``steps`` equal parts); records changed."""
    target.mkdir(parents=True)
    shutil.copytree(source / COMMITLOG_DIR, target / COMMITLOG_DIR)
    dispatcher = Dispatcher(target, settings, QueueRegistry(target, settings.cq_file_bytes), clock=lambda: CLOCK_MS)
    commitlog = CommitLog.open(target, settings.segment_bytes)
    run = dispatcher.catch_up_per_record if per_record else dispatcher.catch_up
    try:
        if not to_end:
            return run(0, None, commitlog)
        end = commitlog.data_end()
        changed, start = 0, 0
        for step in range(1, steps + 1):
            stop = end * step // steps
            changed += run(start, stop, commitlog)
            start = dispatcher.next_offset
        return changed
    finally:
        commitlog.close()
        dispatcher.close()


def _compare(source: Path, tmp: Path, settings: StoreSettings, **kw) -> int:
    old = _dispatch(source, tmp / "old", settings, per_record=True, **kw)
    new = _dispatch(source, tmp / "new", settings, per_record=False, **kw)
    assert new == old
    _assert_same_files(tmp / "old", tmp / "new")
    return new


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """Delays, retries, DLQ, transactions, batches, compression, multi-byte keys; small files so
    the commitlog, the queues and the index all roll."""
    store = tmp_path_factory.mktemp("gen") / "store"
    generate_store(store, GenerateSpec(messages=1500, body_bytes=200, seed=7, segment_bytes=SMALL.segment_bytes,
                                       cq_file_bytes=SMALL.cq_file_bytes, index_slots=SMALL.index_slots,
                                       index_entries=SMALL.index_entries))
    return store


# ---- Apache's store --------------------------------------------------------------------------------------
def test_golden_rebuild_is_byte_exact(tmp_path, golden_store):
    settings = StoreSettings(segment_bytes=CommitLog.open(golden_store).segment_size, cq_file_bytes=2000,
                             index_slots=128, index_entries=512, fsync_metadata=False)
    changed = _dispatch(golden_store, tmp_path / "new", settings, per_record=False)
    assert changed == 2001 - 5  # everything but ROLLBACK is indexed, PREPARED also (10 of them)
    golden_cq = sorted(p.relative_to(golden_store) for p in (golden_store / CONSUME_QUEUE_DIR).rglob("*")
                       if p.is_file())
    mine_cq = sorted(p.relative_to(tmp_path / "new") for p in (tmp_path / "new" / CONSUME_QUEUE_DIR).rglob("*")
                     if p.is_file())
    assert mine_cq == golden_cq and len(golden_cq) == 35
    for rel in golden_cq:
        assert (tmp_path / "new" / rel).read_bytes() == (golden_store / rel).read_bytes(), rel
    golden_index = sorted((golden_store / INDEX_DIR).iterdir())
    mine_index = sorted((tmp_path / "new" / INDEX_DIR).iterdir())
    assert len(mine_index) == len(golden_index) == 13  # names are clock times: compared by order
    for g, m in zip(golden_index, mine_index):
        assert m.read_bytes() == g.read_bytes(), (g.name, m.name)


def test_golden_same_as_per_record(tmp_path, golden_store):
    settings = StoreSettings(segment_bytes=CommitLog.open(golden_store).segment_size, cq_file_bytes=2000,
                             index_slots=128, index_entries=512, fsync_metadata=False)
    assert _compare(golden_store, tmp_path, settings, steps=7) == 1996


# ---- generated stores -----------------------------------------------------------------------------------
@pytest.mark.parametrize("to_end, steps", [(True, 1), (True, 13), (False, 1)])
def test_generated_same_as_per_record(tmp_path, generated, to_end, steps):
    assert _compare(generated, tmp_path, SMALL, to_end=to_end, steps=steps) == 1500
    new = tmp_path / "new"
    assert len(list((new / COMMITLOG_DIR).iterdir())) > 3  # BLANK-ended files were crossed
    assert len(list((new / INDEX_DIR).iterdir())) > 3  # full index files rolled (mid-record too)
    assert any(len(list(d.iterdir())) > 1 for d in (new / CONSUME_QUEUE_DIR).glob("*/*"))  # CQ files rolled


def test_redispatch_changes_nothing(tmp_path, generated):
    _dispatch(generated, tmp_path / "s", SMALL, per_record=False)
    before = {rel: (tmp_path / "s" / rel).read_bytes() for rel in _files(tmp_path / "s")}
    dispatcher = Dispatcher(tmp_path / "s", SMALL, QueueRegistry(tmp_path / "s", SMALL.cq_file_bytes),
                            clock=lambda: CLOCK_MS)
    try:
        assert dispatcher.catch_up(0) == 0
    finally:
        dispatcher.close()
    assert {rel: (tmp_path / "s" / rel).read_bytes() for rel in _files(tmp_path / "s")} == before


def _tamper(generated: Path, dst: Path, edit) -> Path:
    shutil.copytree(generated / COMMITLOG_DIR, dst / COMMITLOG_DIR)
    seg = sorted((dst / COMMITLOG_DIR).iterdir())[1]  # a file in the middle
    data = bytearray(seg.read_bytes())
    log_ = CommitLog.open(dst, SMALL.segment_bytes)
    starts = [r.physical_offset - int(seg.name) for r in log_.iter_records(int(seg.name), int(seg.name) + len(data))]
    edit(data, starts)
    seg.write_bytes(bytes(data))
    return dst


def test_corrupt_record_same_as_per_record(tmp_path, generated, caplog):
    def flip_magic(data: bytearray, starts: list[int]) -> None:
        data[starts[len(starts) // 2] + 4] ^= 0xFF

    source = _tamper(generated, tmp_path / "src", flip_magic)
    for to_end in (True, False):
        changed = _compare(source, tmp_path / str(to_end), SMALL, to_end=to_end)
        assert changed == 1499  # the corrupt record is skipped, the walk resumes after it
    assert "fails its check" in caplog.text  # the follower's warning, from the per-record path


def test_torn_tail_same_as_per_record(tmp_path, generated):
    def tear_rest(data: bytearray, starts: list[int]) -> None:
        cut = starts[-3] + 50  # mid-record: the rest of the file as a crash left it (zeros)
        data[cut:] = bytes(len(data) - cut)

    source = _tamper(generated, tmp_path / "src", tear_rest)
    assert _compare(source, tmp_path / "a", SMALL, to_end=False) == _compare(source, tmp_path / "b", SMALL)


# ---- the kernel itself ------------------------------------------------------------------------------------
def _write(tmp_path: Path, records: list[tuple[str, dict[str, str], int]]) -> CommitLog:
    with CommitLogWriter(tmp_path, segment_size=1 << 16) as writer:
        for i, (topic, props, sys_flag) in enumerate(records):
            writer.append(MessageRecord(topic=topic, body=b"body-%d" % i, properties_raw=encode_properties(props),
                                        queue_id=i % 2, queue_offset=i // 2, sys_flag=sys_flag), CLOCK_MS + i * 1500)
    return CommitLog.open(tmp_path)


def _expected_key_hashes(rec: MessageRecord) -> list[int]:
    props = rec.properties
    keys = ([props["UNIQ_KEY"]] if "UNIQ_KEY" in props else []) + split_keys(props.get("KEYS"))
    return [java_string_hash(build_index_key(rec.topic, k)) for k in keys]


def test_kernel_fields_match_the_codec(tmp_path):
    log_ = _write(tmp_path, [
        ("主题-🚀", {"TAGS": "支付", "KEYS": "заказ 🚀  a", "UNIQ_KEY": "U1"}, 0),
        ("T", {"TAGS": "région", "KEYS": "x", "TAGS\x01": "y"}, TRANSACTION_PREPARED_TYPE),
        ("T", {"KEYS": "  ", "OTHER": "1"}, 0),
        ("T", {}, 0),
        (SCHEDULE_TOPIC, {"TAGS": "t", "DELAY": "3", "REAL_TOPIC": "T"}, 0),
    ])
    seg = log_.segments[0]
    buf = np.frombuffer(seg.open(), np.uint8)
    run = scan_run(buf, seg.base, 0, len(buf))
    records = list(log_.iter_records())
    assert run.n == len(records) == 5 and run.stop == STOP_CHECK  # END zeros after the last record
    for i, rec in enumerate(records):
        assert (run.phy[i], run.size[i], run.queue_id[i], run.queue_offset[i], run.sys_flag[i], run.store_ts[i]) == (
            rec.physical_offset, rec.total_size, rec.queue_id, rec.queue_offset, rec.sys_flag, rec.store_timestamp)
        assert bytes(buf[run.topic_at[i]:run.topic_at[i] + run.topic_len[i]]).decode() == rec.topic
        hashes = run.key_hash[run.key_first[i]:run.key_first[i] + run.key_count[i]].tolist()
        assert hashes == _expected_key_hashes(rec)
        assert bool(run.delay_topic[i]) == (rec.topic == SCHEDULE_TOPIC)
        if rec.topic != SCHEDULE_TOPIC:
            assert run.tags_code[i] == tags_code_for(rec.topic, rec.properties, rec.store_timestamp)
    assert run.key_count.tolist() == [4, 1, 0, 0, 0]
    limited = scan_run(buf, seg.base, 0, int(run.phy[2]))
    assert (limited.n, limited.stop, limited.stop_pos) == (2, STOP_LIMIT, int(run.phy[2]))
    del buf


def test_kernel_stops_where_python_must_decide(tmp_path):
    log_ = _write(tmp_path, [("T", {"KEYS": "k"}, 0)] * 3)
    seg = log_.segments[0]
    data = bytearray(seg.path.read_bytes())
    records = list(log_.iter_records())
    second = records[1].physical_offset
    # not well-formed UTF-8 in KEYS: Python decodes it with a replacement character, the kernel stops
    at = data.index(b"KEYS\x01k", second) + 5
    data[at] = 0xFF
    run = scan_run(np.frombuffer(bytes(data), np.uint8), 0, 0, len(data))
    assert (run.n, run.stop, run.stop_pos) == (1, STOP_PYTHON, second)
    data[at] = ord("k")
    # a wrong body CRC stops the walk only when the check is on, as check_record raises only then
    data[second + 8] ^= 0x01
    buf = np.frombuffer(bytes(data), np.uint8)
    assert scan_run(buf, 0, 0, len(data)).n == 3
    run = scan_run(buf, 0, 0, len(data), check_crc=True)
    assert (run.n, run.stop, run.stop_pos) == (1, STOP_CHECK, second)
    with pytest.raises(RecordError) as err:
        check_record(bytes(data), second, check_crc=True)
    assert err.value.kind == fk.CRC_MISMATCH


@pytest.mark.parametrize("check_crc", [False, True])
def test_kernel_and_the_record_checker_agree_on_damaged_records(tmp_path, check_crc):
    """The kernel's checks are check_record's (the store's one record checker, whose error the
    Python path reports): over thousands of copies of a record damaged where a check reads (head,
    host fields, BODYLENGTH, body, TOPICLENGTH, PROPERTIESLENGTH), the kernel takes the record
    exactly when check_record accepts it, with the same size and store time, and stops right before
    it exactly when check_record raises."""
    log_ = _write(tmp_path, [("T", {"KEYS": "k", "TAGS": "t"}, 0), ("主题-V", {"KEYS": "k2"}, 0), ("T", {}, 0)])
    seg = log_.segments[0]
    clean = seg.path.read_bytes()
    second = [r.physical_offset for r in log_.iter_records()][1]
    found = check_record(clean, second)
    places = list(range(second, found.body_at + found.body_len)) + [found.topic_at - 1, found.props_at - 2,
                                                                      found.props_at - 1]
    rng = random.Random(11)
    outcomes = {"accepted": 0, "refused": 0}
    for _ in range(3000):
        data = bytearray(clean)
        for at in rng.sample(places, rng.choice((1, 1, 2, 3))):
            data[at] ^= rng.randrange(1, 256)
        buf = bytes(data)
        run = scan_run(np.frombuffer(buf, np.uint8), seg.base, 0, len(buf), check_crc=check_crc)
        try:
            checked = check_record(buf, second, seg.base + second, check_crc=check_crc)
        except RecordError:
            assert (run.n, run.stop, run.stop_pos) == (1, STOP_CHECK, second), data
            outcomes["refused"] += 1
            continue
        if checked.kind == BLANK:
            assert (run.n, run.stop, run.stop_pos) == (1, STOP_BLANK, second)
            continue
        outcomes["accepted"] += 1
        if run.n == 1:  # well-formed, but text the kernel leaves to Python (damaged UTF-8)
            assert (run.stop, run.stop_pos) == (STOP_PYTHON, second)
            continue
        assert (run.phy[1], run.size[1], run.store_ts[1], run.sys_flag[1]) == (
            second, checked.size, checked.store_timestamp, checked.sys_flag)
    assert outcomes["accepted"] > 100 and outcomes["refused"] > 1000, outcomes


def test_kernel_stops_at_a_blank(tmp_path, generated):
    log_ = CommitLog.open(generated, SMALL.segment_bytes)
    seg = log_.segments[0]
    raw = seg.open()
    run = scan_run(np.frombuffer(raw, np.uint8), seg.base, 0, SMALL.segment_bytes)
    assert run.stop == STOP_BLANK
    assert run.n == len(list(log_.iter_records(seg.base, seg.base + SMALL.segment_bytes)))
    del run


def test_long_queue_runs_same_as_per_record(tmp_path):
    """One topic, one queue, a 1 MiB file: long runs of one queue go to the block writer
    (``ConsumeQueue.put_many``), rolling CQ files in the middle of a block."""
    settings = StoreSettings(segment_bytes=1 << 20, cq_file_bytes=20 * 50, index_slots=64, index_entries=300,
                             fsync_metadata=False)
    store = tmp_path / "gen"
    generate_store(store, GenerateSpec(messages=1200, body_bytes=100, topics=1, queues=1, seed=3, special=False,
                                       segment_bytes=settings.segment_bytes, cq_file_bytes=settings.cq_file_bytes,
                                       index_slots=settings.index_slots, index_entries=settings.index_entries))
    assert _compare(store, tmp_path, settings) == 1200
    assert _compare(store, tmp_path / "steps", settings, steps=9) == 1200
    assert len(list((tmp_path / "new" / CONSUME_QUEUE_DIR).glob("*/*/*"))) == 24  # 1200 units, 50 a file
