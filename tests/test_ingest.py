"""Ingest job: golden store into Delta, exactly once and incremental."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pytest

from pipelines.ingest import app_id_for, ingest
from pipelines.job_args import StoreSpec
from pipelines.lake import app_version, open_table, table_version
from schemas.messages import MESSAGES_TABLE
from schemas.tables import CONSUME_QUEUE_TABLE, CORRUPT_RECORDS_TABLE, INDEX_ENTRIES_TABLE, INGEST_RUNS_TABLE
from tests.golden_fields import expected_row
from tests.job_runner import group_alive, pump_lines


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return tmp_path_factory.mktemp("lake")


def _rows(lake, name):
    return open_table(lake, name).to_pyarrow_table()


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


def test_the_findings_walk_reads_only_segments_the_decode_did_not_prove_clean(spark, golden_store, golden_records,
                                                                              tmp_path, monkeypatch):
    """A segment whose messages splits found nothing and followed one record chain is not walked
    again; the damaged one is, and corrupt_records holds exactly the walk's findings of every segment."""
    import pipelines.ingest as ingest_module
    from pipelines.commitlog_ranges import commitlog_end, segment_files, walk_range
    from pipelines.store_files import StoreFiles
    from tests.damaged_store import damaged_copy

    walked: list[list[tuple[int, int, int]]] = []
    real = ingest_module.collect_partitions

    def spy(spark, reader, schema, parts=None):
        walked.append(sorted((p.base, p.start, p.end) for p in parts))
        return real(spark, reader, schema, parts)

    monkeypatch.setattr(ingest_module, "collect_partitions", spy)
    ingest(spark, [StoreSpec("broker-a", str(golden_store))], str(tmp_path / "golden-lake"))
    assert walked == []  # Apache's store is healthy: every segment proven by its decode
    store = damaged_copy(golden_store, golden_records, tmp_path)
    lake = tmp_path / "lake"
    ingest(spark, [StoreSpec("broker-a", str(store))], str(lake))
    segments, _ = segment_files(StoreFiles(store))
    end = commitlog_end(segments)
    assert walked == [[(0, 0, segments[0].data_len)]]  # the damage is all in the first segment
    want = sorted((f.file, f.offset, f.kind) for seg in segments
                  for f in walk_range(seg, 0, min(seg.data_len, end - seg.base)).findings)
    assert len(want) == 3  # two zeroed runs and a broken magic
    got = sorted((r["file"], r["offset"], r["reason"].split(":")[0]) for r in _rows(lake, "corrupt_records").to_pylist()
                 if not r["reason"].startswith("crc_mismatch"))
    assert got == want


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


# Killed runs. Each round starts the ingest job as its own process, reads its log as it is written and
# SIGKILLs the whole process group the moment a chosen point is reached: a condition on the log lines
# pipelines/partition_writer.py writes per task ("<table>: partition i/n …: R rows"), or the line
# tests/hold_after_commit.py logs when it holds the job right after one table's commit (the tables'
# files are written by one Spark job and then committed one after another, milliseconds apart), never
# a clock. After the kill the marks (the Delta app transaction ``rocketlake.ingest.<broker>``) show
# which tables had committed, so each round proves where its kill landed.

KILL_BROKER = "broker-a"
KILL_SPLIT_BYTES = 262_144  # ~19 messages tasks over the golden store's 4.6 MiB commitlog
KILL_UNTIL = 3_000_000  # the first rounds stop here, so later rounds resume each table from a mark
KILL_TABLES = (MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE, CORRUPT_RECORDS_TABLE, INGEST_RUNS_TABLE)
NATURAL_KEYS = {
    MESSAGES_TABLE: ["broker_name", "commitlog_offset"],
    CONSUME_QUEUE_TABLE: ["broker_name", "topic", "queue_id", "queue_offset"],
    # prev_index as well: one record can have two keys of the same hash in one file
    INDEX_ENTRIES_TABLE: ["broker_name", "index_file", "key_hash", "commitlog_offset", "prev_index"],
    CORRUPT_RECORDS_TABLE: ["broker_name", "file", "offset", "reason"],
    INGEST_RUNS_TABLE: ["broker_name", "to_offset"],
}
PARTITION_LINE = re.compile(rb"\b(\w+): partition (\d+)/(\d+) .*: (\d+) rows")
HELD_LINE = re.compile(rb"held after (\w+) commit")
JOB_DEADLINE_S = 300  # a guard against a hung job, never a pass condition


