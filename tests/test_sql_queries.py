"""The ready-made queries (``pipelines/sql/queries/*.sql``): each runs on DuckDB, DataFusion and Spark with
the same answer, on a lake the report jobs built from Apache's golden store, and returns exactly the rows
the golden records (or a small synthetic lake with a known message path, lag history and audit findings)
imply."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from broker.cli import main, run_job
from pipelines.lake import append_arrow, scan_arrow
from pipelines.sql.engines import open_engine
from pipelines.sql.queries import find_query, list_queries
from pipelines.sql.statements import resolve_params, statements_of, substitute
from schemas.messages import MESSAGES_PARTITION_BY, MESSAGES_SCHEMA
from schemas.reports import AUDIT_FINDINGS_SCHEMA, CONSUMER_LAG_SCHEMA
from tests.golden_fields import expected_row

SNAPSHOTS = ("2030-01-01T00:00:00Z", "2030-01-01T01:00:00Z")
T0 = datetime(2030, 3, 1, 12, 0, tzinfo=timezone.utc)


def ms(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, timezone.utc)


# ---- lakes ------------------------------------------------------------------------------------------------
FINDINGS = [  # (broker, kind, file, offset, detail)
    ("broker-a", "crc_mismatch", "commitlog/00000000000001048576", 700, "stored 1 != computed 2"),
    ("broker-a", "crc_mismatch", "commitlog/00000000000000000000", 900, "stored 3 != computed 4"),
    ("broker-a", "crc_mismatch", "commitlog/00000000000000000000", 100, "stored 5 != computed 6"),
    ("broker-a", "cq_missing_unit", "consumequeue/TopicOrders/0/00000000000000000000", 40, "no unit for offset 2"),
    ("broker-b", "crc_mismatch", "commitlog/00000000000000000000", 64, "stored 7 != computed 8"),
]


@pytest.fixture(scope="module")
def golden_lake(tmp_path_factory, golden_store):
    """Ingest, two lag snapshots, the DLQ report; plus audit findings (the golden store has none)."""
    lake = str(tmp_path_factory.mktemp("queries") / "lake")
    store = ["--store", f"broker-a={golden_store}", "--lake", lake]
    assert run_job("ingest_commitlog.py", store) == 0
    for ts in SNAPSHOTS:
        assert run_job("consumer_lag.py", [*store, "--snapshot-ts", ts]) == 0
    assert run_job("dlq_report.py", [*store, "--no-ingest"]) == 0
    audited = T0 - timedelta(days=1)
    append_arrow(lake, "audit_findings", pa.Table.from_pylist(
        [{"audit_run_id": "run-1", "audited_at": audited, "broker_name": b, "kind": k, "file": f, "offset": o,
          "commitlog_offset": o, "topic": None, "queue_id": None, "detail": d} for b, k, f, o, d in FINDINGS],
        schema=AUDIT_FINDINGS_SCHEMA))
    return lake


def offset_msg_id(offset: int) -> str:
    return f"0A00000200002A9F{offset:016X}"


def message(offset: int, topic: str, second: int, *, real_topic=None, uniq=None, origin=None, reconsume=0,
            props=None) -> dict:
    """A ``messages`` row of broker b1, stored ``second`` seconds after T0."""
    stored = T0 + timedelta(seconds=second)
    props = dict(props or {})
    if uniq:
        props["UNIQ_KEY"] = uniq
    if origin:
        props["ORIGIN_MESSAGE_ID"] = origin
    retry, dlq = topic.startswith("%RETRY%"), topic.startswith("%DLQ%")
    return {"commitlog_offset": offset, "store_size": 200, "magic_code": -626843477, "body_crc": 0,
            "body_crc_ok": True, "queue_id": 0, "flag": 0, "queue_offset": offset // 1000, "sys_flag": 0,
            "transaction_type": "NOT", "compression": "NONE", "born_timestamp": int(T0.timestamp() * 1000),
            "store_timestamp": int(stored.timestamp() * 1000), "born_host": "10.0.0.1:5000",
            "store_host": "10.0.0.2:10911", "reconsume_times": reconsume, "prepared_transaction_offset": 0,
            "topic": topic, "real_topic": real_topic or topic, "properties": list(props.items()), "keys": [],
            "tags": None, "uniq_key": uniq, "offset_msg_id": offset_msg_id(offset), "body": b"payload",
            "born_time": T0, "store_time": stored, "broker_name": "b1", "store_date": stored.date(),
            "segment_file": "00000000000000000000", "ingest_run_id": "synthetic", "is_retry": retry, "is_dlq": dlq,
            "consumer_group": topic.split("%")[2] if retry or dlq else None, "origin_msg_id": origin}


U = "0A0000017F0000000000000000000001"  # the client message id
O1 = offset_msg_id(1000)                 # the original record's offset message id
CHAIN = [  # RocketMQ 4.x: send-back goes through SCHEDULE_TOPIC_XXXX to %RETRY%g, and at last to %DLQ%g
    message(1000, "Orders", 0, uniq=U),
    message(1500, "Orders", 1, uniq="0A0000017F0000000000000000000002"),  # another message
    message(2000, "SCHEDULE_TOPIC_XXXX", 2, real_topic="%RETRY%g", uniq=U, origin=O1, reconsume=1,
            props={"DELAY": "3", "RETRY_TOPIC": "Orders"}),
    message(3000, "%RETRY%g", 12, uniq=U, origin=O1, reconsume=1, props={"RETRY_TOPIC": "Orders"}),
    message(4000, "SCHEDULE_TOPIC_XXXX", 13, real_topic="%RETRY%g", uniq=U, origin=O1, reconsume=2,
            props={"DELAY": "4", "RETRY_TOPIC": "Orders"}),
    message(5000, "%RETRY%g", 43, uniq=U, origin=O1, reconsume=2, props={"RETRY_TOPIC": "Orders"}),
    message(6000, "%DLQ%g", 44, origin=O1, reconsume=3, props={"RETRY_TOPIC": "Orders"}),  # no UNIQ_KEY left
]
LAGS = {  # group -> one {queue: lag} per snapshot (None: absent from that snapshot)
    "growing": [{0: 5, 1: 5}, {0: 10, 1: 10}, {0: 30, 1: 20}],
    "shrinking": [{0: 100}, {0: 80}, {0: 60}],
    "fresh": [None, None, {0: 7}],
    "steady": [None, {0: 3}, {0: 3}],
    "caught_up": [None, None, {0: 0}],
}
SNAP_TS = [T0, T0 + timedelta(hours=1), T0 + timedelta(hours=2)]


@pytest.fixture(scope="module")
def synthetic_lake(tmp_path_factory):
    lake = str(tmp_path_factory.mktemp("synthetic") / "lake")
    append_arrow(lake, "messages", pa.Table.from_pylist(CHAIN, schema=MESSAGES_SCHEMA),
                 partition_by=MESSAGES_PARTITION_BY)
    for i, ts in enumerate(SNAP_TS):  # one commit per snapshot, as the lag job makes them
        rows = [{"snapshot_ts": ts, "snapshot_id": f"lag-{i}", "broker_name": "b1", "consumer_group": group,
                 "topic": "Orders", "queue_id": q, "consumer_offset": 100, "min_offset": 0, "max_offset": 100 + lag,
                 "lag_messages": lag, "next_store_timestamp_ms": None, "newest_store_timestamp_ms": None,
                 "lag_seconds": float(lag) / 10 + q, "lost_messages": 0, "offset_source": "consumerOffset.json"}
                for group, history in LAGS.items() if history[i] is not None for q, lag in history[i].items()]
        append_arrow(lake, "consumer_lag", pa.Table.from_pylist(rows, schema=CONSUMER_LAG_SCHEMA))
    return lake


@pytest.fixture(scope="module")
def synthetic_dlq(synthetic_lake, spark):
    """The DLQ report's rows and the Orders payload table (bodies declared as text) of the chain."""
    from pipelines.payloads.declarations import parse_declarations
    from pipelines.payloads.rows import payload_batches
    from pipelines.reports.dlq import dlq_messages
    from pipelines.storage import Location
    from schemas.reports import DLQ_MESSAGES, DLQ_MESSAGES_SCHEMA

    chain = pa.Table.from_pylist(CHAIN, schema=MESSAGES_SCHEMA)
    dlq = dlq_messages(spark.createDataFrame(chain)).toArrow().cast(DLQ_MESSAGES_SCHEMA)
    append_arrow(synthetic_lake, "dlq_messages", dlq, partition_by=list(DLQ_MESSAGES.partition_by))
    declared = parse_declarations(b'[topics.Orders]\nformat = "text"\n', Location.parse(synthetic_lake))
    for batch in chain.to_batches():
        for table, rows in payload_batches(batch, declared):
            append_arrow(synthetic_lake, table, pa.Table.from_batches([rows]),
                         partition_by=list(declared.get("Orders").contract.partition_by))
    return synthetic_lake


