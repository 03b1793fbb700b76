"""The delta-rs Spark data source (pipelines.sources.delta) and the lake views (pipelines.sql.views),
on a lake ingested from the golden store."""

from __future__ import annotations

import datetime as dt
import shutil
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNull, LessThan

from pipelines.ingest import ingest
from pipelines.job_args import StoreSpec
from pipelines.lake import append_arrow, scan_arrow
from pipelines.sources.delta import (
    FORMAT_NAME,
    DeltaRsScan,
    FileGroup,
    load_delta,
    needs_delta_rs,
    plan_scan,
    register,
)
from pipelines.sql.views import lake_table_paths, register_lake_views

CQ_KEY = ["broker_name", "topic", "queue_id", "queue_offset"]


@pytest.fixture(scope="module")
def lake(spark, golden_store, tmp_path_factory):
    lake = tmp_path_factory.mktemp("delta_source_lake")
    [summary] = ingest(spark, [StoreSpec("broker-a", str(golden_store))], str(lake), split_bytes=1 << 20)
    assert summary.rows["messages"] == 2001 and summary.rows["consume_queue"] == 1986
    return lake


@pytest.fixture()
def cq_copy(lake, tmp_path):
    """A private copy of consume_queue (partitioned by broker_name) that a test may append to."""
    lake2 = tmp_path / "lake"
    shutil.copytree(lake / "consume_queue", lake2 / "consume_queue")
    return lake2


def _as_broker(table: pa.Table, broker: str) -> pa.Table:
    i = table.schema.get_field_index("broker_name")
    return table.set_column(i, table.schema.field(i), pa.array([broker] * table.num_rows, pa.string()))


def _sorted(table: pa.Table, keys: list[str]) -> pa.Table:
    return table.sort_by([(k, "ascending") for k in keys])


def test_messages_same_rows_as_deltalake(spark, lake):
    got = load_delta(spark, lake / "messages").toArrow()
    want = scan_arrow(lake, "messages")
    assert got.schema.equals(want.schema)  # map, list, binary, timestamp[us, UTC], date, partition cols
    assert got.num_rows == 2001
    assert _sorted(got, ["commitlog_offset"]).equals(_sorted(want, ["commitlog_offset"]))


def test_partitioned_table_same_rows_as_deltalake(spark, lake):
    got = load_delta(spark, f"file://{lake / 'consume_queue'}").toArrow()  # a file:// URI works too
    want = scan_arrow(lake, "consume_queue")
    assert got.num_rows == 1986
    assert _sorted(got, CQ_KEY).equals(_sorted(want, CQ_KEY))


def test_declared_schema_reads_only_those_columns(spark, lake):
    df = (spark.read.format(FORMAT_NAME).schema("queue_offset BIGINT, broker_name STRING, topic STRING")
          .load(str(lake / "consume_queue")))
    got = df.toArrow()
    want = scan_arrow(lake, "consume_queue", columns=["queue_offset", "broker_name", "topic"])
    assert got.column_names == ["queue_offset", "broker_name", "topic"]
    keys = ["topic", "queue_offset"]
    assert _sorted(got, keys).to_pylist() == _sorted(want, keys).to_pylist()


def test_partition_filter_prunes_files(spark, cq_copy):
    path = cq_copy / "consume_queue"
    a_rows = scan_arrow(cq_copy, "consume_queue")
    append_arrow(cq_copy, "consume_queue", _as_broker(a_rows.slice(0, 100), "broker-b"), partition_by=["broker_name"])
    plan_all = plan_scan(str(path))
    plan_b = plan_scan(str(path), filters=[EqualTo(("broker_name",), "broker-b")])
    b_files = [f for f in plan_all.files if "broker_name=broker-b/" in f.path]
    assert plan_all.total_files == len(plan_all.files) > len(b_files) == 1
    assert [f.path for f in plan_b.files] == [f.path for f in b_files]
    assert plan_scan(str(path), filters=[In(("broker_name",), ("x", "y"))]).files == []
    assert plan_scan(str(path), filters=[IsNull(("broker_name",))]).files == []

    # through Spark: one file per task (maxPartitionBytes=1), so the task count is the file count
    df = load_delta(spark, path, maxPartitionBytes=1)
    assert df.rdd.getNumPartitions() == plan_all.total_files
    only_b = df.filter("broker_name = 'broker-b'")
    assert only_b.rdd.getNumPartitions() == 1
    assert only_b.count() == 100
    assert df.filter("broker_name = 'broker-a'").count() == 1986
    assert df.count() == 2086  # the same DataFrame after filtered queries: every file again