def _mark(lake: Path, name: str) -> int | None:
    """The table's ingest mark for the broker (None: no table, or no commit by the ingest)."""
    table = open_table(lake, name)
    return None if table is None else table.transaction_version(app_id_for(KILL_BROKER))


def _marks(lake: Path) -> dict[str, int | None]:
    return {name: _mark(lake, name) for name in KILL_TABLES}


@dataclass
class JobProgress:
    """What a running job has shown so far: its stderr lines, per table the partitions it logged as
    written and how many there are, and the table after whose commit it holds (if it does)."""

    lake: Path
    end: int
    lines: list[bytes] = field(default_factory=list)
    written: Counter = field(default_factory=Counter)
    totals: dict[str, int] = field(default_factory=dict)
    held_after: str | None = None

    def see(self, line: bytes) -> None:
        self.lines.append(line)
        found = PARTITION_LINE.search(line)
        if found:
            table = found.group(1).decode()
            self.written[table] += 1
            self.totals[table] = int(found.group(3))
        held = HELD_LINE.search(line)
        if held:
            self.held_after = held.group(1).decode()

    def mid_write(self, table: str) -> bool:
        """Some of ``table``'s partitions are written and some are not (its commit is still ahead)."""
        return 0 < self.written[table] < self.totals[table]

    def committed(self, table: str) -> bool:
        """The job holds right after committing ``table``, and the table's mark is the run's end."""
        return self.held_after == table and _mark(self.lake, table) == self.end

    def tail(self, n: int = 40) -> str:
        return b"\n".join(self.lines[-n:]).decode("utf-8", "replace")


# (condition, the table after whose commit the job is held: None runs it unheld)
KILL_WHEN: dict[str, tuple[Callable[[JobProgress], bool], str | None]] = {
    "mid-messages": (lambda p: p.mid_write(MESSAGES_TABLE), None),
    # the other tables' files are written, their commits are ahead
    "messages committed": (lambda p: p.committed(MESSAGES_TABLE), MESSAGES_TABLE),
    "consume_queue committed": (lambda p: p.committed(CONSUME_QUEUE_TABLE), CONSUME_QUEUE_TABLE),
    # corrupt_records is ahead
    "index_entries committed": (lambda p: p.committed(INDEX_ENTRIES_TABLE), INDEX_ENTRIES_TABLE),
}


def _job_cmd(store: Path, lake: Path, until: int | None, hold_after: str | None = None) -> list[str]:
    repo = Path(__file__).resolve().parents[1]
    args = (["--store", f"{KILL_BROKER}={store}", "--lake", str(lake), "--master", "local[1]",
             "--split-bytes", str(KILL_SPLIT_BYTES)] + (["--until-offset", str(until)] if until is not None else []))
    if hold_after is not None:
        return [sys.executable, str(repo / "tests" / "hold_after_commit.py"), hold_after, *args]
    return [sys.executable, str(repo / "jobs" / "ingest_commitlog.py"), *args]


def _job_env() -> dict[str, str]:
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)


