"""The jobs on a real Spark standalone cluster (master + 2 workers, separate JVMs and Python workers)
give the same tables as on ``local[2]``.

A module-scoped cluster from :mod:`pipelines.cluster` on free ports under a tmp dir; a copy of the
golden store; then ingest, consumer lag, DLQ, audit and a replay ``--dry-run`` run twice: as
``spark-submit --master spark://…`` subprocesses into one lake, and in-process (``rocketlake <job>``)
on the tests' ``local[2]`` session into another. Store and lakes are given as paths relative to the
submit directory (executors run in their worker's work directory, so the driver must make them
absolute).

The executors run a Python that cannot import the project (the venv's site-packages without the
editable install's finder): the code reaches them only through ``--py-files`` of the packed zip.
That Python notes its working directory on each start, so the test sees Python ran inside each
worker's work directory; each worker's executor log shows tasks ran there.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from deltalake import DeltaTable

from broker.client import Admin
from pipelines import cluster as cl, spark_cds
from pipelines.job_args import launch_conf_args
from tests.broker_harness import REPO, free_port, start_broker, start_namesrv
from tests.job_runner import run_job_in_process

SNAPSHOT_TS = "2030-01-01T00:00:00Z"
REPLAY_TOPIC = "ReplayDry"
STORE = "store"                           # relative to the submit directory, like the lakes
INGEST_APP = "rocketlake-ingest"          # app name of jobs/ingest_commitlog.py (its job_session)
# columns that differ between two runs by nature: run ids, wall-clock times, the driver's host:pid
VARYING = re.compile(r".*run_id$|.*_at$|duration_s|driver")


def _env() -> dict[str, str]:
    """The environment of the daemons and of spark-submit: no PYTHONPATH (nothing may lead a
    Python to the repository but --py-files), SPARK_HOME for the venv's spark-submit."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SPARK_HOME=str(cl.spark_home()), SPARK_LOCAL_IP=cl.HOST)
    return env


def _python_without_project(tmp: Path) -> tuple[Path, Path]:
    """A Python for executors: the venv's site-packages on PYTHONPATH but no ``site`` (so no
    ``.pth`` file, hence no editable install of the project); it appends its cwd to a log."""
    wrapper, starts = tmp / "python-without-project", tmp / "python-starts.log"
    site_packages = sysconfig.get_paths()["purelib"]
    wrapper.write_text("#!/bin/sh\n"
                       f'pwd >> "{starts}"\n'
                       f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site_packages}" exec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, starts


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Master + 2 workers (1 core, 1 GiB each) on free loopback ports; stopped even when a test or
    the start itself fails."""
    spec = cl.ClusterSpec(str(tmp_path_factory.mktemp("cluster") / "state"), master_port=free_port(),
                          master_ui_port=free_port(), workers=2, worker_cores=1, worker_memory="1g")
    try:
        cl.start_cluster(spec, env=_env())
        yield spec
    finally:
        cl.stop_cluster(spec.state_dir)


def _submit(cwd: Path, log: Path, master_args: list[str], job: str, *args: str) -> str:
    cmd = [str(Path(sys.executable).parent / "spark-submit"), *master_args, *launch_conf_args(),
           "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
           str(REPO / "jobs" / job), *args]
    with open(log, "ab") as err:
        proc = subprocess.run(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=err, timeout=900)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, f"{job} {' '.join(master_args[:2])} exited {proc.returncode}; see {log}\n{out[-3000:]}"
    return out


def _jobs(lake: str, namesrv: str) -> dict[str, tuple[str, list[str]]]:
    """The five jobs in order into ``lake`` (relative to the submit directory): by their
    ``rocketlake`` command name, the ``jobs/`` file and its arguments."""
    store = ["--store", f"broker-a={STORE}", "--lake", lake]
    return {
        "ingest": ("ingest_commitlog.py", store),
        "lag": ("consumer_lag.py", [*store, "--snapshot-ts", SNAPSHOT_TS]),
        "dlq": ("dlq_report.py", [*store, "--no-ingest"]),
        "audit": ("audit.py", [*store, "--no-ingest"]),
        "replay": ("replay.py", ["--lake", lake, "--namesrv", namesrv, "--topic", "TopicOrders",
                                 "--since", "2000-01-01", "--until", "2100-01-01", "--target-topic", REPLAY_TOPIC,
                                 "--dry-run", "--run-id", "cluster-dry"]),
    }


def _run_on_cluster(cwd: Path, lake: str, namesrv: str, master_args: list[str]) -> dict[str, str]:
    """The five jobs as ``spark-submit`` subprocesses: their stdout by job."""
    log = cwd / f"{lake}.log"
    return {name: _submit(cwd, log, master_args, file, *args) for name, (file, args) in _jobs(lake, namesrv).items()}


def _run_locally(config: pytest.Config, cwd: Path, lake: str, namesrv: str) -> dict[str, str]:
    """The same five jobs in this process (``rocketlake <job>``) on the tests' local[2] session, from
    the same directory with the same relative paths: their stdout by job. In-process rather than five
    more spark-submits: the comparison is cluster against local[2], and a JVM start per job is what
    made this module the suite's slowest."""
    out = {}
    for name, (_, args) in _jobs(lake, namesrv).items():
        rc, stdout, stderr = run_job_in_process(config, [name, *args], cwd=cwd)
        assert rc == 0, f"rocketlake {name} exited {rc}:\n{stderr[-3000:]}"
        out[name] = stdout
    return out


