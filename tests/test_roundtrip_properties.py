"""Property tests: object codec ↔ bytes ↔ CommitLogWriter ↔ columnar decoder, Java hashing, rolling.

Every record built here is encoded, decoded again and compared field for field and byte for byte;
the same records are appended through :class:`CommitLogWriter` and read back with the vectorised
decoder, which must agree with the object codec on every column of ``RECORD_SCHEMA``.
"""

from __future__ import annotations

import random
import string
import struct
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.store import compression
from broker.store.columnar import decode_range
from broker.store.commitlog import CommitLog, CommitLogWriter, offset_to_file_name
from broker.store.constants import (
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_BITS_BY_NAME,
    CRC32_RESERVED_LENGTH,
    INNER_BATCH_FLAG,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    MULTI_TAGS_FLAG,
    NEED_UNWRAP_FLAG,
    PROPERTY_CRC32,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    signed32,
)
from broker.store.crc import body_crc, crc32
from broker.store.hosts import Host, format_host
from broker.store.java_hash import index_key_hash, java_string_hash, tags_code
from broker.store.message import (
    BlankRecord,
    MessageRecord,
    decode_record,
    property_crc_value,
    record_size,
)
from broker.store.message_id import encode_offset_msg_id
from broker.store.properties import decode_properties, encode_properties, split_keys
from broker.store.topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC
from schemas.messages import RECORD_FIELD_NAMES

MiB = 1024 * 1024
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
TOPIC_CHARS = string.ascii_letters + string.digits + "_-%|"
# (codec name as the test calls it, compression name the decoders must report, sysFlag bits)
CODECS = [
    ("NONE", "NONE", 0),
    ("ZLIB", "ZLIB", COMPRESSED_FLAG | COMPRESSION_BITS_BY_NAME["ZLIB"]),
    ("LZ4", "LZ4", COMPRESSED_FLAG | COMPRESSION_BITS_BY_NAME["LZ4"]),
    ("ZSTD", "ZSTD", COMPRESSED_FLAG | COMPRESSION_BITS_BY_NAME["ZSTD"]),
    ("LEGACY_ZLIB", "ZLIB", COMPRESSED_FLAG),  # pre-4.9.4 producers: type bits 0 mean ZLIB
]
TXN_TYPES = {TRANSACTION_NOT_TYPE: "NOT", TRANSACTION_PREPARED_TYPE: "PREPARED",
             TRANSACTION_COMMIT_TYPE: "COMMIT", TRANSACTION_ROLLBACK_TYPE: "ROLLBACK"}


# ---- strategies ------------------------------------------------------------------------------------

def _topic(length: int, seed: str) -> str:
    return (seed * length)[:length]


topics = st.one_of(
    st.builds(_topic, st.sampled_from([1, 2, 64, 127, 128, 300, 32767]),
              st.text(TOPIC_CHARS, min_size=1, max_size=6)),
    st.sampled_from([SCHEDULE_TOPIC, TRANS_HALF_TOPIC, "%RETRY%g1", "%DLQ%g1"]),
)

# Property text: any code point but surrogates (not encodable) and the two separators; includes
# accents, CJK and emoji (4-byte UTF-8, two UTF-16 units).
_prop_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02")
_fancy = st.sampled_from(["é", "ß", "你好", "标签", "заказ", "🚀", "👍🏽", "∑", "\u00a0", "a"])
prop_text = st.one_of(st.text(_prop_chars, min_size=1, max_size=12),
                      st.lists(_fancy, min_size=1, max_size=4).map("".join))
# a value may itself contain 0x01 (only the first one splits name from value)
prop_value = st.one_of(prop_text, st.tuples(prop_text, prop_text).map(lambda t: f"{t[0]}\x01{t[1]}"))
# KEYS: tokens joined by one or more spaces, with leading/trailing spaces (empty tokens dropped)
keys_value = st.lists(st.one_of(prop_text.map(lambda s: s.replace(" ", "_")), st.just("")),
                      min_size=1, max_size=5).map(" ".join).filter(lambda s: s != "")


@st.composite
def properties(draw) -> dict[str, str]:
    props: dict[str, str] = {}
    for name in draw(st.lists(st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "REAL_TOPIC", "REAL_QID",
                                               "user"]), unique=True, max_size=6)):
        if name == "KEYS":
            props[name] = draw(keys_value)
        elif name == "user":
            props.update(draw(st.dictionaries(prop_text, prop_value, max_size=4)))
        else:
            props[name] = draw(prop_text)
    return props


