"""The CommitLog message record layout, written once (store-format.md 3.3).

Every struct, numpy dtype and field position of a record is derived from :data:`FIXED_FIELDS`, so
the codec (:mod:`broker.store.message`), the vectorised decoder (:mod:`broker.store.columnar`), the
record walk (:mod:`broker.store.record_scan`), the checker (:mod:`broker.store.record_check`) and the
store-timestamp readers cannot disagree about where a field is.

A record is the fixed part below, then BODY (BODYLENGTH bytes), TOPICLENGTH (1 byte with the V1
magic, 2 with V2), TOPIC, PROPERTIESLENGTH (2 bytes) and PROPERTIES. The two hosts are 4 address
bytes + 4 port bytes, or 16 + 4 when the sysFlag's IPv6 bit for that host is set, which moves every
field after them. All integers are big-endian.
"""

from __future__ import annotations

import struct

import numpy as np

from broker.store.constants import (
    BLANK_HEADER_SIZE,
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    signed32,
)

# (Apache's name, our column name, numpy type); a host is ("…HOST", prefix, None)
FIXED_FIELDS: tuple[tuple[str, str, str | None], ...] = (
    ("TOTALSIZE", "size", ">i4"),
    ("MAGICCODE", "magic", ">i4"),
    ("BODYCRC", "crc", ">i4"),
    ("QUEUEID", "queue_id", ">i4"),
    ("FLAG", "flag", ">i4"),
    ("QUEUEOFFSET", "queue_offset", ">i8"),
    ("PHYSICALOFFSET", "phys", ">i8"),
    ("SYSFLAG", "sys_flag", ">i4"),
    ("BORNTIMESTAMP", "born_ts", ">i8"),
    ("BORNHOST", "born", None),
    ("STORETIMESTAMP", "store_ts", ">i8"),
    ("STOREHOSTADDRESS", "store", None),
    ("RECONSUMETIMES", "reconsume", ">i4"),
    ("PREPAREDTRANSACTIONOFFSET", "prepared", ">i8"),
    ("BODYLENGTH", "body_len", ">i4"),
)
IPV4_ADDRESS_SIZE = 4
IPV6_ADDRESS_SIZE = 16
HOST_PORT_SIZE = 4
IPV4_HOST_SIZE = IPV4_ADDRESS_SIZE + HOST_PORT_SIZE
IPV6_HOST_SIZE = IPV6_ADDRESS_SIZE + HOST_PORT_SIZE
PROPERTIES_LENGTH_SIZE = 2
TOPIC_LENGTH_SIZE_V1 = 1
TOPIC_LENGTH_SIZE_V2 = 2


def fixed_dtype(born_v6: bool = False, store_v6: bool = False) -> np.dtype:
    """The fixed part of a record (TOTALSIZE … BODYLENGTH) as a packed numpy structured dtype.
    Hosts become ``<prefix>_addr`` (uint8 × 4 or 16) and ``<prefix>_port``."""
    fields: list[tuple] = []
    for _, name, typ in FIXED_FIELDS:
        if typ is None:
            v6 = born_v6 if name == "born" else store_v6
            fields += [(f"{name}_addr", "u1", (IPV6_ADDRESS_SIZE if v6 else IPV4_ADDRESS_SIZE,)),
                       (f"{name}_port", ">i4")]
        else:
            fields.append((name, typ))
    return np.dtype(fields)


FIXED_V4_DTYPE = fixed_dtype()
FIXED_V4_SIZE = FIXED_V4_DTYPE.itemsize  # 88


def _head_fields() -> tuple[tuple[str, str, str], ...]:
    """The fields before the first host: their positions never move."""
    out = []
    for apache, name, typ in FIXED_FIELDS:
        if typ is None:
            break
        out.append((apache, name, typ))
    return tuple(out)


