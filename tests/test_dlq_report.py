"""DLQ analysis (jobs/dlq_report.py, pipelines.reports.dlq).

The main test drives our broker with the Python client: two groups fail every message of a topic,
one with retryMaxTimes 2 and one with 1, so the store holds real send-back, schedule and DLQ records
(with the same original ids in both groups' retry topics). ``rocketlake dlq`` then ingests the store
and writes the tables; the expected rows are derived from the store by the offline decoder, in plain
Python, and from the producer's send results. The edge cases (5.x properties, POP retry topics, an
original no longer in the store, a message dead-lettered twice, several brokers) are rows built in
MESSAGES_SCHEMA; the summary arithmetic is checked on Arrow rows and against Spark's ``percentile``.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from broker.client import Admin, Message, Producer, PullConsumer, PushConsumer
from broker.remoting.bodies import ConsumeFromWhere
from broker.store.config_files import SubscriptionGroupConfig
from broker.store.constants import (
    PROPERTY_DELAY,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
)
from broker.store.inspect import MessageQuery, iter_messages
from broker.store.topics import SCHEDULE_TOPIC, consumer_group_of, dlq_topic, retry_topic
from pipelines.lake import replace_arrow
from pipelines.reports.dlq import dlq_messages, dlq_summary, exact_percentile, run_dlq_report
from schemas.messages import MESSAGES_SCHEMA
from schemas.reports import DLQ_MESSAGES_SCHEMA, DLQ_MESSAGES_TABLE, DLQ_SUMMARY_SCHEMA, DLQ_SUMMARY_TABLE
from tests.broker_harness import Recorder, cluster, drain, stored_messages, wait_until

UTC = dt.timezone.utc
TOPIC = "DlqTopic"
GROUPS = {"CG_DLQ_TWICE": 2, "CG_DLQ_ONCE": 1}  # group -> retryMaxTimes
N_MESSAGES = 5


def _ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, UTC)


# ---- a store written by the real broker ------------------------------------------------------------
@pytest.fixture(scope="module")
def failing_store(tmp_path_factory):
    """Store where every message of TOPIC went through the retry topics into both groups' DLQs."""
    tmp = tmp_path_factory.mktemp("dlq")
    with cluster(tmp, {"messageDelayLevel": "1s 1s 1s 1s 1s 1s"}) as broker:
        with Admin(broker.namesrv) as admin:
            for group, max_times in GROUPS.items():
                admin.create_subscription_group(broker.addr, SubscriptionGroupConfig(group, retry_max_times=max_times))
            admin.create_topic(broker.addr, TOPIC, queues=2)
        calls = {g: Recorder() for g in GROUPS}

        def failing(group):
            def listener(msg):
                calls[group].add(msg.offset_msg_id)
                raise RuntimeError("poison message")
            return listener

        # from the first offset: a send that lands before a group's queues are assigned is still consumed
        consumers = [PushConsumer(g, broker.namesrv, failing(g), topic=TOPIC,
                                  consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET) for g in GROUPS]
        with Admin(broker.namesrv) as admin:
            assert admin.wait_writable(TOPIC)  # routed: the consumers' first rebalance assigns its queues
        for c in consumers:
            c.start()
        try:
            with Producer("PG_DLQ", broker.namesrv) as producer:
                sent = [producer.send(Message(TOPIC, f"order {i}".encode(), tags="TagA" if i % 2 == 0 else "TagB",
                                              keys=[f"order-{i}", "common"])) for i in range(N_MESSAGES)]
            want = {g: (m + 1) * N_MESSAGES for g, m in GROUPS.items()}  # first delivery + m redeliveries
            deadline = time.monotonic() + 40
            assert {g: len(calls[g].wait_for(n, deadline)) for g, n in want.items()} == want
            with Admin(broker.namesrv) as admin:  # each group's last failure sends the message to its DLQ
                for g in GROUPS:
                    wait_until(lambda g=g: stored_messages(admin, broker.addr, dlq_topic(g)) >= N_MESSAGES,
                               f"{N_MESSAGES} records in {dlq_topic(g)}", max(1.0, deadline - time.monotonic()))
                    assert admin.wait_writable(dlq_topic(g))  # the reader finds the DLQ topic by its route
            with PullConsumer("CG_DLQ_READER", broker.namesrv) as reader:
                dead = {g: drain(reader, dlq_topic(g)) for g in GROUPS}
            assert {g: len(v) for g, v in dead.items()} == {g: N_MESSAGES for g in GROUPS}
        finally:
            for c in consumers:
                c.shutdown()
        assert {g: len(calls[g].items) for g in GROUPS} == want  # nothing delivered after the DLQ
    return broker.store, sent