hosts = st.one_of(
    st.builds(Host, st.binary(min_size=4, max_size=4), INT32),
    st.builds(Host, st.binary(min_size=16, max_size=16), INT32),
    st.sampled_from([Host(bytes([192, 168, 0, 10]), 10911),
                     Host.parse("[2001:db8::a]:10911"), Host.parse("[::1]:0"), Host.parse("[::ffff:1.2.3.4]:65535")]),
)


def _body_for(payload: bytes, codec: str) -> bytes:
    name = "ZLIB" if codec == "LEGACY_ZLIB" else codec
    return compression.compress(payload, name)


def _sys_flag(codec_bits: int, txn: int, born: Host, store: Host, extra: int) -> int:
    flag = codec_bits | txn | extra
    if born.is_ipv6:
        flag |= BORNHOST_V6_FLAG
    if store.is_ipv6:
        flag |= STOREHOSTADDRESS_V6_FLAG
    return signed32(flag & 0xFFFFFFFF)


@st.composite
def records(draw, max_body: int = 1500, placed: bool = True):
    """(record, payload, codec row): a record as a producer + broker would have stored it."""
    codec = draw(st.sampled_from(CODECS))
    payload = draw(st.one_of(st.binary(max_size=max_body),
                             st.text(max_size=max_body // 4).map(lambda s: s.encode("utf-8", "surrogatepass"))))
    body = _body_for(payload, codec[0])
    born, store = draw(hosts), draw(hosts)
    txn = draw(st.sampled_from(sorted(TXN_TYPES)))
    extra = draw(st.sampled_from([0, MULTI_TAGS_FLAG, NEED_UNWRAP_FLAG | INNER_BATCH_FLAG, 0x800, 1 << 31]))
    props = draw(properties())
    raw = encode_properties(props, trailing_separator=draw(st.booleans()))
    topic = draw(topics)
    force_v2 = len(topic) <= 127 and draw(st.booleans())
    rec = MessageRecord(
        topic=topic, body=body, properties_raw=raw,
        queue_id=draw(INT32), flag=draw(INT32),
        queue_offset=draw(INT64) if placed else 0, physical_offset=draw(INT64) if placed else 0,
        sys_flag=_sys_flag(codec[2], txn, born, store, extra),
        born_timestamp=draw(INT64), born_host=born,
        store_timestamp=draw(INT64) if placed else 0, store_host=store,
        reconsume_times=draw(INT32), prepared_transaction_offset=draw(INT64),
        magic_code=MESSAGE_MAGIC_CODE_V2 if force_v2 else None,
    )
    if draw(st.booleans()):
        rec = rec.with_property_crc()
    return rec, payload, codec


def _disk_sys_flag(rec: MessageRecord) -> int:
    """sysFlag as encoded: the IPv6 bits always follow the host fields."""
    flag = rec.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG) & 0xFFFFFFFF
    return signed32(flag | BORNHOST_V6_FLAG * rec.born_host.is_ipv6
                    | STOREHOSTADDRESS_V6_FLAG * rec.store_host.is_ipv6)


def _settled(rec: MessageRecord) -> MessageRecord:
    """What decode_record returns for ``rec``: BODYCRC, magic and the IPv6 sysFlag bits made explicit."""
    return replace(rec, body_crc=rec.effective_body_crc, magic_code=rec.effective_magic,
                   sys_flag=_disk_sys_flag(rec))


def _check_object_round_trip(rec: MessageRecord, payload: bytes, codec) -> bytes:
    data = rec.encode()
    v2 = rec.effective_magic == MESSAGE_MAGIC_CODE_V2
    assert rec.effective_magic == (MESSAGE_MAGIC_CODE_V2 if len(rec.topic_bytes) > 127 or rec.magic_code
                                   else MESSAGE_MAGIC_CODE_V1)
    assert len(data) == rec.total_size == record_size(len(rec.body), len(rec.topic_bytes),
                                                      len(rec.properties_bytes), rec.born_host.is_ipv6,
                                                      rec.store_host.is_ipv6, v2)
    assert struct.unpack_from(">iI", data) == (len(data), rec.effective_magic)
    back = decode_record(data, 0, rec.physical_offset)
    assert back == _settled(rec)
    assert back.encode() == data
    # inside a larger buffer, bounded by ``limit``
    framed = b"\xee" * 13 + data + b"\xdd" * 9
    assert decode_record(framed, 13, rec.physical_offset, limit=13 + len(data)) == back
    assert back.payload == payload
    assert back.compression == codec[1]
    assert back.body_crc_ok and back.body_crc == body_crc(rec.body)
    assert back.transaction_type == TXN_TYPES[rec.sys_flag & 0xC]
    assert back.properties == decode_properties(rec.properties_raw)
    assert back.keys == split_keys(back.properties.get("KEYS"))
    assert back.born_host == rec.born_host and back.store_host == rec.store_host
    return data


# ---- object codec ----------------------------------------------------------------------------------

@settings(max_examples=250, deadline=None)
@given(records())
def test_encode_decode_round_trip(case):
    rec, payload, codec = case
    _check_object_round_trip(rec, payload, codec)


def _big_payload(seed: int, size: int = 4 * MiB) -> bytes:
    """Text-like bytes: compressible, but not trivially."""
    rnd = random.Random(seed)
    words = [bytes(rnd.randrange(97, 123) for _ in range(rnd.randrange(2, 9))) for _ in range(500)]
    out = bytearray()
    while len(out) < size:
        out += rnd.choice(words) + b" "
    return bytes(out[:size])


@pytest.mark.parametrize("codec,payload_kind", [(c, k) for c in CODECS for k in ("empty", "4MiB-text")]
                         + [(CODECS[0], "4MiB-random")], ids=lambda v: v[0] if isinstance(v, tuple) else v)
def test_empty_and_4mib_bodies_round_trip(payload_kind, codec):
    if payload_kind == "empty":
        payload = b""
    elif payload_kind == "4MiB-text":
        payload = _big_payload(1)
    else:
        payload = random.Random(2).randbytes(4 * MiB)
    assert len(payload) in (0, 4 * MiB)
    born = Host.parse("[2001:db8::1]:4242")
    rec = MessageRecord(topic="BigTopic", body=_body_for(payload, codec[0]),
                        properties_raw=encode_properties({"KEYS": "big  one", "TAGS": "标签D"}),
                        queue_id=3, flag=-7, queue_offset=11, physical_offset=123_456_789,
                        sys_flag=_sys_flag(codec[2], 0, born, Host(bytes(4), 1), 0), born_timestamp=1,
                        born_host=born, store_timestamp=2, store_host=Host(bytes([10, 0, 0, 1]), 10911))
    data = _check_object_round_trip(rec, payload, codec)
    if payload_kind == "empty" and codec[0] == "NONE":
        assert struct.unpack_from(">i", data, 8)[0] == 0  # BODYCRC of an empty body is 0
    assert _check_object_round_trip(rec.with_property_crc(), payload, codec)


@pytest.mark.parametrize("topic_len,magic", [(1, MESSAGE_MAGIC_CODE_V1), (127, MESSAGE_MAGIC_CODE_V1),
                                             (128, MESSAGE_MAGIC_CODE_V2), (32767, MESSAGE_MAGIC_CODE_V2)])
def test_topic_length_picks_the_magic(topic_len, magic):
    rec = MessageRecord(topic="t" * topic_len, body=b"x")
    data = rec.encode()
    assert struct.unpack_from(">I", data, 4)[0] == magic
    len_pos = 88 + 1
    if magic == MESSAGE_MAGIC_CODE_V1:
        assert data[len_pos] == topic_len
    else:
        assert struct.unpack_from(">h", data, len_pos)[0] == topic_len
    assert decode_record(data, 0) == _settled(rec)
    with pytest.raises(ValueError):
        MessageRecord(topic="t" * 128, magic_code=MESSAGE_MAGIC_CODE_V1).encode()
    with pytest.raises(ValueError):
        MessageRecord(topic="t" * 32768).encode()


@settings(max_examples=150, deadline=None)
@given(records())
def test_property_crc(case):
    rec, payload, codec = case
    raw = rec.properties_raw
    if PROPERTY_CRC32 in decode_properties(raw):  # the strategy may already have added it: start over
        raw = encode_properties({k: v for k, v in decode_properties(raw).items() if k != PROPERTY_CRC32})
        rec = replace(rec, properties_raw=raw)
    with_crc = rec.with_property_crc()
    prefix = raw if not raw or raw.endswith("\x02") else raw + "\x02"
    assert with_crc.properties_raw.startswith(prefix + PROPERTY_CRC32 + "\x01")
    assert len(with_crc.properties_bytes) == len(prefix.encode()) + CRC32_RESERVED_LENGTH
    data = with_crc.encode()
    tail = data[-CRC32_RESERVED_LENGTH:]
    assert tail[:9] == b"__CRC32#\x01" and tail[-1:] == b"\x02" and tail[9:19].isdigit()
    digits = tail[9:19].decode()
    assert property_crc_value(digits) == crc32(data[:-CRC32_RESERVED_LENGTH]) & 0x7FFFFFFF
    assert decode_properties(with_crc.properties_raw)[PROPERTY_CRC32] == digits
    assert with_crc.with_property_crc() == with_crc  # an existing CRC is replaced, not duplicated
    _check_object_round_trip(with_crc, payload, codec)


def test_property_crc_digits_are_least_significant_first():
    assert property_crc_value("4321000000") == 1234
    assert property_crc_value("0000000001") == 1_000_000_000
    rec = MessageRecord(topic="T", body=b"abc", properties_raw="a\x01b").with_property_crc()
    data = rec.encode()
    value = crc32(data[:-20]) & 0x7FFFFFFF
    assert rec.properties_raw == "a\x01b\x02__CRC32#\x01" + str(value)[::-1].ljust(10, "0") + "\x02"


# ---- the writer and the columnar decoder agree with the object codec --------------------------------

def _expected_row(rec: MessageRecord, payload: bytes, codec) -> dict:
    props = decode_properties(rec.properties_raw)
    topic = rec.topic
    real = props.get("REAL_TOPIC") if topic in (SCHEDULE_TOPIC, TRANS_HALF_TOPIC) else None
    return {
        "commitlog_offset": rec.physical_offset,
        "store_size": rec.total_size,
        "magic_code": signed32(rec.effective_magic),
        "body_crc": body_crc(rec.body),
        "body_crc_ok": True,
        "queue_id": rec.queue_id,
        "flag": rec.flag,
        "queue_offset": rec.queue_offset,
        "sys_flag": _disk_sys_flag(rec),
        "transaction_type": TXN_TYPES[rec.sys_flag & 0xC],
        "compression": codec[1],
        "born_timestamp": rec.born_timestamp,
        "store_timestamp": rec.store_timestamp,
        "born_host": format_host(rec.born_host.address, rec.born_host.port),
        "store_host": format_host(rec.store_host.address, rec.store_host.port),
        "reconsume_times": rec.reconsume_times,
        "prepared_transaction_offset": rec.prepared_transaction_offset,
        "topic": topic,
        "real_topic": real or topic,
        "properties": list(props.items()),
        "keys": [k for k in (props.get("KEYS") or "").split(" ") if k],
        "tags": props.get("TAGS"),
        "uniq_key": props.get("UNIQ_KEY"),
        "offset_msg_id": encode_offset_msg_id(rec.store_host, rec.physical_offset),
        "body": payload,
    }


def _columnar_rows(store: Path, segment_size: int) -> tuple[list[dict], list]:
    log = CommitLog.open(store, segment_size)
    rows, found = [], list(log.findings)
    for seg in log.segments:
        table, stats = decode_range(seg.open(), seg.base, log.segment_size, file_name=seg.name)
        rows += table.to_pylist()
        found += stats.findings
    return rows, found


def _write_and_compare(cases, segment_size: int, batch: bool = False) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        with CommitLogWriter(store, segment_size=segment_size) as w:
            if batch:
                results = w.append_batch([c[0] for c in cases], store_timestamp=1_800_000_000_000)
            else:
                results = [w.append(c[0], store_timestamp=1_800_000_000_000 + i) for i, c in enumerate(cases)]
        rows, found = _columnar_rows(store, segment_size)
        assert found == []
        assert len(rows) == len(results)
        for row, res, (rec, payload, codec) in zip(rows, results, cases):
            assert list(row) == RECORD_FIELD_NAMES
            placed = res.record
            # the writer only fills in the position fields (and the 5.2+ property CRC that covers them)
            want = replace(rec, physical_offset=res.physical_offset, queue_offset=res.queue_offset,
                           store_timestamp=res.store_timestamp)
            if PROPERTY_CRC32 in decode_properties(rec.properties_raw):
                want = want.with_property_crc()
                data = placed.encode()
                assert property_crc_value(data[-11:-1].decode()) == crc32(data[:-20]) & 0x7FFFFFFF
            assert placed == want
            assert row == _expected_row(placed, payload, codec)
        # the object reader sees the very same bytes
        log = CommitLog.open(store, segment_size)
        assert list(log.iter_records()) == [_settled(r.record) for r in results]
        for res in results:
            assert log.read_record(res.physical_offset) == _settled(res.record)
            assert log.read_record(res.physical_offset).encode() == res.record.encode()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(max_body=1200, placed=False), min_size=1, max_size=6))
