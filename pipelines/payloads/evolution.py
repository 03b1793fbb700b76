"""Which schema changes a payload table may take: the additive ones.

A producer's schema moves on; its table must follow without rewriting old data and without
reading old rows differently. Accepted (:func:`check_evolution` returns the merged schema):

* a new field, top-level or inside a struct (also a struct inside a list or map value), that is
  nullable: old rows read it as null; it is appended after the existing fields;
* a field becoming nullable;
* a field that the new schema lacks: the table keeps the column and new rows fill it with nulls
  (refused only when the column is not nullable, as nothing could fill it).

Refused (:class:`PayloadSchemaError` naming the field): a type change (including widening such as
int32 → int64, which Delta readers would need a table feature for), and a new non-nullable field.
Type spellings that store the same (string / large_string / string_view, binary / large_binary /
binary_view, list / large_list, whatever a list's element is called) are the same type; field
metadata (descriptions) never matters.
"""

from __future__ import annotations

import pyarrow as pa

from pipelines.payloads.errors import PayloadSchemaError

_SAME = {pa.large_string(): pa.string(), pa.string_view(): pa.string(),
         pa.large_binary(): pa.binary(), pa.binary_view(): pa.binary()}


def check_evolution(old: pa.Schema, new: pa.Schema) -> pa.Schema:
    """The schema a table of schema ``old`` gets when rows of schema ``new`` are added (the module
    doc's rules); :class:`PayloadSchemaError` for an incompatible change."""
    fields = _merge_fields(list(old), list(new), "")
    return pa.schema(fields, metadata=old.metadata)


def adds_fields(old: pa.Schema, new: pa.Schema) -> bool:
    """True when rows of schema ``new`` bring fields a table of schema ``old`` lacks (top-level or
    nested) and :func:`check_evolution` accepts the change; False for the same fields (nullability
    aside) or a refused change."""
    try:
        merged = check_evolution(old, new)
    except PayloadSchemaError:
        return False
    return _shape(merged) != _shape(old)


def _shape(t: "pa.Schema | pa.DataType") -> tuple:
    """Field names, nested (what "adds a field" compares)."""
    if isinstance(t, pa.Schema):
        return tuple((f.name, _shape(f.type)) for f in t)
    if pa.types.is_struct(t):
        return tuple((f.name, _shape(f.type)) for f in t)
    if _is_list(t):
        return ("[]", _shape(t.value_type))
    if pa.types.is_map(t):
        return ("{}", _shape(t.item_type))
    return ()


def _norm(t: pa.DataType) -> pa.DataType:
    return _SAME.get(t, t)


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    a, b = _norm(a), _norm(b)
    if _is_list(a) and _is_list(b):  # element names differ by writer ("item", "element"): not a change
        return a.value_field.nullable == b.value_field.nullable and _same_type(a.value_type, b.value_type)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return a.num_fields == b.num_fields and all(_same_field(x, y) for x, y in zip(a, b))
    if pa.types.is_map(a) and pa.types.is_map(b):
        return (_same_type(a.key_type, b.key_type) and a.item_field.nullable == b.item_field.nullable
                and _same_type(a.item_type, b.item_type))
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        return a.unit == b.unit and _utc(a.tz) == _utc(b.tz)
    return a == b


def _same_field(a: pa.Field, b: pa.Field) -> bool:
    return a.name == b.name and a.nullable == b.nullable and _same_type(a.type, b.type)


def _utc(tz: str | None) -> str | None:
    return "UTC" if tz in ("UTC", "+00:00", "Etc/UTC", "Z") else tz


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)


def _merge_fields(old: list[pa.Field], new: list[pa.Field], prefix: str) -> list[pa.Field]:
    by_name = {f.name: f for f in new}
    out: list[pa.Field] = []
    for o in old:
        n = by_name.get(o.name)
        path = prefix + o.name
        if n is None:
            if not o.nullable:
                raise PayloadSchemaError(f"field {path}: removed, but the table's column is not nullable")
            out.append(o)
            continue
        out.append(o.with_type(_merge_type(o.type, n.type, path)).with_nullable(o.nullable or n.nullable))
    known = {f.name for f in old}
    for n in new:
        if n.name not in known:
            if not n.nullable:
                raise PayloadSchemaError(f"field {prefix + n.name}: a new field must be nullable "
                                         "(rows already in the table have no value for it)")
            out.append(n)
    return out


def _merge_type(old: pa.DataType, new: pa.DataType, path: str) -> pa.DataType:
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        return pa.struct(_merge_fields(list(old), list(new), path + "."))
    if _is_list(old) and _is_list(new):
        item = old.value_field
        merged = _merge_type(item.type, new.value_field.type, path + "[]")
        nullable = item.nullable or new.value_field.nullable
        return pa.list_(item.with_type(merged).with_nullable(nullable))
    if pa.types.is_map(old) and pa.types.is_map(new):
        if not _same_type(old.key_type, new.key_type):
            raise PayloadSchemaError(f"field {path}: map key type changed from {old.key_type} to {new.key_type}")
        item = old.item_field
        merged = _merge_type(item.type, new.item_type, path + "{}")
        return pa.map_(old.key_field, item.with_type(merged).with_nullable(item.nullable or new.item_field.nullable))
    if not _same_type(old, new):
        raise PayloadSchemaError(f"field {path}: type changed from {old} to {new} (only additive changes are "
                                 "accepted: new nullable fields, fields becoming nullable)")
    return old
