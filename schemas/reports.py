"""Delta tables written by the report jobs (issue 5): consumer lag, DLQ analysis, store audit.

One definition per table, used by the jobs, the tests and the docs. Timestamps are
``timestamp[us, UTC]``; raw epoch-millisecond store timestamps keep their ``_ms`` suffix.
"""

from __future__ import annotations

import pyarrow as pa

from schemas.tables import Columns, schema_of

_TS = pa.timestamp("us", tz="UTC")

# ---- consumer lag -----------------------------------------------------------------------------------
CONSUMER_LAG_TABLE = "consumer_lag"
CONSUMER_LAG_COLUMNS: Columns = [
    ("snapshot_ts", _TS, "when the snapshot was taken (one value per job run and broker)"),
    ("snapshot_id", pa.string(), "id of the job run that took it"),
    ("broker_name", pa.string(), "broker the store belongs to"),
    ("consumer_group", pa.string(), "consumer group"),
    ("topic", pa.string(), "topic the group consumes (retry topics included)"),
    ("queue_id", pa.int32(), "queue id"),
    ("consumer_offset", pa.int64(), "committed offset (next message to consume); null: never committed"),
    ("min_offset", pa.int64(), "oldest logical offset still in the consume queue"),
    ("max_offset", pa.int64(), "logical offset after the newest message"),
    ("lag_messages", pa.int64(), "max_offset - max(consumer_offset, min_offset); uncommitted: max - min"),
    ("next_store_timestamp_ms", pa.int64(), "store timestamp of the next unconsumed message (null when lag 0)"),
    ("newest_store_timestamp_ms", pa.int64(), "store timestamp of the newest message (null for an empty queue)"),
    ("lag_seconds", pa.float64(), "newest minus next unconsumed store timestamp, seconds (0 when lag 0)"),
    ("lost_messages", pa.int64(), "min_offset - consumer_offset when the offset is below the queue's min"),
    ("offset_source", pa.string(), "consumerOffset.json | none"),
]

CONSUMER_LAG_STATUS_TABLE = "consumer_lag_status"
CONSUMER_LAG_STATUS_COLUMNS: Columns = [
    ("evaluated_at", _TS, "snapshot_ts of the newest snapshot evaluated"),
    ("snapshot_id", pa.string(), "id of the newest snapshot evaluated"),
    ("broker_name", pa.string(), "broker"),
    ("consumer_group", pa.string(), "consumer group"),
    ("topic", pa.string(), "topic; null on the group row"),
    ("queue_id", pa.int32(), "queue id; null on the group row"),
    ("level", pa.string(), "partition | group"),
    ("status", pa.string(), "OK | WARN | STALL | STOP | REWIND (partition); OK | WARN | ERR (group)"),
    ("reason", pa.string(), "why, in words (thresholds broken, offsets seen)"),
    ("snapshots", pa.int32(), "snapshots evaluated (the window)"),
    ("lag_messages", pa.int64(), "lag in the newest snapshot (group: sum over its partitions)"),
    ("lag_seconds", pa.float64(), "lag_seconds in the newest snapshot (group: max)"),
    ("max_lag_messages", pa.int64(), "threshold applied, if any"),
    ("max_lag_seconds", pa.float64(), "threshold applied, if any"),
]

# ---- DLQ --------------------------------------------------------------------------------------------
RETRY_ATTEMPT_TYPE = pa.struct([
    pa.field("attempt", pa.int32()),          # 1 = first redelivery
    pa.field("topic", pa.string()),           # %RETRY%<group> or SCHEDULE_TOPIC_XXXX
    pa.field("commitlog_offset", pa.int64()),
    pa.field("store_time", _TS),
    pa.field("reconsume_times", pa.int32()),
    pa.field("delay_level", pa.int32()),      # DELAY property, null when none
])

DLQ_MESSAGES_TABLE = "dlq_messages"
DLQ_MESSAGES_COLUMNS: Columns = [
    ("broker_name", pa.string(), "broker"),
    ("consumer_group", pa.string(), "group whose DLQ holds the message"),
    ("dlq_topic", pa.string(), "%DLQ%<group>"),
    ("original_topic", pa.string(), "RETRY_TOPIC / DLQ_ORIGIN_TOPIC property, else the real topic"),
    ("msg_id", pa.string(), "offset message id of the DLQ record"),
    ("original_msg_id", pa.string(), "ORIGIN_MESSAGE_ID / DLQ_ORIGIN_MESSAGE_ID"),
    ("uniq_key", pa.string(), "UNIQ_KEY (client message id)"),
    ("keys", pa.list_(pa.string()), "KEYS"),
    ("tags", pa.string(), "TAGS"),
    ("reconsume_times", pa.int32(), "times the message was redelivered"),
    ("first_born_time", _TS, "born time of the original message"),
    ("original_store_time", _TS, "store time of the original message when still in the store"),
    ("dlq_store_time", _TS, "when it reached the DLQ"),
    ("time_to_dlq_s", pa.float64(), "dlq_store_time - first_born_time, seconds"),
    ("dlq_commitlog_offset", pa.int64(), "commitlog offset of the DLQ record"),
    ("store_date", pa.date32(), "UTC date of dlq_store_time (partition column)"),
    ("retry_history", pa.list_(RETRY_ATTEMPT_TYPE), "every retry/schedule record of the same original, in order"),
    ("replayed_at", _TS, "when the latest replay that the target confirmed (replay_ledger SENT) was recorded"),
    ("replay_run_id", pa.string(), "that replay's run id (null: never replayed)"),
]

