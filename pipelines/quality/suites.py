"""One Great Expectations suite per Delta table: what a table must satisfy to be trusted.

Every expectation carries ``meta={"critical": True|False}`` (and the matching GX ``severity``,
``critical`` or ``warning``):

* **critical**: the table is wrong or unusable when it fails (a key is null or duplicated, a value
  is outside what the store format allows, an enumeration holds an unknown value). The validate
  job exits 1.
* **non-critical**: the data is suspicious but the table is right (some bodies fail their CRC,
  clocks disagree, the store had corrupt regions). The validate job logs a WARNING and exits 0.

Suites are built in code, not edited in the GX project: the code is the single definition and the
file-backed context under ``<lake>/_quality/gx`` is refreshed from it on every run. The number of
expectations is kept small on purpose: on Spark each one costs a handful of jobs.

Every suite starts with what the table's contract (:mod:`schemas.registry`) declares, all critical:
its required columns are not null, its key is unique, its enumerated columns hold only their allowed
values (:func:`contract_expectations`). The builders below add only what a contract cannot say:
ranges, comparisons between columns, and the warnings. The tables, their columns and their order
are the registry's too: a table the project writes has a suite.

Uniqueness is per broker: commitlog offsets, queue offsets and message ids only mean something
within one broker's store, so the keys include ``broker_name`` and use GX's
``expect_compound_columns_to_be_unique``. Checks that compare a column with an expression of another
(store time against born time minus a skew, bytes against rows × the smallest record) are
``UnexpectedRowsExpectation`` Spark-SQL queries over ``{batch}``; the columns such a query reads are
listed in its ``meta["columns"]`` so the runner can project the table down to what the suite needs.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import pyarrow as pa
from great_expectations import ExpectationSuite
from great_expectations import expectations as gxe
from great_expectations.expectations.expectation import Expectation
from great_expectations.expectations.metadata_types import FailureSeverity
from great_expectations.expectations.row_conditions import Column

from broker.store.constants import DEFAULT_MAX_MESSAGE_SIZE, MAX_RECORD_OVERHEAD
from broker.store.record_layout import MIN_MESSAGE_RECORD_SIZE
from broker.store.topics import DLQ_GROUP_TOPIC_PREFIX
from schemas.contract import TableContract
from schemas.messages import MESSAGES_TABLE
from schemas.registry import INGEST_TABLES, REPLAY_TABLES, REPORT_TABLES, TABLES
from schemas.replay import REPLAY_LEDGER_TABLE, REPLAY_RUNS_TABLE
from schemas.reports import (
    AUDIT_FINDINGS_TABLE,
    CONSUMER_LAG_STATUS_TABLE,
    CONSUMER_LAG_TABLE,
    DLQ_MESSAGES_TABLE,
    DLQ_SUMMARY_TABLE,
    TOPIC_DAILY_STATS_TABLE,
)
from schemas.tables import CONSUME_QUEUE_TABLE, CORRUPT_RECORDS_TABLE, INDEX_ENTRIES_TABLE, INGEST_RUNS_TABLE

CRITICAL = "critical"  # meta key: True = a failure makes the run fail
COLUMNS = "columns"    # meta key: columns an UnexpectedRowsExpectation query reads

DEFAULT_SKEW_MS = 60_000  # born (producer clock) vs store (broker clock) allowance
MAX_STORE_SIZE = DEFAULT_MAX_MESSAGE_SIZE + MAX_RECORD_OVERHEAD  # whole record: body limit + 64 KiB
BODY_CRC_OK_MOSTLY = 0.999  # a few flipped bits are suspicious, many are a broken store or decoder

# every table the project writes has a suite (schemas.registry), in the order the jobs write them
ALL_TABLES: tuple[str, ...] = INGEST_TABLES + REPORT_TABLES + REPLAY_TABLES
TABLE_SCHEMAS: dict[str, pa.Schema] = {name: TABLES[name].schema for name in ALL_TABLES}


# ---- building blocks ---------------------------------------------------------------------------------
def _flag(critical: bool, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"meta": {CRITICAL: critical, **(meta or {})},
            "severity": FailureSeverity.CRITICAL if critical else FailureSeverity.WARNING}


def not_null(column: str, *, critical: bool = True) -> Expectation:
    return gxe.ExpectColumnValuesToNotBeNull(column=column, **_flag(critical))


def unique_key(columns: Iterable[str], *, critical: bool = True) -> Expectation:
    """The row key is unique (rows whose key columns are all null are ignored, as GX does; GX's
    compound form wants two columns or more, a one-column key uses the column form)."""
    columns = list(columns)
    if len(columns) == 1:
        return gxe.ExpectColumnValuesToBeUnique(column=columns[0], **_flag(critical))
    return gxe.ExpectCompoundColumnsToBeUnique(column_list=columns, **_flag(critical))


def between(column: str, min_value: float | None = None, max_value: float | None = None, *,
            critical: bool = True, **kwargs: Any) -> Expectation:
    """Non-null values lie in ``[min_value, max_value]`` (either bound may be open)."""
    return gxe.ExpectColumnValuesToBeBetween(column=column, min_value=min_value, max_value=max_value,
                                             **kwargs, **_flag(critical))


def in_set(column: str, values: Iterable[Any], *, critical: bool = True, **kwargs: Any) -> Expectation:
    return gxe.ExpectColumnValuesToBeInSet(column=column, value_set=list(values), **kwargs, **_flag(critical))


def a_at_least_b(column_a: str, column_b: str, *, critical: bool = True) -> Expectation:
    return gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A=column_a, column_B=column_b, or_equal=True,
                                                       **_flag(critical))


def no_rows_where(condition: str, columns: list[str], description: str, *, critical: bool = True) -> Expectation:
    """No row satisfies the Spark-SQL ``condition`` (for checks that involve an expression)."""
    query = f"SELECT {', '.join(columns)} FROM {{batch}} WHERE {condition}"
    return gxe.UnexpectedRowsExpectation(unexpected_rows_query=query, description=description,
                                         **_flag(critical, {COLUMNS: list(columns)}))


def contract_expectations(contract: TableContract) -> list[Expectation]:
    """What the table's contract (:mod:`schemas.registry`) says every row satisfies, all critical:
    its required columns are never null, its key is unique, its enumerated columns hold only their
    allowed values (per row condition where the contract gives one)."""
    expectations = [not_null(column) for column in contract.required]
    if contract.key:
        expectations.append(unique_key(contract.key))
    for allowed in contract.allowed:
        condition = {} if allowed.when is None else {"row_condition": Column(allowed.when[0]) == allowed.when[1]}
        expectations.append(in_set(allowed.column, allowed.values, **condition))
    return expectations


def _suite(table: str, expectations: list[Expectation]) -> ExpectationSuite:
    """The table's contract expectations, then the table's own ``expectations``."""
    # built from a list (no context needed: add_expectation() on an unsaved suite wants one)
    return ExpectationSuite(name=table, expectations=contract_expectations(TABLES[table]) + expectations,
                            meta={"table": table})


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ---- ingest tables -----------------------------------------------------------------------------------
def messages_suite(skew_ms: int = DEFAULT_SKEW_MS) -> ExpectationSuite:
    """``messages``: one row per CommitLog record, unique per broker and commitlog offset."""
    return _suite(MESSAGES_TABLE, [
        between("store_size", MIN_MESSAGE_RECORD_SIZE, MAX_STORE_SIZE),
        between("queue_offset", 0),
        in_set("body_crc_ok", [True], mostly=BODY_CRC_OK_MOSTLY, critical=False),
        no_rows_where(f"store_timestamp < born_timestamp - {int(skew_ms)}",
                      ["broker_name", "commitlog_offset", "born_timestamp", "store_timestamp"],
                      f"store_timestamp >= born_timestamp - {int(skew_ms)} ms", critical=False),
    ])


def consume_queue_suite() -> ExpectationSuite:
    """``consume_queue``: one unit per (broker, topic, queue, logical offset)."""
    return _suite(CONSUME_QUEUE_TABLE, [
        between("commitlog_offset", 0),
        between("queue_offset", 0),
        # a unit whose size no record can have (e.g. a "pre-blank" fill unit) points nowhere useful
        between("size", MIN_MESSAGE_RECORD_SIZE, MAX_STORE_SIZE, critical=False),
    ])


def index_entries_suite() -> ExpectationSuite:
    """``index_entries``: IndexFile entries (hashes are ``abs(hashCode)``, links are slot numbers)."""
    return _suite(INDEX_ENTRIES_TABLE, [
        between("commitlog_offset", 0),
        between("key_hash", 0),
        between("prev_index", 0),
    ])


def corrupt_records_suite() -> ExpectationSuite:
    """``corrupt_records``: any row at all is worth a warning (the store had damaged regions)."""
    return _suite(CORRUPT_RECORDS_TABLE, [
        gxe.ExpectTableRowCountToEqual(value=0, description="the store had no corrupt regions",
                                       **_flag(False)),
        between("offset", 0),
        between("bytes_skipped", 0),
    ])


def ingest_runs_suite() -> ExpectationSuite:
    """``ingest_runs``: one row per run and broker, offsets moving forward."""
    return _suite(INGEST_RUNS_TABLE, [
        a_at_least_b("to_offset", "from_offset"),
    ])


# ---- report tables -----------------------------------------------------------------------------------
def consumer_lag_suite() -> ExpectationSuite:
    """``consumer_lag``: one row per snapshot and (broker, group, topic, queue); lag is never negative."""
    return _suite(CONSUMER_LAG_TABLE, [
        between("lag_messages", 0),
        a_at_least_b("max_offset", "min_offset"),
        between("lag_seconds", 0, critical=False),  # store clocks going backwards
    ])


def consumer_lag_status_suite() -> ExpectationSuite:
    """``consumer_lag_status``: Burrow statuses, partition and group rows each with their own set.

    No key uniqueness: every evaluation is appended, and evaluating twice without a new snapshot
    legitimately repeats (snapshot_id, group, partition)."""
    return _suite(CONSUMER_LAG_STATUS_TABLE, [
        between("lag_messages", 0),
        between("snapshots", 1),
    ])


def dlq_messages_suite() -> ExpectationSuite:
    """``dlq_messages``: one row per DLQ record, stored in its group's ``%DLQ%`` topic."""
    prefix = _sql_string(DLQ_GROUP_TOPIC_PREFIX)
    return _suite(DLQ_MESSAGES_TABLE, [
        no_rows_where(f"dlq_topic IS NULL OR consumer_group IS NULL OR dlq_topic <> concat({prefix}, consumer_group)",
                      ["broker_name", "dlq_commitlog_offset", "dlq_topic", "consumer_group"],
                      f"dlq_topic = '{DLQ_GROUP_TOPIC_PREFIX}' + consumer_group"),
        between("reconsume_times", 0),
        between("time_to_dlq_s", 0, critical=False),  # producer clock ahead, or a client resent it
    ])


