"""Spark DDL strings derived from the Arrow schemas (so there is one definition per table)."""

from __future__ import annotations

import pyarrow as pa


def spark_type(t: pa.DataType) -> str:
    if pa.types.is_int64(t):
        return "BIGINT"
    if pa.types.is_int32(t):
        return "INT"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_float64(t):
        return "DOUBLE"
    if pa.types.is_string(t):
        return "STRING"
    if pa.types.is_binary(t):
        return "BINARY"
    if pa.types.is_date32(t):
        return "DATE"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    if pa.types.is_map(t):
        return f"MAP<{spark_type(t.key_type)}, {spark_type(t.item_type)}>"
    if pa.types.is_list(t):
        return f"ARRAY<{spark_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"`{f.name}`: {spark_type(f.type)}" for f in t) + ">"
    raise TypeError(f"no Spark type for {t}")


def spark_ddl(schema: pa.Schema) -> str:
    """``name TYPE, …`` for DataSource.schema() and CREATE TABLE."""
    return ", ".join(f"`{f.name}` {spark_type(f.type)}" for f in schema)
