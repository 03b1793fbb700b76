"""Delta tables written from Spark through the delta-rs Python Data Source (no Delta Spark jar)."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pipelines import delta_writer, lake
from schemas.messages import MESSAGES_PARTITION_BY, MESSAGES_SCHEMA

N_ROWS = 60
UTC = dt.timezone.utc


def _messages(n: int = N_ROWS, start: int = 0) -> pa.Table:
    """Deterministic rows of the full messages schema (nulls, maps, lists, binary, µs timestamps)."""
    rows = []
    for i in range(start, start + n):
        store_time = dt.datetime(2024, 3, 1 + i % 3, 12, 0, i % 60, 1000 * i + 7, tzinfo=UTC)
        born_time = store_time - dt.timedelta(microseconds=123)
        row: dict = {}
        for field in MESSAGES_SCHEMA:
            t = field.type
            if pa.types.is_integer(t):
                row[field.name] = (i * 4096 + 7) if pa.types.is_int64(t) else (i % 7 - 3)
            elif pa.types.is_boolean(t):
                row[field.name] = i % 2 == 0
            elif pa.types.is_string(t):
                row[field.name] = None if i % 11 == 5 else f"{field.name}-{i % 5}"
            elif pa.types.is_map(t):
                row[field.name] = None if i % 13 == 3 else [("KEYS", f"k{i}"), ("UNIQ_KEY", f"U{i:04d}")]
            elif pa.types.is_list(t):
                row[field.name] = [] if i % 4 == 1 else [f"k{i}", "b"]
            elif pa.types.is_binary(t):
                row[field.name] = None if i % 9 == 2 else bytes([i % 256, 0, 255]) * (i % 3)
            elif pa.types.is_timestamp(t):
                row[field.name] = store_time if field.name == "store_time" else born_time
            elif pa.types.is_date(t):
                row[field.name] = store_time.date()
            else:  # pragma: no cover - schema grew a type this generator does not know
                raise AssertionError(f"no generator for {field}")
        row["broker_name"] = ["broker-a", "broker:b c", None][(i // 3) % 3]
        row["commitlog_offset"] = i * 4096
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=MESSAGES_SCHEMA)


def _df(spark, table: pa.Table, partitions: int = 3):
    return spark.createDataFrame(table).repartition(partitions)


def _data_files(path: str) -> set[str]:
    """Every file under the table except the Delta log and ``_``-prefixed bookkeeping dirs."""
    out = set()
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith("_") or "=" in d]
        out.update(os.path.join(root, f) for f in files)
    return out


def _sorted(table) -> pa.Table:
    return pa.table(table).sort_by("commitlog_offset")


def _assert_same_rows(got: pa.Table, expected: pa.Table) -> None:
    got = got.select(expected.schema.names)
    assert got.num_rows == expected.num_rows
    assert got.to_pylist() == expected.to_pylist()


@pytest.fixture()
def lake_dir(tmp_path: Path) -> str:
    return str(tmp_path / "lake")


def test_write_messages_is_a_standard_delta_table(spark, lake_dir):
    expected = _messages()
    result = lake.write_table(_df(spark, expected), lake_dir, "messages",
                              partition_by=MESSAGES_PARTITION_BY, schema=MESSAGES_SCHEMA)
    path = lake.table_path(lake_dir, "messages")
    assert result.engine == "delta-rs"  # no Delta Spark jar in the test session
    assert (result.committed, result.skipped, result.version, result.num_rows) == (True, False, 0, N_ROWS)

    table = DeltaTable(path)
    assert table.version() == 0
    history = table.history()
    assert len(history) == 1
    assert history[0]["operationParameters"]["mode"] in ("ErrorIfExists", "Append")
    assert table.metadata().partition_columns == MESSAGES_PARTITION_BY
    assert pa.schema(table.schema().to_arrow()).names == MESSAGES_SCHEMA.names
    got = _sorted(table.to_pyarrow_table())
    assert got.schema.field("store_time").type == pa.timestamp("us", tz="UTC")
    assert got.schema.field("store_date").type == pa.date32()
    _assert_same_rows(got, expected)

    # files: Hive-style directories from the Delta partition values, zstd, no partition columns inside
    files = table.file_uris()
    assert set(files) == _data_files(path)
    assert result.num_files == len(files)
    adds = pa.table(table.get_add_actions(flatten=False)).to_pylist()
    assert sum(a["num_records"] for a in adds) == N_ROWS
    seen_partitions = set()
    for add in adds:
        part = add["partition"]
        seen_partitions.add((part["broker_name"], part["store_date"]))
        local = os.path.join(path, *unquote(add["path"]).split("/"))
        broker_dir = "__HIVE_DEFAULT_PARTITION__" if part["broker_name"] is None else \
            quote(part["broker_name"], safe="")
        assert os.path.relpath(local, path).split(os.sep)[:2] == [
            f"broker_name={broker_dir}", f"store_date={part['store_date'].isoformat()}"]
        pf = pq.ParquetFile(local)
        assert "broker_name" not in pf.schema_arrow.names and "store_date" not in pf.schema_arrow.names
        assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
        assert pf.metadata.row_group(0).column(0).statistics.has_min_max
        rows = pf.read().to_pylist()
        assert add["num_records"] == len(rows)
        offsets = [r["commitlog_offset"] for r in rows]
        assert add["min"]["commitlog_offset"] == min(offsets)
        assert add["max"]["commitlog_offset"] == max(offsets)
        assert add["max"]["store_time"] == max(r["store_time"] for r in rows)  # µs kept
        for r in rows:
            want = expected.filter(pa.compute.equal(expected["commitlog_offset"],
                                                    r["commitlog_offset"])).to_pylist()[0]
            assert (want["broker_name"], want["store_date"]) == (part["broker_name"], part["store_date"])
    expected_partitions = {(r["broker_name"], r["store_date"]) for r in expected.to_pylist()}
    assert seen_partitions == expected_partitions
    assert len(expected_partitions) == 9  # 3 brokers (one null) x 3 dates

    # read back through Spark
    back = lake.read_table(spark, lake_dir, "messages")
    assert back.columns == MESSAGES_SCHEMA.names
    _assert_same_rows(_sorted(back.toArrow()), expected)
    assert back.where("broker_name IS NULL").count() == sum(
        1 for r in expected.to_pylist() if r["broker_name"] is None)


def test_append_twice_makes_two_versions(spark, lake_dir):
    first, second = _messages(20, 0), _messages(25, 100)
    r1 = lake.write_table(_df(spark, first), lake_dir, "t", partition_by=["store_date"],
                          schema=MESSAGES_SCHEMA)
    r2 = lake.write_table(_df(spark, second, 4), lake_dir, "t", partition_by=["store_date"],
                          schema=MESSAGES_SCHEMA)
    assert (r1.version, r2.version) == (0, 1)
    assert lake.table_version(lake_dir, "t") == 1
    table = DeltaTable(lake.table_path(lake_dir, "t"))
    assert [h["version"] for h in table.history()] == [1, 0]
    assert table.history()[0]["operation"] == "WRITE"
    expected = pa.concat_tables([first, second])
    _assert_same_rows(_sorted(table.to_pyarrow_table()), _sorted(expected))
    _assert_same_rows(_sorted(lake.read_table(spark, lake_dir, "t").toArrow()), _sorted(expected))
    assert DeltaTable(lake.table_path(lake_dir, "t"), version=0).to_pyarrow_table().num_rows == 20


def test_unpartitioned_table_and_spark_schema(spark, lake_dir):
    df = spark.createDataFrame([(1, "a", dt.datetime(2024, 1, 1, tzinfo=UTC)), (2, None, None)],
                               "id long, s string, ts timestamp").repartition(2)
    result = lake.write_table(df, lake_dir, "plain")
    assert (result.version, result.num_rows) == (0, 2)
    got = pa.table(DeltaTable(lake.table_path(lake_dir, "plain")).to_pyarrow_table()).sort_by("id")
    assert got.to_pylist() == [{"id": 1, "s": "a", "ts": dt.datetime(2024, 1, 1, tzinfo=UTC)},
                               {"id": 2, "s": None, "ts": None}]
    assert sorted(lake.read_table(spark, lake_dir, "plain").collect()) == sorted(df.collect())


def test_app_version_replay_is_skipped(spark, lake_dir):
    path = lake.table_path(lake_dir, "m")
    batch = _messages(12)
    r1 = lake.write_table(_df(spark, batch), lake_dir, "m", partition_by=MESSAGES_PARTITION_BY,
                          schema=MESSAGES_SCHEMA, app_id="ingest-1", app_version=5)
    assert (r1.committed, r1.version) == (True, 0)
    assert lake.app_version(lake_dir, "m", "ingest-1") == 5
    assert lake.app_version(lake_dir, "m", "other") is None
    files_before = _data_files(path)

    # replay through the API: skipped up front
    r2 = lake.write_table(_df(spark, batch), lake_dir, "m", partition_by=MESSAGES_PARTITION_BY,
                          schema=MESSAGES_SCHEMA, app_id="ingest-1", app_version=5)
    assert (r2.committed, r2.skipped, r2.version) == (False, True, 0)

    # replay straight through the data source: the executors write, the driver's commit refuses
    result_file = os.path.join(lake_dir, "..", "result.json")
    (_df(spark, batch).write.format(delta_writer.FORMAT_NAME).mode("append")
     .option("partitionBy", json.dumps(MESSAGES_PARTITION_BY))
     .option("arrowSchema", delta_writer.encode_schema(MESSAGES_SCHEMA))
     .option("appId", "ingest-1").option("appVersion", "4")
     .option("resultFile", result_file).save(path))
    with open(result_file) as fh:
        report = json.load(fh)
    assert (report["committed"], report["skipped"], report["version"]) == (False, True, 0)
    assert DeltaTable(path).version() == 0
    assert _data_files(path) == files_before  # the replay's files were deleted

    # the next version commits, and the txn is stored with it
    r3 = lake.write_table(_df(spark, _messages(6, 500)), lake_dir, "m",
                          partition_by=MESSAGES_PARTITION_BY, schema=MESSAGES_SCHEMA,
                          app_id="ingest-1", app_version=6)
    assert (r3.committed, r3.version, r3.num_rows) == (True, 1, 6)
    assert lake.app_version(lake_dir, "m", "ingest-1") == 6
    assert DeltaTable(path).to_pyarrow_table().num_rows == 18
    assert set(DeltaTable(path).file_uris()) == _data_files(path)


def _failing_source():
    """A data source whose task for Spark partition 1 writes its files and then fails, while the
    task for partition 0 only starts writing after the driver has aborted the job."""
    import time

    from pyspark import TaskContext

    class FailingWriter(delta_writer.DeltaArrowWriter):
        def write(self, iterator):
            if TaskContext.get().partitionId() == 0:
                time.sleep(2)
            message = super().write(iterator)
            if TaskContext.get().partitionId() == 1:
                raise RuntimeError("injected executor failure")
            return message

    class FailingSource(delta_writer.RocketlakeDeltaDataSource):
        @classmethod
        def name(cls):
            return "rocketlake_delta_failing"

        def writer(self, schema, overwrite):
            writer = super().writer(schema, overwrite)
            writer.__class__ = FailingWriter
            return writer

    return FailingSource


def test_executor_failure_aborts_and_leaves_table_unchanged(spark, lake_dir):
    path = lake.table_path(lake_dir, "m")
    lake.write_table(_df(spark, _messages(9)), lake_dir, "m", partition_by=MESSAGES_PARTITION_BY,
                     schema=MESSAGES_SCHEMA)
    files_before = _data_files(path)
    spark.dataSource.register(_failing_source())
    result_file = os.path.join(lake_dir, "..", "abort.json")
    with pytest.raises(Exception, match="injected executor failure"):
        (_df(spark, _messages(30, 100)).write.format("rocketlake_delta_failing").mode("append")
         .option("partitionBy", json.dumps(MESSAGES_PARTITION_BY))
         .option("arrowSchema", delta_writer.encode_schema(MESSAGES_SCHEMA))
         .option("resultFile", result_file).save(path))
    with open(result_file) as fh:
        assert json.load(fh)["reason"] == "aborted: a write task failed"
    time.sleep(3)  # let a straggler task (partition 0) finish: it must clean up after itself
    assert DeltaTable(path).version() == 0
    assert _data_files(path) == files_before
    assert DeltaTable(path).to_pyarrow_table().num_rows == 9


def test_upstream_task_failure_through_write_table(spark, lake_dir):
    from pyspark.sql import functions as F

    @F.udf("long")
    def boom(x):
        if x == 25:
            raise ValueError("bad row 25")
        return x

    df = spark.range(0, 30, 1, numPartitions=3).select(boom("id").alias("id"))
    with pytest.raises(Exception, match="bad row 25"):
        lake.write_table(df, lake_dir, "ids")
    path = lake.table_path(lake_dir, "ids")
    assert not DeltaTable.is_deltatable(path)
    assert _data_files(path) == set()
    assert lake.table_version(lake_dir, "ids") is None


def test_write_table_validates_arguments(spark, lake_dir):
    df = spark.range(3)
    with pytest.raises(ValueError):
        lake.write_table(df, lake_dir, "x", app_id="a")
    with pytest.raises(ValueError):
        lake.write_table(df, lake_dir, "x", schema=pa.schema([("nope", pa.int64())]))
