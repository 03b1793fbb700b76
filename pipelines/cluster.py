"""A Spark standalone cluster on this machine: one master and N workers, each its own JVM, from the
pyspark wheel (``spark-class …deploy.master.Master`` / ``…deploy.worker.Worker``; SPARK_HOME is the
pyspark package directory), bound to loopback only.

    python -m pipelines.cluster up [--dir build/cluster] [--master-port 7077] [--workers 2] ...
    python -m pipelines.cluster status [--dir build/cluster]
    python -m pipelines.cluster down [--dir build/cluster]
    python -m pipelines.cluster pyfiles [--out build/rocketlake-pyfiles.zip]

Why it exists: ``local[2]`` runs every task in the driver's JVM, so it can not show what breaks once
executors are other processes with another working directory and their own Python (relative paths,
code that is not shipped, state kept on the driver). ``make cluster-up`` gives the jobs a real
``spark://`` master to be submitted to; ``tests/test_cluster.py`` runs the jobs on one.

The state directory holds ``cluster.json`` (the settings the cluster was started with, so ``status``
and ``down`` need nothing else), one pid file and one log per daemon, and each worker's work
directory (executor logs under ``worker-N/work/<app-id>/<executor-id>/``). ``up`` waits until the
master reports every worker registered (its web UI's ``/json/``), with a deadline, and leaves
running daemons alone, so it is idempotent. ``down`` stops only the processes whose pid files are
in the directory and whose environment still carries that directory's marker (a reused pid is left alone).

``pyfiles`` packs the project's packages (``broker``, ``pipelines``, ``schemas``: the ones
``pyproject.toml`` installs) into one zip for ``spark-submit --py-files``, so executors whose Python
does not have the project installed can import it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DEFAULT_DIR = Path("build/cluster")
DEFAULT_PYFILES = Path("build/rocketlake-pyfiles.zip")
DEFAULT_MASTER_PORT = 7077
DEFAULT_MASTER_UI_PORT = 8090    # Spark's own default, 8080, is the Airflow UI's port here
DEFAULT_WORKERS = 2
DEFAULT_WORKER_CORES = 1
DEFAULT_WORKER_MEMORY = "1g"
DEFAULT_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
STATE_FILE = "cluster.json"
MARKER_PROPERTY = "rocketlake.cluster.dir"   # -D<this>=<state dir> on every daemon's command line
POLL_S = 0.2
EXEC_RETRIES = 10
_MEMORY = re.compile(r"[1-9][0-9]*[kKmMgGtT]?")
# settings of every daemon: fail instead of silently moving to the next port when one is taken, and
# no REST submission server (it would listen on another port, 6066, nobody here uses)
DAEMON_JAVA_OPTS = ("-Dspark.port.maxRetries=0", "-Dspark.master.rest.enabled=false")


class ClusterError(RuntimeError):
    """The cluster cannot be started, reached or stopped (the message says which part and where)."""


@dataclass(frozen=True)
class ClusterSpec:
    """What ``up`` starts; saved as ``cluster.json`` in ``state_dir`` while the cluster runs."""

    state_dir: str
    master_port: int = DEFAULT_MASTER_PORT
    master_ui_port: int = DEFAULT_MASTER_UI_PORT
    workers: int = DEFAULT_WORKERS
    worker_cores: int = DEFAULT_WORKER_CORES
    worker_memory: str = DEFAULT_WORKER_MEMORY
    python: str = sys.executable     # the executors' Python when the driver names none (PYSPARK_PYTHON)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_dir", os.path.abspath(self.state_dir))
        if any(c.isspace() for c in self.state_dir):
            raise ClusterError(f"state directory {self.state_dir!r} contains whitespace (Spark's daemon "
                               "options are split on it); choose another")
        for name in ("master_port", "master_ui_port"):
            port = getattr(self, name)
            if not 0 < port < 65536:
                raise ClusterError(f"{name.replace('_', ' ')} {port} is not a TCP port (1-65535)")
        if self.master_port == self.master_ui_port:
            raise ClusterError(f"master port and master web UI port are both {self.master_port}")
        if self.workers < 1 or self.worker_cores < 1:
            raise ClusterError("a cluster needs at least 1 worker with at least 1 core")
        if not _MEMORY.fullmatch(self.worker_memory):
            raise ClusterError(f"worker memory {self.worker_memory!r} is not a size such as 1g or 512m")

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.master_ui_port}"

    @property
    def dir(self) -> Path:
        return Path(self.state_dir)

    def worker_names(self) -> list[str]:
        return [f"worker-{i}" for i in range(1, self.workers + 1)]

    def work_dir(self, worker: str) -> Path:
        """Where ``worker`` runs its executors (``<app-id>/<executor-id>/stdout|stderr`` below)."""
        return self.dir / worker / "work"


# ---- where Spark is ---------------------------------------------------------------------------------
def spark_home() -> Path:
    """The pyspark package directory: the wheel carries Spark's jars and bin/ scripts."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_class() -> Path:
    """``spark-class`` beside this interpreter (``.venv/bin``), else the one in the pyspark package."""
    beside = Path(sys.executable).parent / "spark-class"
    return beside if beside.exists() else spark_home() / "bin" / "spark-class"


