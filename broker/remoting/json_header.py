"""The remoting JSON header codec: orjson where it gives what the standard library gives, the
standard library everywhere else.

Why: ``json.dumps``/``json.loads`` of the header were a large share of a network process's CPU per
message. RocketMQ's clients (Java's fastjson, C++'s jsoncpp) must still see byte-identical headers
and every malformed header must still be refused with the same error text, so orjson is only
trusted where it is known to agree with the standard library (``tests/test_remoting_fastpath.py``
compares them over many header shapes):

* ``fast_loads``: any orjson error means "not sure" and the caller uses ``json.loads`` (same error text; ``NaN``/``Infinity``
  refused as before; lone surrogates, numbers beyond a double's range). orjson reads integers
  beyond 64 bits as floats, so a result holding any float is parsed again by the standard library
  (headers hold no floats in practice).
* ``dumps_sorted``: compact, key-sorted, non-ASCII kept (``ensure_ascii=False``). orjson refuses
  non-``str`` keys, integers beyond 64 bits and lone surrogates: those fall back, and so does any
  float (its text differs from ``repr``).
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def _plain(value: Any) -> bool:
    """True when ``value`` holds no float (the one type whose orjson reading or text may differ)
    and nothing but JSON's own types (exactly, or subclasses of str/int, which both libraries
    write as their base type)."""
    t = type(value)
    if t is dict:
        items = value.values()
    elif t is list:
        items = value
    else:
        return value is None or isinstance(value, (str, int))  # bool is an int
    for item in items:
        t = type(item)
        if t is str or t is int:
            continue
        if not _plain(item):
            return False
    return True


def fast_loads(raw: bytes) -> Any:
    """What ``json.loads(raw.decode("utf-8"))`` gives, or None when orjson cannot tell it (the
    caller then takes the standard library path, with its own error text)."""
    try:
        value = orjson.loads(raw)
        return value if _plain(value) else None
    except (orjson.JSONDecodeError, RecursionError):
        return None


def loads_flat_header(raw: bytes) -> dict[str, Any] | None:
    """The header object when it is *flat* — every top-level value a str, an int (not a bool) or
    null, and ``extFields``, if there, an object of str values — else None (the caller then takes
    the general path: :func:`fast_loads`, then the standard library). What a remoting header from
    any client looks like; checked in one pass, where :func:`fast_loads` walks every value
    recursively and the caller normalises extFields again. ints beyond 64 bits come back from
    orjson as floats, so they are not flat either."""
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(header) is not dict:
        return None
    for key, value in header.items():
        t = type(value)
        if t is str or t is int or value is None:
            continue
        if t is dict and key == "extFields":
            for item in value.values():
                if type(item) is not str:
                    return None
            continue
        return None
    return header


def dumps_sorted(obj: Any) -> bytes:
    """``json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")``,
    faster when it can be. Raises what that expression raises."""
    try:
        if _plain(obj):
            return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError, RecursionError):
        pass
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")
