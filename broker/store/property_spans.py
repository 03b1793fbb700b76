"""Where each property of a chunk's records lies: (record, name span, value span), compiled.

The properties string is ``name 0x01 value 0x02 …``; Apache's ``string2messageProperties`` drops
entries without a name or a value, lets a value contain 0x01 and lets a later duplicate name
overwrite an earlier one (the map keeps the later entry, in its own place). Splitting this with
Arrow's string kernels (two ``split_pattern`` passes, a ``dictionary_encode`` to find duplicates,
two ``take`` copies) was the largest part of decoding a chunk; one compiled pass over the record
bytes finds the same entries, drops the overwritten duplicates, and leaves only the final copy of
names and values to Arrow (see ``broker.store.columnar``).

The separators are ASCII, which never occurs inside a multi-byte UTF-8 sequence, so spans found on
the raw bytes are the spans of the decoded text whenever the bytes are valid UTF-8; the caller
falls back to the text path where they are not.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit, types

from broker.store.constants import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR

_ENTRY_SEP = ord(PROPERTY_SEPARATOR)
_NAME_SEP = ord(NAME_VALUE_SEPARATOR)

# Compiled at import (from numba's cache after the first time) for read-only buffers (file maps,
# bytes) and writable ones, as record_scan's walk: a lazy compile would stall a worker's first split.
_SPAN_SIGNATURES = [
    types.Tuple([types.Array(types.int64, 1, "C"), *[types.Array(types.int32, 1, "C"), types.Array(types.uint8, 1, "C")] * 2,
                 types.boolean])(
        types.Array(types.uint8, 1, "C", readonly=readonly), types.Array(types.int64, 1, "C"),
        types.Array(types.int64, 1, "C"), types.uint8, types.uint8)
    for readonly in (True, False)
]


@njit(_SPAN_SIGNATURES, cache=True, nogil=True)
def _spans(a, starts, lengths, entry_sep, name_sep):  # pragma: no cover (compiled)
    """Entries of the properties at ``a[starts[i]:starts[i] + lengths[i]]``, in stored order, each
    name's earlier duplicates of the same record dropped: (record per entry, name offsets, name
    bytes, value offsets, value bytes, whether every byte is ASCII), the buffers of two Arrow string
    arrays.

    One pass, each record's entries copied out while its bytes are in cache: the records lie
    about a kilobyte apart, so every pass over them costs a cache miss per line (a second pass to
    copy doubled the time); duplicates, rare, are compacted afterwards from the copies. Each byte
    is looked at once, copied as it is scanned: scanning an entry for its separators and then
    copying its name and value took ~60 % longer (62 -> 29 ms per 128 MiB split of 1 KiB
    messages, ~110 bytes of properties each)."""
    n = starts.shape[0]
    cap = 0
    total = 0
    for i in range(n):
        cap += (lengths[i] + 1) // 4 + 1  # a kept entry takes >= 3 bytes and a separator
        total += lengths[i]
    rec = np.empty(cap, np.int64)
    name_offsets = np.empty(cap + 1, np.int32)
    value_offsets = np.empty(cap + 1, np.int32)
    names = np.empty(total, np.uint8)
    values = np.empty(total, np.uint8)
    dropped = np.zeros(cap, np.bool_)
    name_offsets[0] = 0
    value_offsets[0] = 0
    k = 0
    no = 0  # bytes written to names
    vo = 0
    any_dropped = False
    for i in range(n):
        first = k
        p = starts[i]
        stop = p + lengths[i]
        while p <= stop:
            # the name is copied while it is scanned, up to the first name separator
            n0 = no
            while p < stop:
                c = a[p]
                if c == name_sep or c == entry_sep:
                    break
                names[no] = c
                no += 1
                p += 1
            if p >= stop or a[p] == entry_sep:  # no name separator: not an entry
                no = n0
                p += 1
                continue
            p += 1
            v0 = vo  # the value: everything up to the entry separator, 0x01 included
            while p < stop:
                c = a[p]
                if c == entry_sep:
                    break
                values[vo] = c
                vo += 1
                p += 1
            p += 1
            nl = no - n0
            if nl == 0 or vo == v0:  # an empty name or value: no entry, overwrites nothing
                no = n0
                vo = v0
                continue
            for j in range(first, k):  # an earlier entry of this name is overwritten
                if dropped[j] or name_offsets[j + 1] - name_offsets[j] != nl:
                    continue
                q = name_offsets[j]
                same = True
                for b in range(nl):
                    if names[q + b] != names[n0 + b]:
                        same = False
                        break
                if same:
                    dropped[j] = True
                    any_dropped = True
                    break  # at most one earlier copy is still kept
            rec[k] = i
            k += 1
            name_offsets[k] = no
            value_offsets[k] = vo
    high = 0  # OR of every byte kept: ASCII when < 128 (a separate loop, which LLVM vectorises)
    for b in range(no):
        high |= names[b]
    for b in range(vo):
        high |= values[b]
    if not any_dropped:
        return rec[:k].copy(), name_offsets[:k + 1].copy(), names[:no].copy(), value_offsets[:k + 1].copy(), \
            values[:vo].copy(), high < 128
    # compact: the kept entries' bytes moved down over the dropped ones (contiguous, cheap)
    m = 0
    no = 0
    vo = 0
    for e in range(k):
        if dropped[e]:
            continue
        s0, s1 = name_offsets[e], name_offsets[e + 1]
        for b in range(s1 - s0):
            names[no + b] = names[s0 + b]
        no += s1 - s0
        v0, v1 = value_offsets[e], value_offsets[e + 1]
        for b in range(v1 - v0):
            values[vo + b] = values[v0 + b]
        vo += v1 - v0
        rec[m] = rec[e]
        m += 1
        name_offsets[m] = no  # m <= e + 1: offsets of entries not yet read are not overwritten
        value_offsets[m] = vo
    return rec[:m].copy(), name_offsets[:m + 1].copy(), names[:no].copy(), value_offsets[:m + 1].copy(), \
        values[:vo].copy(), high < 128


def property_entries(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, pa.Array, pa.Array] | None:
    """The kept property entries of the records whose properties are ``a[starts[i]:starts[i] +
    lengths[i]]``: (record index per entry, names, values), in the order each record stores them;
    entries without a name or value and the earlier copies of a duplicate name are left out (Apache's
    ``string2messageProperties``). None if a kept name or value is not valid UTF-8."""
    records, name_offsets, names, value_offsets, values, ascii = _spans(
        a, np.array(starts, np.int64), np.array(lengths, np.int64), _ENTRY_SEP, _NAME_SEP)
    m = records.size
    name_array = pa.Array.from_buffers(pa.string(), m, [None, pa.py_buffer(name_offsets), pa.py_buffer(names)])
    value_array = pa.Array.from_buffers(pa.string(), m, [None, pa.py_buffer(value_offsets), pa.py_buffer(values)])
    if not ascii:
        try:
            name_array.validate(full=True)  # checks UTF-8
            value_array.validate(full=True)
        except pa.ArrowInvalid:
            return None
    return records, name_array, value_array
