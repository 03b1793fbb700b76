"""Ingest of stores on S3 into a lake on S3 (a real ``moto_server`` over HTTP): the tables equal a
local ingest of the same stores, a killed run on S3 reruns with no duplicate and no gap, and a
location that holds no store is a one-line error (exit 2).

The two stores (the damaged golden copy, a generated store) and the comparison: tests/remote_lakes.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from broker import cli
from pipelines.ingest import ingest
from pipelines.job_args import StoreSpec
from pipelines.lake import app_version, open_table
from pipelines.storage import Location
from tests.job_runner import group_alive, pump_lines
from tests.remote_lakes import RUN_COUNTS, SORT_KEYS, SPLIT_BYTES, comparable, ingest_remote, table
from schemas.messages import MESSAGES_TABLE
from schemas.tables import CONSUME_QUEUE_TABLE, CORRUPT_RECORDS_TABLE, INDEX_ENTRIES_TABLE, INGEST_RUNS_TABLE

REPO = Path(__file__).resolve().parents[1]
PARTITION_LINE = re.compile(rb"\bmessages: partition (\d+)/(\d+) .*: (\d+) rows")
JOB_DEADLINE_S = 600  # a guard against a hung job, never a pass condition


@pytest.fixture(scope="module")
def bucket(s3_server) -> str:
    return s3_server.new_bucket("ingest")


@pytest.fixture(scope="module")
def s3_stores(s3_server, two_stores, bucket) -> dict[str, str]:
    return {name: s3_server.upload_dir(path, bucket, f"stores/{name}") for name, path in two_stores.items()}


@pytest.fixture(scope="module")
def s3_lake(spark, s3_server, s3_stores, bucket) -> Location:
    return ingest_remote(spark, s3_stores, f"s3://{bucket}/lake", s3_server.options)


def _roots(stores: dict[str, Path], s3_stores: dict[str, str]) -> list[str]:
    return [str(p) for p in stores.values()] + list(s3_stores.values())


@pytest.mark.parametrize("name", [MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE, CORRUPT_RECORDS_TABLE])
def test_s3_tables_equal_the_local_ones(name, two_stores_lake, s3_lake, two_stores, s3_stores):
    roots = _roots(two_stores, s3_stores)
    local, remote = comparable(two_stores_lake, name, roots), comparable(s3_lake, name, roots)
    assert local.num_rows > 0
    assert remote.schema == local.schema
    assert remote.num_rows == local.num_rows
    assert remote.equals(local)


def test_s3_tables_hold_both_stores(two_stores_lake, s3_lake, two_stores, s3_stores, golden_records):
    """What the comparison compared: every store's records, both kinds of damage, files by root."""
    messages = table(s3_lake, MESSAGES_TABLE)
    per_broker = Counter(messages["broker_name"].to_pylist())
    assert per_broker == {"golden-x": len(golden_records) - 1, "generated": 3000}
    segments = set(pc.unique(messages.filter(pc.field("broker_name") == "generated")["segment_file"]).to_pylist())
    assert len(segments) >= 3  # several segments of the generated store
    corrupt = table(s3_lake, CORRUPT_RECORDS_TABLE).to_pylist()
    assert sorted((r["broker_name"], r["reason"].split(":")[0]) for r in corrupt) == [
        ("golden-x", "bad_magic"), ("golden-x", "crc_mismatch")]
    seg = f"{s3_stores['golden-x']}/commitlog/00000000000000000000"
    assert {r["file"] for r in corrupt} == {seg}  # both kinds name the file by the store's URI
    local_files = {r["file"] for r in table(two_stores_lake, CORRUPT_RECORDS_TABLE).to_pylist()}
    assert local_files == {str(two_stores["golden-x"] / "commitlog" / "00000000000000000000")}


def test_s3_ingest_runs_count_the_same(two_stores_lake, s3_lake):
    def runs(lake) -> list[tuple]:
        return sorted(tuple(r[c] for c in RUN_COUNTS) for r in table(lake, INGEST_RUNS_TABLE).to_pylist())

    assert runs(s3_lake) == runs(two_stores_lake)
    assert len(runs(s3_lake)) == 2 and all(r[-1] == "SUCCEEDED" for r in runs(s3_lake))


def test_s3_rerun_adds_nothing(spark, s3_server, s3_stores, s3_lake):
    versions = {name: open_table(s3_lake, name).version() for name in SORT_KEYS}
    specs = [StoreSpec.parse(f"{name}={uri}", s3_server.options) for name, uri in s3_stores.items()]
    summaries = ingest(spark, specs, s3_lake, split_bytes=SPLIT_BYTES)
    assert [(s.rows, s.status) for s in summaries] == [({}, "NOTHING_NEW")] * 2
    assert {name: open_table(s3_lake, name).version() for name in SORT_KEYS} == versions


# ---- a killed run on S3 ---------------------------------------------------------------------------------

def _job(store_uri: str, lake_uri: str) -> list[str]:
    return [sys.executable, str(REPO / "jobs" / "ingest_commitlog.py"), "--store", f"golden-x={store_uri}",
            "--lake", lake_uri, "--master", "local[1]", "--split-bytes", str(SPLIT_BYTES)]


def _job_env(s3_server) -> dict[str, str]:
    """The storage options reach the job through the environment, as they would on a cluster node."""
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, **s3_server.env)


