"""The Spark driver's class-data-sharing archive (:mod:`pipelines.spark_cds`, built by ``make venv``):
built for this JDK and pyspark, offered to launchers only while it matches, and really mapped by a
driver JVM started the way every job is started."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import job_args, spark_cds

REPO = Path(__file__).resolve().parents[1]


def test_make_venv_built_the_archive_for_this_jdk_and_pyspark():
    archive = spark_cds.archive_path()
    assert archive == Path(sys.prefix) / "share" / "rocketlake" / "spark-driver.jsa"
    assert archive.stat().st_size > 10_000_000
    assert json.loads(archive.with_suffix(".json").read_text()) == spark_cds.identity()
    option = f"-XX:SharedArchiveFile={archive}"
    assert spark_cds.launch_conf() == {"spark.driver.defaultJavaOptions": option,
                                       "spark.executor.defaultJavaOptions": option}


def test_a_driver_started_by_spark_submit_loads_spark_classes_from_the_archive():
    """``-Xshare:on`` makes a JVM that cannot map the archive (wrong JDK, other classpath) fail
    instead of starting without it; the class-load log then says where each class came from."""
    cmd = [str(Path(sys.executable).parent / "spark-submit"), *job_args.launch_conf_args(),
           "--conf", "spark.driver.extraJavaOptions=-Xshare:on -Xlog:class+load=info", "--version"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stderr[-2000:]
    # Spark's own classes; lambda proxies are made at run time and never archived
    loads = [line for line in (out.stdout + out.stderr).splitlines()
             if "] org.apache.spark." in line and " source: " in line and "$$Lambda" not in line]
    assert len(loads) > 100
    assert [line for line in loads if not line.endswith("source: shared objects file (top)")] == []


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_SUBMIT_OPTS", "JDK_JAVA_OPTIONS")}
    return dict(env, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)


def _fake_archive(prefix: Path, built_for: object) -> Path:
    archive = spark_cds.archive_path(prefix)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"not read by launch_conf")
    archive.with_suffix(".json").write_text(json.dumps(built_for))
    return archive


def test_launch_conf_offers_only_an_archive_built_for_this_jdk(tmp_path, caplog):
    assert spark_cds.launch_conf(tmp_path / "none") == {}  # no archive: jobs start as before
    archive = _fake_archive(tmp_path / "venv", spark_cds.identity())
    option = f"-XX:SharedArchiveFile={archive}"
    assert spark_cds.launch_conf(tmp_path / "venv") == {"spark.driver.defaultJavaOptions": option,
                                                        "spark.executor.defaultJavaOptions": option}
    other = dict(spark_cds.identity(), jvm_mtime_ns=1)
    _fake_archive(tmp_path / "old", other)
    with caplog.at_level(logging.WARNING, logger="pipelines.spark_cds"):
        assert spark_cds.launch_conf(tmp_path / "old") == {}
        assert spark_cds.launch_conf(tmp_path / "old") == {}
    assert [r.getMessage() for r in caplog.records].count(
        f"{spark_cds.archive_path(tmp_path / 'old')} was built for another JDK or pyspark; Spark starts without it "
        "(run 'make venv' or 'python -m pipelines.spark_cds build')") == 1  # said once
    _fake_archive(tmp_path / "with space", spark_cds.identity())
    assert spark_cds.launch_conf(tmp_path / "with space") == {}  # Spark would split the option


def test_remove_deletes_archive_and_sidecar(tmp_path):
    archive = _fake_archive(tmp_path, spark_cds.identity())
    assert spark_cds.remove(tmp_path) is True
    assert not archive.exists() and not archive.with_suffix(".json").exists()
    assert spark_cds.remove(tmp_path) is False


def test_build_without_a_jdk_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(spark_cds, "identity", lambda: None)
    with pytest.raises(RuntimeError, match="no JDK found"):
        spark_cds.build(tmp_path)
    assert spark_cds.main(["build", "--prefix", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == "error: no JDK found (set JAVA_HOME or put java on PATH)\n"
    assert not spark_cds.archive_path(tmp_path).exists()


def test_cli_conf_prints_the_launch_properties():
    out = subprocess.run([sys.executable, "-m", "pipelines.spark_cds", "conf"], cwd=REPO, capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout) == spark_cds.launch_conf()


def test_job_args_cli_quotes_properties_for_a_shell(monkeypatch, capsys):
    """A JVM option list holds spaces: the shell form is quoted, and ``eval`` (the Makefile's
    SUBMIT) gets each ``--conf`` value back whole."""
    monkeypatch.setattr(job_args, "launch_conf", lambda *_: {"spark.driver.extraJavaOptions": "-Xa -Xb"})
    assert job_args.main([]) == 0
    printed = capsys.readouterr().out
    assert printed == "--conf 'spark.driver.extraJavaOptions=-Xa -Xb'\n"
    evaluated = subprocess.run(["sh", "-c", f'eval "printf \'%s\\n\' {printed.strip()}"'], capture_output=True,
                               text=True, check=True).stdout
    assert evaluated.splitlines() == ["--conf", "spark.driver.extraJavaOptions=-Xa -Xb"]
    assert job_args.main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"spark.driver.extraJavaOptions": "-Xa -Xb"}
