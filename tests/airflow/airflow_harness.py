"""Running the DAGs for real: an Airflow home per test session (sqlite), ``airflow dags test``, and
looks into the lake through the project's Python (delta-rs lives in .venv, not in .venv-airflow)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from broker.server.launcher import free_port  # stdlib only: loads in .venv-airflow too

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "airflow_dags"
AIRFLOW = Path(sys.executable).parent / "airflow"
PROJECT_PYTHON = Path(os.environ.get("ROCKETLAKE_PYTHON", REPO / ".venv" / "bin" / "python"))


def airflow_env(home: Path, **variables: str) -> dict[str, str]:
    """This process's environment without any AIRFLOW_* setting of the caller, plus a sqlite home,
    the DAG folder, the Spark connection (local[2]) and ``AIRFLOW_VAR_<NAME>`` Variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",  # a paused DAG is not queued by Asset events
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "SPARK_LOCAL_IP": "127.0.0.1",
    })
    env.update({f"AIRFLOW_VAR_{name.upper()}": value for name, value in variables.items()})
    return env


def airflow(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(AIRFLOW), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def dags_test(env: dict[str, str], dag_id: str, conf: dict | None = None, log_dir: Path | None = None,
              skip: str | None = None) -> subprocess.CompletedProcess:
    """``airflow dags test DAG_ID [-c CONF]``; its output is kept in ``log_dir`` for a failing test.
    ``skip``: a regex of task ids marked successful without running them."""
    args = ["dags", "test", dag_id] + (["-c", json.dumps(conf)] if conf else [])
    args += ["--mark-success-pattern", skip] if skip else []
    started = time.monotonic()
    proc = airflow(env, *args)
    if log_dir is not None:
        n = len(list(log_dir.glob(f"{dag_id}-*.log")))
        (log_dir / f"{dag_id}-{n + 1}.log").write_text(proc.stdout + proc.stderr)
    print(f"airflow dags test {dag_id}: exit {proc.returncode} in {time.monotonic() - started:.1f} s")
    return proc


def db(env: dict[str, str]) -> sqlite3.Connection:
    return sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db")


def last_run(env: dict[str, str], dag_id: str) -> tuple[str, str]:
    with db(env) as con:
        return con.execute("SELECT run_id, state FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1",
                           (dag_id,)).fetchone()


def task_states(env: dict[str, str], dag_id: str, run_id: str) -> dict[str, str]:
    with db(env) as con:
        return dict(con.execute("SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?",
                                (dag_id, run_id)).fetchall())


def asset_events(env: dict[str, str], dag_id: str, run_id: str | None = None) -> dict[str, dict]:
    """Asset name -> extra of the events the DAG (run) emitted."""
    query = ("SELECT a.name, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE e.source_dag_id = ?"
             + (" AND e.source_run_id = ?" if run_id else "") + " ORDER BY e.id")
    with db(env) as con:
        rows = con.execute(query, (dag_id, run_id) if run_id else (dag_id,)).fetchall()
    return {name: json.loads(extra or "{}") for name, extra in rows}


def queued_by_assets(env: dict[str, str]) -> set[str]:
    """DAGs a received Asset event queued for a run (asset_dag_run_queue)."""
    with db(env) as con:
        return {row[0] for row in con.execute("SELECT target_dag_id FROM asset_dag_run_queue")}


def xcom(env: dict[str, str], dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
    with db(env) as con:
        row = con.execute("SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND key = ?",
                          (dag_id, run_id, task_id, key)).fetchone()
    if row is None:
        return None
    return json.loads(row[0]) if isinstance(row[0], (str, bytes)) else row[0]


_LAKE_SCRIPT = r"""
import hashlib, json, os, sys
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from pipelines.maintenance import list_tables
lake = sys.argv[1]
out = {}
for name in list_tables(lake):
    dt = DeltaTable(os.path.join(lake, name))
    rows = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all()).to_pylist()
    digest = hashlib.sha256("\n".join(sorted(repr(sorted(r.items())) for r in rows)).encode()).hexdigest()
    out[name] = {"version": dt.version(), "files": len(dt.file_uris()), "rows": len(rows), "digest": digest}
    if name == "replay_runs":
        out[name]["runs"] = {r["run_id"]: {k: (str(v) if v is not None and not isinstance(v, (int, float, bool, str)) else v)
                                           for k, v in r.items()} for r in rows}
sys.stdout.write(json.dumps(out))
sys.stdout.flush()
os._exit(0)  # no pyarrow/delta-rs thread teardown at exit
"""


def lake_state(lake: Path) -> dict[str, dict]:
    """Per table of the lake: Delta version, active files, rows and a digest of the rows (read with
    delta-rs in the project's Python)."""
    proc = subprocess.run([str(PROJECT_PYTHON), "-c", _LAKE_SCRIPT, str(lake)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ---- a name server and a broker of the project, for the replay's target ------------------------------
def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def start(tmp: Path, name: str, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(tmp / f"{name}-{port}.log", "w")
    cmd = [str(PROJECT_PYTHON), "-m", "broker.cli", *args]
    cmd = [a.replace("{port}", str(port)) for a in cmd]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_port(port, proc)
    return proc, f"127.0.0.1:{port}"


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the supervisor (it stops its processes), SIGKILL to the whole group if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its process group
    except ProcessLookupError:
        pass
    proc.wait()
