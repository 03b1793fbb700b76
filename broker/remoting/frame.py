"""Incremental frame splitting for a TCP byte stream (remoting-protocol.md section 1).

TCP delivers arbitrary slices: half a length prefix, three frames at once, a body split in two.
``FrameDecoder`` buffers and hands out whole payloads (the ``N`` bytes after each 4-byte length),
so the command decoder never sees a partial frame. A length that cannot be right (below the 4-byte
header-length word, negative, or above the limit) means the stream is out of sync or hostile; there
is no way to resynchronise, so the decoder raises :class:`FrameError` and stays failed, and the
server closes that one connection (Java's ``NettyDecoder`` does the same).
"""

from __future__ import annotations

import struct

DEFAULT_MAX_FRAME = 16 * 1024 * 1024  # Java's com.rocketmq.remoting.frameMaxLength default
MIN_FRAME = 4  # the header-length word must be there

_LENGTH = struct.Struct(">i")


class FrameError(Exception):
    """The byte stream cannot be split into frames any more; close the connection."""


class FrameDecoder:
    """Feed bytes in, get complete frame payloads out (length prefix stripped)."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame < MIN_FRAME:
            raise ValueError(f"max_frame must be >= {MIN_FRAME}, got {max_frame}")
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._failed: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held back waiting for the rest of a frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Append ``data``; return every frame payload now complete, in order."""
        if self._failed is not None:
            raise self._failed
        self._buffer += data
        frames: list[bytes] = []
        buffer = self._buffer
        start = 0
        while len(buffer) - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if length < MIN_FRAME or length > self.max_frame:
                self._buffer = bytearray()
                if length < 0:
                    reason = f"negative frame length {length}"
                elif length < MIN_FRAME:
                    reason = f"frame length {length} is below the {MIN_FRAME}-byte minimum"
                else:
                    reason = f"frame length {length} exceeds the {self.max_frame}-byte limit"
                self._failed = FrameError(reason)
                raise self._failed
            end = start + 4 + length
            if end > len(buffer):
                break
            frames.append(bytes(buffer[start + 4:end]))
            start = end
        if start:
            del buffer[:start]
        return frames
