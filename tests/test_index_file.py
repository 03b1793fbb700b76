"""Index files against Apache RocketMQ 4.9.8's own store: queries, raw file dumps, byte-exact rebuild,
hash rules (UTF-16, MIN_VALUE), collisions, rolling, damaged files."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from broker.store import findings as fk
from broker.store.commitlog import CommitLog, CommitLogWriter
from broker.store.constants import INDEX_DIR, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE
from broker.store.index_file import (
    ENTRIES_DTYPE,
    INDEX_HEADER_SIZE,
    LONG_MAX,
    IndexFile,
    IndexHeader,
    IndexService,
    build_index_key,
    index_file_name,
    index_file_size,
    infer_index_geometry,
    parse_index_file_name,
)
from broker.store.java_hash import index_key_hash, java_string_hash
from broker.store.message import MessageRecord
from broker.store.properties import encode_properties
from tests.conftest import load_expected

SLOTS, ENTRIES = 128, 512  # the golden store's maxHashSlotNum / maxIndexNum
ENTRY_COLUMNS = "entries[index,keyHash,phyOffset,timeDiffSec,prevIndex]"
INT_MIN = -(1 << 31)


@pytest.fixture(scope="module")
def golden_log(golden_store) -> CommitLog:
    return CommitLog.open(golden_store)


@pytest.fixture(scope="module")
def golden_index(golden_store) -> IndexService:
    service = IndexService(golden_store, SLOTS, ENTRIES)
    yield service
    service.close()


@pytest.fixture(scope="module")
def expected_queries(golden_expected) -> list[dict]:
    return load_expected(golden_expected, "expected_index.json")["queries"]


@pytest.fixture(scope="module")
def expected_files(golden_expected) -> list[dict]:
    return load_expected(golden_expected, "expected_index_files.json")["files"]


@pytest.fixture(scope="module")
def rebuilt_index(tmp_path_factory, golden_log) -> Path:
    """Index files rebuilt by dispatching every golden commitlog record in offset order."""
    out = tmp_path_factory.mktemp("index_rebuild")
    with IndexService(out, SLOTS, ENTRIES) as service:
        for rec in golden_log.iter_records():
            service.dispatch(rec)
    return out


def _header_fields(h: IndexHeader) -> tuple:
    return (h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset, h.hash_slot_count,
            h.index_count)


def _record(topic: str, props: dict[str, str]) -> MessageRecord:
    return MessageRecord(topic=topic, body=b"x", properties_raw=encode_properties(props))


# ---- golden store ---------------------------------------------------------------------------------------

def test_golden_queries(golden_index, golden_log, expected_queries):
    assert len(expected_queries) == 75
    for q in expected_queries:
        assert index_key_hash(q["indexKey"]) == q["keyHash"]
        assert q["keyHash"] % SLOTS == q["slot"]
        assert golden_index.query_offsets(q["topic"], q["key"], max_num=64) == q["phyOffsets"], q["indexKey"]
        assert golden_index.query(q["topic"], q["key"], 0, LONG_MAX, golden_log) == q["verifiedPhyOffsets"]
    assert golden_index.findings == []


def test_golden_files_raw_dump(golden_index, expected_files):
    assert [f.name for f in golden_index.files] == [e["name"] for e in expected_files]
    for f, exp in zip(golden_index.files, expected_files):
        assert f.path.stat().st_size == exp["size"] == index_file_size(SLOTS, ENTRIES)
        assert _header_fields(f.header) == (exp["beginTimestamp"], exp["endTimestamp"], exp["beginPhyOffset"],
                                            exp["endPhyOffset"], exp["hashSlotCount"], exp["indexCount"])
        slots = f.slots()
        assert {str(i): int(v) for i, v in enumerate(slots) if v} == exp["nonZeroSlots"]
        entries = f.entries()
        assert entries.dtype == ENTRIES_DTYPE
        assert entries.tolist() == [tuple(e) for e in exp[ENTRY_COLUMNS]], f.name


def test_golden_header_codec(golden_store, expected_files):
    path = sorted((golden_store / INDEX_DIR).iterdir())[1]
    raw = path.read_bytes()[:40]
    header = IndexHeader.decode(raw)
    exp = expected_files[1]
    assert _header_fields(header) == (exp["beginTimestamp"], exp["endTimestamp"], exp["beginPhyOffset"],
                                      exp["endPhyOffset"], exp["hashSlotCount"], exp["indexCount"])
    assert header.encode() == raw
    assert IndexHeader.decode(bytes(40)).index_count == 0  # a never-flushed new file; load treats it as 1


def test_golden_entries_table(golden_index, expected_files):
    table = golden_index.entries_table()
    assert table.column_names == ["file", "entry", "key_hash", "phy_offset", "time_diff", "prev_index"]
    assert table.num_rows == sum(e["indexCount"] - 1 for e in expected_files) == 12 * 511 + 446
    first = golden_index.files[0].entries_table()
    assert first.slice(0, 3).to_pylist()[2] == dict(zip(
        ["entry", "key_hash", "phy_offset", "time_diff", "prev_index"], expected_files[0][ENTRY_COLUMNS][2]))


def test_golden_max_num_keeps_newest(golden_index):
    full = golden_index.query_offsets("TopicOrders", "order-0")
    assert len(full) == 24
    assert golden_index.query_offsets("TopicOrders", "order-0", max_num=5) == full[-5:]


def test_golden_time_window(golden_index, golden_log, golden_records):
    full = golden_index.query_offsets("TopicOrders", "order-0")
    store_time = {r["phyOffset"]: r["storeTimestamp"] for r in golden_records}
    last = max(store_time.values())
    assert golden_index.query_offsets("TopicOrders", "order-0", last + 1000, LONG_MAX) == []
    assert golden_index.query_offsets("TopicOrders", "order-0", 0, 1000) == []
    # The index keeps seconds relative to each file's begin time: a window of whole files is exact.
    files = golden_index.files
    begin, end = files[4].header.begin_timestamp, files[8].header.end_timestamp
    got = golden_index.query_offsets("TopicOrders", "order-0", begin, end)
    assert got and set(got) <= set(full)
    assert all(begin - 1000 <= store_time[o] <= end + 1000 for o in got)


def test_golden_file_names_are_local_time(golden_index):
    for f in golden_index.files:
        assert index_file_name(parse_index_file_name(f.name)) == f.name
    assert parse_index_file_name("2026112105511892") is None
    assert parse_index_file_name("20261399055118929") is None


def test_golden_geometry_inferred_from_size(golden_store):
    assert infer_index_geometry(10792) == (SLOTS, ENTRIES)
    assert infer_index_geometry(420_000_040) == (5_000_000, 20_000_000)
    assert infer_index_geometry(1000) is None
    path = sorted((golden_store / INDEX_DIR).iterdir())[0]
    f = IndexFile.open(path)
    assert (f.max_hash_slot_num, f.max_index_num, f.findings) == (SLOTS, ENTRIES, [])
    with pytest.raises(ValueError):
        f.put_key("T#k", 1, 1)  # mapped read-only
    f.close()


# ---- writer: byte-exact rebuild ----------------------------------------------------------------------------

def test_rebuild_is_byte_exact(golden_store, rebuilt_index):
    golden = sorted((golden_store / INDEX_DIR).iterdir())
    mine = sorted((rebuilt_index / INDEX_DIR).iterdir())
    assert len(mine) == len(golden) == 13
    # Names are wall-clock creation times and cannot match; they must be valid and strictly ordered.
    assert all(parse_index_file_name(p.name) is not None for p in mine)
    assert len({p.name for p in mine}) == 13
    for g, m in zip(golden, mine):
        assert m.read_bytes() == g.read_bytes(), (g.name, m.name)


def test_rebuild_answers_like_apache(rebuilt_index, golden_log, expected_queries):
    service = IndexService(rebuilt_index, SLOTS, ENTRIES)
    for q in expected_queries:
        assert service.query_offsets(q["topic"], q["key"], max_num=64) == q["phyOffsets"]
    service.close()


def test_redispatch_skips_indexed_messages(tmp_path, golden_log):
    records = list(golden_log.iter_records())[:400]
    with IndexService(tmp_path, SLOTS, ENTRIES) as service:
        assert sum(service.dispatch(r) for r in records[:300]) > 0
        end = service.files[-1].header.end_phy_offset
    reopened = IndexService(tmp_path, SLOTS, ENTRIES)
    # Offsets below the last file's endPhyOffset are skipped; the message *at* it is indexed again
    # (Apache compares with <), so a re-dispatch of the last indexed message adds its keys once more.
    for rec in records[:300]:
        added = reopened.dispatch(rec)
        assert added == 0 if rec.physical_offset < end else rec.physical_offset > end or added > 0
    assert sum(reopened.dispatch(r) for r in records[300:]) > 0
    reopened.close()


# ---- hash rules -----------------------------------------------------------------------------------------------

def _key_hashing_to(prefix: str, target: int) -> str:
    """A 7-char key k ('A'..'_') with String.hashCode(prefix + k) == target (mod 2^32)."""
    n, base_char = 7, ord("A")
    fixed = (java_string_hash(prefix) * pow(31, n, 1 << 32) + base_char * sum(31 ** i for i in range(n))) % (1 << 32)
    rest = (target - fixed) % (1 << 32)
    digits = []
    for _ in range(n):
        rest, d = divmod(rest, 31)
        digits.append(d)
    assert rest == 0
    return "".join(chr(base_char + d) for d in reversed(digits))


def test_min_value_hash_maps_to_zero(tmp_path):
    assert java_string_hash("polygenelubricants") == INT_MIN
    assert index_key_hash("polygenelubricants") == 0
    key = _key_hashing_to("T#", INT_MIN)
    assert java_string_hash(build_index_key("T", key)) == INT_MIN
    with IndexService(tmp_path, 8, 16) as service:
        service.build_index("T", key, None, 100, 1_000_000)
        service.build_index("T", "other", None, 200, 1_000_000)
        f = service.files[0]
        assert f.entries()["key_hash"].tolist()[0] == 0
        assert f.slots()[0] == 1  # slot 0 % 8
        assert service.query_offsets("T", key) == [100]


def test_utf16_hash_of_emoji_keys(golden_index, expected_queries):
    q = next(q for q in expected_queries if q["key"] == "emoji😀0")
    code_units = struct.unpack(f">{len(q['indexKey'].encode('utf-16-be')) // 2}H", q["indexKey"].encode("utf-16-be"))
    assert len(code_units) == len(q["indexKey"]) + 1  # the emoji is a surrogate pair: two code units
    h = 0
    for unit in code_units:
        h = (31 * h + unit) & 0xFFFFFFFF
    assert abs(h - (1 << 32) if h & 0x80000000 else h) == q["keyHash"] == index_key_hash(q["indexKey"])
    wrong = 0
    for ch in q["indexKey"]:  # hashing code points instead gives another slot chain
        wrong = (31 * wrong + ord(ch)) & 0xFFFFFFFF
    assert wrong != h
    assert golden_index.query_offsets(q["topic"], q["key"]) == q["phyOffsets"]


def test_hash_collision_needs_verification(tmp_path):
    # "Aa" and "BB" have the same String.hashCode, so "T#xAa"/"T#xBB" and "Aa#k"/"BB#k" collide.
    assert java_string_hash("T#xAa") == java_string_hash("T#xBB")
    assert java_string_hash("Aa#k") == java_string_hash("BB#k")
    with CommitLogWriter(tmp_path, segment_size=1 << 16) as writer:
        puts = [writer.append(_record(t, p), 1_700_000_000_000 + i) for i, (t, p) in enumerate([
            ("T", {"KEYS": "xAa", "UNIQ_KEY": "U1"}),
            ("T", {"KEYS": "xBB"}),
            ("Aa", {"KEYS": "k"}),
            ("BB", {"KEYS": "k"}),
        ])]
    offsets = [p.physical_offset for p in puts]
    log_ = CommitLog.open(tmp_path)
    with IndexService(tmp_path, 16, 64) as service:
        assert [service.dispatch(p.record) for p in puts] == [2, 1, 1, 1]
        assert service.query_offsets("T", "xAa") == offsets[:2]
        assert service.query("T", "xAa", 0, LONG_MAX, log_) == offsets[:1]
        assert service.query("T", "xBB", 0, LONG_MAX, log_) == offsets[1:2]
        assert service.query("T", "U1", 0, LONG_MAX, log_) == offsets[:1]
        assert service.query_offsets("Aa", "k") == offsets[2:]
        assert service.query("Aa", "k", 0, LONG_MAX, log_) == offsets[2:3]  # same hash, other topic
        assert service.query("BB", "k", 0, LONG_MAX, log_) == offsets[3:]


# ---- writer rules -----------------------------------------------------------------------------------------------

def test_roll_at_capacity_and_seeding(tmp_path):
    clock_ms = 1_795_240_278_915
    with IndexService(tmp_path, 4, 4, clock=lambda: clock_ms) as service:  # 3 entries per file
        assert service.build_index("T", "k1 k2  k3 k4", "U", 100, 10_000) == 5  # empty token skipped
        assert service.build_index("T", ["k5"], None, 200, 15_500) == 1
        assert service.build_index("T", "k6", None, 300, 20_999) == 1
        files = list(service.files)
        assert [f.name for f in files] == [index_file_name(clock_ms + i) for i in range(3)]  # +1 ms each
        slots_used = [len({index_key_hash(f"T#{k}") % 4 for k in keys}) for keys in (["U", "k1", "k2"],
                                                                                  ["k3", "k4", "k5"])]
        assert [_header_fields(f.header) for f in files] == [
            (10_000, 10_000, 100, 100, slots_used[0], 4),  # full: indexCount == maxIndexNum
            (10_000, 15_500, 100, 200, slots_used[1], 4),  # seeded with file 1's end = its first entry
            (20_999, 20_999, 300, 300, 1, 2),  # begin = the first entry, not the seed (15500/200)
        ]
        assert all(f.is_full for f in files[:2]) and not files[2].is_full
        # timeDiff: first file relative to nothing (0); later files' first entry relative to the seed.
        assert files[1].entries()["time_diff"].tolist() == [0, 0, 5]
        assert files[2].entries()["time_diff"].tolist() == [5]  # (20999 - 15500) / 1000, truncated
        assert service.query_offsets("T", "k4") == [100]
        assert service.query_offsets("T", "k6") == [300]
    raw = (tmp_path / INDEX_DIR / files[2].name).read_bytes()
    assert len(raw) == index_file_size(4, 4) == 40 + 16 + 80
    assert struct.unpack_from(">qqqqii", raw) == (20_999, 20_999, 300, 300, 1, 2)


def test_new_file_name_never_goes_back(tmp_path):
    times = iter([2_000_000_000_000, 1_000_000_000_000])  # the clock steps back
    with IndexService(tmp_path, 2, 2, clock=lambda: next(times)) as service:
        service.build_index("T", "a", None, 1, 1)
        service.build_index("T", "b", None, 2, 2)
        names = [f.name for f in service.files]
    assert names == [index_file_name(2_000_000_000_000), index_file_name(2_000_000_000_001)]
    assert sorted(p.name for p in (tmp_path / INDEX_DIR).iterdir()) == names


def test_transaction_types_and_duplicates(tmp_path):
    with IndexService(tmp_path, 16, 64) as service:
        assert service.build_index("T", "a", "U", 10, 1, "ROLLBACK") == 0
        assert service.build_index("T", "a", "U", 10, 1, TRANSACTION_ROLLBACK_TYPE | 0x10) == 0
        assert service.build_index("T", "a a", "U", 20, 1, TRANSACTION_PREPARED_TYPE) == 3
        assert service.build_index("T", "", None, 30, 1, "COMMIT") == 0
        assert service.build_index("T", "  ", None, 40, 1) == 0
        assert service.build_index("T", "b", None, 15, 1) == 0  # below endPhyOffset 20: already indexed
        assert service.query_offsets("T", "a") == [20, 20]  # duplicated key indexed twice
        with pytest.raises(ValueError):
            service.build_index("T", "a", None, 50, 1, "MAYBE")


def test_flush_writes_index_count_of_empty_new_file(tmp_path):
    f = IndexFile.create(tmp_path / "20260101000000000", 4, 4, end_phy_offset=7, end_timestamp=9)
    assert struct.unpack_from(">qqqqii", (tmp_path / "20260101000000000").read_bytes()) == (9, 9, 7, 7, 0, 0)
    f.close()  # flush writes the whole header, indexCount 1 included (updateByteBuffer)
    assert struct.unpack_from(">qqqqii", (tmp_path / "20260101000000000").read_bytes()) == (9, 9, 7, 7, 0, 1)
    with pytest.raises(FileExistsError):
        IndexFile.create(tmp_path / "20260101000000000", 4, 4)


# ---- damaged files -------------------------------------------------------------------------------------------

def _copy_index(golden_store: Path, dst: Path, count: int = 2) -> list[Path]:
    (dst / INDEX_DIR).mkdir(parents=True)
    out = []
    for p in sorted((golden_store / INDEX_DIR).iterdir())[:count]:
        shutil.copy(p, dst / INDEX_DIR / p.name)
        (dst / INDEX_DIR / p.name).chmod(0o644)
        out.append(dst / INDEX_DIR / p.name)
    return out


def test_truncated_file_and_bad_name(tmp_path, golden_store, golden_index):
    paths = _copy_index(golden_store, tmp_path)
    with open(paths[1], "r+b") as fh:
        fh.truncate(5000)  # keeps header, slots and entries 1..221 (222 is cut)
    (tmp_path / INDEX_DIR / "readme").write_text("x")
    service = IndexService(tmp_path, SLOTS, ENTRIES)
    found = sorted((f.kind, Path(f.file).name, f.offset) for f in service.findings)
    assert found == [(fk.BAD_FILE_NAME, "readme", 0), (fk.WRONG_FILE_SIZE, paths[1].name, 0)]
    entries = service.files[1].entries()
    assert len(entries) == 511
    intact = (5000 - 40 - 4 * SLOTS) // 20 - 1  # entries fully inside the first 5000 bytes
    assert entries[:intact].tolist() == golden_index.files[1].entries()[:intact].tolist()
    assert (entries["key_hash"][intact + 1:] == 0).all()
    assert service.query_offsets("TopicOrders", "order-0")  # still answers, never raises
    with pytest.raises(ValueError):
        IndexFile.open(paths[1], SLOTS, ENTRIES, writable=True)  # no writing into a wrong-length file
    assert service.build_index("T", "k", None, 10**9, 1) == 1  # the damaged file is full: a new one
    assert len(service.files) == 3
    service.close()


def test_garbage_header_is_clamped(tmp_path, golden_store):
    (path,) = _copy_index(golden_store, tmp_path, 1)
    with open(path, "r+b") as fh:
        fh.seek(0)
        fh.write(struct.pack(">qqqqii", 5, 1, 9, 3, 10_000, 1 << 30))
    f = IndexFile.open(path, SLOTS, ENTRIES)
    kinds = [(x.kind, x.offset) for x in f.findings]
    assert kinds == [(fk.INDEX_BAD_HEADER, 36), (fk.INDEX_BAD_HEADER, 32), (fk.INDEX_BAD_HEADER, 0)]
    assert f.header.index_count == ENTRIES
    assert len(f.entries()) == ENTRIES - 1
    f.close()


def test_chain_walks_terminate(tmp_path):
    f = IndexFile.create(tmp_path / "20260101000000000", 1, 8)  # one slot: every key chains together
    for i in range(1, 5):
        f.put_key(f"T#k{i}", i * 100, 1_000 + i)
    assert f.entries()["prev_index"].tolist() == [0, 1, 2, 3]
    kh = index_key_hash("T#k1")
    assert f.select_phy_offsets(kh, 0, LONG_MAX) == [100]
    entry_at = 40 + 4 + 20 * 2
    struct.pack_into(">i", f._buf, entry_at + 16, 4)  # entry 2 points forward to 4: a cycle
    assert f.select_phy_offsets(kh, 0, LONG_MAX) == []
    assert [(x.kind, x.offset) for x in f.findings] == [(fk.INDEX_BAD_CHAIN, entry_at + 16)]
    struct.pack_into(">i", f._buf, entry_at + 16, 2)  # a self-loop: Apache's own stop rule
    assert f.select_phy_offsets(index_key_hash("T#k2"), 0, LONG_MAX) == [200]
    assert len(f.findings) == 1
    struct.pack_into(">i", f._buf, 40 + 4 + 20 * 4 + 12, -1)  # negative timeDiff ends the walk
    assert f.select_phy_offsets(kh, 0, LONG_MAX) == []
    f.close()


def test_entries_are_copies(tmp_path):
    f = IndexFile.create(tmp_path / "20260101000000000", 2, 4)
    f.put_key("T#a", 1, 2)
    rows = f.entries()
    f.close()  # the map can close while the rows live on
    assert rows.tolist() == [(1, index_key_hash("T#a"), 1, 0, 0)]
    assert isinstance(rows, np.ndarray)


def test_complete_record_finishes_a_half_indexed_record(tmp_path):
    # a crash between two puts of one record: UNIQ_KEY on disk, the KEYS tokens not
    with CommitLogWriter(tmp_path, segment_size=1 << 16) as writer:
        put = writer.append(_record("T", {"KEYS": "k1 k2", "UNIQ_KEY": "U9"}), 1_700_000_000_000)
    rec, log_ = put.record, CommitLog.open(tmp_path)
    with IndexService(tmp_path, 16, 64) as service:
        assert service.build_index("T", None, "U9", rec.physical_offset, rec.store_timestamp) == 1
    with IndexService(tmp_path, 16, 64) as service:
        assert service.complete_record(rec) == 2
        assert service.complete_record(rec) == 0  # nothing missing any more
        for key in ("U9", "k1", "k2"):
            assert service.query("T", key, 0, LONG_MAX, log_) == [rec.physical_offset], key
        assert len(service.files[-1].entries()) == 3  # no entry twice


def test_complete_record_counts_entries_across_a_roll(tmp_path):
    # 4 entries per file (3 usable): UNIQ_KEY and k1 fill the first file with another record's entry
    with CommitLogWriter(tmp_path, segment_size=1 << 16) as writer:
        first = writer.append(_record("T", {"KEYS": "a0"}), 1_700_000_000_000).record
        rec = writer.append(_record("T", {"KEYS": "k1 k2 k3", "UNIQ_KEY": "U9"}), 1_700_000_000_001).record
    log_ = CommitLog.open(tmp_path)
    with IndexService(tmp_path, 4, 4) as service:
        service.dispatch(first)
        assert service.build_index("T", "k1 k2", "U9", rec.physical_offset, rec.store_timestamp) == 3
        assert len(service.files) == 2
    with IndexService(tmp_path, 4, 4) as service:
        assert service.complete_record(rec) == 1
        assert service.query("T", "k3", 0, LONG_MAX, log_) == [rec.physical_offset]


def test_put_killed_before_its_header_keeps_older_chain(tmp_path):
    # A put writes entry, slot, header. Killed between slot and header (mmap writes survive a SIGKILL),
    # the slot points at an entry the header does not count; re-indexing that record writes over the
    # same entry and must link to what that entry linked to, not to itself, or the older keys of the
    # chain (one slot here: all of them) are lost to queries.
    with CommitLogWriter(tmp_path, segment_size=1 << 16) as writer:
        recs = [writer.append(_record("T", {"KEYS": k}), 1_700_000_000_000 + i).record
                for i, k in enumerate(("a", "b", "c"))]
    log_ = CommitLog.open(tmp_path)
    with IndexService(tmp_path, 1, 64) as service:
        assert [service.dispatch(r) for r in recs[:2]] == [1, 1]
        f = service.files[-1]
        header_before = bytes(f._buf[:INDEX_HEADER_SIZE])
        assert f.put_key(build_index_key("T", "c"), recs[2].physical_offset, recs[2].store_timestamp)
        f._buf[:INDEX_HEADER_SIZE] = header_before  # the header write never happened
        f.header = IndexHeader.decode(header_before)
    with IndexService(tmp_path, 1, 64) as service:
        assert service.files[-1].header.index_count == 3
        assert service.dispatch(recs[2]) == 1
        assert service.files[-1].header.index_count == 4
        for key, rec in zip(("a", "b", "c"), recs):
            assert service.query("T", key, 0, LONG_MAX, log_) == [rec.physical_offset], key
        assert service.files[-1].entries()["prev_index"].tolist() == [0, 1, 2]