def _run_until_killed(store: Path, lake: Path, until: int | None, end: int,
                      stage: str) -> tuple[JobProgress, int]:
    """Start the job; SIGKILL its process group as soon as ``stage``'s condition holds. Returns what
    the job had logged and its exit status (-SIGKILL when the kill found it running)."""
    kill_when, hold_after = KILL_WHEN[stage]
    proc = subprocess.Popen(_job_cmd(store, lake, until, hold_after), env=_job_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    lines, pump = pump_lines(proc.stderr)
    progress = JobProgress(lake, end)
    deadline = time.monotonic() + JOB_DEADLINE_S
    try:
        while not kill_when(progress):
            try:
                line = lines.get(timeout=0.05)  # also re-checks mark conditions while the log is quiet
            except queue.Empty:
                line = b""
            if line is None:
                pytest.fail(f"the job ended before the kill condition held:\n{progress.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the kill condition did not hold within {JOB_DEADLINE_S} s:\n{progress.tail()}")
            if line:
                progress.see(line)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        returncode = proc.wait()
        while group_alive(proc.pid):  # nothing of this run may still write when the next starts
            assert time.monotonic() < deadline, "the killed job's processes did not go"
            time.sleep(0.05)
        pump.join(max(0.0, deadline - time.monotonic()))  # ends at the pipe's EOF: every writer is gone
        proc.stderr.close()
    return progress, returncode


def _damaged_store(golden_store: Path, golden_records: list[dict], into: Path) -> tuple[Path, dict]:
    """A copy of the golden store with one record's magic broken (skipped) and one body byte
    flipped (kept, CRC mismatch): corrupt_records gets rows, so its kill round interrupts a real write."""
    store = into / "store"
    shutil.copytree(golden_store, store)
    victim = golden_records[100]
    seg = store / "commitlog" / "00000000000000000000"
    seg.chmod(0o644)  # the golden files are read-only, and so is the copy
    data = bytearray(seg.read_bytes())
    data[victim["phyOffset"] + 4:victim["phyOffset"] + 8] = b"\x00\x11\x22\x33"
    data[golden_records[200]["phyOffset"] + 200] ^= 0xFF
    seg.write_bytes(bytes(data))
    return store, victim


def _comparable(lake: Path, name: str) -> pa.Table:
    """The table's rows in natural-key order, without the run id (which differs run to run)."""
    table = _rows(lake, name)
    columns = sorted(c for c in table.column_names if c != "ingest_run_id")
    return table.select(columns).sort_by([(k, "ascending") for k in NATURAL_KEYS[name]])


def _duplicates(table: pa.Table, keys: list[str]) -> list[tuple]:
    counts = Counter(zip(*(table.column(k).to_pylist() for k in keys)))
    return [key for key, n in counts.items() if n > 1]


def test_killed_runs_then_rerun_leave_no_duplicates_or_gaps(spark, golden_store, golden_records, tmp_path):
    """SIGKILL the job in the middle of each stage in turn (several rounds, resuming from the marks
    the earlier rounds left); a final run then completes every table: no duplicates, no gaps (the
    tables equal a clean single run's), every mark at the end."""
    store, victim = _damaged_store(golden_store, golden_records, tmp_path)
    end = golden_records[-1]["phyOffset"] + golden_records[-1]["storeSize"]
    cut = KILL_UNTIL
    lake = tmp_path / "lake"
    # (--until-offset, when to kill, the marks the kill leaves: tables not named have none)
    rounds = [
        (cut, "messages committed", {MESSAGES_TABLE: cut}),  # the other tables' writes are ahead
        (cut, "consume_queue committed", {MESSAGES_TABLE: cut, CONSUME_QUEUE_TABLE: cut}),
        (None, "mid-messages", {MESSAGES_TABLE: cut, CONSUME_QUEUE_TABLE: cut}),  # resumed at cut
        (None, "index_entries committed", dict.fromkeys((MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE),
                                                        end)),  # corrupt_records is being written
    ]
    for until, stage, left in rounds:
        run_end = end if until is None else until
        progress, returncode = _run_until_killed(store, lake, until, run_end, stage)
        assert returncode == -signal.SIGKILL, f"{stage}: the job had already ended ({returncode})"
        assert sum(progress.written.values()) >= 1, f"{stage}: no partition written before the kill"
        marks = _marks(lake)
        assert any(m is None or m < run_end for m in marks.values()), f"{stage}: every table had committed"
        assert marks == {name: left.get(name) for name in KILL_TABLES}, stage

    done = subprocess.run(_job_cmd(store, lake, None), env=_job_env(), capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:].decode("utf-8", "replace")
    clean = tmp_path / "clean"
    ingest(spark, [StoreSpec(KILL_BROKER, str(store))], str(clean), split_bytes=KILL_SPLIT_BYTES)

    assert _marks(lake) == _marks(clean) == dict.fromkeys(KILL_TABLES, end)
    offsets = _comparable(lake, MESSAGES_TABLE).column("commitlog_offset").to_pylist()
    assert offsets == [e["phyOffset"] for e in golden_records if e is not victim]
    for name in (MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE, CORRUPT_RECORDS_TABLE):
        got, want = _comparable(lake, name), _comparable(clean, name)
        assert _duplicates(got, NATURAL_KEYS[name]) == [], name
        assert got.num_rows == want.num_rows and got.equals(want), name
    assert _comparable(lake, CORRUPT_RECORDS_TABLE).num_rows == 2
    # killed runs never reached their run record: only the final run has one, and it added only
    # what the kills had left uncommitted (corrupt_records)
    runs = _rows(lake, INGEST_RUNS_TABLE).to_pylist()
    assert [(r["broker_name"], r["to_offset"], r["messages_rows"], r["consume_queue_rows"], r["index_entries_rows"],
             r["corrupt_records_rows"]) for r in runs] == [(KILL_BROKER, end, 0, 0, 0, 2)]


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
