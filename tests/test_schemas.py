"""Table schemas: one definition, Spark DDL derived from it."""

import pyarrow as pa

from schemas.messages import MESSAGES_SCHEMA, RECORD_SCHEMA
from schemas.spark import spark_ddl
from schemas.tables import CONSUME_QUEUE_SCHEMA, INGEST_RUNS_SCHEMA


def test_messages_table_extends_the_record():
    assert MESSAGES_SCHEMA.names[:len(RECORD_SCHEMA)] == RECORD_SCHEMA.names
    assert MESSAGES_SCHEMA.field("store_time").type == pa.timestamp("us", tz="UTC")


def test_spark_ddl(spark):
    assert spark_ddl(CONSUME_QUEUE_SCHEMA).startswith("`broker_name` STRING, `topic` STRING, `queue_id` INT")
    for schema in (MESSAGES_SCHEMA, CONSUME_QUEUE_SCHEMA, INGEST_RUNS_SCHEMA):
        df = spark.createDataFrame([], spark_ddl(schema))
        assert df.columns == schema.names
    assert "MAP<STRING, STRING>" in spark_ddl(RECORD_SCHEMA) and "ARRAY<STRING>" in spark_ddl(RECORD_SCHEMA)


def test_report_schemas_have_spark_ddl(spark):
    from schemas.reports import REPORT_SCHEMAS

    for name, schema in REPORT_SCHEMAS.items():
        df = spark.createDataFrame([], spark_ddl(schema))
        assert df.columns == schema.names, name
    assert "ARRAY<STRUCT<`attempt`: INT" in spark_ddl(REPORT_SCHEMAS["dlq_messages"])
