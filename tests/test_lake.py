"""Delta tables written from Spark through the delta-rs Python Data Source (no Delta Spark jar)."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pipelines import delta_writer, lake
from pipelines.delta_files import AddInfo, FileSetWriter
from pyspark import cloudpickle
from schemas.messages import MESSAGES_PARTITION_BY, MESSAGES_SCHEMA

# the Python workers cannot import this test module: ship what its writer classes use by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

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


class RecomputedStats:
    """The oracle: how the writer computed an ``add``'s statistics before they came from the
    Parquet footer (``pc.min_max`` over every batch written, merged; the same rules)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.num_records = 0
        self.min: dict = {}
        self.max: dict = {}
        self.nulls: dict[str, int] = {}
        self.no_minmax: set[str] = set()

    @staticmethod
    def _supported(typ: pa.DataType) -> bool:
        return (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_string(typ)
                or pa.types.is_large_string(typ) or pa.types.is_timestamp(typ) or pa.types.is_date(typ)
                or pa.types.is_boolean(typ) or pa.types.is_decimal(typ))

    @staticmethod
    def _value(value, typ: pa.DataType):
        if value is None:
            return None
        if pa.types.is_timestamp(typ):
            if value.tzinfo is not None:
                value = value.astimezone(UTC).replace(tzinfo=None)
            return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if pa.types.is_date(typ):
            return value.isoformat()
        if pa.types.is_decimal(typ):
            return float(value)
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return None
        return value

    def update(self, table: pa.Table) -> None:
        self.num_records += table.num_rows
        for f in self.schema:
            if not self._supported(f.type):
                continue
            col = table.column(f.name)
            self.nulls[f.name] = self.nulls.get(f.name, 0) + col.null_count
            if f.name in self.no_minmax or col.null_count == len(col):
                continue
            if pa.types.is_floating(f.type) and pc.any(pc.is_nan(col)).as_py():
                self.no_minmax.add(f.name)
                self.min.pop(f.name, None)
                self.max.pop(f.name, None)
                continue
            mm = pc.min_max(col)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if f.name not in self.min or lo < self.min[f.name]:
                self.min[f.name] = lo
            if f.name not in self.max or hi > self.max[f.name]:
                self.max[f.name] = hi

    def to_json(self) -> str:
        mins, maxs = {}, {}
        for f in self.schema:
            if f.name in self.min:
                lo, hi = self.min[f.name], self.max[f.name]
                if isinstance(lo, str) and len(lo) > 32:
                    lo = lo[:32]
                if isinstance(hi, str) and len(hi) > 32:
                    hi = None
                lo, hi = self._value(lo, f.type), self._value(hi, f.type)
                if lo is not None:
                    mins[f.name] = lo
                if hi is not None:
                    maxs[f.name] = hi
        return json.dumps({"numRecords": self.num_records, "minValues": mins, "maxValues": maxs,
                           "nullCount": dict(self.nulls)}, separators=(",", ":"))


STATS_EXTRA = pa.schema([("long_text", pa.string()), ("huge_text", pa.string()), ("score", pa.float64()),
                         ("ratio", pa.float64()), ("amount", pa.decimal128(12, 3)), ("ok", pa.bool_()),
                         ("tiny", pa.int8()), ("local_time", pa.timestamp("us")), ("event_date", pa.date32())])


def stats_table(n: int = 240) -> pa.Table:
    """Messages rows plus columns that exercise every statistics rule: strings over 32 characters,
    strings over Parquet's 4096-byte statistics limit, NaN, zeros, decimals, booleans, int8, naive
    timestamps, dates, nulls."""
    base = _messages(n)
    extra = {
        "long_text": [None if i % 7 == 0 else chr(97 + i % 26) * (20 + i % 30) + f"{i:04d}" for i in range(n)],
        "huge_text": [None if i % 13 == 0 else ("h" * 5000 + str(i) if i % 50 == 3 else f"t{i % 9}")
                      for i in range(n)],
        "score": [float("nan") if i % 37 == 5 else None if i % 11 == 0 else i * 0.5 - 20 for i in range(n)],
        "ratio": [(i % 10) / 4 for i in range(n)],
        "amount": [None if i % 6 == 1 else __import__("decimal").Decimal(f"{i - 100}.125") for i in range(n)],
        "ok": [None if i % 5 == 0 else i % 3 == 0 for i in range(n)],
        "tiny": [i % 100 - 50 for i in range(n)],
        "local_time": [dt.datetime(2024, 1, 1) + dt.timedelta(seconds=37 * i, microseconds=i) for i in range(n)],
        "event_date": [None if i % 8 == 0 else dt.date(2023, 12, 1) + dt.timedelta(days=i % 45) for i in range(n)],
    }
    for field in STATS_EXTRA:
        base = base.append_column(field, pa.array(extra[field.name], field.type))
    return base


