"""Table contracts (:mod:`schemas.registry`): one definition per table, from which the Arrow schemas
(with each column's description as field metadata), the Delta schemas, the Spark schemas and the
quality suites derive."""

from __future__ import annotations

import datetime as dt
import importlib
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from schemas.contract import DESCRIPTION_KEY, Allowed, TableContract, description_of, one_of
from schemas.messages import MESSAGES, MESSAGES_SCHEMA, RECORD_COLUMNS, RECORD_SCHEMA, body_as_view
from schemas.registry import INGEST_TABLES, REPLAY_TABLES, REPORT_TABLES, TABLES, contract
from schemas.spark import spark_ddl, spark_schema

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_MODULES = ("schemas.messages", "schemas.tables", "schemas.reports", "schemas.replay")
UTC = dt.timezone.utc

# what schemas/spark.py's hand-written Arrow -> Spark mapper produced before the registry (issue 12)
OLD_SPARK_DDL: dict[str, str] = {
    "record": (
        "`commitlog_offset` BIGINT, `store_size` INT, `magic_code` INT, `body_crc` INT, "
        "`body_crc_ok` BOOLEAN, `queue_id` INT, `flag` INT, `queue_offset` BIGINT, `sys_flag` INT, "
        "`transaction_type` STRING, `compression` STRING, `born_timestamp` BIGINT, "
        "`store_timestamp` BIGINT, `born_host` STRING, `store_host` STRING, `reconsume_times` INT, "
        "`prepared_transaction_offset` BIGINT, `topic` STRING, `real_topic` STRING, "
        "`properties` MAP<STRING, STRING>, `keys` ARRAY<STRING>, `tags` STRING, `uniq_key` STRING, "
        "`offset_msg_id` STRING, `body` BINARY"
    ),
    "messages": (
        "`commitlog_offset` BIGINT, `store_size` INT, `magic_code` INT, `body_crc` INT, "
        "`body_crc_ok` BOOLEAN, `queue_id` INT, `flag` INT, `queue_offset` BIGINT, `sys_flag` INT, "
        "`transaction_type` STRING, `compression` STRING, `born_timestamp` BIGINT, "
        "`store_timestamp` BIGINT, `born_host` STRING, `store_host` STRING, `reconsume_times` INT, "
        "`prepared_transaction_offset` BIGINT, `topic` STRING, `real_topic` STRING, "
        "`properties` MAP<STRING, STRING>, `keys` ARRAY<STRING>, `tags` STRING, `uniq_key` STRING, "
        "`offset_msg_id` STRING, `body` BINARY, `born_time` TIMESTAMP, `store_time` TIMESTAMP, "
        "`broker_name` STRING, `store_date` DATE, `segment_file` STRING, `ingest_run_id` STRING, "
        "`is_retry` BOOLEAN, `is_dlq` BOOLEAN, `consumer_group` STRING, `origin_msg_id` STRING"
    ),
    "consume_queue": (
        "`broker_name` STRING, `topic` STRING, `queue_id` INT, `queue_offset` BIGINT, "
        "`commitlog_offset` BIGINT, `size` INT, `tags_code` BIGINT"
    ),
    "index_entries": (
        "`broker_name` STRING, `index_file` STRING, `key_hash` INT, `commitlog_offset` BIGINT, "
        "`store_timestamp` BIGINT, `prev_index` INT"
    ),
    "corrupt_records": (
        "`broker_name` STRING, `file` STRING, `offset` BIGINT, `reason` STRING, `bytes_skipped` BIGINT, "
        "`ingest_run_id` STRING"
    ),
    "ingest_runs": (
        "`ingest_run_id` STRING, `broker_name` STRING, `from_offset` BIGINT, `to_offset` BIGINT, "
        "`messages_rows` BIGINT, `consume_queue_rows` BIGINT, `index_entries_rows` BIGINT, "
        "`corrupt_records_rows` BIGINT, `started_at` TIMESTAMP, `duration_s` DOUBLE, `status` STRING"
    ),
    "consumer_lag": (
        "`snapshot_ts` TIMESTAMP, `snapshot_id` STRING, `broker_name` STRING, `consumer_group` STRING, "
        "`topic` STRING, `queue_id` INT, `consumer_offset` BIGINT, `min_offset` BIGINT, "
        "`max_offset` BIGINT, `lag_messages` BIGINT, `next_store_timestamp_ms` BIGINT, "
        "`newest_store_timestamp_ms` BIGINT, `lag_seconds` DOUBLE, `lost_messages` BIGINT, "
        "`offset_source` STRING"
    ),
    "consumer_lag_status": (
        "`evaluated_at` TIMESTAMP, `snapshot_id` STRING, `broker_name` STRING, `consumer_group` STRING, "
        "`topic` STRING, `queue_id` INT, `level` STRING, `status` STRING, `reason` STRING, "
        "`snapshots` INT, `lag_messages` BIGINT, `lag_seconds` DOUBLE, `max_lag_messages` BIGINT, "
        "`max_lag_seconds` DOUBLE"
    ),
    "dlq_messages": (
        "`broker_name` STRING, `consumer_group` STRING, `dlq_topic` STRING, `original_topic` STRING, "
        "`msg_id` STRING, `original_msg_id` STRING, `uniq_key` STRING, `keys` ARRAY<STRING>, "
        "`tags` STRING, `reconsume_times` INT, `first_born_time` TIMESTAMP, "
        "`original_store_time` TIMESTAMP, `dlq_store_time` TIMESTAMP, `time_to_dlq_s` DOUBLE, "
        "`dlq_commitlog_offset` BIGINT, `store_date` DATE, `retry_history` ARRAY<STRUCT<`attempt`: INT, "
        "`topic`: STRING, `commitlog_offset`: BIGINT, `store_time`: TIMESTAMP, `reconsume_times`: INT, "
        "`delay_level`: INT>>, `replayed_at` TIMESTAMP, `replay_run_id` STRING, `original_commitlog_offset` BIGINT"
    ),
    "dlq_summary": (
        "`store_date` DATE, `broker_name` STRING, `consumer_group` STRING, `original_topic` STRING, "
        "`messages` BIGINT, `distinct_originals` BIGINT, `p50_time_to_dlq_s` DOUBLE, "
        "`p95_time_to_dlq_s` DOUBLE, `max_time_to_dlq_s` DOUBLE, `top_keys` ARRAY<STRING>, "
        "`top_tags` ARRAY<STRING>, `replayed` BIGINT"
    ),
    "audit_findings": (
        "`audit_run_id` STRING, `audited_at` TIMESTAMP, `broker_name` STRING, `kind` STRING, "
        "`file` STRING, `offset` BIGINT, `commitlog_offset` BIGINT, `topic` STRING, `queue_id` INT, "
        "`detail` STRING"
    ),
    "topic_daily_stats": (
        "`store_date` DATE, `broker_name` STRING, `topic` STRING, `messages` BIGINT, `bytes` BIGINT, "
        "`body_bytes` BIGINT, `distinct_producers` BIGINT, `first_store_time` TIMESTAMP, "
        "`last_store_time` TIMESTAMP, `audit_run_id` STRING"
    ),
    "replay_ledger": (
        "`run_id` STRING, `broker_name` STRING, `commitlog_offset` BIGINT, `event_seq` INT, "
        "`status` STRING, `reason` STRING, `attempts` INT, `store_date` DATE, `source_topic` STRING, "
        "`source_queue_id` INT, `source_queue_offset` BIGINT, `source_msg_id` STRING, "
        "`source_uniq_key` STRING, `source_store_time` TIMESTAMP, `body_bytes` BIGINT, "
        "`replay_key` STRING, `target_topic` STRING, `target_broker` STRING, `target_queue_id` INT, "
        "`target_queue_offset` BIGINT, `target_msg_id` STRING, `target_offset_msg_id` STRING, "
        "`recorded_at` TIMESTAMP"
    ),
    "replay_runs": (
        "`run_id` STRING, `status` STRING, `selection` STRING, `target_namesrv` STRING, "
        "`target_topic` STRING, `options` STRING, `operator` STRING, `driver` STRING, `dry_run` BOOLEAN, "
        "`attempts` INT, `planned` BIGINT, `planned_bytes` BIGINT, `sent` BIGINT, `failed` BIGINT, "
        "`unknown` BIGINT, `skipped` BIGINT, `pending` BIGINT, `started_at` TIMESTAMP, "
        "`ended_at` TIMESTAMP, `message` STRING"
    ),
}


