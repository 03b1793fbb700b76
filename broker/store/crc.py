"""CRC-32 (IEEE, as zlib) of stored bodies, sign bit cleared like RocketMQ's ``UtilAll.crc32``.

python-isal's SIMD CRC is several times faster than zlib's on large bodies, and the body CRC is on
the decode hot path, so it is used when present.
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is a declared dependency
    from zlib import crc32 as _crc32

# RocketMQ keeps CRCs as non-negative Java ints (UtilAll.crc32): the sign bit is cleared
CRC_MASK = 0x7FFFFFFF


def body_crc(data: bytes | memoryview) -> int:
    """RocketMQ's BODYCRC: ``crc32(data) & 0x7FFFFFFF``; 0 for an empty body."""
    if not len(data):
        return 0
    return _crc32(data) & CRC_MASK


crc32 = _crc32