def _expected_from_store(store: Path) -> tuple[list[dict], dict]:
    """dlq_messages rows as the definitions say, from the offline decoder (plain Python)."""
    records = list(iter_messages(store, MessageQuery()))
    for r in records:
        r["props"] = dict(r["properties"])
    by_offset_id = {r["offset_msg_id"]: r for r in records}
    rows = []
    for r in records:
        if not r["topic"].startswith("%DLQ%"):
            continue
        group = consumer_group_of(r["topic"])
        oid = r["props"][PROPERTY_ORIGIN_MESSAGE_ID]
        original = by_offset_id[oid]
        history = [h for h in records if h["props"].get(PROPERTY_ORIGIN_MESSAGE_ID) == oid
                   and h["commitlog_offset"] < r["commitlog_offset"]
                   and (h["topic"] == retry_topic(group)
                        or (h["topic"] == SCHEDULE_TOPIC and h["props"][PROPERTY_REAL_TOPIC] == retry_topic(group)))]
        rows.append({
            "broker_name": "broker-a", "consumer_group": group, "dlq_topic": r["topic"],
            "original_topic": r["props"][PROPERTY_RETRY_TOPIC], "msg_id": r["offset_msg_id"],
            "original_msg_id": oid, "uniq_key": r["uniq_key"], "keys": r["keys"], "tags": r["tags"],
            "reconsume_times": r["reconsume_times"], "first_born_time": _ts(original["born_timestamp"]),
            "original_store_time": _ts(original["store_timestamp"]), "dlq_store_time": _ts(r["store_timestamp"]),
            "time_to_dlq_s": (r["store_timestamp"] - original["born_timestamp"]) / 1000,
            "dlq_commitlog_offset": r["commitlog_offset"], "store_date": _ts(r["store_timestamp"]).date(),
            "retry_history": [{"attempt": h["reconsume_times"], "topic": h["topic"],
                               "commitlog_offset": h["commitlog_offset"], "store_time": _ts(h["store_timestamp"]),
                               "reconsume_times": h["reconsume_times"], "delay_level": int(h["props"][PROPERTY_DELAY])}
                              for h in history],
            "replayed_at": None, "replay_run_id": None,   # no replay_ledger in this lake
            "original_commitlog_offset": original["commitlog_offset"]})
    return rows, by_offset_id


def _table(lake: Path, name: str) -> pa.Table:
    return DeltaTable(str(lake / name)).to_pyarrow_table()


