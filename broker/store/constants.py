"""Every fixed number and name of the Apache RocketMQ store format, in one place.

Values follow ``shared/reference/store-format.md`` (Apache RocketMQ 4.9.8 / 5.3.3). All multi-byte
integers on disk are big-endian.
"""

from __future__ import annotations

import re
from enum import StrEnum

# --- record magic codes (signed Java ints on disk) -----------------------------------------------
MESSAGE_MAGIC_CODE_V1 = 0xDAA320A7  # 1-byte topic length
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB  # 2-byte topic length (5.0.0+)
BLANK_MAGIC_CODE = 0xCBD43194  # end-of-file filler


def signed32(value: int) -> int:
    """Java's view of an unsigned 32-bit constant (what the golden dumps print)."""
    return value - (1 << 32) if value & 0x80000000 else value


MESSAGE_MAGIC_CODES = (MESSAGE_MAGIC_CODE_V1, MESSAGE_MAGIC_CODE_V2)

# --- commitlog record layout ------------------------------------------------------------------
END_FILE_MIN_BLANK_LENGTH = 8  # a full file always keeps room for the BLANK header
BLANK_HEADER_SIZE = 8
# field positions, host sizes and the fixed record size: broker/store/record_layout.py
MAX_TOPIC_LENGTH_V1 = 127  # signed byte
MAX_TOPIC_LENGTH = 127  # TopicValidator limit (characters), 4.x and 5.x
MAX_PROPERTIES_LENGTH = 32767  # signed short
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024  # maxMessageSize: body limit
MAX_RECORD_OVERHEAD = 64 * 1024  # whole record may be body + 64 KiB

# --- sysFlag bits (MessageSysFlag) -------------------------------------------------------------
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_TYPE_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80
COMPRESSION_TYPE_MASK = 0x700
COMPRESSION_LZ4 = 0x100
COMPRESSION_ZSTD = 0x200
COMPRESSION_ZLIB = 0x300

# Names used in the inspector's JSON and the Delta tables, indexed by the 2-bit transaction type.
TRANSACTION_TYPE_NAMES = ("NOT", "PREPARED", "COMMIT", "ROLLBACK")
# The dispatcher's transaction rule (DefaultMessageStore.CommitLogDispatcherBuildConsumeQueue /
# BuildIndex): a plain or committed message is queued (gets a queue offset and a consume-queue
# unit); a half (PREPARED) or ROLLBACK record is not. Everything but ROLLBACK is indexed.
QUEUED_TRANSACTION_TYPES = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
QUEUED_TRANSACTION_TYPE_NAMES = tuple(TRANSACTION_TYPE_NAMES[t >> 2] for t in QUEUED_TRANSACTION_TYPES)
NOT_INDEXED_TRANSACTION_TYPE = TRANSACTION_ROLLBACK_TYPE
NOT_INDEXED_TRANSACTION_TYPE_NAME = TRANSACTION_TYPE_NAMES[NOT_INDEXED_TRANSACTION_TYPE >> 2]


def is_queued(sys_flag: int) -> bool:
    """Whether a record with this sysFlag is queued (see ``QUEUED_TRANSACTION_TYPES``)."""
    return sys_flag & TRANSACTION_TYPE_MASK in QUEUED_TRANSACTION_TYPES


def is_indexed(sys_flag: int) -> bool:
    """Whether a record with this sysFlag is indexed (everything but ROLLBACK)."""
    return sys_flag & TRANSACTION_TYPE_MASK != NOT_INDEXED_TRANSACTION_TYPE


def queued_mask(sys_flags):  # numpy array in, boolean array out (no numpy import in this module)
    """:func:`is_queued` over a numpy array of sysFlags (the dispatcher's runs of records)."""
    tx = sys_flags & TRANSACTION_TYPE_MASK
    mask = tx == QUEUED_TRANSACTION_TYPES[0]
    for t in QUEUED_TRANSACTION_TYPES[1:]:
        mask = mask | (tx == t)
    return mask


def indexed_mask(sys_flags):
    """:func:`is_indexed` over a numpy array of sysFlags."""
    return (sys_flags & TRANSACTION_TYPE_MASK) != NOT_INDEXED_TRANSACTION_TYPE

COMPRESSION_NAMES = ("NONE", "ZLIB", "LZ4", "ZSTD")
COMPRESSION_NONE, COMPRESSION_NAME_ZLIB, COMPRESSION_NAME_LZ4, COMPRESSION_NAME_ZSTD = COMPRESSION_NAMES
COMPRESSION_BITS_BY_NAME = {"ZLIB": COMPRESSION_ZLIB, "LZ4": COMPRESSION_LZ4, "ZSTD": COMPRESSION_ZSTD}

# --- properties --------------------------------------------------------------------------------
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_TRAN_MSG = "TRAN_MSG"
PROPERTY_PGROUP = "PGROUP"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_INNER_NUM = "INNER_NUM"
PROPERTY_INNER_BASE = "INNER_BASE"
PROPERTY_CRC32 = "__CRC32#"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
# transaction check bookkeeping the broker writes on re-put half messages (MessageConst, 4.9)
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
CRC32_RESERVED_LENGTH = 20  # "__CRC32#" + 0x01 + 10 digits + 0x02

