"""``RemotingCommand``: one request or response of the RocketMQ remoting protocol.

Wire layout (remoting-protocol.md sections 1-4): ``int total | int (type << 24 | headerLen) |
header | body``. The header is JSON (type 0) from every client we care about, or Java's optional
binary "ROCKETMQ" layout (type 1). We always *write* JSON because the C++ client in the
``rocketmq`` wheel does not mask the type byte and cannot read anything else (section 13.1).

The interop traps this module absorbs so nobody else has to:

* extFields values arrive as JSON numbers *or* strings (C++ mixes them per field) and are
  normalised to ``str`` on decode — Java holds them as ``Map<String,String>`` too;
* extFields are always written, every value as a JSON string: the C++ client ignores numbers and
  crashes (SIGSEGV) on a SUCCESS response to SEND/QUERY_CONSUMER_OFFSET/GET_MAX_OFFSET without an
  ``extFields`` object (sections 4 and 13.2-13.3);
* the C++ header ends with a newline that is counted in the header length.

Every decoding problem raises :class:`ProtocolError` with a reason a log reader can act on; a
bare ``KeyError``/``struct.error`` escaping from here would be a bug (the fuzz test checks that).
"""

from __future__ import annotations

import itertools
import json
import re
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from broker.remoting.codes import DEFAULT_VERSION, LanguageCode, ResponseCode
from broker.remoting.json_header import dumps_sorted, fast_loads, loads_flat_header

RESPONSE_FLAG = 0x1  # bit 0: this command is a response
ONEWAY_FLAG = 0x2  # bit 1: the sender does not want an answer

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
SERIALIZE_TYPE_NAMES = {SERIALIZE_JSON: "JSON", SERIALIZE_ROCKETMQ: "ROCKETMQ"}

LANGUAGE = "PYTHON"  # what we call ourselves; Java's LanguageCode has it, so Java peers parse it

_LENGTH = struct.Struct(">i")
_BINARY_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_HEADER_LENGTH_MASK = 0xFFFFFF
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,40}")  # long enough for "out of range", short enough to be cheap


class ProtocolError(ValueError):
    """A frame or header that cannot be understood; ``detail`` says exactly why."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class HeaderError(ProtocolError):
    """A readable command whose custom header (extFields) lacks or garbles a field."""


# =====================================================================================================
# Opaque (request id) allocation
# =====================================================================================================
_opaque_counter = itertools.count()
_opaque_lock = threading.Lock()


def next_opaque() -> int:
    """Process-wide request id: 0, 1, 2, … with the sign bit masked like the clients do.

    A lock because the sync client wrapper and user threads may build requests concurrently;
    ``itertools.count`` alone is not documented as thread-safe.
    """
    with _opaque_lock:
        return next(_opaque_counter) & 0x7FFFFFFF


# =====================================================================================================
# extFields value handling
# =====================================================================================================
def ext_value_to_str(key: str, value: Any) -> str | None:
    """Normalise one extFields value to the string Java would hold; ``None`` means "leave out".

    Booleans become ``true``/``false`` (``Boolean.toString``), numbers their decimal text (what
    fastjson does when it reads a JSON number into a ``Map<String,String>``). Nested JSON is kept
    as compact JSON text rather than rejected, which is also what fastjson would do.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # 1.5 -> "1.5", like fastjson's text of the number
    if isinstance(value, (dict, list)):
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"extFields[{key!r}]: cannot be written as JSON: {exc}") from None
    raise ProtocolError(f"extFields[{key!r}]: unsupported value type {type(value).__name__}")


def normalise_ext(ext: Mapping[Any, Any] | None) -> dict[str, str]:
    """A copy of ``ext`` with ``str`` keys and ``str`` values, ``None`` values dropped."""
    result: dict[str, str] = {}
    if not ext:
        return result
    if type(ext) is dict:  # nearly always already str → str (decoded JSON, our own replies): copy it
        for key, value in ext.items():
            if type(key) is not str or type(value) is not str:
                break
        else:
            return dict(ext)
    for key, value in ext.items():
        text = ext_value_to_str(str(key), value)
        if text is not None:
            result[str(key)] = text
    return result