def test_broker_retries_into_dlq_end_to_end(spark, failing_store, tmp_path, capsys):
    store, sent = failing_store
    lake = tmp_path / "lake"
    # another broker's rows, there before the run: the run replaces only broker-a's
    other = pa.Table.from_pylist([{**{f.name: None for f in DLQ_MESSAGES_SCHEMA}, "broker_name": "broker-z",
                                   "store_date": dt.date(2024, 1, 1), "retry_history": []}], schema=DLQ_MESSAGES_SCHEMA)
    replace_arrow(str(lake), DLQ_MESSAGES_TABLE, other, partition_by=["store_date"])
    from broker.cli import main as rocketlake

    assert rocketlake(["dlq", "--store", f"broker-a={store}", "--lake", str(lake)]) == 0
    out = capsys.readouterr().out
    assert spark.sparkContext._jsc is not None  # the job left the test session running

    expected, by_offset_id = _expected_from_store(store)
    got = _table(lake, DLQ_MESSAGES_TABLE)
    assert got.schema == DLQ_MESSAGES_SCHEMA
    assert sorted(got["broker_name"].to_pylist()) == ["broker-a"] * 10 + ["broker-z"]
    rows = sorted((r for r in got.to_pylist() if r["broker_name"] == "broker-a"),
                  key=lambda r: r["dlq_commitlog_offset"])
    assert rows == expected
    # what the producer and the broker's retry rules say, independently of the decoder
    sent_ids = sorted(r.offset_msg_id for r in sent)
    for group, max_times in GROUPS.items():
        mine = [r for r in rows if r["consumer_group"] == group]
        assert sorted(r["original_msg_id"] for r in mine) == sent_ids
        for r in mine:
            original = by_offset_id[r["original_msg_id"]]
            assert (r["dlq_topic"], r["original_topic"], r["reconsume_times"]) == (
                dlq_topic(group), TOPIC, max_times + 1)
            assert r["keys"] == original["keys"] and r["tags"] == original["tags"]
            assert r["uniq_key"] == original["uniq_key"]
            # each redelivery: the send-back record in SCHEDULE_TOPIC_XXXX, then the schedule
            # service's copy in %RETRY%<group>, both with attempt = reconsume times, DELAY 3 + n - 1
            assert [(h["attempt"], h["topic"], h["delay_level"]) for h in r["retry_history"]] == [
                (n, t, 2 + n) for n in range(1, max_times + 1) for t in (SCHEDULE_TOPIC, retry_topic(group))]
            times = [r["original_store_time"]] + [h["store_time"] for h in r["retry_history"]] + [r["dlq_store_time"]]
            assert times == sorted(times) and r["first_born_time"] <= r["original_store_time"]
            assert r["time_to_dlq_s"] == (r["dlq_store_time"] - r["first_born_time"]) / dt.timedelta(seconds=1)
            assert r["time_to_dlq_s"] >= max_times  # a 1 s delay level per redelivery

    summary = _table(lake, DLQ_SUMMARY_TABLE)
    assert summary.schema == DLQ_SUMMARY_SCHEMA
    srows = sorted(summary.to_pylist(), key=lambda r: r["consumer_group"])
    assert len(srows) == 2  # both groups, one day (a run across UTC midnight would make 3-4)
    for s in srows:
        secs = sorted(r["time_to_dlq_s"] for r in rows if r["consumer_group"] == s["consumer_group"])
        assert {k: s[k] for k in ("broker_name", "original_topic", "messages", "distinct_originals", "replayed")} == {
            "broker_name": "broker-a", "original_topic": TOPIC, "messages": 5, "distinct_originals": 5, "replayed": 0}
        assert s["store_date"] == rows[0]["store_date"]
        assert (s["p50_time_to_dlq_s"], s["max_time_to_dlq_s"]) == (secs[2], secs[4])
        # position 0.95 * 4 = 3.8: interpolated between the 4th and 5th value (Spark's arithmetic)
        assert s["p95_time_to_dlq_s"] == (secs[3] if secs[3] == secs[4] else (4 - 3.8) * secs[3] + (3.8 - 3) * secs[4])
        assert s["top_keys"] == ["common", "order-0", "order-1", "order-2", "order-3"]  # 5 each 1: by name
        assert s["top_tags"] == ["TagA", "TagB"]  # 3 and 2
    lines = out.splitlines()
    assert lines[-1].startswith("dlq: 10 DLQ messages (5 distinct originals) in 2 group(s) on 1 broker(s) broker-a;")
    header = next(i for i, line in enumerate(lines) if line.startswith("date"))
    assert [line.split()[2] for line in lines[header + 1:header + 3]] == ["CG_DLQ_ONCE", "CG_DLQ_TWICE"]


