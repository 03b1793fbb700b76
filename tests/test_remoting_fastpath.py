"""Fast paths of the remoting codec give exactly what the standard-library path gives."""

from __future__ import annotations

import json
import random

import pytest

from broker.remoting.command import ProtocolError, RemotingCommand
from broker.remoting.json_header import dumps_sorted, fast_loads

GOLDEN_HEADERS = [  # ../shared/reference/remoting-protocol.md
    b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"N/YT7X6tJe5UfutmW+uNwTTJ7Fc=",'
    b'"topic":"TopicTest"},"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}',
    b'{"code":0,"extFields":{},"flag":1,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}',
    b'{"code":0,"flag":1,"opaque":5}',
]

ODD = ["", "a", "é", "\u2028", "\x00", "\x1f", "\x7f", '"', "\\", "/", "\n\r\t\b\f", "\ud7ff", "\ue000", "\uffff",
       "\U0001F600", "\x01\x02", "UNIQ_KEY\x01ABC\x02KEYS\x01k1 k2", "主题", "%RETRY%g", "a" * 300]


def _std_dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")


def _random_text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(ODD)
    return "".join(chr(rng.choice([rng.randrange(0, 0x80), rng.randrange(0x80, 0x800), rng.randrange(0xE000, 0x10000),
                                   rng.randrange(0x10000, 0x110000)])) for _ in range(rng.randrange(0, 12)))


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.choice([0, 1, -1, 2**31 - 1, -2**31, 2**63 - 1, -2**63, 2**63, 2**64 - 1, 2**64, -2**63 - 1,
                           10**30, rng.randrange(-10**6, 10**6)])
    if kind == 1:
        return rng.choice([True, False, None])
    if kind == 2:
        return rng.choice([0.0, -0.0, 1.5, 1e16, 1e-7, 123456.789, 2.0**70])
    if kind in (3, 4, 5):
        return _random_text(rng)
    if kind in (6, 7):
        return {_random_text(rng): _random_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))}
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]


@pytest.mark.parametrize("seed", range(20))
def test_dumps_sorted_equals_the_standard_library(seed):
    rng = random.Random(seed)
    for _ in range(200):
        obj = {_random_text(rng): _random_value(rng) for _ in range(rng.randrange(0, 8))}
        assert dumps_sorted(obj) == _std_dumps(obj)


@pytest.mark.parametrize("seed", range(20))
def test_fast_loads_equals_the_standard_library_or_declines(seed):
    rng = random.Random(seed)
    for _ in range(200):
        obj = {_random_text(rng): _random_value(rng) for _ in range(rng.randrange(0, 8))}
        raw = _std_dumps(obj)
        got = fast_loads(raw)
        want = json.loads(raw.decode("utf-8"))
        if got is not None:
            assert repr(got) == repr(want)
            assert list(got) == list(want)


@pytest.mark.parametrize("raw", GOLDEN_HEADERS + [
    b'{"a":1,"a":2,"b":3}', b'{"b":1,"a":2,"b":3}', b'{"a":1}\n', b' {"a":1} ', b'{"a":18446744073709551615}',
    b'{"\\u0000":1}', b'{"a":"\\u00e9\\ud83d\\ude00"}', b'{"a":-0}', b'[1,2]', b'"x"', b'null'])
def test_fast_loads_agrees(raw):
    got = fast_loads(raw)
    want = json.loads(raw.decode("utf-8"))
    assert got is None or (repr(got) == repr(want) and (not isinstance(got, dict) or list(got) == list(want)))


@pytest.mark.parametrize("raw", [
    b'{"a":1e400}', b'{"a":"\\ud800"}', b'{"a":NaN}', b'{"a":Infinity}', b'{"a":123456789012345678901234567890}',
    b'{"a":18446744073709551616}', b'{"a":1.5}', b'\xef\xbb\xbf{"a":1}', b'{"a":1}x', b'{"a":"\xff"}', b'{"a":01}',
    b'[' * 5000 + b']' * 5000, b'{"a":"\x01"}'])
def test_fast_loads_declines_where_it_could_differ(raw):
    assert fast_loads(raw) is None


@pytest.mark.parametrize("obj", [{"a": "\ud800"}, {1: "a"}, {"a": 2**64}, {"a": float("nan")}, {"a": 1.5},
                                 {"a": [{"b": -2**63 - 1}]}])