def _kill_after_first_partition(cmd: list[str], env: dict[str, str]) -> tuple[int, int, int, list[bytes]]:
    """Run the job; SIGKILL its process group once it has logged a written messages partition (and
    not all of them). Returns (exit status, partitions logged, partitions in all, log lines)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    lines, reader = pump_lines(proc.stderr)
    seen: list[bytes] = []
    written, total = 0, 0
    deadline = time.monotonic() + JOB_DEADLINE_S
    try:
        while written == 0:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                pytest.fail("the job ended before it logged a written partition:\n"
                            + b"\n".join(seen[-40:]).decode("utf-8", "replace"))
            seen.append(line)
            found = PARTITION_LINE.search(line)
            if found:
                written, total = written + 1, int(found.group(2))
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        returncode = proc.wait()
        while group_alive(proc.pid):  # nothing of the killed run may still write when the rerun starts
            assert time.monotonic() < deadline, "the killed job's processes did not go"
            time.sleep(0.05)
        reader.join(max(0.0, deadline - time.monotonic()))
        proc.stderr.close()
    return returncode, written, total, seen


def test_killed_s3_ingest_reruns_exactly_once(s3_server, s3_stores, two_stores_lake):
    bucket = s3_server.new_bucket("killed")
    lake_uri = f"s3://{bucket}/lake"
    cmd, env = _job(s3_stores["golden-x"], lake_uri), _job_env(s3_server)
    returncode, written, total, _ = _kill_after_first_partition(cmd, env)
    assert returncode == -signal.SIGKILL  # the job was running when it was killed
    assert 1 <= written < total  # ... in the middle of writing messages
    lake = Location.parse(lake_uri, s3_server.options)
    tables = (MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE, CORRUPT_RECORDS_TABLE, INGEST_RUNS_TABLE)
    app_id = "rocketlake.ingest.golden-x"
    assert {name: app_version(lake, name, app_id) for name in tables} == dict.fromkeys(tables)  # nothing committed

    done = subprocess.run(cmd, env=env, capture_output=True, timeout=JOB_DEADLINE_S)
    assert done.returncode == 0, done.stderr[-3000:].decode("utf-8", "replace")

    def broker_rows(lake_, name: str) -> pa.Table:
        return table(lake_, name).filter(pc.field("broker_name") == "golden-x")

    got, want = broker_rows(lake, MESSAGES_TABLE), broker_rows(two_stores_lake, MESSAGES_TABLE)
    offsets = got["commitlog_offset"].to_pylist()
    assert len(offsets) == len(set(offsets)) == want.num_rows  # no duplicate
    assert sorted(offsets) == sorted(want["commitlog_offset"].to_pylist())  # no gap
    for name in (CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE, CORRUPT_RECORDS_TABLE):
        assert broker_rows(lake, name).num_rows == broker_rows(two_stores_lake, name).num_rows, name
    runs = table(lake, INGEST_RUNS_TABLE).to_pylist()
    assert [(r["from_offset"], r["messages_rows"]) for r in runs] == [(0, want.num_rows)]
    marks = {name: app_version(lake, name, app_id) for name in tables}
    assert marks == {name: app_version(two_stores_lake, name, app_id) for name in tables} == dict.fromkeys(tables, runs[0]["to_offset"])


# ---- locations that hold no store ----------------------------------------------------------------------

def _options(s3_server) -> list[str]:
    return [arg for key, value in s3_server.options.items() for arg in ("--storage-option", f"{key}={value}")]


def test_uri_without_a_commitlog_is_an_error(s3_server, s3_stores, bucket, capsys, tmp_path):
    empty = f"s3://{bucket}/stores/nothing-here"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ingest", "--store", f"b={empty}", "--lake", str(tmp_path / "lake"), *_options(s3_server)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"ingest_commitlog.py: error: {empty} lists no commitlog segment (commitlog/ holds no "
                       "20-digit file): not a broker store, or not reachable with these storage options")
    assert not (tmp_path / "lake").exists()


def test_unreachable_endpoint_is_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ingest", "--store", "s3://some-bucket/store", "--lake", str(tmp_path / "lake"),
                  "--storage-option", "AWS_ENDPOINT_URL=http://127.0.0.1:9", "--storage-option", "AWS_REGION=us-east-1",
                  "--storage-option", "AWS_ACCESS_KEY_ID=x", "--storage-option", "AWS_SECRET_ACCESS_KEY=y"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ingest_commitlog.py: error: s3://some-bucket/store/commitlog: cannot list (")
    assert "Traceback" not in "\n".join(err)


def test_lake_in_a_missing_bucket_is_an_error(s3_server, golden_store, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ingest", "--store", str(golden_store), "--lake", "s3://no-such-bucket-here/lake", *_options(s3_server)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "ingest_commitlog.py: error: --lake s3://no-such-bucket-here/lake: bucket 'no-such-bucket-here' does not "
        "exist (or is not visible with these storage options)")


@pytest.mark.parametrize("bad", ["NOEQUALS", "=value"])
def test_malformed_storage_option_is_an_error(bad, golden_store, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ingest", "--store", str(golden_store), "--lake", str(tmp_path / "lake"), "--storage-option", bad])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"ingest_commitlog.py: error: --storage-option {bad!r} is not KEY=VALUE"
