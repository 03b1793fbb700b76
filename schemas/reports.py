"""Delta tables written by the report jobs (issue 5): consumer lag, DLQ analysis, store audit.

One contract per table (:class:`schemas.contract.TableContract`), used by the jobs, the quality
suites, the tests and the docs. Timestamps are ``timestamp[us, UTC]``; raw epoch-millisecond store
timestamps keep their ``_ms`` suffix. The enumerations the report jobs write (offset sources, lag
levels and statuses, audit finding kinds) are declared here, with the tables that hold them.
"""

from __future__ import annotations

import pyarrow as pa

from broker.store import findings as fk
from schemas.contract import Allowed, Columns, TableContract, one_of

_TS = pa.timestamp("us", tz="UTC")

# ---- consumer lag -----------------------------------------------------------------------------------
OFFSET_SOURCE_FILE = "consumerOffset.json"  # the broker's committed offsets file
OFFSET_SOURCE_NONE = "none"                 # the group never committed an offset for the queue
OFFSET_SOURCES = (OFFSET_SOURCE_FILE, OFFSET_SOURCE_NONE)

CONSUMER_LAG = TableContract(
    name="consumer_lag",
    description="lag snapshots: one row per snapshot and (broker, group, topic, queue)",
    columns=[
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
        ("offset_source", pa.string(), one_of(OFFSET_SOURCES)),
    ],
    partition_by=("broker_name",),
    key=("snapshot_id", "broker_name", "consumer_group", "topic", "queue_id"),
    allowed=[Allowed("offset_source", OFFSET_SOURCES)],
)

# Burrow-style statuses (pipelines.reports.lag_status): partition rows and group rows
LAG_OK, LAG_WARN, LAG_STALL, LAG_STOP, LAG_REWIND, LAG_ERR = "OK", "WARN", "STALL", "STOP", "REWIND", "ERR"
LEVEL_PARTITION, LEVEL_GROUP = "partition", "group"
LAG_LEVELS = (LEVEL_PARTITION, LEVEL_GROUP)
PARTITION_STATUSES = (LAG_OK, LAG_WARN, LAG_STALL, LAG_STOP, LAG_REWIND)
GROUP_STATUSES = (LAG_OK, LAG_WARN, LAG_ERR)

CONSUMER_LAG_STATUS = TableContract(
    name="consumer_lag_status",
    description="Burrow-style evaluations of the newest lag snapshots: one row per partition and per group, "
                "appended on every evaluation",
    columns=[
        ("evaluated_at", _TS, "snapshot_ts of the newest snapshot evaluated"),
        ("snapshot_id", pa.string(), "id of the newest snapshot evaluated"),
        ("broker_name", pa.string(), "broker"),
        ("consumer_group", pa.string(), "consumer group"),
        ("topic", pa.string(), "topic; null on the group row"),
        ("queue_id", pa.int32(), "queue id; null on the group row"),
        ("level", pa.string(), one_of(LAG_LEVELS)),
        ("status", pa.string(),
         f"{one_of(PARTITION_STATUSES)} ({LEVEL_PARTITION}); {one_of(GROUP_STATUSES)} ({LEVEL_GROUP})"),
        ("reason", pa.string(), "why, in words (thresholds broken, offsets seen)"),
        ("snapshots", pa.int32(), "snapshots evaluated (the window)"),
        ("lag_messages", pa.int64(), "lag in the newest snapshot (group: sum over its partitions)"),
        ("lag_seconds", pa.float64(), "lag_seconds in the newest snapshot (group: max)"),
        ("max_lag_messages", pa.int64(), "threshold applied, if any"),
        ("max_lag_seconds", pa.float64(), "threshold applied, if any"),
    ],
    partition_by=("broker_name",),
    # no key: evaluating twice without a new snapshot legitimately repeats (snapshot_id, group, partition)
    allowed=[Allowed("level", LAG_LEVELS),
             Allowed("status", PARTITION_STATUSES, when=("level", LEVEL_PARTITION)),
             Allowed("status", GROUP_STATUSES, when=("level", LEVEL_GROUP))],
)

# ---- DLQ --------------------------------------------------------------------------------------------
RETRY_ATTEMPT_TYPE = pa.struct([
    pa.field("attempt", pa.int32()),          # 1 = first redelivery
    pa.field("topic", pa.string()),           # %RETRY%<group> or SCHEDULE_TOPIC_XXXX
    pa.field("commitlog_offset", pa.int64()),
    pa.field("store_time", _TS),
    pa.field("reconsume_times", pa.int32()),
    pa.field("delay_level", pa.int32()),      # DELAY property, null when none
])

DLQ_MESSAGES = TableContract(
    name="dlq_messages",
    description="one row per message in a %DLQ% topic, with where it came from and its retry history",
    columns=[
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
        ("original_commitlog_offset", pa.int64(),
         "commitlog offset of the original on the same broker when still in the store: joins "
         "messages and the typed payload_<topic> tables (commitlog_offset)"),
    ],
    # day-pruned reads ("what died yesterday") are the common query
    partition_by=("store_date",),
    key=("broker_name", "dlq_commitlog_offset"),
)

