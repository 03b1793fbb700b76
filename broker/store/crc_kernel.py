"""Body CRCs inside compiled loops: ISA-L's SIMD CRC-32 called from numba, one call per record.

Why: the decoder checked each body with ``crc32(mem[p:e])`` in a Python list comprehension, and
slicing a memoryview plus a Python call per record cost about twice the CRC itself (~60 of ~100 ms
per 128 MiB split of 1 KiB messages); the dispatcher's compiled scan used a table-driven
byte-at-a-time CRC, several times slower than ISA-L's. Both now call ``crc32_gzip_refl`` from the
ISA-L that python-isal (a declared dependency, :mod:`broker.store.crc`) links into its extension:
the symbol is registered with LLVM by name before any kernel that uses it is compiled or loaded
from numba's cache, so cached machine code finds it in every process.

Kept apart from :mod:`broker.store.crc` so that importing that (the broker's network processes do)
never loads numba.
"""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import numpy as np
from numba import njit, types

import isal.isal_zlib

from broker.store.crc import CRC_MASK

_SYMBOL = "crc32_gzip_refl"  # uint32_t crc32_gzip_refl(uint32_t init, const unsigned char *buf, uint64_t len)


def _register_isal_crc() -> None:
    try:
        fn = getattr(ctypes.CDLL(isal.isal_zlib.__file__), _SYMBOL)
    except (OSError, AttributeError) as exc:  # pragma: no cover - isal is pinned in pyproject.toml
        raise ImportError(f"python-isal's extension does not export {_SYMBOL} ({exc}); "
                          "reinstall the pinned isal version") from exc
    llvm.add_symbol(_SYMBOL, ctypes.cast(fn, ctypes.c_void_p).value)


_register_isal_crc()
_isal_crc = types.ExternalFunction(_SYMBOL, types.uint32(types.uint32, types.voidptr, types.uint64))


@njit(cache=True, inline="always")
def crc_at(buf, at, n):  # pragma: no cover (compiled)
    """RocketMQ's BODYCRC of ``buf[at:at + n]`` (CRC-32 & CRC_MASK; 0 when ``n`` is 0)."""
    if n <= 0:
        return np.int64(0)
    return np.int64(_isal_crc(np.uint32(0), buf.ctypes.data + at, np.uint64(n))) & CRC_MASK


_SIGNATURES = [types.void(types.Array(types.uint8, 1, "C", readonly=readonly), types.Array(types.int64, 1, "C"),
                          types.Array(types.int64, 1, "C"), types.Array(types.int64, 1, "C"))
               for readonly in (True, False)]


@njit(_SIGNATURES, cache=True, nogil=True)
def _body_crcs(a, starts, lengths, out):  # pragma: no cover (compiled)
    for i in range(starts.size):
        out[i] = crc_at(a, starts[i], lengths[i])


def body_crcs(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """BODYCRC of ``a[starts[i]:starts[i] + lengths[i]]`` for every ``i`` (int64; bounds are the
    caller's: every span must lie inside ``a``)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if starts.size and (int(starts.min()) < 0 or int((starts + np.maximum(lengths, 0)).max()) > a.size):
        raise ValueError("body span outside the buffer")
    out = np.empty(starts.size, np.int64)
    _body_crcs(a, starts, lengths, out)
    return out
