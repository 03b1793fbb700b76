"""Spark schemas of the Arrow table schemas, through pyspark's own Arrow converter.

pyspark's ``from_arrow_schema`` is the mapping Spark itself applies to Arrow data (``toArrow``,
``mapInArrow``, Arrow-backed data sources), so a declared schema cannot disagree with what the
rows turn into. Two things it does not do are done here:

* the ``*_view`` types (the decoder emits ``body`` as ``binary_view``, see
  :func:`schemas.messages.body_as_view`) have no case in pyspark 4.2's converter; they are the same
  values as ``binary``/``string``, so they are declared as those (Spark's ``BINARY``/``STRING``);
* a field's description (Arrow metadata ``comment``, :data:`schemas.contract.DESCRIPTION_KEY`)
  becomes the Spark column comment (``StructField`` metadata ``comment``, what ``DESCRIBE``
  shows); pyspark's converter only carries its own ``SPARK::metadata::json`` key.

:func:`spark_ddl` renders the same ``StructType`` as a DDL string (``\\`name\\` TYPE, …``, the form
``DataSource.schema()``, ``createDataFrame`` and ``mapInArrow`` accept) without a JVM:
``StructType.toDDL()`` needs the driver's Spark context, and data-source schemas are asked for in
Python workers.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from schemas.contract import description_of

SPARK_COMMENT_KEY = "comment"  # StructField metadata key of a column comment (Spark, Delta, catalogs)


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` with every view type replaced by its plain form (nested ones included)."""
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(t.value_field.with_type(_plain(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_plain(t.key_type)), t.item_field.with_type(_plain(t.item_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain(f.type)) for f in t])
    return t


def spark_schema(schema: pa.Schema, *, comments: bool = True) -> StructType:
    """The Spark ``StructType`` of an Arrow schema; with ``comments``, each described field's
    description as its column comment."""
    plain = pa.schema([f.with_type(_plain(f.type)) for f in schema])
    struct = from_arrow_schema(plain)
    if not comments:
        return struct
    fields = []
    for arrow_field, spark_field in zip(schema, struct.fields):
        text = description_of(arrow_field)
        metadata = dict(spark_field.metadata or {})
        if text is not None:
            metadata[SPARK_COMMENT_KEY] = text
        fields.append(StructField(spark_field.name, spark_field.dataType, spark_field.nullable, metadata or None))
    return StructType(fields)


def _sql_type(t: DataType) -> str:
    """Spark's SQL spelling of a type (``BIGINT``, ``MAP<STRING, STRING>``, ``STRUCT<`a`: INT>``)."""
    if isinstance(t, ArrayType):
        return f"ARRAY<{_sql_type(t.elementType)}>"
    if isinstance(t, MapType):
        return f"MAP<{_sql_type(t.keyType)}, {_sql_type(t.valueType)}>"
    if isinstance(t, StructType):
        return "STRUCT<" + ", ".join(f"`{f.name}`: {_sql_type(f.dataType)}" for f in t.fields) + ">"
    return t.simpleString().upper()


def spark_ddl(schema: pa.Schema) -> str:
    """``\\`name\\` TYPE, …`` for DataSource.schema(), ``mapInArrow`` and CREATE TABLE."""
    return ", ".join(f"`{f.name}` {_sql_type(f.dataType)}" for f in spark_schema(schema, comments=False).fields)

