"""The properties string: ``name 0x01 value 0x02 …`` in UTF-8.

Order is kept as stored (Python dicts keep insertion order), so decode → encode reproduces the bytes
of any string Apache wrote, with or without the 5.2+ trailing separator.
"""

from __future__ import annotations

from broker.store.constants import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR


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
