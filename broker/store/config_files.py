"""Broker metadata under ``<store>/config``: read and write what fastjson 1.x reads and writes.

Apache persists ``topics.json``, ``subscriptionGroup.json``, ``consumerOffset.json`` and
``delayOffset.json`` with ``JSON.toJSONString(obj, prettyFormat=true)`` (store-format.md section 10),
which is *not* strict JSON:

* ``Map<Integer, …>`` keys are written bare: ``{0:97,1:110}`` (negative ids bare too: ``{-1:5}``);
* pretty printing indents with TABs, puts every String-keyed entry and bean field on its own line
  but keeps Integer-keyed entries on one line, and closes a non-empty object on a new line;
* bean fields come out in alphabetical order, map entries in the map's iteration order;
* null values are left out; every public getter becomes a key (5.x adds ``dataVersion``,
  ``groupTopicMap``, ``attributes``, ``forbiddenTable`` …).

So this module has its own small tokenizing parser (quoted, single-quoted, bare-word and numeric
keys; numeric keys become Python ``int`` so the writer can put them back bare) and a writer that
reproduces fastjson's layout; arrays are written the way fastjson writes a ``Set`` (one line), which
is what the 5.x files contain. Persistence follows ``MixAll.string2File``: new text to ``<file>.tmp``,
previous content copied to ``<file>.bak``, then the temp file replaces the main file (with an atomic
rename where Apache deletes then renames). Reading falls back to ``<file>.bak`` like
``ConfigManager.load``, but a file that cannot be parsed with no usable backup is an error here,
not the empty table Apache would silently start with.

The typed tables keep every key they do not model in ``extra`` and write it back, so a 5.x file
survives a read/modify/write by this 4.x-shaped code.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.store.checkpoint import fsync_directory
from broker.store.clock import now_ms as epoch_ms
from broker.store.constants import (
    CONFIG_BACKUP_SUFFIX,
    CONFIG_DIR,
    CONFIG_TEMP_SUFFIX,
    CONSUMER_OFFSET_FILE,
    DELAY_OFFSET_FILE,
    DELETED_TOPICS_FILE,
    SUBSCRIPTION_GROUP_FILE,
    TOPIC_GROUP_SEPARATOR,
    TOPICS_FILE,
)

log = logging.getLogger(__name__)

JsonObject = dict[Any, Any]


# =====================================================================================================
# Errors
# =====================================================================================================
class FastjsonDecodeError(ValueError):
    """Text that even a lenient fastjson reader rejects; carries the position like ``json``'s error."""

    def __init__(self, msg: str, text: str, pos: int) -> None:
        self.msg = msg
        self.pos = pos
        self.lineno = text.count("\n", 0, pos) + 1
        self.colno = pos - text.rfind("\n", 0, pos)
        super().__init__(f"{msg}: line {self.lineno} column {self.colno} (char {pos})")


class ConfigFileError(Exception):
    """A config file (and its backup) could not be used; the message names the file(s)."""


# =====================================================================================================
# Lenient parser
# =====================================================================================================
_WHITESPACE = re.compile(r"[ \t\n\r\f\b]*")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")
_BARE_WORD = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_STRING_CHUNK = {'"': re.compile(r'[^"\\]*'), "'": re.compile(r"[^'\\]*")}
_SIMPLE_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n",
                   "r": "\r", "t": "\t", "0": "\0"}
_LITERALS = {"true": True, "false": False, "null": None}


