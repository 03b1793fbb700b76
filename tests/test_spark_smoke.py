"""PySpark 4.2 + Java 17 work here, and the decoder's Arrow batches are Spark-compatible as they are."""

from __future__ import annotations

import pyarrow as pa

from broker.store.columnar import decode_range
from broker.store.commitlog import CommitLog
from schemas.messages import RECORD_SCHEMA


def test_decoded_batches_load_into_spark(spark, golden_store, golden_records):
    log = CommitLog.open(golden_store)
    tables = []
    for seg in log.segments:
        table, _ = decode_range(seg.open(), seg.base, log.segment_size)
        tables.append(table)
    table = pa.concat_tables(tables)
    df = spark.createDataFrame(table)
    assert df.count() == 2001
    assert df.columns == RECORD_SCHEMA.names
    row = df.filter("commitlog_offset = 0").collect()[0]
    first = golden_records[0]
    assert row["store_timestamp"] == first["storeTimestamp"]
    assert dict(row["properties"]) == first["properties"]
    assert row["keys"] == first["keys"].split(" ")
    totals = df.groupBy().sum("store_size").collect()[0][0]
    assert totals == sum(e["storeSize"] for e in golden_records)
