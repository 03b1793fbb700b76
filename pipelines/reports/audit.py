"""Store audit: integrity findings and per-day topic statistics, computed with Spark from the lake.

Input are the ingest's Delta tables (``messages``, ``consume_queue``, ``index_entries``,
``corrupt_records``) plus a small :class:`StoreLayout` per broker read off the store directory (CQ
file sizes and index geometry, so that a finding can name the file and byte it is about). The
checks are joins, anti-joins and window sorts over whole tables; only findings (few) reach the
driver. Per-broker constants (store roots, file sizes, bounds) enter the plans as literal maps,
not as broadcast joins: each broadcast of a driver-made frame would cost a Spark job.

Finding kinds (:data:`KINDS`) and their rules:

``crc_mismatch``
    A record whose stored BODYCRC does not match its body (``messages.body_crc_ok`` false).
    file/offset: the commitlog file and the record's position in it.
``corrupt_region``
    Every structural finding of the ingest's commitlog walk (``corrupt_records`` rows other than
    its CRC rows, which ``crc_mismatch`` already reports with more context): zeroed regions, bad
    magic, bad sizes, torn tails, wrong file sizes. The walker's own kind starts ``detail``.
``cq_dangling_unit``
    A ConsumeQueue unit whose commitlog offset is not the start of any record, judged only inside
    the commitlog range the lake holds records for (a unit below it points at an expired file).
``cq_mismatch``
    A unit that points at a record of another topic or queue, or whose size or logical offset
    disagrees with the record's TOTALSIZE or QUEUEOFFSET. Records are compared by *stored* topic
    and queue id: ``SCHEDULE_TOPIC_XXXX`` records are dispatched to that topic's queue
    ``delayLevel - 1``, and their queue id is stored as such (as :mod:`broker.store.verify` does).
``cq_missing_unit``
    A dispatchable record (transaction type NOT or COMMIT; PREPARED and ROLLBACK are never queued)
    at or below the newest unit's commitlog offset that no unit points at. Records after the last
    dispatched one are the dispatcher's backlog, not a defect; nor are the records of a topic deleted on
    the broker that lie below its fence (``config/rocketlakeDeletedTopics.json``: the commitlog end at
    deletion). file/offset: where its unit belongs.
``cq_offset_gap`` / ``cq_offset_repeat``
    Per queue, logical offsets must be consecutive from the smallest one: a gap is reported where
    the first missing unit belongs, a repeat (a second unit with the same logical offset) there.
``cq_phy_not_increasing``
    A unit whose commitlog offset is not greater than the previous unit's (a queue is written in
    commitlog order).
``index_missing_key``
    A key of an indexed record (UNIQ_KEY and each KEYS token, as ``topic#key`` with the stored
    topic; ROLLBACK records are never indexed) with no index entry of that hash and commitlog offset.
    Only records inside the index's coverage are judged: between the smallest and the largest
    commitlog offset of any index entry of the broker. Older records lost their index files to
    expiry, newer ones are not indexed yet (``index_entries`` stops at the dispatcher's progress).
    file/offset: the index file whose entries cover that offset (the last file whose smallest
    offset is not above it) and the hash slot the key's chain starts at (``40 + (hash % slots) *
    4``). Presence is checked, not chain reachability: the table keeps no entry numbers. All-zero
    entries (zeroed or never written) are not entries: they neither index nor extend coverage.
``payload_quarantined``
    A record of a topic with a declared payload schema whose body did not decode
    (``payload_quarantine``; the reason is the detail). The record itself is intact and in
    ``messages``; only its typed row is missing. file/offset: its commitlog file and position.
``duplicate_uniq_key``
    A dispatchable record in a user topic whose UNIQ_KEY an earlier record of the same topic
    already has (a producer retry that was stored twice). Retry, DLQ and system topics are left
    out: redeliveries, delay rounds and transaction checks legitimately store a message again.
    file/offset: each later copy's commitlog file and position.
``transaction_unresolved``
    A transactional message whose half (``RMQ_SYS_TRANS_HALF_TOPIC``) never got an op record: no copy
    of it (the half and the copies the transaction check put back, one UNIQ_KEY) has an op record in
    ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` naming its queue offset, so it was never committed or rolled back
    (so far: a transaction still in flight at ingest time is one too; one the broker gave up on was
    copied to ``TRANS_CHECK_MAX_TIME_TOPIC``). One finding per transaction, at its newest copy.
``commit_without_half``
    A COMMIT record whose PREPAREDTRANSACTIONOFFSET is not the start of a half message (a record of
    the half topic, or a PREPARED record of a pre-4.3 producer) the lake holds, judged only where the
    lake holds records (an older half may have expired with its commitlog file).
``replica_lag``
    For a replica pair named with ``--replica SLAVE=MASTER`` (a 4.x slave copies its master's
    commitlog bytes at the same offsets): one finding per pair whose slave does not end where its
    master does, under the slave's name. ``detail`` gives the lag in bytes (end of the master's last
    record - end of the slave's), in ms (store time of the master's last record - the slave's), the
    number of records the slave lacks and the store time of the first one; file/offset: the master's
    commitlog file and position of that first missing record. A slave ahead of its master is
    reported here too ("ahead" in ``detail``, no file; ``commitlog_offset``: where the master ends).
``replica_divergent``
    A commitlog offset inside the range both stores of a pair hold where the two ``messages`` rows
    differ (one Spark join on the physical offset): a record on one side only, or different stored
    fields (:data:`REPLICA_COMPARED_COLUMNS`, the body and the properties by hash). ``detail`` names
    the fields; file/offset: the slave's commitlog file and the record's position in it.

Why a full recompute each run is fine: the audit is a consistency check between tables that grow
independently (a CQ unit or index entry ingested today can point at a record ingested last week,
and coverage changes when index files expire), so findings about old data can appear or vanish
with new data; the job replaces only the brokers it was given, in one commit per table. Its cost
is a scan of the columns listed in :func:`audit_inputs` (plus ``body`` for ``body_bytes``).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from broker.store import findings as fk
from broker.store.config_files import load_topic_fences, parse_config_text, topic_fences_from
from broker.store.constants import (
    COMMITLOG_DIR,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_NAMES,
    CONFIG_DIR,
    CONSUME_QUEUE_DIR,
    CQ_STORE_UNIT_SIZE,
    DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE,
    DEFAULT_MAX_HASH_SLOT_NUM,
    DELETED_TOPICS_FILE,
    INDEX_DIR,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_KEY_JOINER,
    NOT_INDEXED_TRANSACTION_TYPE_NAME,
    QUEUED_TRANSACTION_TYPE_NAMES,
)
from broker.store.topics import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    SYSTEM_TOPIC_PREFIX,
    SYSTEM_TOPICS,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    WRAPPER_TOPICS,
)
from pipelines.job_args import StoreSpec
from pipelines.storage import Location
from pipelines.store_files import StoreFiles
from schemas.messages import MESSAGES_SCHEMA, MESSAGES_TABLE
from schemas.payloads import PAYLOAD_QUARANTINE_SCHEMA, PAYLOAD_QUARANTINE_TABLE
from schemas.reports import (
    AUDIT_KINDS,
    COMMIT_WITHOUT_HALF,
    CQ_OFFSET_REPEAT,
    REPLICA_DIVERGENT,
    REPLICA_LAG,
    CQ_PHY_NOT_INCREASING,
    DUPLICATE_UNIQ_KEY,
    INDEX_MISSING_KEY,
    PAYLOAD_QUARANTINED,
    TRANSACTION_UNRESOLVED,
    AUDIT_FINDINGS_SCHEMA,
    AUDIT_FINDINGS_TABLE,
    TOPIC_DAILY_STATS_SCHEMA,
    TOPIC_DAILY_STATS_TABLE,
)
from schemas.tables import (
    CONSUME_QUEUE_SCHEMA,
    CONSUME_QUEUE_TABLE,
    CORRUPT_RECORDS_SCHEMA,
    CORRUPT_RECORDS_TABLE,
    INDEX_ENTRIES_SCHEMA,
    INDEX_ENTRIES_TABLE,
)

log = logging.getLogger(__name__)

# ---- finding kinds (the store reader's names where it has one) ----------------------------------------
CRC_MISMATCH = fk.CRC_MISMATCH
CORRUPT_REGION = fk.CORRUPT_REGION
CQ_DANGLING = fk.CQ_DANGLING
CQ_MISMATCH = fk.CQ_MISMATCH
CQ_MISSING = fk.CQ_MISSING
CQ_OFFSET_GAP = fk.CQ_OFFSET_GAP
KINDS = AUDIT_KINDS  # declared with the audit_findings table (schemas.reports)

_CRC_REASON_PREFIX = CRC_MISMATCH + ":"
_FINDING_COLUMNS = ["broker_name", "kind", "file", "offset", "commitlog_offset", "topic", "queue_id", "detail"]
_UINT32 = 1 << 32
# the stored fields a slave's record must share with its master's at the same commitlog offset (plus
# the body and the properties, compared by hash): everything the record's bytes decide
REPLICA_COMPARED_COLUMNS = ("store_size", "magic_code", "body_crc", "body_crc_ok", "queue_id", "flag", "queue_offset",
                            "sys_flag", "born_timestamp", "store_timestamp", "born_host", "store_host",
                            "reconsume_times", "prepared_transaction_offset", "topic", "tags", "uniq_key",
                            "offset_msg_id")
_KEY_SEP = "\u0000"  # joins broker, topic and queue id into one literal-map key (never in a name)


# ---- store layout (small, read by the driver) ---------------------------------------------------------

@dataclass(frozen=True)
class StoreLayout:
    """What a finding needs from the store directory to name a file and a byte in it.

    ``root`` prefixes every file name (``<root>/commitlog/…``, ``<root>/consumequeue/…``,
    ``<root>/index/…``), as the store reader names files. ``mappedFileSizeConsumeQueue`` is a
    broker setting, so ``cq_file_size`` is one number; ``cq_file_size_exceptions`` holds the
    queues whose files say otherwise. Index hash-slot counts are per file.
    """

    broker_name: str
    root: str
    cq_file_size: int = DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE
    cq_file_size_exceptions: dict[tuple[str, int], int] = field(default_factory=dict)
    index_slots: dict[str, int] = field(default_factory=dict)
    default_index_slots: int = DEFAULT_MAX_HASH_SLOT_NUM
    # topics deleted on the broker (DELETE_TOPIC_IN_BROKER): their records below the fence (the
    # commitlog end at deletion) are never queued again, so no unit is missing for them
    topic_fences: dict[str, int] = field(default_factory=dict)

    def index_file_slots(self, name: str) -> int:
        return self.index_slots.get(name, self.default_index_slots)


def _most_common(values: list[int], default: int) -> int:
    return max(set(values), key=values.count) if values else default


def read_layout(spec: StoreSpec) -> StoreLayout:
    """The layout of a store, local or behind a URI. Only listings are read (file names and
    sizes), never file contents: a remote store costs one recursive listing of ``consumequeue/``
    and one of ``index/``. ``root`` is the store's absolute path or URI, as the ingest names files
    (:meth:`pipelines.store_files.StoreFiles.label`)."""
    location = spec.location
    if location.is_local:
        return _read_local_layout(spec.name, location.uri)
    from broker.store.index_file import infer_index_geometry

    files = StoreFiles(location)
    files.commitlog_segments()  # a URI without a store is an error, not a store without findings
    sizes = {key: files.queue_file_size(qfiles) for key, qfiles in files.queue_files().items()}
    slots = {f.name: geometry[0] for f in files.index_files() if (geometry := infer_index_geometry(f.size))}
    raw = files.read_file(CONFIG_DIR, DELETED_TOPICS_FILE)
    label = files.label(CONFIG_DIR, DELETED_TOPICS_FILE)
    fences = topic_fences_from(parse_config_text(raw.decode("utf-8"), label), label) if raw is not None else {}
    return _layout(spec.name, location.uri, sizes, slots, fences)


def _read_local_layout(name: str, root: str) -> StoreLayout:
    from broker.store.consume_queue import ConsumeQueue, list_queues
    from broker.store.index_file import infer_index_geometry, parse_index_file_name

    sizes = {(t, q): ConsumeQueue(root, t, q).file_size for t, q in list_queues(root)}  # listings only
    slots: dict[str, int] = {}
    index_dir = Path(root) / INDEX_DIR
    if index_dir.is_dir():
        for p in index_dir.iterdir():
            if p.is_file() and parse_index_file_name(p.name) is not None:
                geometry = infer_index_geometry(p.stat().st_size)
                if geometry:
                    slots[p.name] = geometry[0]
    return _layout(name, root, sizes, slots, load_topic_fences(root))


def _layout(name: str, root: str, sizes: dict[tuple[str, int], int], slots: dict[str, int],
            fences: dict[str, int]) -> StoreLayout:
    """The layout from per-queue CQ file sizes and per-index-file slot counts (most common = usual)."""
    usual = _most_common(list(sizes.values()), DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE)
    return StoreLayout(name, root, usual, {k: s for k, s in sizes.items() if s != usual}, slots,
                       _most_common(list(slots.values()), DEFAULT_MAX_HASH_SLOT_NUM), dict(fences))


# ---- Spark helpers ------------------------------------------------------------------------------------

def java_hash_code(col):
    """Java ``String.hashCode`` of a string column as a Spark expression (signed 32-bit, as bigint).

    Native Spark SQL, no Python worker: the string is encoded as UTF-16BE (Java's code units, so a
    character outside the BMP counts as two surrogates), cut into 4-hex-digit units, and folded as
    ``h*31 + u`` mod 2^32 in bigint (no overflow, so it runs under ANSI mode too). Each step refers
    to its input once, so the optimizer has no long expression to duplicate.
    """
    from pyspark.sql import functions as F

    units = F.transform(F.regexp_extract_all(F.hex(F.encode(col, "UTF-16BE")), F.lit("(.{4})"), 1),
                        lambda u: F.conv(u, 16, 10).cast("bigint"))
    unsigned = F.aggregate(units, F.lit(0).cast("bigint"), lambda acc, u: F.pmod(acc * 31 + u, F.lit(_UINT32)))
    return F.pmod(unsigned + (1 << 31), F.lit(_UINT32)) - (1 << 31)


def index_key_hash_col(col):
    """IndexFile key hash of a ``topic#key`` column: ``abs(hashCode)``, and 0 for Integer.MIN_VALUE
    (whose abs, 2^31, is the only value the pmod folds), as :func:`broker.store.java_hash.index_key_hash`."""
    from pyspark.sql import functions as F

    return F.pmod(F.abs(java_hash_code(col)), F.lit(1 << 31)).cast("int")


def _lookup(mapping: dict, key, value_type: str):
    """``mapping[key]`` as an expression over a literal map (null when absent or empty)."""
    from pyspark.sql import functions as F

    items = [(k, v) for k, v in mapping.items() if v is not None]
    if not items:
        return F.lit(None).cast(value_type)
    literal = F.create_map(*[x for k, v in items for x in (F.lit(k), F.lit(v).cast(value_type))])
    return F.try_element_at(literal, key)


def _root(layouts: list[StoreLayout]):
    from pyspark.sql import functions as F

    return _lookup({lay.broker_name: lay.root for lay in layouts}, F.col("broker_name"), "string")


def _commitlog_location(df, layouts: list[StoreLayout]):
    """``file``/``offset`` of a record from its ``segment_file`` (20-digit name) and commitlog offset."""
    from pyspark.sql import functions as F

    return (df.withColumn("file", F.concat_ws("/", _root(layouts), F.lit(COMMITLOG_DIR), F.col("segment_file")))
            .withColumn("offset", F.col("commitlog_offset") - F.col("segment_file").cast("bigint")))


def _cq_location(df, layouts: list[StoreLayout], topic: str, queue_id: str, logical: str):
    """``file``/``offset`` where unit ``logical`` of queue (``topic``, ``queue_id``) lives (or would):
    file ``consumequeue/<topic>/<q>/<20-digit base>``, byte ``(logical*20) % file_size``."""
    from pyspark.sql import functions as F

    exceptions = {_KEY_SEP.join((lay.broker_name, t, str(q))): s
                  for lay in layouts for (t, q), s in lay.cq_file_size_exceptions.items()}
    key = F.concat_ws(_KEY_SEP, F.col("broker_name"), F.col(topic), F.col(queue_id).cast("string"))
    size = F.coalesce(_lookup(exceptions, key, "bigint"),
                      _lookup({lay.broker_name: lay.cq_file_size for lay in layouts}, F.col("broker_name"), "bigint"))
    byte = F.col(logical).cast("bigint") * CQ_STORE_UNIT_SIZE
    return (df.withColumn("_size", size)
            .withColumn("offset", F.pmod(byte, F.col("_size")))
            .withColumn("file", F.format_string(f"%s/{CONSUME_QUEUE_DIR}/%s/%d/%020d", _root(layouts),
                                                F.col(topic), F.col(queue_id), byte - F.col("offset")))
            .drop("_size"))


def _finding(df, kind, detail, commitlog_offset=None, topic=None, queue_id=None):
    """Project a frame holding ``broker_name``, ``file``, ``offset`` onto the finding columns
    (``kind`` a kind name or a column; the others column names, columns or None)."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    def as_col(value, typ):
        if value is None:
            return F.lit(None).cast(typ)
        return (value if isinstance(value, Column) else F.col(value)).cast(typ)

    return df.select(
        F.col("broker_name"), (kind if isinstance(kind, Column) else F.lit(kind)).alias("kind"), F.col("file"),
        F.col("offset").cast("bigint").alias("offset"), as_col(commitlog_offset, "bigint").alias("commitlog_offset"),
        as_col(topic, "string").alias("topic"), as_col(queue_id, "int").alias("queue_id"),
        detail.cast("string").alias("detail"))


