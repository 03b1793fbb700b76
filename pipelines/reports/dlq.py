"""Dead-letter-queue analysis: the ``dlq_messages`` and ``dlq_summary`` tables (issue 5).

How a message reaches ``%DLQ%<group>`` (Apache 4.9.x ``consumerSendMsgBack``, our
:func:`broker.server.send_back.consumer_send_back`, store-format.md 3.9): every time
a consumer fails it, the broker looks the consumed record up by commitlog offset and writes a NEW
record with the same body, born timestamp/host, ``reconsumeTimes + 1``, ``RETRY_TOPIC`` (the original
topic, kept once set) and ``ORIGIN_MESSAGE_ID`` (the original's offset message id, kept once set).
Below the group's retry limit that record carries ``DELAY = 3 + reconsumeTimes`` and so is stored in
``SCHEDULE_TOPIC_XXXX`` with ``REAL_TOPIC = %RETRY%<group>``; when the delay is up the schedule
service stores a copy in ``%RETRY%<group>`` (same properties, same reconsume times). At the limit
the record goes to ``%DLQ%<group>`` instead. A client whose send-back fails (Java client fallback)
sends the copy itself: ``ORIGIN_MESSAGE_ID`` is then the client id (``UNIQ_KEY``) of the original and
the born time is the resend's. 5.x gRPC/POP paths may name the original with ``DLQ_ORIGIN_TOPIC`` /
``DLQ_ORIGIN_MESSAGE_ID``; POP retry topics are ``%RETRY%<group>_<topic>`` / ``%RETRY%<group>+<topic>``.

Definitions (what the columns of :mod:`schemas.reports` mean here):

* ``original_topic``: non-blank ``RETRY_TOPIC``, else non-blank ``DLQ_ORIGIN_TOPIC``, else the DLQ
  record's real topic. ``original_msg_id``: non-blank ``ORIGIN_MESSAGE_ID``, else non-blank
  ``DLQ_ORIGIN_MESSAGE_ID``, else null (a record someone sent straight to the DLQ).
* The *original* is the record stored in ``original_topic`` on the same broker whose offset message
  id equals ``original_msg_id`` (broker send-back) or, failing that, whose ``UNIQ_KEY`` does (client
  fallback, 5.x ids); the earliest such record wins. It gives ``first_born_time`` and
  ``original_store_time`` and ``original_commitlog_offset`` (the key of its ``messages`` row and of
  its typed ``payload_<topic>`` row). When it is gone (commitlog files deleted), ``first_born_time`` is the
  earliest born time among the retry records and the DLQ record itself (send-back carries the
  original's born time along, so this is exact unless a client resent the message itself) and
  ``original_store_time`` and ``original_commitlog_offset`` are null.
* ``retry_history``: every ``%RETRY%<group>`` record and every ``SCHEDULE_TOPIC_XXXX`` record with
  ``REAL_TOPIC = %RETRY%<group>`` (POP retry topics of the group for the original topic included) on
  the same broker with the same original message id, stored before the DLQ record and after the
  previous DLQ record of the same group and original (a message replayed and dead-lettered again
  gets only its own second round), ordered by commitlog offset (= store order on one broker).
  ``attempt`` is the record's reconsume times: the schedule record and the %RETRY% copy the schedule
  service makes of it share an attempt number, and attempt n is the n-th redelivery; both records
  are listed, each with its topic. ``delay_level`` is the ``DELAY`` property (null when absent or
  not an integer).
* ``time_to_dlq_s = dlq_store_time - first_born_time`` in seconds (microsecond precision).
* ``dlq_summary`` groups by ``store_date`` (UTC day of the DLQ store time) × broker × group ×
  original topic. ``p50``/``p95`` are exact percentiles with Spark SQL ``percentile``'s method (linear
  interpolation at position ``p * (n - 1)`` of the sorted values, numpy's default ``linear``),
  computed on the driver by :func:`exact_percentile`. ``top_keys``/``top_tags``: up to 5 values by
  number of DLQ messages carrying them (a key repeated within one message counts once), ties broken
  by code-point order of the value.
* ``replayed_at`` / ``replay_run_id``: the latest replay run whose ``replay_ledger`` says the DLQ
  record was SENT (the target confirmed it), from :func:`pipelines.replay.ledger.sent_dlq_replays`;
  null when it was never replayed. ``replayed`` in the summary counts those DLQ messages (a message
  replayed by several runs counts once).

Full recompute per run: DLQ volumes are small, so the job recomputes both tables for its brokers
from the whole ``messages`` table (one scan; only records matching a DLQ record survive the
broadcast join) and replaces their rows in one commit per table (other brokers' rows stay).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker.store.constants import (
    PROPERTY_DELAY,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
)
from broker.store.topics import RETRY_GROUP_TOPIC_PREFIX, SCHEDULE_TOPIC
from pipelines.lake import WriteResult, read_table, replace_arrow, sql_string_list, table_exists
from pipelines.storage import Location
from schemas.messages import MESSAGES_TABLE
from schemas.reports import (
    DLQ_MESSAGES,
    DLQ_SUMMARY,
    DLQ_MESSAGES_SCHEMA,
    DLQ_MESSAGES_TABLE,
    DLQ_SUMMARY_SCHEMA,
    DLQ_SUMMARY_TABLE,
)

log = logging.getLogger(__name__)

TOP_N = 5
SUMMARY_GROUP = ["store_date", "broker_name", "consumer_group", "original_topic"]
# dlq_messages is partitioned as schemas.reports declares (store_date): day-pruned reads ("what
# died yesterday") are the common query; the replace predicate is per broker either way.
DLQ_MESSAGES_PARTITION_BY = list(DLQ_MESSAGES.partition_by)
DLQ_SUMMARY_PARTITION_BY = list(DLQ_SUMMARY.partition_by)  # none: a few rows per day and group


def _prop(name: str) -> Column:
    """A property value, null when absent or blank (Apache tests ``UtilAll.isBlank``)."""
    value = F.try_element_at(F.col("properties"), F.lit(name))
    return F.when(F.trim(value) != "", value)


def original_id() -> Column:
    """``ORIGIN_MESSAGE_ID``, else 5.x ``DLQ_ORIGIN_MESSAGE_ID`` (blank values skipped)."""
    return F.coalesce(_prop(PROPERTY_ORIGIN_MESSAGE_ID), _prop(PROPERTY_DLQ_ORIGIN_MESSAGE_ID))


def original_topic() -> Column:
    """The topic a %DLQ% record's message was first sent to: ``RETRY_TOPIC``, else 5.x
    ``DLQ_ORIGIN_TOPIC`` (blank values skipped), else the record's real topic."""
    return F.coalesce(_prop(PROPERTY_RETRY_TOPIC), _prop(PROPERTY_DLQ_ORIGIN_TOPIC), F.col("real_topic"))


