"""The other Delta tables written by the ingest job (one definition each: jobs, tests and docs)."""

from __future__ import annotations

import pyarrow as pa

# Columns and schema_of are re-exported: modules declared their columns with them before the contracts
from schemas.contract import Allowed, Columns, TableContract, one_of, schema_of  # noqa: F401

CONSUME_QUEUE = TableContract(
    name="consume_queue",
    description="one row per ConsumeQueue unit: where each (topic, queue, logical offset) points in the CommitLog",
    columns=[
        ("broker_name", pa.string(), "broker the store belongs to"),
        ("topic", pa.string(), "queue topic (directory name)"),
        ("queue_id", pa.int32(), "queue id"),
        ("queue_offset", pa.int64(), "logical offset of the unit"),
        ("commitlog_offset", pa.int64(), "physical offset of the record"),
        ("size", pa.int32(), "record size"),
        ("tags_code", pa.int64(), "tag hash (deliver time for SCHEDULE_TOPIC_XXXX)"),
    ],
    partition_by=("broker_name",),
    key=("broker_name", "topic", "queue_id", "queue_offset"),
    required=("commitlog_offset",),
)

INDEX_ENTRIES = TableContract(
    name="index_entries",
    description="one row per IndexFile entry (message key hash -> commitlog offset)",
    columns=[
        ("broker_name", pa.string(), "broker the store belongs to"),
        ("index_file", pa.string(), "index file name (yyyyMMddHHmmssSSS)"),
        ("key_hash", pa.int32(), "abs(hashCode(topic#key))"),
        ("commitlog_offset", pa.int64(), "physical offset of the record"),
        ("store_timestamp", pa.int64(), "begin timestamp of the file + timeDiff seconds, epoch ms"),
        ("prev_index", pa.int32(), "previous entry in the slot chain (0 = end)"),
    ],
    partition_by=("broker_name",),
    required=("commitlog_offset",),
)

CORRUPT_RECORDS = TableContract(
    name="corrupt_records",
    description="damaged regions and records the ingest's commitlog walk found (and skipped)",
    columns=[
        ("broker_name", pa.string(), "broker the store belongs to"),
        ("file", pa.string(), "file the problem is in"),
        ("offset", pa.int64(), "byte position in that file"),
        ("reason", pa.string(), "finding kind and detail"),
        ("bytes_skipped", pa.int64(), "bytes a reader jumped over"),
        ("ingest_run_id", pa.string(), "ingest run that found it"),
    ],
    partition_by=("broker_name",),
    required=("file",),
)

# ingest run statuses
INGEST_SUCCEEDED, INGEST_NOTHING_NEW, INGEST_FAILED = "SUCCEEDED", "NOTHING_NEW", "FAILED"
INGEST_RUN_STATUSES = (INGEST_SUCCEEDED, INGEST_NOTHING_NEW, INGEST_FAILED)

INGEST_RUNS = TableContract(
    name="ingest_runs",
    description="one row per ingest run and broker: the commitlog range it covered and the rows it added",
    columns=[
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
        ("status", pa.string(), one_of(INGEST_RUN_STATUSES)),
    ],
    key=("ingest_run_id", "broker_name"),
    required=("ingest_run_id",),
    allowed=[Allowed("status", INGEST_RUN_STATUSES)],
)

CONSUME_QUEUE_TABLE = CONSUME_QUEUE.name
CONSUME_QUEUE_COLUMNS: Columns = list(CONSUME_QUEUE.columns)
CONSUME_QUEUE_SCHEMA = CONSUME_QUEUE.schema

INDEX_ENTRIES_TABLE = INDEX_ENTRIES.name
INDEX_ENTRIES_COLUMNS: Columns = list(INDEX_ENTRIES.columns)
INDEX_ENTRIES_SCHEMA = INDEX_ENTRIES.schema

CORRUPT_RECORDS_TABLE = CORRUPT_RECORDS.name
CORRUPT_RECORDS_COLUMNS: Columns = list(CORRUPT_RECORDS.columns)
CORRUPT_RECORDS_SCHEMA = CORRUPT_RECORDS.schema

INGEST_RUNS_TABLE = INGEST_RUNS.name
INGEST_RUNS_COLUMNS: Columns = list(INGEST_RUNS.columns)
INGEST_RUNS_SCHEMA = INGEST_RUNS.schema
