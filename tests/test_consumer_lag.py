"""Consumer lag snapshot from a store written by our broker's MessageStore (fake clock, so every
store timestamp is known), the heartbeat -> subscriptionDataSet path through BrokerCore, and the
job end to end (two snapshots, status, plot, argument errors)."""

from __future__ import annotations

import logging
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.compute as pc
import pytest

from broker.remoting.codes import PullSysFlag, RequestCode
from broker.engine import MessageStore, StoreSettings
from broker.server import BrokerMetadata
from broker.server.offsets import SubscriptionGroupManager
from broker.server.processors import BrokerCore, Request
from broker.store.config_files import ConsumerOffsetTable, SubscriptionGroupTable, TopicConfig, config_path
from broker.store.consume_queue import ConsumeQueue
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from broker.cli import run_job
from pipelines.reports.consumer_lag import snapshot_store, snapshot_stores
from schemas.reports import CONSUMER_LAG_SCHEMA

T0 = 1_900_000_000_000  # store clock start (epoch ms); message i of the store is stored at T0 + i s
SNAP = datetime(2030, 1, 1, tzinfo=timezone.utc)
SEGMENT = 4096
RECORD = 197  # 91 + body 100 + topic "Orders"/"Orders" 6, no properties
HEARTBEAT = (b'{"clientID":"1-127.0.0.1@x","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,'
             b'"groupName":"fresh","messageModel":1,"subscriptionDataSet":['
             b'{"subString":"*","subVersion":"17","topic":"%RETRY%fresh"},'
             b'{"subString":"TagA","subVersion":"17","topic":"Payments"}]}]}')
# what the C++ pull consumer sends: its group, no subscriptions (each PULL names topic and expression)
PULL_HEARTBEAT = (b'{"clientID":"2-127.0.0.1@x","consumerDataSet":[{"consumeFromWhere":0,"consumeType":0,'
                  b'"groupName":"puller","messageModel":1,"subscriptionDataSet":[]}]}')
PULL = {"consumerGroup": "puller", "topic": "Orders", "queueId": "1", "queueOffset": "0", "maxMsgNums": "32",
        "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)), "commitOffset": "0", "suspendTimeoutMillis": "0",
        "subscription": "*", "subVersion": "0"}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def _put(store: MessageStore, clock: Clock, topic: str, queue_id: int, n: int) -> list[tuple[int, int]]:
    """n messages, one store second apart: [(physical offset, store timestamp)]."""
    out = []
    for _ in range(n):
        clock.now += 1000
        r = store.put_message(MessageRecord(topic=topic, body=b"x" * 100, queue_id=queue_id, born_timestamp=clock.now,
                                            born_host=Host(bytes([10, 0, 0, 1]), 5000)))
        out.append((r.physical_offsets[0], r.store_timestamp))
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """Orders/0: 30 msgs (T0+1..30 s), Orders/1: 3 (T0+31..33 s), Payments/0: 4 (T0+34..37 s) with
    Payments configured for 2 queues. Groups: ``fast`` caught up, ``slow`` behind, ``fresh`` never
    committed (known from its heartbeat only), ``puller`` never committed (known from its pulls
    only), ``idle`` neither, TOOLS_CONSUMER with an offset.
    Then the first commitlog file is deleted (as retention would): Orders/0 starts at 20."""
    root = tmp_path_factory.mktemp("lag") / "store"
    clock = Clock()
    ms = MessageStore(root, StoreSettings(segment_bytes=SEGMENT, cq_file_bytes=20 * 64, index_slots=64,
                                          index_entries=256, fsync_metadata=False), clock=clock)
    ms.open()
    orders0 = _put(ms, clock, "Orders", 0, 30)
    assert [p for p, _ in orders0[19:21]] == [19 * RECORD, SEGMENT]  # 20 records fill the first file
    _put(ms, clock, "Orders", 1, 3)
    _put(ms, clock, "Payments", 0, 4)
    meta = BrokerMetadata(ms)
    meta.topics.put(TopicConfig("Payments", 2, 2))
    meta.topics.put(TopicConfig("Orders", 2, 2))
    for group, topic, qid, offset in [("fast", "Orders", 0, 30), ("fast", "Orders", 1, 3), ("slow", "Orders", 0, 2),
                                      ("slow", "Orders", 1, 1), ("TOOLS_CONSUMER", "Orders", 1, 3)]:
        meta.consumer_offsets.commit_offset(group, topic, qid, offset)
    meta.groups.find("idle")
    core = BrokerCore(ms, meta, cluster_name="DefaultCluster", broker_name="broker-a", broker_addr="127.0.0.1:10911",
                      max_message_size=4 << 20)
    core.process(Request(code=RequestCode.HEART_BEAT, ext={}, body=HEARTBEAT, channel=("h", 1)))
    core.process(Request(code=RequestCode.HEART_BEAT, ext={}, body=PULL_HEARTBEAT, channel=("h", 2)))
    for _ in range(2):
        assert core.process(Request(code=RequestCode.PULL_MESSAGE, ext=PULL, channel=("h", 2))).code == 0
    core.process(Request(code=RequestCode.HEART_BEAT, ext={}, body=PULL_HEARTBEAT, channel=("h", 2)))  # keeps it
    meta.close()
    ms.close()
    (root / "commitlog" / "00000000000000000000").unlink()
    return root