def _retry_topic_of_record() -> Column:
    """The %RETRY% topic a record belongs to: its own topic, or REAL_TOPIC of a schedule record."""
    return F.when(F.col("topic") == SCHEDULE_TOPIC, F.col("real_topic")).otherwise(F.col("topic"))


def _dlq_records(messages: DataFrame) -> DataFrame:
    """One row per %DLQ% record, with the columns it contributes itself."""
    return (messages.where(F.col("is_dlq"))
            .select(F.col("broker_name"), F.col("consumer_group"), F.col("topic").alias("dlq_topic"),
                    original_topic().alias("original_topic"),
                    F.col("offset_msg_id").alias("msg_id"), original_id().alias("original_msg_id"),
                    "uniq_key", "keys", "tags", "reconsume_times",
                    F.col("born_time").alias("dlq_born_time"), F.col("store_time").alias("dlq_store_time"),
                    F.col("commitlog_offset").alias("dlq_commitlog_offset"), "store_date"))


# kinds of records related to a DLQ record (see _related)
_ORIGINAL, _RETRY, _EARLIER_DLQ = 0, 1, 2


def _related(messages: DataFrame) -> DataFrame:
    """Every record that may be related to some DLQ record, once per id it can be found by
    (``match_id``): plain records by offset id (rank 0) and by UNIQ_KEY (rank 1) as originals,
    retry/schedule records and DLQ records by the original id they carry."""
    def entry(kind: int, rank: int, match_id: Column) -> Column:
        return F.struct(F.lit(kind).alias("kind"), F.lit(rank).alias("rank"), match_id.alias("match_id"))

    retry_name = _retry_topic_of_record()
    plain = ~F.col("is_retry") & ~F.col("is_dlq") & (F.col("topic") != SCHEDULE_TOPIC)
    as_original = F.array(entry(_ORIGINAL, 0, F.col("offset_msg_id")), entry(_ORIGINAL, 1, F.col("uniq_key")))
    entries = (F.when(plain, as_original)
               .when(retry_name.startswith(RETRY_GROUP_TOPIC_PREFIX), F.array(entry(_RETRY, 0, original_id())))
               .when(F.col("is_dlq"), F.array(entry(_EARLIER_DLQ, 0, original_id()))))
    rel = messages.select(
        F.col("broker_name").alias("_rb"), F.col("commitlog_offset").alias("_roff"), F.col("topic").alias("_rtopic"),
        retry_name.substr(F.lit(len(RETRY_GROUP_TOPIC_PREFIX) + 1), F.length(retry_name)).alias("_rgroup"),
        F.col("consumer_group").alias("_rdlq_group"), F.col("reconsume_times").alias("_rrc"),
        _prop(PROPERTY_DELAY).try_cast("int").alias("_rdelay"), F.col("born_time").alias("_rborn"),
        F.col("store_time").alias("_rstore"), F.explode(entries).alias("_e"))
    return rel.where(F.col("_e.match_id").isNotNull())


