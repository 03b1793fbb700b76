"""The other Delta tables written by the ingest job (one definition each: jobs, tests and docs)."""

from __future__ import annotations

import pyarrow as pa

Columns = list[tuple[str, pa.DataType, str]]

CONSUME_QUEUE_TABLE = "consume_queue"
CONSUME_QUEUE_COLUMNS: Columns = [
    ("broker_name", pa.string(), "broker the store belongs to"),
    ("topic", pa.string(), "queue topic (directory name)"),
    ("queue_id", pa.int32(), "queue id"),
    ("queue_offset", pa.int64(), "logical offset of the unit"),
    ("commitlog_offset", pa.int64(), "physical offset of the record"),
    ("size", pa.int32(), "record size"),
    ("tags_code", pa.int64(), "tag hash (deliver time for SCHEDULE_TOPIC_XXXX)"),
]

INDEX_ENTRIES_TABLE = "index_entries"
INDEX_ENTRIES_COLUMNS: Columns = [
    ("broker_name", pa.string(), "broker the store belongs to"),
    ("index_file", pa.string(), "index file name (yyyyMMddHHmmssSSS)"),
    ("key_hash", pa.int32(), "abs(hashCode(topic#key))"),
    ("commitlog_offset", pa.int64(), "physical offset of the record"),
    ("store_timestamp", pa.int64(), "begin timestamp of the file + timeDiff seconds, epoch ms"),
    ("prev_index", pa.int32(), "previous entry in the slot chain (0 = end)"),
]

CORRUPT_RECORDS_TABLE = "corrupt_records"
CORRUPT_RECORDS_COLUMNS: Columns = [
    ("broker_name", pa.string(), "broker the store belongs to"),
    ("file", pa.string(), "file the problem is in"),
    ("offset", pa.int64(), "byte position in that file"),
    ("reason", pa.string(), "finding kind and detail"),
    ("bytes_skipped", pa.int64(), "bytes a reader jumped over"),
    ("ingest_run_id", pa.string(), "ingest run that found it"),
]

INGEST_RUNS_TABLE = "ingest_runs"
INGEST_RUNS_COLUMNS: Columns = [
    ("ingest_run_id", pa.string(), "run id"),
    ("broker_name", pa.string(), "broker"),
    ("from_offset", pa.int64(), "first commitlog offset ingested (inclusive)"),
    ("to_offset", pa.int64(), "commitlog offset the run stopped at (exclusive)"),
    ("messages_rows", pa.int64(), "rows added to messages"),
    ("consume_queue_rows", pa.int64(), "rows added to consume_queue"),
    ("index_entries_rows", pa.int64(), "rows added to index_entries"),
    ("corrupt_records_rows", pa.int64(), "rows added to corrupt_records"),
    ("started_at", pa.timestamp("us", tz="UTC"), "start"),
    ("duration_s", pa.float64(), "wall time"),
    ("status", pa.string(), "SUCCEEDED | NOTHING_NEW | FAILED"),
]


def schema_of(columns: Columns) -> pa.Schema:
    return pa.schema([pa.field(name, typ) for name, typ, _ in columns])


CONSUME_QUEUE_SCHEMA = schema_of(CONSUME_QUEUE_COLUMNS)
INDEX_ENTRIES_SCHEMA = schema_of(INDEX_ENTRIES_COLUMNS)
CORRUPT_RECORDS_SCHEMA = schema_of(CORRUPT_RECORDS_COLUMNS)
INGEST_RUNS_SCHEMA = schema_of(INGEST_RUNS_COLUMNS)