def job_main(argv: list[str]) -> int:
    """``jobs/consumer_lag.py``'s main, loaded the way ``rocketlake`` loads it."""
    return run_job("consumer_lag.py", argv)


def _rows(table) -> list[tuple]:
    cols = ["consumer_group", "topic", "queue_id", "consumer_offset", "min_offset", "max_offset", "lag_messages",
            "next_store_timestamp_ms", "newest_store_timestamp_ms", "lag_seconds", "lost_messages", "offset_source"]
    return [tuple(r[c] for c in cols) for r in table.to_pylist()]


def test_snapshot_exact_lag(store, caplog):
    with caplog.at_level(logging.INFO, logger="pipelines.reports.consumer_lag"):
        table = snapshot_store("broker-a", store, SNAP)
    assert table.schema == CONSUMER_LAG_SCHEMA
    s = 1000
    assert _rows(table) == [
        # an internal group is reported because it committed; a group consumes every queue of its topics
        ("TOOLS_CONSUMER", "Orders", 0, None, 20, 30, 10, T0 + 21 * s, T0 + 30 * s, 9.0, 0, "none"),
        ("TOOLS_CONSUMER", "Orders", 1, 3, 0, 3, 0, None, T0 + 33 * s, 0.0, 0, "consumerOffset.json"),
        ("fast", "Orders", 0, 30, 20, 30, 0, None, T0 + 30 * s, 0.0, 0, "consumerOffset.json"),
        ("fast", "Orders", 1, 3, 0, 3, 0, None, T0 + 33 * s, 0.0, 0, "consumerOffset.json"),
        # never committed, topics from subscriptionDataSet; %RETRY%fresh has no queue yet: no rows
        ("fresh", "Payments", 0, None, 0, 4, 4, T0 + 34 * s, T0 + 37 * s, 3.0, 0, "none"),
        ("fresh", "Payments", 1, None, 0, 0, 0, None, None, 0.0, 0, "none"),
        # never committed, topic from its pulls
        ("puller", "Orders", 0, None, 20, 30, 10, T0 + 21 * s, T0 + 30 * s, 9.0, 0, "none"),
        ("puller", "Orders", 1, None, 0, 3, 3, T0 + 31 * s, T0 + 33 * s, 2.0, 0, "none"),
        # offset 2 lies below the retained min 20: 18 messages were deleted unconsumed
        ("slow", "Orders", 0, 2, 20, 30, 10, T0 + 21 * s, T0 + 30 * s, 9.0, 18, "consumerOffset.json"),
        ("slow", "Orders", 1, 1, 0, 3, 2, T0 + 32 * s, T0 + 33 * s, 1.0, 0, "consumerOffset.json"),
    ]
    assert set(table.column("snapshot_ts").to_pylist()) == {SNAP}
    assert set(table.column("snapshot_id").to_pylist()) == {"lag-20300101T000000.000000Z"}
    assert "group idle has no committed offsets and no subscriptionDataSet: no lag rows" in caplog.messages
    # deterministic: a second snapshot of the same store is the same table
    assert snapshot_store("broker-a", store, SNAP).equals(table)