class _Parser:
    """Recursive-descent reader over the whole text, so string contents are never mistaken for
    structure (a regex over the raw text would rewrite ``"{0:1}"`` inside a value)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    # --- entry ------------------------------------------------------------------------------------
    def parse_document(self) -> Any:
        if self.text.startswith("\ufeff"):
            self.pos = 1
        self._skip_ws()
        if self.pos >= len(self.text):
            self._fail("empty document")
        value = self._value()
        self._skip_ws()
        if self.pos != len(self.text):
            self._fail("unexpected text after the top-level value")
        return value

    # --- helpers ----------------------------------------------------------------------------------
    def _fail(self, msg: str, pos: int | None = None) -> None:
        raise FastjsonDecodeError(msg, self.text, self.pos if pos is None else pos)

    def _skip_ws(self) -> None:
        self.pos = _WHITESPACE.match(self.text, self.pos).end()

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _expect(self, char: str) -> None:
        self._skip_ws()
        if self._peek() != char:
            found = repr(self._peek()) if self._peek() else "end of text"
            self._fail(f"expected {char!r}, found {found}")
        self.pos += 1

    # --- values -----------------------------------------------------------------------------------
    def _value(self) -> Any:
        self._skip_ws()
        ch = self._peek()
        if ch == "{":
            return self._object()
        if ch == "[":
            return self._array()
        if ch in ('"', "'"):
            return self._string(ch)
        if ch == "-" or ch.isdigit():
            return self._number()
        word = _BARE_WORD.match(self.text, self.pos)
        if word and word.group() in _LITERALS:
            self.pos = word.end()
            return _LITERALS[word.group()]
        self._fail("expected a value" if ch else "unexpected end of text")

    def _object(self) -> JsonObject:
        self.pos += 1  # '{'
        result: JsonObject = {}
        self._skip_ws()
        if self._peek() == "}":
            self.pos += 1
            return result
        while True:
            key = self._key()
            self._expect(":")
            result[key] = self._value()
            self._skip_ws()
            ch = self._peek()
            self.pos += 1
            if ch == "}":
                return result
            if ch != ",":
                self._fail("expected ',' or '}' in object", self.pos - 1)
            self._skip_ws()
            if self._peek() == "}":  # fastjson tolerates a trailing comma
                self.pos += 1
                return result

    def _key(self) -> str | int | float:
        self._skip_ws()
        ch = self._peek()
        if ch in ('"', "'"):
            return self._string(ch)
        if ch == "-" or ch.isdigit():
            return self._number()  # fastjson's unquoted Integer/Long map keys
        word = _BARE_WORD.match(self.text, self.pos)
        if word:  # fastjson also accepts unquoted field names
            self.pos = word.end()
            return word.group()
        self._fail("expected an object key" if ch else "unexpected end of text")
        raise AssertionError  # unreachable; keeps type checkers calm

    def _array(self) -> list[Any]:
        self.pos += 1  # '['
        items: list[Any] = []
        self._skip_ws()
        if self._peek() == "]":
            self.pos += 1
            return items
        while True:
            items.append(self._value())
            self._skip_ws()
            ch = self._peek()
            self.pos += 1
            if ch == "]":
                return items
            if ch != ",":
                self._fail("expected ',' or ']' in array", self.pos - 1)
            self._skip_ws()
            if self._peek() == "]":
                self.pos += 1
                return items

    def _number(self) -> int | float:
        match = _NUMBER.match(self.text, self.pos)
        if not match:
            self._fail("malformed number")
        self.pos = match.end()
        literal = match.group()
        if match.group(1) is None and match.group(2) is None:
            return int(literal)
        return float(literal)

    def _string(self, quote: str) -> str:
        start = self.pos
        self.pos += 1
        chunk = _STRING_CHUNK[quote]
        parts: list[str] = []
        while True:
            match = chunk.match(self.text, self.pos)
            parts.append(match.group())
            self.pos = match.end()
            if self.pos >= len(self.text):
                self._fail("unterminated string", start)
            if self.text[self.pos] == quote:
                self.pos += 1
                return "".join(parts)
            parts.append(self._escape())

    def _escape(self) -> str:
        """Decode one backslash escape at ``pos`` (JSON's, plus fastjson's ``\\'``, ``\\x``, ``\\0``)."""
        code = self.text[self.pos + 1: self.pos + 2]
        if code in _SIMPLE_ESCAPES:
            self.pos += 2
            return _SIMPLE_ESCAPES[code]
        if code == "x":
            return chr(self._hex(self.pos + 2, 2))
        if code == "u":
            unit = self._hex(self.pos + 2, 4)
            if 0xD800 <= unit < 0xDC00 and self.text.startswith("\\u", self.pos):
                low = self._peek_hex(self.pos + 2, 4)
                if low is not None and 0xDC00 <= low < 0xE000:
                    self.pos += 6
                    return chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
            return chr(unit)
        self._fail("invalid escape in string")
        raise AssertionError

    def _hex(self, at: int, width: int) -> int:
        value = self._peek_hex(at, width)
        if value is None:
            self._fail("invalid hex escape in string")
        self.pos = at + width
        return value

    def _peek_hex(self, at: int, width: int) -> int | None:
        digits = self.text[at: at + width]
        if len(digits) != width or any(c not in "0123456789abcdefABCDEF" for c in digits):
            return None
        return int(digits, 16)


def loads_fastjson(text: str) -> Any:
    """Parse fastjson output (and plain JSON). Unquoted numeric keys come back as ``int``."""
    return _Parser(text).parse_document()


# =====================================================================================================
# Writer
# =====================================================================================================
def dumps_fastjson(value: Any) -> str:
    """Serialize like fastjson ``toJSONString(value, prettyFormat=true)``.

    ``int`` keys are written bare (Java Integer/Long map keys), ``str`` keys quoted; ``None`` values
    are dropped from objects; arrays stay on one line (fastjson's Set layout). No trailing newline.
    """
    out: list[str] = []
    _write_value(out, value, 0)
    return "".join(out)


def _write_value(out: list[str], value: Any, indent: int) -> None:
    if value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_format_float(value))
    elif isinstance(value, str):
        out.append(_quote(value))
    elif isinstance(value, Mapping):
        _write_object(out, value, indent)
    elif isinstance(value, (list, tuple, set, frozenset)):
        _write_array(out, value, indent)
    else:
        raise TypeError(f"cannot write {type(value).__name__} as fastjson: {value!r}")


