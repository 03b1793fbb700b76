"""Java ``Properties`` as request/response bodies (GET/UPDATE_NAMESRV_CONFIG, UPDATE_BROKER_CONFIG).

Apache writes them with ``MixAll.properties2String``: one ``key=value\\n`` per entry, nothing escaped,
in hash-table order (we sort, so answers are reproducible), and reads them with
``MixAll.string2Properties``, i.e. ``java.util.Properties.load``. Bodies are UTF-8
(``MixAll.DEFAULT_CHARSET``) both ways.
"""

from __future__ import annotations

from collections.abc import Mapping

CHARSET = "utf-8"  # MixAll.DEFAULT_CHARSET
_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


class PropertiesError(ValueError):
    """Text ``Properties.load`` would reject (a malformed ``\\uXXXX`` escape)."""


def properties_to_text(values: Mapping[str, object]) -> str:
    """``MixAll.properties2String``: ``key=value`` lines, booleans as Java prints them, None left out."""
    lines = []
    for key in sorted(values):
        value = values[key]
        if value is None:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        lines.append(f"{key}={text}\n")
    return "".join(lines)


def _logical_lines(text: str) -> list[str]:
    """Natural lines joined where one ends in an odd number of backslashes (the continuation's
    leading whitespace dropped); blank and comment lines left out."""
    out: list[str] = []
    pending: str | None = None
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = raw.lstrip(_WHITESPACE)
        if pending is None and (not line or line[0] in "#!"):
            continue
        line = line if pending is None else pending + line
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending = line[:-1]
            continue
        pending = None
        out.append(line)
    if pending is not None:
        out.append(pending)
    return out


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 >= len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2:i + 6]
            if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise PropertiesError(f"Malformed \\uxxxx encoding: \\u{digits}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    """``Properties.load`` of ``text``: ``key=value``, ``key:value`` or ``key value``, comments, line
    continuations and escapes; a later key wins. Raises :class:`PropertiesError`."""
    result: dict[str, str] = {}
    for line in _logical_lines(text):
        i, n = 0, len(line)
        while i < n:  # the key ends at an unescaped separator or whitespace
            ch = line[i]
            if ch == "\\":
                i += 2
                continue
            if ch in "=:" or ch in _WHITESPACE:
                break
            i += 1
        key = line[:min(i, n)]
        j = i
        while j < n and line[j] in _WHITESPACE:
            j += 1
        if j < n and line[j] in "=:":
            j += 1
            while j < n and line[j] in _WHITESPACE:
                j += 1
        result[_unescape(key)] = _unescape(line[j:])
    return result
