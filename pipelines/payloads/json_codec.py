"""``format = "json"``: bodies that are JSON objects, typed by a JSON Schema.

Schema mapping (:func:`json_schema_to_arrow`): ``object`` with ``properties`` → struct (the top
level: the table's columns, in declaration order), ``array`` with ``items`` → list, ``string`` →
string (``format: date-time`` → ``timestamp[us, UTC]``), ``integer`` → int64, ``number`` → float64,
``boolean`` → bool; ``["x", "null"]`` and ``anyOf``/``oneOf`` of one type and ``null`` → that type;
``["integer", "number"]`` → float64; ``enum``/``const`` of strings (integers) → string (int64);
local ``$ref`` (``#/$defs/…``, ``#/definitions/…``) are followed. Every column is nullable (a
missing or null value is a null); a field in ``required`` whose type does not allow ``null`` makes
a row where it is missing or null a failure. ``description`` becomes the column's comment. Other
keywords (``minimum``, ``pattern``, ``additionalProperties``, …) are not enforced: this types
payloads, it does not validate business rules.

Decoding (:meth:`JsonCodec.decode`): one ``pyarrow.json.read_json`` with the explicit schema over
the newline-joined bodies (joined by an Arrow kernel, no Python per row). What cannot go into that
batch is handled first: invalid UTF-8 and empty bodies are failures; a body with a raw line break
(pretty-printed JSON) is parsed and re-serialised on one line. When the batch parse fails, or
yields a different number of rows than bodies (two objects on one line), the batch is bisected so
the good rows are still typed, and each bad row gets a reason from a per-row look at it
(``invalid JSON at byte 17: Expecting ',' delimiter``, ``field amount: expected number, got string
"12"``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from pipelines.payloads.codec import Decoded, as_binary, utf8_failures
from pipelines.payloads.errors import PayloadSchemaError
from schemas.contract import DESCRIPTION_KEY

TIMESTAMP = pa.timestamp("us", tz="UTC")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_MIN_BLOCK = 1 << 20
_FAN_OUT = 8  # parts a failing chunk is split into
_ARROW_COLUMN_ERROR = re.compile(r"Column\(/?([^)]*)\) (.*?)(?: in row \d+)?$")
_JSON_NAMES = {"integer": pa.int64(), "number": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}


# ---- JSON Schema → Arrow ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class JsonLayout:
    """What a JSON Schema says in Arrow terms: the columns, and the paths (field names from the
    top) of required fields that may not be null, checked along chains of objects."""

    schema: pa.Schema
    required: tuple[tuple[str, ...], ...] = ()


def json_schema_to_arrow(document: dict) -> JsonLayout:
    """The Arrow columns of a JSON Schema whose top level is an object (see the module doc);
    :class:`PayloadSchemaError` naming the field for what cannot be mapped."""
    if not isinstance(document, dict):
        raise PayloadSchemaError("a JSON Schema is a JSON object")
    required: list[tuple[str, ...]] = []
    top = _to_arrow(document, (), document, required, frozenset(), top=True)
    if not pa.types.is_struct(top.type):
        raise PayloadSchemaError(f"the top level must be an object with properties, not {_describe_node(document)}")
    return JsonLayout(pa.schema(list(top.type)), tuple(required))


def _describe_node(node: Any) -> str:
    return json.dumps(node)[:60]


def _where(path: tuple[str, ...]) -> str:
    return f"field {'.'.join(path)}: " if path else ""


def _resolve(node: dict, root: dict, path: tuple[str, ...], seen: frozenset[str]) -> tuple[dict, frozenset[str]]:
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise PayloadSchemaError(f"{_where(path)}only local $ref (#/…) are supported, not {ref!r}")
        if ref in seen:
            raise PayloadSchemaError(f"{_where(path)}recursive $ref {ref!r} cannot be a column type")
        seen = seen | {ref}
        target: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise PayloadSchemaError(f"{_where(path)}$ref {ref!r} points at nothing")
            target = target[part]
        node = target
    if not isinstance(node, dict):
        raise PayloadSchemaError(f"{_where(path)}schema must be an object, not {_describe_node(node)}")
    return node, seen


def _types_of(node: dict, root: dict, path: tuple[str, ...], seen: frozenset[str]) -> tuple[list, bool, dict]:
    """(non-null type names or one sub-schema, null allowed, the node carrying the type)."""
    for key in ("anyOf", "oneOf"):
        if key in node:
            options = [_resolve(o, root, path, seen)[0] for o in node[key]]
            non_null = [o for o in options if o.get("type") != "null"]
            if len(non_null) != 1:
                raise PayloadSchemaError(f"{_where(path)}{key} of several non-null schemas is not supported")
            inner, nullable, carrier = _types_of(non_null[0], root, path, seen)
            return inner, nullable or len(non_null) < len(options), carrier
    if "enum" in node or "const" in node:
        values = node["enum"] if "enum" in node else [node["const"]]
        kinds = {json_kind(v) for v in values if v is not None}
        if kinds <= {"integer"} and kinds:
            return ["integer"], None in values, node
        if kinds == {"string"}:
            return ["string"], None in values, node
        if "type" not in node:
            raise PayloadSchemaError(f"{_where(path)}enum/const values must all be strings or all integers")
    typ = node.get("type")
    if typ is None:
        typ = "object" if "properties" in node else "array" if "items" in node else None
    if typ is None:
        raise PayloadSchemaError(f"{_where(path)}no type")
    names = [typ] if isinstance(typ, str) else list(typ) if isinstance(typ, list) else None
    if names is None or not all(isinstance(t, str) for t in names):
        raise PayloadSchemaError(f"{_where(path)}type must be a name or a list of names")
    non_null = [t for t in names if t != "null"]
    if set(non_null) == {"integer", "number"}:
        non_null = ["number"]
    if len(non_null) != 1:
        what = "only null" if not non_null else f"a union of {non_null}"
        raise PayloadSchemaError(f"{_where(path)}type {what} is not supported (one type, optionally with null)")
    return non_null, len(non_null) < len(names), node


def _to_arrow(node: Any, path: tuple[str, ...], root: dict, required: list, seen: frozenset[str],
              top: bool = False) -> pa.Field:
    node, seen = _resolve(node, root, path, seen)
    (name,), nullable, node = _types_of(node, root, path, seen)
    meta = {DESCRIPTION_KEY: node["description"]} if isinstance(node.get("description"), str) else None
    if name == "object":
        props = node.get("properties")
        if not isinstance(props, dict) or not props:
            raise PayloadSchemaError(f"{_where(path)}an object needs 'properties' (free-form objects have no columns)")
        needed = node.get("required", [])
        children = []
        for key, sub in props.items():
            child = _to_arrow(sub, path + (key,), root, required, seen)
            if key in needed and not _allows_null(sub, root, seen):
                required.append(path + (key,))
            children.append(child)
        typ: pa.DataType = pa.struct(children)
    elif name == "array":
        items = node.get("items")
        if not isinstance(items, dict):
            raise PayloadSchemaError(f"{_where(path)}an array needs 'items' with one schema")
        typ = pa.list_(_to_arrow(items, path + ("[]",), root, [], seen).with_name("element"))
    elif name == "string":
        typ = TIMESTAMP if node.get("format") == "date-time" else pa.string()
    elif name in _JSON_NAMES:
        typ = _JSON_NAMES[name]
    else:
        raise PayloadSchemaError(f"{_where(path)}unknown type {name!r}")
    return pa.field(path[-1] if path else "", typ, True, metadata=meta)


def _allows_null(node: Any, root: dict, seen: frozenset[str]) -> bool:
    node, seen = _resolve(node, root, (), seen)
    return _types_of(node, root, (), seen)[1]


# ---- decoding ----------------------------------------------------------------------------------------

def json_kind(value: Any) -> str:
    """The JSON Schema type name of a parsed JSON value (booleans are not integers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _shown(value: Any) -> str:
    kind = json_kind(value)
    if kind in ("array", "object", "null"):
        return kind
    text = json.dumps(value, ensure_ascii=False)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def _expected(typ: pa.DataType) -> str:
    if pa.types.is_struct(typ):
        return "object"
    if pa.types.is_list(typ):
        return "array"
    if pa.types.is_timestamp(typ):
        return "date-time string"
    return {pa.int64(): "integer", pa.float64(): "number", pa.string(): "string", pa.bool_(): "boolean"}[typ]


def _check(value: Any, typ: pa.DataType, path: str) -> str | None:
    """Why ``value`` cannot be a ``typ`` (None: it can)."""
    if value is None:
        return None
    bad = f"field {path}: expected {_expected(typ)}, got {_shown(value)}"
    if pa.types.is_struct(typ):
        if not isinstance(value, dict):
            return bad
        for f in typ:
            if f.name in value:
                why = _check(value[f.name], f.type, f"{path}.{f.name}")
                if why:
                    return why
        return None
    if pa.types.is_list(typ):
        if not isinstance(value, list):
            return bad
        for i, item in enumerate(value):
            why = _check(item, typ.value_type, f"{path}[{i}]")
            if why:
                return why
        return None
    if typ == pa.int64():
        if not isinstance(value, int) or isinstance(value, bool):
            return bad
        return None if _INT64_MIN <= value <= _INT64_MAX else f"field {path}: integer {value} is out of the int64 range"
    if typ == pa.float64():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return bad
        return None if math.isfinite(value) else f"field {path}: {value} is not a JSON number"
    if typ == pa.bool_():
        return None if isinstance(value, bool) else bad
    if pa.types.is_timestamp(typ):
        if not isinstance(value, str):
            return bad
        try:
            pa.array([value], pa.string()).cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return f"field {path}: {_shown(value)} is not an ISO-8601 date-time (microseconds at most)"
        return None
    return None if isinstance(value, str) else bad


@dataclass
class JsonCodec:
    """Bodies → the columns of a JSON Schema (see the module doc)."""

    layout: JsonLayout
    format: str = "json"
    _explicit: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._explicit = self.layout.schema

    @classmethod
    def from_json_schema(cls, document: dict) -> "JsonCodec":
        return cls(json_schema_to_arrow(document))

    @property
    def schema(self) -> pa.Schema:
        return self.layout.schema

    # -- the batch -----------------------------------------------------------------------------
    def decode(self, bodies: "pa.Array | Sequence[bytes]") -> Decoded:
        binary = as_binary(bodies)
        n = len(binary)
        failures: dict[int, str] = dict(utf8_failures(binary))
        text = binary.view(pa.string())
        if failures:
            text = pc.if_else(pa.array(Decoded(self.schema.empty_table(), list(failures.items())).ok_mask(n)),
                              text, pa.scalar(None, pa.string()))
        blank = pc.fill_null(pc.equal(pc.binary_length(pc.utf8_trim_whitespace(text)), 0), True)
        for i in np.flatnonzero(np.asarray(blank)).tolist():
            failures.setdefault(i, "empty body")
        keep = np.ones(n, dtype=bool)
        keep[list(failures)] = False
        multiline = np.asarray(pc.fill_null(pc.match_substring_regex(binary, "[\r\n]"), False)) & keep
        if multiline.any():
            binary = self._one_line(binary, multiline, keep, failures)
        rows = np.flatnonzero(keep)
        tables: list[tuple[int, pa.Table]] = []
        if rows.size:
            self._bisect(binary.take(pa.array(rows)), rows, 0, rows.size, tables, failures)
        tables.sort(key=lambda t: t[0])
        table = pa.concat_tables([t for _, t in tables]) if tables else self.schema.empty_table()
        table = self._required(table, np.concatenate([rows[s:s + t.num_rows] for s, t in tables])
                               if tables else np.zeros(0, np.int64), failures)
        return Decoded(table, sorted(failures.items()))

    def _one_line(self, binary: pa.BinaryArray, multiline: np.ndarray, keep: np.ndarray,
                  failures: dict[int, str]) -> pa.BinaryArray:
        """Bodies with raw line breaks, parsed and written back on one line (same values)."""
        idx = np.flatnonzero(multiline)
        replaced, mask = [], np.zeros(len(binary), dtype=bool)
        for i, body in zip(idx.tolist(), binary.take(pa.array(idx)).to_pylist()):
            try:
                value = json.loads(body)
            except json.JSONDecodeError as exc:
                failures[i] = _invalid_json(body.decode("utf-8"), exc)
                keep[i] = False
                continue
            replaced.append(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
            mask[i] = True
        if not replaced:
            return binary
        return pc.replace_with_mask(binary, pa.array(mask), pa.array(replaced, pa.binary()))

    def _parse(self, chunk: pa.BinaryArray) -> tuple[pa.Table | None, str]:
        """One read_json over the chunk's bodies; (None, why) unless it yields one row per body."""
        joined = pc.binary_join_element_wise(chunk, pa.scalar(b"", pa.binary()), b"\n")
        offsets = np.frombuffer(joined.buffers()[1], np.int32, len(joined) + 1, joined.offset * 4)
        data = joined.buffers()[2][int(offsets[0]):int(offsets[-1])]
        longest = int(np.max(np.diff(offsets))) if len(chunk) else 0
        try:
            table = pajson.read_json(
                pa.BufferReader(data),
                read_options=pajson.ReadOptions(block_size=max(_MIN_BLOCK, 2 * longest + 2)),
                parse_options=pajson.ParseOptions(explicit_schema=self._explicit,
                                                  unexpected_field_behavior="ignore"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            return None, str(exc)
        if table.num_rows != len(chunk):
            return None, f"{table.num_rows} JSON values in {len(chunk)} bodies"
        if table.schema != self._explicit:
            table = table.select(self._explicit.names).cast(self._explicit)
        return table, ""

    def _bisect(self, chunk: pa.BinaryArray, rows: np.ndarray, lo: int, hi: int,
                out: list[tuple[int, pa.Table]], failures: dict[int, str]) -> None:
        """Parse ``chunk[lo:hi]``; on failure split it into parts, down to single bad rows."""
        table, why = self._parse(chunk.slice(lo, hi - lo))
        if table is not None:
            out.append((lo, table))
        elif hi - lo == 1:
            failures[int(rows[lo])] = self._explain(chunk[lo].as_py(), why)
        else:
            # split in _FAN_OUT parts (halves when small): fewer levels of re-parsing around a bad row
            parts = _FAN_OUT if hi - lo >= 8 * _FAN_OUT else 2
            bounds = [lo + (hi - lo) * k // parts for k in range(parts + 1)]
            for a, b in zip(bounds, bounds[1:]):
                if b > a:
                    self._bisect(chunk, rows, a, b, out, failures)

    def _explain(self, body: bytes, arrow_error: str) -> str:
        """The reason one body did not parse, in the producer's terms."""
        text = body.decode("utf-8")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return _invalid_json(text, exc)
        if not isinstance(value, dict):
            return f"expected a JSON object, got {_shown(value)}"
        for f in self.schema:
            if f.name in value:
                why = _check(value[f.name], f.type, f.name)
                if why:
                    return why
        message = arrow_error.removeprefix("JSON parse error: ")
        m = _ARROW_COLUMN_ERROR.search(message)
        if m:
            return f"field {m.group(1).replace('/', '.')}: {m.group(2)}"
        return message

    def _required(self, table: pa.Table, rows: np.ndarray, failures: dict[int, str]) -> pa.Table:
        """Rows missing a required non-null field become failures (first such field named)."""
        if not self.layout.required or table.num_rows == 0:
            return table
        bad_any = np.zeros(table.num_rows, dtype=bool)
        for path in self.layout.required:
            column: pa.Array = table.column(path[0]).combine_chunks()
            present = np.ones(table.num_rows, dtype=bool)
            for name in path[1:]:
                if not pa.types.is_struct(column.type):
                    break
                present &= np.asarray(column.is_valid())
                column = column.field(name)
            missing = present & np.asarray(column.is_null())
            for r in np.flatnonzero(missing & ~bad_any).tolist():
                failures[int(rows[r])] = f"field {'.'.join(path)}: required, missing or null"
            bad_any |= missing
        return table.filter(pa.array(~bad_any)) if bad_any.any() else table


def _invalid_json(text: str, exc: json.JSONDecodeError) -> str:
    return f"invalid JSON at byte {len(text[:exc.pos].encode('utf-8'))}: {exc.msg}"


def parse_json_schema_text(data: bytes) -> dict:
    """A JSON Schema file's text as a dict, checked by ``jsonschema`` against its meta-schema
    (:class:`PayloadSchemaError` for bad JSON or a schema its own draft rejects)."""
    import jsonschema

    try:
        document = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PayloadSchemaError(f"not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise PayloadSchemaError("a JSON Schema is a JSON object")
    try:
        jsonschema.validators.validator_for(document).check_schema(document)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "top level"
        raise PayloadSchemaError(f"not a valid JSON Schema ({where}: {exc.message})") from None
    return document