def dlq_messages(messages: DataFrame) -> DataFrame:
    """``messages`` rows (MESSAGES_SCHEMA, any brokers) → one row per DLQ record, columns of
    DLQ_MESSAGES_SCHEMA in order (see the module docstring for the definitions).

    One pass: the (small) DLQ records are broadcast and joined with every related record of the
    same broker and id (originals, retry/schedule records, earlier DLQ records of the same original),
    then one aggregation per DLQ record picks the original, bounds the history by the previous DLQ
    record and orders it: one shuffle of matched rows only, whatever the size of ``messages``."""
    dlq = _dlq_records(messages)
    rel = _related(messages)
    kind, off = F.col("_e.kind"), F.col("_roff")
    group = F.col("consumer_group")
    same_retry_group = ((F.col("_rgroup") == group)
                        | (F.col("_rgroup") == F.concat(group, F.lit("_"), F.col("original_topic")))   # 5.x POP v1
                        | (F.col("_rgroup") == F.concat(group, F.lit("+"), F.col("original_topic"))))  # 5.x POP v2
    before = off < F.col("dlq_commitlog_offset")
    cond = ((F.col("_rb") == F.col("broker_name")) & (F.col("_e.match_id") == F.col("original_msg_id"))
            & (((kind == _ORIGINAL) & (F.col("_rtopic") == F.col("original_topic")))
               | ((kind == _RETRY) & same_retry_group & before)
               | ((kind == _EARLIER_DLQ) & (F.col("_rdlq_group") == group) & before)))
    matched = rel.join(F.broadcast(dlq), cond).select(*dlq.columns, *rel.columns)
    # every DLQ record takes part in the aggregation, related records or not
    alone = dlq.select(*dlq.columns, *[F.lit(None).cast(rel.schema[c].dataType).alias(c) for c in rel.columns])
    attempt = F.struct(off.alias("commitlog_offset"), F.col("_rrc").alias("attempt"), F.col("_rtopic").alias("topic"),
                       F.col("_rstore").alias("store_time"), F.col("_rrc").alias("reconsume_times"),
                       F.col("_rdelay").alias("delay_level"), F.col("_rborn").alias("born_time"))
    agg = matched.unionByName(alone).groupBy(*dlq.columns).agg(
        F.sort_array(F.collect_list(F.when(kind == _RETRY, attempt))).alias("_h"),
        F.max(F.when(kind == _EARLIER_DLQ, off)).alias("_after"),
        F.min(F.when(kind == _ORIGINAL, F.struct(F.col("_e.rank"), off, F.col("_rborn"), F.col("_rstore"))))
        .alias("_o"))
    after = F.coalesce(F.col("_after"), F.lit(-1))
    kept = F.filter("_h", lambda a: a["commitlog_offset"] > after)
    history = F.transform(kept, lambda a: F.struct(
        a["attempt"].cast("int").alias("attempt"), a["topic"].alias("topic"),
        a["commitlog_offset"].alias("commitlog_offset"), a["store_time"].alias("store_time"),
        a["reconsume_times"].cast("int").alias("reconsume_times"), a["delay_level"].alias("delay_level")))
    first_born = F.coalesce(F.col("_o._rborn"),
                            F.least(F.array_min(F.transform(kept, lambda a: a["born_time"])), F.col("dlq_born_time")))
    out = (agg.withColumn("retry_history", history)
           .withColumn("original_store_time", F.col("_o._rstore"))
           .withColumn("original_commitlog_offset", F.col("_o._roff"))
           .withColumn("first_born_time", first_born))
    out = out.withColumn(
        "time_to_dlq_s", (F.unix_micros("dlq_store_time") - F.unix_micros("first_born_time")) / F.lit(1_000_000.0))
    out = (out.withColumn("replayed_at", F.lit(None).cast("timestamp"))   # filled from the ledger, not the store
           .withColumn("replay_run_id", F.lit(None).cast("string")))
    return out.select(*DLQ_MESSAGES_SCHEMA.names)