def dlq_summary_suite() -> ExpectationSuite:
    """``dlq_summary``: one row per (day, broker, group, original topic) with consistent counts."""
    return _suite(DLQ_SUMMARY_TABLE, [
        between("messages", 1),
        a_at_least_b("messages", "distinct_originals"),
        between("replayed", 0),
        no_rows_where("p50_time_to_dlq_s > p95_time_to_dlq_s OR p95_time_to_dlq_s > max_time_to_dlq_s",
                      ["store_date", "broker_name", "consumer_group", "original_topic", "p50_time_to_dlq_s",
                       "p95_time_to_dlq_s", "max_time_to_dlq_s"],
                      "p50 <= p95 <= max time to DLQ", critical=False),
    ])


def audit_findings_suite() -> ExpectationSuite:
    """``audit_findings``: every finding names its broker and a known kind (the contract says both)."""
    return _suite(AUDIT_FINDINGS_TABLE, [])


def topic_daily_stats_suite() -> ExpectationSuite:
    """``topic_daily_stats``: one row per (day, broker, topic); sizes add up to whole records."""
    return _suite(TOPIC_DAILY_STATS_TABLE, [
        between("messages", 1),
        no_rows_where(f"bytes < messages * {MIN_MESSAGE_RECORD_SIZE}",
                      ["store_date", "broker_name", "topic", "messages", "bytes"],
                      f"bytes >= messages x {MIN_MESSAGE_RECORD_SIZE} (smallest record)"),
        a_at_least_b("last_store_time", "first_store_time"),
    ])