# ---- inputs and bounds --------------------------------------------------------------------------------

@dataclass
class AuditInputs:
    """The columns the checks read, filtered to the audited brokers.

    Several checks read each of them; they are not cached: re-reading a few Parquet columns costs
    less than building Spark's in-memory cache of them (measured: a cached audit of the golden
    store took almost twice as long), and nothing has to be released afterwards.
    """

    records: object   # messages: broker_name, commitlog_offset, store_size, topic, queue_id, queue_offset,
                      #   transaction_type, segment_file, uniq_key, keys, body_crc, body_crc_ok,
                      #   prepared_transaction_offset, real_topic
    units: object     # consume_queue: broker_name, topic, queue_id, queue_offset, commitlog_offset, size
    entries: object   # index_entries without all-zero entries: broker_name, index_file, key_hash, commitlog_offset
    corrupt: object   # corrupt_records
    quarantine: object = None  # payload_quarantine: broker_name, commitlog_offset, topic, reason
    ops: object = None  # op records (RMQ_SYS_TRANS_OP_HALF_TOPIC): broker_name, queue_id, half_offset
    replica: object = None  # records of the brokers in replica pairs: broker_name, commitlog_offset,
                            #   segment_file, REPLICA_COMPARED_COLUMNS, body_hash, properties_hash