def test_snapshot_of_a_live_store_tolerates_units_whose_record_is_not_there(store, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(store, live)
    with ConsumeQueue(live, "Payments", 0) as cq:  # the dispatcher ran ahead of what we can read
        assert cq.put(4, SEGMENT + 17 * RECORD, RECORD, 0)  # the commitlog's end: zeros
    rows = _rows(snapshot_stores([("b1", str(live)), ("a0", str(store))], SNAP).filter(
        (pc.field("consumer_group") == "fresh") & (pc.field("queue_id") == 0)))
    assert rows == [("fresh", "Payments", 0, None, 0, 4, 4, T0 + 34_000, T0 + 37_000, 3.0, 0, "none"),
                    ("fresh", "Payments", 0, None, 0, 5, 5, T0 + 34_000, None, None, 0, "none")]


def test_heartbeat_records_subscription_data_set_only_on_change(store, tmp_path):
    groups = SubscriptionGroupTable.load(config_path(store, "subscriptionGroup.json"))
    assert groups.get("fresh").extra["subscriptionDataSet"] == [
        {"expression": "*", "expressionType": "TAG", "topic": "%RETRY%fresh", "version": 17},
        {"expression": "TagA", "expressionType": "TAG", "topic": "Payments", "version": 17}]
    assert "subscriptionDataSet" not in groups.get("idle").extra
    assert groups.get("puller").extra["subscriptionDataSet"] == [
        {"expression": "*", "expressionType": "TAG", "topic": "Orders", "version": 0}]
    copy = tmp_path / "store"
    shutil.copytree(store / "config", copy / "config")
    manager = SubscriptionGroupManager(copy, fsync=False)
    path = config_path(copy, "subscriptionGroup.json")
    before = path.read_text()
    subs = [("Payments", "TAG", "TagA", 99), ("%RETRY%fresh", "TAG", "*", 99)]
    assert manager.update_subscriptions("fresh", subs) is False  # only the version moved
    assert path.read_text() == before
    assert manager.update_subscriptions("fresh", [("Payments", "TAG", "TagB", 99)]) is True
    reread = SubscriptionGroupTable.load(path).get("fresh")
    assert reread.extra["subscriptionDataSet"] == [
        {"expression": "TagB", "expressionType": "TAG", "topic": "Payments", "version": 99}]
    assert reread.to_json()["subscriptionDataSet"] == reread.extra["subscriptionDataSet"]  # round-trips
    assert manager.update_subscriptions("nobody", subs) is False
    # pulls add (never replace) and only a new (topic, type, expression) is written
    assert manager.add_subscription("fresh", "Orders", None, "TagC", 5) is True
    written = path.read_text()
    assert manager.add_subscription("fresh", "Orders", "TAG", "TagC", 6) is False
    assert path.read_text() == written
    assert [e["topic"] for e in SubscriptionGroupTable.load(path).get("fresh").extra["subscriptionDataSet"]] == \
        ["Orders", "Payments"]
    assert manager.update_subscriptions("fresh", subs) is True  # a heartbeat replaces: the cache must not lie
    assert manager.add_subscription("fresh", "Orders", "TAG", "TagC", 7) is True


def test_job_end_to_end(store, tmp_path, spark, capsys):
    from broker.cli import main as rocketlake
    from pipelines.lake import scan_arrow
    from pipelines.reports.lag_plot import load_lag_series

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    lake = tmp_path / "lake"
    base = ["--store", f"broker-a={copy}", "--lake", str(lake), "--max-lag-messages", "*=5",
            "--max-lag-seconds", "fast=0"]
    assert job_main(base + ["--snapshot-ts", "2030-01-01T00:00:00Z"]) == 0
    first = capsys.readouterr().out.splitlines()
    assert first[0].split() == ["broker", "group", "topic", "queue", "offset", "max", "lag", "lag_s", "status"]
    assert first[9].split() == ["broker-a", "slow", "Orders", "0", "2", "30", "10", "9", "WARN"]
    assert "group slow on broker-a: WARN lag=12 lag_s=9 (2 partitions; not OK: Orders/0 WARN; " \
           "group lag 12 > max 5 messages)" in first

    offsets_file = config_path(copy, "consumerOffset.json")  # slow catches up on Orders/1 only
    offsets = ConsumerOffsetTable.load(offsets_file)
    offsets.set_offset("slow", "Orders", 1, 3)
    offsets.save(offsets_file, fsync=False)
    assert job_main(base + ["--snapshot-ts", "2030-01-01T00:10:00+00:00", "--group", "slow"]) == 0
    second = capsys.readouterr().out.splitlines()
    assert second[1:] == [
        "broker-a  slow   Orders      0       2   30   10      9  STOP",
        "broker-a  slow   Orders      1       3    3    0      0  OK",
        "group slow on broker-a: ERR lag=10 lag_s=9 (2 partitions; not OK: Orders/0 STOP; group lag 10 > max 5 messages)",
        "consumer_lag: 10 rows at 2030-01-01T00:10:00Z, appended for broker-a; consumer_lag_status: 15 rows appended"]

    assert job_main(base + ["--snapshot-ts", "2030-01-01T00:10:00Z"]) == 0  # a rerun of the same snapshot
    assert capsys.readouterr().out.splitlines()[-1].endswith("already recorded: nothing appended; "
                                                             "consumer_lag_status: 0 rows appended")
    lag = scan_arrow(lake, "consumer_lag")
    assert lag.num_rows == 20 and sorted(set(lag.column("snapshot_id").to_pylist())) == [
        "lag-20300101T000000.000000Z", "lag-20300101T001000.000000Z"]
    status = scan_arrow(lake, "consumer_lag_status").sort_by([("evaluated_at", "ascending")])
    groups = [(r["consumer_group"], r["status"], r["snapshots"]) for r in status.to_pylist()
              if r["level"] == "group" and r["evaluated_at"] == SNAP + timedelta(minutes=10)]
    assert sorted(groups) == [("TOOLS_CONSUMER", "ERR", 2), ("fast", "OK", 2), ("fresh", "ERR", 2),
                              ("puller", "ERR", 2), ("slow", "ERR", 2)]

    png = tmp_path / "out" / "slow.png"
    assert rocketlake(["lag", "--lake", str(lake), "--group", "slow", "--plot", str(png)]) == 0
    assert capsys.readouterr().out.strip() == f"plot: {png} (2 snapshots, 1 topics of group slow)"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    by_spark = load_lag_series(lake, "slow", spark, spark_min_rows=0)  # what a long history takes
    assert by_spark.equals(load_lag_series(lake, "slow"))
    assert by_spark.column("lag_messages").to_pylist() == [12, 10]

    with pytest.raises(SystemExit) as exc:
        job_main(["--lake", str(lake), "--group", "nobody", "--plot", str(tmp_path / "x.png")])
    assert exc.value.code == 2
    assert "--group 'nobody': no consumer_lag rows for this group" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--lake", "L"], "nothing to do"),
    (["--lake", "L", "--plot", "x.png"], "--plot needs --group"),
    (["--lake", "L", "--store", "/nonexistent"], "has no commitlog/ directory"),
    (["--lake", "L", "--store", "STORE", "--window", "0"], "--window must be >= 1"),
    (["--lake", "L", "--store", "STORE", "--stop-after-s", "nan"], "--stop-after-s must be a number > 0"),
    (["--lake", "L", "--store", "STORE", "--max-lag-messages", "G=x"], "'x' is not an integer"),
    (["--lake", "L", "--store", "STORE", "--max-lag-seconds", "G"], "is not GROUP=VALUE"),
    (["--lake", "L", "--store", "STORE", "--snapshot-ts", "yesterday"], "is not an ISO 8601 time"),
    (["--lake", "L", "--group", "G", "--plot", "x.png", "--snapshot-ts", "2030-01-01"], "only apply with --store"),
])
def test_bad_arguments_exit_2(argv, message, store, capsys):
    with pytest.raises(SystemExit) as exc:
        job_main([str(store) if a == "STORE" else a for a in argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
