"""What to replay: a selection over the lake's ``messages`` table (never the live store).

Three forms, as ``jobs/replay.py`` takes them:

* a topic time range: ``--topic T --since ISO --until ISO [--broker B] [--queue Q] [--tag TAG] [--key K]``
  selects the records *stored in* topic T with ``since <= store time < until``. A delayed or
  transactional message counts once: its SCHEDULE_TOPIC_XXXX / half record (``real_topic`` T, stored
  elsewhere) is not selected, the copy delivered to T is; retries live in ``%RETRY%`` topics and are
  not selected either;
* ``--where PREDICATE``: any Spark SQL predicate over the ``messages`` columns;
* ``--dlq GROUP [--original-topic T] [--since/--until]``: the records of ``%DLQ%GROUP``, each going back
  to its original topic (``RETRY_TOPIC`` / ``DLQ_ORIGIN_TOPIC``, as the DLQ report defines it).

The time bounds also prune ``store_date`` partitions; Parquet statistics prune the rest.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from broker.store.constants import QUEUED_TRANSACTION_TYPE_NAMES
from broker.store.topics import dlq_topic
from pipelines.lake import open_table, read_table, table_exists, table_path
from pipelines.reports.dlq import original_topic
from pipelines.storage import Location
from schemas.messages import MESSAGES_TABLE


class SelectionError(ValueError):
    """The selection cannot be evaluated or selects nothing; the message says why."""


@dataclass(frozen=True)
class Selection:
    topic: str | None = None
    where: str | None = None
    dlq_group: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    broker: str | None = None
    queue: int | None = None
    tag: str | None = None
    key: str | None = None
    original_topic: str | None = None

    def __post_init__(self) -> None:
        forms = [f for f in (self.topic, self.where, self.dlq_group) if f is not None]
        if len(forms) != 1:
            raise SelectionError("give exactly one selection: --topic T, --where PREDICATE or --dlq GROUP")
        if self.topic is not None and (self.since_ms is None or self.until_ms is None):
            raise SelectionError("--topic needs --since and --until (a store-time range)")
        if self.since_ms is not None and self.until_ms is not None and self.since_ms >= self.until_ms:
            raise SelectionError("--since must be before --until")
        if self.original_topic is not None and self.dlq_group is None:
            raise SelectionError("--original-topic goes with --dlq")
        if self.where is not None and any(v is not None for v in (self.queue, self.tag, self.key)):
            raise SelectionError("--queue/--tag/--key go with --topic (put them into the --where predicate)")

    @property
    def is_dlq(self) -> bool:
        return self.dlq_group is not None

    def describe(self) -> str:
        """The selection as command-line arguments (stored in replay_runs, shown in the plan)."""
        parts: list[str] = []
        names = {"topic": "--topic", "where": "--where", "dlq_group": "--dlq", "original_topic": "--original-topic",
                 "broker": "--broker", "queue": "--queue", "tag": "--tag", "key": "--key"}
        for name, flag in names.items():
            value = getattr(self, name)
            if value is not None:
                parts += [flag, str(value)]
        for name, flag in (("since_ms", "--since"), ("until_ms", "--until")):
            value = getattr(self, name)
            if value is not None:
                parts += [flag, datetime.fromtimestamp(value / 1000, timezone.utc).isoformat(timespec="milliseconds")]
        return shlex.join(parts)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Selection":
        return cls(**json.loads(text))


PLAN_COLUMNS = ["broker_name", "commitlog_offset", "store_date", "source_topic", "source_queue_id",
                "source_queue_offset", "source_msg_id", "source_uniq_key", "source_store_time", "body_bytes",
                "origin_topic", "_file"]


def _date(ms: int):
    return datetime.fromtimestamp(ms / 1000, timezone.utc).date()


def messages_frame(spark, lake: str | Location) -> DataFrame:
    if not table_exists(lake, MESSAGES_TABLE):
        raise SelectionError(f"{table_path(lake, MESSAGES_TABLE)} is not a Delta table: ingest the stores first "
                             "(rocketlake ingest --store NAME=PATH --lake LAKE)")
    return read_table(spark, lake, MESSAGES_TABLE)


def filtered(messages: DataFrame, sel: Selection) -> DataFrame:
    """``messages`` rows the selection takes (all columns)."""
    df = messages
    if sel.since_ms is not None:
        df = df.where((F.col("store_date") >= F.lit(_date(sel.since_ms)))
                      & (F.col("store_timestamp") >= F.lit(sel.since_ms)))
    if sel.until_ms is not None:
        df = df.where((F.col("store_date") <= F.lit(_date(sel.until_ms)))
                      & (F.col("store_timestamp") < F.lit(sel.until_ms)))
    if sel.broker is not None:
        df = df.where(F.col("broker_name") == sel.broker)
    if sel.topic is not None:
        df = df.where((F.col("topic") == sel.topic) & F.col("transaction_type").isin(*QUEUED_TRANSACTION_TYPE_NAMES))
    if sel.queue is not None:
        df = df.where(F.col("queue_id") == sel.queue)
    if sel.tag is not None:
        df = df.where(F.col("tags") == sel.tag)
    if sel.key is not None:
        df = df.where(F.array_contains(F.col("keys"), sel.key))
    if sel.dlq_group is not None:
        df = df.where(F.col("topic") == dlq_topic(sel.dlq_group))
        if sel.original_topic is not None:
            df = df.where(original_topic() == sel.original_topic)
    if sel.where is not None:
        try:
            df = df.where(F.expr(sel.where))
        except PySparkException as exc:
            raise SelectionError(f"--where {sel.where!r} is not a valid predicate over the messages table: "
                                 f"{_first_line(exc)}") from None
    return df


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return "\n".join(line for line in text.splitlines()[:6] if line.strip() and "JVM stacktrace" not in line)


def plan_frame(messages: DataFrame, sel: Selection, max_messages: int | None) -> DataFrame:
    """One narrow row per selected message (PLAN_COLUMNS), in (broker, commitlog offset) order."""
    df = filtered(messages, sel)
    origin = original_topic() if sel.is_dlq else F.col("real_topic")
    out = df.select(
        "broker_name", "commitlog_offset", "store_date", F.col("topic").alias("source_topic"),
        F.col("queue_id").alias("source_queue_id"), F.col("queue_offset").alias("source_queue_offset"),
        F.col("offset_msg_id").alias("source_msg_id"), F.col("uniq_key").alias("source_uniq_key"),
        F.col("store_time").alias("source_store_time"), F.length("body").cast("long").alias("body_bytes"),
        origin.alias("origin_topic"), F.input_file_name().alias("_file"))
    out = out.orderBy("broker_name", "commitlog_offset")
    return out.limit(max_messages) if max_messages is not None else out


def explain_empty(spark, lake: str | Location, messages: DataFrame, sel: Selection) -> str:
    """Why a selection matched nothing, naming the part that is wrong."""
    import pyarrow as pa

    table = open_table(lake, MESSAGES_TABLE)
    actions = pa.table(table.get_add_actions(flatten=True)) if table is not None else pa.table({})
    brokers = sorted(set(actions["partition.broker_name"].to_pylist())) if actions.num_rows else []
    if sel.broker is not None and sel.broker not in brokers:
        return f"unknown broker {sel.broker!r}: the lake has {', '.join(brokers) or 'no brokers'}"
    if sel.topic is not None and messages.where(F.col("topic") == sel.topic).limit(1).count() == 0:
        return f"unknown topic {sel.topic!r}: no message of it was ever ingested into {lake}"
    if sel.dlq_group is not None and messages.where(F.col("topic") == dlq_topic(sel.dlq_group)).limit(1).count() == 0:
        return f"no DLQ messages of group {sel.dlq_group!r} ({dlq_topic(sel.dlq_group)}) in {lake}"
    return f"the selection ({sel.describe()}) matched no message in {lake}"