# Properties a client may not set: the Java client's reserved set (MessageConst.STRING_HASH_SET,
# 4.9.x and 5.x) plus what brokers write themselves (5.x DLQ origin, the CRC property, inner-batch
# and transaction-check bookkeeping). Copying one into a new message changes what the target broker
# does with it (DELAY goes through the schedule topic, TRAN_MSG makes a half message, ...).
SYSTEM_PROPERTY_NAMES = frozenset({
    "TRACE_ON", "MSG_REGION", PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_WAIT, PROPERTY_DELAY, PROPERTY_RETRY_TOPIC,
    PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, PROPERTY_TRAN_MSG, PROPERTY_PGROUP, "MIN_OFFSET", "MAX_OFFSET",
    "BUYER_ID", PROPERTY_ORIGIN_MESSAGE_ID, "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME",
    PROPERTY_UNIQ_KEY, "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME",
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "DUP_INFO", "EXTEND_UNIQ_INFO", "INSTANCE_ID", "CORRELATION_ID",
    "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", PROPERTY_CLUSTER, "MSG_TYPE",
    "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
    "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP",
    # written by brokers, not in the client's set
    PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_DLQ_ORIGIN_MESSAGE_ID, PROPERTY_CRC32, PROPERTY_INNER_NUM, PROPERTY_INNER_BASE,
    PROPERTY_TRANSACTION_CHECK_TIMES, PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "__transactionId__",
    "PROPERTY_FORWARD_QUEUE_ID",
    "REDIRECT", "INNER_MULTI_DISPATCH", "TRACE_CONTEXT",
})
TRANSIENT_PROPERTY_PREFIX = "__RMQ.TRANSIENT."  # never stored by a broker

# --- consume queue / ext ---------------------------------------------------------------------
CQ_STORE_UNIT_SIZE = 20
DEFAULT_CQ_UNITS_PER_FILE = 300_000
DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE = DEFAULT_CQ_UNITS_PER_FILE * CQ_STORE_UNIT_SIZE
DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE_EXT = 48 * 1024 * 1024
CQ_EXT_MAX_ADDR = -2147483649  # tagsCode <= this is an ext address (0xFFFFFFFF7FFFFFFF)
CQ_EXT_ADDR_BASE = -(1 << 63)  # address = ext byte offset + Long.MIN_VALUE
CQ_EXT_END_MARKER = -1  # short written when a unit does not fit the rest of a file
CQ_EXT_UNIT_HEADER_SIZE = 20
CQ_FILL_UNIT_SIZE = 0x7FFFFFFF  # "pre-blank" fill units (phy 0, size MAX_INT, tags 0)

# --- commitlog ----------------------------------------------------------------------------------
DEFAULT_MAPPED_FILE_SIZE_COMMITLOG = 1024 * 1024 * 1024
FILE_NAME_DIGITS = 20

# --- index ----------------------------------------------------------------------------------------
INDEX_HEADER_SIZE = 40
INDEX_HASH_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
DEFAULT_MAX_HASH_SLOT_NUM = 5_000_000
DEFAULT_MAX_INDEX_NUM = 5_000_000 * 4
MAX_MSGS_NUM_BATCH = 64  # Apache caps one index query at this; our inspector does not
INDEX_KEY_JOINER = "#"
INDEX_FILE_NAME_FORMAT = "%Y%m%d%H%M%S"  # + 3 digits of milliseconds (yyyyMMddHHmmssSSS)

# --- checkpoint / lock / config -----------------------------------------------------------------
OS_PAGE_SIZE = 4096
CHECKPOINT_FILE_SIZE = OS_PAGE_SIZE
LOCK_FILE_CONTENT = b"lock"
TOPIC_GROUP_SEPARATOR = "@"

# --- store directory layout -----------------------------------------------------------------------
COMMITLOG_DIR = "commitlog"
CONSUME_QUEUE_DIR = "consumequeue"
CONSUME_QUEUE_EXT_DIR = "consumequeue_ext"
INDEX_DIR = "index"
CONFIG_DIR = "config"
CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
TOPICS_FILE = "topics.json"
CONSUMER_OFFSET_FILE = "consumerOffset.json"
SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"
DELAY_OFFSET_FILE = "delayOffset.json"
# Ours, beside Apache's config files (Apache ignores it): deleted topic -> commitlog offset at its
# deletion. The topic's records below it belong to no consume queue any more (DELETE_TOPIC_IN_BROKER).
DELETED_TOPICS_FILE = "rocketlakeDeletedTopics.json"

# --- delay levels ----------------------------------------------------------------------------------
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


class FlushDiskType(StrEnum):
    """``flushDiskType``: when a put is acknowledged. A ``str`` subclass, so it compares, prints and
    pickles as the plain broker.conf value."""

    ASYNC_FLUSH = "ASYNC_FLUSH"  # acknowledged once written; fsync every flushIntervalCommitLog ms
    SYNC_FLUSH = "SYNC_FLUSH"  # acknowledged after fsync (group commit), or FLUSH_DISK_TIMEOUT


ASYNC_FLUSH = FlushDiskType.ASYNC_FLUSH
SYNC_FLUSH = FlushDiskType.SYNC_FLUSH
FLUSH_DISK_TYPES = tuple(t.value for t in FlushDiskType)

# --- topic names -----------------------------------------------------------------------------------
TOPIC_NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")

# --- config/*.json persistence (ConfigManager / MixAll.string2File) ----------------------------------
CONFIG_BACKUP_SUFFIX = ".bak"  # previous content, read when the main file is missing/empty/unparsable
CONFIG_TEMP_SUFFIX = ".tmp"  # new content before it is renamed over the main file
