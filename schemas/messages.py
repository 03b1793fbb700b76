"""The ``messages`` record: one row per CommitLog message record.

``RECORD_SCHEMA`` is what the store decoder (:mod:`broker.store.columnar`) emits and what
``rocketlake store messages`` prints, field for field; the Delta ``messages`` table (:data:`MESSAGES`)
is the same columns plus lineage and derived ones. Columns are (name, Arrow type, description) so
docs, field metadata and Spark schemas derive from one list.
"""

from __future__ import annotations

import pyarrow as pa

from broker.store.constants import COMPRESSION_NAMES, MESSAGE_MAGIC_CODES, TRANSACTION_TYPE_NAMES, signed32
from schemas.contract import Allowed, Columns, TableContract, one_of, schema_of

# the record magic as the decoder emits it (a signed Java int)
MAGIC_CODE_VALUES: tuple[int, ...] = tuple(signed32(m) for m in MESSAGE_MAGIC_CODES)

RECORD_COLUMNS: Columns = [
    ("commitlog_offset", pa.int64(), "physical offset of the record in the CommitLog"),
    ("store_size", pa.int32(), "TOTALSIZE: bytes of the whole record"),
    ("magic_code", pa.int32(), "record magic as a signed int ({} = V1, {} = V2)".format(*MAGIC_CODE_VALUES)),
    ("body_crc", pa.int32(), "BODYCRC as stored (CRC-32 of the stored body & 0x7FFFFFFF)"),
    ("body_crc_ok", pa.bool_(), "stored BODYCRC equals the CRC recomputed over the stored body"),
    ("queue_id", pa.int32(), "queue id in the stored topic"),
    ("flag", pa.int32(), "user flag"),
    ("queue_offset", pa.int64(), "logical offset in the ConsumeQueue (0 for PREPARED/ROLLBACK)"),
    ("sys_flag", pa.int32(), "sysFlag bits as stored"),
    ("transaction_type", pa.string(), one_of(TRANSACTION_TYPE_NAMES)),
    ("compression", pa.string(), one_of(COMPRESSION_NAMES)),
    ("born_timestamp", pa.int64(), "producer clock, epoch ms"),
    ("store_timestamp", pa.int64(), "broker clock at append, epoch ms"),
    ("born_host", pa.string(), "producer address 'a.b.c.d:port' or '[v6]:port'"),
    ("store_host", pa.string(), "broker address 'a.b.c.d:port' or '[v6]:port'"),
    ("reconsume_times", pa.int32(), "redelivery count"),
    ("prepared_transaction_offset", pa.int64(), "offset of the half/prepared record for commit/rollback, else 0"),
    ("topic", pa.string(), "stored topic (SCHEDULE_TOPIC_XXXX, %RETRY%g, … as written)"),
    ("real_topic", pa.string(), "topic the user sent to (REAL_TOPIC of delayed and half messages)"),
    ("properties", pa.map_(pa.string(), pa.string()), "all properties, in stored order"),
    ("keys", pa.list_(pa.string()), "KEYS split on spaces (empty tokens dropped)"),
    ("tags", pa.string(), "TAGS"),
    ("uniq_key", pa.string(), "UNIQ_KEY (client message id)"),
    ("offset_msg_id", pa.string(), "broker message id: store host + physical offset, uppercase hex"),
    ("body", pa.binary(), "payload as the producer sent it (decompressed)"),
]

RECORD_SCHEMA = schema_of(RECORD_COLUMNS)
RECORD_FIELD_NAMES = [name for name, _, _ in RECORD_COLUMNS]


# ---- the Delta ``messages`` table: the record columns plus lineage and derived columns ----------------
LAKE_COLUMNS: Columns = [
    ("born_time", pa.timestamp("us", tz="UTC"), "born_timestamp as a UTC timestamp"),
    ("store_time", pa.timestamp("us", tz="UTC"), "store_timestamp as a UTC timestamp"),
    ("broker_name", pa.string(), "broker the store belongs to (--store NAME=PATH)"),
    ("store_date", pa.date32(), "UTC date of store_time (partition column)"),
    ("segment_file", pa.string(), "commitlog file the record was read from"),
    ("ingest_run_id", pa.string(), "ingest run that wrote the row"),
    ("is_retry", pa.bool_(), "stored in a %RETRY%<group> topic"),
    ("is_dlq", pa.bool_(), "stored in a %DLQ%<group> topic"),
    ("consumer_group", pa.string(), "group of a %RETRY%/%DLQ% topic, else null"),
    ("origin_msg_id", pa.string(), "ORIGIN_MESSAGE_ID (or 5.x DLQ_ORIGIN_MESSAGE_ID) of a retried message"),
]

MESSAGES = TableContract(
    name="messages",
    description="one row per CommitLog message record of each broker's store, decoded field for field",
    columns=RECORD_COLUMNS + LAKE_COLUMNS,
    partition_by=("broker_name", "store_date"),
    key=("broker_name", "commitlog_offset"),
    required=("commitlog_offset", "topic"),
    allowed=(Allowed("magic_code", MAGIC_CODE_VALUES),
             Allowed("transaction_type", TRANSACTION_TYPE_NAMES),
             Allowed("compression", COMPRESSION_NAMES)),
)

MESSAGES_TABLE = MESSAGES.name
MESSAGES_COLUMNS: Columns = list(MESSAGES.columns)
MESSAGES_SCHEMA = MESSAGES.schema
MESSAGES_PARTITION_BY = list(MESSAGES.partition_by)


def body_as_view(schema: pa.Schema) -> pa.Schema:
    """``schema`` with ``body`` as ``binary_view``: the decoder's zero-copy form (each body stays in
    the mapped segment instead of being copied into one buffer). Parquet stores it as the same
    BYTE_ARRAY column, so tables written from either form are identical to readers."""
    i = schema.get_field_index("body")
    return schema.set(i, schema.field(i).with_type(pa.binary_view()))
