"""``format = "avro"``: each body one Avro datum (no container file, no schema-registry header),
written with the declared ``.avsc`` schema; read with ``fastavro.schemaless_reader``.

Type mapping (:func:`avro_to_arrow`): record → struct, array → list, map → map<string, …>, enum →
string, ``["null", X]`` → nullable X (other unions are refused), boolean/int/long/float/double →
bool/int32/int64/float32/float64, bytes and fixed → binary, string → string; logical types
``timestamp-millis``/``timestamp-micros`` → ``timestamp[us, UTC]``, ``date`` → date32, ``decimal`` →
decimal128(precision, scale), ``uuid`` → string, ``time-millis``/``time-micros`` → int32
milliseconds / int64 microseconds since midnight (Delta has no time type). A record's ``doc``
becomes the column's comment. Named types may be referenced again by name; a recursive record
cannot be a column type and is refused.

A body decodes when the datum reads completely and no byte is left over; otherwise the failure
says what happened (``truncated Avro body``, ``3 bytes left after the Avro datum``, …).
"""

from __future__ import annotations

import datetime as dt
import io
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa

from pipelines.payloads.codec import Decoded, Failure, as_binary
from pipelines.payloads.errors import PayloadSchemaError
from schemas.contract import DESCRIPTION_KEY

_PRIMITIVES = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
               "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}
TIMESTAMP = pa.timestamp("us", tz="UTC")
_MIDNIGHT = dt.datetime.min


def avro_to_arrow(schema: Any, named: dict[str, Any]) -> pa.Schema:
    """The columns of a parsed Avro record schema (``named``: fastavro's named types)."""
    top = _type(schema, named, "", frozenset())
    if not pa.types.is_struct(top.type):
        raise PayloadSchemaError("the top-level Avro schema must be a record")
    return pa.schema(list(top.type))


def _type(node: Any, named: dict[str, Any], path: str, seen: frozenset[str], doc: str | None = None) -> pa.Field:
    where = f"field {path}: " if path else ""
    name = path.rsplit(".", 1)[-1]
    meta = {DESCRIPTION_KEY: doc} if doc else None
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return pa.field(name, _PRIMITIVES[node], True, metadata=meta)
        if node in named:
            if node in seen:
                raise PayloadSchemaError(f"{where}recursive type {node!r} cannot be a column type")
            return _type(named[node], named, path, seen | {node}, doc)
        raise PayloadSchemaError(f"{where}unknown Avro type {node!r}")
    if isinstance(node, list):
        non_null = [t for t in node if t != "null"]
        if len(non_null) != 1:
            raise PayloadSchemaError(f"{where}union {node!r}: only a union of null and one type is supported")
        return _type(non_null[0], named, path, seen, doc)
    if not isinstance(node, dict):
        raise PayloadSchemaError(f"{where}not an Avro schema: {node!r}")
    kind, logical = node.get("type"), node.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        typ: pa.DataType = TIMESTAMP
    elif logical == "date" and kind == "int":
        typ = pa.date32()
    elif logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(node.get("precision", 0)), int(node.get("scale", 0))
        if not 0 < precision <= 38:
            raise PayloadSchemaError(f"{where}decimal precision {precision} is outside 1..38")
        typ = pa.decimal128(precision, scale)
    elif logical == "time-millis" and kind == "int":
        typ = pa.int32()
    elif logical == "time-micros" and kind == "long":
        typ = pa.int64()
    elif kind == "record":
        full = node.get("name")
        inner = seen | {full} if full else seen
        children = [_type(f["type"], named, f"{path}.{f['name']}" if path else f["name"], inner, f.get("doc"))
                    for f in node.get("fields", [])]
        if not children:
            raise PayloadSchemaError(f"{where}a record without fields has no columns")
        typ = pa.struct(children)
        meta = meta or ({DESCRIPTION_KEY: node["doc"]} if path and node.get("doc") else None)
    elif kind == "array":
        typ = pa.list_(_type(node["items"], named, f"{path}[]", seen).with_name("element"))
    elif kind == "map":
        typ = pa.map_(pa.string(), _type(node["values"], named, f"{path}{{}}", seen).type)
    elif kind == "enum":
        typ = pa.string()
    elif kind == "fixed":
        typ = pa.binary()
    else:
        return _type(kind, named, path, seen, doc)  # {"type": "long"}, uuid on string, …
    return pa.field(name, typ, True, metadata=meta)


def _plain(value: Any, typ: pa.DataType) -> Any:
    """fastavro's value as what Arrow takes for ``typ`` (only time-of-day and uuid differ)."""
    if value is None:
        return None
    if pa.types.is_struct(typ):
        return {f.name: _plain(value.get(f.name), f.type) for f in typ}
    if pa.types.is_list(typ):
        return [_plain(v, typ.value_type) for v in value]
    if pa.types.is_map(typ):
        return [(k, _plain(v, typ.item_type)) for k, v in value.items()]
    if isinstance(value, dt.time):
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
        return micros // 1000 if typ == pa.int32() else micros
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


@dataclass
class AvroCodec:
    """Bodies → the columns of an Avro record schema (see the module doc)."""

    schema_json: Any  # the .avsc document as read (what pickles; parsed again after unpickling)
    format: str = "avro"
    _parsed: Any = field(init=False, repr=False)
    _schema: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        import fastavro

        named: dict[str, Any] = {}
        try:
            self._parsed = fastavro.parse_schema(self.schema_json, named_schemas=named)
        except Exception as exc:  # fastavro raises SchemaParseException, ValueError, KeyError, …
            raise PayloadSchemaError(f"not a valid Avro schema: {exc}") from None
        self._schema = avro_to_arrow(self._parsed, named)

    def __getstate__(self) -> dict:
        return {"schema_json": self.schema_json, "format": self.format}

    def __setstate__(self, state: dict) -> None:
        self.schema_json, self.format = state["schema_json"], state["format"]
        self.__post_init__()

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def decode(self, bodies: "pa.Array | Sequence[bytes]") -> Decoded:
        from fastavro import schemaless_reader

        struct = pa.struct(list(self._schema))
        rows: list[dict] = []
        failures: list[Failure] = []
        for i, body in enumerate(as_binary(bodies).to_pylist()):
            body = body or b""
            stream = io.BytesIO(body)
            try:
                value = schemaless_reader(stream, self._parsed, None)
            except EOFError:
                failures.append((i, f"truncated Avro body ({len(body)} bytes)"))
                continue
            except Exception as exc:  # garbage surfaces as IndexError, UnicodeDecodeError, ValueError, …
                failures.append((i, f"invalid Avro body at byte {stream.tell()}: {type(exc).__name__}: {exc}"))
                continue
            left = len(body) - stream.tell()
            if left:
                failures.append((i, f"{left} byte{'' if left == 1 else 's'} left after the Avro datum"))
                continue
            rows.append(_plain(value, struct))
        return Decoded(pa.Table.from_pylist(rows, schema=self._schema), failures)
