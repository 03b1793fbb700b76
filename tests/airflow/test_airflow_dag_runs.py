"""``airflow dags test`` of the rocketlake DAGs, for real: spark-submit of the jobs in .venv, a copy of
the golden store, a temporary lake and Airflow home (sqlite). The tests run in file order and share
the lake: ingest -> reports, a second ingest, lag snapshots, maintenance of what they wrote, a replay
dry run."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from airflow_harness import (
    PROJECT_PYTHON,
    airflow,
    airflow_env,
    asset_events,
    dags_test,
    lake_state,
    last_run,
    queued_by_assets,
    start,
    stop,
    task_states,
    xcom,
)

INGEST_TABLES = {"messages", "consume_queue", "index_entries", "corrupt_records", "ingest_runs"}
ORDERS = 135 + 163 + 179 + 153  # TopicOrders messages of the golden store (4 queues)


@pytest.fixture(scope="module")
def world(tmp_path_factory, golden_store):
    if not PROJECT_PYTHON.exists():
        pytest.fail(f"{PROJECT_PYTHON} missing: the DAGs submit the jobs with the project's .venv ('make venv')")
    tmp = tmp_path_factory.mktemp("airflow")
    store = tmp / "store_a"
    shutil.copytree(golden_store, store)
    lake = tmp / "lake"
    logs = tmp / "logs"
    logs.mkdir()
    env = airflow_env(tmp / "airflow_home", rocketlake_stores=f'{{"broker-a": "{store}"}}', rocketlake_lake=str(lake))
    migrate = airflow(env, "db", "migrate")
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    return {"env": env, "lake": lake, "store": store, "tmp": tmp, "logs": logs}


def run_ok(world, dag_id: str, conf: dict | None = None) -> tuple[str, str]:
    proc = dags_test(world["env"], dag_id, conf, world["logs"])
    run_id, state = last_run(world["env"], dag_id)
    assert proc.returncode == 0 and state == "success", (
        f"{dag_id} {state}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    return run_id, proc.stdout + proc.stderr


def test_ingest_writes_the_tables_and_emits_one_asset_per_table_then_reports_run(world):
    env, lake = world["env"], world["lake"]
    run_id, out = run_ok(world, "rocketlake_ingest")

    state = lake_state(lake)
    assert INGEST_TABLES <= set(state)  # the DAG's Asset list is exactly what the ingest writes
    assert set(state) == INGEST_TABLES
    assert state["messages"]["rows"] > 2000
    events = asset_events(env, "rocketlake_ingest", run_id)
    assert set(events) == {f"rocketlake.{t}" for t in INGEST_TABLES}
    assert events["rocketlake.messages"]["lake"] == str(lake)
    assert events["rocketlake.messages"]["version"] == state["messages"]["version"]
    assert events["rocketlake.messages"]["marks"]["broker-a"][0] is None  # from nothing to the store's end
    assert "rocketlake_reports" in queued_by_assets(env)  # the Assets schedule the reports DAG
    assert "ingest broker-a: offsets [0," in out
    # spark-submit got what every rocketlake launcher passes (JVM options, the class archive)
    launch = subprocess.run([str(PROJECT_PYTHON), "-m", "pipelines.job_args", "--json"], capture_output=True,
                            text=True, check=True)
    for name, value in json.loads(launch.stdout).items():
        assert f"--conf {name}={value}" in out

    run_id, out = run_ok(world, "rocketlake_reports")
    assert set(task_states(env, "rocketlake_reports", run_id).values()) == {"success"}
    state = lake_state(lake)
    assert {"dlq_messages", "dlq_summary", "audit_findings", "topic_daily_stats"} <= set(state)
    assert state["dlq_messages"]["rows"] == 33  # %DLQ%groupA
    assert "validate " in out and ": OK" in out  # Great Expectations ran, nothing critical failed
    assert (lake / "_quality").is_dir()
    assert set(asset_events(env, "rocketlake_reports", run_id)) == {
        "rocketlake.dlq_messages", "rocketlake.dlq_summary", "rocketlake.audit_findings", "rocketlake.topic_daily_stats"}


def test_a_second_ingest_adds_nothing_and_emits_nothing(world):
    env, lake = world["env"], world["lake"]
    before = lake_state(lake)
    run_id, out = run_ok(world, "rocketlake_ingest")
    assert lake_state(lake) == before
    assert asset_events(env, "rocketlake_ingest", run_id) == {}
    states = task_states(env, "rocketlake_ingest", run_id)
    assert {states[f"publish.{t}"] for t in INGEST_TABLES} == {"skipped"}
    assert "nothing new" in out


def test_lag_snapshots_then_the_alert_fires_on_a_stalled_group(world):
    env, lake = world["env"], world["lake"]
    # first snapshot: no trend yet, every group OK; a threshold the groups stay under
    run_id, out = run_ok(world, "rocketlake_lag", {"max_lag_messages": {"groupZ": 5}})
    assert xcom(env, "rocketlake_lag", run_id, "alert") == 3  # groupA, groupZ, CID_Analytics-1
    assert "--max-lag-messages groupZ=5" in out
    assert lake_state(lake)["consumer_lag"]["files"] == 1

    # second snapshot: the golden store's consumers never moved while lag > 0: STALL, group ERR
    proc = dags_test(env, "rocketlake_lag", None, world["logs"])
    run_id, state = last_run(env, "rocketlake_lag")
    assert proc.returncode != 0 and state == "failed"
    states = task_states(env, "rocketlake_lag", run_id)
    assert (states["lag_snapshot"], states["lag_status"], states["alert"]) == ("success", "success", "failed")
    text = proc.stdout + proc.stderr
    assert "consumer group(s) need attention" in text and "broker-a/groupA: ERR" in text
    assert "rocketlake lag alert" in text  # the on_failure_callback hook ran
    assert lake_state(lake)["consumer_lag"]["files"] == 2


def test_maintenance_compacts_the_lag_table_and_the_tables_read_the_same(world):
    lake = world["lake"]
    before = lake_state(lake)
    assert before["consumer_lag"]["files"] == 2 and before["consumer_lag_status"]["files"] == 2
    run_id, out = run_ok(world, "rocketlake_maintenance")
    after = lake_state(lake)
    assert after["consumer_lag"]["files"] == 1 and after["consumer_lag_status"]["files"] == 1
    assert "maintenance consumer_lag: files 2 -> 1, compacted 2 into 1" in out
    assert set(after) == set(before)
    for table in before:
        assert (after[table]["rows"], after[table]["digest"]) == (before[table]["rows"], before[table]["digest"]), table
        assert after[table]["files"] <= before[table]["files"], table


def test_replay_dry_run_records_a_dry_run_row(world):
    env, lake, tmp = world["env"], world["lake"], world["tmp"]
    ns, ns_addr = start(tmp, "namesrv", "namesrv", "start", "--listen", "127.0.0.1:{port}")
    try:
        broker, broker_addr = start(tmp, "broker", "broker", "start", "--store", str(tmp / "target"),
                                    "--listen", "127.0.0.1:{port}", "--namesrv", ns_addr, "--processes", "1")
        try:
            created = subprocess.run([str(PROJECT_PYTHON), "-m", "broker.cli", "admin", "updateTopic", "-n", ns_addr,
                                      "-b", broker_addr, "-t", "OrdersDry", "-r", "4", "-w", "4"],
                                     capture_output=True, text=True, timeout=120)
            assert created.returncode == 0, created.stdout + created.stderr
            run_id, out = run_ok(world, "rocketlake_replay", {
                "topic": "TopicOrders", "since": "2000-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z",
                "target_topic": "OrdersDry", "namesrv": ns_addr, "rate": 100})
        finally:
            stop(broker)
    finally:
        stop(ns)
    replay_id = xcom(env, "rocketlake_replay", run_id, "plan", "run_id")
    assert replay_id.startswith("airflow-manual__")
    row = lake_state(lake)["replay_runs"]["runs"][replay_id]
    assert (row["status"], row["dry_run"], row["planned"], row["sent"]) == ("DRY_RUN", True, ORDERS, 0)
    outcome = xcom(env, "rocketlake_replay", run_id, "outcome")
    assert (outcome["run_id"], outcome["status"]) == (replay_id, "DRY_RUN")
    assert "DRY RUN: nothing is sent" in out and f"replay {replay_id}: DRY_RUN recorded" in out


_DUPLICATE_INGEST_RUNS = r"""
import os, sys
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake
path = os.path.join(sys.argv[1], "ingest_runs")
dt = DeltaTable(path)
rows = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
write_deltalake(path, rows.cast(pa.schema(dt.schema().to_arrow())), mode="append")
os._exit(0)
"""


def test_a_critical_expectation_failure_fails_the_reports_run_without_retries(world):
    env, lake = world["env"], world["lake"]
    broken = subprocess.run([str(PROJECT_PYTHON), "-c", _DUPLICATE_INGEST_RUNS, str(lake)], capture_output=True,
                            text=True, timeout=120)
    assert broken.returncode == 0, broken.stderr  # ingest_runs now has a duplicate key: a critical failure
    # the reports themselves ran in the first test: only the validation runs here
    proc = dags_test(env, "rocketlake_reports", None, world["logs"], skip="^(dlq_report|audit)$")
    run_id, state = last_run(env, "rocketlake_reports")
    assert proc.returncode != 0 and state == "failed"
    assert task_states(env, "rocketlake_reports", run_id) == {
        "config": "success", "dlq_report": "success", "audit": "success", "validate": "failed"}
    text = proc.stdout + proc.stderr
    assert "ingest_runs: FAILED (critical)" in text
    assert "a critical expectation failed" in text  # the retry policy failed the task at once
    assert "up_for_retry" not in text
