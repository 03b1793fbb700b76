"""The compiled body CRC (ISA-L from numba) equals zlib's CRC-32 with the sign bit cleared."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from broker.store.crc import body_crc
from broker.store.crc_kernel import body_crcs


def _spans(size: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 3000, n)
    lengths[::7] = 0  # empty bodies: RocketMQ stores 0
    starts = rng.integers(0, size - 3000, n)
    return starts.astype(np.int64), lengths.astype(np.int64)


@pytest.mark.parametrize("readonly", [True, False])
def test_equals_zlib_on_every_span(readonly: bool) -> None:
    data = np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8).tobytes()
    a = np.frombuffer(data, np.uint8) if readonly else np.frombuffer(bytearray(data), np.uint8)
    starts, lengths = _spans(len(data), 500, 1)
    got = body_crcs(a, starts, lengths)
    want = [zlib.crc32(data[s:s + n]) & 0x7FFFFFFF if n else 0 for s, n in zip(starts, lengths)]
    assert got.dtype == np.int64
    assert got.tolist() == want
    assert got.tolist() == [body_crc(data[s:s + n]) for s, n in zip(starts, lengths)]


def test_known_value_and_empty_input() -> None:
    a = np.frombuffer(b"123456789", np.uint8)
    # the CRC-32 check value of "123456789" is 0xCBF43926; its low 31 bits are what RocketMQ stores
    assert body_crcs(a, np.array([0]), np.array([9])).tolist() == [0xCBF43926 & 0x7FFFFFFF]
    assert body_crcs(a, np.array([], np.int64), np.array([], np.int64)).tolist() == []


def test_span_outside_the_buffer_is_refused() -> None:
    a = np.zeros(100, np.uint8)
    with pytest.raises(ValueError, match="outside the buffer"):
        body_crcs(a, np.array([90]), np.array([11]))
    with pytest.raises(ValueError, match="outside the buffer"):
        body_crcs(a, np.array([-1]), np.array([5]))