# =====================================================================================================
# The command
# =====================================================================================================
@dataclass(eq=True)
class RemotingCommand:
    """One remoting frame, request or response (``flag`` bit 0)."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: str = LANGUAGE
    version: int = DEFAULT_VERSION
    serialize_type: int = SERIALIZE_JSON

    # --- construction -----------------------------------------------------------------------------
    @classmethod
    def request(cls, code: int, ext_fields: Mapping[str, Any] | None = None, body: bytes = b"",
                oneway: bool = False) -> RemotingCommand:
        """A new request with the next process-wide opaque; values of ``ext_fields`` become str."""
        return cls(code=int(code), opaque=next_opaque(), flag=ONEWAY_FLAG if oneway else 0,
                   ext_fields=normalise_ext(ext_fields), body=bytes(body))

    def response(self, code: int = ResponseCode.SUCCESS, remark: str | None = None,
                 ext_fields: Mapping[str, Any] | None = None, body: bytes = b"") -> RemotingCommand:
        """The reply to this request: same opaque, response flag, JSON, every ext value a str.

        ``ext_fields`` is always present in the encoded reply (``{}`` at least) because the C++
        client dereferences it unconditionally on SUCCESS.
        """
        return RemotingCommand(code=int(code), opaque=self.opaque, flag=RESPONSE_FLAG, remark=remark,
                               ext_fields=normalise_ext(ext_fields), body=bytes(body))

    # --- flags ------------------------------------------------------------------------------------
    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & ONEWAY_FLAG)

    def mark_oneway(self) -> None:
        self.flag |= ONEWAY_FLAG

    # --- encoding ---------------------------------------------------------------------------------
    def header_json(self) -> dict[str, Any]:
        """The JSON header object as Java's fastjson would write it (nulls left out)."""
        return _header_json(self.code, self.opaque, self.flag, self.remark, self.ext_fields, self.language,
                            self.version)

    def encode_json_header(self) -> bytes:
        """Compact, key-sorted UTF-8 JSON (the layout of both fastjson and jsoncpp's writer)."""
        return _encode_json_header(self.header_json())

    def encode_binary_header(self) -> bytes:
        """Java's ROCKETMQ binary header (section 3). Never send this to the C++ client.

        Java writes the code as a ``short``; codes above 32767 (5.x POP codes) are truncated there
        too, so this mirrors it rather than failing.
        """
        try:
            language = LanguageCode[self.language].value
        except KeyError:
            language = LanguageCode.OTHER.value
        code16 = _to_signed(int(self.code) & 0xFFFF, 16)
        version16 = _to_signed(int(self.version) & 0xFFFF, 16)
        parts = [_BINARY_FIXED.pack(code16, language, version16, _to_signed(self.opaque & 0xFFFFFFFF, 32),
                                    _to_signed(self.flag & 0xFFFFFFFF, 32))]
        remark = (self.remark or "").encode("utf-8")
        parts.append(_LENGTH.pack(len(remark)))
        parts.append(remark)
        entries = bytearray()
        for key, value in normalise_ext(self.ext_fields).items():
            k, v = key.encode("utf-8"), value.encode("utf-8")
            if not k or not v:
                continue  # Java skips null keys/values; zero length would decode back as null anyway
            if len(k) > 0x7FFF:
                raise ProtocolError(f"extFields key of {len(k)} bytes does not fit a short length")
            entries += struct.pack(">h", len(k)) + k + _LENGTH.pack(len(v)) + v
        parts.append(_LENGTH.pack(len(entries)))
        parts.append(bytes(entries))
        return b"".join(parts)

    def encode(self) -> bytes:
        """The whole frame, including the leading 4-byte total length."""
        if self.serialize_type == SERIALIZE_ROCKETMQ:
            header = self.encode_binary_header()
        elif self.serialize_type == SERIALIZE_JSON:
            header = self.encode_json_header()
        else:
            raise ProtocolError(f"unknown serialize type {self.serialize_type}")
        return _frame(self.serialize_type, header, self.body)

    # --- decoding ---------------------------------------------------------------------------------
    @classmethod
    def decode(cls, payload: bytes | bytearray | memoryview) -> RemotingCommand:
        """Parse the ``N`` bytes that follow a frame's length prefix."""
        payload = bytes(payload)
        if len(payload) < 4:
            raise ProtocolError(f"frame of {len(payload)} bytes is too short for the header-length word")
        word = _LENGTH.unpack_from(payload, 0)[0] & 0xFFFFFFFF
        serialize_type, header_length = word >> 24, word & _HEADER_LENGTH_MASK
        if header_length > len(payload) - 4:
            raise ProtocolError(f"header length {header_length} exceeds the {len(payload) - 4} bytes "
                                "left in the frame")
        header = payload[4:4 + header_length]
        body = payload[4 + header_length:]
        if serialize_type == SERIALIZE_JSON:
            cmd = _flat_json_command(header, body)
            if cmd is not None:
                return cmd
            cmd = _decode_json_header(header)
        elif serialize_type == SERIALIZE_ROCKETMQ:
            cmd = _decode_binary_header(header)
        else:
            raise ProtocolError(f"unknown serialize type {serialize_type} in the header-length word")
        cmd.body = body
        return cmd

    # --- misc -------------------------------------------------------------------------------------
    def describe(self) -> str:
        """Short one-line form for logs (never the body)."""
        kind = "response" if self.is_response else ("oneway" if self.is_oneway else "request")
        remark = f" remark={self.remark!r}" if self.remark else ""
        return f"{kind} code={self.code} opaque={self.opaque}{remark} ext={len(self.ext_fields)} body={len(self.body)}B"

    def __repr__(self) -> str:
        return (f"RemotingCommand(code={self.code}, opaque={self.opaque}, flag={self.flag}, remark={self.remark!r}, "
                f"ext_fields={self.ext_fields!r}, body=<{len(self.body)} bytes>, language={self.language!r}, "
                f"version={self.version}, serialize_type={self.serialize_type})")