@pytest.fixture(scope="module")
def runs(request, spark, cluster, golden_store, tmp_path_factory):
    """Both runs of the jobs on one copy of the golden store, against one replay target."""
    tmp = tmp_path_factory.mktemp("cluster-jobs")
    shutil.copytree(golden_store, tmp / "store")
    pyfiles, _ = cl.pack_pyfiles(tmp / "rocketlake-pyfiles.zip")
    python, starts = _python_without_project(tmp)
    ns_proc, namesrv = start_namesrv(tmp)
    target = start_broker(tmp / "target-store", namesrv)
    try:
        with Admin(namesrv) as admin:
            admin.create_topic(target.addr, REPLAY_TOPIC, queues=4)
            assert admin.wait_writable(REPLAY_TOPIC), f"{REPLAY_TOPIC} not routed"
        on_cluster = ["--master", cluster.master_url,
                      "--conf", f"spark.driver.host={cl.HOST}", "--conf", f"spark.driver.bindAddress={cl.HOST}",
                      "--conf", f"spark.pyspark.python={python}", "--conf", f"spark.pyspark.driver.python={sys.executable}",
                      # both executors registered before the first task is scheduled: work goes to both workers
                      "--conf", f"spark.cores.max={cluster.workers * cluster.worker_cores}",
                      "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
                      "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=300s",
                      "--py-files", str(pyfiles)]
        out = {"cluster": _run_on_cluster(tmp, "lake-cluster", namesrv, on_cluster),
               "local": _run_locally(request.config, tmp, "lake-local", namesrv)}
    finally:
        target.stop()
        ns_proc.send_signal(signal.SIGTERM)
        ns_proc.wait(10)
    return {"tmp": tmp, "out": out, "python": python, "starts": starts}


def _tables(lake: Path) -> dict[str, list[dict]]:
    """Every Delta table of ``lake``: rows without the by-nature varying columns, sorted."""
    out = {}
    for path in sorted(p for p in lake.iterdir() if (p / "_delta_log").is_dir()):
        table = DeltaTable(str(path)).to_pyarrow_table()
        table = table.drop_columns([c for c in table.column_names if VARYING.fullmatch(c)])
        out[path.name] = sorted(table.to_pylist(), key=repr)
    return out


# ---- without JVMs -------------------------------------------------------------------------------------
def test_spec_rejects_bad_settings(tmp_path):
    with pytest.raises(cl.ClusterError, match="worker memory '1 GB' is not a size"):
        cl.ClusterSpec(str(tmp_path), worker_memory="1 GB")
    with pytest.raises(cl.ClusterError, match="at least 1 worker"):
        cl.ClusterSpec(str(tmp_path), workers=0)
    with pytest.raises(cl.ClusterError, match="both 7077"):
        cl.ClusterSpec(str(tmp_path), master_port=7077, master_ui_port=7077)
    with pytest.raises(cl.ClusterError, match="contains whitespace"):
        cl.ClusterSpec(str(tmp_path / "a b"))


