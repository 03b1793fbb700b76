"""``format = "protobuf"``: each body one serialized message of the declared type, described by a
compiled ``FileDescriptorSet`` (``protoc --include_imports --descriptor_set_out=x.pb``; no
``protoc`` is needed here, only its output).

Type mapping (:func:`message_to_arrow`): double/float → float64/float32, int32/sint32/sfixed32 →
int32, int64/sint64/sfixed64 → int64, uint32/fixed32 → int64 (Delta has no unsigned types),
uint64/fixed64 → decimal128(20, 0), bool → bool, string → string, bytes → binary, enum → string
(the value's name; an unknown number in an open enum → its decimal text), message → struct
(``google.protobuf.Timestamp`` → ``timestamp[us, UTC]``), repeated → list, map → map. A field with
presence (proto2 optional, proto3 ``optional``, message fields, oneof members) that is not set is
null; a proto3 scalar without presence reads as its default (0, "", false), as every protobuf
reader sees it. Recursive message types cannot be column types and are refused.

Unknown field numbers are accepted (producers may be on a newer schema): protobuf's own rule. A
body fails when protobuf cannot parse it (truncated, corrupt wire format, invalid UTF-8 in a proto3
string), or when a declared top-level field arrives with another wire type (protobuf would silently
keep it as unknown and report the field unset).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa

from pipelines.payloads.codec import Decoded, Failure, as_binary
from pipelines.payloads.errors import PayloadSchemaError

TIMESTAMP = pa.timestamp("us", tz="UTC")
TIMESTAMP_TYPE = "google.protobuf.Timestamp"


def _scalar_types() -> dict[int, pa.DataType]:
    from google.protobuf.descriptor import FieldDescriptor as F

    return {F.TYPE_DOUBLE: pa.float64(), F.TYPE_FLOAT: pa.float32(), F.TYPE_INT32: pa.int32(),
            F.TYPE_SINT32: pa.int32(), F.TYPE_SFIXED32: pa.int32(), F.TYPE_INT64: pa.int64(),
            F.TYPE_SINT64: pa.int64(), F.TYPE_SFIXED64: pa.int64(), F.TYPE_UINT32: pa.int64(),
            F.TYPE_FIXED32: pa.int64(), F.TYPE_UINT64: pa.decimal128(20, 0), F.TYPE_FIXED64: pa.decimal128(20, 0),
            F.TYPE_BOOL: pa.bool_(), F.TYPE_STRING: pa.string(), F.TYPE_BYTES: pa.binary(), F.TYPE_ENUM: pa.string()}


def load_message_class(descriptor_set: bytes, message: str):
    """The message class of ``message`` (full name) from a serialized FileDescriptorSet; files are
    added dependencies first, whatever their order in the set."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf.message import DecodeError

    fds = descriptor_pb2.FileDescriptorSet()
    try:
        fds.ParseFromString(descriptor_set)
    except DecodeError as exc:
        raise PayloadSchemaError(f"not a serialized FileDescriptorSet ({exc})") from None
    if not fds.file:
        raise PayloadSchemaError("the FileDescriptorSet holds no file")
    files = {f.name: f for f in fds.file}
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str, stack: tuple[str, ...]) -> None:
        if name in added:
            return
        proto = files.get(name)
        if proto is None:
            if pool_has_default(name):
                return
            raise PayloadSchemaError(f"{stack[-1]} imports {name}, which the FileDescriptorSet lacks "
                                     "(compile with protoc --include_imports)")
        for dep in proto.dependency:
            add(dep, stack + (name,))
        try:
            pool.Add(proto)
        except Exception as exc:
            raise PayloadSchemaError(f"{name}: {exc}") from None
        added.add(name)

    def pool_has_default(name: str) -> bool:
        from google.protobuf import descriptor_pool as dp

        try:
            default_file = dp.Default().FindFileByName(name)
        except KeyError:
            return False
        proto = descriptor_pb2.FileDescriptorProto()
        default_file.CopyToProto(proto)
        files[name] = proto
        add(name, ())
        return True

    for name in list(files):
        add(name, (name,))
    try:
        desc = pool.FindMessageTypeByName(message)
    except KeyError:
        known = sorted(m for f in fds.file for m in _message_names(f))
        raise PayloadSchemaError(f"no message {message!r} in the FileDescriptorSet (it has: {', '.join(known)})") \
            from None
    return message_factory.GetMessageClass(desc)


def _message_names(file_proto) -> list[str]:
    prefix = f"{file_proto.package}." if file_proto.package else ""
    out: list[str] = []

    def walk(messages, scope: str) -> None:
        for m in messages:
            out.append(scope + m.name)
            walk(m.nested_type, f"{scope}{m.name}.")

    walk(file_proto.message_type, prefix)
    return out