def _header_json(code: int, opaque: int, flag: int, remark: str | None, ext: Mapping[Any, Any] | None,
                 language: str, version: int) -> dict[str, Any]:
    header: dict[str, Any] = {
        "code": int(code),
        "extFields": normalise_ext(ext),
        "flag": int(flag),
        "language": str(language),
        "opaque": int(opaque),
        "serializeTypeCurrentRPC": "JSON",
        "version": int(version),
    }
    if remark is not None:
        header["remark"] = str(remark)
    return header


def _encode_json_header(header: dict[str, Any]) -> bytes:
    try:
        return dumps_sorted(header)
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"header text cannot be encoded as UTF-8 at char {exc.start}") from None


def _frame(serialize_type: int, header: bytes, body: bytes) -> bytes:
    """The whole frame, including the leading 4-byte total length."""
    if len(header) > _HEADER_LENGTH_MASK:
        raise ProtocolError(f"header of {len(header)} bytes exceeds the 24-bit length field")
    total = 4 + len(header) + len(body)
    if total > _INT32_MAX:
        raise ProtocolError(f"frame of {total} bytes exceeds the 32-bit length field")
    return b"".join((_LENGTH.pack(total), _LENGTH.pack((serialize_type << 24) | len(header)), header, body))


def response_frame(opaque: int, code: int, remark: str | None = None, ext: Mapping[Any, Any] | None = None,
                   body: bytes = b"") -> bytes:
    """The bytes of ``request.response(code, remark, ext, body).encode()`` for a request of that
    ``opaque``, without building the command (a network process answers every send with one).
    Raises ProtocolError as ``encode`` does."""
    if remark is None and not body and type(ext) is dict:
        header = _plain_reply_header(int(code), int(opaque), ext)
        if header is not None and len(header) <= _HEADER_LENGTH_MASK:
            return b"".join((_LENGTH.pack(4 + len(header)), _LENGTH.pack(len(header)), header))
    header = _header_json(code, opaque, RESPONSE_FLAG, remark, ext, LANGUAGE, DEFAULT_VERSION)
    return _frame(SERIALIZE_JSON, _encode_json_header(header), bytes(body))


# a reply's JSON header around its code, extFields and opaque: the keys _header_json writes, in
# sorted order, for a reply without remark
_REPLY_HEAD = b'{"code":'
_REPLY_EXT = b',"extFields":'
_REPLY_OPAQUE = (',"flag":%d,"language":%s,"opaque":' % (RESPONSE_FLAG, json.dumps(LANGUAGE))).encode()
_REPLY_TAIL = (',"serializeTypeCurrentRPC":"JSON","version":%d}' % DEFAULT_VERSION).encode()


