"""Lake maintenance (pipelines.maintenance, jobs/maintenance.py): compaction keeps every row, the
ingest's app transactions and the lag table's rerun detection; VACUUM only deletes files the log
removed longer ago than the retention; the retention cannot go below the floor from the job."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from broker.cli import run_job
from pipelines import maintenance
from pipelines.lake import app_version, append_arrow, scan_arrow, table_path
from pipelines.reports.consumer_lag import append_snapshot, snapshot_stores
from schemas.reports import CONSUMER_LAG_TABLE

APP = "rocketlake.ingest.broker-a"
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def _many_file_table(lake: Path, name: str = "runs", commits: int = 15) -> pa.Table:
    """``commits`` one-row appends in two partitions, each with the ingest's app transaction."""
    rows = []
    for i in range(commits):
        row = pa.table({"broker_name": pa.array(["broker-a" if i % 2 else "broker-b"]),
                        "n": pa.array([i], pa.int64()), "text": pa.array([f"row {i}"])})
        append_arrow(lake, name, row, partition_by=["broker_name"], app_id=APP, app_version=i + 1)
        rows.append(row)
    return pa.concat_tables(rows)


def _sorted(table: pa.Table, key: str) -> list[dict]:
    return table.sort_by(key).to_pylist()


def _data_files(path: str) -> set[str]:
    out = set()
    for root, _dirs, files in os.walk(path):
        if "_delta_log" not in root:
            out |= {os.path.join(root, f) for f in files if f.endswith(".parquet")}
    return out


def test_compaction_keeps_rows_and_app_transactions(tmp_path):
    lake = tmp_path / "lake"
    expected = _many_file_table(lake)
    before_version = DeltaTable(table_path(lake, "runs")).version()

    result = maintenance.maintain_table(lake, "runs")

    assert result.error is None
    assert (result.files_before, result.files_after) == (15, 2)  # one file per partition
    assert (result.compacted_removed, result.compacted_added) == (15, 2)
    assert result.rows_before == result.rows_after == 15
    assert result.version_after == before_version + 1  # the OPTIMIZE commit
    assert result.checkpoint_version == result.version_after
    assert result.vacuumed == []  # the removed files are younger than the retention
    assert result.retention_hours == maintenance.DEFAULT_RETENTION_HOURS
    assert _sorted(scan_arrow(lake, "runs"), "n") == _sorted(expected.select(scan_arrow(lake, "runs").column_names), "n")
    assert app_version(lake, "runs", APP) == 15  # exactly-once marks survive compaction and checkpoint
    assert (Path(table_path(lake, "runs")) / "_delta_log" / "_last_checkpoint").exists()
    assert "files 15 -> 2" in result.line() and "compacted 15 into 2" in result.line()

    again = maintenance.maintain_table(lake, "runs")  # nothing left to compact: no new commit
    assert (again.files_before, again.files_after, again.compacted_removed) == (2, 2, 0)
    assert again.version_after == result.version_after
    # an append after maintenance still lands after the recorded mark
    append_arrow(lake, "runs", expected.slice(0, 1), partition_by=["broker_name"], app_id=APP, app_version=16)
    assert app_version(lake, "runs", APP) == 16
    assert scan_arrow(lake, "runs").num_rows == 16


def test_lag_table_compacts_and_still_recognises_a_rerun(tmp_path, golden_store):
    lake = tmp_path / "lake"
    for i in range(6):  # one file per snapshot and broker today
        assert append_snapshot(lake, snapshot_stores([("broker-a", str(golden_store))], T0 + timedelta(minutes=5 * i)))
    before = scan_arrow(lake, CONSUMER_LAG_TABLE)

    result = maintenance.maintain_table(lake, CONSUMER_LAG_TABLE)

    assert (result.files_before, result.files_after) == (6, 1)
    after = scan_arrow(lake, CONSUMER_LAG_TABLE)
    keys = ["snapshot_ts", "consumer_group", "topic", "queue_id"]
    assert after.sort_by([(k, "ascending") for k in keys]).equals(before.sort_by([(k, "ascending") for k in keys]))
    # the snapshot at T0 is still found in the compacted file: a rerun appends nothing
    assert append_snapshot(lake, snapshot_stores([("broker-a", str(golden_store))], T0)) == []


