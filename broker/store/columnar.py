"""CommitLog segment or byte range → ``pyarrow.RecordBatch``es, vectorised.

The hot path of every bulk reader (the inspector, ``verify``, the Spark data source). Per record
only the start is found in Python (:mod:`broker.store.record_scan`); every field is then gathered for
all records of a chunk at once with numpy fancy indexing over an overlapping, unaligned view of the
mmap (one C-level copy per row and field, or per record header), and variable-length fields (topic,
properties, body) become Arrow *view* arrays that point into the mapped bytes and are compacted by
Arrow's C++ cast. Properties are split on their separators by a compiled pass over the record bytes
(:mod:`broker.store.property_spans`; Arrow's string kernels where a chunk is not valid UTF-8); host strings
are formatted once per distinct host. No per-field Python objects are built except for the rare rows
that need them (compressed bodies, duplicate property names).
"""

from __future__ import annotations

import logging
from socket import AF_INET6, inet_ntop
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker.store import findings as fk
from broker.store.compression import DecompressionError, decompress
from broker.store.constants import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_NAMES,
    COMPRESSION_TYPE_MASK,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_TYPE_MASK,
    TRANSACTION_TYPE_NAMES,
)
from broker.store.crc_kernel import body_crcs
from broker.store.findings import Finding
from broker.store.property_spans import property_entries
from broker.store.record_layout import (
    FIXED_V4_DTYPE,
    FIXED_V4_SIZE,
    IPV4_ADDRESS_SIZE,
    IPV4_HOST_SIZE,
    IPV6_ADDRESS_SIZE,
    IPV6_HOST_SIZE,
    MAGIC_V2,
    POS_BORN_HOST,
    SIZE_MAGIC,
    TAIL_PREPARED_AT,
    TAIL_SIZE,
)
from broker.store.record_scan import find_record_start, last_nonzero, scan_records
from broker.store.topics import WRAPPER_TOPICS
from schemas.messages import RECORD_SCHEMA, body_as_view

_RECORD_SCHEMA_BODY_VIEW = body_as_view(RECORD_SCHEMA)

log = logging.getLogger(__name__)

DEFAULT_BATCH_ROWS = 32_768
DEFAULT_BATCH_BYTES = 64 * 1024 * 1024  # keeps int32 Arrow offsets and temporaries small

# The first 88 bytes of a record whose two hosts are IPv4: header, hosts, store time, reconsume
# times, prepared offset and body length (the layout module's fixed part).
_FIXED_V4_DTYPE = FIXED_V4_DTYPE
_FIXED_V4_SIZE = FIXED_V4_SIZE
_NATIVE = {name: (np.uint8 if _FIXED_V4_DTYPE[name].subdtype else _FIXED_V4_DTYPE[name].newbyteorder("="))
           for name in _FIXED_V4_DTYPE.names}
_V4_MASK = np.array([1, 1, 1, 1] + [0] * 12, dtype=np.uint8)[None, :]
_WRAPPER_TOPICS = pa.array(sorted(WRAPPER_TOPICS), pa.string())
# per inline value length 0..12: masks keeping the value's bytes of its first 8 and next 4 bytes
_MASK_FIRST8 = np.array([(1 << 8 * min(k, 8)) - 1 for k in range(13)], dtype=np.uint64)
_MASK_LAST4 = np.array([(1 << 8 * max(k - 8, 0)) - 1 for k in range(13)], dtype=np.uint64)
_U32 = np.uint64(32)
# byte → its two uppercase hex digits, as one little-endian uint16 (first digit in the low byte)
_HEX_PAIRS = np.array([ord(f"{i:02X}"[0]) | ord(f"{i:02X}"[1]) << 8 for i in range(256)], dtype="<u2")
_HOST_KEY_BYTES = 24  # address (16) ‖ port (4, little-endian) ‖ IPv6 flag (1) ‖ padding
_TXN_NAMES = pa.array(TRANSACTION_TYPE_NAMES, pa.string())
_COMPRESSION_NAMES = pa.array(COMPRESSION_NAMES, pa.string())
# compression type bits (sysFlag >> 8 & 7) → index into COMPRESSION_NAMES; 0 with the flag = ZLIB
_COMPRESSION_BY_TYPE_BITS = np.array([1, 2, 3, 1, 1, 1, 1, 1], dtype=np.int8)