# ---- replay tables -----------------------------------------------------------------------------------
def replay_ledger_suite() -> ExpectationSuite:
    """``replay_ledger``: one event per (run, message, event_seq); sequences and attempts count up."""
    return _suite(REPLAY_LEDGER_TABLE, [
        between("event_seq", 1),
        between("attempts", 0),
    ])


def replay_runs_suite() -> ExpectationSuite:
    """``replay_runs``: one row per run, started at least once."""
    return _suite(REPLAY_RUNS_TABLE, [
        between("attempts", 1),
    ])


SUITE_BUILDERS: dict[str, Callable[..., ExpectationSuite]] = {
    MESSAGES_TABLE: messages_suite,
    CONSUME_QUEUE_TABLE: consume_queue_suite,
    INDEX_ENTRIES_TABLE: index_entries_suite,
    CORRUPT_RECORDS_TABLE: corrupt_records_suite,
    INGEST_RUNS_TABLE: ingest_runs_suite,
    CONSUMER_LAG_TABLE: consumer_lag_suite,
    CONSUMER_LAG_STATUS_TABLE: consumer_lag_status_suite,
    DLQ_MESSAGES_TABLE: dlq_messages_suite,
    DLQ_SUMMARY_TABLE: dlq_summary_suite,
    AUDIT_FINDINGS_TABLE: audit_findings_suite,
    TOPIC_DAILY_STATS_TABLE: topic_daily_stats_suite,
    REPLAY_LEDGER_TABLE: replay_ledger_suite,
    REPLAY_RUNS_TABLE: replay_runs_suite,
}


