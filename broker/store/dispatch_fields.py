"""The dispatcher's compiled kernels: the fields of a run of commitlog records, and index puts.

The per-record dispatch path (``decode_record`` → ``MessageRecord`` → properties dict → tag hash →
index key strings → one struct pack per unit) costs tens of microseconds of Python per record, and
the dispatcher process does it for every message the broker stores. :func:`scan_run` walks a run of
contiguous records in a mapped commitlog file once, in numba, and returns only what dispatch needs
(:class:`RunFields`); :func:`put_index_entries` writes index entries exactly as
``IndexFile.put_key`` does. Python then works per queue and per index file, not per record.

The kernel applies the checks of :func:`broker.store.record_check.check_record` (positions from
:mod:`broker.store.record_layout`, never re-typed). It does not report errors itself: it stops
*before* a record that fails a check, or that it cannot dispatch bit-identically (a topic, TAGS,
KEYS or UNIQ_KEY that is not well-formed UTF-8: Python decodes it with replacement characters
before hashing its UTF-16 units), and says why; the caller then hands that record to the Python
path, which raises the same error or dispatches it as before. A record of the delay topic, whose
tagsCode may be a deliver time, is only flagged: the caller works that out from its properties.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from broker.store.constants import (
    BLANK_HEADER_SIZE,
    BORNHOST_V6_FLAG,
    INDEX_ENTRY_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_KEY_JOINER,
    KEY_SEPARATOR,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    STOREHOSTADDRESS_V6_FLAG,
)
from broker.store.crc_kernel import crc_at
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
    POS_MAGIC,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_ID,
    POS_QUEUE_OFFSET,
    POS_SYS_FLAG,
    POS_TOTAL_SIZE,
    PROPERTIES_LENGTH_SIZE,
    TOPIC_LENGTH_SIZE_V1,
    TOPIC_LENGTH_SIZE_V2,
)
from broker.store.topics import SCHEDULE_TOPIC

# Why a run stopped (the caller's next step in brackets)
STOP_LIMIT = 0  # the next record starts at or past the limit [done]
STOP_FULL = 1  # the output arrays are full [dispatch, call again]
STOP_BLANK = 2  # an end-of-file BLANK [go on at the next file]
STOP_PYTHON = 3  # a well-formed record the kernel cannot dispatch bit-identically [Python path, one record]
STOP_CHECK = 4  # the record fails a check (or END zeros, a torn tail) [Python path: its error]

_U32 = np.uint32
_NAME_TAGS = np.frombuffer(PROPERTY_TAGS.encode(), np.uint8).copy()
_NAME_KEYS = np.frombuffer(PROPERTY_KEYS.encode(), np.uint8).copy()
_NAME_UNIQ = np.frombuffer(PROPERTY_UNIQ_KEY.encode(), np.uint8).copy()
_SCHEDULE = np.frombuffer(SCHEDULE_TOPIC.encode(), np.uint8).copy()
_NV_SEP = ord(NAME_VALUE_SEPARATOR)
_PROP_SEP = ord(PROPERTY_SEPARATOR)
_KEY_SEP = ord(KEY_SEPARATOR)
_JOINER = ord(INDEX_KEY_JOINER)
_INT_MIN = -(1 << 31)


@numba.njit(cache=True, inline="always")
def _i32(buf, p):
    v = (np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16) | (np.int64(buf[p + 2]) << 8) | np.int64(buf[p + 3])
    return v - (np.int64(1) << 32) if v >= (np.int64(1) << 31) else v


@numba.njit(cache=True, inline="always")
def _i16(buf, p):
    v = (np.int64(buf[p]) << 8) | np.int64(buf[p + 1])
    return v - 65536 if v >= 32768 else v


@numba.njit(cache=True, inline="always")
def _i8(buf, p):
    v = np.int64(buf[p])
    return v - 256 if v >= 128 else v


@numba.njit(cache=True, inline="always")
def _i64(buf, p):
    hi = _i32(buf, p)
    lo = (np.int64(buf[p + 4]) << 24) | (np.int64(buf[p + 5]) << 16) | (np.int64(buf[p + 6]) << 8) | np.int64(buf[p + 7])
    return (hi << 32) | lo


@numba.njit(cache=True)
def _hash_utf8(buf, at, n, h):
    """Java ``hashCode`` continued over the UTF-16 units of well-formed UTF-8 bytes (a code point
    above the BMP is two surrogate units); -1 when the bytes are not well-formed UTF-8 (Python
    would decode them with replacement characters: left to the Python path)."""
    i = at
    stop = at + n
    while i < stop:
        b0 = np.int64(buf[i])
        if b0 < 0x80:
            cp = b0
            i += 1
        else:
            if 0xC2 <= b0 <= 0xDF:
                need = 1
                cp = b0 & 0x1F
                lo, hi = 0x80, 0xBF
            elif 0xE0 <= b0 <= 0xEF:
                need = 2
                cp = b0 & 0x0F
                lo = 0xA0 if b0 == 0xE0 else 0x80
                hi = 0x9F if b0 == 0xED else 0xBF
            elif 0xF0 <= b0 <= 0xF4:
                need = 3
                cp = b0 & 0x07
                lo = 0x90 if b0 == 0xF0 else 0x80
                hi = 0x8F if b0 == 0xF4 else 0xBF
            else:
                return np.int64(-1)
            if i + need >= stop:
                return np.int64(-1)
            for j in range(1, need + 1):
                c = np.int64(buf[i + j])
                if j == 1:
                    if c < lo or c > hi:
                        return np.int64(-1)
                elif c < 0x80 or c > 0xBF:
                    return np.int64(-1)
                cp = (cp << 6) | (c & 0x3F)
            i += need + 1
        if cp >= 0x10000:
            cp -= 0x10000
            h = (h * 31 + (0xD800 | (cp >> 10))) & 0xFFFFFFFF
            h = (h * 31 + (0xDC00 | (cp & 0x3FF))) & 0xFFFFFFFF
        else:
            h = (h * 31 + cp) & 0xFFFFFFFF
    return h


@numba.njit(cache=True)
def _signed32(h):
    return h - (np.int64(1) << 32) if h >= (np.int64(1) << 31) else h


@numba.njit(cache=True)
def _equals(buf, at, n, name):
    if n != name.shape[0]:
        return False
    for i in range(n):
        if buf[at + i] != name[i]:
            return False
    return True


@numba.njit(cache=True)
def _scan(buf, base, pos, limit, check_crc, names_tags, names_keys, names_uniq, schedule,
          phy, size, queue_id, queue_offset, sys_flag, store_ts, topic_at, topic_len, tags_code, delay_topic,
          key_first, key_count, key_hash):
    """Walk records from ``buf[pos]`` while they start before ``limit`` (file positions); fill one
    row per record and the index key hashes of each (UNIQ_KEY first, then each KEYS token).
    Returns (records, keys, stop position, stop reason)."""
    n = 0
    k = 0
    end = buf.shape[0]
    cap = phy.shape[0]
    kcap = key_hash.shape[0]
    while pos < limit:
        if n >= cap:
            return n, k, pos, STOP_FULL
        if end - pos < BLANK_HEADER_SIZE:
            return n, k, pos, STOP_CHECK
        total = _i32(buf, pos + POS_TOTAL_SIZE)
        magic = _i32(buf, pos + POS_MAGIC)
        if magic == MAGIC_BLANK:
            if total < BLANK_HEADER_SIZE:
                return n, k, pos, STOP_CHECK
            return n, k, pos, STOP_BLANK
        if magic != MAGIC_V1 and magic != MAGIC_V2:
            return n, k, pos, STOP_CHECK
        if total < MIN_MESSAGE_RECORD_SIZE or pos + total > end:
            return n, k, pos, STOP_CHECK
        if _i64(buf, pos + POS_PHYSICAL_OFFSET) != base + pos:
            return n, k, pos, STOP_CHECK
        rec_end = pos + total
        flag = _i32(buf, pos + POS_SYS_FLAG)
        p = pos + POS_BORN_HOST + (IPV6_HOST_SIZE if flag & BORNHOST_V6_FLAG else IPV4_HOST_SIZE)
        if p + 8 > rec_end:
            return n, k, pos, STOP_CHECK
        ts = _i64(buf, p)
        p += AFTER_STORE_TIMESTAMP_V6 if flag & STOREHOSTADDRESS_V6_FLAG else AFTER_STORE_TIMESTAMP_V4
        if p + 4 > rec_end:
            return n, k, pos, STOP_CHECK
        body_len = _i32(buf, p)
        body_at = p + 4
        if body_len < 0 or body_at + body_len > rec_end:
            return n, k, pos, STOP_CHECK
        p = body_at + body_len
        if magic == MAGIC_V2:
            if p + TOPIC_LENGTH_SIZE_V2 > rec_end:
                return n, k, pos, STOP_CHECK
            t_len = _i16(buf, p)
            t_at = p + TOPIC_LENGTH_SIZE_V2
        else:
            if p + TOPIC_LENGTH_SIZE_V1 > rec_end:
                return n, k, pos, STOP_CHECK
            t_len = _i8(buf, p)
            t_at = p + TOPIC_LENGTH_SIZE_V1
        if t_len < 0 or t_at + t_len > rec_end:
            return n, k, pos, STOP_CHECK
        p = t_at + t_len
        if p + PROPERTIES_LENGTH_SIZE > rec_end:
            return n, k, pos, STOP_CHECK
        props_len = _i16(buf, p)
        props_at = p + PROPERTIES_LENGTH_SIZE
        if props_len < 0 or props_at + props_len != rec_end:
            return n, k, pos, STOP_CHECK
        if check_crc and crc_at(buf, body_at, body_len) != _i32(buf, pos + POS_BODY_CRC):
            return n, k, pos, STOP_CHECK
        # ---- properties: the last well-formed TAGS / KEYS / UNIQ_KEY entry wins ----
        tags_at = -1
        tags_len = 0
        keys_at = -1
        keys_len = 0
        uniq_at = -1
        uniq_len = 0
        item = props_at
        props_end = props_at + props_len
        while item <= props_end:
            stop = item
            while stop < props_end and buf[stop] != _PROP_SEP:
                stop += 1
            sep = item
            while sep < stop and buf[sep] != _NV_SEP:
                sep += 1
            if sep < stop and 0 < sep - item < stop - item - 1:
                name_len = sep - item
                v_at = sep + 1
                v_len = stop - v_at
                if _equals(buf, item, name_len, names_tags):
                    tags_at, tags_len = v_at, v_len
                elif _equals(buf, item, name_len, names_keys):
                    keys_at, keys_len = v_at, v_len
                elif _equals(buf, item, name_len, names_uniq):
                    uniq_at, uniq_len = v_at, v_len
            item = stop + 1
        prefix = _hash_utf8(buf, t_at, t_len, np.int64(0))
        code = _hash_utf8(buf, tags_at, tags_len, np.int64(0)) if tags_at >= 0 else np.int64(0)
        if (prefix < 0 or code < 0
                or (keys_at >= 0 and _hash_utf8(buf, keys_at, keys_len, np.int64(0)) < 0)
                or (uniq_at >= 0 and _hash_utf8(buf, uniq_at, uniq_len, np.int64(0)) < 0)):
            return n, k, pos, STOP_PYTHON
        # ---- index keys: topic#UNIQ_KEY, then topic#token for each non-empty KEYS token ----
        need = (1 if uniq_at >= 0 else 0) + (keys_len + 1) // 2
        if k + need > kcap:
            if n == 0:
                return n, k, pos, STOP_PYTHON  # more keys than one call holds: the Python path
            return n, k, pos, STOP_FULL
        prefix = (prefix * 31 + _JOINER) & 0xFFFFFFFF
        key_first[n] = k
        if uniq_at >= 0:
            key_hash[k] = _signed32(_hash_utf8(buf, uniq_at, uniq_len, prefix))
            k += 1
        if keys_at >= 0:
            tok = keys_at
            keys_end = keys_at + keys_len
            while tok <= keys_end:
                t_end = tok
                while t_end < keys_end and buf[t_end] != _KEY_SEP:
                    t_end += 1
                if t_end > tok:
                    key_hash[k] = _signed32(_hash_utf8(buf, tok, t_end - tok, prefix))
                    k += 1
                tok = t_end + 1
        key_count[n] = k - key_first[n]
        phy[n] = base + pos
        size[n] = total
        queue_id[n] = _i32(buf, pos + POS_QUEUE_ID)
        queue_offset[n] = _i64(buf, pos + POS_QUEUE_OFFSET)
        sys_flag[n] = flag
        store_ts[n] = ts
        topic_at[n] = t_at
        topic_len[n] = t_len
        tags_code[n] = _signed32(code)
        delay_topic[n] = _equals(buf, t_at, t_len, schedule)
        n += 1
        pos = rec_end
    return n, k, pos, STOP_LIMIT


@dataclass
class RunFields:
    """What :func:`scan_run` found: ``n`` records (arrays sliced to it), their index key hashes
    (record ``i`` owns ``key_hash[key_first[i]:key_first[i] + key_count[i]]``; already
    ``topic#key`` Java hashes, not yet the index's abs), and where and why it stopped
    (``stop_pos`` a file position; a ``STOP_*`` reason). ``tags_code`` is the TAGS hash; a record
    of the delay topic (``delay_topic``) may need a deliver time instead, which the caller works
    out from its properties (``base`` is the file's first physical offset, to find it)."""

    base: int
    phy: np.ndarray
    size: np.ndarray
    queue_id: np.ndarray
    queue_offset: np.ndarray
    sys_flag: np.ndarray
    store_ts: np.ndarray
    topic_at: np.ndarray
    topic_len: np.ndarray
    tags_code: np.ndarray
    delay_topic: np.ndarray
    key_first: np.ndarray
    key_count: np.ndarray
    key_hash: np.ndarray
    stop_pos: int
    stop: int

    @property
    def n(self) -> int:
        return len(self.phy)


def scan_run(buf: np.ndarray, base: int, pos: int, limit: int, *, check_crc: bool = False,
             max_records: int = 4096) -> RunFields:
    """Fields of the records from file position ``pos`` that start before ``limit`` in one
    commitlog file mapped as the uint8 array ``buf`` (``base`` its first physical offset)."""
    cap = max(1, min(max_records, (limit - pos) // MIN_MESSAGE_RECORD_SIZE + 1))  # a small pass: small arrays
    kcap = cap * 4
    phy = np.empty(cap, np.int64)
    size = np.empty(cap, np.int64)
    queue_id = np.empty(cap, np.int64)
    queue_offset = np.empty(cap, np.int64)
    sys_flag = np.empty(cap, np.int64)
    store_ts = np.empty(cap, np.int64)
    topic_at = np.empty(cap, np.int64)
    topic_len = np.empty(cap, np.int64)
    tags = np.empty(cap, np.int64)
    delay_topic = np.empty(cap, np.bool_)
    key_first = np.empty(cap, np.int64)
    key_count = np.empty(cap, np.int64)
    key_hash = np.empty(kcap, np.int64)
    n, k, stop_pos, stop = _scan(buf, base, pos, limit, check_crc, _NAME_TAGS, _NAME_KEYS,
                                 _NAME_UNIQ, _SCHEDULE, phy, size, queue_id, queue_offset, sys_flag, store_ts,
                                 topic_at, topic_len, tags, delay_topic, key_first, key_count, key_hash)
    return RunFields(base, phy[:n], size[:n], queue_id[:n], queue_offset[:n], sys_flag[:n], store_ts[:n],
                     topic_at[:n], topic_len[:n], tags[:n], delay_topic[:n], key_first[:n], key_count[:n],
                     key_hash[:k], int(stop_pos), int(stop))


def index_key_hashes(java_hashes: np.ndarray) -> np.ndarray:
    """``java_hash.index_key_hash`` over an array: abs, and 0 for Integer.MIN_VALUE."""
    return np.where(java_hashes == _INT_MIN, 0, np.abs(java_hashes))


# =====================================================================================================
# Index entries
# =====================================================================================================
@numba.njit(cache=True, inline="always")
def _put_i32(buf, p, v):
    v = v & 0xFFFFFFFF
    buf[p] = (v >> 24) & 0xFF
    buf[p + 1] = (v >> 16) & 0xFF
    buf[p + 2] = (v >> 8) & 0xFF
    buf[p + 3] = v & 0xFF


@numba.njit(cache=True, inline="always")
def _put_i64(buf, p, v):
    _put_i32(buf, p, v >> 32)
    _put_i32(buf, p + 4, v)


@numba.njit(cache=True)
def _put_entries(buf, header, slots, max_num, entries_at, rec_phy, rec_ts, rec_first, rec_count, hashes,
                 wrote, rec, key, check_record):
    """``IndexFile.put_key`` for record ``rec``'s keys from ``key`` on, then the next records'.
    ``header`` (begin ts, end ts, begin phy, end phy, slot count, index count) is updated and
    written to ``buf`` after each put, as Apache does. A record's ``phy < end phy`` check is made
    when it is started (``check_record``), not when resumed after a roll. Returns (record, key) to
    go on from: the end, or where the file became full (the caller rolls and calls again)."""
    n = rec_phy.shape[0]
    while rec < n:
        if header[5] >= max_num:
            return rec, key
        if check_record:
            if rec_phy[rec] < header[3]:
                rec += 1
                key = 0
                continue
        check_record = True
        phy = rec_phy[rec]
        ts = rec_ts[rec]
        while key < rec_count[rec]:
            if header[5] >= max_num:
                return rec, key
            h = hashes[rec_first[rec] + key]
            slot_pos = INDEX_HEADER_SIZE + (h % slots) * INDEX_HASH_SLOT_SIZE
            count = header[5]
            value = _i32(buf, slot_pos)
            if value == count:
                value = _i32(buf, entries_at + value * INDEX_ENTRY_SIZE + 16)
            prev = value if 0 < value < count else 0
            diff = 0
            if header[0] > 0:
                delta = ts - header[0]
                diff = delta // 1000 if delta >= 0 else -((-delta) // 1000)
                diff = min(max(diff, 0), 2147483647)
            number = count
            e = entries_at + number * INDEX_ENTRY_SIZE
            _put_i32(buf, e, h)
            _put_i64(buf, e + 4, phy)
            _put_i32(buf, e + 12, diff)
            _put_i32(buf, e + 16, prev)
            _put_i32(buf, slot_pos, number)
            if number <= 1:
                header[2] = phy
                header[0] = ts
            if prev == 0:
                header[4] += 1
            header[5] += 1
            header[3] = phy
            header[1] = ts
            _put_i64(buf, 0, header[0])
            _put_i64(buf, 8, header[1])
            _put_i64(buf, 16, header[2])
            _put_i64(buf, 24, header[3])
            _put_i32(buf, 32, header[4])
            _put_i32(buf, 36, header[5])
            wrote[rec] = True
            key += 1
        rec += 1
        key = 0
    return rec, key


def put_index_entries(buf: np.ndarray, header: np.ndarray, slots: int, max_num: int, entries_at: int,
                      rec_phy: np.ndarray, rec_ts: np.ndarray, rec_first: np.ndarray, rec_count: np.ndarray,
                      hashes: np.ndarray, wrote: np.ndarray, rec: int, key: int,
                      check_record: bool) -> tuple[int, int]:
    """See :func:`_put_entries` (``hashes`` are index key hashes: non-negative; ``wrote[i]`` is set
    for each record that got an entry)."""
    r, k = _put_entries(buf, header, slots, max_num, entries_at, rec_phy, rec_ts, rec_first, rec_count, hashes,
                        wrote, rec, key, check_record)
    return int(r), int(k)