# ---- the contracts -----------------------------------------------------------------------------------
def test_registry_lists_every_table_by_job():
    assert INGEST_TABLES == ("messages", "consume_queue", "index_entries", "corrupt_records", "ingest_runs")
    assert REPORT_TABLES == ("consumer_lag", "consumer_lag_status", "dlq_messages", "dlq_summary", "audit_findings",
                             "topic_daily_stats")
    assert REPLAY_TABLES == ("replay_ledger", "replay_runs")
    assert tuple(TABLES) == INGEST_TABLES + REPORT_TABLES + REPLAY_TABLES
    assert all(c.name == name for name, c in TABLES.items())
    assert contract("messages") is MESSAGES
    with pytest.raises(KeyError, match="no table 'nope'; known: messages, consume_queue"):
        contract("nope")


def test_messages_table_extends_the_record():
    assert MESSAGES_SCHEMA.names[:len(RECORD_SCHEMA)] == RECORD_SCHEMA.names
    assert MESSAGES_SCHEMA.field("store_time").type == pa.timestamp("us", tz="UTC")
    assert [description_of(f) for f in RECORD_SCHEMA] == [text for _, _, text in RECORD_COLUMNS]


def test_every_column_is_described_in_its_field_metadata():
    for name, c in TABLES.items():
        assert c.description.strip(), name
        assert c.schema.names == c.names, name
        for f in c.schema:
            text = c.column(f.name).description
            assert text.strip(), (name, f.name)
            assert f.metadata == {DESCRIPTION_KEY.encode(): text.encode()}, (name, f.name)
        assert c.descriptions == {f.name: description_of(f) for f in c.schema}