@dataclass(slots=True)
class DecodeFilter:
    """Row filters applied inside the decoder, before the expensive columns are built."""

    topics: frozenset[str] | None = None  # stored or real topic must be in the set
    min_store_timestamp: int | None = None  # inclusive, epoch ms
    max_store_timestamp: int | None = None  # inclusive, epoch ms
    min_offset: int | None = None  # inclusive commitlog offset
    max_offset: int | None = None  # exclusive commitlog offset


@dataclass(slots=True)
class DecodeStats:
    """What a decode saw: findings with file and offset, and where it stopped."""

    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    rows: int = 0
    bytes_decoded: int = 0  # bytes walked over by decoded records (incl. any skipped region after one)
    stop: int = 0  # segment position where the walk ended
    first_at: int | None = None  # segment position of the first record walked (None: none found)
    end_of_data: bool = False
    blank_at: int | None = None  # position of the segment's BLANK record, if the walk reached it


def _strided(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Every byte position of ``a`` as the start of one ``dtype`` value: an overlapping, unaligned
    view (stride 1), so one fancy index gathers a whole field (or a whole record header) per row in
    one C loop, instead of a byte-wise gather over a sliding-window view."""
    count = a.size - dtype.itemsize + 1
    return np.ndarray((max(count, 0),), dtype, buffer=a, strides=(1,))


def _take(a: np.ndarray, pos: np.ndarray, dtype: np.dtype | str) -> np.ndarray:
    """The ``dtype`` value starting at each position in ``pos``. Bytes past the end of ``a`` read as
    zero (a record cut off by the end of the buffer, or a garbage length pointing past it)."""
    dtype = np.dtype(dtype)
    if dtype.names:  # records: gather raw bytes (a fast memcpy per row), then reinterpret
        return _take(a, pos, np.dtype((np.void, dtype.itemsize))).view(dtype)
    width = dtype.itemsize
    if a.size < width:
        a = np.concatenate([a, np.zeros(width - a.size, np.uint8)])
    last = a.size - width  # the last position whose value lies wholly inside ``a``
    if pos.size == 0 or int(pos.max()) <= last:
        return _strided(a, dtype)[pos]
    out = np.empty(pos.size, dtype)
    inside = pos <= last
    out[inside] = _strided(a, dtype)[pos[inside]]
    tail = np.flatnonzero(~inside)
    padded = np.concatenate([a[last:], np.zeros(width, np.uint8)])  # 2 * width bytes
    out[tail] = _strided(padded, dtype)[np.minimum(pos[tail] - last, width)]
    return out


def _gather(a: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """(n, width) bytes starting at each position (bytes past the end of ``a`` read as zero)."""
    return _take(a, pos, np.dtype((np.void, width))).view(np.uint8).reshape(pos.size, width)


def _be(a: np.ndarray, pos: np.ndarray, dtype: str) -> np.ndarray:
    return _take(a, pos, dtype).astype(dtype.replace(">", "<"))


def _views(a: np.ndarray, pos: np.ndarray, lengths: np.ndarray, buffer_index: int = 0) -> np.ndarray:
    """Arrow binary-view structs (n × 16 bytes) for ``lengths[i]`` bytes at ``pos[i]`` of ``a``.

    Layout (two little-endian uint64 words): the length and the value's first 4 bytes, then either
    the value's next 8 bytes (values ≤ 12 bytes are inline, zero padded) or the data buffer's index
    and the offset into it. Built from one 8-byte gather per row (and a 4-byte one for inline rows).
    """
    n = pos.size
    lengths = lengths.astype(np.uint64)
    head = _take(a, pos, "<u8")  # the value's first 8 bytes (for short values: and what follows)
    inline = lengths <= 12
    words = np.empty((n, 2), dtype="<u8")
    if not inline.any():  # e.g. bodies
        words[:, 0] = lengths | (head << _U32)
        words[:, 1] = np.uint64(buffer_index) | (pos.astype(np.uint64) << _U32)
        return words.view(np.uint8)
    short = np.minimum(lengths, np.uint64(12))
    first8 = head & _MASK_FIRST8[short]  # all 8 bytes of any value of 8 bytes or more
    words[:, 0] = lengths | (first8 << _U32)
    last4 = _take(a, pos + 8, "<u4").astype(np.uint64) & _MASK_LAST4[short]
    words[:, 1] = np.where(inline, (first8 >> _U32) | (last4 << _U32),
                           np.uint64(buffer_index) | (pos.astype(np.uint64) << _U32))
    return words.view(np.uint8)


def _view_array(a: np.ndarray, buf: pa.Buffer, pos: np.ndarray, lengths: np.ndarray,
                typ: pa.DataType) -> pa.Array:
    """A binary_view/string_view array over ``buf`` (no copy; Arrow's cast compacts it later)."""
    return pa.Array.from_buffers(typ, pos.size, [None, pa.py_buffer(_views(a, pos, lengths)), buf])


def _to_utf8(binary: pa.Array) -> pa.Array:
    """binary → string. Arrow validates UTF-8 here; damaged bytes are decoded with U+FFFD
    replacement like Java's ``new String(bytes, UTF_8)`` instead of failing the whole chunk."""
    try:
        return pc.cast(binary, pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in binary.to_pylist()],
                        pa.string())


def _string_slices(data: np.ndarray, buf: pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    return _to_utf8(pc.cast(_view_array(data, buf, starts, ends - starts, pa.binary_view()), pa.binary()))


def _hex_ids(addr: np.ndarray, v6: np.ndarray, port: np.ndarray, phys: np.ndarray) -> pa.Array:
    """offsetMsgId strings: hex(address ‖ port ‖ offset), 32 chars (IPv4) or 56 (IPv6).

    One table lookup turns each byte into its two hex digits (a little-endian uint16 of ASCII)."""
    n = phys.size
    port_be = port.astype(">i4").view(np.uint8).reshape(n, 4)
    phys_be = phys.astype(">i8").view(np.uint8).reshape(n, 8)
    if not v6.any():  # the usual case: fixed 32-char ids, no per-row lengths
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, 0:4] = addr[:, 0:4]
        raw[:, 4:8] = port_be
        raw[:, 8:16] = phys_be
        offsets = np.arange(0, 32 * (n + 1), 32, dtype=np.int32)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(_HEX_PAIRS[raw])])
    raw = np.zeros((n, 28), dtype=np.uint8)
    v4 = ~v6
    raw[v4, 0:4] = addr[v4, 0:4]
    raw[v4, 4:8] = port_be[v4]
    raw[v4, 8:16] = phys_be[v4]
    raw[v6, 0:16] = addr[v6]
    raw[v6, 16:20] = port_be[v6]
    raw[v6, 20:28] = phys_be[v6]
    chars = _HEX_PAIRS[raw].view(np.uint8)
    lengths = np.where(v6, 56, 32)
    keep = np.arange(56)[None, :] < lengths[:, None]
    data = chars[keep]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _host_text(key: bytes) -> str:
    """One ``_host_strings`` key (address ‖ port ‖ IPv6 flag) as 'a.b.c.d:port' or '[v6]:port'."""
    port = int.from_bytes(key[16:20], "little", signed=True)
    if key[20]:
        return f"[{inet_ntop(AF_INET6, key[:16])}]:{port}"
    return f"{key[0]}.{key[1]}.{key[2]}.{key[3]}:{port}"