def test_writer_then_columnar_decoder_same_fields(cases):
    _write_and_compare(cases, 128 * 1024)


@settings(max_examples=25, deadline=None)
@given(st.lists(records(max_body=400, placed=False), min_size=2, max_size=6))
def test_batch_then_columnar_decoder_same_fields(cases):
    cases = [(replace(rec, topic="BatchTopic", queue_id=1, sys_flag=rec.sys_flag & ~0xC, magic_code=None), p, c)
             for rec, p, c in cases]
    _write_and_compare(cases, 256 * 1024, batch=True)


@pytest.mark.parametrize("codec", CODECS, ids=[c[0] for c in CODECS])
def test_4mib_bodies_through_writer_and_decoder(codec):
    payload = _big_payload(7)
    big = []
    for i, born in enumerate([Host(bytes([10, 0, 0, 1]), 1), Host.parse("[2001:db8::7]:2")]):
        rec = MessageRecord(topic="Big", body=_body_for(payload, codec[0]),
                            properties_raw=encode_properties({"KEYS": f"k{i}", "UNIQ_KEY": f"U{i}"}),
                            sys_flag=_sys_flag(codec[2], 0, born, Host(bytes(4), 9), 0), born_host=born,
                            store_host=Host(bytes(4), 9))
        big.append((rec, payload, codec))
    small = (MessageRecord(topic="Small", body=b"", properties_raw=""), b"", CODECS[0])
    _write_and_compare([small, big[0], small, big[1], small], 8 * MiB + 4096)