_HEAD_FIELDS = _head_fields()
POSITIONS: dict[str, int] = {apache: FIXED_V4_DTYPE.fields[name][1] for apache, name, _ in _HEAD_FIELDS}
POS_TOTAL_SIZE = POSITIONS["TOTALSIZE"]
POS_MAGIC = POSITIONS["MAGICCODE"]
POS_BODY_CRC = POSITIONS["BODYCRC"]
POS_QUEUE_ID = POSITIONS["QUEUEID"]
POS_FLAG = POSITIONS["FLAG"]
POS_QUEUE_OFFSET = POSITIONS["QUEUEOFFSET"]
POS_PHYSICAL_OFFSET = POSITIONS["PHYSICALOFFSET"]
POS_SYS_FLAG = POSITIONS["SYSFLAG"]
POS_BORN_TIMESTAMP = POSITIONS["BORNTIMESTAMP"]
POS_BORN_HOST = FIXED_V4_DTYPE.fields["born_addr"][1]  # == the head's size

# TOTALSIZE … BORNTIMESTAMP, one struct
HEAD = struct.Struct(">" + "".join("i" if typ == ">i4" else "q" for _, _, typ in _HEAD_FIELDS))
assert HEAD.size == POS_BORN_HOST
# TOTALSIZE and MAGICCODE: how every record starts, a message or the BLANK that ends a file
SIZE_MAGIC = struct.Struct(">ii")
assert SIZE_MAGIC.size == POS_BODY_CRC == BLANK_HEADER_SIZE  # a BLANK record is just this head
# MAGICCODE as the field holds it (a signed int)
MAGIC_V1 = signed32(MESSAGE_MAGIC_CODE_V1)
MAGIC_V2 = signed32(MESSAGE_MAGIC_CODE_V2)
MAGIC_BLANK = signed32(BLANK_MAGIC_CODE)
STORE_TIMESTAMP_SIZE = FIXED_V4_DTYPE.fields["store_ts"][0].itemsize
# RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET
TAIL = struct.Struct(">iq")
TAIL_SIZE = TAIL.size
TAIL_PREPARED_AT = struct.calcsize(">i")  # PREPAREDTRANSACTIONOFFSET's place in the tail
# STORETIMESTAMP → BODYLENGTH: the timestamp, the store host and the tail
AFTER_STORE_TIMESTAMP_V4 = STORE_TIMESTAMP_SIZE + IPV4_HOST_SIZE + TAIL_SIZE
AFTER_STORE_TIMESTAMP_V6 = STORE_TIMESTAMP_SIZE + IPV6_HOST_SIZE + TAIL_SIZE

# Bytes that do not depend on body, topic or properties, with two IPv4 hosts and a V1 topic length
FIXED_RECORD_SIZE_V1_IPV4 = FIXED_V4_SIZE + TOPIC_LENGTH_SIZE_V1 + PROPERTIES_LENGTH_SIZE  # 91
MIN_MESSAGE_RECORD_SIZE = FIXED_RECORD_SIZE_V1_IPV4  # smallest well-formed message record

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def store_timestamp_pos(sys_flag: int) -> int:
    """Position of STORETIMESTAMP in a record (after the born host, whose size the sysFlag says)."""
    return POS_BORN_HOST + (IPV6_HOST_SIZE if sys_flag & BORNHOST_V6_FLAG else IPV4_HOST_SIZE)


# enough leading bytes of any record to read its STORETIMESTAMP (IPv6 born host)
STORE_TIMESTAMP_PROBE = POS_BORN_HOST + IPV6_HOST_SIZE + STORE_TIMESTAMP_SIZE


def read_store_timestamp(head: bytes | memoryview, pos: int = 0) -> int:
    """STORETIMESTAMP of the record starting at ``head[pos]``; ``struct.error`` when ``head`` is
    too short for it."""
    sys_flag = _I32.unpack_from(head, pos + POS_SYS_FLAG)[0]
    return _I64.unpack_from(head, pos + store_timestamp_pos(sys_flag))[0]