def test_vacuum_deletes_only_what_the_log_removed(tmp_path):
    lake = tmp_path / "lake"
    _many_file_table(lake, commits=8)
    path = table_path(lake, "runs")
    maintenance.maintain_table(lake, "runs", vacuum=False)
    on_disk = _data_files(path)
    assert len(on_disk) == 8 + 2  # compaction leaves the old files for readers of older snapshots
    stray = Path(path) / "broker_name=broker-a" / "part-uncommitted.parquet"  # a write not committed yet
    stray.write_bytes(b"PAR1")

    dry = maintenance.maintain_table(lake, "runs", retention_hours=0, enforce_min_retention=False, dry_run=True)
    assert len(dry.vacuumed) == 8 and _data_files(path) == on_disk | {str(stray)}

    done = maintenance.maintain_table(lake, "runs", retention_hours=0, enforce_min_retention=False)
    assert len(done.vacuumed) == 8
    assert _data_files(path) == {f for f in on_disk if f.replace(path + "/", "") not in done.vacuumed} | {str(stray)}
    assert stray.exists()  # files the log never listed are not touched
    assert scan_arrow(lake, "runs").num_rows == 8


def test_retention_floor_and_the_tables_own_retention(tmp_path, capsys):
    with pytest.raises(ValueError, match="shorter than 24 h"):
        maintenance.check_retention(1)
    lake = tmp_path / "lake"
    write_deltalake(table_path(lake, "keep"), pa.table({"x": [1]}),
                    configuration={"delta.deletedFileRetentionDuration": "interval 30 days"})
    assert maintenance.interval_hours("interval 30 days") == 720
    assert maintenance.interval_hours("interval 1 week") == 168
    assert maintenance.interval_hours("nonsense") is None
    assert maintenance.maintain_table(lake, "keep").retention_hours == 720  # the table asked for more

    with pytest.raises(SystemExit) as exit_info:
        run_job("maintenance.py", ["--lake", str(lake), "--retention-hours", "2"])
    assert exit_info.value.code == 2
    assert "shorter than 24 h" in capsys.readouterr().err


def test_job_maintains_every_table_and_prints_files_before_after(tmp_path, capsys):
    lake = tmp_path / "lake"
    _many_file_table(lake, "runs", commits=5)
    _many_file_table(lake, "other", commits=3)
    (lake / "_quality").mkdir()  # validation results: not a table

    assert maintenance.list_tables(lake) == ["other", "runs"]
    assert run_job("maintenance.py", ["--lake", str(lake), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "maintenance runs: files 5 -> 5, dry run" in out and "(dry run)" in out
    assert DeltaTable(table_path(lake, "runs")).version() == 4  # nothing written

    assert run_job("maintenance.py", ["--lake", str(lake), "--retention-hours", "48"]) == 0
    out = capsys.readouterr().out
    assert "maintenance other: files 3 -> 2" in out and "maintenance runs: files 5 -> 2" in out
    assert "maintenance: 2 table(s) done, files 8 -> 4" in out

    assert run_job("maintenance.py", ["--lake", str(lake), "--tables", "runs,missing"]) == 1
    out = capsys.readouterr().out
    assert "maintenance missing: FAILED" in out and "FAILED: missing" in out


def test_appends_with_marks_go_on_while_compaction_commits(tmp_path):
    """A streaming ingest keeps appending (each commit with its app transaction) while the maintenance
    job compacts the same table: every append and the compaction commit, no row is lost or doubled,
    and the last mark is the last append's."""
    import threading

    lake = tmp_path / "lake"
    schema = pa.schema([("commitlog_offset", pa.int64()), ("batch", pa.int32())])

    def batch(i: int) -> pa.Table:
        return pa.table({"commitlog_offset": pa.array(range(i * 10, i * 10 + 10), pa.int64()),
                         "batch": pa.array([i] * 10, pa.int32())}, schema=schema)

    for i in range(20):  # small files to compact
        append_arrow(lake, "t", batch(i), app_id="rocketlake.ingest.b", app_version=(i + 1) * 10)
    errors: list[BaseException] = []
    compacted: list = []
    started = threading.Event()

    def compact() -> None:
        try:
            started.set()
            compacted.append(maintenance.maintain_table(lake, "t", vacuum=False, checkpoint=False))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    worker = threading.Thread(target=compact)
    worker.start()
    started.wait()
    for i in range(20, 40):  # the stream's micro-batches, committing meanwhile
        res = append_arrow(lake, "t", batch(i), app_id="rocketlake.ingest.b", app_version=(i + 1) * 10)
        assert res.committed, res
    worker.join(120)
    assert not worker.is_alive() and not errors, errors
    assert compacted[0].compacted_removed >= 2
    rows = scan_arrow(lake, "t").sort_by("commitlog_offset")
    assert rows["commitlog_offset"].to_pylist() == list(range(400))
    assert app_version(lake, "t", "rocketlake.ingest.b") == 400
