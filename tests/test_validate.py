"""Data quality (jobs/validate.py, pipelines.quality): Great Expectations suites over the lake.

The golden store is ingested once; its tables follow their contracts (schemas.registry), the clean
lake validates (report and replay tables skipped), a copy with a duplicated ``messages`` row fails
critically, and a lake of small hand-made report and replay tables with one suspicious value passes
with a warning. GX on Spark costs a few Spark jobs per expectation, so the
runs are few and the damaged run validates ``messages`` only.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from broker.cli import run_job
from pipelines.ingest import ingest
from pipelines.job_args import StoreSpec
from pipelines.lake import append_arrow, scan_arrow
from pipelines.quality.runner import (
    DATA_DOCS_DIR,
    GX_DIR,
    QUALITY_DIR,
    RESULTS_DIR,
    SITE_NAME,
    SUMMARY_FILE,
    open_context,
)
from pipelines.quality.suites import (
    ALL_TABLES,
    CRITICAL,
    INGEST_TABLES,
    REPLAY_TABLES,
    REPORT_TABLES,
    TABLE_SCHEMAS,
    build_suite,
    is_critical,
    suite_columns,
)
from schemas.contract import description_of
from schemas.messages import MESSAGES_PARTITION_BY, MESSAGES_TABLE
from schemas.registry import TABLES
from schemas.replay import REPLAY_LEDGER_SCHEMA, REPLAY_LEDGER_TABLE, REPLAY_RUNS_SCHEMA, REPLAY_RUNS_TABLE
from schemas.reports import (
    AUDIT_FINDINGS_SCHEMA,
    AUDIT_FINDINGS_TABLE,
    CONSUMER_LAG_SCHEMA,
    CONSUMER_LAG_STATUS_SCHEMA,
    CONSUMER_LAG_STATUS_TABLE,
    CONSUMER_LAG_TABLE,
    DLQ_MESSAGES_SCHEMA,
    DLQ_MESSAGES_TABLE,
    DLQ_SUMMARY_SCHEMA,
    DLQ_SUMMARY_TABLE,
    TOPIC_DAILY_STATS_SCHEMA,
    TOPIC_DAILY_STATS_TABLE,
)

UTC = dt.timezone.utc
DUPLICATE_KEY = "expect_compound_columns_to_be_unique(broker_name, commitlog_offset)"


def job_main(argv: list[str]) -> int:
    """``jobs/validate.py``'s main, loaded the way ``rocketlake`` loads it."""
    return run_job("validate.py", argv)


def run_summary(lake: Path) -> dict:
    """summary.json of the lake's only (or newest) run."""
    [run_dir] = sorted((lake / QUALITY_DIR / RESULTS_DIR).iterdir())[-1:]
    return json.loads((run_dir / SUMMARY_FILE).read_text())


