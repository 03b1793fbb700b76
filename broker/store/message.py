"""One commitlog record: encode and decode, byte-exact (store-format.md 3.2, 3.3, 3.6).

This is the object-level codec: one Python object per record, used by the writer, the broker and
tests. Bulk reads go through :mod:`broker.store.columnar`, which decodes the same layout vectorised.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

from broker.store import compression
from broker.store.constants import (
    BLANK_HEADER_SIZE,
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    CRC32_RESERVED_LENGTH,
    MAX_PROPERTIES_LENGTH,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    MIN_MESSAGE_RECORD_SIZE,
    NAME_VALUE_SEPARATOR,
    POS_BORN_HOST,
    PROPERTY_CRC32,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_TYPE_MASK,
    TRANSACTION_TYPE_NAMES,
    signed32,
)
from broker.store.crc import body_crc, crc32
from broker.store.hosts import Host
from broker.store.message_id import encode_offset_msg_id
from broker.store.properties import decode_properties, split_keys
from broker.store import topics

# TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BORNTIMESTAMP
_HEAD = struct.Struct(">iiiiiqqiq")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_TAIL = struct.Struct(">iq")  # RECONSUMETIMES, PREPARED TRANSACTION OFFSET
_BLANK = struct.Struct(">ii")

_MAGIC_V1 = signed32(MESSAGE_MAGIC_CODE_V1)
_MAGIC_V2 = signed32(MESSAGE_MAGIC_CODE_V2)
_MAGIC_BLANK = signed32(BLANK_MAGIC_CODE)


class RecordError(ValueError):
    """A record could not be decoded. ``offset`` is the physical offset of the record start."""

    def __init__(self, kind: str, offset: int, detail: str) -> None:
        super().__init__(f"offset {offset}: {kind}: {detail}")
        self.kind = kind
        self.offset = offset
        self.detail = detail


@dataclass(frozen=True, slots=True)
class BlankRecord:
    """End-of-file filler: ``total_size`` is the number of bytes to the end of the file."""

    physical_offset: int
    total_size: int

    def encode(self) -> bytes:
        """Only the 8-byte header is written; the filler keeps the file's zeros."""
        return _BLANK.pack(self.total_size, _MAGIC_BLANK)


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """A stored message, every header field as on disk.

    ``body`` holds the stored bytes (compressed when the sysFlag says so). ``properties_raw`` keeps
    the exact stored properties text so re-encoding reproduces Apache's bytes, whatever HashMap order
    or trailing separator it used.
    """

    topic: str
    body: bytes = b""
    properties_raw: str = ""
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = field(default_factory=lambda: Host(bytes(4), 0))
    store_timestamp: int = 0
    store_host: Host = field(default_factory=lambda: Host(bytes(4), 0))
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int | None = None  # None: computed from ``body`` on encode
    magic_code: int | None = None  # None: V1 unless the topic needs V2

    # ---- derived values ------------------------------------------------------------------------
    @property
    def topic_bytes(self) -> bytes:
        return self.topic.encode("utf-8")

    @property
    def properties_bytes(self) -> bytes:
        return self.properties_raw.encode("utf-8")

    @property
    def effective_magic(self) -> int:
        if self.magic_code is not None:
            return self.magic_code
        return MESSAGE_MAGIC_CODE_V2 if len(self.topic_bytes) > 127 else MESSAGE_MAGIC_CODE_V1

    @property
    def effective_body_crc(self) -> int:
        return body_crc(self.body) if self.body_crc is None else self.body_crc

    @property
    def total_size(self) -> int:
        return record_size(len(self.body), len(self.topic_bytes), len(self.properties_bytes),
                           self.born_host.is_ipv6, self.store_host.is_ipv6,
                           self.effective_magic == MESSAGE_MAGIC_CODE_V2)

    @property
    def properties(self) -> dict[str, str]:
        return decode_properties(self.properties_raw)

    @property
    def transaction_type(self) -> str:
        return TRANSACTION_TYPE_NAMES[(self.sys_flag & TRANSACTION_TYPE_MASK) >> 2]

    @property
    def compression(self) -> str:
        return compression.compression_of(self.sys_flag)

    @property
    def payload(self) -> bytes:
        """The body as the producer sent it (decompressed)."""
        return compression.decompress(self.body, self.compression)

    @property
    def body_crc_ok(self) -> bool:
        return self.effective_body_crc == body_crc(self.body)

    @property
    def keys(self) -> list[str]:
        return split_keys(self.properties.get(PROPERTY_KEYS))

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def offset_msg_id(self) -> str:
        return encode_offset_msg_id(self.store_host, self.physical_offset)

    @property
    def real_topic(self) -> str:
        return topics.real_topic(self.topic, self.properties)

    # ---- codec --------------------------------------------------------------------------------------
    def encode(self) -> bytes:
        """The record's bytes exactly as Apache's store writes them."""
        topic = self.topic_bytes
        props = self.properties_bytes
        magic = self.effective_magic
        v2 = magic == MESSAGE_MAGIC_CODE_V2
        if len(topic) > (32767 if v2 else 127):
            raise ValueError(f"topic of {len(topic)} bytes does not fit a {'V2' if v2 else 'V1'} record")
        if len(props) > MAX_PROPERTIES_LENGTH:
            raise ValueError(f"properties of {len(props)} bytes exceed {MAX_PROPERTIES_LENGTH}")
        sys_flag = self.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
        if self.born_host.is_ipv6:
            sys_flag |= BORNHOST_V6_FLAG
        if self.store_host.is_ipv6:
            sys_flag |= STOREHOSTADDRESS_V6_FLAG
        parts = [
            _HEAD.pack(self.total_size, signed32(magic), self.effective_body_crc, self.queue_id,
                       self.flag, self.queue_offset, self.physical_offset, sys_flag, self.born_timestamp),
            self.born_host.encode(),
            struct.pack(">q", self.store_timestamp),
            self.store_host.encode(),
            _TAIL.pack(self.reconsume_times, self.prepared_transaction_offset),
            _I32.pack(len(self.body)),
            self.body,
            _I16.pack(len(topic)) if v2 else struct.pack(">b", len(topic)),
            topic,
            _I16.pack(len(props)),
            props,
        ]
        return b"".join(parts)

    def with_position(self, physical_offset: int, queue_offset: int, store_timestamp: int) -> "MessageRecord":
        """A copy placed in the log (the fields the store fills in under its append lock)."""
        return replace(self, physical_offset=physical_offset, queue_offset=queue_offset,
                       store_timestamp=store_timestamp)

    def with_property_crc(self) -> "MessageRecord":
        """5.2+ ``enabledAppendPropCRC``: reserve and fill the ``__CRC32#`` property (store-format 3.6)."""
        props = decode_properties(self.properties_raw)
        raw = self.properties_raw
        if PROPERTY_CRC32 in props:
            props.pop(PROPERTY_CRC32)
            raw = PROPERTY_SEPARATOR.join(f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items())
        if raw and not raw.endswith(PROPERTY_SEPARATOR):
            raw += PROPERTY_SEPARATOR
        placeholder = raw + PROPERTY_CRC32 + NAME_VALUE_SEPARATOR + "0" * 10 + PROPERTY_SEPARATOR
        draft = replace(self, properties_raw=placeholder).encode()
        value = crc32(draft[: len(draft) - CRC32_RESERVED_LENGTH]) & 0x7FFFFFFF
        digits = str(value)[::-1].ljust(10, "0")
        return replace(self, properties_raw=raw + PROPERTY_CRC32 + NAME_VALUE_SEPARATOR + digits + PROPERTY_SEPARATOR)