def test_partitioning_keys_and_rules():
    assert {name: c.partition_by for name, c in TABLES.items()} == {
        "messages": ("broker_name", "store_date"), "consume_queue": ("broker_name",),
        "index_entries": ("broker_name",), "corrupt_records": ("broker_name",), "ingest_runs": (),
        "consumer_lag": ("broker_name",), "consumer_lag_status": ("broker_name",), "dlq_messages": ("store_date",),
        "dlq_summary": (), "audit_findings": (), "topic_daily_stats": (), "replay_ledger": ("run_id",),
        "replay_runs": ()}
    for name, c in TABLES.items():
        named = c.partition_by + c.key + c.required + tuple(a.column for a in c.allowed) + \
            tuple(a.when[0] for a in c.allowed if a.when)
        assert set(named) <= set(c.names), name
        for column in c.partition_by:  # Delta partition values are primitive
            assert not pa.types.is_nested(c.schema.field(column).type), (name, column)


def test_a_contract_that_names_a_missing_column_is_refused():
    columns = [("a", pa.int64(), "the a")]
    with pytest.raises(ValueError, match=r"^table contract 't': partition column 'p' is not a column; "
                                         r"allowed-values condition 'x' is not a column$"):
        TableContract("t", "a table", columns, partition_by=["p"], allowed=[Allowed("a", [1], when=("x", 1))])
    with pytest.raises(ValueError, match=r"^table contract 't': column 'b' has no description$"):
        TableContract("t", "a table", columns + [("b", pa.int64(), " ")])
    with pytest.raises(ValueError, match=r"^table contract 't': duplicate column 'a'$"):
        TableContract("t", "a table", columns + columns)