def _host_strings(addr: np.ndarray, v6: np.ndarray, port: np.ndarray) -> pa.Array:
    """'a.b.c.d:port' or '[v6]:port' per row. A store has few distinct hosts: the (address, port,
    family) keys are hashed by Arrow, each distinct one is formatted once, and a take spreads them."""
    n = port.size
    key = np.zeros((n, _HOST_KEY_BYTES), dtype=np.uint8)
    key[:, 0:16] = addr
    key[:, 16:20] = port.astype("<i4").view(np.uint8).reshape(n, 4)
    key[:, 20] = v6
    keys = pa.FixedSizeBinaryArray.from_buffers(pa.binary(_HOST_KEY_BYTES), n, [None, pa.py_buffer(key)])
    enc = pc.dictionary_encode(keys)
    texts = pa.array([_host_text(k) for k in enc.dictionary.to_pylist()], pa.string())
    return texts.take(enc.indices)


def _take_or_null(values: pa.Array, index: np.ndarray) -> pa.Array:
    return values.take(pa.array(index, mask=index < 0))


class _Properties:
    """Properties of a chunk split into (message, name, value) entries with Apache's rules.

    :meth:`of_records` finds the entries on the record bytes (compiled); the constructor, the path
    for text that is not valid UTF-8, has Arrow's C++ string kernels do the splitting: on ``0x02`` into entries, then each entry on its
    first ``0x01`` into name and value; entries with an empty name or value are dropped (as
    ``string2messageProperties`` does) and a value may itself contain ``0x01``.
    """

    def __init__(self, props: pa.StringArray) -> None:
        self.n = len(props)
        entries = pc.split_pattern(props, PROPERTY_SEPARATOR)
        msgs = np.asarray(pc.list_parent_indices(entries))
        pairs = pc.split_pattern(pc.list_flatten(entries), NAME_VALUE_SEPARATOR, max_splits=1)
        tokens = pc.list_flatten(pairs)
        offsets = np.asarray(pairs.offsets)
        first = offsets[:-1] - offsets[0]
        token_len = np.asarray(pc.binary_length(tokens))
        valid = np.diff(offsets) == 2
        cand = first[valid]
        valid[valid] = (token_len[cand] > 0) & (token_len[cand + 1] > 0)
        name_idx = first[valid]
        self.msg = msgs[valid].astype(np.int64)
        self.names = tokens.take(pa.array(name_idx))
        self.values = tokens.take(pa.array(name_idx + 1))
        self._dedupe()

    @classmethod
    def of_records(cls, a: np.ndarray, buf: pa.Buffer, p_props: np.ndarray, props_len: np.ndarray) -> _Properties:
        """The properties at ``a[p_props:p_props + props_len]`` of each record, split by the compiled
        span finder (:mod:`broker.store.property_spans`), which copies only the kept names and values
        out of ``buf``. A chunk with a name or value that is not valid UTF-8 takes the text path instead,
        whose replacement characters this one would not reproduce."""
        entries = property_entries(a, p_props, props_len)
        if entries is None:
            return cls(_string_slices(a, buf, p_props, p_props + props_len))
        rec, names, values = entries
        self = cls.__new__(cls)
        self.n, self.msg, self.names, self.values = p_props.size, rec, names, values
        self._encode_names()
        return self

    def _encode_names(self) -> np.ndarray:
        """Dictionary codes of ``names`` (what :meth:`lookup` matches on)."""
        if self.msg.size == 0:
            self.codes = np.empty(0, np.int64)
            self.dictionary = pa.array([], pa.string())
        else:
            enc = pc.dictionary_encode(self.names)
            self.codes = np.asarray(enc.indices).astype(np.int64)
            self.dictionary = enc.dictionary
        return self.codes

    def _dedupe(self) -> None:
        """A later duplicate name overwrites an earlier one (Java HashMap.put)."""
        codes = self._encode_names()
        if self.msg.size == 0:
            return
        key = (self.msg << 32) | codes
        if len(self.dictionary) <= 62:
            bits = np.left_shift(np.uint64(1), codes.astype(np.uint64))
            seg = np.flatnonzero(np.r_[True, self.msg[1:] != self.msg[:-1]])
            dup_msgs = self.msg[seg][np.bitwise_or.reduceat(bits, seg) != np.add.reduceat(bits, seg)]
        else:
            order = np.argsort(key, kind="stable")
            sk = key[order]
            dup_msgs = np.unique(self.msg[order][1:][sk[1:] == sk[:-1]])
        keep = np.ones(self.msg.size, dtype=bool)
        if dup_msgs.size:
            for m in dup_msgs.tolist():
                rows = np.flatnonzero(self.msg == m)
                seen: set[int] = set()
                for r in rows[::-1].tolist():
                    if codes[r] in seen:
                        keep[r] = False
                    seen.add(int(codes[r]))
            self.msg = self.msg[keep]
            self.names = self.names.filter(pa.array(keep))
            self.values = self.values.filter(pa.array(keep))
            self.codes = codes[keep]

    def lookup(self, name: str) -> np.ndarray:
        """Per message: index of the entry named ``name`` in ``values``, or -1."""
        out = np.full(self.n, -1, dtype=np.int64)
        matches = np.flatnonzero(np.asarray(pc.equal(self.dictionary, name).fill_null(False)))
        if matches.size:
            rows = np.flatnonzero(self.codes == matches[0])
            out[self.msg[rows]] = rows
        return out

    def value_of(self, name: str) -> pa.Array:
        return _take_or_null(self.values, self.lookup(name))

    def map_array(self) -> pa.MapArray:
        counts = np.bincount(self.msg, minlength=self.n) if self.msg.size else np.zeros(self.n, np.int64)
        offsets = np.zeros(self.n + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), self.names, self.values,
                                       type=RECORD_SCHEMA.field("properties").type)


