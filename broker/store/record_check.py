"""The record checker: is there a well-formed record at this position, and where are its parts?

One function (as Apache's ``CommitLog.checkMessageAndReturnSize``) decides it for everything that
reads records one at a time: the codec's :func:`broker.store.message.decode_record` (and through it
the dispatcher, the broker's reads and the clients) and the broker's recovery. The vectorised
decoder (:mod:`broker.store.columnar`) and the record walk (:mod:`broker.store.record_scan`) apply
the same rules to whole columns at once, with positions from the same layout module. The checker
allocates nothing but its result, so recovery can run it over gigabytes.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from broker.store import findings as fk
from broker.store.constants import BLANK_HEADER_SIZE, BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG
from broker.store.crc import body_crc
from broker.store.record_layout import (
    AFTER_STORE_TIMESTAMP_V4,
    AFTER_STORE_TIMESTAMP_V6,
    IPV4_HOST_SIZE,
    IPV6_HOST_SIZE,
    MAGIC_BLANK,
    MAGIC_V1,
    MAGIC_V2,
    MIN_MESSAGE_RECORD_SIZE,
    POS_BODY_CRC,
    POS_BORN_HOST,
    POS_PHYSICAL_OFFSET,
    POS_SYS_FLAG,
    PROPERTIES_LENGTH_SIZE,
    SIZE_MAGIC,
    TOPIC_LENGTH_SIZE_V1,
    TOPIC_LENGTH_SIZE_V2,
)

MESSAGE = "msg"
BLANK = "blank"  # end-of-file filler: the rest of the file is empty
END = "end"  # zeros where a record would start: the end of written data

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class RecordError(ValueError):
    """A record could not be decoded. ``kind`` is a finding kind (:mod:`broker.store.findings`);
    ``offset`` the physical offset of the record start."""

    def __init__(self, kind: str, offset: int, detail: str) -> None:
        super().__init__(f"offset {offset}: {kind}: {detail}")
        self.kind = kind
        self.offset = offset
        self.detail = detail


class CheckedRecord(NamedTuple):
    """What the checker found. For a MESSAGE, where its variable parts are (positions in the
    buffer given); for BLANK only ``size`` (its TOTALSIZE); END is all zeros. (A named tuple: the
    checker runs once per record on the dispatch and recovery paths.)"""

    kind: str
    size: int = 0
    sys_flag: int = 0
    store_timestamp: int = 0
    v2: bool = False
    body_at: int = 0
    body_len: int = 0
    topic_at: int = 0
    topic_len: int = 0
    props_at: int = 0
    props_len: int = 0


_END = CheckedRecord(END)


def check_record(buf, pos: int, physical_offset: int | None = None, limit: int | None = None, *,
                 check_crc: bool = False) -> CheckedRecord:
    """Check the record starting at ``buf[pos]``; raise :class:`RecordError` naming what is wrong.

    ``physical_offset`` is the global offset of ``buf[pos]`` (default ``pos``): PHYSICALOFFSET must
    equal it. ``limit`` is where data ends (default ``len(buf)``): a record must not run past it.
    Every length field must fit TOTALSIZE and they must add up to it exactly. With ``check_crc``
    BODYCRC must match the body. A BLANK is only checked for a sane size (whether it fills its
    file is the caller's rule); 8 zero bytes are END."""
    phys = pos if physical_offset is None else physical_offset
    end = len(buf) if limit is None else min(limit, len(buf))
    if end - pos < BLANK_HEADER_SIZE:
        raise RecordError(fk.TRUNCATED_RECORD, phys, f"only {end - pos} bytes left, a record header needs 8")
    total, magic = SIZE_MAGIC.unpack_from(buf, pos)
    if magic == MAGIC_BLANK:
        if total < BLANK_HEADER_SIZE:
            raise RecordError(fk.BAD_SIZE, phys, f"BLANK record size {total} < 8")
        return CheckedRecord(BLANK, total)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        if total == 0 and magic == 0:
            return _END
        raise RecordError(fk.BAD_MAGIC, phys, f"magic 0x{magic & 0xFFFFFFFF:08X} is not a RocketMQ record")
    if total < MIN_MESSAGE_RECORD_SIZE:
        raise RecordError(fk.BAD_SIZE, phys, f"TOTALSIZE {total} < minimum {MIN_MESSAGE_RECORD_SIZE}")
    if pos + total > end:
        raise RecordError(fk.TRUNCATED_RECORD, phys,
                          f"TOTALSIZE {total} runs past the end of data ({end - pos} bytes left)")
    phys_field = _I64.unpack_from(buf, pos + POS_PHYSICAL_OFFSET)[0]
    if phys_field != phys:
        raise RecordError(fk.OFFSET_MISMATCH, phys, f"PHYSICALOFFSET field is {phys_field}, record is at {phys}")
    rec_end = pos + total
    sys_flag = _I32.unpack_from(buf, pos + POS_SYS_FLAG)[0]
    v2 = magic == MAGIC_V2
    try:
        p = pos + POS_BORN_HOST + (IPV6_HOST_SIZE if sys_flag & BORNHOST_V6_FLAG else IPV4_HOST_SIZE)
        store_ts = _I64.unpack_from(buf, p)[0]
        p += AFTER_STORE_TIMESTAMP_V6 if sys_flag & STOREHOSTADDRESS_V6_FLAG else AFTER_STORE_TIMESTAMP_V4
        body_len = _I32.unpack_from(buf, p)[0]
        body_at = p + 4
        if body_len < 0 or body_at + body_len > rec_end:
            raise RecordError(fk.LENGTH_MISMATCH, phys, f"BODYLENGTH {body_len} does not fit TOTALSIZE {total}")
        p = body_at + body_len
        if v2:
            topic_len = _I16.unpack_from(buf, p)[0]
            topic_at = p + TOPIC_LENGTH_SIZE_V2
        else:
            topic_len = _I8.unpack_from(buf, p)[0]
            topic_at = p + TOPIC_LENGTH_SIZE_V1
        if topic_len < 0 or topic_at + topic_len > rec_end:
            raise RecordError(fk.LENGTH_MISMATCH, phys, f"TOPICLENGTH {topic_len} does not fit TOTALSIZE {total}")
        p = topic_at + topic_len
        props_len = _I16.unpack_from(buf, p)[0]
        props_at = p + PROPERTIES_LENGTH_SIZE
        if props_len < 0 or props_at + props_len != rec_end:
            raise RecordError(fk.LENGTH_MISMATCH, phys, f"field lengths add up to "
                              f"{props_at + max(props_len, 0) - pos}, TOTALSIZE says {total}")
    except struct.error as exc:  # only reachable when TOTALSIZE lies about a tiny record
        raise RecordError(fk.LENGTH_MISMATCH, phys, f"record fields run past TOTALSIZE {total}: {exc}") from None
    if check_crc:
        crc = _I32.unpack_from(buf, pos + POS_BODY_CRC)[0]
        with memoryview(buf) as view:
            computed = body_crc(view[body_at:body_at + body_len])
        if computed != crc:
            raise RecordError(fk.CRC_MISMATCH, phys, f"BODYCRC {crc} != computed {computed}")
    return CheckedRecord(MESSAGE, total, sys_flag, store_ts, v2, body_at, body_len, topic_at, topic_len,
                         props_at, props_len)