def test_writer_recomputes_the_property_crc_after_placing(tmp_path):
    """The 5.2+ CRC covers QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP, which the writer fills in."""
    rec = MessageRecord(topic="T", body=b"x", properties_raw="a\x01b").with_property_crc()
    with CommitLogWriter(tmp_path, segment_size=SEG) as w:
        w.append(MessageRecord(topic="T", body=b"pad"), store_timestamp=5)
        res = w.append(rec, store_timestamp=6)
    data = _segment_bytes(tmp_path, 0)[res.physical_offset:res.physical_offset + res.size]
    assert res.size == rec.total_size
    assert data == res.record.encode()
    assert property_crc_value(data[-11:-1].decode()) == crc32(data[:-20]) & 0x7FFFFFFF
    assert res.record.properties_raw.startswith("a\x01b\x02__CRC32#\x01")


def test_empty_properties_and_empty_body_everywhere():
    rec = MessageRecord(topic="E", body=b"", properties_raw="", store_host=Host(bytes(16), 7))
    _write_and_compare([(rec, b"", CODECS[0])] * 3, 64 * 1024)


# properties strings as Apache may have written them (separators anywhere, empty names/values,
# duplicates, values with 0x01): both decoders must apply string2messageProperties identically
raw_props = st.lists(st.one_of(st.sampled_from(["\x01", "\x02", "\x01\x01", "\x02\x02", "KEYS", "TAGS",
                                                "UNIQ_KEY", "REAL_TOPIC", " ", "  a ", "é", "🚀", "x"]),
                               st.text(_prop_chars, max_size=4)), max_size=16).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(raw_props, min_size=1, max_size=5),
       st.sampled_from(["T", SCHEDULE_TOPIC, TRANS_HALF_TOPIC]))
