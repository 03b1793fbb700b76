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
