"""The properties string: ``name 0x01 value 0x02 …`` in UTF-8.

Order is kept as stored (Python dicts keep insertion order), so decode → encode reproduces the bytes
of any string Apache wrote, with or without the 5.2+ trailing separator.
"""

from __future__ import annotations

from broker.store.constants import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from broker.store.java_hash import java_string_hash


def decode_properties(text: str) -> dict[str, str]:
    """Apache's ``string2messageProperties``: entries without a name or a value are dropped; a later
    duplicate overwrites an earlier one; a value may itself contain 0x01."""
    props: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        sep = item.find(NAME_VALUE_SEPARATOR)
        if 0 < sep < len(item) - 1:
            name = item[:sep]
            props.pop(name, None)  # a duplicate moves to where it was last written
            props[name] = item[sep + 1 :]
    return props


def encode_properties(props: dict[str, str] | None, trailing_separator: bool = False) -> str:
    """Apache's ``messageProperties2String``; ``trailing_separator`` is the 5.2.0+ form."""
    if not props:
        return ""
    text = PROPERTY_SEPARATOR.join(
        f"{name}{NAME_VALUE_SEPARATOR}{value}" for name, value in props.items() if value is not None
    )
    return text + PROPERTY_SEPARATOR if trailing_separator and text else text


def split_keys(keys: str | None) -> list[str]:
    """KEYS split on spaces, empty tokens dropped (as the index builder skips them)."""
    if not keys:
        return []
    return [k for k in keys.split(" ") if k]


_HASHMAP_INITIAL_CAPACITY = 16  # java.util.HashMap's default table size
_HASHMAP_LOAD_FACTOR = 0.75


def java_hashmap_order(props: dict[str, str]) -> dict[str, str]:
    """``props`` in the order a ``java.util.HashMap`` built by putting them in this order iterates.

    Where Apache re-encodes a message's properties map (``messageProperties2String`` in
    ``parseHalfMessageInner``, ``endMessageTransaction``, the op record, the transaction check's
    re-put), the stored text is in HashMap order, not in the order the names were added. That order is
    the table bucket of each name (``hash ^ hash >>> 16`` masked by the table size, which starts at 16
    and doubles past 3/4 full), names sharing a bucket keeping the order they were put in: a resize
    splits a bucket's list without reordering it. Checked against the half, commit and op records of
    the 4.9.8 golden store."""
    capacity = _HASHMAP_INITIAL_CAPACITY
    while len(props) > capacity * _HASHMAP_LOAD_FACTOR:
        capacity *= 2
    mask = capacity - 1

    def bucket(name: str) -> int:
        h = java_string_hash(name) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & mask

    return dict(sorted(props.items(), key=lambda item: bucket(item[0])))