def check_footer_stats(table) -> list[AddInfo]:
    """Write :func:`stats_table` through :class:`FileSetWriter` into ``table`` (a Location), many
    row groups per file; assert every file's footer statistics JSON equals the recomputed one."""
    data = stats_table()
    writer = FileSetWriter(table, data.schema, MESSAGES_PARTITION_BY, "part-00000-stats-a0")
    for start in range(0, data.num_rows, 17):
        writer.write(data.slice(start, 17))
    infos = writer.close()
    fs, root = table.filesystem()
    file_schema = pa.schema([f for f in data.schema if f.name not in MESSAGES_PARTITION_BY])
    for info in infos:
        with fs.open_input_file(f"{root}/{info.path}") as fh:
            pf = pq.ParquetFile(fh)
            assert pf.metadata.num_row_groups > 1
            oracle = RecomputedStats(file_schema)
            for i in range(pf.metadata.num_row_groups):
                oracle.update(pf.read_row_group(i))
        assert info.stats == oracle.to_json(), info.path
        assert info.num_records == oracle.num_records
    assert sum(i.num_records for i in infos) == data.num_rows
    # the rules were exercised: NaN files have no score bounds, long strings only a min prefix,
    # strings beyond the footer's limit still have their bounds
    stats = [json.loads(i.stats) for i in infos]
    assert any("score" not in s["minValues"] and s["nullCount"]["score"] < s["numRecords"] for s in stats)
    assert any("score" in s["minValues"] for s in stats)
    assert any(len(s["minValues"]["long_text"]) == 32 and "long_text" not in s["maxValues"] for s in stats)
    assert any(s["minValues"]["huge_text"] == "h" * 32 and s["maxValues"]["huge_text"].startswith("t")
               for s in stats)
    assert all("body" not in s["nullCount"] and "properties" not in s["nullCount"] for s in stats)
    return infos


def test_footer_stats_equal_recomputed_stats(tmp_path):
    from pipelines.storage import Location

    infos = check_footer_stats(Location.parse(tmp_path / "t"))
    assert len(infos) == 9  # one file per (broker, date) partition


def test_dictionaries_only_on_repeated_strings(tmp_path):
    """A file's string columns get a Parquet dictionary when their values mostly repeat (judged on
    the first rows): topics and property names yes; ids, keys and property values no."""
    from pipelines.delta_files import dictionary_columns
    from pipelines.storage import Location

    n = 1000
    sample = pa.table({
        "topic": pa.array([f"t{i % 3}" for i in range(n)]),
        "msg_id": pa.array([f"id-{i}" for i in range(n)]),
        "props": pa.array([[("KEYS", f"k{i}"), ("TAGS", "a")] for i in range(n)],
                          pa.map_(pa.string(), pa.string())),
        "keys": pa.array([[f"k{i}", f"x{i}"] for i in range(n)], pa.list_(pa.string())),
        "n": pa.array(range(n), pa.int64()),
    })
    assert dictionary_columns(sample) == ["topic", "props.key_value.key"]
    writer = FileSetWriter(Location.parse(tmp_path / "t"), sample.schema, [], "part-00000-x")
    writer.write(sample)
    (info,) = writer.close()
    meta = pq.ParquetFile(tmp_path / "t" / info.path).metadata.row_group(0)
    dictionary = {meta.column(i).path_in_schema: meta.column(i).has_dictionary_page for i in range(meta.num_columns)}
    assert dictionary == {"topic": True, "msg_id": False, "props.key_value.key": True,
                          "props.key_value.value": False, "keys.list.element": False, "n": False}
    assert pq.read_table(tmp_path / "t" / info.path).equals(sample)
    stats = {meta.column(i).path_in_schema: meta.column(i).is_stats_set for i in range(meta.num_columns)}
    # statistics only where the Delta log takes them from the footer (not the nested columns)
    assert stats == {"topic": True, "msg_id": True, "props.key_value.key": False,
                     "props.key_value.value": False, "keys.list.element": False, "n": True}