def message_to_arrow(desc, path: str = "", seen: frozenset[str] = frozenset()) -> pa.DataType:
    """The Arrow struct type of a message descriptor (see the module doc)."""
    if desc.full_name == TIMESTAMP_TYPE:
        return TIMESTAMP
    if desc.full_name in seen:
        raise PayloadSchemaError(f"field {path}: recursive message {desc.full_name} cannot be a column type")
    seen = seen | {desc.full_name}
    scalars = _scalar_types()
    fields = []
    for f in desc.fields:
        where = f"{path}.{f.name}" if path else f.name
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            fields.append(pa.field(f.name, pa.map_(_field_type(key_f, where, seen, scalars),
                                                   _field_type(value_f, where, seen, scalars))))
            continue
        typ = _field_type(f, where, seen, scalars)
        fields.append(pa.field(f.name, pa.list_(pa.field("element", typ)) if f.is_repeated else typ))
    if not fields:
        raise PayloadSchemaError(f"{'field ' + path + ': ' if path else ''}message {desc.full_name} has no fields")
    return pa.struct(fields)


def _field_type(f, path: str, seen: frozenset[str], scalars: dict[int, pa.DataType]) -> pa.DataType:
    if f.message_type is not None:
        return message_to_arrow(f.message_type, path, seen)
    return scalars[f.type]


def _value(value: Any, f, typ: pa.DataType) -> Any:
    """One singular field value as Arrow takes it."""
    if pa.types.is_timestamp(typ):
        return value.seconds * 1_000_000 + value.nanos // 1000
    if pa.types.is_struct(typ):
        return _row(value, typ)
    if f.enum_type is not None:
        known = f.enum_type.values_by_number.get(value)
        return known.name if known is not None else str(value)
    if pa.types.is_decimal(typ):
        from decimal import Decimal

        return Decimal(value)
    return value


def _row(msg, struct: pa.StructType) -> dict:
    desc = msg.DESCRIPTOR
    out: dict[str, Any] = {}
    for child in struct:
        f = desc.fields_by_name[child.name]
        value = getattr(msg, f.name)
        typ = child.type
        if pa.types.is_map(typ):
            value_f = f.message_type.fields_by_name["value"]
            out[f.name] = [(k, _value(value[k], value_f, typ.item_type)) for k in value]
        elif f.is_repeated:
            out[f.name] = [_value(v, f, typ.value_type) for v in value]
        elif f.has_presence and not msg.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _value(value, f, typ)
    return out


def _wire_type_clash(msg) -> str | None:
    """A top-level field number of the declared type that came with another wire type (protobuf
    keeps it as an unknown field and would report the field unset): the body was written with an
    incompatible schema, or is not this message at all."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    unknown = UnknownFieldSet(msg)
    if not len(unknown):
        return None
    by_number = msg.DESCRIPTOR.fields_by_number
    for u in unknown:
        f = by_number.get(u.field_number)
        if f is not None:
            return f"field {f.name} (number {u.field_number}): wire type {u.wire_type} does not match its declared type"
    return None


@dataclass
class ProtobufCodec:
    """Bodies → the columns of a protobuf message type (see the module doc)."""

    descriptor_set: bytes  # what pickles: the message class is rebuilt from it after unpickling
    message: str
    format: str = "protobuf"
    _cls: Any = field(init=False, repr=False)
    _schema: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._cls = load_message_class(self.descriptor_set, self.message)
        self._schema = pa.schema(list(message_to_arrow(self._cls.DESCRIPTOR)))

    def __getstate__(self) -> dict:
        return {"descriptor_set": self.descriptor_set, "message": self.message, "format": self.format}

    def __setstate__(self, state: dict) -> None:
        self.descriptor_set, self.message, self.format = state["descriptor_set"], state["message"], state["format"]
        self.__post_init__()

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def decode(self, bodies: "pa.Array | Sequence[bytes]") -> Decoded:
        from google.protobuf.message import DecodeError

        struct = pa.struct(list(self._schema))
        rows: list[dict] = []
        failures: list[Failure] = []
        for i, body in enumerate(as_binary(bodies).to_pylist()):
            msg = self._cls()
            try:
                msg.ParseFromString(body or b"")
            except (DecodeError, ValueError, RuntimeError) as exc:
                failures.append((i, f"invalid protobuf body: {exc}"))
                continue
            clash = _wire_type_clash(msg)
            if clash:
                failures.append((i, clash))
                continue
            rows.append(_row(msg, struct))
        return Decoded(pa.Table.from_pylist(rows, schema=self._schema), failures)