def test_enumerated_columns_and_their_values():
    from broker.store.constants import COMPRESSION_NAMES, TRANSACTION_TYPE_NAMES
    from schemas.replay import LEDGER_STATUSES, RUN_STATUSES

    enumerated = {(name, a.column, a.when): a.values for name, c in TABLES.items() for a in c.allowed}
    assert enumerated == {
        ("messages", "magic_code", None): (-626843481, -626843477),
        ("messages", "transaction_type", None): TRANSACTION_TYPE_NAMES,
        ("messages", "compression", None): COMPRESSION_NAMES,
        ("ingest_runs", "status", None): ("SUCCEEDED", "NOTHING_NEW", "FAILED"),
        ("consumer_lag", "offset_source", None): ("consumerOffset.json", "none"),
        ("consumer_lag_status", "level", None): ("partition", "group"),
        ("consumer_lag_status", "status", ("level", "partition")): ("OK", "WARN", "STALL", "STOP", "REWIND"),
        ("consumer_lag_status", "status", ("level", "group")): ("OK", "WARN", "ERR"),
        ("audit_findings", "kind", None): (
            "crc_mismatch", "corrupt_region", "cq_dangling_unit", "cq_mismatch", "cq_missing_unit", "cq_offset_gap",
            "cq_offset_repeat", "cq_phy_not_increasing", "index_missing_key", "duplicate_uniq_key",
            "payload_quarantined", "transaction_unresolved", "commit_without_half", "replica_lag",
            "replica_divergent"),
        ("replay_ledger", "status", None): LEDGER_STATUSES,
        ("replay_runs", "status", None): RUN_STATUSES,
    }
    assert TRANSACTION_TYPE_NAMES == ("NOT", "PREPARED", "COMMIT", "ROLLBACK")
    assert COMPRESSION_NAMES == ("NONE", "ZLIB", "LZ4", "ZSTD")
    assert LEDGER_STATUSES == ("PLANNED", "SENT", "FAILED", "UNKNOWN", "SKIPPED")
    assert RUN_STATUSES == ("RUNNING", "SUCCEEDED", "INCOMPLETE", "DRY_RUN")
    assert TABLES["consumer_lag_status"].allowed_values("status") == ("OK", "WARN", "STALL", "STOP", "REWIND", "ERR")
    assert TABLES["messages"].allowed_values("topic") == ()
    # the description says what the contract enforces (written from the same constants)
    for (name, column, _), values in enumerated.items():
        text = TABLES[name].column(column).description
        assert one_of(values) in text or all(str(v) in text for v in values), (name, column, text)


def test_writers_use_the_registry_values():
    """The report jobs' own names for the enumerations are the registry's (until they import them)."""
    from pipelines.reports import audit, consumer_lag, lag_status

    assert TABLES["audit_findings"].allowed_values("kind") == audit.KINDS
    assert TABLES["consumer_lag"].allowed_values("offset_source") == (consumer_lag.OFFSET_SOURCE_FILE,
                                                                      consumer_lag.OFFSET_SOURCE_NONE)
    status = TABLES["consumer_lag_status"]
    assert status.allowed_values("level") == (lag_status.PARTITION, lag_status.GROUP)
    by_level = {a.when[1]: a.values for a in status.allowed if a.when}
    assert by_level == {lag_status.PARTITION: (lag_status.OK, lag_status.WARN, lag_status.STALL, lag_status.STOP,
                                               lag_status.REWIND),
                        lag_status.GROUP: (lag_status.OK, lag_status.WARN, lag_status.ERR)}


def _condition(kwargs: dict) -> tuple | None:
    condition = kwargs.get("row_condition")
    if condition is None:
        return None
    condition = condition if isinstance(condition, dict) else condition.dict()
    assert condition["operator"] == "==", condition
    return condition["column"]["name"], condition["parameter"]