def _write_object(out: list[str], obj: Mapping[Any, Any], indent: int) -> None:
    """``{`` + entries + newline-and-indent before ``}`` when non-empty (MapSerializer/JavaBean layout)."""
    inner_break = "\n" + "\t" * (indent + 1)
    wrote_any = False
    out.append("{")
    for key, item in obj.items():
        if item is None:
            continue
        if wrote_any:
            out.append(",")
        if isinstance(key, str):
            out.append(inner_break)
            out.append(_quote(key))
        elif isinstance(key, int) and not isinstance(key, bool):
            out.append(str(key))  # Integer keys: bare, and no line break before them
        else:
            raise TypeError(f"object key must be str or int, not {type(key).__name__}: {key!r}")
        out.append(":")
        _write_value(out, item, indent + 1)
        wrote_any = True
    if wrote_any:
        out.append("\n" + "\t" * indent)
    out.append("}")


def _write_array(out: list[str], items: Any, indent: int) -> None:
    out.append("[")
    for position, item in enumerate(items):
        if position:
            out.append(",")
        _write_value(out, item, indent)
    out.append("]")


def _quote(text: str) -> str:
    # Non-ASCII stays as is (fastjson does not escape it); control characters, quote and backslash
    # are escaped, which both fastjson and this parser read back.
    return json.dumps(text, ensure_ascii=False)


def _format_float(value: float) -> str:
    if not math.isfinite(value):
        return "null"  # what fastjson writes for NaN/Infinity
    return repr(value)