def _group_runs(table: pa.Table, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """For a table sorted by ``keys`` (no nulls): the start row of each run of equal keys and the
    run number of every row."""
    n = table.num_rows
    change = np.zeros(n, dtype=bool)
    change[:1] = True
    for key in keys:
        col = table[key].combine_chunks()
        if n > 1:
            change[1:] |= np.asarray(pc.not_equal(col.slice(1), col.slice(0, n - 1)).fill_null(True))
    starts = np.flatnonzero(change)
    return starts, np.cumsum(change) - 1


def exact_percentile(sorted_values: np.ndarray, starts: np.ndarray, counts: np.ndarray, p: float) -> np.ndarray:
    """Exact percentile ``p`` of each run ``sorted_values[start:start+count]`` (ascending), computed
    as Spark SQL's ``percentile`` does, bit for bit: position ``pos = (n - 1) * p``; the value there
    when ``pos`` is whole or both neighbours are equal, else ``(ceil - pos) * lower + (pos - floor) * upper``."""
    pos = (counts - 1) * p
    lo = np.floor(pos).astype(np.int64)
    hi = np.ceil(pos).astype(np.int64)
    lower = sorted_values[starts + lo]
    upper = sorted_values[starts + hi]
    with np.errstate(invalid="ignore"):
        mixed = (hi - pos) * lower + (pos - lo) * upper
    return np.where((hi == lo) | (upper == lower), lower, mixed)


def _top_values(group_of_row: np.ndarray, rows: pa.Array, values: pa.Array, groups: int) -> pa.ListArray:
    """Per group, the TOP_N values by number of distinct rows carrying them (most first, ties in
    code-point order); ``rows``/``values`` are parallel (row index, value) pairs, nulls ignored."""
    pairs = pa.table({"_g": pa.array(group_of_row[np.asarray(rows, dtype=np.int64)], pa.int64()),
                      "_row": rows, "value": values}).filter(pc.is_valid(values))
    distinct = pairs.group_by(["_g", "_row", "value"]).aggregate([])
    counted = (distinct.group_by(["_g", "value"]).aggregate([("_row", "count")])
               .sort_by([("_g", "ascending"), ("_row_count", "descending"), ("value", "ascending")]))
    g = counted["_g"].to_numpy()
    starts, _ = _group_runs(counted, ["_g"])
    run_start = np.repeat(starts, np.diff(np.append(starts, len(g))))
    keep = (np.arange(len(g)) - run_start) < TOP_N
    kept_groups = g[keep]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(kept_groups, minlength=groups))]).astype(np.int32)
    kept_values = counted["value"].combine_chunks().filter(pa.array(keep))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), kept_values.cast(pa.string()))