def test_quality_suites_enforce_the_contracts():
    from pipelines.quality.suites import ALL_TABLES, CRITICAL, TABLE_SCHEMAS, build_suite

    assert ALL_TABLES == tuple(TABLES)
    assert all(TABLE_SCHEMAS[name] is c.schema for name, c in TABLES.items())
    for name, c in TABLES.items():
        expectations = [(e.expectation_type, e.configuration.kwargs, e.meta[CRITICAL])
                        for e in build_suite(name).expectations]
        in_sets = [(kw["column"], tuple(kw["value_set"]), _condition(kw))
                   for kind, kw, critical in expectations if kind == "expect_column_values_to_be_in_set" and critical]
        assert in_sets == [(a.column, a.values, a.when) for a in c.allowed], name
        not_null = [kw["column"] for kind, kw, _ in expectations if kind == "expect_column_values_to_not_be_null"]
        assert not_null == list(c.required), name
        unique = [tuple(kw.get("column_list") or [kw.get("column")]) for kind, kw, critical in expectations
                  if kind in ("expect_compound_columns_to_be_unique", "expect_column_values_to_be_unique")]
        assert unique == ([c.key] if c.key else []), name
        if c.key:
            assert all(critical for kind, _, critical in expectations if "unique" in kind), name


def test_every_table_the_project_writes_has_a_contract():
    """Table names given to the lake writers anywhere in the code, and ``*_TABLE`` constants
    defined outside the schema modules, are registered tables."""
    exported = {attr: value for module_name in SCHEMA_MODULES
                for attr, value in vars(importlib.import_module(module_name)).items() if attr.isupper()}
    call = re.compile(r"\b(?:append_arrow|replace_arrow|write_table|write_partitions|write_source)\(([^()]*)")
    constant = re.compile(r"\b[A-Z][A-Z0-9_]*\b")
    literal = re.compile(r"^\s*\w+_TABLE\s*(?::[^=\n]*)?=\s*[\"'](\w+)[\"']", re.M)
    written: dict[str, str] = {}
    for directory in ("pipelines", "jobs", "schemas"):
        for path in sorted((ROOT / directory).rglob("*.py")):
            text, where = path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))
            for args in call.findall(text):
                for name in constant.findall(args):  # X_TABLE names, or contracts (X, X.name)
                    value = exported.get(name)
                    if name.endswith("_TABLE"):
                        assert isinstance(value, str), f"{where}: {name} is not a schema module's table name"
                        written[value] = where
                    elif isinstance(value, TableContract):
                        written[value.name] = where
            for name in literal.findall(text):
                written[name] = where
    assert {t: where for t, where in written.items() if t not in TABLES} == {}
    assert len(written) >= len(TABLES) // 2, f"the scan no longer sees the writers' calls ({sorted(written)})"
    # the schema modules' exported names are the contracts' (nothing declared beside the registry)
    for module_name in SCHEMA_MODULES:
        module = importlib.import_module(module_name)
        for attr, value in vars(module).items():
            if isinstance(value, TableContract):
                assert TABLES[value.name] is value, (module_name, attr)
            elif attr.endswith("_TABLE") and isinstance(value, str):
                assert value in TABLES, (module_name, attr)
                c = TABLES[value]
                prefix = attr.removesuffix("_TABLE")
                assert getattr(module, f"{prefix}_SCHEMA") is c.schema, (module_name, attr)
                assert getattr(module, f"{prefix}_COLUMNS") == list(c.columns), (module_name, attr)
                partition_by = getattr(module, f"{prefix}_PARTITION_BY", list(c.partition_by))
                assert partition_by == list(c.partition_by), (module_name, attr)


# ---- Spark ------------------------------------------------------------------------------------------------
def test_spark_ddl_is_what_the_hand_written_mapper_gave():
    assert {"record": spark_ddl(RECORD_SCHEMA), **{n: spark_ddl(c.schema) for n, c in TABLES.items()}} == OLD_SPARK_DDL
    # the decoder's zero-copy body is declared as what Spark receives: BINARY
    assert spark_ddl(body_as_view(RECORD_SCHEMA)) == OLD_SPARK_DDL["record"]