def audit_inputs(messages, consume_queue, index_entries, corrupt_records, broker_names: Iterable[str],
                 payload_quarantine=None, replica_brokers: Iterable[str] = ()) -> AuditInputs:
    """Filter the ingest tables to the brokers and keep only what the checks read (``replica_brokers``:
    the brokers of replica pairs, whose records are compared field by field)."""
    from pyspark.sql import functions as F

    mine = F.col("broker_name").isin(*list(broker_names))
    records = messages.filter(mine).select(
        "broker_name", "commitlog_offset", "store_size", "topic", "queue_id", "queue_offset", "transaction_type",
        "segment_file", "uniq_key", "keys", "body_crc", "body_crc_ok", "prepared_transaction_offset", "real_topic")
    units = consume_queue.filter(mine).select("broker_name", "topic", "queue_id", "queue_offset",
                                              "commitlog_offset", "size")
    # an all-zero entry (zeroed, or a slot never written) is not an entry: it indexes nothing and
    # must not stretch the index's coverage down to offset 0
    entries = index_entries.filter(mine & ~((F.col("key_hash") == 0) & (F.col("commitlog_offset") == 0)
                                            & (F.col("prev_index") == 0))
                                   ).select("broker_name", "index_file", "key_hash", "commitlog_offset")
    quarantine = (payload_quarantine.filter(mine).select("broker_name", "commitlog_offset", "topic", "reason")
                  if payload_quarantine is not None else None)
    # op records: the half queue offset each one ends (its body, decimal text; null when not a number)
    ops = messages.filter(mine & (F.col("topic") == TRANS_OP_HALF_TOPIC)).select(
        "broker_name", "queue_id", F.expr("try_cast(cast(body AS string) AS bigint)").alias("half_offset"))
    replica_brokers = sorted(set(replica_brokers))
    replica = None
    if replica_brokers:
        replica = messages.filter(F.col("broker_name").isin(*replica_brokers)).select(
            "broker_name", "commitlog_offset", "segment_file", *REPLICA_COMPARED_COLUMNS,
            F.xxhash64("body").alias("body_hash"), F.xxhash64(F.to_json("properties")).alias("properties_hash"))
    return AuditInputs(records, units, entries, corrupt_records.filter(mine), quarantine, ops, replica)