def test_up_refuses_a_taken_port_and_starts_nothing(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind((cl.HOST, 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = cl.ClusterSpec(str(tmp_path / "state"), master_port=port, master_ui_port=free_port())
        with pytest.raises(cl.ClusterError, match=f"master port {cl.HOST}:{port} is already in use"):
            cl.start_cluster(spec, env=_env())
    assert cl.running_roles(spec) == {} and not list((tmp_path / "state").glob("*.pid"))


def test_status_and_down_without_a_cluster(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipelines.cluster", "status", "--dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (1, f"no cluster running from {tmp_path}")
    assert cl.stop_cluster(tmp_path) == []


def test_pyfiles_zip_holds_the_packages_and_is_reproducible(tmp_path):
    first, count = cl.pack_pyfiles(tmp_path / "a.zip")
    second, _ = cl.pack_pyfiles(tmp_path / "b.zip")
    assert first.read_bytes() == second.read_bytes()
    names = zipfile.ZipFile(first).namelist()
    assert len(names) == count and names == sorted(names)
    assert {n.split("/")[0] for n in names} == set(cl.project_packages()) == {"broker", "pipelines", "schemas"}
    assert "pipelines/cluster.py" in names and "schemas/__init__.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    sources = {p.relative_to(REPO).as_posix() for pkg in ("broker", "pipelines", "schemas")
               for p in (REPO / pkg).rglob("*.py") if "__pycache__" not in p.parts}
    assert sources <= set(names)


# ---- on the cluster -----------------------------------------------------------------------------------
def test_up_is_idempotent_and_reports_both_workers(cluster):
    before = cl.running_roles(cluster)
    assert sorted(before) == ["master", "worker-1", "worker-2"]
    state = cl.start_cluster(cluster, env=_env())
    assert cl.running_roles(cluster) == before
    assert state["url"] == cluster.master_url and state["status"] == "ALIVE"
    assert [(w["host"], w["cores"], w["memory"]) for w in cl.alive_workers(state)] == [(cl.HOST, 1, 1024)] * 2
    status = subprocess.run([sys.executable, "-m", "pipelines.cluster", "status", "--dir", cluster.state_dir],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and status.stdout.startswith(f"master {cluster.master_url} (ALIVE)")
    assert len([line for line in status.stdout.splitlines() if line.startswith("worker ") and " ALIVE " in line]) == 2


def test_executor_python_cannot_import_the_project_by_itself(runs):
    proc = subprocess.run([str(runs["python"]), "-c", "import pipelines"], cwd=runs["tmp"], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "No module named 'pipelines'" in proc.stderr


def test_jobs_on_the_cluster_equal_local_runs(runs):
    cluster_tables, local_tables = _tables(runs["tmp"] / "lake-cluster"), _tables(runs["tmp"] / "lake-local")
    assert sorted(cluster_tables) == sorted(local_tables)
    assert {"messages", "consume_queue", "index_entries", "ingest_runs", "consumer_lag", "consumer_lag_status",
            "dlq_messages", "dlq_summary", "audit_findings", "topic_daily_stats", "replay_runs"} <= set(cluster_tables)
    assert len(cluster_tables["messages"]) == 2001
    [run] = cluster_tables["replay_runs"]
    assert (run["status"], run["dry_run"], run["sent"]) == ("DRY_RUN", True, 0) and run["planned"] > 0
    for name in sorted(cluster_tables):
        assert cluster_tables[name] == local_tables[name], f"table {name} differs between cluster and local[2]"
    for where in ("cluster", "local"):
        assert "replay cluster-dry: DRY_RUN recorded, nothing sent" in runs["out"][where]["replay"]


def test_the_work_ran_on_both_workers(cluster, runs):
    state = cl.master_state(cluster)
    ingest_apps = [a["id"] for a in state["completedapps"] if a["name"] == INGEST_APP]
    assert len(ingest_apps) == 1 and len(state["completedapps"]) == 5   # one app per cluster job
    starts = runs["starts"].read_text().splitlines()
    for worker in cluster.worker_names():
        work = cluster.work_dir(worker)
        logs = list((work / ingest_apps[0]).glob("*/stderr"))
        assert len(logs) == 1, f"{worker}: executors of the ingest {logs}"
        text = logs[0].read_text(errors="replace")
        assert re.search(r"Executor: Running task", text), f"no task ran on {worker}"
        # the executor JVM got the class archive (pipelines.spark_cds) and mapped it without a word
        command = next(line for line in text.splitlines() if line.startswith("Spark Executor Command:"))
        assert f"-XX:SharedArchiveFile={spark_cds.archive_path()}" in command
        assert "[cds" not in text
        # the project-less Python started inside this worker's executor directories
        assert any(Path(s).is_relative_to(work) for s in starts), f"no Python worker started under {work}"


def test_down_stops_every_daemon_and_is_idempotent(cluster, runs):
    pids = cl.running_roles(cluster)
    assert cl.stop_cluster(cluster.state_dir) == ["worker-1", "worker-2", "master"]
    assert cl.running_roles(cluster) == {}
    assert not [pid for pid in pids.values() if Path(f"/proc/{pid}").exists()]
    assert cl.stop_cluster(cluster.state_dir) == []