def test_dumps_sorted_falls_back(obj):
    try:
        want = _std_dumps(obj)
    except (UnicodeEncodeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            dumps_sorted(obj)
    else:
        assert dumps_sorted(obj) == want


def _frame(header: bytes, body: bytes = b"") -> bytes:
    return len(header).to_bytes(4, "big") + header + body


@pytest.mark.parametrize("header", GOLDEN_HEADERS)
def test_golden_headers_round_trip_byte_identical(header):
    cmd = RemotingCommand.decode(_frame(header))
    again = RemotingCommand.decode(cmd.encode()[4:])
    assert again.encode() == cmd.encode()
    assert cmd.encode_json_header() == _std_dumps(cmd.header_json())


@pytest.mark.parametrize("header, message", [
    (b'{"code":1,"a":NaN}', "JSON header does not parse: NaN is not a JSON value"),
    (b'{"code":1,"a":"\xff"}', "JSON header is not valid UTF-8 at byte 15"),
    (b'{"code":1}x', "JSON header does not parse: Extra data: line 1 column 11 (char 10)"),
    (b'[1]', "JSON header is a list, not an object"),
    (b'{"opaque":1}', "JSON header has no 'code'"),
    (b'{"code":123456789012345678901234567890}', "header 'code' = 123456789012345678901234567890 does not fit a 32-bit int"),
    (b'{"code":1.5}', "header 'code' is not an integer: 1.5"),
])
def test_decode_errors_are_worded_as_before(header, message):
    with pytest.raises(ProtocolError) as err:
        RemotingCommand.decode(_frame(header))
    assert str(err.value) == message


# ---- SEND_MESSAGE(_V2) header and the SEND_OK reply ------------------------------------------------
from broker.remoting.command import response_frame  # noqa: E402
from broker.remoting.headers import SendMessageRequestHeader  # noqa: E402
from broker.server.send_draft import _plain_send_header, check_topic_name, TopicRefused  # noqa: E402

_SEND_VALUES = {
    "producer_group": ["PG", "", "组"],
    "topic": ["BenchTopic", "", "主题", "%RETRY%g", "a b", "t" * 300],
    "default_topic": ["TBW102", ""],
    "default_topic_queue_nums": ["4", "0", "", "-1", "abc", "2147483647", "2147483648", "007", "٣", " 4", None],
    "queue_id": ["0", "3", "-1", "", "999999999", "1e3", None],
    "sys_flag": ["0", "4", "", "x", None],
    "born_timestamp": ["0", "1700000000000", "-5", "9223372036854775807", "9223372036854775808",
                       "123456789012345678", "", None],
    "flag": ["0", "12", "", None],
    "properties": [None, "", "WAIT\x01true", "KEYS\x01a b\x02TAGS\x01t\x02UNIQ_KEY\x01X", "a\x01\x02\x01"],
    "reconsume_times": [None, "0", "3", "", "x", "-2"],
    "unit_mode": [None, "false", "true", "", "1", "TRUE", " true", "no"],
    "max_reconsume_times": [None, "16", "", "x"],
    "batch": [None, "false", "true", "", "1", "True", "0"],
    "broker_name": [None, "", "broker-a"],
}


def _outcome(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return ("error", type(exc).__name__, str(exc))


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_plain_send_header_equals_the_generic_parser(v2, seed):
    rng = random.Random(seed)
    wire = {name: wire for name, wire, _, _ in SendMessageRequestHeader._wire_fields("v2" if v2 else "wire")}
    fast_taken = 0
    for i in range(400):
        ext = {"extra": "ignored"}
        for name, choices in _SEND_VALUES.items():
            value = choices[0] if i % 3 == 0 else rng.choice(choices)  # a third look like real producers
            if value is not None:
                ext[wire[name]] = value
        fast = _plain_send_header(ext, v2)
        generic = _outcome(lambda: SendMessageRequestHeader.from_ext(ext, v2=v2))
        if fast is not None:
            fast_taken += 1
            assert fast == generic, ext
    assert fast_taken >= 100


def test_plain_send_header_of_the_other_naming_is_not_taken():
    ext = SendMessageRequestHeader(producer_group="PG", topic="T", default_topic="TBW102", default_topic_queue_nums=4,
                                   queue_id=0, sys_flag=0, born_timestamp=1, flag=0).to_ext(v2=False)
    assert _plain_send_header(ext, True) is None
    assert _plain_send_header(ext, False) == SendMessageRequestHeader.from_ext(ext, v2=False)


@pytest.mark.parametrize("topic, remark", [
    ("ok_Topic-1", None), ("", "The specified topic is blank."), ("  ", "The specified topic is blank."),
    ("a b", "illegal"), ("主题", "illegal"), ("t" * 127, None), ("t" * 128, "longer"), ("t" * 256, "longer"),
    ("%RETRY%" + "g" * 200, None), ("%DLQ%" + "g" * 251, "longer")])
def test_check_topic_name_cached_gives_the_same_answer_each_time(topic, remark):
    for _ in range(2):
        if remark is None:
            check_topic_name(topic)
        else:
            with pytest.raises(TopicRefused) as err:
                check_topic_name(topic)
            assert remark in str(err.value)


@pytest.mark.parametrize("code, remark, ext, body", [
    (0, None, {"msgId": "7F0000010000", "queueId": "0", "queueOffset": "12"}, b""),
    (0, None, {"msgId": "X", "queueId": 1, "queueOffset": 2, "transactionId": None, "MSG_REGION": "DefaultRegion",
               "TRACE_ON": True}, b""),
    (0, "", {}, b""),
    (1, "SystemError: boom", None, b""),
    (14, "broker is shutting down", {}, b"body"),
    (17, "topic[主题] not exist, apply first please! \u2028\x00", {"k\x01": "v\x02"}, b"\x00\xff"),
    (0, None, {"big": 2**70, "f": 1.5, "n": [1, {"a": None}]}, b""),
    (2**31 - 1, None, {1: "int key"}, b""),
])
@pytest.mark.parametrize("opaque", [0, 1, 2**31 - 1, -5])
def test_response_frame_equals_the_command_path(code, remark, ext, body, opaque):
    request = RemotingCommand.request(310, {"a": "b"}, b"x")
    request.opaque = opaque
    want = _outcome(lambda: _generic_answer(request, code, remark, ext, body))
    got = _outcome(lambda: response_frame(opaque, code, remark, ext, body))
    assert got == want


def _generic_answer(request, code, remark, ext, body) -> bytes:
    """What Connection.answer writes for ``request.response(...)``."""
    from broker.remoting.command import RESPONSE_FLAG
    response = request.response(code, remark, ext, body)
    response.opaque = request.opaque
    response.flag |= RESPONSE_FLAG
    return response.encode()


def test_response_frame_refuses_lone_surrogates_as_encode_does():
    with pytest.raises(ProtocolError) as err:
        response_frame(1, 0, "\ud800")
    with pytest.raises(ProtocolError) as err2:
        RemotingCommand(code=0, opaque=1, flag=1, remark="\ud800").encode()
    assert str(err.value) == str(err2.value)


# ---- the drafted record's encoding -----------------------------------------------------------------
from broker.store.hosts import Host  # noqa: E402
from broker.store.constants import MESSAGE_MAGIC_CODE_V2  # noqa: E402
from broker.store.message import MessageRecord, decode_record  # noqa: E402


@pytest.mark.parametrize("topic", ["T", "主题", "t" * 127, "t" * 128, "%RETRY%" + "g" * 200])
@pytest.mark.parametrize("born, store", [(Host(bytes([127, 0, 0, 1]), 5), Host(bytes([10, 0, 0, 2]), 10911)),
                                         (Host(bytes(range(16)), 7), Host(bytes([10, 0, 0, 2]), 10911)),
                                         (Host(bytes([1, 2, 3, 4]), 7), Host(bytes(range(16)), 9))])
@pytest.mark.parametrize("magic, crc", [(None, None), (None, 123), (MESSAGE_MAGIC_CODE_V2, None)])
def test_record_encode_agrees_with_its_derived_values(topic, born, store, magic, crc):
    rec = MessageRecord(topic=topic, body=b"\x00body\xff", properties_raw="UNIQ_KEY\x01AB\x02主\x01v", queue_id=3, flag=9,
                        queue_offset=11, physical_offset=0, sys_flag=0x1, born_timestamp=1700000000000,
                        born_host=born, store_timestamp=17, store_host=store, reconsume_times=2,
                        prepared_transaction_offset=5, body_crc=crc, magic_code=magic)
    data = rec.encode()
    assert len(data) == rec.total_size
    assert int.from_bytes(data[:4], "big") == rec.total_size
    assert int.from_bytes(data[4:8], "big") == rec.effective_magic & 0xFFFFFFFF
    assert int.from_bytes(data[8:12], "big") == rec.effective_body_crc
    back = decode_record(data, 0)
    assert back.encode() == data
    assert (back.topic, back.body, back.properties_raw, back.born_host, back.store_host) == \
        (topic, rec.body, rec.properties_raw, born, store)


def test_huge_topic_names_are_not_cached():
    from broker.server.send_draft import _cached_topic_name_refusal, topic_name_refusal
    before = _cached_topic_name_refusal.cache_info().currsize
    assert topic_name_refusal("t" * 100_000) == "The specified topic is longer than topic max length."
    assert topic_name_refusal("a b" * 100_000).startswith("The specified topic contains illegal characters")
    assert _cached_topic_name_refusal.cache_info().currsize == before


# ---- the flat-header decode ------------------------------------------------------------------------
from broker.remoting.command import _decode_json_header, _flat_json_command  # noqa: E402

_HEADER_VALUES = {
    "code": [310, 0, -1, 2**31 - 1, 2**31, -2**31 - 1, "310", True, None, 1.5, 2**64],
    "opaque": [7, 0, -5, 2**31, "7", None, False],
    "flag": [0, 1, 2, 3, "0", None, 2**40],
    "version": [401, 0, "401", None, -1],
    "language": ["JAVA", "CPP", "", 12, 0, None, True, ["x"]],
    "remark": [None, "", "boom", "主题\u2028", 5, 1.5, False, {"a": "b"}],
    "extFields": [None, {}, {"a": "PG", "b": "BenchTopic", "i": "WAIT\x01true"}, {"a": 1}, {"a": True},
                  {"a": None}, {"a": [1]}, {"a": {"b": "c"}}, {"a": 1.5}, "text", 3, [], {"é": "ü"}],
    "serializeTypeCurrentRPC": ["JSON", None, 0, True, 2.5],
    "other": [None, "x", 1, 2**70, [1, "a"], {"k": 1}],
}


@pytest.mark.parametrize("seed", range(10))
def test_flat_header_decode_equals_the_general_path(seed):
    """Whenever the flat path takes a header, it gives the command the general path gives."""
    rng = random.Random(seed)
    taken = 0
    for i in range(400):
        header = {}
        for key, choices in _HEADER_VALUES.items():
            if rng.random() < 0.9:
                header[key] = choices[0] if i % 3 == 0 else rng.choice(choices)
        raw = _std_dumps(header)
        got = _flat_json_command(raw, b"body")
        if got is None:
            continue
        taken += 1
        want = _decode_json_header(raw)
        want.body = b"body"
        assert got == want, header
        assert got.language == want.language and got.ext_fields == want.ext_fields
        assert list(got.ext_fields) == list(want.ext_fields)
    assert taken >= 100


@pytest.mark.parametrize("raw", [b'{"code":1,"extFields":"x"}', b'{"code":true}', b'{"code":1,"language":5}',
                                 b'{"code":1,"remark":5}', b'{"code":1,"x":1.5}', b'{"code":1,"x":[1]}',
                                 b'{"code":1,"extFields":{"a":1}}', b'{"code":1,"extFields":{"a":{"b":"c"}}}',
                                 b'{"code":1,"opaque":null}', b'{"code":18446744073709551616}', b'[1]', b'"x"',
                                 b'{"code":1,"a":"\\ud800"}', b'{"code":1}x'])
def test_flat_header_decode_declines(raw):
    assert _flat_json_command(raw, b"") is None


@pytest.mark.parametrize("seed", range(10))
def test_plain_reply_frames_equal_the_command_path(seed):
    """Replies without remark or body and with str extFields (what answers a send) are put
    together around orjson's text of the map: the bytes are the command path's."""
    rng = random.Random(seed)
    request = RemotingCommand.request(310, {"a": "b"}, b"x")
    for _ in range(200):
        ext = {_random_text(rng): _random_text(rng) for _ in range(rng.randrange(0, 6))}
        code = rng.choice([0, 1, 10, 14, 2**31 - 1, -1])
        request.opaque = rng.choice([0, 1, 2**31 - 1, -5])
        want = _outcome(lambda: _generic_answer(request, code, None, ext, b""))
        assert _outcome(lambda: response_frame(request.opaque, code, None, ext, b"")) == want