# =====================================================================================================
# Files: read with .bak fallback, persist with the .tmp/.bak dance
# =====================================================================================================
@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A parsed config file and which file it really came from."""

    data: JsonObject
    source: Path
    from_backup: bool


def backup_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + CONFIG_BACKUP_SUFFIX)


def temp_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + CONFIG_TEMP_SUFFIX)


def parse_config_text(text: str, source: str | os.PathLike = "<text>") -> JsonObject:
    """Parse one document that must be an object; errors name ``source`` and the position."""
    try:
        data = loads_fastjson(text)
    except FastjsonDecodeError as exc:
        raise ConfigFileError(f"cannot parse {source}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigFileError(f"cannot parse {source}: top-level value is {type(data).__name__}, not an object")
    return data


def _read_candidate(path: Path) -> tuple[str, JsonObject | ConfigFileError | None]:
    """One of ("missing"|"empty", None), ("ok", data) or ("bad", error)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return "missing", None
    except OSError as exc:
        return "bad", ConfigFileError(f"cannot read {path}: {exc}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return "bad", ConfigFileError(f"cannot parse {path}: not UTF-8 at byte {exc.start}")
    if not text.strip():
        return "empty", None
    try:
        return "ok", parse_config_text(text, path)
    except ConfigFileError as exc:
        return "bad", exc


def read_config_json(path: str | os.PathLike) -> LoadedConfig | None:
    """Load a config file the way ``ConfigManager.load`` does, falling back to ``<file>.bak``.

    Returns None when neither file has content (the table is simply empty). Raises
    :class:`ConfigFileError` when the content that exists cannot be parsed: the main file is broken
    and there is no usable backup, or the backup we had to use is broken.
    """
    path = Path(path)
    state, result = _read_candidate(path)
    if state == "ok":
        log.debug("loaded %s", path)
        return LoadedConfig(result, path, from_backup=False)  # type: ignore[arg-type]
    if state == "bad":
        log.warning("%s; trying the backup %s", result, backup_path(path))
    else:
        log.info("%s is %s; trying the backup %s", path, state, backup_path(path))

    bak = backup_path(path)
    bak_state, bak_result = _read_candidate(bak)
    if bak_state == "ok":
        log.warning("loaded backup %s instead of %s (main file %s)", bak, path, state)
        return LoadedConfig(bak_result, bak, from_backup=True)  # type: ignore[arg-type]
    if bak_state == "bad":
        first = f"{result}; " if state == "bad" else f"{path} is {state}; "
        raise ConfigFileError(f"{first}backup also unusable: {bak_result}") from bak_result  # type: ignore[misc]
    if state == "bad":
        raise ConfigFileError(f"{result}; and no backup {bak} to fall back to") from result  # type: ignore[misc]
    log.info("neither %s nor its backup has content; starting empty", path)
    return None


def persist_config_text(path: str | os.PathLike, text: str, *, fsync: bool = True) -> None:
    """``MixAll.string2File``: ``.tmp`` first, previous content to ``.bak``, then replace.

    The rename is atomic (``os.replace``) where Apache deletes the old file before renaming, so
    there is never a moment without a main file. Written as UTF-8 (5.x does; 4.9.x uses the JVM
    default charset, which is UTF-8 on any sane broker host).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    _write_file(tmp, text.encode("utf-8"), fsync=fsync)
    if path.exists():
        _copy_file(path, backup_path(path), fsync=fsync)
    os.replace(tmp, path)
    if fsync:
        fsync_directory(path.parent)
    log.info("persisted %s (%d chars)", path, len(text))


def write_config_json(path: str | os.PathLike, data: Mapping[Any, Any], *, fsync: bool = True) -> None:
    """Serialize ``data`` in fastjson layout and persist it with the .tmp/.bak dance."""
    persist_config_text(path, dumps_fastjson(data), fsync=fsync)


def _write_file(path: Path, data: bytes, *, fsync: bool) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())


def _copy_file(source: Path, target: Path, *, fsync: bool) -> None:
    with open(source, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
        dst.flush()
        if fsync:
            os.fsync(dst.fileno())


# =====================================================================================================
# Typed tables
# =====================================================================================================
def _bean(fields: Mapping[str, Any], extra: Mapping[str, Any]) -> JsonObject:
    """A Java bean as fastjson writes it: known and unknown properties together, alphabetical."""
    merged = {**extra, **fields}
    return {name: merged[name] for name in sorted(merged) if merged[name] is not None}


def _split_known(data: Mapping[Any, Any], known: tuple[str, ...]) -> dict[Any, Any]:
    return {key: value for key, value in data.items() if key not in known}


_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,40}")


def coerce_int(value: Any, what: str, error: type[Exception] = None) -> int:
    """fastjson coerces numeric strings (and whole floats) into int/long fields; so do we, and reject
    the rest with ``error`` (default :class:`ConfigFileError`) naming the field."""
    error = error or ConfigFileError
    if isinstance(value, bool):
        raise error(f"{what}: expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
        return int(value.strip())
    raise error(f"{what}: expected an integer, got {value!r:.60}")


_as_int = coerce_int


def _as_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, int):
        return value != 0
    raise ConfigFileError(f"{what}: expected a boolean, got {value!r}")


def _as_object(value: Any, what: str) -> JsonObject:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigFileError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _int_map(value: Any, what: str) -> dict[int, int]:
    """A ``Map<Integer, Long>``: keys may arrive bare (fastjson) or quoted (any other writer)."""
    return {_as_int(k, f"{what} key"): _as_int(v, f"{what}[{k}]") for k, v in _as_object(value, what).items()}


@dataclass
class DataVersion:
    """Version stamp of a table; brokers compare it to decide whether to re-register routes."""

    counter: int = 0
    timestamp: int = field(default_factory=epoch_ms)
    state_version: int | None = None  # 5.x only; omitted for 4.x-shaped output when None
    extra: dict[str, Any] = field(default_factory=dict)

    _KNOWN = ("counter", "timestamp", "stateVersion")

    @classmethod
    def from_json(cls, data: Any) -> DataVersion:
        data = _as_object(data, "dataVersion")
        state = data.get("stateVersion")
        return cls(
            counter=_as_int(data.get("counter", 0), "dataVersion.counter"),
            timestamp=_as_int(data.get("timestamp", 0), "dataVersion.timestamp"),
            state_version=None if state is None else _as_int(state, "dataVersion.stateVersion"),
            extra=_split_known(data, cls._KNOWN),
        )

    def to_json(self) -> JsonObject:
        return _bean({"counter": self.counter, "timestamp": self.timestamp,
                      "stateVersion": self.state_version}, self.extra)

    def bump(self, now_ms: int | None = None) -> None:
        """``DataVersion.nextVersion()``: new timestamp, counter + 1."""
        self.timestamp = epoch_ms() if now_ms is None else now_ms
        self.counter += 1


@dataclass
class TopicConfig:
    """One ``topicConfigTable`` entry (defaults are ``TopicConfig``'s: 16/16 queues, perm 6 = R+W)."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, Any] | None = None  # 5.x
    extra: dict[str, Any] = field(default_factory=dict)

    _KNOWN = ("topicName", "readQueueNums", "writeQueueNums", "perm", "topicFilterType",
              "topicSysFlag", "order", "attributes")

    @classmethod
    def from_json(cls, data: Any, name: str | None = None) -> TopicConfig:
        data = _as_object(data, f"topic {name}")
        where = f"topic {data.get('topicName', name)}"
        attributes = data.get("attributes")
        return cls(
            topic_name=str(data.get("topicName", name)),
            read_queue_nums=_as_int(data.get("readQueueNums", 16), f"{where}.readQueueNums"),
            write_queue_nums=_as_int(data.get("writeQueueNums", 16), f"{where}.writeQueueNums"),
            perm=_as_int(data.get("perm", 6), f"{where}.perm"),
            topic_filter_type=str(data.get("topicFilterType", "SINGLE_TAG")),
            topic_sys_flag=_as_int(data.get("topicSysFlag", 0), f"{where}.topicSysFlag"),
            order=_as_bool(data.get("order", False), f"{where}.order"),
            attributes=None if attributes is None else dict(_as_object(attributes, f"{where}.attributes")),
            extra=_split_known(data, cls._KNOWN),
        )

    def to_json(self) -> JsonObject:
        return _bean({
            "attributes": self.attributes,
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }, self.extra)

    @property
    def readable(self) -> bool:
        return bool(self.perm & 4)

    @property
    def writable(self) -> bool:
        return bool(self.perm & 2)


@dataclass
class SubscriptionGroupConfig:
    """One consumer group; defaults are ``SubscriptionGroupConfig``'s (16 retries, 1 retry queue)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # 5.x: groupSysFlag, consumeTimeoutMinute, ...

    _FIELDS = (  # (json name, attribute, kind)
        ("brokerId", "broker_id", int),
        ("consumeBroadcastEnable", "consume_broadcast_enable", bool),
        ("consumeEnable", "consume_enable", bool),
        ("consumeFromMinEnable", "consume_from_min_enable", bool),
        ("notifyConsumerIdsChangedEnable", "notify_consumer_ids_changed_enable", bool),
        ("retryMaxTimes", "retry_max_times", int),
        ("retryQueueNums", "retry_queue_nums", int),
        ("whichBrokerWhenConsumeSlowly", "which_broker_when_consume_slowly", int),
    )

    @classmethod
    def from_json(cls, data: Any, name: str | None = None) -> SubscriptionGroupConfig:
        data = _as_object(data, f"group {name}")
        group = str(data.get("groupName", name))
        values: dict[str, Any] = {}
        for json_name, attr, kind in cls._FIELDS:
            if json_name in data:
                convert = _as_int if kind is int else _as_bool
                values[attr] = convert(data[json_name], f"group {group}.{json_name}")
        known = ("groupName",) + tuple(f[0] for f in cls._FIELDS)
        return cls(group_name=group, extra=_split_known(data, known), **values)

    def to_json(self) -> JsonObject:
        fields = {json_name: getattr(self, attr) for json_name, attr, _ in self._FIELDS}
        fields["groupName"] = self.group_name
        return _bean(fields, self.extra)


class _PersistentTable:
    """load/save for the table dataclasses below (each provides ``from_json``/``to_json``)."""

    @classmethod
    def load(cls, path: str | os.PathLike) -> Any:
        """Read ``path`` (or its .bak); nothing there gives an empty table."""
        loaded = read_config_json(path)
        if loaded is None:
            return cls()
        try:
            return cls.from_json(loaded.data)  # type: ignore[attr-defined]
        except ConfigFileError as exc:
            raise ConfigFileError(f"{loaded.source}: {exc}") from exc

    def save(self, path: str | os.PathLike, *, fsync: bool = True) -> None:
        """Write in fastjson layout with Apache's .tmp/.bak persistence."""
        write_config_json(path, self.to_json(), fsync=fsync)  # type: ignore[attr-defined]


@dataclass
class TopicConfigTable(_PersistentTable):
    """``topics.json``: every topic the broker knows, with the table's data version."""

    topics: dict[str, TopicConfig] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)
    extra: dict[str, Any] = field(default_factory=dict)  # 5.x: topicQueueMapping*, mappingDataVersion

    _KNOWN = ("topicConfigTable", "dataVersion")

    @classmethod
    def from_json(cls, data: Mapping[Any, Any]) -> TopicConfigTable:
        table = _as_object(data.get("topicConfigTable"), "topicConfigTable")
        return cls(
            topics={str(name): TopicConfig.from_json(cfg, str(name)) for name, cfg in table.items()},
            data_version=DataVersion.from_json(data.get("dataVersion")),
            extra=_split_known(data, cls._KNOWN),
        )

    def to_json(self) -> JsonObject:
        return _bean({
            "dataVersion": self.data_version.to_json(),
            "topicConfigTable": {name: cfg.to_json() for name, cfg in self.topics.items()},
        }, self.extra)

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def put(self, config: TopicConfig) -> None:
        """Add or replace a topic and bump the data version, as ``TopicConfigManager`` does."""
        self.topics[config.topic_name] = config
        self.data_version.bump()

    def __contains__(self, topic: object) -> bool:
        return topic in self.topics

    def __len__(self) -> int:
        return len(self.topics)


@dataclass
class SubscriptionGroupTable(_PersistentTable):
    """``subscriptionGroup.json``: consumer group settings, with the table's data version."""

    groups: dict[str, SubscriptionGroupConfig] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)
    extra: dict[str, Any] = field(default_factory=dict)  # 5.x: forbiddenTable

    _KNOWN = ("subscriptionGroupTable", "dataVersion")

    @classmethod
    def from_json(cls, data: Mapping[Any, Any]) -> SubscriptionGroupTable:
        table = _as_object(data.get("subscriptionGroupTable"), "subscriptionGroupTable")
        return cls(
            groups={str(n): SubscriptionGroupConfig.from_json(cfg, str(n)) for n, cfg in table.items()},
            data_version=DataVersion.from_json(data.get("dataVersion")),
            extra=_split_known(data, cls._KNOWN),
        )

    def to_json(self) -> JsonObject:
        return _bean({
            "dataVersion": self.data_version.to_json(),
            "subscriptionGroupTable": {name: cfg.to_json() for name, cfg in self.groups.items()},
        }, self.extra)

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self.groups.get(group)

    def put(self, config: SubscriptionGroupConfig) -> None:
        self.groups[config.group_name] = config
        self.data_version.bump()

    def __contains__(self, group: object) -> bool:
        return group in self.groups

    def __len__(self) -> int:
        return len(self.groups)


