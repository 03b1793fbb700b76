"""Replay (issue 9) against real brokers: a source store made by real traffic, ingested into a lake,
replayed into a second cluster; what arrives is read back with a pull consumer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from broker import demo_traffic
from broker.cli import run_job
from broker.client import Admin, Message, Producer, PullConsumer
from broker.store.constants import SYSTEM_PROPERTY_NAMES
from pipelines.lake import scan_arrow, table_exists
from pipelines.replay import ledger
from pipelines.replay.lineage import (
    LINEAGE_PROPERTY_NAMES,
    Origin,
    replay_key,
    replay_message,
    user_properties,
)
from pipelines.replay.sender import Pacer
from schemas.replay import REPLAY_LEDGER_TABLE, REPLAY_RUNS_TABLE
from tests.broker_harness import drain, start_broker, start_namesrv

BIG_BODY = 3000          # bytes of the "Big" topic's messages
TARGET_MAX = 2048        # the target broker's maxMessageSize


# ---- the rule of what a replay carries (no broker needed) ----------------------------------------------
def test_replayed_message_carries_user_fields_and_lineage_only():
    origin = Origin("broker-a", "%DLQ%g", 0, 7, 1234, "7F00000100002A9F00000000000004D2", "UNIQ-1", 1_700_000_000_123)
    props = {"region": "eu", "DELAY": "3", "TRAN_MSG": "true", "RETRY_TOPIC": "Orders", "UNIQ_KEY": "UNIQ-1",
             "ORIGIN_MESSAGE_ID": "X", "REAL_TOPIC": "T", "__CRC32#": "1", "DLQ_ORIGIN_TOPIC": "Orders",
             "TIMER_DELIVER_MS": "1", "__RMQ.TRANSIENT.X": "1", "RLR_RUN_ID": "old", "KEYS": "a b", "TAGS": "t"}
    msg = replay_message(origin, run_id="r1", target_topic="Orders", body=b"payload", properties=props,
                         keys=["a", "b"], tags="t", flag=3)
    assert msg.topic == "Orders" and msg.body == b"payload" and msg.tags == "t" and msg.flag == 3
    assert msg.keys == ["a", "b", "rlr:r1:broker-a:1234"]
    assert msg.properties == {
        "region": "eu", "RLR_ORIGIN_BROKER": "broker-a", "RLR_ORIGIN_TOPIC": "%DLQ%g", "RLR_ORIGIN_QUEUE_ID": "0",
        "RLR_ORIGIN_QUEUE_OFFSET": "7", "RLR_ORIGIN_COMMITLOG_OFFSET": "1234",
        "RLR_ORIGIN_MSG_ID": "7F00000100002A9F00000000000004D2", "RLR_ORIGIN_STORE_TIME": "1700000000123",
        "RLR_RUN_ID": "r1", "RLR_ORIGIN_UNIQ_KEY": "UNIQ-1"}
    kept = replay_message(origin, run_id="r1", target_topic="Orders", body=b"", properties=props, keys=None,
                          tags=None, keep_msg_id=True)
    assert kept.properties["UNIQ_KEY"] == "UNIQ-1" and kept.keys == ["rlr:r1:broker-a:1234"]
    assert user_properties([("a", "1"), ("WAIT", "true")]) == {"a": "1"}


def test_pacer_spaces_acquisitions_at_the_rate():
    now = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    pacer = Pacer(100.0, burst_s=0.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(101):
        pacer.acquire()
    assert now[0] == pytest.approx(1.0)          # 101 tokens at 100/s: the last one at t = 1 s
    now[0] += 10.0                                  # idle for 10 s: no flood afterwards
    pacer.acquire()
    pacer.acquire()
    assert sleeps[-1] == pytest.approx(0.01)


def test_current_state_takes_the_newest_event():
    ev = ledger.events_table({"run_id": ["r"] * 4, "broker_name": ["a", "a", "a", "b"],
                              "commitlog_offset": [1, 1, 2, 1], "event_seq": [1, 2, 1, 1],
                              "status": ["PLANNED", "SENT", "PLANNED", "UNKNOWN"], "attempts": [0, 1, 0, 1]})
    state = ledger.current_state(ev)
    assert list(zip(state["broker_name"].to_pylist(), state["commitlog_offset"].to_pylist(),
                    state["status"].to_pylist())) == [("a", 1, "SENT"), ("a", 2, "PLANNED"), ("b", 1, "UNKNOWN")]
    assert ledger.status_counts(state) == {"PLANNED": 1, "SENT": 1, "FAILED": 0, "UNKNOWN": 1, "SKIPPED": 0}


# ---- against brokers ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory, spark):
    """A source store with demo traffic (Orders, Payments, a DLQ) plus a 'Big' topic, ingested into a
    lake; a running target cluster with maxMessageSize 2048 and no topic auto-creation."""
    tmp = tmp_path_factory.mktemp("replay")
    ns, ns_addr = start_namesrv(tmp)
    src = start_broker(tmp / "src", ns_addr, {"messageDelayLevel": demo_traffic.DEMO_DELAY_LEVELS})
    try:
        summary = demo_traffic.run(ns_addr, orders=120, payments=6)
        with Admin(ns_addr) as admin:
            admin.create_topic(src.addr, "Big", queues=1)
        with Producer("big-producer", ns_addr) as producer:
            for i in range(3):
                producer.send(Message("Big", bytes([65 + i]) * BIG_BODY, keys=[f"big-{i}"]))
            producer.send(Message("Big", b"small", keys=["big-small"]))
    finally:
        src.stop()
        ns.terminate()
        ns.wait(10)
    assert summary[demo_traffic.FAILS]["delivered"] >= 18
    lake = tmp / "lake"
    assert run_job("ingest_commitlog.py", ["--store", f"broker-a={tmp / 'src'}", "--lake", str(lake)]) == 0
    tns, tns_addr = start_namesrv(tmp)
    target = start_broker(tmp / "tgt", tns_addr, {"autoCreateTopicEnable": False, "maxMessageSize": TARGET_MAX})
    with Admin(tns_addr) as admin:
        for topic, queues in (("OrdersReplay", 4), ("Payments", 2), ("OrdersQ0", 4), ("BigReplay", 1),
                              ("OrdersWhere", 4), ("OrdersDry", 4)):
            admin.create_topic(target.addr, topic, queues=queues)
    _wait_routed(tns_addr, "OrdersDry")
    yield {"lake": lake, "namesrv": tns_addr, "target": target, "tmp": tmp}
    target.stop()
    tns.terminate()
    tns.wait(10)


def _wait_routed(namesrv: str, topic: str) -> None:
    with Admin(namesrv) as admin:
        assert admin.wait_writable(topic), f"{topic} not routed"


def replay(world, capsys, *args: str) -> tuple[int, str, str]:
    rc = run_job("replay.py", ["--lake", str(world["lake"]), "--namesrv", world["namesrv"], *args])
    out, err = capsys.readouterr()
    return rc, out, err


def lake_rows(world, topic: str, **eq) -> list[dict]:
    rows = scan_arrow(world["lake"], "messages").to_pylist()
    return sorted((r for r in rows if r["topic"] == topic and all(r[k] == v for k, v in eq.items())),
                  key=lambda r: r["commitlog_offset"])


def target_messages(world, topic: str) -> list:
    with PullConsumer("replay-check", world["namesrv"]) as consumer:
        return drain(consumer, topic)


def run_row(world, run_id: str) -> dict:
    return next(r for r in scan_arrow(world["lake"], REPLAY_RUNS_TABLE).to_pylist() if r["run_id"] == run_id)


def state(world, run_id: str):
    return ledger.current_state(ledger.run_events(str(world["lake"]), run_id))


ALL_TIME = ["--since", "2000-01-01", "--until", "2100-01-01"]


def test_topic_range_replay_delivers_each_selected_message_once(world, capsys):
    rc, out, err = replay(world, capsys, "--topic", "Orders", *ALL_TIME, "--target-topic", "OrdersReplay",
                          "--run-id", "range-1")
    assert rc == 0, out + err
    source = lake_rows(world, "Orders")
    assert len(source) == 120
    assert "replay plan range-1: 120 message(s)" in out and "SUCCEEDED: 120 sent" in out
    got = target_messages(world, "OrdersReplay")
    assert len(got) == 120
    by_key = {}
    for m in got:
        rkeys = [k for k in m.keys if k.startswith("rlr:")]
        assert len(rkeys) == 1
        by_key.setdefault(rkeys[0], []).append(m)
    assert sorted(by_key) == sorted(replay_key("range-1", "broker-a", r["commitlog_offset"]) for r in source)
    for r in source:
        (m,) = by_key[replay_key("range-1", "broker-a", r["commitlog_offset"])]
        assert m.body == r["body"] and m.tags == r["tags"]
        assert m.keys == r["keys"] + [replay_key("range-1", "broker-a", r["commitlog_offset"])]
        props = m.properties
        assert props["RLR_ORIGIN_COMMITLOG_OFFSET"] == str(r["commitlog_offset"])
        assert props["RLR_ORIGIN_QUEUE_OFFSET"] == str(r["queue_offset"])
        assert props["RLR_ORIGIN_MSG_ID"] == r["offset_msg_id"] and props["RLR_RUN_ID"] == "range-1"
        assert props["RLR_ORIGIN_UNIQ_KEY"] == r["uniq_key"] and props["UNIQ_KEY"] != r["uniq_key"]
        copied = set(props) & SYSTEM_PROPERTY_NAMES - {"KEYS", "TAGS", "UNIQ_KEY", "CLUSTER", "WAIT"}
        assert not copied
    # the ledger agrees with what the target holds
    st = state(world, "range-1")
    assert st.num_rows == 120 and set(st["status"].to_pylist()) == {"SENT"}
    where = {(m.queue_id, m.queue_offset) for m in got}
    assert {(q, o) for q, o in zip(st["target_queue_id"].to_pylist(), st["target_queue_offset"].to_pylist())} == where
    run = run_row(world, "range-1")
    assert (run["status"], run["sent"], run["planned"], run["attempts"]) == ("SUCCEEDED", 120, 120, 1)
    assert json.loads(run["options"])["keep_order"] is False

    # a rerun of a finished run sends nothing
    rc, out, _ = replay(world, capsys, "--run-id", "range-1")
    assert rc == 0 and "SUCCEEDED: 120 sent" in out
    assert len(target_messages(world, "OrdersReplay")) == 120
    assert run_row(world, "range-1")["attempts"] == 2

    # a dry run of a rerun says what it would do and changes nothing
    rc, out, _ = replay(world, capsys, "--run-id", "range-1", "--dry-run")
    assert rc == 0 and "dry run of a rerun: 120 sent, 0 skipped (done); 0 to send, 0 unknown" in out
    assert run_row(world, "range-1")["attempts"] == 2


def test_dry_run_records_the_plan_and_sends_nothing(world, capsys):
    rc, out, _ = replay(world, capsys, "--topic", "Orders", *ALL_TIME, "--target-topic", "OrdersDry", "--dry-run",
                        "--run-id", "dry-1", "--rate", "100")
    assert rc == 0
    assert "estimated time at 100 msg/s: 1.2 s" in out and "DRY_RUN recorded" in out
    run = run_row(world, "dry-1")
    assert (run["status"], run["planned"], run["sent"], run["dry_run"]) == ("DRY_RUN", 120, 0, True)
    assert state(world, "dry-1").num_rows == 0
    assert target_messages(world, "OrdersDry") == []


def test_dlq_replay_goes_back_to_the_original_topic_and_marks_the_dlq_report(world, capsys, spark):
    dlq = lake_rows(world, "%DLQ%demo-fails")
    assert len(dlq) == 6
    rc, out, err = replay(world, capsys, "--dlq", "demo-fails", "--run-id", "dlq-1")
    assert rc == 0, out + err
    got = target_messages(world, "Payments")
    assert sorted(m.body for m in got) == sorted(r["body"] for r in dlq)
    assert all("RETRY_TOPIC" not in m.properties and m.properties["RLR_ORIGIN_TOPIC"] == "%DLQ%demo-fails"
               for m in got)
    from pipelines.reports.dlq import run_dlq_report

    report = run_dlq_report(spark, world["lake"], ["broker-a"])
    assert report.summary["replayed"].to_pylist() == [6]
    assert set(report.messages["replay_run_id"].to_pylist()) == {"dlq-1"}
    assert report.messages["replayed_at"].null_count == 0


def test_keep_order_maps_a_source_queue_onto_one_target_queue_in_order(world, capsys):
    rc, out, err = replay(world, capsys, "--topic", "Orders", "--queue", "2", *ALL_TIME, "--target-topic", "OrdersQ0",
                          "--keep-order", "--run-id", "order-1")
    assert rc == 0, out + err
    source = lake_rows(world, "Orders", queue_id=2)
    got = target_messages(world, "OrdersQ0")
    assert {m.queue_id for m in got} == {2}     # 4 source queues, 4 target queues: the same id
    assert [m.properties["RLR_ORIGIN_QUEUE_OFFSET"] for m in sorted(got, key=lambda m: m.queue_offset)] == \
        [str(r["queue_offset"]) for r in source]


def test_where_predicate_and_max_messages(world, capsys):
    rc, out, err = replay(world, capsys, "--where", "topic = 'Orders' AND tags = 'created' AND "
                                                    "(array_contains(keys, 'customer-3') OR array_contains(keys, 'customer-4'))",
                          "--target-topic", "OrdersWhere", "--run-id", "where-1", "--max-messages", "2")
    assert rc == 0, out + err
    candidates = [r for r in lake_rows(world, "Orders", tags="created")
                  if {"customer-3", "customer-4"} & set(r["keys"])]
    assert len(candidates) == 4      # orders 4, 53, 103, 104
    source = candidates[:2]          # --max-messages takes the first in commitlog order
    got = target_messages(world, "OrdersWhere")
    assert sorted(m.body for m in got) == sorted(r["body"] for r in source) and len(got) == 2


def test_messages_over_the_target_limit_are_skipped(world, capsys):
    rc, out, err = replay(world, capsys, "--topic", "Big", *ALL_TIME, "--target-topic", "BigReplay", "--run-id", "big-1")
    assert rc == 0, out + err
    assert "skipped: 3 message(s) over the target's size limit" in out
    st = state(world, "big-1")
    assert sorted(st["status"].to_pylist()) == ["SENT", "SKIPPED", "SKIPPED", "SKIPPED"]
    skipped = st.filter(pc.equal(st["status"], "SKIPPED"))
    assert set(skipped["reason"].to_pylist()) == {f"body over the target's maxMessageSize {TARGET_MAX}"}
    assert [m.body for m in target_messages(world, "BigReplay")] == [b"small"]
    assert run_row(world, "big-1")["status"] == "SUCCEEDED"


@pytest.mark.parametrize("args, message", [
    (["--topic", "Nope", *ALL_TIME], "unknown topic 'Nope'"),
    (["--topic", "Orders", *ALL_TIME, "--broker", "broker-z"], "unknown broker 'broker-z': the lake has broker-a"),
    (["--topic", "Orders", "--since", "2001-01-01", "--until", "2001-01-02"], "matched no message"),
    (["--where", "topic = = 'x'"], "is not a valid predicate"),
    (["--where", "no_such_column = 1"], "no_such_column"),
    (["--topic", "Orders", *ALL_TIME, "--target-topic", "Missing"], "target topic 'Missing' does not exist"),
    (["--topic", "Orders", *ALL_TIME, "--target-topic", "%DLQ%demo-fails"], "dead-letter topic"),
    (["--topic", "Orders", *ALL_TIME, "--target-topic", "%RETRY%demo-fails"], "only a --dlq replay"),
    (["--topic", "Orders", *ALL_TIME, "--target-topic", "SCHEDULE_TOPIC_XXXX"], "system topic"),
    (["--dlq", "nobody"], "no DLQ messages of group 'nobody'"),
])
def test_bad_input_is_refused_and_nothing_is_recorded(world, capsys, args, message):
    rc, out, err = replay(world, capsys, *args, "--run-id", "bad-1")
    assert rc == 2 and message in err, out + err
    assert "Traceback" not in err
    assert ledger.load_run(str(world["lake"]), "bad-1") is None
    assert state(world, "bad-1").num_rows == 0


def test_unreachable_name_server_is_refused(world, capsys):
    from broker.server.launcher import free_port

    rc = run_job("replay.py", ["--lake", str(world["lake"]), "--namesrv", f"127.0.0.1:{free_port()}",
                               "--topic", "Orders", *ALL_TIME, "--run-id", "bad-2"])
    _, err = capsys.readouterr()
    assert rc == 2 and "is not reachable" in err
    assert ledger.load_run(str(world["lake"]), "bad-2") is None


def test_argument_errors_exit_2(world, capsys):
    for args in (["--topic", "Orders"], ["--topic", "Orders", "--dlq", "g", *ALL_TIME], ["--rate", "0", "--dlq", "g"],
                 ["--run-id", "has space", "--dlq", "demo-fails"]):
        with pytest.raises(SystemExit) as exc:
            run_job("replay.py", ["--lake", str(world["lake"]), "--namesrv", world["namesrv"], *args])
        assert exc.value.code == 2
    assert "run id 'has space' may only use" in capsys.readouterr().err


def test_ledger_and_runs_tables_exist_with_their_schemas(world):
    from schemas.replay import REPLAY_LEDGER_SCHEMA, REPLAY_RUNS_SCHEMA

    assert table_exists(world["lake"], REPLAY_LEDGER_TABLE)
    assert scan_arrow(world["lake"], REPLAY_LEDGER_TABLE).schema.names == REPLAY_LEDGER_SCHEMA.names
    assert scan_arrow(world["lake"], REPLAY_RUNS_TABLE).schema.names == REPLAY_RUNS_SCHEMA.names