def _open_all(lake, spark):
    return {"duckdb": open_engine("duckdb", lake), "datafusion": open_engine("datafusion", lake),
            "spark": open_engine("spark", lake, spark=spark)}


@pytest.fixture(scope="module")
def golden(golden_lake, spark):
    engines = _open_all(golden_lake, spark)
    yield engines
    for engine in engines.values():
        engine.close()


@pytest.fixture(scope="module")
def synthetic(synthetic_lake, synthetic_dlq, spark):
    engines = _open_all(synthetic_lake, spark)
    yield engines
    for engine in engines.values():
        engine.close()


def saved(engine, name: str, **params) -> list[dict]:
    """Run a ready-made query the way ``rocketlake sql --saved NAME --param …`` does."""
    text = find_query(name).text()
    escapes = engine.backslash_escapes
    values = resolve_params(text, {k: str(v) for k, v in params.items()}, backslash_escapes=escapes)
    [statement] = statements_of(text, backslash_escapes=escapes)
    result = engine.execute(substitute(statement.padded(), values, escape_literal=engine.escape_literal,
                                       backslash_escapes=escapes))
    return pa.Table.from_batches(list(result.batches), result.schema).to_pylist(maps_as_pydicts="lossy")


def on_all(engines, name: str, **params) -> list[dict]:
    answers = {engine_name: saved(engine, name, **params) for engine_name, engine in engines.items()}
    assert answers["duckdb"] == answers["datafusion"], name
    assert answers["duckdb"] == answers["spark"], name
    return answers["duckdb"]