@dataclass(frozen=True)
class Bounds:
    """Per broker: the commitlog range ``[lo, hi)`` the lake holds records for, the commitlog offset
    of the last dispatched record (newest CQ unit), and each index file's ``(lo, hi, name)`` range
    of entry offsets, sorted."""

    records: dict[str, tuple[int, int]] = field(default_factory=dict)
    last_dispatched: dict[str, int] = field(default_factory=dict)
    index_files: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)

    def index_coverage(self, broker: str) -> tuple[int, int] | None:
        files = self.index_files.get(broker)
        return (files[0][0], max(f[1] for f in files)) if files else None


def read_bounds(inputs: AuditInputs) -> Bounds:
    """All the bounds in one small aggregation (one shuffle), collected to the driver."""
    from pyspark.sql import functions as F

    phy = F.col("commitlog_offset")
    no_name = F.lit(None).cast("string").alias("name")
    tagged = (inputs.records.select("broker_name", F.lit("records").alias("tag"), no_name,
                                    phy.alias("lo"), (phy + F.col("store_size")).alias("hi"))
              .unionByName(inputs.units.select("broker_name", F.lit("units").alias("tag"), no_name,
                                               phy.alias("lo"), phy.alias("hi")))
              .unionByName(inputs.entries.select("broker_name", F.lit("index").alias("tag"),
                                                 F.col("index_file").alias("name"), phy.alias("lo"), phy.alias("hi"))))
    per_tag = tagged.groupBy("broker_name", "tag", "name").agg(F.min("lo").alias("lo"), F.max("hi").alias("hi"))
    bounds = Bounds()
    for r in per_tag.collect():
        if r["tag"] == "records":
            bounds.records[r["broker_name"]] = (r["lo"], r["hi"])
        elif r["tag"] == "units":
            bounds.last_dispatched[r["broker_name"]] = r["hi"]
        else:
            bounds.index_files.setdefault(r["broker_name"], []).append((r["lo"], r["hi"], r["name"]))
    for files in bounds.index_files.values():
        files.sort()
    return bounds


# ---- the checks ---------------------------------------------------------------------------------------

def crc_findings(inputs: AuditInputs, layouts: list[StoreLayout]):
    """``crc_mismatch``: records whose stored BODYCRC does not match the body."""
    from pyspark.sql import functions as F

    bad = inputs.records.filter(~F.col("body_crc_ok"))
    return _finding(_commitlog_location(bad, layouts), CRC_MISMATCH,
                    F.format_string("BODYCRC %d stored at commitlog offset %d does not match the body",
                                    F.col("body_crc"), F.col("commitlog_offset")),
                    "commitlog_offset", "topic", "queue_id")


def corrupt_region_findings(inputs: AuditInputs):
    """``corrupt_region``: the commitlog walk's structural findings (its CRC rows excepted)."""
    from pyspark.sql import functions as F

    rows = inputs.corrupt.filter(~F.col("reason").startswith(_CRC_REASON_PREFIX))
    base = F.regexp_extract(F.col("file"), rf"(?:^|/){COMMITLOG_DIR}/(\d{{20}})$", 1)
    phy = F.when(base != "", base.cast("bigint") + F.col("offset"))
    detail = F.when(F.col("bytes_skipped") > 0,
                    F.format_string("%s (%d bytes skipped)", F.col("reason"), F.col("bytes_skipped"))
                    ).otherwise(F.col("reason"))
    return _finding(rows, CORRUPT_REGION, detail, phy)


def quarantine_findings(inputs: AuditInputs, layouts: list[StoreLayout]):
    """``payload_quarantined``: records whose body did not decode with their topic's declared schema
    (placed through their ``messages`` row; the quarantine table is small and broadcast)."""
    from pyspark.sql import functions as F

    placed = inputs.records.join(F.broadcast(inputs.quarantine.select("broker_name", "commitlog_offset", "reason")),
                                 ["broker_name", "commitlog_offset"])
    return _finding(_commitlog_location(placed, layouts), PAYLOAD_QUARANTINED, F.col("reason"),
                    "commitlog_offset", "topic", "queue_id")