def build_suite(table: str, *, skew_ms: int = DEFAULT_SKEW_MS) -> ExpectationSuite:
    """The suite of ``table`` (KeyError for a table without one)."""
    builder = SUITE_BUILDERS[table]
    return builder(skew_ms=skew_ms) if table == MESSAGES_TABLE else builder()


# ---- reading suites and results back ----------------------------------------------------------------
def _condition_columns(condition: Any) -> list[str]:
    """Column names in a row condition (the dict form GX serialises, or a Condition object)."""
    if not isinstance(condition, dict):
        to_dict = getattr(condition, "dict", None)
        condition = to_dict() if callable(to_dict) else None
    if not isinstance(condition, dict):
        return []
    names = []
    column = condition.get("column")
    if isinstance(column, dict) and column.get("name"):
        names.append(column["name"])
    for sub in condition.get("conditions") or []:
        names.extend(_condition_columns(sub))
    return names


def expectation_columns(kwargs: dict[str, Any], meta: dict[str, Any] | None) -> list[str]:
    """Columns an expectation reads, from its kwargs (and ``meta["columns"]`` for queries)."""
    names: list[str] = []
    for key in ("column", "column_A", "column_B"):
        if kwargs.get(key):
            names.append(kwargs[key])
    names.extend(kwargs.get("column_list") or [])
    if kwargs.get("row_condition"):
        names.extend(_condition_columns(kwargs["row_condition"]))
    names.extend((meta or {}).get(COLUMNS) or [])
    return list(dict.fromkeys(names))


def suite_columns(suite: ExpectationSuite) -> list[str]:
    """Every column the suite reads, in first-use order (the runner projects the table to these)."""
    names: list[str] = []
    for e in suite.expectations:
        names.extend(expectation_columns(e.configuration.kwargs, e.meta))
    return list(dict.fromkeys(names))


def is_critical(meta: dict[str, Any] | None) -> bool:
    """An expectation without the flag counts as critical: better a false alarm than a silent pass."""
    return bool((meta or {}).get(CRITICAL, True))


def _condition_text(condition: Any) -> str:
    if isinstance(condition, dict) and isinstance(condition.get("column"), dict) and "operator" in condition:
        return f"{condition['column'].get('name')} {condition['operator']} {condition.get('parameter')!r}"
    return str(condition)


def expectation_label(expectation_type: str, kwargs: dict[str, Any], description: str | None = None) -> str:
    """``expect_column_values_to_be_unique(commitlog_offset)``: the type and what it looks at."""
    if expectation_type == "unexpected_rows_expectation" or not expectation_columns(kwargs, None):
        inner = description or ""
    else:
        inner = ", ".join(n for n in expectation_columns({k: v for k, v in kwargs.items() if k != "row_condition"},
                                                         None))
        if kwargs.get("row_condition"):
            inner += f" where {_condition_text(kwargs['row_condition'])}"
    return f"{expectation_type}({inner})"