@pytest.fixture(scope="module")
def lake(spark, golden_store, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("quality") / "lake"
    [summary] = ingest(spark, [StoreSpec("broker-a", str(golden_store))], str(root))
    assert summary.rows["messages"] == 2001
    return root


# ---- suites, no Spark -----------------------------------------------------------------------------------
def test_every_table_has_a_suite_over_its_own_columns():
    assert ALL_TABLES == tuple(TABLES) == INGEST_TABLES + REPORT_TABLES + REPLAY_TABLES and len(ALL_TABLES) == 13
    assert set(TABLE_SCHEMAS) == set(ALL_TABLES)
    for table in ALL_TABLES:
        suite = build_suite(table)
        assert suite.name == table and suite.expectations, table
        assert set(suite_columns(suite)) <= set(TABLE_SCHEMAS[table].names), table
        for e in suite.expectations:
            assert isinstance(e.meta[CRITICAL], bool), (table, e.expectation_type)
            assert e.severity.value == ("critical" if e.meta[CRITICAL] else "warning")
    flags = [(e.expectation_type, e.configuration.kwargs.get("column"), is_critical(e.meta))
             for e in build_suite(MESSAGES_TABLE, skew_ms=5000).expectations]
    assert flags == [  # the contract's rules (schemas.messages.MESSAGES), then the table's own
        ("expect_column_values_to_not_be_null", "commitlog_offset", True),
        ("expect_column_values_to_not_be_null", "topic", True),
        ("expect_compound_columns_to_be_unique", None, True),
        ("expect_column_values_to_be_in_set", "magic_code", True),
        ("expect_column_values_to_be_in_set", "transaction_type", True),
        ("expect_column_values_to_be_in_set", "compression", True),
        ("expect_column_values_to_be_between", "store_size", True),
        ("expect_column_values_to_be_between", "queue_offset", True),
        ("expect_column_values_to_be_in_set", "body_crc_ok", False),
        ("unexpected_rows_expectation", None, False),
    ]
    skew = build_suite(MESSAGES_TABLE, skew_ms=5000).expectations[-1]
    assert "store_timestamp < born_timestamp - 5000" in skew.unexpected_rows_query


def test_context_is_file_backed_offline_and_reopens(tmp_path):
    first = open_context(tmp_path)
    again = open_context(tmp_path)  # a second run on the same lake reads the saved config back
    for context in (first, again):
        assert context.root_directory == str(tmp_path / QUALITY_DIR / GX_DIR)
        assert context.config.analytics_enabled is False
        assert list(context.list_data_docs_sites()) == [SITE_NAME]
    config = (tmp_path / QUALITY_DIR / GX_DIR / "great_expectations.yml").read_text()
    assert "analytics_enabled: false" in config and "local_site" not in config
    assert f"base_directory: ../{DATA_DOCS_DIR}/" in config


def test_unknown_table_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        job_main(["--lake", str(tmp_path), "--tables", "messages,nope"])
    assert exc.value.code == 2
    assert "unknown table(s) nope" in capsys.readouterr().err


# ---- the golden lake ---------------------------------------------------------------------------------
def test_ingested_tables_follow_their_contracts(lake):
    """The ingest writes each table as the registry declares it: columns, partitioning and, for a
    lake it created, every column's description in the Delta schema."""
    for table in INGEST_TABLES:
        contract = TABLES[table]
        dt = DeltaTable(str(lake / table))
        schema = dt.schema().to_arrow()
        assert ([f.name for f in schema], dt.metadata().partition_columns) == \
            (contract.names, list(contract.partition_by)), table
        assert {f.name: description_of(f) for f in schema} == contract.descriptions, table


@pytest.fixture
def no_network(monkeypatch) -> list:
    """Refuse (and record) every connection that is not to this machine: Spark's py4j and the block
    manager use loopback, GX must use nothing."""
    attempts: list = []
    real_connect = socket.socket.connect

    def connect(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(address)
            raise OSError(f"test: no network ({address})")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return attempts


def test_clean_lake_validates(lake, golden_store, capsys, no_network):
    # --store: ingest first (nothing new here: the fixture ingested the store) then validate
    assert job_main(["--store", f"broker-a={golden_store}", "--lake", str(lake)]) == 0
    assert no_network == []
    out = capsys.readouterr().out
    assert out.startswith("ingest broker-a: offsets [4862971, 4862971) nothing new in ")
    summary = run_summary(lake)
    assert summary["success"] is True and summary["exit_code"] == 0
    run_dir = lake / QUALITY_DIR / RESULTS_DIR / summary["run_id"]
    for table in INGEST_TABLES:
        n = len(build_suite(table).expectations)
        got = summary["tables"][table]
        assert (got["status"], got["success"], got["evaluated"], got["successful"], got["failed_expectations"]) == \
            ("passed", True, n, n, []), table
        assert got["result_file"] == str(run_dir / f"{table}.json")
        result = json.loads((run_dir / f"{table}.json").read_text())
        assert result["success"] is True and result["statistics"]["evaluated_expectations"] == n
        assert f"{table}: {n}/{n} expectations passed\n" in out
        assert Path(got["data_docs_page"]).is_file()
        assert Path(got["data_docs_page"]).is_relative_to(lake / QUALITY_DIR / DATA_DOCS_DIR / "validations" / table)
    for table in REPORT_TABLES + REPLAY_TABLES:
        assert summary["tables"][table]["status"] == "skipped" and summary["tables"][table]["success"] is None
        assert f"{table}: skipped (table does not exist)\n" in out
    assert "messages: 10/10 expectations passed\n" in out
    index = lake / QUALITY_DIR / DATA_DOCS_DIR / "index.html"
    assert summary["data_docs_index"] == str(index) and index.is_file()
    assert len(list((lake / QUALITY_DIR / DATA_DOCS_DIR / "validations").rglob("*.html"))) == len(INGEST_TABLES)
    assert f"data docs: {index}\n" in out
    site = [p.read_text() for p in (lake / QUALITY_DIR / DATA_DOCS_DIR).rglob("*.html")]
    assert site and not any("amazonaws.com" in page for page in site)  # GX's logo beacon points home


def test_duplicate_message_fails_critically(lake, tmp_path, capsys):
    damaged = tmp_path / "lake"
    shutil.copytree(lake, damaged, ignore=shutil.ignore_patterns(QUALITY_DIR))
    row = scan_arrow(damaged, MESSAGES_TABLE, filter=pc.field("commitlog_offset") == 0)
    assert row.num_rows == 1
    append_arrow(damaged, MESSAGES_TABLE, row, partition_by=MESSAGES_PARTITION_BY)

    assert job_main(["--lake", str(damaged), "--tables", MESSAGES_TABLE]) == 1
    out = capsys.readouterr().out
    summary = run_summary(damaged)
    assert (summary["success"], summary["exit_code"], list(summary["tables"])) == (False, 1, [MESSAGES_TABLE])
    got = summary["tables"][MESSAGES_TABLE]
    assert (got["status"], got["success"], got["evaluated"], got["successful"]) == ("failed", False, 10, 9)
    assert got["failed_expectations"] == [{
        "expectation": DUPLICATE_KEY, "type": "expect_compound_columns_to_be_unique", "critical": True,
        "unexpected_count": 2, "observed_value": None, "exception": None}]
    assert f"messages: FAILED (critical): {DUPLICATE_KEY} [2 unexpected]\n" in out


# ---- report tables -----------------------------------------------------------------------------------
def _rows(schema: pa.Schema, rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema)


def _append(lake: Path, table: str, rows: pa.Table) -> None:
    append_arrow(lake, table, rows, partition_by=TABLES[table].partition_by)


def _report_lake(lake: Path) -> None:
    """One small, valid table per report and replay schema, except a DLQ message that reached the
    DLQ before it was born (producer clock ahead): suspicious, not wrong."""
    from pipelines.reports.audit import KINDS
    from pipelines.reports.consumer_lag import OFFSET_SOURCE_FILE
    from pipelines.reports.lag_status import ERR, GROUP, PARTITION, WARN
    from schemas.replay import PLANNED, RUN_SUCCEEDED, SENT

    t0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
    day = t0.date()
    common = {"broker_name": "broker-a", "consumer_group": "g"}
    _append(lake, CONSUMER_LAG_TABLE, _rows(CONSUMER_LAG_SCHEMA, [
        {**common, "snapshot_ts": t0, "snapshot_id": "s1", "topic": "T", "queue_id": q, "consumer_offset": 5,
         "min_offset": 0, "max_offset": 10, "lag_messages": 5, "lag_seconds": 1.5, "offset_source": OFFSET_SOURCE_FILE}
        for q in (0, 1)]))
    _append(lake, CONSUMER_LAG_STATUS_TABLE, _rows(CONSUMER_LAG_STATUS_SCHEMA, [
        {**common, "evaluated_at": t0, "snapshot_id": "s1", "topic": "T", "queue_id": 0, "level": PARTITION,
         "status": WARN, "snapshots": 3, "lag_messages": 5},
        {**common, "evaluated_at": t0, "snapshot_id": "s1", "level": GROUP, "status": ERR, "snapshots": 3,
         "lag_messages": 10}]))
    _append(lake, DLQ_MESSAGES_TABLE, _rows(DLQ_MESSAGES_SCHEMA, [
        {**common, "dlq_topic": "%DLQ%g", "original_topic": "T", "reconsume_times": 16, "dlq_commitlog_offset": 100,
         "dlq_store_time": t0, "first_born_time": t0 + dt.timedelta(seconds=5), "time_to_dlq_s": -5.0,
         "store_date": day, "keys": [], "retry_history": []}]))
    _append(lake, DLQ_SUMMARY_TABLE, _rows(DLQ_SUMMARY_SCHEMA, [
        {**common, "store_date": day, "original_topic": "T", "messages": 1, "distinct_originals": 1,
         "p50_time_to_dlq_s": 2.0, "p95_time_to_dlq_s": 2.0, "max_time_to_dlq_s": 2.0, "replayed": 0}]))
    _append(lake, AUDIT_FINDINGS_TABLE, _rows(AUDIT_FINDINGS_SCHEMA, [
        {"audit_run_id": "a1", "audited_at": t0, "broker_name": "broker-a", "kind": KINDS[0], "detail": "x"}]))
    _append(lake, TOPIC_DAILY_STATS_TABLE, _rows(TOPIC_DAILY_STATS_SCHEMA, [
        {"store_date": day, "broker_name": "broker-a", "topic": "T", "messages": 2, "bytes": 400, "body_bytes": 10,
         "distinct_producers": 1, "first_store_time": t0, "last_store_time": t0, "audit_run_id": "a1"}]))
    _append(lake, REPLAY_LEDGER_TABLE, _rows(REPLAY_LEDGER_SCHEMA, [
        {"run_id": "r1", "broker_name": "broker-a", "commitlog_offset": 100, "event_seq": seq, "status": status,
         "attempts": attempts, "store_date": day, "recorded_at": t0}
        for seq, status, attempts in [(1, PLANNED, 0), (2, SENT, 1)]]))
    _append(lake, REPLAY_RUNS_TABLE, _rows(REPLAY_RUNS_SCHEMA, [
        {"run_id": "r1", "status": RUN_SUCCEEDED, "selection": "--dlq-group g", "target_namesrv": "127.0.0.1:9876",
         "dry_run": False, "attempts": 1, "planned": 1, "sent": 1, "started_at": t0, "ended_at": t0}]))


def test_non_critical_failure_warns_and_exits_zero(spark, tmp_path, capsys):
    lake = tmp_path / "reports"
    _report_lake(lake)
    assert job_main(["--lake", str(lake)]) == 0
    out = capsys.readouterr().out
    summary = run_summary(lake)
    assert (summary["success"], summary["exit_code"]) == (True, 0)
    statuses = {t: r["status"] for t, r in summary["tables"].items()}
    assert statuses == {**{t: "skipped" for t in INGEST_TABLES}, **{t: "passed" for t in REPORT_TABLES + REPLAY_TABLES},
                        DLQ_MESSAGES_TABLE: "warning"}
    dlq = summary["tables"][DLQ_MESSAGES_TABLE]
    assert (dlq["success"], dlq["evaluated"], dlq["successful"]) == (True, 4, 3)
    assert dlq["failed_expectations"] == [{
        "expectation": "expect_column_values_to_be_between(time_to_dlq_s)",
        "type": "expect_column_values_to_be_between", "critical": False, "unexpected_count": 1,
        "observed_value": None, "exception": None}]
    for table in REPORT_TABLES + REPLAY_TABLES:
        n = len(build_suite(table).expectations)
        assert summary["tables"][table]["evaluated"] == n
    assert ("dlq_messages: 3/4 expectations passed; WARNING: "
            "expect_column_values_to_be_between(time_to_dlq_s) [1 unexpected]\n") in out
    assert "OK with 1 warning(s)" in out
