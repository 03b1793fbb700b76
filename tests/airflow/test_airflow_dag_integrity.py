"""The DAG folder as Airflow's DagBag sees it: no import errors, every DAG documented, owned, tagged
and retried, no work at parse time, parsed in well under 2 s; plus the DAGs' pure helpers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from airflow_harness import DAGS, REPO

sys.path.insert(0, str(DAGS))  # where Airflow puts the DAG folder when it parses or runs it

from rocketlake_airflow import config  # noqa: E402
from rocketlake_airflow.tasks import SparkJobRetryPolicy  # noqa: E402

DAG_IDS = {"rocketlake_ingest", "rocketlake_lag", "rocketlake_reports", "rocketlake_maintenance", "rocketlake_replay"}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import BundleDagBag

    started = time.monotonic()
    bag = BundleDagBag(dag_folder=DAGS, bundle_path=DAGS, bundle_name="rocketlake")
    bag.wall_seconds = time.monotonic() - started
    return bag


def test_no_import_errors_and_every_dag_is_there(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == DAG_IDS


def test_every_dag_has_owner_tags_docs_and_retries(dagbag):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    for dag in dagbag.dags.values():
        assert dag.owner == "rocketlake", dag.dag_id
        assert "rocketlake" in dag.tags and len(dag.tags) >= 2, dag.dag_id
        assert dag.doc_md and dag.dag_id in dag.doc_md, dag.dag_id
        assert dag.default_args["retries"] >= 1, dag.dag_id
        assert dag.catchup is False, dag.dag_id
        for task in dag.tasks:
            assert task.owner == "rocketlake" and task.retries >= 1, task.task_id
            assert task.execution_timeout is not None and task.execution_timeout < timedelta(hours=config.MIN_RETENTION_HOURS), (
                f"{dag.dag_id}.{task.task_id}: a job may not outlive the VACUUM retention floor")
        spark = [t for t in dag.tasks if isinstance(t, SparkSubmitOperator)]
        assert spark, dag.dag_id  # every DAG runs a job through spark-submit
        for task in spark:
            assert task._conn_id == config.SPARK_CONN_ID and isinstance(task.retry_policy, SparkJobRetryPolicy)


def test_schedules_params_and_assets(dagbag):
    ingest, lag, reports = (dagbag.dags[d] for d in ("rocketlake_ingest", "rocketlake_lag", "rocketlake_reports"))
    maintenance, replay = dagbag.dags["rocketlake_maintenance"], dagbag.dags["rocketlake_replay"]
    assert ingest.timetable.delta == timedelta(minutes=15) and ingest.max_active_runs == 1
    assert lag.timetable.delta == timedelta(minutes=5)
    assert maintenance.timetable.expression == "0 0 * * *"  # @daily
    assert replay.timetable.can_be_scheduled is False  # manual trigger only

    outlets = {a.name for t in ingest.tasks for a in t.outlets}
    assert outlets == {f"rocketlake.{t}" for t in ("messages", "consume_queue", "index_entries",
                                                   "corrupt_records", "ingest_runs")}
    scheduled_on = {a.name for a in reports.timetable.asset_condition.objects}
    assert {"rocketlake.messages", "rocketlake.consume_queue"} <= scheduled_on <= outlets
    assert replay.params["dry_run"] is True  # default: plan only
    assert replay.params.get_param("run_id").schema["pattern"]
    assert ingest.params["split_bytes"] is None  # unset: the ingest job's own default applies
    assert lag.params["window"] == 10 and lag.params["stop_after_s"] == 600
    assert maintenance.params.get_param("retention_hours").schema["minimum"] == config.MIN_RETENTION_HOURS


def test_parse_time_is_well_under_two_seconds(dagbag):
    assert dagbag.wall_seconds < 2.0
    for stat in dagbag.dagbag_stats:
        assert stat.duration < timedelta(seconds=2), stat.file


_PARSE_WITHOUT_WORK = r"""
import json, socket, subprocess, sys, time
from pathlib import Path
# parsing must not read Variables or Connections, start processes or open connections
def refuse(*a, **k):
    raise AssertionError("work at parse time")
from airflow.sdk import BaseHook, Variable
# what Airflow itself loads while parsing (croniter probes the platform with a subprocess)
import croniter, airflow.timetables.trigger, airflow.timetables.simple  # noqa: E401,F401
import airflow.providers.apache.spark.operators.spark_submit, airflow.providers.standard.operators.python  # noqa
Variable.get = classmethod(refuse)
BaseHook.get_connection = classmethod(refuse)
subprocess.Popen.__init__ = refuse
socket.socket.connect = refuse
from airflow.dag_processing.dagbag import BundleDagBag
dags = Path(sys.argv[1])
started = time.monotonic()
bag = BundleDagBag(dag_folder=dags, bundle_path=dags, bundle_name="x")
print(json.dumps({"errors": bag.import_errors, "dags": sorted(bag.dag_ids), "seconds": time.monotonic() - started,
                  "ingest_every": bag.dags["rocketlake_ingest"].timetable.delta.total_seconds()}))