def test_columnar_properties_parse_like_apache(raws, topic):
    buf = bytearray()
    placed = []
    for raw in raws:
        rec = MessageRecord(topic=topic, body=b"b", properties_raw=raw, physical_offset=len(buf))
        placed.append(rec)
        buf += rec.encode()
    seg_size = len(buf) + 4096
    table, stats = decode_range(bytes(buf) + bytes(seg_size - len(buf)), 0, seg_size)
    assert stats.findings == []
    rows = table.to_pylist()
    assert len(rows) == len(placed)
    for row, rec in zip(rows, placed):
        want = _expected_row(rec, b"b", CODECS[0])
        got = {k: row[k] for k in ("properties", "keys", "tags", "uniq_key", "real_topic")}
        assert got == {k: want[k] for k in got}


# ---- Java String.hashCode over UTF-16 ------------------------------------------------------------------

def _reference_hash(text: str) -> int:
    """Straight from the JDK's definition: s[0]*31^(n-1) + … + s[n-1], over UTF-16 code units."""
    units = []
    for ch in text:
        cp = ord(ch)
        if cp > 0xFFFF:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    h = 0
    for u in units:
        h = (h * 31 + u) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


@pytest.mark.parametrize("text,value", [
    ("TagA", 2598919), ("TagB", 2598920), ("标签D", 26572493), ("tag with space", -1742848654),
    ("d", 100), ("", 0), ("a", 97), ("🚀", 31 * 0xD83D + 0xDE80),
    ("polygenelubricants", -(1 << 31)),
])
def test_java_hash_known_values(text, value):
    assert java_string_hash(text) == value == _reference_hash(text)