def property_crc_value(digits: str) -> int:
    """Value of a 5.2+ ``__CRC32#`` property (digits stored least-significant first)."""
    return int(digits[::-1])


def record_size(body_len: int, topic_len: int, props_len: int, born_v6: bool = False,
                store_v6: bool = False, v2: bool = False) -> int:
    """TOTALSIZE = 91 + L + T + P (+12 per IPv6 host, +1 for a V2 topic length)."""
    return 91 + body_len + topic_len + props_len + 12 * born_v6 + 12 * store_v6 + int(v2)


def decode_record(buf: bytes | memoryview, pos: int, physical_offset: int | None = None,
                  limit: int | None = None) -> MessageRecord | BlankRecord:
    """Decode the record starting at ``buf[pos]``.

    ``physical_offset`` is the global offset of ``buf[pos]`` (defaults to ``pos``) and is only used
    to check PHYSICALOFFSET and to report errors. ``limit`` bounds the record (end of file). Raises
    :class:`RecordError` naming what is wrong; never a bare ``struct.error``.
    """
    phys = pos if physical_offset is None else physical_offset
    end = len(buf) if limit is None else min(limit, len(buf))
    if end - pos < BLANK_HEADER_SIZE:
        raise RecordError("truncated_record", phys, f"only {end - pos} bytes left, a record header needs 8")
    total_size, magic = _BLANK.unpack_from(buf, pos)
    if magic == _MAGIC_BLANK:
        if total_size < BLANK_HEADER_SIZE:
            raise RecordError("bad_size", phys, f"BLANK record size {total_size} < 8")
        return BlankRecord(phys, total_size)
    if magic not in (_MAGIC_V1, _MAGIC_V2):
        raise RecordError("bad_magic", phys, f"magic 0x{magic & 0xFFFFFFFF:08X} is not a RocketMQ record")
    if total_size < MIN_MESSAGE_RECORD_SIZE:
        raise RecordError("bad_size", phys, f"TOTALSIZE {total_size} < minimum {MIN_MESSAGE_RECORD_SIZE}")
    if pos + total_size > end:
        raise RecordError("truncated_record", phys,
                          f"TOTALSIZE {total_size} runs past the end of data ({end - pos} bytes left)")
    (_, _, crc, queue_id, flag, queue_offset, phys_field, sys_flag, born_ts) = _HEAD.unpack_from(buf, pos)
    if phys_field != phys:
        raise RecordError("offset_mismatch", phys, f"PHYSICALOFFSET field is {phys_field}, record is at {phys}")
    rec_end = pos + total_size
    try:
        p = pos + POS_BORN_HOST
        born_v6 = bool(sys_flag & BORNHOST_V6_FLAG)
        store_v6 = bool(sys_flag & STOREHOSTADDRESS_V6_FLAG)
        born_host = Host.decode(buf, p, born_v6)
        p += born_host.size
        (store_ts,) = struct.unpack_from(">q", buf, p)
        p += 8
        store_host = Host.decode(buf, p, store_v6)
        p += store_host.size
        reconsume, prepared = _TAIL.unpack_from(buf, p)
        p += _TAIL.size
        (body_len,) = _I32.unpack_from(buf, p)
        p += 4
        if body_len < 0 or p + body_len > rec_end:
            raise RecordError("length_mismatch", phys, f"BODYLENGTH {body_len} does not fit TOTALSIZE {total_size}")
        body = bytes(buf[p : p + body_len])
        p += body_len
        v2 = magic == _MAGIC_V2
        if v2:
            (topic_len,) = _I16.unpack_from(buf, p)
            p += 2
        else:
            topic_len = struct.unpack_from(">b", buf, p)[0]
            p += 1
        if topic_len < 0 or p + topic_len > rec_end:
            raise RecordError("length_mismatch", phys, f"TOPICLENGTH {topic_len} does not fit TOTALSIZE {total_size}")
        topic = bytes(buf[p : p + topic_len]).decode("utf-8", "replace")
        p += topic_len
        (props_len,) = _I16.unpack_from(buf, p)
        p += 2
        if props_len < 0 or p + props_len != rec_end:
            raise RecordError("length_mismatch", phys,
                              f"field lengths add up to {p + max(props_len, 0) - pos}, TOTALSIZE says {total_size}")
        props = bytes(buf[p : p + props_len]).decode("utf-8", "replace")
    except struct.error as exc:  # only reachable when TOTALSIZE lies about a tiny record
        raise RecordError("length_mismatch", phys, f"record fields run past TOTALSIZE {total_size}: {exc}") from None
    return MessageRecord(
        topic=topic, body=body, properties_raw=props, queue_id=queue_id, flag=flag,
        queue_offset=queue_offset, physical_offset=phys_field, sys_flag=sys_flag, born_timestamp=born_ts,
        born_host=born_host, store_timestamp=store_ts, store_host=store_host, reconsume_times=reconsume,
        prepared_transaction_offset=prepared, body_crc=crc, magic_code=magic & 0xFFFFFFFF,
    )