def dlq_summary(rows: pa.Table, replayed: pa.Table | None = None) -> pa.Table:
    """``dlq_messages`` rows (Arrow, DLQ_MESSAGES_SCHEMA) → one row per day × broker × group ×
    original topic (DLQ_SUMMARY_SCHEMA), in that order.

    Computed on the driver with pyarrow/numpy, vectorised: the rows are already there (collected
    from Spark), a few per DLQ message, and this saves the half-dozen shuffles a Spark summary costs.
    Percentiles: :func:`exact_percentile` (same values as Spark's exact ``percentile``).
    ``replayed``: Arrow table with ``broker_name`` and ``dlq_commitlog_offset`` of replayed DLQ
    records (None: 0 everywhere; :func:`compute_dlq_tables` passes the ledger's)."""
    if rows.num_rows == 0:
        return DLQ_SUMMARY_SCHEMA.empty_table()
    t = rows.select(SUMMARY_GROUP + ["original_msg_id", "time_to_dlq_s", "keys", "tags", "dlq_commitlog_offset"])
    t = t.sort_by([(k, "ascending") for k in SUMMARY_GROUP] + [("time_to_dlq_s", "ascending")])
    if t["time_to_dlq_s"].null_count:
        raise ValueError("time_to_dlq_s is null in a dlq_messages row")
    starts, group_of_row = _group_runs(t, SUMMARY_GROUP)
    groups = len(starts)
    counts = np.diff(np.append(starts, t.num_rows))
    seconds = t["time_to_dlq_s"].to_numpy()
    distinct = (pa.table({"_g": group_of_row, "id": t["original_msg_id"]})
                .group_by("_g").aggregate([("id", "count_distinct", pc.CountOptions(mode="only_valid"))])
                .sort_by("_g"))
    keys = t["keys"].combine_chunks()
    top_keys = _top_values(group_of_row, pc.list_parent_indices(keys), pc.list_flatten(keys), groups)
    row_numbers = pa.array(np.arange(t.num_rows), pa.int64())
    top_tags = _top_values(group_of_row, row_numbers, t["tags"].combine_chunks(), groups)
    if replayed is None:
        replayed_counts = np.zeros(groups, dtype=np.int64)
    else:
        numbered = t.select(["broker_name", "dlq_commitlog_offset"]).append_column("_row", row_numbers)
        done = replayed.select(["broker_name", "dlq_commitlog_offset"]).group_by(
            ["broker_name", "dlq_commitlog_offset"]).aggregate([])
        hit = numbered.join(done, ["broker_name", "dlq_commitlog_offset"], join_type="left semi")["_row"].to_numpy()
        replayed_counts = np.bincount(group_of_row[hit], minlength=groups).astype(np.int64)
    head = t.select(SUMMARY_GROUP).take(pa.array(starts))
    columns = {name: head[name] for name in SUMMARY_GROUP}
    columns.update({
        "messages": pa.array(counts, pa.int64()),
        "distinct_originals": distinct["id_count_distinct"],
        "p50_time_to_dlq_s": pa.array(exact_percentile(seconds, starts, counts, 0.5), pa.float64()),
        "p95_time_to_dlq_s": pa.array(exact_percentile(seconds, starts, counts, 0.95), pa.float64()),
        "max_time_to_dlq_s": pa.array(seconds[starts + counts - 1], pa.float64()),
        "top_keys": top_keys,
        "top_tags": top_tags,
        "replayed": pa.array(replayed_counts, pa.int64()),
    })
    return pa.table([columns[name] for name in DLQ_SUMMARY_SCHEMA.names],
                    names=DLQ_SUMMARY_SCHEMA.names).cast(DLQ_SUMMARY_SCHEMA)


def to_arrow(df: DataFrame, schema: pa.Schema, sort_keys: list[str]) -> pa.Table:
    """Collect a (small) result as Arrow, cast exactly to the table schema, in a stable order."""
    table = df.toArrow().select(schema.names)
    return table.cast(schema).sort_by([(k, "ascending") for k in sort_keys])