def test_emoji_counts_as_two_utf16_units():
    # "🚀" is U+1F680 = surrogates D83D DE80: two units, so it hashes like a two-char string
    assert java_string_hash("🚀") == java_string_hash("\ud83d\ude80".encode("utf-16", "surrogatepass")
                                                      .decode("utf-16")) == 31 * 0xD83D + 0xDE80
    assert java_string_hash("a🚀") == (97 * 31 * 31 + 0xD83D * 31 + 0xDE80)
    assert java_string_hash("🚀") != ord("🚀")


def test_tags_code_and_index_key_hash():
    assert tags_code(None) == 0 and tags_code("") == 0
    assert tags_code("tag with space") == -1742848654  # sign-extended, stored as 0xFFFFFFFF981E3D72
    assert struct.pack(">q", tags_code("tag with space")) == bytes.fromhex("FFFFFFFF981E3D72")
    assert index_key_hash("polygenelubricants") == 0  # abs(Integer.MIN_VALUE) stays negative → 0
    assert index_key_hash("tag with space") == 1742848654


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
@example("TagA||TagB")
@example("👍🏽🚀😀")
def test_java_hash_matches_reference(text):
    assert java_string_hash(text) == _reference_hash(text)
    assert -(1 << 31) <= java_string_hash(text) < (1 << 31)


# ---- CommitLogWriter rolling ---------------------------------------------------------------------

SEG = 64 * 1024


def _rec(body_len: int, topic: str = "R", queue_id: int = 0, txn: int = 0) -> MessageRecord:
    return MessageRecord(topic=topic, body=b"z" * body_len, properties_raw="KEYS\x01k", queue_id=queue_id,
                         sys_flag=txn)


def _body_for_size(total: int, topic: str = "R") -> int:
    return total - record_size(0, len(topic), len("KEYS\x01k"))


def _segment_bytes(store: Path, base: int) -> bytes:
    return (store / "commitlog" / offset_to_file_name(base)).read_bytes()


def _assert_blank(store: Path, base: int, pos: int) -> None:
    data = _segment_bytes(store, base)
    assert len(data) == SEG
    blank = decode_record(data, pos, base + pos)
    assert blank == BlankRecord(base + pos, SEG - pos)
    assert struct.unpack_from(">iI", data, pos) == (SEG - pos, BLANK_MAGIC_CODE)
    assert data[pos + 8:] == bytes(SEG - pos - 8)  # the filler keeps the file's zeros


def test_roll_leaves_a_blank_to_the_file_end(tmp_path):
    with CommitLogWriter(tmp_path, segment_size=SEG) as w:
        first = [w.append(_rec(10_000)) for _ in range(6)]
        used = sum(r.size for r in first)
        assert w.write_offset == used
        nxt = w.append(_rec(10_000))  # 6 × ~10 KB used, another does not fit 64 KiB
    assert used + nxt.size + 8 > SEG
    assert nxt.physical_offset == SEG
    _assert_blank(tmp_path, 0, used)
    assert sorted(p.name for p in (tmp_path / "commitlog").iterdir()) == [offset_to_file_name(0),
                                                                         offset_to_file_name(SEG)]
    assert decode_record(_segment_bytes(tmp_path, SEG), 0, SEG) == _settled(nxt.record)


