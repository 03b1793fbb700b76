"""The vectorised decoder: Apache's golden store field for field, split invariance, bad input."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from broker.store import findings as fk
from broker.store.columnar import DecodeFilter, decode_range, iter_decode
from broker.store.commitlog import CommitLog, CommitLogWriter
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from schemas.messages import RECORD_SCHEMA
from tests.golden_fields import expected_row


def _decode_store(store: Path, **kwargs) -> tuple[list[dict], list]:
    log = CommitLog.open(store, kwargs.pop("segment_size", None))
    rows, found = [], list(log.findings)
    for seg in log.segments:
        buf = seg.open()
        table, stats = decode_range(buf, seg.base, log.segment_size, file_name=seg.name, **kwargs)
        rows += table.to_pylist()
        found += stats.findings
    return rows, found


def _comparable(row: dict) -> dict:
    out = {k: v for k, v in row.items() if k not in ("born_host", "store_host")}
    out["properties"] = dict(row["properties"])
    return out


def test_golden_store_every_field(golden_store, golden_records):
    rows, found = _decode_store(golden_store)
    assert found == []
    assert len(rows) == len(golden_records) == 2001
    for row, e in zip(rows, golden_records):
        assert _comparable(row) == expected_row(e)
    hosts = {(r["born_host"], r["store_host"]) for r in rows}
    assert ("[2001:db8::d9e6:108f]:52946", "192.168.0.10:10911") in hosts
    assert any(s == "[2001:db8::a]:10911" for _, s in hosts)


def test_schema_is_the_record_schema(golden_store):
    log = CommitLog.open(golden_store)
    seg = log.segments[0]
    batch = next(iter_decode(seg.open(), seg.base, log.segment_size, batch_rows=50))
    assert batch.schema == RECORD_SCHEMA and batch.num_rows == 50


@pytest.mark.parametrize("split", ["record", 4099, 65536, "segment"])
def test_any_split_size_gives_the_same_rows(golden_store, golden_records, split):
    """One split per record, uneven splits, and one split per segment give identical rows."""
    log = CommitLog.open(golden_store)
    offsets = []
    for seg in log.segments:
        buf = seg.open()
        if split == "record":
            bounds = sorted(_starts_of(golden_records, seg.base, log.segment_size)) + [log.segment_size]
        elif split == "segment":
            bounds = [0, log.segment_size]
        else:
            bounds = list(range(0, log.segment_size, split)) + [log.segment_size]
        for start, end in zip(bounds, bounds[1:]):
            table, stats = decode_range(buf, seg.base, log.segment_size, start, end,
                                        file_name=seg.name, verify_crc=False)
            assert stats.findings == []
            offsets += table.column("commitlog_offset").to_pylist()
    assert offsets == [e["phyOffset"] for e in golden_records]


def test_splits_smaller_than_a_record(golden_store, golden_records):
    """37-byte splits over the first 200 KiB: every record is decoded by exactly one split."""
    log = CommitLog.open(golden_store)
    seg = log.segments[0]
    buf = seg.open()
    limit = 200 * 1024
    offsets = []
    for start in range(0, limit, 37):
        table, stats = decode_range(buf, seg.base, log.segment_size, start, min(start + 37, limit),
                                    file_name=seg.name, verify_crc=False)
        assert stats.findings == []
        offsets += table.column("commitlog_offset").to_pylist()
    assert offsets == [e["phyOffset"] for e in golden_records if e["phyOffset"] < limit]


def _starts_of(records, base, size):
    return {e["phyOffset"] - base for e in records if base <= e["phyOffset"] < base + size}


def test_filters(golden_store, golden_records):
    want_topic = [e["phyOffset"] for e in golden_records
                  if e["topic"] == "TopicOrders" or e["properties"].get("REAL_TOPIC") == "TopicOrders"
                  and e["topic"] in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC")]
    rows, _ = _decode_store(golden_store, flt=DecodeFilter(topics=frozenset({"TopicOrders"})))
    assert [r["commitlog_offset"] for r in rows] == want_topic
    lo, hi = golden_records[100]["storeTimestamp"], golden_records[900]["storeTimestamp"]
    rows, _ = _decode_store(golden_store, flt=DecodeFilter(min_store_timestamp=lo, max_store_timestamp=hi,
                                                           min_offset=golden_records[50]["phyOffset"],
                                                           max_offset=golden_records[1500]["phyOffset"]))
    assert [r["commitlog_offset"] for r in rows] == [
        e["phyOffset"] for e in golden_records[50:1500] if lo <= e["storeTimestamp"] <= hi]


# ---- damaged stores --------------------------------------------------------------------------------

SEG = 64 * 1024


def _make_store(tmp_path: Path, n: int = 120, body: int = 300) -> tuple[Path, list]:
    store = tmp_path / "store"
    results = []
    with CommitLogWriter(store, segment_size=SEG) as w:
        for i in range(n):
            rec = MessageRecord(topic=f"T{i % 3}", body=bytes([i % 251]) * (body + i),
                                properties_raw=f"KEYS\x01k{i}\x02UNIQ_KEY\x01U{i:030d}",
                                queue_id=i % 2, born_timestamp=1_700_000_000_000 + i,
                                born_host=Host(bytes([10, 0, 0, 1]), 5000),
                                store_host=Host(bytes([10, 0, 0, 2]), 10911))
            results.append(w.append(rec, store_timestamp=1_700_000_001_000 + i))
    return store, results


def _damage(store: Path, offset: int, data: bytes) -> None:
    log = CommitLog.open(store, SEG)
    seg = log.segment_for(offset)
    with open(seg.path, "r+b") as fh:
        fh.seek(offset - seg.base)
        fh.write(data)


def _offsets(rows):
    return [r["commitlog_offset"] for r in rows]


def test_writer_store_decodes_back(tmp_path):
    store, results = _make_store(tmp_path)
    rows, found = _decode_store(store, segment_size=SEG)
    assert found == []
    assert _offsets(rows) == [r.physical_offset for r in results]
    assert [r["body"] for r in rows] == [r.record.body for r in results]


def test_crc_mismatch_is_reported_and_record_kept(tmp_path):
    store, results = _make_store(tmp_path)
    victim = results[10]
    body_pos = victim.physical_offset + victim.size - len(victim.record.properties_bytes) - 2 - 1 - 2 - 5
    _damage(store, body_pos, b"\xff\xfe\xfd\xfc\xfb")
    rows, found = _decode_store(store, segment_size=SEG)
    assert _offsets(rows) == [r.physical_offset for r in results]
    assert [f.kind for f in found] == [fk.CRC_MISMATCH]
    assert found[0].physical_offset == victim.physical_offset
    assert rows[10]["body_crc_ok"] is False and rows[9]["body_crc_ok"] is True


def test_wrong_magic_skips_one_record(tmp_path):
    store, results = _make_store(tmp_path)
    victim = results[20]
    _damage(store, victim.physical_offset + 4, b"\x12\x34\x56\x78")
    rows, found = _decode_store(store, segment_size=SEG)
    assert _offsets(rows) == [r.physical_offset for r in results if r is not victim]
    assert [(f.kind, f.physical_offset, f.bytes_skipped) for f in found] == [
        (fk.BAD_MAGIC, victim.physical_offset, victim.size)]
    assert found[0].file.endswith(CommitLog.open(store, SEG).segment_for(victim.physical_offset).name)


def test_size_past_file_end(tmp_path):
    store, results = _make_store(tmp_path)
    victim = results[5]
    _damage(store, victim.physical_offset, struct.pack(">i", SEG * 4))
    rows, found = _decode_store(store, segment_size=SEG)
    assert _offsets(rows) == [r.physical_offset for r in results if r is not victim]
    assert [(f.kind, f.physical_offset) for f in found] == [(fk.TRUNCATED_RECORD, victim.physical_offset)]


def test_lying_total_size_is_a_length_mismatch(tmp_path):
    store, results = _make_store(tmp_path)
    victim = results[7]
    _damage(store, victim.physical_offset, struct.pack(">i", victim.size + 3))
    rows, found = _decode_store(store, segment_size=SEG)
    assert _offsets(rows) == [r.physical_offset for r in results if r is not victim]
    assert [(f.kind, f.physical_offset, f.bytes_skipped) for f in found] == [
        (fk.LENGTH_MISMATCH, victim.physical_offset, victim.size)]


def test_zeroed_region_inside_log(tmp_path):
    store, results = _make_store(tmp_path)
    a, b = results[30], results[33]
    _damage(store, a.physical_offset, bytes(b.physical_offset - a.physical_offset))
    rows, found = _decode_store(store, segment_size=SEG)
    lost = {r.physical_offset for r in results[30:33]}
    assert _offsets(rows) == [r.physical_offset for r in results if r.physical_offset not in lost]
    assert [(f.kind, f.physical_offset, f.bytes_skipped) for f in found] == [
        (fk.CORRUPT_REGION, a.physical_offset, b.physical_offset - a.physical_offset)]


def test_torn_tail_partial_record_then_zeros(tmp_path):
    store, results = _make_store(tmp_path)
    last = results[-1]
    keep = 40
    _damage(store, last.physical_offset + keep, bytes(last.size - keep))
    rows, found = _decode_store(store, segment_size=SEG)
    assert _offsets(rows) == [r.physical_offset for r in results[:-1]]
    assert [(f.kind, f.physical_offset, f.bytes_skipped) for f in found] == [
        (fk.TORN_TAIL, last.physical_offset, 36)]  # bytes 36..40 are the zero sysFlag


def test_truncated_segment_file(tmp_path):
    store, results = _make_store(tmp_path)
    log = CommitLog.open(store, SEG)
    last_seg = log.segments[-1]
    victim = [r for r in results if r.physical_offset >= last_seg.base][3]
    cut = victim.physical_offset - last_seg.base + 50
    with open(last_seg.path, "r+b") as fh:
        fh.truncate(cut)
    rows, found = _decode_store(store, segment_size=SEG)
    assert _offsets(rows) == [r.physical_offset for r in results if r.physical_offset < victim.physical_offset]
    kinds = [(f.kind, f.offset) for f in found]
    assert (fk.WRONG_FILE_SIZE, 0) in kinds
    assert (fk.TORN_TAIL, victim.physical_offset - last_seg.base) in kinds


def test_garbage_everywhere_terminates(tmp_path):
    import random
    store, results = _make_store(tmp_path)
    log = CommitLog.open(store, SEG)
    rnd = random.Random(5)
    for seg in log.segments:
        data = bytearray(seg.path.read_bytes())
        for _ in range(200):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        seg.path.write_bytes(bytes(data))
    rows, found = _decode_store(store, segment_size=SEG)
    good = {r.physical_offset for r in results}
    assert all(r["commitlog_offset"] in good for r in rows)
    assert found



def test_resync_after_a_region_larger_than_the_search_window(tmp_path):
    # the record-start search looks window by window (64 KiB, doubling): a 300 KB run of garbage
    # without magic bytes must still be crossed, by the walk and by a split starting inside it
    big = 4 * 1024 * 1024
    store = tmp_path / "store"
    with CommitLogWriter(store, segment_size=big) as w:
        results = [w.append(MessageRecord(topic="T", body=bytes([i % 251]) * 400, queue_id=0,
                                          born_timestamp=1_700_000_000_000 + i,
                                          born_host=Host(bytes([10, 0, 0, 1]), 5000),
                                          store_host=Host(bytes([10, 0, 0, 2]), 10911)),
                           store_timestamp=1_700_000_001_000 + i) for i in range(2000)]
    a = next(r for r in results if r.physical_offset >= 5000)
    b = next(r for r in results if r.physical_offset >= a.physical_offset + 300_000)
    seg = CommitLog.open(store, big).segments[0]
    with open(seg.path, "r+b") as fh:
        fh.seek(a.physical_offset)
        fh.write(b"\x01" * (b.physical_offset - a.physical_offset))
    kept = [r.physical_offset for r in results if not a.physical_offset <= r.physical_offset < b.physical_offset]
    buf = seg.open()
    table, stats = decode_range(buf, 0, big, file_name=seg.name)
    assert table.column("commitlog_offset").to_pylist() == kept
    assert [(f.physical_offset, f.bytes_skipped) for f in stats.findings] == [
        (a.physical_offset, b.physical_offset - a.physical_offset)]
    tail, _ = decode_range(buf, 0, big, a.physical_offset + 10, file_name=seg.name)
    assert tail.column("commitlog_offset").to_pylist() == [o for o in kept if o > a.physical_offset]


def test_data_end_with_a_known_end_walks_only_the_tail(tmp_path):
    store, results = _make_store(tmp_path, n=200)
    log = CommitLog.open(store, SEG)
    true_end = log.data_end()
    last = results[-1]
    assert true_end == last.physical_offset + last.size
    boundary = results[-5].physical_offset  # a record start in the last segment
    assert log.segment_for(boundary).base == log.segment_for(last.physical_offset).base
    assert log.data_end(boundary) == true_end
    assert log.data_end(boundary + 3) == true_end  # not a record start: falls back to the full walk
    assert log.data_end(true_end) == true_end
    assert log.data_end(10**12) == true_end  # beyond the log: ignored


def test_body_view_gives_the_same_bodies_without_copying(tmp_path):
    # compressed bodies (ZLIB/LZ4/ZSTD) point into a second buffer, plain ones into the segment
    from broker.store.generate import GenerateSpec, generate_store

    generate_store(tmp_path / "g", GenerateSpec(messages=600, body_bytes=300, segment_bytes=1 << 20, seed=3))
    log = CommitLog.open(tmp_path / "g")
    seg = log.segments[0]
    buf = seg.open()
    plain, _ = decode_range(buf, seg.base, log.segment_size, file_name=seg.name)
    viewed, _ = decode_range(buf, seg.base, log.segment_size, file_name=seg.name, body_view=True)
    assert plain.schema.field("body").type == "binary" and viewed.schema.field("body").type == "binary_view"
    assert set(plain.column("compression").to_pylist()) > {"NONE"}  # some bodies were compressed
    assert viewed.column("body").cast("binary").to_pylist() == plain.column("body").to_pylist()
    assert viewed.drop_columns(["body"]).equals(plain.drop_columns(["body"]))


def test_field_gathers_read_zeros_past_the_end_of_the_buffer():
    """Fields of a record cut off by the end of the buffer (or at a garbage position) read as zero,
    bytes and records alike, as the walk's findings expect."""
    import numpy as np

    from broker.store.columnar import _gather, _take

    a = np.frombuffer(bytes(range(1, 11)), np.uint8)  # 10 bytes: 01 02 … 0A
    pos = np.array([0, 6, 8, 10, 50], np.int64)
    assert _take(a, pos, ">i4").tolist() == [0x01020304, 0x0708090A, 0x090A0000, 0, 0]
    assert _gather(a, np.array([7], np.int64), 6).tolist() == [[8, 9, 10, 0, 0, 0]]
    assert _take(np.zeros(0, np.uint8), np.array([0], np.int64), ">i8").tolist() == [0]


@pytest.mark.parametrize("at_end", [False, True])
def test_views_inline_and_out_of_line_values(at_end):
    """Binary views of values of 0..40 bytes (inline up to 12, zero padded; longer ones point into
    the buffer) give back exactly the values, also for values that end at the buffer's last byte."""
    import numpy as np
    import pyarrow as pa

    from broker.store.columnar import _views

    values = [bytes((i * 7 + k) % 251 + 1 for k in range(n)) for i, n in enumerate(range(41))]
    filler = b"\xff" * 16
    data = filler.join(values) + (b"" if at_end else filler)
    pos, p = [], 0
    for v in values:
        pos.append(p)
        p += len(v) + len(filler)
    views = _views(np.frombuffer(data, np.uint8), np.array(pos, np.int64), np.array([len(v) for v in values]))
    arr = pa.Array.from_buffers(pa.binary_view(), len(values), [None, pa.py_buffer(views), pa.py_buffer(data)])
    arr.validate(full=True)
    assert arr.cast(pa.binary()).to_pylist() == values
    inline = views.reshape(-1, 16)[:13]  # values of 0..12 bytes: length, then the bytes, zero padded
    assert all(row[4 + n:].tolist() == [0] * (12 - n) for n, row in enumerate(inline))