def queue_findings(inputs: AuditInputs, layouts: list[StoreLayout], bounds: Bounds):
    """CQ ↔ commitlog: ``cq_dangling_unit``, ``cq_mismatch``, ``cq_missing_unit`` from ONE full
    outer join of units and records on the commitlog offset."""
    from pyspark.sql import functions as F

    c = F.col
    broker = c("broker_name")
    rec_lo = _lookup({b: lo for b, (lo, _) in bounds.records.items()}, broker, "bigint")
    rec_hi = _lookup({b: hi for b, (_, hi) in bounds.records.items()}, broker, "bigint")
    last_dispatched = _lookup(bounds.last_dispatched, broker, "bigint")
    fence = F.coalesce(_lookup({_KEY_SEP.join((lay.broker_name, topic)): f for lay in layouts
                                for topic, f in lay.topic_fences.items()},
                               F.concat_ws(_KEY_SEP, broker, c("rec_topic")), "bigint"), F.lit(-1))
    recs = inputs.records.select(
        "broker_name", c("commitlog_offset").alias("phy"), c("store_size").alias("rec_size"),
        c("topic").alias("rec_topic"), c("queue_id").alias("rec_queue_id"),
        c("queue_offset").alias("rec_queue_offset"), c("transaction_type").alias("txn"))
    units = inputs.units.select("broker_name", "topic", "queue_id", "queue_offset", c("commitlog_offset").alias("phy"),
                                "size")
    has_unit, has_rec = c("topic").isNotNull(), c("rec_size").isNotNull()
    other_queue = (c("rec_topic") != c("topic")) | (c("rec_queue_id") != c("queue_id"))
    wrong_size = c("rec_size") != c("size")
    wrong_offset = c("rec_queue_offset") != c("queue_offset")
    kind = (F.when(has_unit & ~has_rec & (c("phy") >= rec_lo) & (c("phy") < rec_hi), F.lit(CQ_DANGLING))
            .when(has_unit & has_rec & (other_queue | wrong_size | wrong_offset), F.lit(CQ_MISMATCH))
            .when(~has_unit & c("txn").isin(*QUEUED_TRANSACTION_TYPE_NAMES) & (c("phy") <= last_dispatched)
                  & (c("phy") >= fence), F.lit(CQ_MISSING)))
    joined = units.join(recs, ["broker_name", "phy"], "full").withColumn("kind", kind).filter(c("kind").isNotNull())
    missing = c("kind") == CQ_MISSING
    joined = (joined.withColumn("loc_topic", F.when(missing, c("rec_topic")).otherwise(c("topic")))
              .withColumn("loc_queue_id", F.when(missing, c("rec_queue_id")).otherwise(c("queue_id")))
              .withColumn("loc_offset", F.when(missing, c("rec_queue_offset")).otherwise(c("queue_offset"))))
    where = F.format_string("%s/%d offset %d", c("topic"), c("queue_id"), c("queue_offset"))
    problems = F.concat_ws(
        "; ",
        F.when(other_queue, F.format_string("record is in %s/%d", c("rec_topic"), c("rec_queue_id"))),
        F.when(wrong_size, F.format_string("size %d != record size %d", c("size"), c("rec_size"))),
        F.when(wrong_offset, F.format_string("record QUEUEOFFSET is %d", c("rec_queue_offset"))))
    detail = (F.when(c("kind") == CQ_DANGLING,
                     F.format_string("%s points at commitlog offset %d, where no record starts", where, c("phy")))
              .when(c("kind") == CQ_MISMATCH, F.format_string("%s -> commitlog %d: %s", where, c("phy"), problems))
              .otherwise(F.format_string("record at commitlog offset %d (%s/%d offset %d) has no ConsumeQueue unit",
                                         c("phy"), c("rec_topic"), c("rec_queue_id"), c("rec_queue_offset"))))
    return _finding(_cq_location(joined, layouts, "loc_topic", "loc_queue_id", "loc_offset"), c("kind"), detail,
                    "phy", "loc_topic", "loc_queue_id")


def queue_offset_findings(inputs: AuditInputs, layouts: list[StoreLayout]):
    """Per queue, units in logical order: ``cq_offset_repeat`` (same logical offset again),
    ``cq_offset_gap`` (offsets skipped; reported where the first missing unit belongs) and
    ``cq_phy_not_increasing`` (commitlog offset not after the previous unit's); a row reports the
    first of these that applies. One window sort per queue: a queue is sorted by one task, which
    for Apache-sized queues (tens of millions of 20-byte units) spills but stays linear."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    c = F.col
    w = Window.partitionBy("broker_name", "topic", "queue_id").orderBy("queue_offset", "commitlog_offset")
    units = (inputs.units.withColumn("prev_offset", F.lag("queue_offset").over(w))
             .withColumn("prev_phy", F.lag("commitlog_offset").over(w)))
    kind = (F.when(c("queue_offset") == c("prev_offset"), F.lit(CQ_OFFSET_REPEAT))
            .when(c("queue_offset") > c("prev_offset") + 1, F.lit(CQ_OFFSET_GAP))
            .when(c("commitlog_offset") <= c("prev_phy"), F.lit(CQ_PHY_NOT_INCREASING)))
    found = units.withColumn("kind", kind).filter(c("kind").isNotNull())
    gap = c("kind") == CQ_OFFSET_GAP
    found = found.withColumn("loc_offset", F.when(gap, c("prev_offset") + 1).otherwise(c("queue_offset")))
    detail = (F.when(c("kind") == CQ_OFFSET_REPEAT,
                     F.format_string("%s/%d: logical offset %d appears again (commitlog offsets %d and %d)",
                                     c("topic"), c("queue_id"), c("queue_offset"), c("prev_phy"),
                                     c("commitlog_offset")))
              .when(gap, F.format_string("%s/%d: logical offsets %d..%d (%d units) are missing; "
                                         "the queue resumes at %d",
                                         c("topic"), c("queue_id"), c("prev_offset") + 1, c("queue_offset") - 1,
                                         c("queue_offset") - c("prev_offset") - 1, c("queue_offset")))
              .otherwise(F.format_string("%s/%d offset %d points at commitlog offset %d, not after offset %d's %d",
                                         c("topic"), c("queue_id"), c("queue_offset"), c("commitlog_offset"),
                                         c("prev_offset"), c("prev_phy"))))
    return _finding(_cq_location(found, layouts, "topic", "queue_id", "loc_offset"), c("kind"), detail,
                    F.when(~gap, c("commitlog_offset")), "topic", "queue_id")


def index_findings(inputs: AuditInputs, layouts: list[StoreLayout], bounds: Bounds):
    """``index_missing_key``: keys of indexed records inside the index's coverage with no entry of
    that hash and commitlog offset (one anti-join), placed in the index file covering the offset."""
    from pyspark.sql import functions as F

    c = F.col
    broker = c("broker_name")
    coverage = {b: bounds.index_coverage(b) for b in bounds.index_files}
    idx_lo = _lookup({b: cov[0] for b, cov in coverage.items()}, broker, "bigint")
    idx_hi = _lookup({b: cov[1] for b, cov in coverage.items()}, broker, "bigint")
    empty_keys = F.array().cast("array<string>")
    keys = F.array_distinct(F.concat(F.when(c("uniq_key").isNotNull(), F.array(c("uniq_key"))).otherwise(empty_keys),
                                     F.coalesce(c("keys"), empty_keys)))
    wanted = (inputs.records.filter((c("transaction_type") != NOT_INDEXED_TRANSACTION_TYPE_NAME)
                                    & (c("commitlog_offset") >= idx_lo) & (c("commitlog_offset") <= idx_hi))
              .select("broker_name", "commitlog_offset", "topic", "queue_id", F.explode(keys).alias("key"))
              .withColumn("key_hash", index_key_hash_col(F.concat(c("topic"), F.lit(INDEX_KEY_JOINER), c("key")))))
    missing = wanted.join(inputs.entries.select("broker_name", "commitlog_offset", "key_hash"),
                          ["broker_name", "commitlog_offset", "key_hash"], "left_anti")
    # the covering file: the last one (by smallest entry offset) starting at or before the record,
    # looked up in a literal array per broker (one entry per index file: a handful, even at scale)
    files = {}
    for lay in layouts:
        ranges = bounds.index_files.get(lay.broker_name)
        if ranges:
            files[lay.broker_name] = F.array(*[
                F.struct(F.lit(lo).cast("bigint").alias("lo"), F.lit(f"{lay.root}/{INDEX_DIR}/{name}").alias("file"),
                         F.lit(name).alias("name"), F.lit(lay.index_file_slots(name)).cast("bigint").alias("slots"))
                for lo, _, name in ranges])
    if not files:  # no index entries at all: nothing was judged
        return _finding(missing.withColumn("file", F.lit(None).cast("string")).withColumn("offset", F.lit(None)),
                        INDEX_MISSING_KEY, F.lit(None))
    by_broker = F.create_map(*[x for b, arr in files.items() for x in (F.lit(b), arr)])
    covering = F.try_element_at(F.filter(F.try_element_at(by_broker, broker),
                                         lambda f: f["lo"] <= c("commitlog_offset")), F.lit(-1))
    placed = (missing.withColumn("_f", covering)
              .withColumn("slot", F.pmod(c("key_hash"), c("_f.slots")))
              .withColumn("file", c("_f.file"))
              .withColumn("offset", c("slot") * INDEX_HASH_SLOT_SIZE + INDEX_HEADER_SIZE))
    return _finding(
        placed, INDEX_MISSING_KEY,
        F.format_string("key '%s' of the record at commitlog offset %d (%s%s%s, hash %d, slot %d) has no entry "
                        "in index file %s", c("key"), c("commitlog_offset"), c("topic"), F.lit(INDEX_KEY_JOINER),
                        c("key"), c("key_hash"), c("slot"), c("_f.name")),
        "commitlog_offset", "topic", "queue_id")


def duplicate_uniq_key_findings(inputs: AuditInputs, layouts: list[StoreLayout]):
    """``duplicate_uniq_key``: later records of a user topic repeating an earlier record's UNIQ_KEY
    (one window per (topic, UNIQ_KEY): tiny groups, no skew)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    c = F.col
    topic = c("topic")
    candidates = inputs.records.filter(
        c("transaction_type").isin(*QUEUED_TRANSACTION_TYPE_NAMES) & c("uniq_key").isNotNull()
        & ~topic.startswith(RETRY_GROUP_TOPIC_PREFIX) & ~topic.startswith(DLQ_GROUP_TOPIC_PREFIX)
        & ~topic.isin(*sorted(SYSTEM_TOPICS)) & ~topic.startswith(SYSTEM_TOPIC_PREFIX))
    group = Window.partitionBy("broker_name", "topic", "uniq_key")
    later = (candidates.withColumn("first_offset", F.min("commitlog_offset").over(group))
             .withColumn("copies", F.count(F.lit(1)).over(group))
             .filter(c("commitlog_offset") != c("first_offset")))
    return _finding(
        _commitlog_location(later, layouts), DUPLICATE_UNIQ_KEY,
        F.format_string("UNIQ_KEY %s in %s was first stored at commitlog offset %d (%d copies): "
                        "a producer retry stored twice", c("uniq_key"), topic, c("first_offset"), c("copies")),
        "commitlog_offset", "topic", "queue_id")


