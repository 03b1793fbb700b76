"""Ingest job: golden store into Delta, exactly once and incremental."""

from __future__ import annotations

import json
import shutil

import pytest
from deltalake import DeltaTable

from pipelines.ingest import app_id_for, ingest
from pipelines.job_args import StoreSpec
from pipelines.lake import app_version, table_version
from tests.golden_fields import expected_row


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return tmp_path_factory.mktemp("lake")


def _rows(lake, name):
    return DeltaTable(str(lake / name)).to_pyarrow_table()


def test_golden_store_into_delta(spark, golden_store, golden_records, golden_expected, lake):
    [summary] = ingest(spark, [StoreSpec("broker-a", str(golden_store))], str(lake), split_bytes=1 << 20)
    assert summary.rows["messages"] == 2001 and summary.to_offset == 4862971
    messages = _rows(lake, "messages").sort_by("commitlog_offset").to_pylist()
    assert len(messages) == 2001
    for row, e in zip(messages, golden_records):
        want = expected_row(e)
        got = {k: row[k] for k in want}
        got["properties"] = dict(got["properties"])
        assert got == want
        assert row["broker_name"] == "broker-a" and row["ingest_run_id"] == summary.run_id
    queues = json.loads((golden_expected / "expected_queues.json").read_text())["queues"]
    want_units = sorted((t, int(q), u[0], u[1], u[2], u[3]) for t, qs in queues.items() for q, d in qs.items()
                        for u in d["entries"])
    cq = _rows(lake, "consume_queue").to_pylist()
    assert sorted((r["topic"], r["queue_id"], r["queue_offset"], r["commitlog_offset"], r["size"], r["tags_code"])
                  for r in cq) == want_units
    files = json.loads((golden_expected / "expected_index_files.json").read_text())["files"]
    assert _rows(lake, "index_entries").num_rows == sum(f["indexCount"] - 1 for f in files)
    assert _rows(lake, "corrupt_records").num_rows == 0 if (lake / "corrupt_records").exists() else True
    runs = _rows(lake, "ingest_runs").to_pylist()
    assert [(r["broker_name"], r["from_offset"], r["to_offset"], r["messages_rows"]) for r in runs] == [
        ("broker-a", 0, 4862971, 2001)]


def test_rerun_adds_nothing(spark, golden_store, lake):
    versions = {t: table_version(str(lake), t) for t in ("messages", "consume_queue", "index_entries", "ingest_runs")}
    [summary] = ingest(spark, [StoreSpec("broker-a", str(golden_store))], str(lake))
    assert summary.rows == {} and summary.status == "NOTHING_NEW"
    assert {t: table_version(str(lake), t) for t in versions} == versions
    assert app_version(str(lake), "messages", app_id_for("broker-a")) == 4862971


def test_incremental_runs_have_no_gaps_or_duplicates(spark, golden_store, golden_records, tmp_path):
    lake = tmp_path / "lake"
    spec = StoreSpec("b1", str(golden_store))
    first = ingest(spark, [spec], str(lake), until_offset=2_000_000)[0]
    second = ingest(spark, [spec], str(lake))[0]
    assert (first.to_offset, second.from_offset) == (2_000_000, 2_000_000)
    offsets = sorted(_rows(lake, "messages").column("commitlog_offset").to_pylist())
    assert offsets == [e["phyOffset"] for e in golden_records]
    assert first.rows["messages"] + second.rows["messages"] == 2001


def test_corrupt_store_keeps_intact_records(spark, golden_store, golden_records, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(golden_store, store)
    victim = golden_records[100]
    seg = store / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    data[victim["phyOffset"] + 4:victim["phyOffset"] + 8] = b"\x00\x11\x22\x33"  # bad magic
    flip = golden_records[200]["phyOffset"] + 200
    data[flip] ^= 0xFF  # inside a body: CRC mismatch, record kept
    seg.write_bytes(bytes(data))
    lake = tmp_path / "lake"
    ingest(spark, [StoreSpec("broker-a", str(store))], str(lake))
    offsets = sorted(_rows(lake, "messages").column("commitlog_offset").to_pylist())
    assert offsets == [e["phyOffset"] for e in golden_records if e is not victim]
    found = _rows(lake, "corrupt_records").to_pylist()
    assert sorted((r["offset"], r["reason"].split(":")[0]) for r in found) == sorted([
        (victim["phyOffset"], "bad_magic"), (golden_records[200]["phyOffset"], "crc_mismatch")])
    assert {r["file"] for r in found} == {str(seg.resolve())}  # both kinds name the file the same way


def test_tables_read_the_same_with_spark_deltalake_and_duckdb(spark, lake):
    from pipelines.duckdb_delta import connect
    from pipelines.lake import read_table

    cols = ["commitlog_offset", "topic", "queue_id", "queue_offset", "store_timestamp", "tags", "uniq_key", "body"]
    via_delta = _rows(lake, "messages").select(cols).sort_by("commitlog_offset").to_pylist()
    via_spark = [r.asDict() for r in read_table(spark, str(lake), "messages").select(*cols)
                 .orderBy("commitlog_offset").collect()]
    con = connect()
    via_duckdb = con.execute(f"SELECT {', '.join(cols)} FROM delta_scan('{lake / 'messages'}') "
                             "ORDER BY commitlog_offset").arrow()
    via_duckdb = via_duckdb.to_pylist() if hasattr(via_duckdb, "to_pylist") else via_duckdb.read_all().to_pylist()
    assert len(via_delta) == 2001
    assert via_spark == via_delta
    assert via_duckdb == via_delta
    counts = con.execute(f"SELECT count(*) FROM delta_scan('{lake / 'consume_queue'}')").fetchone()[0]
    assert counts == _rows(lake, "consume_queue").num_rows == 1986


def test_killed_runs_then_rerun_leave_no_duplicates_or_gaps(golden_store, golden_records, tmp_path):
    """SIGKILL the spark-submit-style job at random moments; a final run completes every table."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    lake = tmp_path / "lake"
    cmd = [sys.executable, str(repo / "jobs" / "ingest_commitlog.py"), "--store", f"broker-a={golden_store}",
           "--lake", str(lake), "--master", "local[1]", "--split-bytes", "262144"]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    rnd = random.Random(11)
    for until in (1_500_000, 3_000_000, None):
        run = cmd + (["--until-offset", str(until)] if until else [])
        proc = subprocess.Popen(run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        time.sleep(rnd.uniform(6, 14))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    offsets = sorted(_rows(lake, "messages").column("commitlog_offset").to_pylist())
    assert offsets == [e["phyOffset"] for e in golden_records]
    assert _rows(lake, "consume_queue").num_rows == 1986
    units = _rows(lake, "consume_queue").select(["topic", "queue_id", "queue_offset"]).to_pylist()
    assert len({tuple(u.values()) for u in units}) == 1986


def test_index_entries_answer_apache_key_queries(lake, golden_expected):
    """Hash lookups on index_entries give exactly the offsets Apache's IndexService returned."""
    queries = json.loads((golden_expected / "expected_index.json").read_text())["queries"]
    entries = _rows(lake, "index_entries").select(["key_hash", "commitlog_offset"]).to_pylist()
    by_hash: dict[int, set[int]] = {}
    for e in entries:
        by_hash.setdefault(e["key_hash"], set()).add(e["commitlog_offset"])
    checked = 0
    for q in queries:
        if len(q["phyOffsets"]) >= 64:  # Apache capped this one at maxMsgsNumBatch
            continue
        assert by_hash.get(q["keyHash"], set()) == set(q["phyOffsets"]), q["indexKey"]
        checked += 1
    assert checked >= 70