def _plain_reply_header(code: int, opaque: int, ext: dict) -> bytes | None:
    """The JSON header of a reply without remark whose extFields map str to str (a SEND_OK), put
    together around orjson's text of the map — the bytes ``_encode_json_header`` writes for it
    (sorted keys, compact; tested equal); None for anything else (lone surrogates included)."""
    for key, value in ext.items():
        if type(key) is not str or type(value) is not str:
            return None
    try:
        text = orjson.dumps(ext, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return None
    return b"".join((_REPLY_HEAD, b"%d" % code, _REPLY_EXT, text, _REPLY_OPAQUE, b"%d" % opaque, _REPLY_TAIL))


def _to_signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


# =====================================================================================================
# Header decoders
# =====================================================================================================
def _json_int(header: Mapping[str, Any], key: str, default: int | None) -> int:
    value = header.get(key)
    if value is None:
        if default is None:
            raise ProtocolError(f"header has no {key!r}")
        return default
    if isinstance(value, bool):
        raise ProtocolError(f"header {key!r} is a boolean, not an integer")
    if isinstance(value, int):
        result = value
    elif isinstance(value, float) and value.is_integer():
        result = int(value)
    elif isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
        result = int(value.strip())  # fastjson coerces numeric strings into int fields
    else:
        raise ProtocolError(f"header {key!r} is not an integer: {value!r:.60}")
    if not _INT32_MIN <= result <= _INT32_MAX:
        raise ProtocolError(f"header {key!r} = {result} does not fit a 32-bit int")
    return result


def _reject_constant(name: str) -> Any:
    """``NaN``/``Infinity``/``-Infinity`` are not JSON (Python's parser accepts them; Java's clients never
    write them), so a header holding one is malformed, not a number."""
    raise ValueError(f"{name} is not a JSON value")


def _flat_json_command(raw: bytes, body: bytes) -> RemotingCommand | None:
    """What ``_decode_json_header`` gives for a flat header (:func:`loads_flat_header`) whose
    numbers fit their fields and whose language and remark are text: the command built without
    the general path's per-field coercions (one per received frame). None: not that header, and the
    general path decides, errors included."""
    header = loads_flat_header(raw)
    if header is None:
        return None
    get = header.get
    code, opaque, flag, version = get("code"), get("opaque", 0), get("flag", 0), get("version", 0)
    language, remark, ext = get("language", "UNKNOWN"), get("remark"), get("extFields")
    if type(code) is not int or type(opaque) is not int or type(flag) is not int or type(version) is not int \
            or not (_INT32_MIN <= code <= _INT32_MAX and _INT32_MIN <= opaque <= _INT32_MAX
                    and _INT32_MIN <= flag <= _INT32_MAX and _INT32_MIN <= version <= _INT32_MAX):
        return None
    if language is None:
        language = "UNKNOWN"
    elif type(language) is not str or type(remark) is int:
        return None
    if ext is None:
        ext = {}
    elif type(ext) is not dict:  # flat: a dict is a fresh one of str values, which normalise_ext would copy
        return None
    return RemotingCommand(code, opaque, flag, remark, ext, body, language, version, SERIALIZE_JSON)


def _decode_json_header(raw: bytes) -> RemotingCommand:
    header = fast_loads(raw)  # None: not sure, so the standard library parses it (and words the error)
    if header is None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"JSON header is not valid UTF-8 at byte {exc.start}") from None
        try:
            header = json.loads(text, parse_constant=_reject_constant)  # tolerates the C++ client's trailing newline
        except RecursionError:
            raise ProtocolError("JSON header nests too deeply") from None
        except ValueError as exc:  # JSONDecodeError, and int-too-long conversions
            raise ProtocolError(f"JSON header does not parse: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"JSON header is a {type(header).__name__}, not an object")
    if "code" not in header:
        raise ProtocolError("JSON header has no 'code'")

    language = header.get("language")
    if isinstance(language, int) and not isinstance(language, bool):  # seen as a number from odd peers
        try:
            language = LanguageCode(language).name
        except ValueError:
            language = str(language)
    elif language is None:
        language = "UNKNOWN"
    elif not isinstance(language, str):
        raise ProtocolError(f"header 'language' is not a string: {language!r:.60}")

    remark = header.get("remark")
    if remark is not None and not isinstance(remark, str):
        if isinstance(remark, (int, float)) and not isinstance(remark, bool):
            remark = str(remark)
        else:
            raise ProtocolError(f"header 'remark' is not a string: {remark!r:.60}")

    ext_raw = header.get("extFields")
    if ext_raw is None:
        ext: dict[str, str] = {}
    elif isinstance(ext_raw, dict):
        ext = normalise_ext(ext_raw)
    else:
        raise ProtocolError(f"header 'extFields' is a {type(ext_raw).__name__}, not an object")

    return RemotingCommand(
        code=_json_int(header, "code", None),
        opaque=_json_int(header, "opaque", 0),
        flag=_json_int(header, "flag", 0),
        remark=remark,
        ext_fields=ext,
        language=language,
        version=_json_int(header, "version", 0),
        serialize_type=SERIALIZE_JSON,
    )


class _Reader:
    """Bounds-checked big-endian reads over the binary header."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int, what: str) -> bytes:
        if size < 0:
            raise ProtocolError(f"binary header: negative length {size} for {what}")
        if self.pos + size > len(self.data):
            raise ProtocolError(f"binary header: {what} needs {size} bytes at offset {self.pos}, "
                                f"only {len(self.data) - self.pos} left")
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[Any, ...]:
        return fmt.unpack(self.take(fmt.size, what))

    def text(self, size: int, what: str) -> str:
        raw = self.take(size, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"binary header: {what} is not valid UTF-8 at byte {exc.start}") from None


_SHORT = struct.Struct(">h")


def _decode_binary_header(raw: bytes) -> RemotingCommand:
    reader = _Reader(raw)
    code, language_byte, version, opaque, flag = reader.unpack(_BINARY_FIXED, "fixed fields")
    (remark_length,) = reader.unpack(_LENGTH, "remark length")
    remark = reader.text(remark_length, "remark") if remark_length else None
    (ext_length,) = reader.unpack(_LENGTH, "extFields length")
    ext_reader = _Reader(reader.take(ext_length, "extFields"))
    ext: dict[str, str] = {}
    while ext_reader.pos < len(ext_reader.data):
        (key_length,) = ext_reader.unpack(_SHORT, "extFields key length")
        key = ext_reader.text(key_length, "extFields key")
        (value_length,) = ext_reader.unpack(_LENGTH, f"extFields[{key!r}] value length")
        value = ext_reader.text(value_length, f"extFields[{key!r}] value")
        if key and value:  # zero length decodes as null in Java; a null entry is not kept
            ext[key] = value
    if reader.pos != len(raw):
        raise ProtocolError(f"binary header: {len(raw) - reader.pos} unexpected trailing bytes")
    try:
        language = LanguageCode(language_byte).name
    except ValueError:
        language = str(language_byte)
    return RemotingCommand(code=code, opaque=opaque, flag=flag, remark=remark, ext_fields=ext,
                           language=language, version=version, serialize_type=SERIALIZE_ROCKETMQ)


# =====================================================================================================
# Typed access to extFields
# =====================================================================================================
_TRUE_WORDS = frozenset({"true", "1"})


def _ext_map(source: RemotingCommand | Mapping[str, Any]) -> Mapping[str, Any]:
    return source.ext_fields if isinstance(source, RemotingCommand) else source


def ext_str(source: RemotingCommand | Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    value = _ext_map(source).get(key)
    return default if value is None else ext_value_to_str(key, value)


def parse_int(key: str, value: Any, *, bits: int = 64) -> int:
    """Java ``Integer.parseInt``/``Long.parseLong`` on one extFields value, as a HeaderError.

    Stricter than Python's ``int()`` on purpose: no surrounding blanks, no ``1_000`` — a Java broker
    would reject those too, and a typed error beats a silently different number.
    """
    if type(value) is str and value.isdigit() and value.isascii() and len(value) <= 18:
        number = int(value)  # the common case, decided without the pattern (one header per message)
    elif isinstance(value, bool):
        raise HeaderError(f"field {key}: {value!r} is not an integer")
    elif isinstance(value, int):
        number = value
    else:
        text = value if isinstance(value, str) else ext_value_to_str(key, value)
        if not _INTEGER_TEXT.fullmatch(text or ""):
            raise HeaderError(f"field {key}: {text!r} is not an integer")
        number = int(text)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not low <= number <= high:
        raise HeaderError(f"field {key}: {number} is out of range for a {bits}-bit integer")
    return number


def parse_bool(value: Any) -> bool:
    """``true``/``1`` in any case (or a real ``True``/non-zero number) is true, anything else false.

    Java's ``Boolean.parseBoolean`` would read the C++ client's ``"1"`` as false (section 4); we
    accept both spellings so its ``batch:"1"`` really means a batch.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    return str(value).strip().lower() in _TRUE_WORDS


def ext_int(source: RemotingCommand | Mapping[str, Any], key: str, default: int | None = None, *,
            bits: int = 64) -> int | None:
    """The integer at ``key``; ``default`` when it is missing or empty, HeaderError when garbled."""
    value = _ext_map(source).get(key)
    if value is None or value == "":
        return default
    return parse_int(key, value, bits=bits)


def ext_bool(source: RemotingCommand | Mapping[str, Any], key: str, default: bool | None = None) -> bool | None:
    """The boolean at ``key`` (``true``/``1`` case-insensitive); ``default`` when missing/empty."""
    value = _ext_map(source).get(key)
    if value is None or value == "":
        return default
    return parse_bool(value)