# ---- every query, every engine, through the CLI too ---------------------------------------------------------
# queries that need what the golden store lacks (its dead letters' originals are not in it): run on the
# synthetic lake instead
ON_SYNTHETIC = {"dlq_payloads": {"payload_table": "payload_orders"}}


def test_every_query_has_a_header_and_runs_everywhere(golden, golden_lake, synthetic, synthetic_lake, capsys,
                                                      golden_records):
    dlq_id = next(e["uniqKey"] for e in golden_records if e["topic"].startswith("%DLQ%"))
    params = {"message_path": {"id": dlq_id}}
    queries = list_queries()
    assert len(queries) >= 6
    for query in queries:
        assert query.title and query.tables and query.engines == "duckdb, datafusion, spark", query.name
        assert f"rocketlake sql --lake LAKE --saved {query.name}" in query.text()
        engines, lake, given = ((synthetic, synthetic_lake, ON_SYNTHETIC[query.name]) if query.name in ON_SYNTHETIC
                                else (golden, golden_lake, params.get(query.name, {})))
        expected = on_all(engines, query.name, **given)
        assert expected, f"{query.name} returned no rows on the golden lake"
        argv = ["sql", "--lake", lake, "--saved", query.name, "--format", "json"]
        for key, value in given.items():
            argv += ["--param", f"{key}={value}"]
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert len(out.splitlines()) == len(expected), query.name
        assert all(isinstance(json.loads(line), dict) for line in out.splitlines())