def transaction_unresolved_findings(inputs: AuditInputs, layouts: list[StoreLayout]):
    """``transaction_unresolved``: transactions (half copies of one UNIQ_KEY) none of whose copies an op
    record ends; reported at the newest copy."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    c = F.col
    halves = inputs.records.filter(c("topic") == TRANS_HALF_TOPIC).withColumn(
        "txn_key", F.coalesce(c("uniq_key"), c("commitlog_offset").cast("string")))
    ops = inputs.ops.select("broker_name", "queue_id", c("half_offset").alias("queue_offset"))
    ended = halves.join(ops, ["broker_name", "queue_id", "queue_offset"], "left_semi").select(
        "broker_name", "txn_key").distinct()
    group = Window.partitionBy("broker_name", "txn_key")
    open_ = (halves.join(ended, ["broker_name", "txn_key"], "left_anti")
             .withColumn("newest", F.max("commitlog_offset").over(group))
             .withColumn("copies", F.count(F.lit(1)).over(group))
             .filter(c("commitlog_offset") == c("newest")))
    return _finding(
        _commitlog_location(open_, layouts), TRANSACTION_UNRESOLVED,
        F.format_string("half message %s for %s (%d copies, newest at queue offset %d) has no op record: "
                        "never committed or rolled back", c("txn_key"), F.coalesce(c("real_topic"), c("topic")),
                        c("copies"), c("queue_offset")),
        "commitlog_offset", "topic", "queue_id")


def commit_without_half_findings(inputs: AuditInputs, layouts: list[StoreLayout], bounds: Bounds):
    """``commit_without_half``: COMMIT records whose PREPAREDTRANSACTIONOFFSET names no half message."""
    from pyspark.sql import functions as F

    c = F.col
    commit, prepared = TRANSACTION_TYPE_NAMES[TRANSACTION_COMMIT_TYPE >> 2], TRANSACTION_TYPE_NAMES[
        TRANSACTION_PREPARED_TYPE >> 2]
    rec_lo = _lookup({b: lo for b, (lo, _) in bounds.records.items()}, c("broker_name"), "bigint")
    halves = inputs.records.filter((c("topic") == TRANS_HALF_TOPIC) | (c("transaction_type") == prepared)).select(
        "broker_name", c("commitlog_offset").alias("prepared_transaction_offset"))
    orphans = (inputs.records.filter((c("transaction_type") == commit) & (c("prepared_transaction_offset") >= rec_lo))
               .join(halves, ["broker_name", "prepared_transaction_offset"], "left_anti"))
    return _finding(
        _commitlog_location(orphans, layouts), COMMIT_WITHOUT_HALF,
        F.format_string("COMMIT record of %s/%d names commitlog offset %d as its half message, where no half "
                        "message is", c("topic"), c("queue_id"), c("prepared_transaction_offset")),
        "commitlog_offset", "topic", "queue_id")


def _replica_sides(inputs: AuditInputs, broker: str, prefix: str):
    from pyspark.sql import functions as F

    return inputs.replica.filter(F.col("broker_name") == broker).select(
        "commitlog_offset", *[F.col(c).alias(prefix + c) for c in inputs.replica.columns
                              if c not in ("broker_name", "commitlog_offset")])


def replica_divergent_findings(inputs: AuditInputs, layouts: list[StoreLayout], bounds: Bounds,
                               slave: str, master: str):
    """``replica_divergent`` of one pair: a full outer join of the two brokers' records on the
    commitlog offset, inside the range both hold; only differing rows leave the join."""
    from pyspark.sql import functions as F

    c = F.col
    s_lo, s_hi = bounds.records.get(slave, (0, 0))
    m_lo, m_hi = bounds.records.get(master, (0, 0))
    lo, hi = max(s_lo, m_lo), min(s_hi, m_hi)
    compared = [*REPLICA_COMPARED_COLUMNS, "body_hash", "properties_hash"]
    joined = (_replica_sides(inputs, slave, "s_").join(_replica_sides(inputs, master, "m_"), "commitlog_offset", "full")
              .filter((c("commitlog_offset") >= lo) & (c("commitlog_offset") < hi)))
    names = {"body_hash": "body", "properties_hash": "properties"}
    fields = F.array_compact(F.array(*[F.when(~c("s_" + col).eqNullSafe(c("m_" + col)), F.lit(names.get(col, col)))
                                       for col in compared]))
    only = F.when(c("s_segment_file").isNull(), F.lit("the slave has no record here, the master has one"))\
        .when(c("m_segment_file").isNull(), F.lit("the master has no record here, the slave has one"))
    differs = joined.withColumn("_fields", fields).withColumn("_only", only).filter(
        c("_only").isNotNull() | (F.size("_fields") > 0))
    placed = _commitlog_location(differs.withColumn("broker_name", F.lit(slave))
                                 .withColumn("segment_file", F.coalesce(c("s_segment_file"), c("m_segment_file"))),
                                 layouts)
    detail = F.coalesce(c("_only"), F.format_string(
        "record at commitlog offset %d differs from master %s's in: %s (slave %s/%d offset %d, store time %d; "
        "master %s/%d offset %d, store time %d)", c("commitlog_offset"), F.lit(master), F.array_join("_fields", ", "),
        c("s_topic"), c("s_queue_id"), c("s_queue_offset"), c("s_store_timestamp"), c("m_topic"), c("m_queue_id"),
        c("m_queue_offset"), c("m_store_timestamp")))
    detail = F.concat(F.lit(f"replica of {master}: "), detail)
    return _finding(placed, REPLICA_DIVERGENT, detail, "commitlog_offset",
                    F.coalesce(c("s_topic"), c("m_topic")), F.coalesce(c("s_queue_id"), c("m_queue_id")))


def replica_lag_findings(inputs: AuditInputs, layouts: list[StoreLayout], bounds: Bounds, slave: str, master: str):
    """``replica_lag`` of one pair: at most one row, built from three one-row aggregations (no
    driver round trip)."""
    from pyspark.sql import functions as F

    c = F.col
    m_lo, m_hi = bounds.records.get(master, (0, 0))
    s_hi = bounds.records.get(slave, (m_lo, m_lo))[1]
    if s_hi == m_hi:
        return None
    recs = inputs.replica

    def last(broker: str, name: str):
        """The store time of the broker's newest record, as a one-row frame."""
        return recs.filter(c("broker_name") == broker).agg(F.max_by("store_timestamp", "commitlog_offset").alias(name))

    first = F.min_by(F.struct("commitlog_offset", "segment_file", "topic", "queue_id", "queue_offset",
                              "store_timestamp"),
                     "commitlog_offset")
    missing = (recs.filter((c("broker_name") == master) & (c("commitlog_offset") >= s_hi))
               .agg(F.count(F.lit(1)).alias("missing"), first.alias("first")))
    row = last(master, "m_last").crossJoin(last(slave, "s_last")).crossJoin(missing)
    lag_ms = c("m_last") - c("s_last")
    if s_hi < m_hi:
        placed = _commitlog_location(row.select(
            F.lit(master).alias("broker_name"), c("first.commitlog_offset").alias("commitlog_offset"),
            c("first.segment_file").alias("segment_file"), "first", "missing", lag_ms.alias("lag_ms")), layouts)
        detail = F.format_string(
            f"replica of {master}: {m_hi - s_hi} bytes and %s ms behind (slave ends at commitlog offset {s_hi}, master "
            f"at {m_hi}); %d records missing, the first at commitlog offset %d (%s/%d offset %d, store time %d)",
            F.coalesce(c("lag_ms").cast("string"), F.lit("?")), c("missing"), c("first.commitlog_offset"),
            c("first.topic"), c("first.queue_id"), c("first.queue_offset"), c("first.store_timestamp"))
        return _finding(placed.withColumn("broker_name", F.lit(slave)), REPLICA_LAG, detail, "commitlog_offset",
                        c("first.topic"), c("first.queue_id"))
    placed = row.select(F.lit(slave).alias("broker_name"), lag_ms.alias("lag_ms"),
                        F.lit(None).cast("string").alias("file"), F.lit(None).cast("bigint").alias("offset"))
    detail = F.format_string(
        f"replica of {master}: ahead of its master by {s_hi - m_hi} bytes and %s ms (slave ends at commitlog offset "
        f"{s_hi}, master at {m_hi}); Apache truncates a slave ahead of its master",
        F.coalesce((-c("lag_ms")).cast("string"), F.lit("?")))
    return _finding(placed, REPLICA_LAG, detail, F.lit(m_hi))


