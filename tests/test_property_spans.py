"""The compiled property splitter gives exactly what the text path (Arrow's string kernels, the
decoder's former only path) and ``decode_properties`` give, for every shape of properties string."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from broker.store.columnar import _Properties, _string_slices
from broker.store.properties import decode_properties
from broker.store.property_spans import property_entries


def _layout(strings: list[bytes]) -> tuple[np.ndarray, pa.Buffer, np.ndarray, np.ndarray]:
    """The strings one after another in a buffer with a junk byte between (as inside records)."""
    blob, starts = bytearray(b"\x7f"), []
    for s in strings:
        starts.append(len(blob))
        blob += s + b"\x02"  # a separator right after each string must not be read
    a = np.frombuffer(bytes(blob), np.uint8)
    return a, pa.py_buffer(a), np.array(starts, np.int64), np.array([len(s) for s in strings], np.int64)


def _rows(p: _Properties) -> list[list[tuple[str, str]]]:
    return [list(m.items()) if isinstance(m, dict) else m for m in p.map_array().to_pylist()]


def _both(strings: list[bytes]) -> tuple[_Properties, _Properties]:
    a, buf, starts, lengths = _layout(strings)
    return _Properties.of_records(a, buf, starts, lengths), _Properties(_string_slices(a, buf, starts, starts + lengths))


def _assert_same(strings: list[bytes]) -> None:
    new, old = _both(strings)
    assert _rows(new) == _rows(old)
    for name in ("KEYS", "TAGS", "UNIQ_KEY", "REAL_TOPIC", "a", "k1", "é", ""):
        assert new.value_of(name).to_pylist() == old.value_of(name).to_pylist(), name


SHAPES = [
    b"",
    b"\x02",
    b"\x01",
    b"\x02\x02\x02",
    b"a",
    b"a\x01",
    b"\x01b",
    b"a\x01b",
    b"a\x01b\x02",
    b"a\x01b\x02\x02c\x01d",
    b"a\x01b\x01c",  # a value may contain 0x01
    b"a\x01\x01c",  # value "\x01c"
    b"a\x01b\x02a\x01c",  # a later duplicate wins
    b"a\x01b\x02x\x01y\x02a\x01c\x02z\x01w",  # ... in its own place
    b"a\x01b\x02a\x01c\x02a\x01d",
    b"a\x01b\x02a\x01\x02a\x01c",  # an empty value is no entry and overwrites nothing
    b"KEYS\x01k1 k2\x02TAGS\x01t\x02UNIQ_KEY\x01ABC\x02WAIT\x01true\x02",
    b"REAL_TOPIC\x01Orders\x02REAL_QID\x013",
    "é\x01ü\x02日本\x01語\x02😀\x01x".encode(),
    "k1\x01é\x02k1\x01日".encode(),
    b"ab\x01x\x02ac\x01y\x02ab\x01z",  # same length, different names
]


def test_each_shape_alone_and_together() -> None:
    for s in SHAPES:
        _assert_same([s])
    _assert_same(SHAPES)
    _assert_same(SHAPES[::-1] * 3)
    _assert_same([])


def test_exact_entries_of_a_record() -> None:
    a, _, starts, lengths = _layout([b"x\x01\x02a\x01b\x02c\x01d\x01e\x02a\x01z\x02", b"q\x01r"])
    rec, names, values = property_entries(a, starts, lengths)
    assert list(zip(rec.tolist(), names.to_pylist(), values.to_pylist())) == [
        (0, "c", "d\x01e"), (0, "a", "z"), (1, "q", "r")]
    assert property_entries(a, starts[:0], lengths[:0])[0].size == 0


def test_invalid_utf8_is_refused() -> None:
    a, _, starts, lengths = _layout([b"a\x01b", b"k\x01\xe2\x82"])
    assert property_entries(a, starts, lengths) is None
    assert property_entries(a, starts[:1], lengths[:1])[1].to_pylist() == ["a"]


def test_matches_decode_properties() -> None:
    strings = [s.decode() for s in SHAPES]
    new, _ = _both([s.encode() for s in strings])
    assert _rows(new) == [list(decode_properties(s).items()) for s in strings]


def test_invalid_utf8_takes_the_text_path() -> None:
    strings = [b"a\x01b", b"k\x01\xff\xfe\x02t\x01\xe2\x82", b"\xc3\x01x\x02y\x01z", b"ok\x01\xf0\x9f\x02x\x01y"]
    new, old = _both(strings)
    assert _rows(new) == _rows(old)
    assert _rows(new)[1] == [("k", "\ufffd\ufffd"), ("t", "\ufffd")]
    # invalid bytes only in an entry that is dropped: the fast path keeps the valid entries as they are
    _assert_same([b"\xff\x02a\x01b", b"\x01\xfe\x02c\x01d"])


@pytest.mark.parametrize("seed", range(6))
def test_random_strings(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = ["a", "b", "K", "\x01", "\x02", "é", "日", "😀", " "]
    names = ["a", "b", "KEYS", "TAGS", "UNIQ_KEY", "é", "k1"]
    strings = []
    for _ in range(400):
        if rng.random() < 0.5:
            s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        else:
            s = "\x02".join(f"{rng.choice(names)}\x01{''.join(rng.choice(alphabet[:3] + alphabet[5:]) for _ in range(rng.randrange(0, 6)))}"
                            for _ in range(rng.randrange(0, 8)))
        strings.append(s.encode())
    _assert_same(strings)


def test_huge_properties() -> None:
    many = b"\x02".join(b"n%d\x01v%d" % (i, i) for i in range(6000))  # ~60 KB, distinct names
    dups = b"\x02".join(b"n%d\x01v%d" % (i % 50, i) for i in range(4000))
    _assert_same([many, dups, b"a\x01" + b"x" * 32000])
    new, _ = _both([dups])
    assert _rows(new)[0] == [(f"n{i % 50}", f"v{i}") for i in range(3950, 4000)]