DLQ_SUMMARY_TABLE = "dlq_summary"
DLQ_SUMMARY_COLUMNS: Columns = [
    ("store_date", pa.date32(), "UTC day the messages reached the DLQ"),
    ("broker_name", pa.string(), "broker"),
    ("consumer_group", pa.string(), "group"),
    ("original_topic", pa.string(), "original topic"),
    ("messages", pa.int64(), "DLQ messages"),
    ("distinct_originals", pa.int64(), "distinct original message ids"),
    ("p50_time_to_dlq_s", pa.float64(), "median time to DLQ, seconds"),
    ("p95_time_to_dlq_s", pa.float64(), "95th percentile time to DLQ, seconds"),
    ("max_time_to_dlq_s", pa.float64(), "slowest, seconds"),
    ("top_keys", pa.list_(pa.string()), "up to 5 most frequent keys"),
    ("top_tags", pa.list_(pa.string()), "up to 5 most frequent tags"),
    ("replayed", pa.int64(), "how many of them a replay has sent back (replay_ledger SENT)"),
]

# ---- audit ------------------------------------------------------------------------------------------
AUDIT_FINDINGS_TABLE = "audit_findings"
AUDIT_FINDINGS_COLUMNS: Columns = [
    ("audit_run_id", pa.string(), "job run"),
    ("audited_at", _TS, "when"),
    ("broker_name", pa.string(), "broker"),
    ("kind", pa.string(), "finding kind (see pipelines.reports.audit.KINDS)"),
    ("file", pa.string(), "file the finding points at"),
    ("offset", pa.int64(), "byte position in that file (or logical offset, see detail)"),
    ("commitlog_offset", pa.int64(), "physical offset involved, when there is one"),
    ("topic", pa.string(), "topic involved, when there is one"),
    ("queue_id", pa.int32(), "queue involved, when there is one"),
    ("detail", pa.string(), "what was found, in words"),
]

TOPIC_DAILY_STATS_TABLE = "topic_daily_stats"
TOPIC_DAILY_STATS_COLUMNS: Columns = [
    ("store_date", pa.date32(), "UTC day"),
    ("broker_name", pa.string(), "broker"),
    ("topic", pa.string(), "real topic (REAL_TOPIC for scheduled/retried/half messages)"),
    ("messages", pa.int64(), "records"),
    ("bytes", pa.int64(), "sum of store_size"),
    ("body_bytes", pa.int64(), "sum of body length"),
    ("distinct_producers", pa.int64(), "distinct born hosts"),
    ("first_store_time", _TS, "earliest store time"),
    ("last_store_time", _TS, "latest store time"),
    ("audit_run_id", pa.string(), "job run that computed it"),
]

CONSUMER_LAG_SCHEMA = schema_of(CONSUMER_LAG_COLUMNS)
CONSUMER_LAG_STATUS_SCHEMA = schema_of(CONSUMER_LAG_STATUS_COLUMNS)
DLQ_MESSAGES_SCHEMA = schema_of(DLQ_MESSAGES_COLUMNS)
DLQ_SUMMARY_SCHEMA = schema_of(DLQ_SUMMARY_COLUMNS)
AUDIT_FINDINGS_SCHEMA = schema_of(AUDIT_FINDINGS_COLUMNS)
TOPIC_DAILY_STATS_SCHEMA = schema_of(TOPIC_DAILY_STATS_COLUMNS)

REPORT_SCHEMAS: dict[str, pa.Schema] = {
    CONSUMER_LAG_TABLE: CONSUMER_LAG_SCHEMA,
    CONSUMER_LAG_STATUS_TABLE: CONSUMER_LAG_STATUS_SCHEMA,
    DLQ_MESSAGES_TABLE: DLQ_MESSAGES_SCHEMA,
    DLQ_SUMMARY_TABLE: DLQ_SUMMARY_SCHEMA,
    AUDIT_FINDINGS_TABLE: AUDIT_FINDINGS_SCHEMA,
    TOPIC_DAILY_STATS_TABLE: TOPIC_DAILY_STATS_SCHEMA,
}
