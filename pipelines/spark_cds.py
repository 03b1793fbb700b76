"""A class-data-sharing archive of Spark's JVMs: every job's driver and executors start with half the work.

Why: a Spark JVM spends its first seconds loading, parsing and verifying the classes of Spark's jars
(C1 only, see ``jobs/spark-submit.conf``, so they run interpreted or lightly compiled). In a job
whose Python does the work, that is most of what the JVM does: measured on this project's jobs
(2 cores), a session plus one tiny job took 12.3-13.0 s and 14.2-14.8 CPU-seconds per
``spark-submit``; with the archive 6.3-6.8 s and 7.1-7.8 CPU-seconds. A 4 GiB ingest: 33.9-34.3 s
end to end without, 26.9-29.3 s with (the driver JVM's CPU 16 s -> 8 s).

How: ``make venv`` runs ``python -m pipelines.spark_cds build``: one ``spark-submit`` whose driver
runs a small but complete workload (a generated store ingested, then the audit, DLQ and lag jobs,
all in one JVM) with ``-XX:ArchiveClassesAtExit``, so the JVM writes every class it loaded into
:func:`archive_path` (a dynamic archive on top of the JDK's own; local mode runs the executor in the
driver, so its classes are in it too). Launchers then give the driver and the executors
``-XX:SharedArchiveFile`` through ``spark.{driver,executor}.defaultJavaOptions`` (:func:`launch_conf`,
merged into :func:`pipelines.job_args.launch_conf`), which Spark puts before the ``extraJavaOptions``.
On the standalone cluster of this machine the executors' JVMs (same JDK, same classpath) map it too:
its test's cluster fixture went from 118 to 88 s.

Limits, and why it is done this way:

* An archive belongs to one JDK build and one Spark classpath (this virtualenv's pyspark). A
  sidecar file records both; :func:`launch_conf` offers the archive only while they still match
  (otherwise it says so once in the log and jobs start without it), and the Makefile rebuilds it
  when either changes. A mismatch the sidecar cannot see makes the JVM print one warning and
  start without the archive (``-Xshare:auto``, the default): never a failed job.
* The JVM refuses an archive whose classpath holds a directory that is not empty, and Spark's conf
  directory is on the classpath: that is why the option is passed by the launchers and not from a
  ``spark-defaults.conf`` in that directory.
* On other machines (a real cluster's workers) the path is absent, or belongs to another JDK: the
  executor JVM then starts without the archive (silently, or with one warning line in its log).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

ARCHIVE_NAME = "spark-driver.jsa"
CONF_KEY = "spark.driver.defaultJavaOptions"  # Spark prepends these to spark.driver.extraJavaOptions
EXECUTOR_CONF_KEY = "spark.executor.defaultJavaOptions"
TRAINING_MESSAGES = 3000  # enough for every record kind of the generator (delays, retries, DLQ, …)


def archive_path(prefix: str | os.PathLike | None = None) -> Path:
    """Where the archive of the virtualenv ``prefix`` (default: this interpreter's) lives."""
    return Path(prefix if prefix is not None else sys.prefix) / "share" / "rocketlake" / ARCHIVE_NAME


def _sidecar(archive: Path) -> Path:
    return archive.with_suffix(".json")


def _java_home() -> Path | None:
    """The JDK ``spark-class`` runs: ``$JAVA_HOME``, else the ``java`` on PATH."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    return Path(os.path.realpath(java)).parents[1] if java else None


def identity() -> dict[str, object] | None:
    """What an archive is valid for: the JVM library (path, size, mtime) and the pyspark version
    (its jars). None when no JDK is found."""
    home = _java_home()
    if home is None:
        return None
    jvm = home / "lib" / "server" / "libjvm.so"
    if not jvm.exists():
        jvm = home / "bin" / "java"
    try:
        st = jvm.stat()
    except OSError:
        return None
    import pyspark

    return {"jvm": str(jvm), "jvm_size": st.st_size, "jvm_mtime_ns": st.st_mtime_ns, "pyspark": pyspark.__version__}


_warned: set[str] = set()


def launch_conf(prefix: str | os.PathLike | None = None) -> dict[str, str]:
    """``spark.{driver,executor}.defaultJavaOptions`` = ``-XX:SharedArchiveFile=…`` when the virtualenv
    has an archive built for this JDK and pyspark, else ``{}`` (jobs then start as they would without)."""
    archive = archive_path(prefix)
    if not archive.exists():
        return {}
    try:
        built_for = json.loads(_sidecar(archive).read_text())
    except (OSError, ValueError):
        built_for = None
    if built_for != identity():
        if str(archive) not in _warned:
            _warned.add(str(archive))
            log.warning("%s was built for another JDK or pyspark; Spark starts without it (run 'make venv' "
                        "or 'python -m pipelines.spark_cds build')", archive)
        return {}
    if any(c.isspace() for c in str(archive)):
        return {}  # Spark splits Java options at whitespace
    option = f"-XX:SharedArchiveFile={archive}"
    return {CONF_KEY: option, EXECUTOR_CONF_KEY: option}


# ---- building ---------------------------------------------------------------------------------------------
def _spark_submit() -> str:
    local = Path(sys.executable).parent / "spark-submit"
    return str(local) if local.exists() else (shutil.which("spark-submit") or "spark-submit")


def build(prefix: str | os.PathLike | None = None, *, timeout: float = 900.0) -> Path:
    """Run the training workload under ``spark-submit`` and install its archive (replacing any
    older one only once the new one is complete). Raises RuntimeError with the run's log tail."""
    from pipelines.job_args import conf_file_settings

    archive = archive_path(prefix)
    want = identity()
    if want is None:
        raise RuntimeError("no JDK found (set JAVA_HOME or put java on PATH)")
    archive.parent.mkdir(parents=True, exist_ok=True)
    conf = conf_file_settings()
    with tempfile.TemporaryDirectory(prefix="rocketlake-cds-") as tmp:
        work = Path(tmp)
        dump = work / ARCHIVE_NAME
        java_opts = " ".join(filter(None, [conf.pop("spark.driver.extraJavaOptions", ""),
                                           f"-XX:ArchiveClassesAtExit={dump}", "-Xlog:cds=error"]))
        cmd = [_spark_submit(), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.ui.showConsoleProgress=false", "--conf", f"{CONF_KEY}=", "--conf", f"{EXECUTOR_CONF_KEY}=",
               "--conf", f"spark.driver.extraJavaOptions={java_opts}",
               *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")],
               str(Path(__file__).resolve()), "train", str(work / "training")]
        env = dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
                   PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        log_file = work / "training.log"
        t0 = time.monotonic()
        with open(log_file, "wb") as out:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
        if proc.returncode != 0 or not dump.exists() or dump.stat().st_size == 0:
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-25:])
            raise RuntimeError(f"the training run exited {proc.returncode} without an archive; its log ends:\n{tail}")
        partial = archive.with_name(archive.name + ".partial")
        shutil.copyfile(dump, partial)
        os.replace(partial, archive)
        _sidecar(archive).write_text(json.dumps(want, indent=1) + "\n")
        log.info("wrote %s (%.0f MB) in %.0f s", archive, archive.stat().st_size / 1e6, time.monotonic() - t0)
    return archive


