"""The object-level record codec against Apache's own store: every field, byte-exact re-encoding."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from broker.store.commitlog import CommitLog
from broker.store.constants import BLANK_MAGIC_CODE, signed32
from broker.store.hosts import Host
from broker.store.message import BlankRecord, MessageRecord, RecordError, decode_record, record_size
from broker.store.message_id import UniqKeyGenerator, _start_of_month_ms, decode_offset_msg_id, encode_offset_msg_id
from broker.store.properties import decode_properties, encode_properties
from tests.golden_fields import expected_row, java_host


@pytest.fixture(scope="module")
def golden_log(golden_store):
    return CommitLog.open(golden_store)


def _segment_bytes(seg) -> bytes:
    return seg.path.read_bytes()


def test_every_golden_record_decodes_and_reencodes_byte_exact(golden_log, golden_records):
    by_offset = {e["phyOffset"]: e for e in golden_records}
    seen = 0
    for seg in golden_log.segments:
        data = _segment_bytes(seg)
        pos = 0
        while pos < len(data) and data[pos:pos + 8] != bytes(8):  # zeros end the live log
            rec = decode_record(data, pos, seg.base + pos)
            if isinstance(rec, BlankRecord):
                assert rec.total_size == len(data) - pos
                assert rec.encode() == data[pos:pos + 8]
                break
            raw = data[pos:pos + rec.total_size]
            assert rec.encode() == raw, f"re-encoded record at {seg.base + pos} differs"
            e = by_offset[seg.base + pos]
            want = expected_row(e)
            got = {
                "commitlog_offset": rec.physical_offset, "store_size": rec.total_size,
                "magic_code": signed32(rec.effective_magic), "body_crc": rec.body_crc,
                "body_crc_ok": rec.body_crc_ok, "queue_id": rec.queue_id, "flag": rec.flag,
                "queue_offset": rec.queue_offset, "sys_flag": rec.sys_flag,
                "transaction_type": rec.transaction_type, "compression": rec.compression,
                "born_timestamp": rec.born_timestamp, "store_timestamp": rec.store_timestamp,
                "reconsume_times": rec.reconsume_times,
                "prepared_transaction_offset": rec.prepared_transaction_offset, "topic": rec.topic,
                "real_topic": rec.real_topic, "properties": rec.properties, "keys": rec.keys,
                "tags": rec.tags, "uniq_key": rec.uniq_key, "offset_msg_id": rec.offset_msg_id,
                "body": rec.payload,
            }
            assert got == want
            assert rec.properties_raw == e["propertiesRaw"]
            for host, field in ((rec.born_host, "bornHost"), (rec.store_host, "storeHost")):
                addr, port = java_host(e[field])
                assert host.port == port
                assert ipaddress.ip_address(host.address) == ipaddress.ip_address(addr)
            seen += 1
            pos += rec.total_size
    assert seen == len(golden_records) == 2001


def test_blank_records_match_apache(golden_log, golden_meta):
    blanks = []
    for seg in golden_log.segments:
        data = _segment_bytes(seg)
        pos = 0
        while pos < len(data):
            size, magic = struct.unpack_from(">ii", data, pos)
            if magic == signed32(BLANK_MAGIC_CODE):
                blanks.append({"phyOffset": seg.base + pos, "totalSizeField": size, "file": seg.name})
                break
            if size <= 0:
                break
            pos += size
    assert blanks == [{k: b[k] for k in ("phyOffset", "totalSizeField", "file")} for b in golden_meta["blankRecords"]]


def test_read_record_at_offset(golden_log, golden_records):
    for e in golden_records[::97]:
        rec = golden_log.read_record(e["phyOffset"])
        assert rec.physical_offset == e["phyOffset"] and rec.topic == e["topic"]


def test_offset_msg_id_round_trip_ipv4_and_ipv6():
    v4 = Host(bytes([192, 168, 0, 10]), 10911)
    assert encode_offset_msg_id(v4, 0x866) == "C0A8000A00002A9F0000000000000866"
    back = decode_offset_msg_id("c0a8000a00002a9f0000000000000866")
    assert back.store_host == v4 and back.physical_offset == 0x866
    v6 = Host.parse("[2001:db8::a]:10911")
    msg_id = encode_offset_msg_id(v6, 123456789)
    assert len(msg_id) == 56
    assert decode_offset_msg_id(msg_id).store_host == v6
    with pytest.raises(ValueError, match="32 or 56"):
        decode_offset_msg_id("ABCD")


def test_uniq_key_layout():
    gen = UniqKeyGenerator(ip=bytes([10, 1, 2, 3]), pid=0x1092, loader_hash=0x1234ABCD)
    first, second = gen.next(now_ms=1_700_000_000_000), gen.next(now_ms=1_700_000_000_000)
    assert first[:20] == "0A01020310921234ABCD" and len(first) == 32
    assert int(second[-4:], 16) == int(first[-4:], 16) + 1
    assert first[20:28] == second[20:28]


def test_uniq_key_late_in_a_month_wraps_as_java_does():
    """Past 2^31 ms (~24.8 days) into a month Java's ``(int) (now - startTime)`` wraps negative; the
    key carries the same four bytes (it once raised struct.error from the 25th on)."""
    gen = UniqKeyGenerator(ip=bytes([10, 1, 2, 3]), pid=1, loader_hash=1)
    month_start = _start_of_month_ms(1_764_028_800_000)  # 2025-11-25 00:00 UTC
    now = month_start + 2**31 + 5
    key = gen.next(now_ms=now)
    assert key[20:28] == f"{(now - month_start) & 0xFFFFFFFF:08X}" == "80000005"


def test_properties_rules():
    assert decode_properties("a\x01b\x02\x01x\x02c\x01\x02d\x01e\x01f\x02a\x01z\x02") == {"d": "e\x01f", "a": "z"}
    assert encode_properties({"k": "v", "n": "m"}) == "k\x01v\x02n\x01m"
    assert encode_properties({"k": "v"}, trailing_separator=True) == "k\x01v\x02"


def test_decode_errors_are_record_errors_not_struct_errors():
    rec = MessageRecord(topic="T", body=b"hello", properties_raw="KEYS\x01a",
                        born_host=Host(bytes(4), 1), store_host=Host(bytes(4), 2))
    data = rec.encode()
    assert record_size(5, 1, 6) == len(data)
    with pytest.raises(RecordError, match="truncated_record"):
        decode_record(data[:50], 0)
    bad_magic = data[:4] + b"\0\0\0\1" + data[8:]
    with pytest.raises(RecordError, match="bad_magic"):
        decode_record(bad_magic, 0)
    wrong_len = struct.pack(">i", len(data) + 10) + data[4:] + bytes(10)
    with pytest.raises(RecordError, match="length_mismatch"):
        decode_record(wrong_len, 0)
    with pytest.raises(RecordError, match="offset_mismatch"):
        decode_record(data, 0, physical_offset=100)
    with pytest.raises(RecordError):
        decode_record(b"\x00\x00\x00\x05\xda\xa3\x20\xa7", 0)


def test_with_position_copies_every_other_field(golden_log):
    """``with_position`` builds the copy positionally (it runs per stored message): every field but
    the three it sets must come through, so a field added to MessageRecord cannot be dropped here."""
    import dataclasses

    records = [r for r in golden_log.iter_records() if isinstance(r, MessageRecord)][:50]
    assert records
    for rec in records:
        placed = rec.with_position(rec.physical_offset + 7, rec.queue_offset + 3, rec.store_timestamp + 1)
        assert placed == dataclasses.replace(rec, physical_offset=rec.physical_offset + 7,
                                             queue_offset=rec.queue_offset + 3,
                                             store_timestamp=rec.store_timestamp + 1)
    assert len(dataclasses.fields(MessageRecord)) == 16  # with_position lists 16 fields in order


def test_follow_reads_what_iter_records_reads(tmp_path, caplog):
    """``CommitLog.follow`` (the dispatcher's reader: sequential, files kept mapped) gives the same
    records as the scanning ``iter_records`` for every range that starts on a record boundary,
    across file rolls, and hands a corrupt record over to the scan, which resumes after it."""
    from broker.store.commitlog import CommitLogWriter

    host = Host(bytes([127, 0, 0, 1]), 10911)
    with CommitLogWriter(tmp_path, segment_size=8192) as writer:
        for i in range(40):  # ~300-600 bytes each: several files, each ending in a BLANK
            writer.append(MessageRecord(topic="T", body=bytes([i]) * (200 + 10 * i), queue_id=i % 3,
                                        born_host=host, store_host=host), store_timestamp=1000 + i)
        end = writer.write_offset
    log_ = CommitLog.open(tmp_path, 8192)
    assert len(log_.segments) >= 3
    every = list(log_.iter_records())
    starts = [r.physical_offset for r in every]
    for a in (0, 5, 17, 33):
        for b in (starts[a] + 1, starts[min(a + 9, 39)], end):
            assert list(log_.follow(starts[a], b)) == list(log_.iter_records(starts[a], b))
    log_.close()

    victim = every[20]  # break its magic code: follow must not stop or skip the records after it
    seg = log_.segment_for(victim.physical_offset)
    with open(seg.path, "r+b") as fh:
        fh.seek(victim.physical_offset - seg.base + 4)
        fh.write(b"\x00\x00\x00\x00")
    broken = CommitLog.open(tmp_path, 8192)
    with caplog.at_level("WARNING", logger="broker.store.commitlog"):
        got = [r.physical_offset for r in broken.follow(starts[10], end)]
    assert got == [p for p in starts[10:] if p != victim.physical_offset]
    broken.close()
    said = [r.getMessage() for r in caplog.records if "fails its check" in r.getMessage()]
    assert len(said) == 1 and f"commitlog offset {victim.physical_offset} " in said[0]
    assert f"(file offset {victim.physical_offset - seg.base})" in said[0]


def test_follow_reads_a_file_listed_before_it_was_sized(tmp_path):
    """A listing taken in the instant between a commitlog file's creation and its pre-sizing says
    the file is empty; the dispatcher must still read the records written there afterwards (it
    once advanced past them: their queue units were missing until a restart re-dispatched)."""
    import dataclasses

    from broker.store.commitlog import CommitLogWriter

    host = Host(bytes([127, 0, 0, 1]), 10911)
    with CommitLogWriter(tmp_path, segment_size=8192) as writer:
        for i in range(30):
            writer.append(MessageRecord(topic="T", body=b"x" * 500, born_host=host, store_host=host), store_timestamp=1)
        end = writer.write_offset
    log_ = CommitLog.open(tmp_path, 8192)
    expected = [r.physical_offset for r in log_.iter_records()]
    log_.segments[-1] = dataclasses.replace(log_.segments[-1], size=0)  # as listed at its creation
    assert [r.physical_offset for r in log_.follow(0, end)] == expected
    log_.close()
