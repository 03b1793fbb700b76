"""The batch wire body (``MessageDecoder.encodeMessages``) and 5.x inner-batch records.

A producer's ``SEND_BATCH_MESSAGE`` body is a concatenation, per message, of TOTALSIZE(4) ·
MAGIC(4, 0 from the client) · BODYCRC(4) · FLAG(4) · BODYLEN(4) · BODY · PROPLEN(2) · PROPERTIES.
A 5.x inner-batch record (sysFlag ``INNER_BATCH_FLAG``) stores that same body as one commitlog
record; consumers split it and give message ``i`` the queue offset ``INNER_BASE + i``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.store.crc import body_crc

_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN
_PROPS_LEN = struct.Struct(">h")
MIN_ITEM_SIZE = _HEAD.size + _PROPS_LEN.size


class BatchFormatError(ValueError):
    """A batch body is malformed; ``offset`` is the byte position inside the body."""

    def __init__(self, offset: int, detail: str) -> None:
        super().__init__(f"batch body offset {offset}: {detail}")
        self.offset = offset


@dataclass(frozen=True, slots=True)
class BatchItem:
    body: bytes
    properties_raw: str = ""
    flag: int = 0
    magic: int = 0
    body_crc: int | None = None

    def encode(self) -> bytes:
        props = self.properties_raw.encode("utf-8")
        total = MIN_ITEM_SIZE + len(self.body) + len(props)
        crc = body_crc(self.body) if self.body_crc is None else self.body_crc
        return _HEAD.pack(total, self.magic, crc, self.flag, len(self.body)) + self.body + \
            _PROPS_LEN.pack(len(props)) + props


def encode_batch(items: list[BatchItem]) -> bytes:
    return b"".join(item.encode() for item in items)


def decode_batch(body: bytes | memoryview) -> list[BatchItem]:
    """Split a batch body; raises :class:`BatchFormatError` naming the offset of what is wrong."""
    out: list[BatchItem] = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < MIN_ITEM_SIZE:
            raise BatchFormatError(pos, f"{end - pos} trailing bytes, an item needs at least {MIN_ITEM_SIZE}")
        total, magic, crc, flag, body_len = _HEAD.unpack_from(body, pos)
        if total < MIN_ITEM_SIZE or pos + total > end:
            raise BatchFormatError(pos, f"item TOTALSIZE {total} does not fit the {end - pos} bytes left")
        if body_len < 0 or _HEAD.size + body_len + _PROPS_LEN.size > total:
            raise BatchFormatError(pos, f"BODYLEN {body_len} does not fit item TOTALSIZE {total}")
        p = pos + _HEAD.size
        item_body = bytes(body[p:p + body_len])
        (props_len,) = _PROPS_LEN.unpack_from(body, p + body_len)
        props_start = p + body_len + _PROPS_LEN.size
        if props_len < 0 or props_start + props_len != pos + total:
            raise BatchFormatError(pos, f"PROPLEN {props_len} does not match item TOTALSIZE {total}")
        props = bytes(body[props_start:props_start + props_len]).decode("utf-8", "replace")
        out.append(BatchItem(item_body, props, flag, magic, crc))
        pos += total
    return out