def test_record_that_leaves_exactly_8_bytes_fits_one_more_does_not(tmp_path):
    with CommitLogWriter(tmp_path, segment_size=SEG) as w:
        a = w.append(_rec(30_000))
        exact = SEG - a.size - 8  # leaves exactly END_FILE_MIN_BLANK_LENGTH
        b = w.append(_rec(_body_for_size(exact)))
        assert (b.physical_offset, b.size) == (a.size, exact)
        c = w.append(_rec(0))  # the file is full: BLANK of exactly 8 bytes
        assert c.physical_offset == SEG
        d = w.append(_rec(_body_for_size(SEG - 8 - c.size + 1)))  # one byte too big for the rest
        assert d.physical_offset == 2 * SEG
    _assert_blank(tmp_path, 0, SEG - 8)
    _assert_blank(tmp_path, SEG, c.size)
    log = CommitLog.open(tmp_path, SEG)
    assert [s.base for s in log.segments] == [0, SEG, 2 * SEG]
    assert [r.physical_offset for r in log.iter_records()] == [0, a.size, SEG, 2 * SEG]
    assert log.data_end() == 2 * SEG + d.size


def test_batch_never_spans_files(tmp_path):
    with CommitLogWriter(tmp_path, segment_size=SEG) as w:
        head = w.append(_rec(45_000, topic="B"))
        batch = w.append_batch([_rec(3_000, topic="B") for _ in range(8)], store_timestamp=42)
        # 8 × ~3 KB would have fit partly in the first file; the whole batch moved on
        assert head.size + batch[0].size + 8 <= SEG
        assert [r.physical_offset for r in batch] == [SEG + sum(r.size for r in batch[:i]) for i in range(8)]
        assert [r.queue_offset for r in batch] == list(range(1, 9))
        assert {r.store_timestamp for r in batch} == {42}
        before = (w.write_offset, dict(w.queue_offsets))
        with pytest.raises(ValueError, match="cannot fit"):
            w.append_batch([_rec(20_000, topic="B") for _ in range(4)])
        assert (w.write_offset, dict(w.queue_offsets)) == before  # nothing written, counters kept
        last = w.append(_rec(1, topic="B"))
        assert last.queue_offset == 9 and last.physical_offset == before[0]
    _assert_blank(tmp_path, 0, head.size)
    rows, found = _columnar_rows(tmp_path, SEG)
    assert found == []
    assert [r["commitlog_offset"] for r in rows] == [head.physical_offset] + [r.physical_offset for r in batch] + [
        last.physical_offset]


def test_prepared_and_rollback_get_queue_offset_zero(tmp_path):
    kinds = [TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE,
             TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_NOT_TYPE]
    with CommitLogWriter(tmp_path, segment_size=SEG) as w:
        res = [w.append(_rec(10, topic="TX", queue_id=2, txn=t)) for t in kinds]
        other = w.append(_rec(10, topic="TX", queue_id=3))
        assert w.queue_offsets == {("TX", 2): 4, ("TX", 3): 1}
    assert [r.queue_offset for r in res] == [0, 0, 1, 0, 2, 0, 3]
    assert other.queue_offset == 0
    rows, _ = _columnar_rows(tmp_path, SEG)
    assert [(r["transaction_type"], r["queue_offset"]) for r in rows[:7]] == [
        (TXN_TYPES[t], q) for t, q in zip(kinds, [0, 0, 1, 0, 2, 0, 3])]


def test_reopened_writer_continues_where_the_log_ends(tmp_path):
    with CommitLogWriter(tmp_path, segment_size=SEG) as w:
        first = [w.append(_rec(20_000)) for _ in range(4)]  # the 4th rolls to file 2
        offsets = dict(w.queue_offsets)
    assert first[-1].physical_offset == SEG
    with CommitLogWriter(tmp_path, segment_size=SEG, queue_offsets=offsets) as w:
        assert w.write_offset == SEG + first[-1].size
        more = w.append(_rec(5))
    assert (more.physical_offset, more.queue_offset) == (SEG + first[-1].size, 4)
    # a log whose last file is full (BLANK written, next file created empty) continues in the next file
    with CommitLogWriter(tmp_path, segment_size=SEG) as w:
        w.append(_rec(_body_for_size(SEG - 8 - more.physical_offset - more.size + SEG)))
        w.append(_rec(0))
        end = w.write_offset
    assert end // SEG == 2
    with CommitLogWriter(tmp_path, segment_size=SEG) as w:
        assert w.write_offset == end
    rows, found = _columnar_rows(tmp_path, SEG)
    assert found == [] and len(rows) == 7