def replica_findings(inputs: AuditInputs, layouts: list[StoreLayout], bounds: Bounds,
                     replicas: Iterable[tuple[str, str]]) -> list:
    """``replica_lag`` and ``replica_divergent`` of every (slave, master) pair."""
    parts = []
    for slave, master in replicas:
        parts.append(replica_divergent_findings(inputs, layouts, bounds, slave, master))
        lag = replica_lag_findings(inputs, layouts, bounds, slave, master)
        if lag is not None:
            parts.append(lag)
    return parts


def audit_findings(inputs: AuditInputs, layouts: Iterable[StoreLayout], run_id: str, audited_at: datetime,
                   bounds: Bounds | None = None, replicas: Iterable[tuple[str, str]] = ()):
    """Every finding of the brokers in ``layouts`` as one DataFrame with the audit_findings columns
    (``replicas``: (slave, master) broker name pairs, whose records ``inputs.replica`` holds).

    ``bounds`` default to :func:`read_bounds` (one small Spark job); the rest is lazy.
    """
    from pyspark.sql import functions as F

    layouts = list(layouts)
    bounds = bounds if bounds is not None else read_bounds(inputs)
    parts = [
        crc_findings(inputs, layouts),
        corrupt_region_findings(inputs),
        queue_findings(inputs, layouts, bounds),
        queue_offset_findings(inputs, layouts),
        index_findings(inputs, layouts, bounds),
        duplicate_uniq_key_findings(inputs, layouts),
        transaction_unresolved_findings(inputs, layouts),
        commit_without_half_findings(inputs, layouts, bounds),
    ]
    if inputs.quarantine is not None:
        parts.append(quarantine_findings(inputs, layouts))
    parts += replica_findings(inputs, layouts, bounds, replicas)
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out.select(F.lit(run_id).alias("audit_run_id"), F.lit(audited_at).alias("audited_at"), *_FINDING_COLUMNS)


