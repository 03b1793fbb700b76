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
from numba import njit, types

from broker.store.constants import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR

_ENTRY_SEP = ord(PROPERTY_SEPARATOR)
_NAME_SEP = ord(NAME_VALUE_SEPARATOR)

# Compiled at import (from numba's cache after the first time) for read-only buffers (file maps,
# bytes) and writable ones, as record_scan's walk: a lazy compile would stall a worker's first split.
_SPAN_SIGNATURES = [
    types.Tuple([types.Array(types.int64, 1, "C")] * 5)(
        types.Array(types.uint8, 1, "C", readonly=readonly), types.Array(types.int64, 1, "C"),
        types.Array(types.int64, 1, "C"), types.uint8, types.uint8)
    for readonly in (True, False)
]


@njit(_SPAN_SIGNATURES, cache=True, nogil=True)
def _spans(a, starts, lengths, entry_sep, name_sep):  # pragma: no cover (compiled)
    """Entries of the properties at ``a[starts[i]:starts[i] + lengths[i]]``, in stored order, each
    name's earlier duplicates of the same record dropped: (record, name start, name length, value
    start, value length)."""
    n = starts.shape[0]
    cap = 0
    for i in range(n):
        cap += (lengths[i] + 1) // 4 + 1  # a kept entry takes >= 3 bytes and a separator
    rec = np.empty(cap, np.int64)
    name_pos = np.empty(cap, np.int64)
    name_len = np.empty(cap, np.int64)
    val_pos = np.empty(cap, np.int64)
    val_len = np.empty(cap, np.int64)
    dropped = np.zeros(cap, np.bool_)
    k = 0
    any_dropped = False
    for i in range(n):
        first = k
        item = starts[i]
        stop = item + lengths[i]
        while item <= stop:
            end = item
            sep = -1
            while end < stop and a[end] != entry_sep:
                if sep < 0 and a[end] == name_sep:
                    sep = end
                end += 1
            if item < sep < end - 1:
                nl = sep - item
                for j in range(first, k):  # an earlier entry of this name is overwritten
                    if dropped[j] or name_len[j] != nl:
                        continue
                    q = name_pos[j]
                    same = True
                    for b in range(nl):
                        if a[q + b] != a[item + b]:
                            same = False
                            break
                    if same:
                        dropped[j] = True
                        any_dropped = True
                        break  # at most one earlier copy is still kept
                rec[k] = i
                name_pos[k] = item
                name_len[k] = nl
                val_pos[k] = sep + 1
                val_len[k] = end - sep - 1
                k += 1
            item = end + 1
    if any_dropped:
        keep = np.flatnonzero(~dropped[:k])
        return rec[keep], name_pos[keep], name_len[keep], val_pos[keep], val_len[keep]
    return rec[:k].copy(), name_pos[:k].copy(), name_len[:k].copy(), val_pos[:k].copy(), val_len[:k].copy()


def property_spans(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per kept property entry of the records whose properties are ``a[starts[i]:starts[i] +
    lengths[i]]``: (record index, name start, name length, value start, value length), positions in
    ``a``, in the order the record stores them; entries without a name or value and the earlier
    copies of a duplicate name are left out (Apache's ``string2messageProperties``)."""
    return _spans(a, np.array(starts, np.int64), np.array(lengths, np.int64), _ENTRY_SEP, _NAME_SEP)