"""


def test_no_top_level_work_at_parse_time(tmp_path):
    """A fresh interpreter, no Airflow database at all, every outside call refused: the DAG files still
    parse (Airflow's own modules are imported first: only the DAG folder's code is under watch).
    Also: the schedule settings come from the environment."""
    env = {"PATH": "/usr/bin:/bin", "AIRFLOW_HOME": str(tmp_path), "ROCKETLAKE_INGEST_EVERY_MINUTES": "7"}
    proc = subprocess.run([sys.executable, "-c", _PARSE_WITHOUT_WORK, str(DAGS)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["errors"] == {} and set(result["dags"]) == DAG_IDS
    assert result["seconds"] < 2.0
    assert result["ingest_every"] == 7 * 60
    assert not (tmp_path / "airflow.db").exists()


def test_retry_policy_fails_fast_only_on_failures_a_retry_reproduces():
    from airflow.sdk import RetryAction

    from rocketlake_airflow.tasks import BAD_ARGUMENTS

    policy = SparkJobRetryPolicy(BAD_ARGUMENTS, {r"^validate \S+: FAILED": "critical"})

    def action(text: str) -> RetryAction:
        return policy.evaluate(Exception(text), 1, 3).action

    assert action("Cannot execute: spark-submit ... Error code is: 2.") is RetryAction.FAIL
    assert action("Cannot execute: x. Error code is: 1.\nLast spark-submit output:\n"
                  "validate 20300101: FAILED: 1 critical expectation(s) failed") is RetryAction.FAIL
    assert action("Cannot execute: x. Error code is: 1.\nLast spark-submit output:\nTraceback ...") is RetryAction.DEFAULT
    assert action("Cannot execute: x. Error code is: 134.") is RetryAction.DEFAULT
    assert SparkJobRetryPolicy.deserialize(policy.serialize()).fail_on_exit == {2: BAD_ARGUMENTS[2]}


def test_settings_parsing(tmp_path):
    store = tmp_path / "store"
    (store / "commitlog").mkdir(parents=True)
    other = tmp_path / "other"
    (other / "commitlog").mkdir(parents=True)
    assert config.parse_stores({"broker-a": str(store)}) == [f"broker-a={store}"]
    assert config.parse_stores(json.dumps({"a": str(store), "b": str(other)})) == [f"a={store}", f"b={other}"]
    assert config.parse_stores(f"a={store}, b={other}") == [f"a={store}", f"b={other}"]
    assert config.parse_stores([str(store)]) == [f"broker-a={store}"]
    assert config.parse_stores({"s3": "s3://bucket/store"}) == ["s3=s3://bucket/store"]
    for bad, message in ((f"a={store},a={other}", "twice"), ("a=relative/path", "absolute"),
                         (f"a={tmp_path}", "no commitlog"), ("bad name=/x", "broker name"), ("[]", "no stores")):
        with pytest.raises(config.ConfigError, match=message):
            config.parse_stores(bad)
    assert config.parse_thresholds({"groupA": 100, "*": 5}, "x", int) == ["*=5", "groupA=100"]
    assert config.parse_thresholds('{"g": 1.5}', "x", float) == ["g=1.5"]
    assert config.parse_thresholds({}, "x", int) == []
    with pytest.raises(config.ConfigError, match="not a number"):
        config.parse_thresholds({"g": "many"}, "x", int)


def test_replay_run_id_and_selection():
    import re

    from rocketlake_replay import RUN_ID, default_run_id, selection_args

    rid = default_run_id("manual__2026-11-25T15:03:24.143812+00:00")
    assert rid == "airflow-manual__2026-11-25T15-03-24.143812-00-00" and re.fullmatch(RUN_ID, rid)
    long_id = default_run_id("asset_triggered__" + "x" * 80)
    assert len(long_id) == 64 and re.fullmatch(RUN_ID, long_id)
    assert selection_args({"topic": "T", "since": "2030-01-01", "until": "2030-01-02", "tag": "a"}) == [
        "--topic", "T", "--tag", "a", "--since", "2030-01-01", "--until", "2030-01-02"]
    assert selection_args({"dlq_group": "g", "original_topic": "T"}) == ["--dlq", "g", "--original-topic", "T"]
    assert selection_args({"where": "topic = 'T'"}) == ["--where", "topic = 'T'"]
    for params, message in (({}, "exactly one"), ({"topic": "T", "where": "x"}, "got topic, where"),
                            ({"topic": "T"}, "needs 'since'")):
        with pytest.raises(config.ConfigError, match=message):
            selection_args(params)


def test_lag_alert_rule():
    from rocketlake_lag import lag_alerts

    ok = {"broker_name": "b", "consumer_group": "ok", "status": "OK", "reason": "fine", "lag_messages": 5,
          "lag_seconds": 1.0, "max_lag_messages": 10, "max_lag_seconds": None}
    err = {**ok, "consumer_group": "stuck", "status": "ERR", "reason": "STALL", "max_lag_messages": None}
    over = {**ok, "consumer_group": "behind", "status": "WARN", "lag_messages": 11}
    slow = {**ok, "consumer_group": "slow", "max_lag_seconds": 0.5}
    alerts = lag_alerts([ok, err, over, slow])
    assert [a.split(":")[0] for a in alerts] == ["b/stuck", "b/behind", "b/slow"]
    assert "lag 11 > 10 messages" in alerts[1] and "lag 1 s > 0.5 s" in alerts[2]