def topic_daily_stats(messages, broker_names: Iterable[str], run_id: str):
    """Per UTC store day × broker × real topic: records, bytes, body bytes, distinct born hosts,
    first/last store time — straight from the records, so they reconcile with the store.

    The topic is ``real_topic`` (REAL_TOPIC of scheduled and half records, else the stored topic);
    records whose real topic is still a wrapper topic (no REAL_TOPIC) are left out. Every record
    counts once where it is stored: a delayed message counts at its schedule record and at its
    delivered copy, as both occupy the store. ``body_bytes`` are payload bytes as the producer
    sent them (decompressed); producers are distinct ``born_host`` values (address:port).
    """
    from pyspark.sql import functions as F

    rows = messages.filter(F.col("broker_name").isin(*list(broker_names))
                           & ~F.col("real_topic").isin(*sorted(WRAPPER_TOPICS)))
    return (rows.groupBy("store_date", "broker_name", F.col("real_topic").alias("topic"))
            .agg(F.count(F.lit(1)).alias("messages"),
                 F.sum(F.col("store_size").cast("bigint")).alias("bytes"),
                 F.sum(F.length(F.col("body")).cast("bigint")).alias("body_bytes"),
                 F.countDistinct("born_host").alias("distinct_producers"),
                 F.min("store_time").alias("first_store_time"),
                 F.max("store_time").alias("last_store_time"))
            .withColumn("audit_run_id", F.lit(run_id))
            .select(*TOPIC_DAILY_STATS_SCHEMA.names))


# ---- the job ------------------------------------------------------------------------------------------

@dataclass
class AuditResult:
    run_id: str
    brokers: list[str]
    findings: pa.Table   # AUDIT_FINDINGS_SCHEMA, sorted by broker, kind, file, offset
    stats: pa.Table      # TOPIC_DAILY_STATS_SCHEMA, sorted by day, broker, topic
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        """Findings per kind, every kind listed (0 when none)."""
        kinds = self.findings.column("kind").to_pylist()
        return {k: kinds.count(k) for k in KINDS}

    def line(self) -> str:
        per_broker = {b: 0 for b in self.brokers}
        for b in self.findings.column("broker_name").to_pylist():
            per_broker[b] = per_broker.get(b, 0) + 1
        brokers = ", ".join(f"{b} {n}" for b, n in per_broker.items())
        return (f"{self.findings.num_rows} findings ({brokers}), {self.stats.num_rows} topic-day rows, "
                f"run {self.run_id} in {self.seconds:.1f} s")


def _table_or_empty(spark, lake: str | os.PathLike | Location, name: str, schema: pa.Schema):
    """The table, or an empty frame of its schema when it does not exist or holds no rows (built
    in the JVM: an empty ``createDataFrame`` would start a Python worker for nothing)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from pipelines.lake import open_table, read_table

    table = open_table(lake, name)
    if table is not None and table.file_uris():
        return read_table(spark, lake, name)
    log.info("audit: %s in %s is missing or empty", name, lake)
    return spark.range(0).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in from_arrow_schema(schema)])


def _to_arrow(df, schema: pa.Schema, sort_keys: list[str]) -> pa.Table:
    """Collect a small result as Arrow, cast exactly to the table schema (timestamps in UTC)."""
    table = df.toArrow()
    columns = []
    for f in schema:
        col = table.column(f.name)
        if pa.types.is_timestamp(f.type) and pa.types.is_timestamp(col.type) and col.type.tz is None:
            col = pc.assume_timezone(col, "UTC")
        columns.append(col.cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema).sort_by([(k, "ascending") for k in sort_keys])


def check_replicas(replicas: Iterable[tuple[str, str]], names: Iterable[str]) -> list[tuple[str, str]]:
    """The (slave, master) pairs, each broker among the audited ones, none its own master and no
    slave with two masters; ValueError naming the pair otherwise."""
    names = set(names)
    out: list[tuple[str, str]] = []
    for slave, master in replicas:
        for name in (slave, master):
            if name not in names:
                raise ValueError(f"--replica {slave}={master}: {name} is not one of the --store names "
                                 f"({', '.join(sorted(names))})")
        if slave == master:
            raise ValueError(f"--replica {slave}={master}: a broker cannot be its own master")
        if any(s == slave for s, _ in out):
            raise ValueError(f"--replica: {slave} is named as a slave twice")
        out.append((slave, master))
    return out


def run_audit(spark, stores: list[StoreSpec], lake: str | os.PathLike | Location, *,
              ingest_first: bool = True, replicas: Iterable[tuple[str, str]] = ()) -> AuditResult:
    """Bring the lake up to date (unless ``ingest_first`` is False), audit the given brokers and
    replace their rows in ``audit_findings`` and ``topic_daily_stats`` (one commit per table).
    Stores and lake may be local directories or URIs (a :class:`Location` carries its options).
    ``replicas``: (slave, master) pairs of broker names among ``stores`` (see ``replica_lag``)."""
    from pipelines.lake import replace_arrow, sql_string_list

    replicas = check_replicas(replicas, [spec.name for spec in stores])

    started = time.monotonic()
    if ingest_first:
        from pipelines.ingest import ingest

        for summary in ingest(spark, stores, lake):
            log.info("audit: ingest %s", summary.line())
    run_id = uuid.uuid4().hex
    audited_at = datetime.now(timezone.utc)
    layouts = [read_layout(spec) for spec in stores]
    names = [spec.name for spec in stores]
    messages = _table_or_empty(spark, lake, MESSAGES_TABLE, MESSAGES_SCHEMA)
    inputs = audit_inputs(messages,
                          _table_or_empty(spark, lake, CONSUME_QUEUE_TABLE, CONSUME_QUEUE_SCHEMA),
                          _table_or_empty(spark, lake, INDEX_ENTRIES_TABLE, INDEX_ENTRIES_SCHEMA),
                          _table_or_empty(spark, lake, CORRUPT_RECORDS_TABLE, CORRUPT_RECORDS_SCHEMA),
                          names, _table_or_empty(spark, lake, PAYLOAD_QUARANTINE_TABLE, PAYLOAD_QUARANTINE_SCHEMA),
                          [name for pair in replicas for name in pair])
    findings = _to_arrow(audit_findings(inputs, layouts, run_id, audited_at, replicas=replicas), AUDIT_FINDINGS_SCHEMA,
                         ["broker_name", "kind", "file", "offset", "detail"])
    stats = _to_arrow(topic_daily_stats(messages, names, run_id), TOPIC_DAILY_STATS_SCHEMA,
                      ["store_date", "broker_name", "topic"])
    predicate = f"broker_name IN ({sql_string_list(names)})"
    replace_arrow(lake, AUDIT_FINDINGS_TABLE, findings, predicate=predicate)
    replace_arrow(lake, TOPIC_DAILY_STATS_TABLE, stats, predicate=predicate)
    result = AuditResult(run_id, names, findings, stats, time.monotonic() - started)
    log.info("audit: %s", result.line())
    return result