def daemon_env(spec: ClusterSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the master and the workers (the executors inherit the workers')."""
    env = dict(os.environ if base is None else base)
    env.update({
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": HOST,           # RPC, web UIs, executors and block managers on loopback
        "PYSPARK_PYTHON": spec.python,
        "SPARK_DAEMON_JAVA_OPTS": " ".join([*DAEMON_JAVA_OPTS, _marker(spec),
                                            env.get("SPARK_DAEMON_JAVA_OPTS", "")]).strip(),
    })
    return env


def _check_java(env: Mapping[str, str]) -> None:
    java_home = env.get("JAVA_HOME")
    if not (java_home and Path(java_home, "bin", "java").exists()) and shutil.which("java", path=env.get("PATH")) is None:
        raise ClusterError("java not found: Spark needs Java 17 on PATH or JAVA_HOME "
                           "(apt-get install openjdk-17-jdk-headless)")


# ---- processes --------------------------------------------------------------------------------------
def _pid_file(spec: ClusterSpec, role: str) -> Path:
    return spec.dir / f"{role}.pid"


def _log_file(spec: ClusterSpec, role: str) -> Path:
    return spec.dir / f"{role}.log"


def _proc_file(pid: int, name: str) -> list[str] | None:
    """``/proc/<pid>/<name>`` (cmdline, environ) as its NUL-separated strings; None when unreadable."""
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None


def _reap(pid: int) -> bool:
    """Reap ``pid`` if it is an exited child of this process (the test fixture's daemons are)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False


def _alive(pid: int) -> bool:
    """The process has a thread that is not a zombie (one of ours that exited is reaped here).

    Per thread, because a JVM's main thread ends (``/proc/<pid>/stat`` says Z) while its shutdown
    hooks still run in other threads: the process is alive until the last of them is gone."""
    if _reap(pid):
        return False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            if Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
                return True
        except OSError:
            continue
    _reap(pid)
    return False


def _daemon_pid(spec: ClusterSpec, role: str) -> int | None:
    """The pid of ``role`` when its pid file names a live daemon of *this* cluster, else None.

    *This* cluster's: the command line names the daemon's class (``spark-class`` keeps it when it
    execs java under the same pid) and the environment carries the state directory's marker (in
    ``SPARK_DAEMON_JAVA_OPTS``, from the launch on), so a pid reused by another process is not ours."""
    try:
        pid = int(_pid_file(spec, role).read_text().strip())
    except (OSError, ValueError):
        return None
    for _ in range(EXEC_RETRIES):   # unreadable or empty for a moment while spark-class execs java
        cmd, environ = _proc_file(pid, "cmdline"), _proc_file(pid, "environ")
        if (cmd not in (None, [""]) and environ not in (None, [""])) or not _alive(pid):
            break
        time.sleep(POLL_S)
    main_class = MASTER_CLASS if role == "master" else WORKER_CLASS
    if cmd is None or environ is None or main_class not in cmd:
        return None
    opts = next((e.partition("=")[2] for e in environ if e.startswith("SPARK_DAEMON_JAVA_OPTS=")), "")
    if _marker(spec) not in opts.split():
        return None
    return pid if _alive(pid) else None


def _marker(spec: ClusterSpec) -> str:
    return f"-D{MARKER_PROPERTY}={spec.state_dir}"


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) == 0


def _launch(spec: ClusterSpec, role: str, args: list[str], env: Mapping[str, str]) -> int:
    """Start one daemon in its own session (a terminal's hang-up or Ctrl-C does not reach it)."""
    main_class = MASTER_CLASS if role == "master" else WORKER_CLASS
    with open(_log_file(spec, role), "ab") as out:
        proc = subprocess.Popen([str(spark_class()), main_class, *args], env=dict(env), cwd=spec.dir,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    _pid_file(spec, role).write_text(f"{proc.pid}\n")
    log.info("started %s (pid %d), log %s", role, proc.pid, _log_file(spec, role))
    return proc.pid


def _start_master(spec: ClusterSpec, env: Mapping[str, str]) -> int:
    for port, what in ((spec.master_port, "master port"), (spec.master_ui_port, "master web UI port")):
        if _port_taken(port):
            raise ClusterError(f"{what} {HOST}:{port} is already in use by another process; choose another "
                               "(CLUSTER_MASTER_PORT / CLUSTER_MASTER_UI_PORT) or stop that process")
    return _launch(spec, "master", ["--host", HOST, "--port", str(spec.master_port),
                                    "--webui-port", str(spec.master_ui_port)], env)


def _start_worker(spec: ClusterSpec, name: str, env: Mapping[str, str]) -> int:
    spec.work_dir(name).mkdir(parents=True, exist_ok=True)
    # --port/--webui-port 0: free ports chosen by the worker (nobody needs to know them in advance)
    return _launch(spec, name, ["--host", HOST, "--port", "0", "--webui-port", "0",
                                "--cores", str(spec.worker_cores), "--memory", spec.worker_memory,
                                "--work-dir", str(spec.work_dir(name)), spec.master_url], env)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---- the master's view ------------------------------------------------------------------------------
def master_state(spec: ClusterSpec, timeout: float = 5.0) -> dict | None:
    """The master's ``/json/`` (url, status, workers, activeapps, completedapps), None when it does
    not answer."""
    try:
        with urllib.request.urlopen(f"{spec.ui_url}/json/", timeout=timeout) as resp:
            return json.load(resp)
    except (OSError, urllib.error.URLError, ValueError):
        return None


def alive_workers(state: dict | None) -> list[dict]:
    return [w for w in (state or {}).get("workers", []) if w.get("state") == "ALIVE"]


def wait_until_ready(spec: ClusterSpec, pids: Mapping[str, int], timeout: float = DEFAULT_TIMEOUT_S) -> dict:
    """Poll the master until it is ALIVE with ``spec.workers`` workers ALIVE; a daemon of ``pids``
    (``{role: pid}``) that exits meanwhile, or the deadline, raises with the log to read."""
    deadline = time.monotonic() + timeout
    while True:
        for role, pid in pids.items():
            if not _alive(pid):
                raise ClusterError(f"the {role} exited while the cluster was starting; see {_log_file(spec, role)}:\n"
                                   + _tail(_log_file(spec, role)))
        state = master_state(spec)
        if state and state.get("status") == "ALIVE" and len(alive_workers(state)) >= spec.workers:
            return state
        if time.monotonic() >= deadline:
            have = len(alive_workers(state)) if state else "no answer from the master"
            raise ClusterError(f"cluster not ready after {timeout:g} s (workers alive: {have}, want "
                               f"{spec.workers}); logs in {spec.dir}")
        time.sleep(POLL_S)


# ---- up / down / status -----------------------------------------------------------------------------
def load_spec(state_dir: str | os.PathLike) -> ClusterSpec | None:
    """The settings a cluster was started with in ``state_dir`` (None when none was)."""
    path = Path(state_dir) / STATE_FILE
    try:
        return ClusterSpec(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise ClusterError(f"{path} is not a cluster state file ({exc}); remove it after checking no "
                           "daemon of that cluster runs") from None


def running_roles(spec: ClusterSpec) -> dict[str, int]:
    """``{role: pid}`` of this cluster's live daemons."""
    out = {}
    for role in ["master", *spec.worker_names()]:
        pid = _daemon_pid(spec, role)
        if pid is not None:
            out[role] = pid
    return out


def start_cluster(spec: ClusterSpec, env: Mapping[str, str] | None = None,
                  timeout: float = DEFAULT_TIMEOUT_S) -> dict:
    """Start whatever of the master and workers is not running, wait until every worker is
    registered, and return the master's ``/json/`` state. ``env`` is the daemons' base environment
    (default: this process's)."""
    spec.dir.mkdir(parents=True, exist_ok=True)
    previous = load_spec(spec.dir)
    if previous is not None and running_roles(previous):
        if previous != spec:
            raise ClusterError(f"a cluster with other settings runs from {spec.dir} ({previous.master_url}, "
                               f"{previous.workers} workers); stop it first (make cluster-down)")
    full_env = daemon_env(spec, env)
    _check_java(full_env)
    (spec.dir / STATE_FILE).write_text(json.dumps(asdict(spec), indent=2) + "\n")
    pids = running_roles(spec)
    if len(pids) == spec.workers + 1:
        log.info("cluster already running: %s", spec.master_url)
    if "master" not in pids:
        pids["master"] = _start_master(spec, full_env)
    for name in spec.worker_names():
        if name not in pids:
            pids[name] = _start_worker(spec, name, full_env)
    return wait_until_ready(spec, pids, timeout)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stop_daemon(spec: ClusterSpec, role: str, pid: int, timeout: float) -> None:
    """SIGTERM (a worker then stops its executors), SIGKILL after ``timeout``; then whatever is left
    of the daemon's own process group (executors, Python workers it started)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    if not _wait_gone(pid, timeout):
        log.warning("%s (pid %d) did not stop within %g s: killing it", role, pid, timeout)
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, timeout)
    if _group_alive(pid):       # each daemon leads its own session: pgid == its pid
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _group_alive(pid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if _group_alive(pid):
            os.killpg(pid, signal.SIGKILL)
    log.info("stopped %s (pid %d)", role, pid)


def stop_cluster(state_dir: str | os.PathLike, timeout: float = STOP_TIMEOUT_S) -> list[str]:
    """Stop this directory's workers, then its master; the roles stopped (none when nothing ran)."""
    spec = load_spec(state_dir)
    if spec is None:
        return []
    stopped = []
    for role in [*spec.worker_names(), "master"]:
        pid = _daemon_pid(spec, role)
        if pid is not None:
            _stop_daemon(spec, role, pid, timeout)
            stopped.append(role)
        _pid_file(spec, role).unlink(missing_ok=True)
    return stopped


def describe(spec: ClusterSpec, state: dict | None, pids: Mapping[str, int]) -> list[str]:
    """Lines for ``status``: master URL and web UI, each registered worker, the applications."""
    lines = [f"master {spec.master_url} ({(state or {}).get('status', 'not answering')}), "
             f"web UI {spec.ui_url}, pid {pids.get('master', '-')}, state in {spec.dir}"]
    for w in (state or {}).get("workers", []):
        lines.append(f"worker {w['id']} {w['host']}:{w['port']} {w['state']} cores {w['coresused']}/{w['cores']} "
                     f"memory {w['memoryused']}/{w['memory']} MiB")
    missing = [r for r in spec.worker_names() if r not in pids]
    if missing:
        lines.append(f"not running: {', '.join(missing)}")
    if state is not None:
        lines.append(f"applications: {len(state.get('activeapps', []))} running, "
                     f"{len(state.get('completedapps', []))} completed")
    return lines


# ---- code for --py-files ----------------------------------------------------------------------------
def project_packages(repo: Path = REPO) -> list[str]:
    """The top-level packages ``pyproject.toml`` installs (``[tool.setuptools.packages.find] include``)."""
    with open(repo / "pyproject.toml", "rb") as fh:
        include = tomllib.load(fh)["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({pattern.rstrip("*").rstrip(".") for pattern in include})


def pack_pyfiles(out: str | os.PathLike = DEFAULT_PYFILES, repo: Path = REPO) -> tuple[Path, int]:
    """Zip the project's packages (sources and package data, no ``__pycache__``) for ``--py-files``;
    entries in name order with a fixed timestamp, so the same sources give the same bytes. Returns
    (zip path, number of files)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    files = sorted(p for pkg in project_packages(repo) for p in (repo / pkg).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in files:
            info = zipfile.ZipInfo(path.relative_to(repo).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    os.replace(tmp, out)
    return out, len(files)


# ---- command line -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pipelines.cluster", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True, metavar="{up,down,status,pyfiles}")
    dir_help = f"state directory: pid files, logs, worker work dirs (default {DEFAULT_DIR})"
    up = sub.add_parser("up", help="start the master and the workers (running ones are kept) and wait for them")
    up.add_argument("--dir", default=str(DEFAULT_DIR), help=dir_help)
    up.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT,
                    help=f"master RPC port (default {DEFAULT_MASTER_PORT})")
    up.add_argument("--master-ui-port", type=int, default=DEFAULT_MASTER_UI_PORT,
                    help=f"master web UI port, also its /json/ status (default {DEFAULT_MASTER_UI_PORT})")
    up.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help=f"workers (default {DEFAULT_WORKERS})")
    up.add_argument("--worker-cores", type=int, default=DEFAULT_WORKER_CORES,
                    help=f"cores each worker offers (default {DEFAULT_WORKER_CORES})")
    up.add_argument("--worker-memory", default=DEFAULT_WORKER_MEMORY,
                    help=f"memory each worker offers, e.g. 2g (default {DEFAULT_WORKER_MEMORY}; an executor "
                         "takes spark.executor.memory, 1g by default)")
    up.add_argument("--python", default=sys.executable,
                    help="PYSPARK_PYTHON of the daemons (default: this interpreter)")
    up.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"seconds to wait for every worker to register (default {DEFAULT_TIMEOUT_S:g})")
    for name, text in (("down", "stop this directory's workers and master"),
                       ("status", "print the master URL and the workers (exit 1 when the master is not running)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--dir", default=str(DEFAULT_DIR), help=dir_help)
    pf = sub.add_parser("pyfiles", help="zip broker/, pipelines/, schemas/ for spark-submit --py-files")
    pf.add_argument("--out", default=str(DEFAULT_PYFILES), help=f"zip to write (default {DEFAULT_PYFILES})")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "up":
            spec = ClusterSpec(args.dir, args.master_port, args.master_ui_port, args.workers, args.worker_cores,
                               args.worker_memory, args.python)
            state = start_cluster(spec, timeout=args.timeout)
            print("\n".join(describe(spec, state, running_roles(spec))))
        elif args.command == "down":
            stopped = stop_cluster(args.dir)
            print(f"stopped {', '.join(stopped)}" if stopped else f"no cluster running from {args.dir}")
        elif args.command == "status":
            spec = load_spec(args.dir)
            pids = running_roles(spec) if spec else {}
            if spec is None or "master" not in pids:
                print(f"no cluster running from {args.dir}")
                return 1
            print("\n".join(describe(spec, master_state(spec), pids)))
        else:
            path, count = pack_pyfiles(args.out)
            print(f"{path}: {count} files of {', '.join(project_packages())}")
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