def test_dictionary_columns_judges_the_first_rows_only():
    """Only the first DICTIONARY_SAMPLE_ROWS rows decide (a fixed cost per task): a column unique
    there gets no dictionary however repetitive its later rows are, and a null is not a value."""
    from pipelines.delta_files import DICTIONARY_SAMPLE_ROWS, dictionary_columns

    n = DICTIONARY_SAMPLE_ROWS
    sample = pa.table({
        "late_repeats": pa.array([f"u{i}" for i in range(n)] + ["same"] * (20 * n)),
        "nulls_and_one": pa.array([None if i % 2 else "x" for i in range(21 * n)], pa.string()),
        "all_null": pa.array([None] * (21 * n), pa.string()),
    })
    assert dictionary_columns(sample) == ["nulls_and_one", "all_null"]


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
    """A data source whose task for Spark partition 1 writes its files and then fails (the others
    write normally), so the driver aborts the job."""
    from pyspark import TaskContext

    class FailingWriter(delta_writer.DeltaArrowWriter):
        def write(self, iterator):
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
    options = {"path": path, "partitionBy": json.dumps(MESSAGES_PARTITION_BY),
               "arrowSchema": delta_writer.encode_schema(MESSAGES_SCHEMA), "resultFile": result_file}
    with pytest.raises(Exception, match="injected executor failure"):
        _df(spark, _messages(30, 100)).write.format("rocketlake_delta_failing").mode("append").options(**options).save()
    with open(result_file) as fh:
        assert json.load(fh)["reason"] == "aborted: a write task failed"
    assert DeltaTable(path).version() == 0
    assert _data_files(path) == files_before
    # A straggler: a task of the aborted job still writing after the abort (Spark may kill a
    # cancelled task's Python worker at any moment, so it is played here, in this process, with
    # the aborted job's id). Its first file makes it see the abort marker; it removes its files.
    (job_id,) = os.listdir(os.path.join(path, delta_writer.ABORT_MARKER_DIR))
    straggler = delta_writer.RocketlakeDeltaDataSource(options).writer(_df(spark, _messages(1)).schema, False)
    straggler.job_id = job_id
    with pytest.raises(RuntimeError, match=f"write job {job_id} was aborted"):
        straggler.write(iter(_messages(5, 500).to_batches()), part_id=7)
    assert DeltaTable(path).version() == 0
    assert _data_files(path) == files_before
    assert DeltaTable(path).to_pyarrow_table().num_rows == 9


def test_upstream_task_failure_through_write_table(failing_df, lake_dir):
    with pytest.raises(Exception, match="bad row 25"):
        lake.write_table(failing_df, lake_dir, "ids")
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


def test_session_jvm_runs_c1_only_with_the_full_code_cache(spark):
    """The session's JVM got the launch options: C1 only, and the tiered code cache (240 MiB) that
    C1-only would shrink to 48 MiB. A long-lived driver (this test session, the SQL server, a
    streaming ingest) filled the smaller one with generated code and died with "Out of space in
    CodeCache" (a clean-clone run of the suite, 2026-11-29)."""
    bean = spark._jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        spark._jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert bean.getVMOption("TieredStopAtLevel").getValue() == "1"
    assert bean.getVMOption("ReservedCodeCacheSize").getValue() == str(240 * 1024 * 1024)


def test_launch_conf_is_what_every_launcher_passes():
    """jobs/spark-submit.conf plus the driver's class archive (pipelines.spark_cds) is what every
    launcher passes: sessions and benchmarks (job_args), the Makefile's SUBMIT and the Airflow DAGs'
    config task (both ask ``python -m pipelines.job_args``, the one reader of the file)."""
    import json
    import shlex
    import subprocess

    from pipelines import spark_cds
    from pipelines.job_args import LAUNCH_CONF_FILE, conf_file_settings, launch_conf, launch_conf_args

    repo = Path(__file__).resolve().parents[1]
    assert LAUNCH_CONF_FILE == repo / "jobs" / "spark-submit.conf"
    java_options = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
    file_conf = {"spark.driver.extraJavaOptions": f"{java_options} -Xms96m", "spark.executor.extraJavaOptions": java_options}
    assert conf_file_settings() == file_conf
    archive = spark_cds.archive_path()
    option = f"-XX:SharedArchiveFile={archive}"  # make venv built it
    expected = {**file_conf, "spark.driver.defaultJavaOptions": option, "spark.executor.defaultJavaOptions": option}
    assert launch_conf() == expected
    args = [arg for name, value in expected.items() for arg in ("--conf", f"{name}={value}")]
    assert launch_conf_args() == args
    cli = subprocess.run([sys.executable, "-m", "pipelines.job_args", "--json"], cwd=repo, capture_output=True,
                         text=True, check=True)
    assert json.loads(cli.stdout) == expected
    make = subprocess.run(["make", "-s", "--eval", "print-launch: ; @echo $(SUBMIT)", "print-launch"],
                          cwd=repo, capture_output=True, text=True, check=True)
    assert shlex.split(make.stdout)[-len(args):] == args  # quoted for the eval in SUBMIT
    # the DAGs' config task (Airflow's Python cannot import pipelines: it runs the project's Python)
    sys.path.insert(0, str(repo / "airflow_dags"))
    try:
        from rocketlake_airflow.config import Settings
    finally:
        sys.path.remove(str(repo / "airflow_dags"))
    settings = Settings(str(repo), sys.executable, "/lake", (), "local[2]")
    assert settings.spark_conf() == {"spark.ui.showConsoleProgress": "false", "spark.log.level": "WARN", **expected}
