"""The Spark data sources over a store: the golden store read through Spark, splits, pushdown,
consume queues and index files."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, IsNotNull, LessThan

from broker.store.columnar import DecodeStats
from pipelines.sources import register_sources
from pipelines.sources.rocketmq import CommitLogSplit, RocketMQReader, decode_split
from schemas.messages import MESSAGES_SCHEMA, RECORD_SCHEMA
from schemas.tables import CONSUME_QUEUE_SCHEMA, INDEX_ENTRIES_SCHEMA
from tests.conftest import load_expected
from tests.golden_fields import expected_row

WRAPPERS = ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC")


@pytest.fixture(scope="module")
def rmq(spark):
    register_sources(spark)
    return spark


def _load(spark, store, fmt="rocketmq", **options):
    options.setdefault("pushFilters", "true")  # each test builds a fresh DataFrame (see the xfail below)
    reader = spark.read.format(fmt)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load(str(store))


def _offsets(df) -> list[int]:
    return sorted(r[0] for r in df.select("commitlog_offset").collect())


# every RECORD field except the two host strings (Apache prints IPv6 hosts differently)
RECORD_KEYS = [n for n in RECORD_SCHEMA.names if n not in ("born_host", "store_host")]


def _comparable(row: dict) -> dict:
    out = {k: row[k] for k in RECORD_KEYS}
    out["properties"] = dict(row["properties"])
    return out


@pytest.fixture(scope="module")
def golden_table(rmq, golden_store) -> pa.Table:
    df = _load(rmq, golden_store, brokerName="broker-b", ingestRunId="run-7", splitBytes=300_000)
    return df.toArrow().sort_by("commitlog_offset")


def test_schema_is_the_messages_schema(rmq, golden_store, golden_table):
    df = _load(rmq, golden_store)
    assert df.columns == MESSAGES_SCHEMA.names
    assert golden_table.schema.names == MESSAGES_SCHEMA.names
    for got, want in zip(golden_table.schema, MESSAGES_SCHEMA):
        assert got.type == want.type, got.name


def test_every_record_field_matches_apache(golden_table, golden_records):
    assert golden_table.num_rows == len(golden_records) == 2001
    for row, e in zip(golden_table.to_pylist(), golden_records):
        assert _comparable(row) == expected_row(e)
    hosts = set(zip(golden_table["born_host"].to_pylist(), golden_table["store_host"].to_pylist()))
    assert ("[2001:db8::d9e6:108f]:52946", "192.168.0.10:10911") in hosts


def test_derived_columns(golden_table, golden_records):
    rows = golden_table.to_pylist()
    utc = dt.timezone.utc
    for row, e in zip(rows, golden_records):
        assert row["broker_name"] == "broker-b" and row["ingest_run_id"] == "run-7"
        assert row["born_time"] == dt.datetime.fromtimestamp(e["bornTimestamp"] / 1000, utc)
        assert row["store_time"] == dt.datetime.fromtimestamp(e["storeTimestamp"] / 1000, utc)
        assert row["store_date"] == row["store_time"].date()
        base = e["phyOffset"] // 1048576 * 1048576
        assert row["segment_file"] == str(base).zfill(20)
        topic = e["topic"]
        assert row["is_retry"] == topic.startswith("%RETRY%")
        assert row["is_dlq"] == topic.startswith("%DLQ%")
        group = topic.split("%", 2)[2] if row["is_retry"] or row["is_dlq"] else None
        assert row["consumer_group"] == group
        props = e["properties"]
        assert row["origin_msg_id"] == props.get("ORIGIN_MESSAGE_ID", props.get("DLQ_ORIGIN_MESSAGE_ID"))
    assert sum(r["is_retry"] for r in rows) == 47 and sum(r["is_dlq"] for r in rows) == 33
    retried = [r for r in rows if r["is_retry"] and r["origin_msg_id"]]
    assert retried and all(r["consumer_group"] == "groupA" for r in retried)
    # a few exact rows
    first = rows[0]
    assert (first["commitlog_offset"], first["segment_file"], first["store_date"]) == \
        (0, "00000000000000000000", dt.date(2026, 11, 21))
    assert rows[-1]["segment_file"] == "00000000000004194304"


@pytest.mark.parametrize("split_bytes", [1_048_576, 4_000_000])  # (300 000 in golden_table)
def test_split_sizes_give_the_same_rows(rmq, golden_store, golden_records, split_bytes):
    df = _load(rmq, golden_store, splitBytes=split_bytes)
    assert df.rdd.getNumPartitions() == 5  # a split never spans two segments
    assert _offsets(df) == [e["phyOffset"] for e in golden_records]


def test_tiny_splits_over_part_of_a_segment(rmq, golden_store, golden_records):
    """600-byte splits (smaller than most records) over [100 000, 136 000): each record once. The
    range starts inside a 104 580-byte record, so the first splits own no record at all."""
    df = _load(rmq, golden_store, splitBytes=600, fromOffset=100_000, untilOffset=136_000)
    assert df.rdd.getNumPartitions() == 61  # the split grid is aligned to multiples of 600
    want = [e["phyOffset"] for e in golden_records if 100_000 <= e["phyOffset"] < 136_000]
    assert len(want) == 27 and _offsets(df) == want


def test_from_until_offsets(rmq, golden_store, golden_records):
    lo, hi = golden_records[500]["phyOffset"] + 1, golden_records[1500]["phyOffset"]
    df = _load(rmq, golden_store, fromOffset=lo, untilOffset=hi, splitBytes=262_144)
    assert _offsets(df) == [e["phyOffset"] for e in golden_records if lo <= e["phyOffset"] < hi]
    assert df.rdd.getNumPartitions() < 20  # splits outside the range are not planned


# ---- pushdown ------------------------------------------------------------------------------------

def _no_spark_filter(df) -> bool:
    """The optimized plan has no Filter above the scan: Spark left the predicate to the source."""
    return "Filter" not in df._jdf.queryExecution().optimizedPlan().toString()


def test_topic_pushdown_is_exact(rmq, golden_store, golden_records):
    df = _load(rmq, golden_store).filter("topic = 'TopicOrders'")
    assert _no_spark_filter(df)
    assert _offsets(df) == [e["phyOffset"] for e in golden_records if e["topic"] == "TopicOrders"]
    # real_topic also finds delayed / half messages stored under the wrapper topics
    df = _load(rmq, golden_store).filter("real_topic = 'TopicOrders'")
    assert _no_spark_filter(df)
    want = [e["phyOffset"] for e in golden_records
            if (e["properties"].get("REAL_TOPIC") if e["topic"] in WRAPPERS else e["topic"]) == "TopicOrders"]
    assert _offsets(df) == want
    assert len(want) > len([e for e in golden_records if e["topic"] == "TopicOrders"])
    df = _load(rmq, golden_store).filter("topic IN ('TopicPayments', '%DLQ%groupA', 'nope')")
    assert _no_spark_filter(df)
    assert _offsets(df) == [e["phyOffset"] for e in golden_records
                            if e["topic"] in ("TopicPayments", "%DLQ%groupA")]
    df = _load(rmq, golden_store).filter("topic = 'TopicOrders' AND topic = 'TopicPayments'")
    assert df.count() == 0


def test_offset_and_timestamp_pushdown(rmq, golden_store, golden_records):
    lo, hi = golden_records[100]["phyOffset"], golden_records[1200]["phyOffset"]
    df = _load(rmq, golden_store, splitBytes=262_144).filter(
        f"commitlog_offset >= {lo} AND commitlog_offset < {hi}")
    assert _no_spark_filter(df)
    assert _offsets(df) == [e["phyOffset"] for e in golden_records[100:1200]]
    assert df.rdd.getNumPartitions() < 20  # whole splits dropped at planning
    df = _load(rmq, golden_store).filter(f"commitlog_offset > {lo} AND commitlog_offset <= {hi}")
    assert _offsets(df) == [e["phyOffset"] for e in golden_records[101:1201]]
    df = _load(rmq, golden_store).filter(f"commitlog_offset = {hi}")
    assert _offsets(df) == [hi]
    t0, t1 = golden_records[300]["storeTimestamp"], golden_records[900]["storeTimestamp"]
    df = _load(rmq, golden_store).filter(f"store_timestamp > {t0} AND store_timestamp <= {t1}")
    assert _no_spark_filter(df)
    assert _offsets(df) == [e["phyOffset"] for e in golden_records if t0 < e["storeTimestamp"] <= t1]
    # store_time narrows the decode but Spark re-checks it: still exact
    start = dt.datetime.fromtimestamp(t0 / 1000, dt.timezone.utc)
    df = _load(rmq, golden_store).filter(pa_lit_filter(start))
    assert _offsets(df) == [e["phyOffset"] for e in golden_records if e["storeTimestamp"] >= t0]


def pa_lit_filter(start: dt.datetime):
    from pyspark.sql import functions as F

    return F.col("store_time") >= F.lit(start)


def test_unpushed_filters_still_apply(rmq, golden_store, golden_records):
    df = _load(rmq, golden_store).filter("queue_id = 1 AND (is_retry OR is_dlq)")
    assert not _no_spark_filter(df)
    assert _offsets(df) == [e["phyOffset"] for e in golden_records
                            if e["queueId"] == 1 and e["topic"].startswith(("%RETRY%", "%DLQ%"))]
    assert _load(rmq, golden_store).filter("broker_name = 'other'").count() == 0
    assert _load(rmq, golden_store).filter("broker_name = 'broker-a'").count() == 2001


def test_pushdown_decodes_fewer_rows(golden_store, golden_records):
    """The reader itself: pushed filters shrink the decode (DecodeStats) and the split plan."""
    reader = RocketMQReader({"path": str(golden_store), "splitBytes": "262144", "pushFilters": "true"})
    filters = [EqualTo(("topic",), "TopicOrders"), IsNotNull(("topic",)),
               GreaterThanOrEqual(("commitlog_offset",), 1_048_576), LessThan(("commitlog_offset",), 3_145_728),
               In(("queue_id",), (1, 2))]
    assert list(reader.pushFilters(filters)) == [filters[-1]]
    parts = reader.partitions()
    assert all(isinstance(p, CommitLogSplit) for p in parts)
    assert len(parts) == 8 and {p.base for p in parts} == {1_048_576, 2_097_152}
    stats = DecodeStats()
    rows = sum(b.num_rows for p in parts for b in decode_split(p, reader.pushed, stats=stats))
    want = [e for e in golden_records if e["topic"] == "TopicOrders" and 1_048_576 <= e["phyOffset"] < 3_145_728]
    assert rows == len(want)
    # the decoder's topic filter keeps stored-or-real-topic matches (delayed/half messages too);
    # read() then applies the exact stored-topic condition
    real = [e for e in golden_records if 1_048_576 <= e["phyOffset"] < 3_145_728
            and (e["topic"] == "TopicOrders" or e["topic"] in WRAPPERS
                 and e["properties"].get("REAL_TOPIC") == "TopicOrders")]
    assert stats.rows == len(real) > rows
    in_range = sum(1 for e in golden_records if 1_048_576 <= e["phyOffset"] < 3_145_728)
    assert stats.records == in_range > stats.rows  # walked every record, built columns only for matches
    batches = [b for p in parts for b in reader.read(p)]
    assert all(b.schema == MESSAGES_SCHEMA for b in batches)


def test_file_uri_goes_through_pyarrow_fs(rmq, golden_store, golden_records):
    df = _load(rmq, golden_store.resolve().as_uri(), splitBytes=524_288, untilOffset=2_097_152)
    assert _offsets(df) == [e["phyOffset"] for e in golden_records if e["phyOffset"] < 2_097_152]


# ---- consume queues and index files -----------------------------------------------------------------

def test_consume_queue_units(rmq, golden_store, golden_expected):
    expected = load_expected(golden_expected, "expected_queues.json")["queues"]
    df = _load(rmq, golden_store, "rocketmq_consume_queue", brokerName="broker-a")
    assert df.columns == CONSUME_QUEUE_SCHEMA.names
    table = df.toArrow()
    assert table.schema.equals(CONSUME_QUEUE_SCHEMA)
    got: dict = {}
    for r in table.to_pylist():
        assert r["broker_name"] == "broker-a"
        got.setdefault(r["topic"], {}).setdefault(str(r["queue_id"]), []).append(
            [r["queue_offset"], r["commitlog_offset"], r["size"], r["tags_code"]])
    want = {t: {q: e["entries"] for q, e in qs.items() if e["entries"]} for t, qs in expected.items()}
    want = {t: qs for t, qs in want.items() if qs}
    assert {t: {q: sorted(v) for q, v in qs.items()} for t, qs in got.items()} == want
    assert table.num_rows == 1986


def test_consume_queue_file_uri(rmq, golden_store, golden_expected):
    expected = load_expected(golden_expected, "expected_queues.json")["queues"]
    df = _load(rmq, golden_store.resolve().as_uri(), "rocketmq_consume_queue").filter(
        "topic = 'TopicPayments' AND queue_id = 1")
    got = sorted([r.queue_offset, r.commitlog_offset, r.size, r.tags_code] for r in df.collect())
    assert got == expected["TopicPayments"]["1"]["entries"]


def test_index_entries(rmq, golden_store, golden_expected, golden_records):
    files = load_expected(golden_expected, "expected_index_files.json")["files"]
    df = _load(rmq, golden_store, "rocketmq_index")
    table = df.toArrow()
    assert table.schema.equals(INDEX_ENTRIES_SCHEMA)
    counts: dict[str, int] = {}
    for name in table["index_file"].to_pylist():
        counts[name] = counts.get(name, 0) + 1
    assert counts == {f["name"]: f["indexCount"] - 1 for f in files}
    offsets = {e["phyOffset"] for e in golden_records}
    by_file = {f["name"]: f for f in files}
    for r in table.to_pylist():
        f = by_file[r["index_file"]]
        assert r["commitlog_offset"] in offsets
        assert r["store_timestamp"] >= f["beginTimestamp"]
        assert (r["store_timestamp"] - f["beginTimestamp"]) % 1000 == 0  # timeDiff is in seconds
        assert 0 <= r["prev_index"] < f["indexCount"]
        assert r["broker_name"] == "broker-a"
    uri = _load(rmq, golden_store.resolve().as_uri(), "rocketmq_index").filter(
        f"index_file = '{files[-1]['name']}'")
    assert uri.count() == files[-1]["indexCount"] - 1


# ---- PySpark 4.2.0: pushdown state leaks between queries of one DataFrame ----------------------------

@pytest.mark.xfail(reason="PySpark 4.2.0 stores the read planned during filter pushdown on the relation's "
                          "PythonDataSourceV2 and reuses it for a later scan that pushes nothing",
                   strict=False)
def test_reused_dataframe_after_pushdown(rmq, golden_store):
    df = _load(rmq, golden_store)
    assert df.filter("topic = 'TopicOrders'").count() == 636
    assert df.count() == 2001  # 636 on PySpark 4.2.0


def test_pushdown_off_makes_reuse_safe(rmq, golden_store):
    df = _load(rmq, golden_store, pushFilters="false")
    filtered = df.filter("topic = 'TopicOrders'")
    assert "Filter" in filtered._jdf.queryExecution().optimizedPlan().toString()  # Spark filters
    assert filtered.count() == 636
    assert df.count() == 2001


def test_findings_format_reports_each_damaged_region_once(rmq, golden_store, golden_records, tmp_path):
    import shutil

    store = tmp_path / "store"
    shutil.copytree(golden_store, store)
    seg = store / "commitlog" / "00000000000000000000"
    a, b = golden_records[50]["phyOffset"], golden_records[53]["phyOffset"]
    data = bytearray(seg.read_bytes())
    data[a:b] = bytes(b - a)  # three records zeroed
    seg.write_bytes(bytes(data))
    rows = [r.asDict() for r in _load(rmq, store, "rocketmq_findings", brokerName="b9", ingestRunId="r1").collect()]
    assert [(r["broker_name"], r["file"], r["offset"], r["reason"].split(":")[0], r["bytes_skipped"],
             r["ingest_run_id"]) for r in rows] == [("b9", str(seg), a, "corrupt_region", b - a, "r1")]
    # an offset range after the damage finds nothing
    assert _load(rmq, store, "rocketmq_findings", fromOffset=b).count() == 0