def test_stats_filter_prunes_files(spark, lake, golden_records):
    path = str(lake / "messages")
    everything = plan_scan(path)
    high = plan_scan(path, filters=[GreaterThanOrEqual(("commitlog_offset",), 4_000_000)])
    assert everything.total_files == len(everything.files) >= 3
    assert 1 <= len(high.files) < everything.total_files
    for f in high.files:
        assert dict((c, hi) for c, lo, hi, n in f.stats)["commitlog_offset"] >= 4_000_000
    assert plan_scan(path, filters=[LessThan(("commitlog_offset",), 0)]).files == []

    want = sum(1 for e in golden_records if e["phyOffset"] >= 4_000_000)
    df = load_delta(spark, path, maxPartitionBytes=1)
    high_df = df.filter("commitlog_offset >= 4000000")
    assert high_df.rdd.getNumPartitions() == len(high.files)
    assert high_df.count() == want
    assert df.count() == 2001


def test_timestamp_and_string_stats(spark, lake):
    path = str(lake / "messages")
    table = scan_arrow(lake, "messages", columns=["store_time", "topic"])
    times = sorted(table.column("store_time").to_pylist())
    cut = times[len(times) * 3 // 4]
    late = plan_scan(path, filters=[GreaterThan(("store_time",), cut)])
    assert len(late.files) < late.total_files
    df = load_delta(spark, path)
    want = pc.sum(pc.greater(table.column("store_time"), pa.scalar(cut, pa.timestamp("us", "UTC")))).as_py()
    assert df.filter(df.store_time > cut).count() == want
    assert plan_scan(path, filters=[EqualTo(("topic",), "zzz-no-such-topic")]).files == []
    assert df.filter("topic = 'TopicOrders'").count() == pc.sum(pc.equal(table.column("topic"), "TopicOrders")).as_py()


def test_view_sees_new_commits_and_survives_reuse(spark, cq_copy):
    path = cq_copy / "consume_queue"
    df = load_delta(spark, path)
    df.createOrReplaceTempView("cq_fresh")
    try:
        assert spark.sql("SELECT count(*) FROM cq_fresh").first()[0] == 1986
        # a filtered query plans with pruning; the next unfiltered one must not reuse that plan
        assert spark.sql("SELECT count(*) FROM cq_fresh WHERE broker_name = 'broker-x'").first()[0] == 0
        assert spark.sql("SELECT count(*) FROM cq_fresh").first()[0] == 1986
        assert df.filter("broker_name = 'broker-x'").count() == 0
        assert df.count() == 1986

        extra = _as_broker(scan_arrow(cq_copy, "consume_queue").slice(0, 7), "broker-c")
        append_arrow(cq_copy, "consume_queue", extra, partition_by=["broker_name"])
        assert spark.sql("SELECT count(*) FROM cq_fresh").first()[0] == 1993
        assert spark.sql("SELECT count(*) FROM cq_fresh WHERE broker_name = 'broker-c'").first()[0] == 7
        assert df.count() == 1993  # the DataFrame itself too
    finally:
        spark.catalog.dropTempView("cq_fresh")


def test_plain_format_without_guard_does_not_push(spark, lake):
    register(spark)
    df = spark.read.format(FORMAT_NAME).load(str(lake / "consume_queue"))
    assert df.filter("broker_name = 'broker-x'").count() == 0
    assert df.count() == 1986  # pushdown is off without planGuard: nothing was pruned for reuse


def test_register_lake_views(spark, lake):
    tables = register_lake_views(spark, lake, global_views=True)
    try:
        assert tables == lake_table_paths(lake)
        assert {"messages", "consume_queue", "index_entries", "ingest_runs"} <= set(tables)
        assert list(tables) == sorted(tables) and tables["messages"] == str(lake / "messages")
        views = {t.name for t in spark.catalog.listTables() if t.isTemporary}
        assert set(tables) <= views
        assert spark.sql("SELECT count(*) FROM messages").first()[0] == 2001
        assert spark.sql("SELECT count(*) FROM global_temp.consume_queue").first()[0] == 1986
        assert spark.sql("SELECT count(*) FROM ingest_runs").first()[0] == 1
    finally:
        for name in tables:
            spark.catalog.dropTempView(name)
            spark.catalog.dropGlobalTempView(name)


def test_lake_without_tables_is_a_value_error(spark, tmp_path):
    (tmp_path / "empty" / "not_a_table").mkdir(parents=True)
    with pytest.raises(ValueError, match=str(tmp_path / "empty")):
        register_lake_views(spark, tmp_path / "empty")
    with pytest.raises(ValueError, match="does not exist"):
        lake_table_paths(tmp_path / "missing")


def test_column_mapping_is_read_through_delta_rs(spark, tmp_path):
    path = tmp_path / "mapped"
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "a b": ["x", "y", None], "p": ["u", "u", "v"]})
    write_deltalake(str(path), data, partition_by=["p"], configuration={"delta.columnMapping.mode": "name"})
    plan = plan_scan(str(path))
    assert plan.delta_rs_reason == "column mapping mode 'name'"
    assert [type(p) for p in plan.partitions] == [DeltaRsScan]
    got = load_delta(spark, path).toArrow()
    assert _sorted(got, ["id"]).to_pylist() == data.to_pylist()