def _split_keys(keys: pa.Array) -> pa.Array:
    """KEYS → list<string>, empty tokens dropped; null KEYS → empty list."""
    lists = pc.split_pattern(keys.fill_null(""), " ")
    flat = pc.list_flatten(lists)
    parents = np.asarray(pc.list_parent_indices(lists))
    nonempty = np.asarray(pc.greater(pc.binary_length(flat), 0))
    counts = np.bincount(parents[nonempty], minlength=len(keys))
    offsets = np.zeros(len(keys) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), flat.filter(pa.array(nonempty)),
                                    type=RECORD_SCHEMA.field("keys").type)


def _bodies(mem: memoryview, a: np.ndarray, buf: pa.Buffer, pos: np.ndarray, lengths: np.ndarray,
            compression: np.ndarray, phys: np.ndarray, file_name: str, seg_base: int,
            findings: list[Finding], as_view: bool = False) -> pa.Array:
    """Payloads: stored bytes, or the decompressed bytes for compressed rows. The decompressed
    payloads go into a second data buffer that their views point at, so one cast builds the column."""
    views = _views(a, pos, lengths)
    rows = np.flatnonzero(compression > 0)
    buffers = [None, None, buf]
    if rows.size:
        plain = []
        for p, ln, code, off in zip(pos[rows].tolist(), lengths[rows].tolist(), compression[rows].tolist(),
                                    phys[rows].tolist()):
            try:
                plain.append(decompress(mem[p:p + ln], COMPRESSION_NAMES[code]))
            except DecompressionError as exc:
                findings.append(Finding(file_name, off - seg_base, fk.DECOMPRESSION_FAILED,
                                        f"{exc}; body kept as stored", physical_offset=off))
                plain.append(bytes(mem[p:p + ln]))
        sizes = np.fromiter((len(x) for x in plain), np.int64, rows.size)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        payload = b"".join(plain) or b"\0"
        views[rows] = _views(np.frombuffer(payload, np.uint8), starts, sizes, buffer_index=1)
        buffers.append(pa.py_buffer(payload))
    buffers[1] = pa.py_buffer(views)
    column = pa.Array.from_buffers(pa.binary_view(), pos.size, buffers)
    return column if as_view else pc.cast(column, pa.binary())