DLQ_SUMMARY = TableContract(
    name="dlq_summary",
    description="DLQ arrivals per (day, broker, group, original topic): counts, time to DLQ, top keys and tags",
    columns=[
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
    ],
    # a few rows per day and group: one file is best
    key=("store_date", "broker_name", "consumer_group", "original_topic"),
)

# ---- audit ------------------------------------------------------------------------------------------
# finding kinds (the store reader's names where it has one; rules in pipelines.reports.audit)
CQ_OFFSET_REPEAT = "cq_offset_repeat"
CQ_PHY_NOT_INCREASING = "cq_phy_not_increasing"
INDEX_MISSING_KEY = "index_missing_key"
DUPLICATE_UNIQ_KEY = "duplicate_uniq_key"
PAYLOAD_QUARANTINED = "payload_quarantined"
TRANSACTION_UNRESOLVED = "transaction_unresolved"
COMMIT_WITHOUT_HALF = "commit_without_half"
REPLICA_LAG = "replica_lag"
REPLICA_DIVERGENT = "replica_divergent"
AUDIT_KINDS: tuple[str, ...] = (
    fk.CRC_MISMATCH,
    fk.CORRUPT_REGION,
    fk.CQ_DANGLING,
    fk.CQ_MISMATCH,
    fk.CQ_MISSING,
    fk.CQ_OFFSET_GAP,
    CQ_OFFSET_REPEAT,
    CQ_PHY_NOT_INCREASING,
    INDEX_MISSING_KEY,
    DUPLICATE_UNIQ_KEY,
    PAYLOAD_QUARANTINED,
    TRANSACTION_UNRESOLVED,
    COMMIT_WITHOUT_HALF,
    REPLICA_LAG,
    REPLICA_DIVERGENT,
)

AUDIT_FINDINGS = TableContract(
    name="audit_findings",
    description="integrity findings of the store audit: what is wrong, in which file and where",
    columns=[
        ("audit_run_id", pa.string(), "job run"),
        ("audited_at", _TS, "when"),
        ("broker_name", pa.string(), "broker"),
        ("kind", pa.string(), f"finding kind ({one_of(AUDIT_KINDS)}; rules: pipelines.reports.audit)"),
        ("file", pa.string(), "file the finding points at"),
        ("offset", pa.int64(), "byte position in that file (or logical offset, see detail)"),
        ("commitlog_offset", pa.int64(), "physical offset involved, when there is one"),
        ("topic", pa.string(), "topic involved, when there is one"),
        ("queue_id", pa.int32(), "queue involved, when there is one"),
        ("detail", pa.string(), "what was found, in words"),
    ],
    required=("broker_name", "kind"),
    allowed=[Allowed("kind", AUDIT_KINDS)],
)

TOPIC_DAILY_STATS = TableContract(
    name="topic_daily_stats",
    description="per (day, broker, real topic): records, bytes, producers and the time span stored",
    columns=[
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
    ],
    key=("store_date", "broker_name", "topic"),
)

REPORT_CONTRACTS: tuple[TableContract, ...] = (CONSUMER_LAG, CONSUMER_LAG_STATUS, DLQ_MESSAGES, DLQ_SUMMARY,
                                               AUDIT_FINDINGS, TOPIC_DAILY_STATS)

# ---- the names every module imported before the contracts existed ------------------------------------
CONSUMER_LAG_TABLE = CONSUMER_LAG.name
CONSUMER_LAG_COLUMNS: Columns = list(CONSUMER_LAG.columns)
CONSUMER_LAG_SCHEMA = CONSUMER_LAG.schema

CONSUMER_LAG_STATUS_TABLE = CONSUMER_LAG_STATUS.name
CONSUMER_LAG_STATUS_COLUMNS: Columns = list(CONSUMER_LAG_STATUS.columns)
CONSUMER_LAG_STATUS_SCHEMA = CONSUMER_LAG_STATUS.schema

DLQ_MESSAGES_TABLE = DLQ_MESSAGES.name
DLQ_MESSAGES_COLUMNS: Columns = list(DLQ_MESSAGES.columns)
DLQ_MESSAGES_SCHEMA = DLQ_MESSAGES.schema

DLQ_SUMMARY_TABLE = DLQ_SUMMARY.name
DLQ_SUMMARY_COLUMNS: Columns = list(DLQ_SUMMARY.columns)
DLQ_SUMMARY_SCHEMA = DLQ_SUMMARY.schema

AUDIT_FINDINGS_TABLE = AUDIT_FINDINGS.name
AUDIT_FINDINGS_COLUMNS: Columns = list(AUDIT_FINDINGS.columns)
AUDIT_FINDINGS_SCHEMA = AUDIT_FINDINGS.schema

TOPIC_DAILY_STATS_TABLE = TOPIC_DAILY_STATS.name
TOPIC_DAILY_STATS_COLUMNS: Columns = list(TOPIC_DAILY_STATS.columns)
TOPIC_DAILY_STATS_SCHEMA = TOPIC_DAILY_STATS.schema

REPORT_SCHEMAS: dict[str, pa.Schema] = {c.name: c.schema for c in REPORT_CONTRACTS}
