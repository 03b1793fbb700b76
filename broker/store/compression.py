"""Body compression codecs selected by sysFlag bits (ZLIB, LZ4 frame, ZSTD frame)."""

from __future__ import annotations

import threading
import zlib

import lz4.frame
import zstandard
from isal import isal_zlib

from broker.store.constants import (
    COMPRESSED_FLAG,
    COMPRESSION_LZ4,
    COMPRESSION_NAMES,
    COMPRESSION_TYPE_MASK,
    COMPRESSION_ZLIB,
    COMPRESSION_ZSTD,
)

_TYPE_BITS_TO_NAME = {0: "ZLIB", COMPRESSION_ZLIB: "ZLIB", COMPRESSION_LZ4: "LZ4", COMPRESSION_ZSTD: "ZSTD"}


_LOCAL = threading.local()


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    """One decompressor per thread: building one per body cost more than decompressing it."""
    dctx = getattr(_LOCAL, "zstd", None)
    if dctx is None:
        dctx = _LOCAL.zstd = zstandard.ZstdDecompressor()
    return dctx


class DecompressionError(ValueError):
    """A body flagged as compressed could not be decompressed."""


def compression_of(sys_flag: int) -> str:
    """``NONE`` unless the COMPRESSED bit is set; type bits 0 with the bit set mean legacy ZLIB."""
    if not sys_flag & COMPRESSED_FLAG:
        return "NONE"
    return _TYPE_BITS_TO_NAME.get(sys_flag & COMPRESSION_TYPE_MASK, "ZLIB")


def compression_code(sys_flag: int) -> int:
    """Index into :data:`COMPRESSION_NAMES`."""
    return COMPRESSION_NAMES.index(compression_of(sys_flag))


def decompress(data: bytes, compression: str) -> bytes:
    try:
        if compression == "NONE":
            return bytes(data)
        if compression == "ZLIB":
            return isal_zlib.decompress(data)  # same format as zlib, about twice as fast
        if compression == "LZ4":
            return lz4.frame.decompress(data)
        if compression == "ZSTD":
            return _zstd_decompressor().decompressobj().decompress(data)
    except Exception as exc:  # the codecs raise their own error types
        raise DecompressionError(f"{compression} body does not decompress: {exc}") from exc
    raise ValueError(f"unknown compression {compression!r}")


def compress(data: bytes, compression: str, level: int = 5) -> bytes:
    """Compress like the Java producer (level 5 by default)."""
    if compression == "ZLIB":
        return zlib.compress(data, level)
    if compression == "LZ4":
        return lz4.frame.compress(data)
    if compression == "ZSTD":
        return zstandard.ZstdCompressor(level=level).compress(data)
    if compression == "NONE":
        return bytes(data)
    raise ValueError(f"unknown compression {compression!r}")