def split_topic_group(key: str) -> tuple[str, str] | None:
    """``topic@group`` -> (topic, group); None for a key Apache would also skip (not exactly one ``@``)."""
    parts = key.split(TOPIC_GROUP_SEPARATOR)
    return (parts[0], parts[1]) if len(parts) == 2 else None


def topic_group_key(topic: str, group: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


@dataclass
class ConsumerOffsetTable(_PersistentTable):
    """``consumerOffset.json``: ``topic@group`` -> {queueId: next offset to consume}."""

    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    data_version: DataVersion | None = None  # 5.x only
    extra: dict[str, Any] = field(default_factory=dict)  # 5.x: groupTopicMap (derived), ...

    _KNOWN = ("offsetTable", "dataVersion")
    _GROUP_TOPIC_MAP = "groupTopicMap"

    @classmethod
    def from_json(cls, data: Mapping[Any, Any]) -> ConsumerOffsetTable:
        table = _as_object(data.get("offsetTable"), "offsetTable")
        version = data.get("dataVersion")
        return cls(
            offsets={str(key): _int_map(queues, f"offsetTable[{key}]") for key, queues in table.items()},
            data_version=None if version is None else DataVersion.from_json(version),
            extra=_split_known(data, cls._KNOWN),
        )

    def to_json(self) -> JsonObject:
        extra = dict(self.extra)
        if self._GROUP_TOPIC_MAP in extra:  # a derived getter in 5.x: keep it in step with the table
            extra[self._GROUP_TOPIC_MAP] = self._group_topic_map(extra[self._GROUP_TOPIC_MAP])
        return _bean({
            "dataVersion": None if self.data_version is None else self.data_version.to_json(),
            "offsetTable": {key: dict(queues) for key, queues in self.offsets.items()},
        }, extra)

    # --- queries ----------------------------------------------------------------------------------
    def offsets_for(self, group: str, topic: str) -> dict[int, int]:
        """Committed offsets of ``group`` on ``topic`` (a copy; empty if it never committed)."""
        return dict(self.offsets.get(topic_group_key(topic, group), {}))

    def groups(self) -> list[str]:
        """Every group with at least one committed topic, sorted."""
        return sorted({pair[1] for pair in map(split_topic_group, self.offsets) if pair})

    def topics_of(self, group: str) -> list[str]:
        return sorted(pair[0] for pair in map(split_topic_group, self.offsets) if pair and pair[1] == group)

    def entries(self) -> Iterator[tuple[str, str, int, int]]:
        """(topic, group, queue_id, offset) for every well-formed key, in table order."""
        for key, queues in self.offsets.items():
            pair = split_topic_group(key)
            if pair is None:
                log.warning("offsetTable key %r is not topic@group; skipped", key)
                continue
            for queue_id, offset in queues.items():
                yield pair[0], pair[1], queue_id, offset

    # --- updates ----------------------------------------------------------------------------------
    def set_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """``commitOffset``: overwrite one queue's offset."""
        self.offsets.setdefault(topic_group_key(topic, group), {})[int(queue_id)] = int(offset)

    def update(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Overwrite the given queues, keep the others."""
        for queue_id, offset in offsets.items():
            self.set_offset(group, topic, queue_id, offset)

    def remove(self, group: str, topic: str) -> bool:
        return self.offsets.pop(topic_group_key(topic, group), None) is not None

    def __len__(self) -> int:
        return len(self.offsets)

    def _group_topic_map(self, previous: Any) -> Any:
        """Rebuild 5.x's ``groupTopicMap``; reuse the old value (and its order) if still accurate."""
        derived: dict[str, list[str]] = {}
        for pair in map(split_topic_group, self.offsets):
            if pair and pair[0] not in derived.setdefault(pair[1], []):
                derived[pair[1]].append(pair[0])
        if isinstance(previous, dict) and {g: set(t) for g, t in previous.items()} == {
                g: set(t) for g, t in derived.items()}:
            return previous
        return derived


@dataclass
class DelayOffsetTable(_PersistentTable):
    """``delayOffset.json``: delay level (1-based) -> next offset in ``SCHEDULE_TOPIC_XXXX`` queue level-1."""

    offsets: dict[int, int] = field(default_factory=dict)
    data_version: DataVersion | None = None  # 5.x only
    extra: dict[str, Any] = field(default_factory=dict)

    _KNOWN = ("offsetTable", "dataVersion")

    @classmethod
    def from_json(cls, data: Mapping[Any, Any]) -> DelayOffsetTable:
        version = data.get("dataVersion")
        return cls(
            offsets=_int_map(data.get("offsetTable"), "offsetTable"),
            data_version=None if version is None else DataVersion.from_json(version),
            extra=_split_known(data, cls._KNOWN),
        )

    def to_json(self) -> JsonObject:
        return _bean({
            "dataVersion": None if self.data_version is None else self.data_version.to_json(),
            "offsetTable": dict(self.offsets),
        }, self.extra)

    def offset_for(self, level: int) -> int | None:
        return self.offsets.get(level)

    def set_offset(self, level: int, offset: int) -> None:
        self.offsets[int(level)] = int(offset)

    def __len__(self) -> int:
        return len(self.offsets)


# =====================================================================================================
# A store's whole config directory
# =====================================================================================================
def config_path(store_dir: str | os.PathLike, file_name: str) -> Path:
    """``<store>/config/<file_name>`` (``BrokerPathConfigHelper`` / ``StorePathConfigHelper``)."""
    return Path(store_dir) / CONFIG_DIR / file_name


def load_topic_fences(store_dir: str | os.PathLike) -> dict[str, int]:
    """Deleted topics' fences (``DELETED_TOPICS_FILE``): topic -> the commitlog offset at deletion;
    empty when the store never had a topic deleted. Raises :class:`ConfigFileError` when unreadable."""
    loaded = read_config_json(config_path(store_dir, DELETED_TOPICS_FILE))
    if loaded is None:
        return {}
    return topic_fences_from(loaded.data, loaded.source)


def topic_fences_from(data: object, source: str | os.PathLike) -> dict[str, int]:
    """The fences of a parsed ``DELETED_TOPICS_FILE`` (also for a store read through a URI)."""
    fences = {}
    for topic, fence in _as_object(data, DELETED_TOPICS_FILE).items():
        if not isinstance(fence, int) or isinstance(fence, bool) or fence < 0:
            raise ConfigFileError(f"{source}: fence of {topic!r} is not a commitlog offset: {fence!r}")
        fences[str(topic)] = fence
    return fences


def save_topic_fences(store_dir: str | os.PathLike, fences: Mapping[str, int], *, fsync: bool = True) -> None:
    write_config_json(config_path(store_dir, DELETED_TOPICS_FILE), dict(sorted(fences.items())), fsync=fsync)


@dataclass
class StoreConfig:
    """The four metadata tables of one store."""

    topics: TopicConfigTable
    subscription_groups: SubscriptionGroupTable
    consumer_offsets: ConsumerOffsetTable
    delay_offsets: DelayOffsetTable

    def save(self, store_dir: str | os.PathLike, *, fsync: bool = True) -> None:
        """Persist all four files (each with its own .tmp/.bak dance)."""
        self.topics.save(config_path(store_dir, TOPICS_FILE), fsync=fsync)
        self.subscription_groups.save(config_path(store_dir, SUBSCRIPTION_GROUP_FILE), fsync=fsync)
        self.consumer_offsets.save(config_path(store_dir, CONSUMER_OFFSET_FILE), fsync=fsync)
        self.delay_offsets.save(config_path(store_dir, DELAY_OFFSET_FILE), fsync=fsync)


def load_store_config(store_dir: str | os.PathLike) -> StoreConfig:
    """All four tables of a store; a missing file gives an empty table, a broken one an error."""
    return StoreConfig(
        topics=TopicConfigTable.load(config_path(store_dir, TOPICS_FILE)),
        subscription_groups=SubscriptionGroupTable.load(config_path(store_dir, SUBSCRIPTION_GROUP_FILE)),
        consumer_offsets=ConsumerOffsetTable.load(config_path(store_dir, CONSUMER_OFFSET_FILE)),
        delay_offsets=DelayOffsetTable.load(config_path(store_dir, DELAY_OFFSET_FILE)),
    )