def test_reader_features_that_force_delta_rs():
    def proto(version, features):
        return SimpleNamespace(min_reader_version=version, reader_features=features)

    assert needs_delta_rs(proto(1, None), {}) is None
    assert needs_delta_rs(proto(3, ["timestampNtz", "deletionVectors"]), {}, lambda: False) is None
    assert needs_delta_rs(proto(3, ["deletionVectors"]), {}, lambda: True) == "deletion vectors"
    assert needs_delta_rs(proto(3, ["variantType"]), {}) == "reader features ['variantType']"
    assert needs_delta_rs(proto(2, None), {"delta.columnMapping.mode": "id"}) == "column mapping mode 'id'"
    assert needs_delta_rs(proto(3, ["columnMapping"]), {"delta.columnMapping.mode": "none"}) is None


def test_empty_filter_result_and_grouping(lake):
    path = str(lake / "messages")
    plan = plan_scan(path, max_partition_bytes=1)
    assert [len(p.files) for p in plan.partitions] == [1] * plan.total_files
    one = plan_scan(path, max_partition_bytes=1 << 30, open_cost=0, min_partitions=1)
    assert len(one.partitions) == 1 and isinstance(one.partitions[0], FileGroup)
    assert plan_scan(path, version=0).version == 0
    assert DeltaTable(path).version() == plan.version


def test_millisecond_timestamp_stats_do_not_drop_rows(spark, tmp_path):
    """delta-rs writes timestamp min/max truncated to milliseconds: .123456 is recorded as .123."""
    path = tmp_path / "ts"
    t = dt.datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=dt.timezone.utc)
    data = pa.table({"t": pa.array([t, t], pa.timestamp("us", "UTC")), "f": [float("nan"), 1.0]})
    write_deltalake(str(path), data)
    just_below = dt.datetime(2024, 1, 1, 0, 0, 0, 123400, tzinfo=dt.timezone.utc)
    assert len(plan_scan(str(path), filters=[GreaterThan(("t",), just_below)]).files) == 1
    df = load_delta(spark, path)
    assert df.filter(df.t > just_below).count() == 2
    assert df.filter("f > 5").count() == 1  # NaN is above every number in Spark; float stats say max 1.0


def test_unknown_declared_column_is_an_error(spark, lake):
    df = spark.read.format(FORMAT_NAME).schema("topic STRING, no_such_column INT").load(str(lake / "consume_queue"))
    with pytest.raises(Exception, match="no_such_column"):
        df.count()
