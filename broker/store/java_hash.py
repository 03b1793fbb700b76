"""Java ``String.hashCode`` as RocketMQ uses it for tag codes and index keys.

Java hashes UTF-16 code units, not UTF-8 bytes: a character outside the BMP (an emoji) counts as two
surrogate units. Getting this wrong silently breaks tag filtering and key lookups.
"""

from __future__ import annotations

import numpy as np

_INT_MIN = -(1 << 31)


def java_string_hash(text: str) -> int:
    """``text.hashCode()`` as a signed 32-bit int.

    The dispatcher hashes every message's keys and tags, so this is on the store's hot path: ASCII
    text (nearly every key) is read as bytes without numpy, and the 32-bit wrap is applied every 16
    units instead of every unit (the exact value is the same: the wrap is a ring homomorphism)."""
    units = text.encode("ascii") if text.isascii() else np.frombuffer(text.encode("utf-16-be"), dtype=">u2").tolist()
    h = 0
    for start in range(0, len(units), 16):
        for unit in units[start:start + 16]:
            h = 31 * h + unit
        h &= 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tagsCode of a TAGS value: the hash sign-extended to 64 bits, 0 when no tags."""
    if not tags:
        return 0
    return java_string_hash(tags)


def index_key_hash(index_key: str) -> int:
    """IndexFile key hash: ``abs(hashCode)``, and 0 for Integer.MIN_VALUE (whose abs stays negative)."""
    h = java_string_hash(index_key)
    if h == _INT_MIN:
        return 0
    return abs(h)