def test_spark_schema_is_what_spark_parses_and_carries_the_comments(spark):
    from pyspark.sql.types import BinaryType

    for name, c in TABLES.items():
        parsed = spark.createDataFrame([], spark_ddl(c.schema)).schema
        assert spark_schema(c.schema, comments=False) == parsed, name
        described = spark_schema(c.schema)
        assert [(f.name, f.dataType, f.nullable) for f in described] == \
            [(f.name, f.dataType, f.nullable) for f in parsed], name
        assert [f.metadata for f in described] == [{"comment": text} for text in c.descriptions.values()], name
    assert spark_schema(body_as_view(RECORD_SCHEMA))["body"].dataType == BinaryType()
    # the comments survive the JVM: what DESCRIBE shows for a frame of that schema
    df = spark.createDataFrame([], spark_schema(MESSAGES_SCHEMA))
    assert df.schema["body_crc_ok"].metadata == {"comment": MESSAGES.column("body_crc_ok").description}


# ---- Delta ----------------------------------------------------------------------------------------------
def _lag_rows(snapshot: str, broker: str = "broker-a") -> pa.Table:
    c = TABLES["consumer_lag"]
    t0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
    return pa.Table.from_pylist([
        {"snapshot_ts": t0, "snapshot_id": snapshot, "broker_name": broker, "consumer_group": "g", "topic": "T",
         "queue_id": q, "consumer_offset": 5, "min_offset": 0, "max_offset": 10, "lag_messages": 5,
         "lag_seconds": 1.5, "offset_source": "consumerOffset.json"} for q in (0, 1)], schema=c.schema)


def _delta_comments(path: Path) -> dict[str, str | None]:
    return {f.name: description_of(f) for f in DeltaTable(str(path)).schema().to_arrow()}


def _plain(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.remove_metadata() for f in schema])


def test_descriptions_reach_the_delta_schema_and_older_tables_keep_working(spark, tmp_path):
    from pipelines.lake import append_arrow, read_table, replace_arrow, scan_arrow, write_table

    c = TABLES["consumer_lag"]
    key = ["snapshot_id", "queue_id"]
    # a table created from the contract's schema documents every column in its Delta schema
    append_arrow(tmp_path / "new", c.name, _lag_rows("s1"), partition_by=c.partition_by)
    assert _delta_comments(tmp_path / "new" / c.name) == c.descriptions
    # rows without descriptions (a Spark frame through pyspark's converter) still append
    append_arrow(tmp_path / "new", c.name, _lag_rows("s2").cast(_plain(c.schema)), partition_by=c.partition_by)
    assert _delta_comments(tmp_path / "new" / c.name) == c.descriptions
    assert scan_arrow(tmp_path / "new", c.name).sort_by([(k, "ascending") for k in key]).to_pylist() == \
        pa.concat_tables([_lag_rows("s1"), _lag_rows("s2")]).to_pylist()
    # Spark reads it with the contract's Spark types
    frame = read_table(spark, tmp_path / "new", c.name)
    assert frame.schema == spark_schema(c.schema, comments=False)
    assert frame.count() == 4

    # a lake written before the descriptions existed: appends and replaces with described rows work,
    # and the table keeps its schema
    old = tmp_path / "old" / c.name
    write_deltalake(str(old), _lag_rows("s1").cast(_plain(c.schema)), partition_by=list(c.partition_by))
    append_arrow(tmp_path / "old", c.name, _lag_rows("s2"), partition_by=c.partition_by)
    replace_arrow(tmp_path / "old", c.name, _lag_rows("s3", "broker-b"), predicate="broker_name = 'broker-b'",
                  partition_by=c.partition_by)
    # ... and so does the Spark writer (Parquet files from the tasks, one delta-rs commit)
    result = write_table(spark.createDataFrame(_lag_rows("s4")), tmp_path / "old", c.name,
                         partition_by=c.partition_by, schema=c.schema)
    assert (result.committed, result.version) == (True, 3)
    assert _delta_comments(old) == {name: None for name in c.names}
    got = scan_arrow(tmp_path / "old", c.name).sort_by([(k, "ascending") for k in key])
    assert got.to_pylist() == pa.concat_tables([_lag_rows(s, b) for s, b in [
        ("s1", "broker-a"), ("s2", "broker-a"), ("s3", "broker-b"), ("s4", "broker-a")]]).to_pylist()
