"""The record layout module and the one record checker, against Apache's documented positions and files."""

from __future__ import annotations

import struct

import pytest

from broker.store import findings as fk
from broker.store.commitlog import CommitLog
from broker.store.hosts import Host
from broker.store.message import MessageRecord, decode_record
from broker.store.record_check import BLANK, END, MESSAGE, RecordError, check_record
from broker.store.record_layout import (
    FIXED_RECORD_SIZE_V1_IPV4,
    FIXED_V4_SIZE,
    HEAD,
    POSITIONS,
    STORE_TIMESTAMP_PROBE,
    fixed_dtype,
    read_store_timestamp,
    store_timestamp_pos,
)


def test_positions_are_apaches():
    # store-format.md 3.3 (MessageDecoder's constants in Apache 4.9.8)
    assert POSITIONS == {"TOTALSIZE": 0, "MAGICCODE": 4, "BODYCRC": 8, "QUEUEID": 12, "FLAG": 16,
                         "QUEUEOFFSET": 20, "PHYSICALOFFSET": 28, "SYSFLAG": 36, "BORNTIMESTAMP": 40}
    assert HEAD.size == 48 and FIXED_V4_SIZE == 88 and FIXED_RECORD_SIZE_V1_IPV4 == 91
    assert fixed_dtype(True, False).itemsize == fixed_dtype(False, True).itemsize == 100
    assert fixed_dtype(True, True).itemsize == 112
    assert fixed_dtype(True, True).fields["body_len"][1] == 108
    assert store_timestamp_pos(0) == 56 and store_timestamp_pos(0x10) == 68 and STORE_TIMESTAMP_PROBE == 76


@pytest.mark.parametrize("born_v6,store_v6", [(False, False), (True, False), (False, True), (True, True)])
def test_checker_locates_every_part(born_v6, store_v6):
    v4, v6 = Host(bytes([10, 0, 0, 1]), 7), Host(bytes(range(16)), 9)
    rec = MessageRecord(topic="T" * 200, body=b"body!", properties_raw="KEYS\x01a\x02", store_timestamp=123456789,
                        born_host=v6 if born_v6 else v4, store_host=v6 if store_v6 else v4,
                        physical_offset=1000)
    data = bytes(3) + rec.encode()  # a V2 record (topic > 127 bytes), not at buffer position 0
    found = check_record(data, 3, 1000, check_crc=True)
    assert found.kind == MESSAGE and found.size == len(data) - 3 and found.v2
    assert found.store_timestamp == read_store_timestamp(data, 3) == 123456789
    assert data[found.body_at:found.body_at + found.body_len] == b"body!"
    assert data[found.topic_at:found.topic_at + found.topic_len] == b"T" * 200
    assert data[found.props_at:found.props_at + found.props_len] == b"KEYS\x01a\x02"
    assert decode_record(data, 3, 1000) == decode_record(data[3:], 0, 1000)


def test_checker_kinds_and_errors():
    rec = MessageRecord(topic="T", body=b"hello", born_host=Host(bytes(4), 1), store_host=Host(bytes(4), 2))
    data = rec.encode()
    assert check_record(bytes(16), 0).kind == END
    assert check_record(struct.pack(">iI", 64, 0xCBD43194) + bytes(56), 0) == (BLANK, 64, 0, 0, False, 0, 0, 0, 0,
                                                                                0, 0)
    bad_crc = data[:8] + struct.pack(">i", 1) + data[12:]
    assert check_record(bad_crc, 0).kind == MESSAGE  # BODYCRC only when asked
    cases = [
        (data[:5], {}, fk.TRUNCATED_RECORD, "only 5 bytes left"),
        (data[:4] + b"\0\0\0\1" + data[8:], {}, fk.BAD_MAGIC, "magic 0x00000001"),
        (struct.pack(">i", 50) + data[4:], {}, fk.BAD_SIZE, "TOTALSIZE 50 < minimum 91"),
        (data, {"limit": len(data) - 1}, fk.TRUNCATED_RECORD, "runs past the end of data"),
        (data, {"physical_offset": 64}, fk.OFFSET_MISMATCH, "PHYSICALOFFSET field is 0, record is at 64"),
        (struct.pack(">i", len(data) + 4) + data[4:] + bytes(4), {}, fk.LENGTH_MISMATCH, "add up to"),
        (bad_crc, {"check_crc": True}, fk.CRC_MISMATCH, "BODYCRC 1 != computed"),
    ]
    for buf, kwargs, kind, text in cases:
        with pytest.raises(RecordError) as err:
            check_record(buf, 0, **kwargs)
        assert err.value.kind == kind and text in err.value.detail, (kind, err.value)


def test_checker_walks_apaches_store(golden_store, golden_records):
    log_ = CommitLog.open(golden_store)
    stamps = {}
    for seg in log_.segments:
        data = seg.path.read_bytes()
        pos = 0
        while True:
            found = check_record(data, pos, seg.base + pos, check_crc=True)
            if found.kind != MESSAGE:
                assert found.kind in (BLANK, END)
                break
            stamps[seg.base + pos] = found.store_timestamp
            pos += found.size
    assert stamps == {e["phyOffset"]: e["storeTimestamp"] for e in golden_records}