def test_run_from_the_file_too(golden_lake, capsys):
    path = find_query("dlq_volume").path
    assert main(["sql", "--lake", golden_lake, "-f", str(path), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("store_date,broker_name,consumer_group,original_topic,messages")
    assert len(lines) == 1 + 3


# ---- exact rows from the golden records --------------------------------------------------------------------
def _queue_units(golden_expected):
    units = json.loads((golden_expected / "expected_queues.json").read_text())["queues"]
    return {u[1]: (topic, int(qid), u[0], u[2], u[3]) for topic, queues in units.items()
            for qid, data in queues.items() for u in data["entries"]}


@pytest.mark.parametrize("key", ["order-1", "0A01020310921234ABCD47B78A29032D", "C0A8000A00002A9F0000000000000866"])
def test_message_by_key(key, golden, golden_records, golden_expected):
    units = _queue_units(golden_expected)
    expected = []
    for e in golden_records:
        r = expected_row(e)
        if key in r["keys"] or r["uniq_key"] == key or r["offset_msg_id"] == key:
            unit = units.get(e["phyOffset"], (None,) * 5)
            expected.append({"broker_name": "broker-a", "topic": r["topic"], "real_topic": r["real_topic"],
                             "queue_id": r["queue_id"], "queue_offset": r["queue_offset"],
                             "commitlog_offset": r["commitlog_offset"], "store_time": ms(r["store_timestamp"]),
                             "tags": r["tags"], "keys": r["keys"], "uniq_key": r["uniq_key"],
                             "offset_msg_id": r["offset_msg_id"], "cq_topic": unit[0], "cq_queue_id": unit[1],
                             "cq_queue_offset": unit[2], "cq_size": unit[3], "cq_tags_code": unit[4]})
    assert expected and len(expected) < 100
    assert on_all(golden, "message_by_key", key=key) == expected


def test_message_by_key_uniq_key_of_a_transaction(golden):
    rows = on_all(golden, "message_by_key", key="0A01020310921234ABCD47B78A29032D")
    assert [r["topic"] for r in rows] == ["RMQ_SYS_TRANS_HALF_TOPIC", "Topic_Events-v1"]  # half, then commit
    assert rows[0]["cq_topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"


def test_dlq_volume(golden, golden_records):
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for e in golden_records:
        if e["topic"].startswith("%DLQ%"):
            props = e["properties"]
            original = props.get("RETRY_TOPIC") or props.get("DLQ_ORIGIN_TOPIC")
            groups[(ms(e["storeTimestamp"]).date(), e["topic"][len("%DLQ%"):], original)].append(e)
    expected = [{"store_date": day, "broker_name": "broker-a", "consumer_group": group, "original_topic": topic,
                 "messages": len(es), "distinct_originals": len({e["properties"]["ORIGIN_MESSAGE_ID"] for e in es}),
                 "first_dlq_time": ms(min(e["storeTimestamp"] for e in es)),
                 "last_dlq_time": ms(max(e["storeTimestamp"] for e in es)), "replayed": 0}
                for (day, group, topic), es in groups.items()]
    expected.sort(key=lambda r: (-r["messages"], r["broker_name"], r["consumer_group"], r["original_topic"]))
    assert sum(r["messages"] for r in expected) == 33
    assert on_all(golden, "dlq_volume") == expected
    assert on_all(golden, "dlq_volume", since="2026-11-22") == []


def test_dlq_payloads(synthetic):
    """The dead letter of the synthetic chain next to its original's typed row (payload_orders,
    text bodies), joined by the original's commitlog offset."""
    rows = on_all(synthetic, "dlq_payloads", payload_table="payload_orders")
    assert [(r["consumer_group"], r["original_topic"], r["dlq_commitlog_offset"], r["broker_name"],
             r["commitlog_offset"], r["offset_msg_id"], r["text"]) for r in rows] == [
        ("g", "Orders", 6000, "b1", 1000, O1, "payload")]
    assert on_all(synthetic, "dlq_payloads", payload_table="payload_orders", group="nobody") == []


def test_topic_bytes_per_day(golden, golden_records):
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for e in golden_records:
        groups[(ms(e["storeTimestamp"]).date(), expected_row(e)["real_topic"])].append(e)
    expected = [{"store_date": day, "broker_name": "broker-a", "topic": topic, "messages": len(es),
                 "bytes": sum(e["storeSize"] for e in es), "producers": len({e["bornHost"] for e in es}),
                 "first_store_time": ms(min(e["storeTimestamp"] for e in es)),
                 "last_store_time": ms(max(e["storeTimestamp"] for e in es))} for (day, topic), es in groups.items()]
    expected.sort(key=lambda r: (r["store_date"], -r["bytes"], r["broker_name"], r["topic"]))
    assert on_all(golden, "topic_bytes_per_day") == expected
    assert sum(r["messages"] for r in expected) == 2001


def test_lagging_groups_on_the_golden_lake(golden, golden_lake):
    lag = scan_arrow(golden_lake, "consumer_lag").to_pylist()
    latest = max(r["snapshot_ts"] for r in lag)
    sums: dict[str, int] = defaultdict(int)
    for r in lag:
        if r["snapshot_ts"] == latest:
            sums[r["consumer_group"]] += r["lag_messages"]
    rows = on_all(golden, "lagging_groups")
    assert [(r["consumer_group"], r["lag_messages"]) for r in rows] == \
        sorted(sums.items(), key=lambda kv: (-kv[1], kv[0]))
    assert {(r["trend"], r["change_since_previous"], r["latest_snapshot"]) for r in rows} == {("steady", 0, latest)}
    assert rows[0]["lag_messages"] > 0


def test_audit_findings_by_kind(golden):
    assert on_all(golden, "audit_findings_by_kind") == [
        {"broker_name": "broker-a", "kind": "crc_mismatch", "findings": 3, "files": 2,
         "example_file": "commitlog/00000000000000000000", "example_offset": 100,
         "example_detail": "stored 5 != computed 6", "audited_at": T0 - timedelta(days=1)},
        {"broker_name": "broker-a", "kind": "cq_missing_unit", "findings": 1, "files": 1,
         "example_file": "consumequeue/TopicOrders/0/00000000000000000000", "example_offset": 40,
         "example_detail": "no unit for offset 2", "audited_at": T0 - timedelta(days=1)},
        {"broker_name": "broker-b", "kind": "crc_mismatch", "findings": 1, "files": 1,
         "example_file": "commitlog/00000000000000000000", "example_offset": 64,
         "example_detail": "stored 7 != computed 8", "audited_at": T0 - timedelta(days=1)},
    ]


def test_message_path_of_a_golden_dead_letter(golden, golden_records):
    dead = next(e for e in golden_records if e["topic"].startswith("%DLQ%"))
    rows = on_all(golden, "message_path", id=dead["offsetMsgId"])
    assert [(r["step"], r["stage"], r["commitlog_offset"], r["retry_topic"]) for r in rows] == \
        [(1, "dead letter", dead["phyOffset"], dead["properties"]["RETRY_TOPIC"])]


# ---- exact rows from the synthetic lake ---------------------------------------------------------------------
PATH = [  # step, stage, topic, real_topic, commitlog offset, reconsume times, DELAY, consumer group, uniq key
    (1, "sent", "Orders", "Orders", 1000, 0, None, None, U),
    (2, "scheduled", "SCHEDULE_TOPIC_XXXX", "%RETRY%g", 2000, 1, "3", None, U),
    (3, "redelivered", "%RETRY%g", "%RETRY%g", 3000, 1, None, "g", U),
    (4, "scheduled", "SCHEDULE_TOPIC_XXXX", "%RETRY%g", 4000, 2, "4", None, U),
    (5, "redelivered", "%RETRY%g", "%RETRY%g", 5000, 2, None, "g", U),
    (6, "dead letter", "%DLQ%g", "%DLQ%g", 6000, 3, None, "g", None),
]


@pytest.mark.parametrize("given", ["uniq key", "original id", "dlq record id", "retry record id"])
def test_message_path_through_retries_and_the_dlq(given, synthetic):
    id_ = {"uniq key": U, "original id": O1, "dlq record id": offset_msg_id(6000),
           "retry record id": offset_msg_id(3000)}[given]
    rows = on_all(synthetic, "message_path", id=id_)
    got = [(r["step"], r["stage"], r["topic"], r["real_topic"], r["commitlog_offset"], r["reconsume_times"],
            r["delay_level"], r["consumer_group"], r["uniq_key"]) for r in rows]
    assert got == PATH
    assert [r["origin_msg_id"] for r in rows] == [None] + [O1] * 5
    assert [r["store_time"] for r in rows] == [T0 + timedelta(seconds=s) for s in (0, 2, 12, 13, 43, 44)]
    assert {r["retry_topic"] for r in rows[1:]} == {"Orders"}


def test_message_path_of_an_unknown_id_is_empty(synthetic):
    assert on_all(synthetic, "message_path", id="nope' OR '1'='1") == []  # the value stays inside its literal


def test_lagging_groups_trend(synthetic):
    t1, t2, t3 = SNAP_TS
    rows = on_all(synthetic, "lagging_groups")
    got = [(r["consumer_group"], r["queues"], r["lag_messages"], r["change_since_previous"], r["change_over_window"],
            r["window_start"], r["trend"], r["latest_snapshot"]) for r in rows]
    assert got == [
        ("shrinking", 1, 60, -20, -40, t1, "shrinking", t3),
        ("growing", 2, 50, 30, 40, t1, "growing", t3),
        ("fresh", 1, 7, None, 0, t3, "new", t3),
        ("steady", 1, 3, 0, 0, t2, "steady", t3),
        ("caught_up", 1, 0, None, 0, t3, "new", t3),
    ]
    assert rows[1]["max_lag_seconds"] == 2.0 + 1  # queue 1's 20 messages: 20 / 10 + 1
    top = on_all(synthetic, "lagging_groups", top=2, window=2)
    assert [(r["consumer_group"], r["change_over_window"], r["window_start"]) for r in top] == [
        ("shrinking", -20, t2), ("growing", 30, t2)]
