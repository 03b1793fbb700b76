"""The lake on S3 (a moto server over HTTP, tests/s3_server.py): every write and read path of
pipelines.lake against an ``s3://`` lake gives what the same calls give on a local lake."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from pyspark import cloudpickle

from pipelines import delta_writer, lake
from pipelines.delta_commit import commit_files, open_delta
from pipelines.delta_files import FileSetWriter
from pipelines.partition_writer import write_partitions
from pipelines.storage import Location, source_options
from schemas.messages import MESSAGES_PARTITION_BY, MESSAGES_SCHEMA
from tests.test_lake import _df, _messages, check_footer_stats
from tests.test_partition_writer import SCHEMA as PW_SCHEMA
from tests.test_partition_writer import _Reader, _wrap

# the Python workers cannot import this test module: ship its functions by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture()
def s3_lake(s3_server) -> Location:
    return Location.parse(f"s3://{s3_server.new_bucket()}/lake", s3_server.options)


@pytest.fixture()
def local_lake(tmp_path: Path) -> Location:
    return Location.parse(tmp_path / "lake")


def _files(table: Location) -> set[str]:
    """Every object under the table except the Delta log (paths relative to the table)."""
    fs, root = table.filesystem()
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=True))
    return {i.path[len(root) + 1:] for i in infos
            if i.type == pafs.FileType.File and not i.path[len(root) + 1:].startswith("_delta_log/")}


def _rows(table: pa.Table, key: str = "commitlog_offset") -> list[dict]:
    return pa.table(table).sort_by(key).to_pylist()


def _adds(lake_dir: Location, name: str) -> list[tuple]:
    """(partition values, numRecords, stats) of every current file, sorted (names differ by job id)."""
    dt = lake.open_table(lake_dir, name)
    adds = pa.table(dt.get_add_actions(flatten=False)).to_pylist()
    return sorted((json.dumps(a["partition"], default=str, sort_keys=True), a["num_records"]) for a in adds)


def test_table_location_keeps_the_storage_options(s3_lake, local_lake):
    table = lake.table_location(s3_lake, "messages")
    assert table.uri == f"{s3_lake.uri}/messages"
    assert table.option_map == s3_lake.option_map
    assert lake.table_path(s3_lake, "messages") == table.uri
    assert lake.table_path(f"file://{local_lake.uri}", "m") == f"{local_lake.uri}/m"
    assert lake.open_table(s3_lake, "messages") is None
    assert not lake.table_exists(s3_lake, "messages")
    assert lake.table_version(s3_lake, "messages") is None
    assert lake.app_version(s3_lake, "messages", "a") is None


def test_write_table_and_read_table_on_s3_equal_local(spark, s3_lake, local_lake):
    batch, more = _messages(45), _messages(30, 500)
    results = {}
    for where in (s3_lake, local_lake):
        r1 = lake.write_table(_df(spark, batch), where, "messages", partition_by=MESSAGES_PARTITION_BY,
                              schema=MESSAGES_SCHEMA, app_id="ingest-1", app_version=5)
        r2 = lake.write_table(_df(spark, more), where, "messages", partition_by=MESSAGES_PARTITION_BY,
                              schema=MESSAGES_SCHEMA, app_id="ingest-1", app_version=6)
        replay = lake.write_table(_df(spark, more), where, "messages", partition_by=MESSAGES_PARTITION_BY,
                                  schema=MESSAGES_SCHEMA, app_id="ingest-1", app_version=6)
        results[where.uri] = (r1, r2, replay)
    (s1, s2, s_replay), (l1, l2, l_replay) = results[s3_lake.uri], results[local_lake.uri]
    assert (s1.committed, s1.version, s1.num_rows) == (l1.committed, l1.version, l1.num_rows) == (True, 0, 45)
    assert (s2.committed, s2.version, s2.num_rows) == (l2.committed, l2.version, l2.num_rows) == (True, 1, 30)
    assert (s_replay.skipped, s_replay.version) == (l_replay.skipped, l_replay.version) == (True, 1)
    assert s1.path == f"{s3_lake.uri}/messages"
    assert lake.app_version(s3_lake, "messages", "ingest-1") == lake.app_version(local_lake, "messages", "ingest-1") == 6

    want = _rows(lake.scan_arrow(local_lake, "messages"))
    assert len(want) == 75
    assert _rows(lake.scan_arrow(s3_lake, "messages")) == want
    assert _adds(s3_lake, "messages") == _adds(local_lake, "messages")
    s3_table = lake.table_location(s3_lake, "messages")
    assert _files(s3_table) == {p for p in _files(s3_table) if p.endswith(".zstd.parquet")}
    assert len(_files(s3_table)) == len(lake.open_table(s3_lake, "messages").file_uris())

    # Spark reads the S3 table through the delta-rs source (no Hadoop S3A)
    back = lake.read_table(spark, s3_lake, "messages")
    assert back.columns == MESSAGES_SCHEMA.names
    assert _rows(back.toArrow()) == _rows(lake.read_table(spark, local_lake, "messages").toArrow()) == want
    filtered = lake.read_table(spark, s3_lake, "messages").where("broker_name = 'broker-a'")
    assert sorted(r.commitlog_offset for r in filtered.collect()) == sorted(
        r["commitlog_offset"] for r in want if r["broker_name"] == "broker-a")


def test_data_source_replay_on_s3_deletes_its_files(spark, s3_lake):
    """Straight through the data source (the executors write to S3, the driver's commit refuses
    the replayed app version and deletes what they wrote)."""
    table = lake.table_location(s3_lake, "m")
    batch = _messages(12)
    first = lake.write_table(_df(spark, batch), s3_lake, "m", partition_by=MESSAGES_PARTITION_BY,
                             schema=MESSAGES_SCHEMA, app_id="ingest-1", app_version=5)
    files_before = _files(table)
    assert first.committed and files_before
    with lake.writer_result_file() as result_file:
        (_df(spark, batch).write.format(delta_writer.FORMAT_NAME).mode("append")
         .option("partitionBy", json.dumps(MESSAGES_PARTITION_BY))
         .option("arrowSchema", delta_writer.encode_schema(MESSAGES_SCHEMA))
         .option("appId", "ingest-1").option("appVersion", "5")
         .option("resultFile", result_file).options(**source_options(table)).save(table.uri))
        report = lake.read_writer_result(table.uri, result_file)
    assert (report.committed, report.skipped, report.version) == (False, True, 0)
    assert report.reason == "appId 'ingest-1' already at version 5 >= 5"
    assert _files(table) == files_before
    assert lake.table_version(s3_lake, "m") == 0


def test_failed_write_on_s3_leaves_no_files(failing_df, s3_lake):
    with pytest.raises(Exception, match="bad row 25"):
        lake.write_table(failing_df, s3_lake, "ids")
    table = lake.table_location(s3_lake, "ids")
    assert not lake.table_exists(s3_lake, "ids")
    assert _files(table) - {p for p in _files(table) if p.startswith(delta_writer.ABORT_MARKER_DIR + "/")} == set()


def test_write_partitions_on_s3_equal_local(spark, s3_lake, local_lake):
    out = {}
    for where in (s3_lake, local_lake):
        res = write_partitions(spark, _wrap(_Reader(5)), where, "t", schema=PW_SCHEMA, partition_by=["part"],
                               app_id="test.app", app_version=7, offset_range=("commitlog_offset", 30, 420))
        again = write_partitions(spark, _wrap(_Reader(5)), where, "t", schema=PW_SCHEMA, partition_by=["part"],
                                 app_id="test.app", app_version=7)
        out[where.uri] = (res, again)
    (s_res, s_again), (l_res, l_again) = out[s3_lake.uri], out[local_lake.uri]
    assert (s_res.committed, s_res.version, s_res.num_rows) == (l_res.committed, l_res.version, l_res.num_rows) \
        == (True, 0, 390)
    assert s_again.skipped and l_again.skipped
    assert lake.app_version(s3_lake, "t", "test.app") == 7
    want = _rows(lake.scan_arrow(local_lake, "t"))
    assert [r["commitlog_offset"] for r in want] == list(range(30, 420))
    assert _rows(lake.scan_arrow(s3_lake, "t")) == want
    assert _adds(s3_lake, "t") == _adds(local_lake, "t")

    # a failing task: no commit, and none of the job's files stay behind on S3
    table = lake.table_location(s3_lake, "t")
    before = _files(table)
    with pytest.raises(Exception, match="failed on purpose"):
        write_partitions(spark, _wrap(_Reader(4, fail=3)), s3_lake, "t", schema=PW_SCHEMA, partition_by=["part"],
                         app_id="test.app", app_version=8)
    assert lake.table_version(s3_lake, "t") == 0 and lake.app_version(s3_lake, "t", "test.app") == 7
    assert {p for p in _files(table) if not p.startswith(delta_writer.ABORT_MARKER_DIR + "/")} == before


def test_driver_side_tables_on_s3_equal_local(s3_lake, local_lake):
    runs = pa.table({"run": ["r1", "r2", "r3"], "broker_name": ["a", "b", "a"], "n": [1, 2, 3]})
    report = pa.table({"broker_name": ["a", "b"], "total": [10, 20]})
    results = {}
    for where in (s3_lake, local_lake):
        first = lake.append_arrow(where, "runs", runs, partition_by=["broker_name"], app_id="x", app_version=3)
        replay = lake.append_arrow(where, "runs", runs, partition_by=["broker_name"], app_id="x", app_version=3)
        lake.replace_arrow(where, "report", report)
        replaced = lake.replace_arrow(where, "report", pa.table({"broker_name": ["a"], "total": [11]}),
                                      predicate="broker_name IN ('a')")
        scanned = lake.scan_arrow(where, "runs", columns=["run", "n"], filter=ds.field("broker_name") == "a")
        results[where.uri] = (first, replay, replaced, scanned, lake.scan_arrow(where, "report"))
    s, loc = results[s3_lake.uri], results[local_lake.uri]
    assert (s[0].committed, s[0].version) == (loc[0].committed, loc[0].version) == (True, 0)
    assert (s[1].skipped, s[1].version) == (loc[1].skipped, loc[1].version) == (True, 0)
    assert s[2].version == loc[2].version == 1
    assert _rows(s[3], "run") == _rows(loc[3], "run") == [{"run": "r1", "n": 1}, {"run": "r3", "n": 3}]
    assert _rows(s[4], "broker_name") == _rows(loc[4], "broker_name") == [
        {"broker_name": "a", "total": 11}, {"broker_name": "b", "total": 20}]
    assert lake.app_version(s3_lake, "runs", "x") == 3
    assert lake.table_exists(s3_lake, "runs") and lake.table_version(s3_lake, "report") == 1


def test_footer_stats_on_s3(s3_lake):
    check_footer_stats(s3_lake.child("stats"))


def _write_files(table: Location, job: str, n: int) -> list:
    writer = FileSetWriter(table, PW_SCHEMA, [], f"part-00000-{job}-a0")
    writer.write(pa.table({"part": ["p"] * n, "commitlog_offset": list(range(n)), "value": ["v"] * n},
                          schema=PW_SCHEMA))
    return writer.close()


def test_concurrent_commits_on_s3_are_not_lost(s3_lake):
    """A writer committing from a stale snapshot lands after the other (conditional put), and a
    concurrent commit of the same app id is refused rather than recorded twice."""
    table = s3_lake.child("c")
    first = commit_files(table, _write_files(table, "job0", 3), schema=PW_SCHEMA, job_id="job0")
    assert (first.committed, first.version) == (True, 0)
    stale = open_delta(table)  # both writers start from version 0
    second = commit_files(table, _write_files(table, "job1", 4), schema=PW_SCHEMA, job_id="job1",
                          app_id="app", app_version=1)
    assert (second.committed, second.version) == (True, 1)

    from deltalake.transaction import AddAction, CommitProperties, Transaction

    def actions(files):
        return [AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats) for f in files]

    stale.create_write_transaction(actions(_write_files(table, "job2", 5)), "append", schema=PW_SCHEMA,
                                   commit_properties=CommitProperties(custom_metadata={"rocketlake.jobId": "job2"}))
    assert open_delta(table).version() == 2
    assert DeltaTable(table.uri, storage_options=table.delta_options()).to_pyarrow_table().num_rows == 12

    stale = DeltaTable(table.uri, version=0, storage_options=table.delta_options())
    with pytest.raises(CommitFailedError, match="Concurrent transaction"):  # not recorded twice
        stale.create_write_transaction(actions(_write_files(table, "job3", 6)), "append", schema=PW_SCHEMA,
                                       commit_properties=CommitProperties(app_transactions=[Transaction("app", 1)]))
    assert open_delta(table).version() == 2 and lake.app_version(s3_lake, "c", "app") == 1