def test_no_ingest_without_messages_table_writes_empty_reports(spark, tmp_path, capsys):
    """--no-ingest leaves the store alone; with no messages table the run still replaces the
    brokers' rows (by nothing) and leaves every table in place for readers."""
    lake = tmp_path / "lake"
    store = tmp_path / "store"
    (store / "commitlog").mkdir(parents=True)
    (store / "commitlog" / "00000000000000000000").write_bytes(b"")  # a store lists a segment, even an empty one
    for name, schema in ((DLQ_MESSAGES_TABLE, DLQ_MESSAGES_SCHEMA), (DLQ_SUMMARY_TABLE, DLQ_SUMMARY_SCHEMA)):
        stale = [{**{f.name: None for f in schema}, "broker_name": b, "store_date": dt.date(2024, 1, 1)}
                 for b in ("gone", "kept")]
        replace_arrow(str(lake), name, pa.Table.from_pylist(stale, schema=schema),
                      partition_by=["store_date"] if name == DLQ_MESSAGES_TABLE else ())
    from broker.cli import main as rocketlake

    assert rocketlake(["dlq", "--store", f"gone={store}", "--lake", str(lake), "--no-ingest"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "dlq: 0 DLQ messages (0 distinct originals) in 0 group(s) on 1 broker(s) gone; " \
                   "dlq_messages v1, dlq_summary v1"
    assert not (lake / "messages").exists()
    for name in (DLQ_MESSAGES_TABLE, DLQ_SUMMARY_TABLE):
        assert _table(lake, name)["broker_name"].to_pylist() == ["kept"]
    fresh = tmp_path / "fresh"
    report = run_dlq_report(spark, fresh, ["x"])
    assert report.messages.num_rows == 0 and report.summary.num_rows == 0
    assert _table(fresh, DLQ_MESSAGES_TABLE).schema == DLQ_MESSAGES_SCHEMA
    assert _table(fresh, DLQ_SUMMARY_TABLE).schema == DLQ_SUMMARY_SCHEMA


@pytest.mark.parametrize("argv", [
    ["--lake", "LAKE"],                                   # --store missing
    ["--store", "/no/such/store", "--lake", "LAKE"],      # no commitlog/ there
    ["--store", "bad name=/tmp", "--lake", "LAKE"],       # broker name rules
    ["--store", "/tmp", "--lake", "LAKE", "--bogus"],     # unknown option
    ["--store", "/tmp"],                                  # --lake missing
])
def test_bad_arguments_exit_2(argv, tmp_path, capsys):
    from broker.cli import main as rocketlake

    with pytest.raises(SystemExit) as exc:
        rocketlake(["dlq"] + [str(tmp_path / "lake") if a == "LAKE" else a for a in argv])
    assert exc.value.code == 2
    assert "dlq_report.py: error:" in capsys.readouterr().err
    assert not (tmp_path / "lake").exists()


# ---- edge cases from hand-built rows ----------------------------------------------------------------
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


class _Store:
    """Rows of MESSAGES_SCHEMA as ingest derives them (real_topic, is_retry, consumer_group, …)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def put(self, broker: str, offset: int, topic: str, *, born: int, store: int, rc: int = 0,
            props: dict | None = None, keys: tuple = (), tags: str | None = None, uniq: str | None = None) -> str:
        props = dict(props or {})
        if uniq is not None:
            props["UNIQ_KEY"] = uniq
        offset_id = f"{broker.upper()}-{offset:08X}"
        row = {f.name: None for f in MESSAGES_SCHEMA}
        group = consumer_group_of(topic)
        row.update(
            commitlog_offset=offset, store_size=100, magic_code=-626843481, body_crc=0, body_crc_ok=True, queue_id=0,
            flag=0, queue_offset=0, sys_flag=0, transaction_type="NOT", compression="NONE", born_timestamp=born,
            store_timestamp=store, born_host="10.0.0.1:1000", store_host="10.0.0.2:10911", reconsume_times=rc,
            prepared_transaction_offset=0, topic=topic,
            real_topic=props.get(PROPERTY_REAL_TOPIC, topic) if topic == SCHEDULE_TOPIC else topic,
            properties=list(props.items()), keys=list(keys), tags=tags, uniq_key=uniq, offset_msg_id=offset_id,
            body=b"x", born_time=_ts(born), store_time=_ts(store), broker_name=broker, store_date=_ts(store).date(),
            segment_file="00000000000000000000", ingest_run_id="run", is_retry=topic.startswith("%RETRY%"),
            is_dlq=topic.startswith("%DLQ%"), consumer_group=group,
            origin_msg_id=props.get(PROPERTY_ORIGIN_MESSAGE_ID) or props.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID))
        self.rows.append(row)
        return offset_id

    def retry_pair(self, broker: str, offset: int, group: str, rc: int, origin: str, *, born: int, at: int,
                   retry_topic_name: str | None = None, extra: dict | None = None) -> None:
        """The send-back record (in SCHEDULE_TOPIC_XXXX) and the schedule service's %RETRY% copy."""
        target = retry_topic_name or retry_topic(group)
        props = {PROPERTY_ORIGIN_MESSAGE_ID: origin, PROPERTY_DELAY: str(2 + rc), PROPERTY_REAL_TOPIC: target,
                 PROPERTY_REAL_QID: "0", **(extra or {})}
        self.put(broker, offset, SCHEDULE_TOPIC, born=born, store=at, rc=rc, props=props)
        self.put(broker, offset + 1, target, born=born, store=at + 1000, rc=rc, props=props)

    def frame(self, spark):
        return spark.createDataFrame(pa.Table.from_pylist(self.rows, schema=MESSAGES_SCHEMA))


def _attempts(history: list[dict]) -> list[tuple]:
    return [(h["attempt"], h["topic"], h["commitlog_offset"], h["delay_level"]) for h in history]


def test_edge_cases_from_rows(spark):
    s = _Store()
    # A: 5.x DLQ record naming its original only by DLQ_ORIGIN_TOPIC / DLQ_ORIGIN_MESSAGE_ID (the
    # client id), ORIGIN_MESSAGE_ID blank; retries went through a POP retry topic %RETRY%G1+TopicA
    s.put("b1", 0, "TopicA", born=T0, store=T0 + 5, uniq="UNIQ-A", keys=("ka",), tags="TagA")
    s.retry_pair("b1", 10, "G1", 1, "UNIQ-A", born=T0, at=T0 + 1_000, retry_topic_name="%RETRY%G1+TopicA")
    s.put("b1", 20, "%DLQ%G1", born=T0, store=T0 + 3_000, rc=2, uniq="UNIQ-A", keys=("ka",), tags="TagA",
          props={PROPERTY_ORIGIN_MESSAGE_ID: "  ", PROPERTY_DLQ_ORIGIN_TOPIC: "TopicA",
                 PROPERTY_DLQ_ORIGIN_MESSAGE_ID: "UNIQ-A"})
    # B: original gone; retry records carry its born time, a client fallback resent the last
    # one itself (born later, DELAY not a number), so the DLQ record's born time is the resend's
    s.retry_pair("b1", 30, "G1", 1, "GONE", born=T0 + 100, at=T0 + 2_000, extra={PROPERTY_RETRY_TOPIC: "TopicB"})
    s.put("b1", 32, "%RETRY%G1", born=T0 + 4_000, store=T0 + 4_001, rc=2,
          props={PROPERTY_ORIGIN_MESSAGE_ID: "GONE", PROPERTY_RETRY_TOPIC: "TopicB", PROPERTY_DELAY: "x"})
    s.retry_pair("b1", 33, "G2", 1, "GONE", born=T0 + 100, at=T0 + 2_500)   # another group: not G1's history
    s.retry_pair("b2", 34, "G1", 1, "GONE", born=T0 + 100, at=T0 + 2_500)   # another broker
    s.put("b1", 40, "%DLQ%G1", born=T0 + 4_000, store=T0 + 6_500, rc=3, keys=("kb", "kb", "shared"),
          props={PROPERTY_ORIGIN_MESSAGE_ID: "GONE", PROPERTY_RETRY_TOPIC: "TopicB"})
    # C: dead-lettered, replayed (same ORIGIN_MESSAGE_ID), dead-lettered again: two rounds
    orig_c = s.put("b1", 50, "TopicC", born=T0 + 200, store=T0 + 201, uniq="UNIQ-C")
    s.retry_pair("b1", 60, "G1", 1, orig_c, born=T0 + 200, at=T0 + 1_200, extra={PROPERTY_RETRY_TOPIC: "TopicC"})
    s.put("b1", 70, "%DLQ%G1", born=T0 + 200, store=T0 + 10_200, rc=2, keys=("kc",),
          props={PROPERTY_ORIGIN_MESSAGE_ID: orig_c, PROPERTY_RETRY_TOPIC: "TopicC", PROPERTY_DELAY: "0"})
    s.retry_pair("b1", 80, "G1", 1, orig_c, born=T0 + 200, at=T0 + 20_200, extra={PROPERTY_RETRY_TOPIC: "TopicC"})
    s.put("b1", 90, "%DLQ%G1", born=T0 + 200, store=T0 + 30_200, rc=2, keys=("kc",),
          props={PROPERTY_ORIGIN_MESSAGE_ID: orig_c, PROPERTY_RETRY_TOPIC: "TopicC", PROPERTY_DELAY: "0"})
    # D: sent straight into a DLQ topic: no original named
    s.put("b1", 100, "%DLQ%G1", born=T0 + 300, store=T0 + 800, uniq="UNIQ-D", tags="TagD")
    # E: broker b2 has its own copy of C's client id (found by UNIQ_KEY; b1's, at a lower offset,
    # must not be taken) and its own retry records
    s.put("b2", 55, "TopicC", born=T0 + 400, store=T0 + 401, uniq="UNIQ-C")
    s.retry_pair("b2", 60, "G1", 1, "UNIQ-C", born=T0 + 400, at=T0 + 900, extra={PROPERTY_RETRY_TOPIC: "TopicC"})
    s.put("b2", 70, "%DLQ%G1", born=T0 + 400, store=T0 + 1_400, rc=2,
          props={PROPERTY_ORIGIN_MESSAGE_ID: "UNIQ-C", PROPERTY_RETRY_TOPIC: "TopicC"})

    table = dlq_messages(s.frame(spark)).toArrow().cast(DLQ_MESSAGES_SCHEMA)
    rows = {(r["broker_name"], r["dlq_commitlog_offset"]): r for r in table.to_pylist()}
    assert sorted(rows) == [("b1", 20), ("b1", 40), ("b1", 70), ("b1", 90), ("b1", 100), ("b2", 70)]

    a = rows["b1", 20]
    assert (a["original_topic"], a["original_msg_id"], a["msg_id"], a["consumer_group"]) == (
        "TopicA", "UNIQ-A", "B1-00000014", "G1")
    assert (a["first_born_time"], a["original_store_time"]) == (_ts(T0), _ts(T0 + 5))
    assert a["original_commitlog_offset"] == 0
    assert _attempts(a["retry_history"]) == [(1, SCHEDULE_TOPIC, 10, 3), (1, "%RETRY%G1+TopicA", 11, 3)]
    assert a["time_to_dlq_s"] == 3.0

    b = rows["b1", 40]
    assert (b["original_topic"], b["original_msg_id"], b["original_store_time"]) == ("TopicB", "GONE", None)
    assert b["first_born_time"] == _ts(T0 + 100) and b["original_commitlog_offset"] is None  # earliest born among its records
    assert _attempts(b["retry_history"]) == [(1, SCHEDULE_TOPIC, 30, 3), (1, "%RETRY%G1", 31, 3),
                                             (2, "%RETRY%G1", 32, None)]
    assert [h["store_time"] for h in b["retry_history"]] == [_ts(T0 + 2_000), _ts(T0 + 3_000), _ts(T0 + 4_001)]
    assert [h["reconsume_times"] for h in b["retry_history"]] == [1, 1, 2]
    assert b["time_to_dlq_s"] == 6.4 and b["keys"] == ["kb", "kb", "shared"] and b["tags"] is None

    c1, c2 = rows["b1", 70], rows["b1", 90]
    assert c1["original_msg_id"] == c2["original_msg_id"] == orig_c
    assert (c1["first_born_time"], c1["original_store_time"]) == (_ts(T0 + 200), _ts(T0 + 201))
    assert c1["original_commitlog_offset"] == c2["original_commitlog_offset"] == 50
    assert _attempts(c1["retry_history"]) == [(1, SCHEDULE_TOPIC, 60, 3), (1, "%RETRY%G1", 61, 3)]
    assert _attempts(c2["retry_history"]) == [(1, SCHEDULE_TOPIC, 80, 3), (1, "%RETRY%G1", 81, 3)]
    assert (c1["time_to_dlq_s"], c2["time_to_dlq_s"]) == (10.0, 30.0)

    d = rows["b1", 100]
    assert (d["original_topic"], d["original_msg_id"], d["retry_history"], d["original_store_time"]) == (
        "%DLQ%G1", None, [], None)
    assert (d["first_born_time"], d["time_to_dlq_s"], d["uniq_key"]) == (_ts(T0 + 300), 0.5, "UNIQ-D")

    e = rows["b2", 70]
    assert (e["original_msg_id"], e["original_store_time"], e["original_commitlog_offset"]) == (
        "UNIQ-C", _ts(T0 + 401), 55)
    assert _attempts(e["retry_history"]) == [(1, SCHEDULE_TOPIC, 60, 3), (1, "%RETRY%G1", 61, 3)]
    assert e["time_to_dlq_s"] == 1.0

    summary = {(r["broker_name"], r["original_topic"]): r for r in dlq_summary(table).to_pylist()}
    assert sorted(summary) == [("b1", "%DLQ%G1"), ("b1", "TopicA"), ("b1", "TopicB"), ("b1", "TopicC"),
                               ("b2", "TopicC")]
    tc = summary["b1", "TopicC"]
    assert (tc["messages"], tc["distinct_originals"], tc["top_keys"], tc["top_tags"]) == (2, 1, ["kc"], [])
    assert (tc["p50_time_to_dlq_s"], tc["p95_time_to_dlq_s"], tc["max_time_to_dlq_s"]) == (20.0, 29.0, 30.0)
    assert summary["b1", "TopicB"]["top_keys"] == ["kb", "shared"]
    assert (summary["b1", "%DLQ%G1"]["distinct_originals"], summary["b1", "%DLQ%G1"]["top_tags"]) == (0, ["TagD"])
    assert summary["b1", "TopicA"]["store_date"] == dt.date(2023, 11, 14)


def _dlq_rows(specs: list[tuple]) -> pa.Table:
    """dlq_messages rows from (date, broker, group, topic, original id, seconds, keys, tags, offset)."""
    rows = []
    for day, broker, group, topic, oid, secs, keys, tags, offset in specs:
        row = {f.name: None for f in DLQ_MESSAGES_SCHEMA}
        row.update(store_date=day, broker_name=broker, consumer_group=group, original_topic=topic,
                   original_msg_id=oid, time_to_dlq_s=secs, keys=keys, tags=tags, dlq_commitlog_offset=offset,
                   retry_history=[])
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=DLQ_MESSAGES_SCHEMA)


def test_summary_percentiles_top_values_and_replayed_hook():
    d1, d2 = dt.date(2024, 5, 1), dt.date(2024, 5, 2)
    keysets = [["a", "b"], ["b", "c"], ["c", "b"], ["d"], ["e"], ["f"], ["g", "g"]]
    specs = [(d1, "b1", "G", "T", f"o{i % 19}", float(20 - i), keysets[i % 7], ["X", "Y", None][i % 3], 100 * i)
             for i in range(21)]  # 21 values 0..20: p50 = 10 and p95 = 19 are exact positions
    specs += [(d2, "b1", "G", "T", "o1", 5.0, [], None, 5000), (d2, "b1", "G", "T", "o1", 1.5, ["k"], "X", 5100),
              (d1, "b0", "G", "T", None, 0.25, ["z"], "Z", 7)]
    replayed = pa.table({"broker_name": ["b1", "b1", "b1", "b0"], "dlq_commitlog_offset": [0, 0, 5100, 8]})
    got = dlq_summary(_dlq_rows(specs), replayed)
    assert got.schema == DLQ_SUMMARY_SCHEMA
    assert got.to_pylist() == [
        {"store_date": d1, "broker_name": "b0", "consumer_group": "G", "original_topic": "T", "messages": 1,
         "distinct_originals": 0, "p50_time_to_dlq_s": 0.25, "p95_time_to_dlq_s": 0.25, "max_time_to_dlq_s": 0.25,
         "top_keys": ["z"], "top_tags": ["Z"], "replayed": 0},
        # keys over 21 messages: b 9 (a/b, b/c, c/b), c 6, a/d/e/f/g 3 each (g once per message) → ties by name
        {"store_date": d1, "broker_name": "b1", "consumer_group": "G", "original_topic": "T", "messages": 21,
         "distinct_originals": 19, "p50_time_to_dlq_s": 10.0, "p95_time_to_dlq_s": 19.0, "max_time_to_dlq_s": 20.0,
         "top_keys": ["b", "c", "a", "d", "e"], "top_tags": ["X", "Y"], "replayed": 1},
        {"store_date": d2, "broker_name": "b1", "consumer_group": "G", "original_topic": "T", "messages": 2,
         "distinct_originals": 1, "p50_time_to_dlq_s": 3.25, "p95_time_to_dlq_s": (1 - 0.95) * 1.5 + 0.95 * 5.0,
         "max_time_to_dlq_s": 5.0, "top_keys": ["k"], "top_tags": ["X"], "replayed": 1},
    ]
    assert dlq_summary(_dlq_rows([])).num_rows == 0
    bare = dlq_summary(_dlq_rows([(d1, "b", "G", "T", None, 1.0, [], None, 1)])).to_pylist()
    assert [(r["top_keys"], r["top_tags"], r["distinct_originals"]) for r in bare] == [([], [], 0)]
    assert dlq_summary(_dlq_rows(specs)).column("replayed").to_pylist() == [0, 0, 0]


def test_exact_percentile_is_sparks_percentile(spark):
    rng = np.random.default_rng(7)
    sizes = [1, 2, 3, 7, 20, 41, 100]
    values = [np.sort(np.round(rng.exponential(30, n), rng.integers(0, 7))) for n in sizes]
    flat = np.concatenate(values)
    counts = np.array(sizes)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    df = spark.createDataFrame(pa.table({"g": np.repeat(np.arange(len(sizes)), counts), "v": flat}))
    ps = [0.5, 0.95, 0.9, 0.33]
    want = df.groupBy("g").agg(*[F.percentile("v", p).alias(str(p)) for p in ps]).orderBy("g").toArrow()
    for p in ps:
        assert exact_percentile(flat, starts, counts, p).tolist() == want[str(p)].to_pylist()
