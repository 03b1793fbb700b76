"""Java ``Properties`` as request/response bodies (GET/UPDATE_NAMESRV_CONFIG, UPDATE_BROKER_CONFIG).

Apache writes them with ``MixAll.properties2String``: one ``key=value\\n`` per entry, nothing escaped,
in hash-table order (we sort, so answers are reproducible), and reads them with
``MixAll.string2Properties``, i.e. ``java.util.Properties.load`` (the grammar is
:mod:`broker.remoting.java_properties`'). Bodies are UTF-8 (``MixAll.DEFAULT_CHARSET``) both ways.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.remoting.java_properties import PropertiesError, dumps, loads

CHARSET = "utf-8"  # MixAll.DEFAULT_CHARSET

__all__ = ["CHARSET", "PropertiesError", "parse_properties", "properties_to_text"]


def properties_to_text(values: Mapping[str, object]) -> str:
    """``MixAll.properties2String``: ``key=value`` lines, booleans as Java prints them, None left out."""
    return dumps({key: ("true" if value else "false") if isinstance(value, bool) else str(value)
                  for key, value in sorted(values.items()) if value is not None})


def parse_properties(text: str) -> dict[str, str]:
    """``Properties.load`` of ``text``: ``key=value``, ``key:value`` or ``key value``, comments, line
    continuations and escapes; a later key wins. Raises :class:`PropertiesError`."""
    return loads(text)