@dataclass(frozen=True)
class DlqReport:
    messages: pa.Table        # DLQ_MESSAGES_SCHEMA rows written for the brokers
    summary: pa.Table         # DLQ_SUMMARY_SCHEMA rows written for the brokers
    messages_write: WriteResult
    summary_write: WriteResult


def with_replays(rows: pa.Table, replayed: pa.Table | None) -> pa.Table:
    """``rows`` with ``replayed_at``/``replay_run_id`` of the latest replay of each DLQ record.

    ``replayed``: ``broker_name``, ``dlq_commitlog_offset``, ``run_id``, ``recorded_at`` (one row per
    run that sent the record back; :func:`pipelines.replay.ledger.sent_dlq_replays`)."""
    if replayed is None or replayed.num_rows == 0 or rows.num_rows == 0:
        return rows
    latest = {}
    for r in replayed.sort_by([("recorded_at", "ascending")]).to_pylist():
        latest[(r["broker_name"], r["dlq_commitlog_offset"])] = (r["recorded_at"], r["run_id"])
    hits = [latest.get(k, (None, None)) for k in zip(rows["broker_name"].to_pylist(),
                                                    rows["dlq_commitlog_offset"].to_pylist())]
    for name, values in (("replayed_at", [h[0] for h in hits]), ("replay_run_id", [h[1] for h in hits])):
        rows = rows.set_column(rows.schema.get_field_index(name), rows.schema.field(name),
                               pa.array(values, rows.schema.field(name).type))
    return rows


def compute_dlq_tables(messages: DataFrame, *, replayed: pa.Table | None = None) -> tuple[pa.Table, pa.Table]:
    """Both report tables as Arrow from ``messages`` (already restricted to the brokers wanted)."""
    rows = to_arrow(dlq_messages(messages), DLQ_MESSAGES_SCHEMA, ["broker_name", "dlq_commitlog_offset"])
    rows = with_replays(rows, replayed)
    return rows, dlq_summary(rows, replayed)


def run_dlq_report(spark, lake: str | os.PathLike | Location, brokers: list[str], *,
                   replayed: pa.Table | None = None) -> DlqReport:
    """Recompute ``dlq_messages``/``dlq_summary`` for ``brokers`` from the lake's ``messages`` table
    and replace those brokers' rows, one commit per table (no ``messages`` table yet: no rows, so
    stale rows of these brokers go away and both tables exist for readers). ``replayed`` defaults
    to what the lake's ``replay_ledger`` says was sent back. ``lake``: a directory, a URI or a
    :class:`Location` (with its storage options)."""
    from pipelines.replay.ledger import sent_dlq_replays

    if replayed is None:
        replayed = sent_dlq_replays(lake)
    if not brokers:
        raise ValueError("no brokers given")
    if table_exists(lake, MESSAGES_TABLE):
        messages = read_table(spark, lake, MESSAGES_TABLE).where(F.col("broker_name").isin(list(brokers)))
        rows, summary = compute_dlq_tables(messages, replayed=replayed)
    else:
        log.warning("dlq: %s has no %s table yet; writing empty reports", lake, MESSAGES_TABLE)
        rows, summary = DLQ_MESSAGES_SCHEMA.empty_table(), DLQ_SUMMARY_SCHEMA.empty_table()
    predicate = f"broker_name IN ({sql_string_list(brokers)})"
    w_rows = replace_arrow(lake, DLQ_MESSAGES_TABLE, rows, predicate=predicate,
                           partition_by=DLQ_MESSAGES_PARTITION_BY)
    w_summary = replace_arrow(lake, DLQ_SUMMARY_TABLE, summary, predicate=predicate,
                              partition_by=DLQ_SUMMARY_PARTITION_BY)
    log.info("dlq: %d DLQ messages in %d summary rows for %s (dlq_messages v%s, dlq_summary v%s)",
             rows.num_rows, summary.num_rows, ", ".join(brokers), w_rows.version, w_summary.version)
    return DlqReport(rows, summary, w_rows, w_summary)