def _fixed_fields(a: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
    """Every field before the body, for all records at once.

    One 88-byte gather per record with a big-endian structured dtype covers the usual layout (two
    IPv4 hosts); rows with an IPv6 host (wider host fields) are re-read field by field.
    """
    rows = _take(a, starts, _FIXED_V4_DTYPE)
    f = {name: rows[name].astype(_NATIVE[name]) for name in _FIXED_V4_DTYPE.names}
    born_addr = np.zeros((starts.size, 16), np.uint8)
    store_addr = np.zeros((starts.size, 16), np.uint8)
    born_addr[:, :4] = rows["born_addr"]
    store_addr[:, :4] = rows["store_addr"]
    f["born_v6"] = (f["sys_flag"] & BORNHOST_V6_FLAG) != 0
    f["store_v6"] = (f["sys_flag"] & STOREHOSTADDRESS_V6_FLAG) != 0
    wide = np.flatnonzero(f["born_v6"] | f["store_v6"])
    if wide.size:
        s, bv6, sv6 = starts[wide], f["born_v6"][wide], f["store_v6"][wide]
        p_born = s + POS_BORN_HOST
        p_store_ts = p_born + np.where(bv6, IPV6_HOST_SIZE, IPV4_HOST_SIZE)
        p_store = p_store_ts + 8
        p_reconsume = p_store + np.where(sv6, IPV6_HOST_SIZE, IPV4_HOST_SIZE)
        born_addr[wide] = _gather(a, p_born, 16) * np.where(bv6[:, None], 1, _V4_MASK).astype(np.uint8)
        store_addr[wide] = _gather(a, p_store, 16) * np.where(sv6[:, None], 1, _V4_MASK).astype(np.uint8)
        f["born_port"][wide] = _be(a, p_born + np.where(bv6, IPV6_ADDRESS_SIZE, IPV4_ADDRESS_SIZE), ">i4")
        f["store_ts"][wide] = _be(a, p_store_ts, ">i8")
        f["store_port"][wide] = _be(a, p_store + np.where(sv6, IPV6_ADDRESS_SIZE, IPV4_ADDRESS_SIZE), ">i4")
        f["reconsume"][wide] = _be(a, p_reconsume, ">i4")
        f["prepared"][wide] = _be(a, p_reconsume + TAIL_PREPARED_AT, ">i8")
        f["body_len"][wide] = _be(a, p_reconsume + TAIL_SIZE, ">i4")
        f["p_body"] = starts + _FIXED_V4_SIZE
        f["p_body"][wide] = p_reconsume + TAIL_SIZE + 4
    else:
        f["p_body"] = starts + _FIXED_V4_SIZE
    f["born_addr"], f["store_addr"] = born_addr, store_addr
    return f


def _decode_chunk(mem: memoryview, a: np.ndarray, buf: pa.Buffer, starts: np.ndarray, seg_base: int,
                  file_name: str, flt: DecodeFilter | None, verify_crc: bool,
                  findings: list[Finding], body_view: bool = False) -> tuple[pa.RecordBatch | None, np.ndarray]:
    """Decode records at ``starts``. Returns the batch (None if every row was filtered out) and the
    indices of records whose field lengths do not add up to TOTALSIZE (to be re-walked)."""
    f = _fixed_fields(a, starts)
    body_len = f["body_len"].astype(np.int64)
    p_topic_len = f["p_body"] + np.maximum(body_len, 0)
    v2 = np.flatnonzero(f["magic"] == MAGIC_V2)
    topic_len = _be(a, p_topic_len, ">i1").astype(np.int64)
    topic_width = np.ones(starts.size, np.int64)
    if v2.size:
        topic_len[v2] = _be(a, p_topic_len[v2], ">i2")
        topic_width[v2] = 2
    p_topic = p_topic_len + topic_width
    p_props_len = p_topic + np.maximum(topic_len, 0)
    props_len = _be(a, p_props_len, ">i2").astype(np.int64)
    p_props = p_props_len + 2
    bad = np.flatnonzero((body_len < 0) | (topic_len < 0) | (props_len < 0)
                         | (p_props + props_len != starts + f["size"]))
    if bad.size:
        return None, bad
    f.update(body_len=body_len, p_topic=p_topic, topic_len=topic_len, p_props=p_props, props_len=props_len)

    phys, store_ts = f["phys"], f["store_ts"]
    keep = np.ones(starts.size, dtype=bool)
    if flt is not None:
        if flt.min_offset is not None:
            keep &= phys >= flt.min_offset
        if flt.max_offset is not None:
            keep &= phys < flt.max_offset
        if flt.min_store_timestamp is not None:
            keep &= store_ts >= flt.min_store_timestamp
        if flt.max_store_timestamp is not None:
            keep &= store_ts <= flt.max_store_timestamp
        if not keep.any():
            return None, bad
    topic = _string_slices(a, buf, p_topic, p_topic + topic_len)
    props = _Properties.of_records(a, buf, p_props, props_len)
    real_topic_prop = props.value_of(PROPERTY_REAL_TOPIC)
    is_wrapper = pc.is_in(topic, value_set=_WRAPPER_TOPICS)
    real_topic = pc.if_else(pc.and_(is_wrapper, pc.is_valid(real_topic_prop)), real_topic_prop, topic)
    if flt is not None and flt.topics is not None:
        wanted = pa.array(sorted(flt.topics), pa.string())
        keep &= np.asarray(pc.or_(pc.is_in(topic, value_set=wanted), pc.is_in(real_topic, value_set=wanted)))
    if not keep.all():
        rows = np.flatnonzero(keep)
        if rows.size == 0:
            return None, bad
        f = {k: v[rows] for k, v in f.items()}
        sel = pa.array(rows)
        topic, real_topic = topic.take(sel), real_topic.take(sel)
        props = _Properties.of_records(a, buf, f["p_props"], f["props_len"])

    n = f["phys"].size
    sys_flag = f["sys_flag"]
    compressed = (sys_flag & COMPRESSED_FLAG) != 0
    compression = np.where(compressed, _COMPRESSION_BY_TYPE_BITS[(sys_flag & COMPRESSION_TYPE_MASK) >> 8], 0)
    crc_stored = f["crc"]
    p_body, body_len = f["p_body"], f["body_len"]
    if verify_crc:
        computed = body_crcs(a, p_body, body_len)  # an empty body's is 0, as RocketMQ stores
        crc_ok = computed == crc_stored
        for r in np.flatnonzero(~crc_ok).tolist():
            off = int(f["phys"][r])
            findings.append(Finding(file_name, off - seg_base, fk.CRC_MISMATCH,
                                    f"BODYCRC {int(crc_stored[r])} != computed {int(computed[r])}",
                                    physical_offset=off))
    else:
        crc_ok = np.ones(n, dtype=bool)
    columns = {
        "commitlog_offset": pa.array(f["phys"]),
        "store_size": pa.array(f["size"]),
        "magic_code": pa.array(f["magic"]),
        "body_crc": pa.array(crc_stored),
        "body_crc_ok": pa.array(crc_ok),
        "queue_id": pa.array(f["queue_id"]),
        "flag": pa.array(f["flag"]),
        "queue_offset": pa.array(f["queue_offset"]),
        "sys_flag": pa.array(sys_flag),
        "transaction_type": _TXN_NAMES.take(pa.array((sys_flag & TRANSACTION_TYPE_MASK) >> 2)),
        "compression": _COMPRESSION_NAMES.take(pa.array(compression.astype(np.int32))),
        "born_timestamp": pa.array(f["born_ts"]),
        "store_timestamp": pa.array(f["store_ts"]),
        "born_host": _host_strings(f["born_addr"], f["born_v6"], f["born_port"]),
        "store_host": _host_strings(f["store_addr"], f["store_v6"], f["store_port"]),
        "reconsume_times": pa.array(f["reconsume"]),
        "prepared_transaction_offset": pa.array(f["prepared"]),
        "topic": topic,
        "real_topic": real_topic,
        "properties": props.map_array(),
        "keys": _split_keys(props.value_of(PROPERTY_KEYS)),
        "tags": props.value_of(PROPERTY_TAGS),
        "uniq_key": props.value_of(PROPERTY_UNIQ_KEY),
        "offset_msg_id": _hex_ids(f["store_addr"], f["store_v6"], f["store_port"], f["phys"]),
        "body": _bodies(mem, a, buf, p_body, body_len, compression, f["phys"], file_name, seg_base, findings,
                        as_view=body_view),
    }
    schema = _RECORD_SCHEMA_BODY_VIEW if body_view else RECORD_SCHEMA
    return pa.RecordBatch.from_arrays([columns[c.name] for c in schema], schema=schema), bad


def iter_decode(buf, seg_base: int, seg_size: int, start: int = 0, end: int | None = None, *,
                file_name: str = "", flt: DecodeFilter | None = None, verify_crc: bool = True,
                batch_rows: int = DEFAULT_BATCH_ROWS, batch_bytes: int = DEFAULT_BATCH_BYTES,
                stats: DecodeStats | None = None, search_first: bool | None = None,
                body_view: bool = False) -> Iterator[pa.RecordBatch]:
    """Decode the records that start in ``[start, end)`` of one segment into RecordBatches.

    ``body_view``: leave ``body`` as ``binary_view`` pointing into ``buf`` (no copy; the batches
    keep ``buf`` alive) for consumers that write it straight out, e.g. the ingest's Parquet files.

    ``buf`` is the whole segment (an mmap or bytes, position 0 = file start); ``seg_base`` its
    physical start offset. ``start`` may be any byte: the first record is found by the
    self-identifying rule (see :mod:`broker.store.record_scan`). Findings (corrupt regions, CRC
    mismatches, torn tails) go to ``stats``; every intact record is still returned.
    """
    stats = stats if stats is not None else DecodeStats()
    mem = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    a = np.frombuffer(mem, dtype=np.uint8)
    pbuf = pa.py_buffer(mem)
    data_len = min(len(mem), seg_size)
    scan = scan_records(buf, seg_base, seg_size, start, end, file_name, search_first)
    walk_findings = list(scan.findings)  # from the walk; superseded if a record turns out bad
    row_findings: list[Finding] = []  # CRC / decompression findings of decoded rows
    starts, sizes = scan.starts, scan.sizes
    stats.stop, stats.end_of_data, stats.blank_at = scan.stop, scan.end_of_data, scan.blank_at
    i = 0
    try:
        while i < starts.size:
            # a chunk: at most batch_rows records and about batch_bytes bytes
            cum = np.cumsum(sizes[i:i + batch_rows])
            j = min(starts.size, i + max(1, int(np.searchsorted(cum, batch_bytes, side="right"))))
            batch, bad = _decode_chunk(mem, a, pbuf, starts[i:j], seg_base, file_name, flt, verify_crc,
                                       row_findings, body_view)
            if bad.size:
                # TOTALSIZE disagrees with the field lengths, so the walk past this record trusted
                # a wrong size: drop what it found beyond here and re-walk from the next real start.
                b = i + int(bad[0])
                pos = int(starts[b])
                total_size = SIZE_MAGIC.unpack_from(mem, pos)[0]
                walk_findings = [f for f in walk_findings if f.offset < pos]
                nxt = find_record_start(buf, pos + 1, data_len, seg_base, seg_size)
                if nxt is None:
                    tail_end = last_nonzero(buf, pos, data_len)
                    walk_findings.append(Finding(
                        file_name, pos, fk.TORN_TAIL,
                        f"field lengths do not add up to TOTALSIZE {total_size} and no valid record "
                        "follows (torn or partial write at the end of the log)",
                        bytes_skipped=tail_end - pos, physical_offset=seg_base + pos))
                    starts, sizes = starts[:b], sizes[:b]
                    stats.stop, stats.end_of_data, stats.blank_at = data_len, True, None
                else:
                    walk_findings.append(Finding(
                        file_name, pos, fk.LENGTH_MISMATCH,
                        f"field lengths do not add up to TOTALSIZE {total_size}; resynchronised at "
                        f"position {nxt}", bytes_skipped=nxt - pos, physical_offset=seg_base + pos))
                    rescan = scan_records(buf, seg_base, seg_size, nxt, max(nxt, end if end is not None
                                                                            else data_len),
                                          file_name, search_first=False)
                    walk_findings += rescan.findings
                    starts = np.concatenate([starts[:b], rescan.starts])
                    sizes = np.concatenate([sizes[:b], rescan.sizes])
                    stats.stop, stats.end_of_data, stats.blank_at = rescan.stop, rescan.end_of_data, rescan.blank_at
                continue  # decode [i, …) again, now without the bad record
            stats.records += j - i
            stats.bytes_decoded += int(cum[j - i - 1])
            i = j
            if batch is not None:
                stats.rows += batch.num_rows
                yield batch
    finally:
        stats.first_at = int(starts[0]) if starts.size else None
        stats.findings.extend(sorted(walk_findings + row_findings, key=lambda f: (f.offset, f.kind)))


def decode_range(buf, seg_base: int, seg_size: int, start: int = 0, end: int | None = None,
                 **kwargs) -> tuple[pa.Table, DecodeStats]:
    """:func:`iter_decode` collected into one table (empty tables keep the schema)."""
    stats = kwargs.pop("stats", None) or DecodeStats()
    batches = list(iter_decode(buf, seg_base, seg_size, start, end, stats=stats, **kwargs))
    schema = _RECORD_SCHEMA_BODY_VIEW if kwargs.get("body_view") else RECORD_SCHEMA
    return pa.Table.from_batches(batches, schema=schema), stats