def remove(prefix: str | os.PathLike | None = None) -> bool:
    """Delete the archive and its sidecar; True when there was one."""
    archive = archive_path(prefix)
    found = archive.exists()
    for path in (archive, _sidecar(archive)):
        path.unlink(missing_ok=True)
    return found


def train(workdir: Path) -> None:
    """The workload whose classes are archived (run as the driver of the build's ``spark-submit``):
    the jobs operators run most, in one session, on a store generated here."""
    from broker.cli import run_job
    from broker.store.generate import GenerateSpec, generate_store
    from pipelines.session import build_session

    store, lake = workdir / "store", workdir / "lake"
    generate_store(store, GenerateSpec(messages=TRAINING_MESSAGES, body_bytes=256, segment_bytes=1 << 20,
                                       cq_file_bytes=20 * 1000, index_slots=1000, index_entries=4000))
    spark = build_session("rocketlake-cds-training")
    common = ["--store", f"broker-a={store}", "--lake", str(lake)]
    try:
        for job, args in (("ingest_commitlog.py", common), ("audit.py", [*common, "--no-ingest"]),
                          ("dlq_report.py", [*common, "--no-ingest"]), ("consumer_lag.py", common)):
            code = run_job(job, args)
            if code:
                raise SystemExit(f"training: {job} exited {code}")
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.spark_cds", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, text in (("build", "build (or rebuild) the virtualenv's archive"),
                       ("remove", "delete the virtualenv's archive"),
                       ("conf", "print the Spark properties that use the archive, as JSON")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--prefix", default=None, help="the virtualenv (default: this Python's)")
    p = sub.add_parser("train", help="the workload itself (run by build under spark-submit)")
    p.add_argument("workdir", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "train":
        train(args.workdir)
        return 0
    if args.command == "conf":
        print(json.dumps(launch_conf(args.prefix)))
        return 0
    if args.command == "remove":
        print("removed" if remove(args.prefix) else "no archive")
        return 0
    print(f"building Spark's class archive for {archive_path(args.prefix)} (one Spark run, about a minute) …",
          flush=True)
    try:
        build(args.prefix)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
