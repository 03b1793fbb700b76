"""Java ``.properties`` text, read and written the way ``java.util.Properties`` does.

Apache RocketMQ's ``broker.conf`` is such a file (``BrokerStartup`` loads it with
``Properties.load``), and so are the bodies of GET/UPDATE_BROKER_CONFIG (``MixAll.string2Properties``
/ ``properties2String``). An operator's file must mean here exactly what it means to the Java broker,
so the grammar is Java's, rule for rule:

* natural lines end at ``\\n``, ``\\r`` or ``\\r\\n``; a line whose first non-blank character is ``#``
  or ``!`` is a comment, and a comment never continues onto the next line;
* a line ending in an odd number of backslashes continues on the next line, whose leading blanks
  (space, tab, form feed) are dropped;
* the key runs to the first unescaped ``=``, ``:`` or blank; then blanks, at most one ``=``/``:``,
  and blanks again are skipped; the rest of the logical line is the value (trailing blanks kept);
* in keys and values ``\\t \\n \\r \\f`` and ``\\uXXXX`` are escapes, and a backslash before any other
  character stands for that character; a malformed ``\\u`` is an error;
* a key given twice keeps its last value.

Files are ISO-8859-1, as ``Properties.load(InputStream)`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

BLANKS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
FILE_ENCODING = "latin-1"


class PropertiesError(ValueError):
    """Text that ``Properties.load`` would refuse (a malformed ``\\uXXXX``); names the line."""


@dataclass(frozen=True)
class Entry:
    """One ``key=value`` with the natural lines (1-based, inclusive) it was written on."""

    key: str
    value: str
    first_line: int
    last_line: int


def _natural_lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _continues(line: str) -> bool:
    """An odd number of trailing backslashes: the last one escapes the line end."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _unescape(raw: str, line_no: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch != "\\" or i + 1 >= len(raw):
            out.append(ch)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "u":
            digits = raw[i + 2:i + 6]
            if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise PropertiesError(f"line {line_no}: malformed \\uxxxx encoding {raw[i:i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    # Java strings are UTF-16: an escaped surrogate pair is one character
    return "".join(out).encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _split_key(logical: str) -> tuple[str, str]:
    """The raw (still escaped) key and value of a logical line without leading blanks."""
    i, n = 0, len(logical)
    while i < n:
        ch = logical[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=:" or ch in BLANKS:
            break
        i += 1
    key_end = min(i, n)
    j = key_end
    while j < n and logical[j] in BLANKS:
        j += 1
    if j < n and logical[j] in "=:":
        j += 1
        while j < n and logical[j] in BLANKS:
            j += 1
    return logical[:key_end], logical[j:]


def parse_entries(text: str) -> list[Entry]:
    """Every entry in file order (a repeated key appears each time it is written)."""
    lines = _natural_lines(text)
    entries: list[Entry] = []
    i = 0
    while i < len(lines):
        start = i
        line = lines[i].lstrip(BLANKS)
        i += 1
        if not line or line[0] in "#!":
            continue
        parts = []
        while _continues(line) and i < len(lines):
            parts.append(line[:-1])
            line = lines[i].lstrip(BLANKS)
            i += 1
        if _continues(line):  # a continuation at the end of the text continues into nothing
            line = line[:-1]
        parts.append(line)
        raw_key, raw_value = _split_key("".join(parts))
        entries.append(Entry(_unescape(raw_key, start + 1), _unescape(raw_value, start + 1), start + 1, i))
    return entries


def loads(text: str) -> dict[str, str]:
    """``Properties.load``: key → value, the last of repeated keys winning, in first-seen order."""
    out: dict[str, str] = {}
    for entry in parse_entries(text):
        out[entry.key] = entry.value
    return out


def dumps(values: dict[str, str]) -> str:
    """``MixAll.properties2String``: one ``key=value`` line per entry, nothing escaped (what Apache's
    broker answers GET_BROKER_CONFIG with; our settings never need escapes)."""
    return "".join(f"{key}={value}\n" for key, value in values.items())


def escape(text: str, *, key: bool = False) -> str:
    """What ``Properties.store`` writes for a key or value, so that :func:`loads` gives it back."""
    out = []
    for pos, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch in _REVERSE:
            out.append(_REVERSE[ch])
        elif ch == " " and (key or pos == 0):
            out.append("\\ ")
        elif ch in "=:#!":
            out.append("\\" + ch)
        elif not 0x20 <= ord(ch) <= 0x7E:
            code = ord(ch)
            units = [code] if code <= 0xFFFF else [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + (code & 0x3FF)]
            out.append("".join(f"\\u{unit:04X}" for unit in units))
        else:
            out.append(ch)
    return "".join(out)


_REVERSE = {v: "\\" + k for k, v in _ESCAPES.items()}
