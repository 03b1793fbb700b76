"""Replay end to end with Apache's C++ client (issue 9): the C++ producer writes, a failing C++ consumer
drives messages into the DLQ, the store is ingested, then

* a topic time range is replayed into a fresh topic on a second broker, and a C++ PushConsumer
  receives exactly the selected messages: bodies, keys, tags and user properties equal, lineage
  present, no system property copied, each once;
* the DLQ is replayed back to its original topic and the (now healthy) group consumes it.
"""

from __future__ import annotations

import base64
import json
import signal

import pytest

from broker.cli import run_job
from broker.store.config_files import SubscriptionGroupConfig, SubscriptionGroupTable, config_path
from broker.store.constants import SUBSCRIPTION_GROUP_FILE
from pipelines.lake import scan_arrow
from pipelines.replay import ledger
from pipelines.replay.lineage import LINEAGE_PROPERTY_NAMES, replay_key
from tests.broker_harness import start_broker, start_namesrv
from tests.cpp_client import ClientProcesses, create_routed_topic, max_offset, wait_for

ORDERS, PAYMENTS, COPY = "IopOrders", "IopPayments", "IopOrdersCopy"
G_DLQ, G_COPY = "CG_IOP_DLQ", "CG_IOP_COPY"
N, DLQ_N, RETRY_MAX = 30, 3, 1
CONFIG = {"messageDelayLevel": " ".join(["1s"] * 18)}
STALE = ["DELAY", "TRAN_MSG", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "REAL_TOPIC", "REAL_QID", "PGROUP",
         "DLQ_ORIGIN_TOPIC", "MAX_RECONSUME_TIMES", "RECONSUME_TIME", "TIMER_DELIVER_MS"]
PROPS = ["seq", "region", *LINEAGE_PROPERTY_NAMES, *STALE]


def _order(i: int) -> dict:
    return {"seq": f"o{i}", "mode": "sync", "keys": f"order-{i} cust-{i % 4}", "tags": f"Tag{i % 3}",
            "props": {"seq": f"o{i}", "region": "eu" if i % 2 else "us"}, "body": f"order {i} " + "x" * (i % 13)}


def _payment(i: int) -> dict:
    return {"seq": f"p{i}", "mode": "sync", "keys": f"pay-{i}", "tags": "Pay", "props": {"seq": f"p{i}"},
            "body": f"payment {i}"}


class Run(ClientProcesses):
    def produce(self, name: str, namesrv: str, topic: str, messages: list[dict]) -> None:
        spec = self.tmp / f"{name}.json"
        spec.write_text(json.dumps({"topic": topic, "messages": messages}))
        res = self.client(name, ["produce.py", namesrv, "PG_IOP", str(spec)], timeout=90).result()
        assert res["errors"] == [] and all(r["status"] == 0 for r in res["results"]), res

    def push(self, name: str, namesrv: str, group: str, topic: str, unique: int, total: int, fail: bool = False):
        return self.client(name, ["push_consume.py", namesrv, group, topic, "*", "--unique", str(unique),
                                  "--total", str(total), "--props", ",".join(PROPS), "--timeout", "120",
                                  "--settle", "3", *(["--fail"] if fail else [])], timeout=150)


@pytest.fixture(scope="module")
def world(tmp_path_factory, spark):
    tmp = tmp_path_factory.mktemp("replay-interop")
    store_a = tmp / "store-a"
    groups = SubscriptionGroupTable()
    groups.put(SubscriptionGroupConfig(group_name=G_DLQ, retry_max_times=RETRY_MAX))
    groups.save(config_path(store_a, SUBSCRIPTION_GROUP_FILE))
    ns, namesrv = start_namesrv(tmp)
    run = Run(tmp)
    broker_a = start_broker(store_a, namesrv, CONFIG)
    broker_b = start_broker(tmp / "store-b", namesrv, {**CONFIG, "brokerName": "broker-b",
                                                       "autoCreateTopicEnable": False})
    lake = tmp / "lake"
    out: dict = {"lake": lake, "namesrv": namesrv}
    try:
        for topic, queues in ((ORDERS, 4), (PAYMENTS, 2), (f"%RETRY%{G_DLQ}", 1)):
            create_routed_topic(broker_a.addr, namesrv, topic, queues)
        create_routed_topic(broker_b.addr, namesrv, COPY, 4)       # the fresh topic, on the second broker
        run.produce("produce-orders", namesrv, ORDERS, [_order(i) for i in range(N)])
        failing = run.push("push-failing", namesrv, G_DLQ, PAYMENTS, DLQ_N, DLQ_N * (1 + RETRY_MAX), fail=True)
        failing.wait_line("started")
        for i in range(DLQ_N):
            run.produce(f"produce-pay{i}", namesrv, PAYMENTS, [_payment(i)])
            wait_for(f"p{i} in the DLQ", lambda: max_offset(broker_a.addr, f"%DLQ%{G_DLQ}", 0) >= i + 1, 60)
        failing.result()
        # ingest while the brokers run (the lake never reads a record still being written)
        assert run_job("ingest_commitlog.py", ["--store", f"broker-a={store_a}", "--lake", str(lake)]) == 0
        out["orders"] = sorted((r for r in scan_arrow(lake, "messages").to_pylist() if r["topic"] == ORDERS),
                               key=lambda r: r["commitlog_offset"])

        copy_consumer = run.push("push-copy", namesrv, G_COPY, COPY, N, N)
        copy_consumer.wait_line("started")
        assert run_job("replay.py", ["--lake", str(lake), "--namesrv", namesrv, "--topic", ORDERS,
                                     "--since", "2000-01-01", "--until", "2100-01-01", "--target-topic", COPY,
                                     "--run-id", "iop-range"]) == 0
        out["copy"] = copy_consumer.result()

        healed = run.push("push-healed", namesrv, G_DLQ, PAYMENTS, DLQ_N, DLQ_N)   # the consumer, fixed
        healed.wait_line("started")
        assert run_job("replay.py", ["--lake", str(lake), "--namesrv", namesrv, "--dlq", G_DLQ,
                                     "--run-id", "iop-dlq"]) == 0
        out["healed"] = healed.result()
    finally:
        run.kill_all()
        broker_a.stop()
        broker_b.stop()
        ns.send_signal(signal.SIGTERM)
        ns.wait(10)
    return out


def test_cpp_consumer_receives_exactly_the_selected_messages(world):
    orders, copy = world["orders"], world["copy"]
    assert len(orders) == N and copy["complete"], copy
    deliveries = copy["deliveries"]
    assert len(deliveries) == N                                   # each once
    by_offset = {int(d["props"]["RLR_ORIGIN_COMMITLOG_OFFSET"]): d for d in deliveries}
    assert sorted(by_offset) == [r["commitlog_offset"] for r in orders]
    for r in orders:
        d = by_offset[r["commitlog_offset"]]
        assert d["topic"] == COPY
        assert base64.b64decode(d["body"]) == r["body"]
        assert d["tags"] == r["tags"]
        assert d["keys"] == " ".join(r["keys"] + [replay_key("iop-range", "broker-a", r["commitlog_offset"])])
        props = d["props"]
        assert {k: props[k] for k in ("seq", "region")} == {k: dict(r["properties"])[k] for k in ("seq", "region")}
        assert props["RLR_ORIGIN_TOPIC"] == ORDERS and props["RLR_ORIGIN_BROKER"] == "broker-a"
        assert props["RLR_ORIGIN_QUEUE_ID"] == str(r["queue_id"])
        assert props["RLR_ORIGIN_QUEUE_OFFSET"] == str(r["queue_offset"])
        assert props["RLR_ORIGIN_MSG_ID"] == r["offset_msg_id"] and props["RLR_RUN_ID"] == "iop-range"
        assert props["RLR_ORIGIN_UNIQ_KEY"] == r["uniq_key"] and d["id"] != r["uniq_key"]  # a fresh message id
        assert not set(props) & set(STALE)
    # the ledger agrees with where the consumer found them
    state = ledger.current_state(ledger.run_events(str(world["lake"]), "iop-range"))
    assert set(state["status"].to_pylist()) == {"SENT"} and set(state["target_broker"].to_pylist()) == {"broker-b"}
    assert sorted(zip(state["target_queue_id"].to_pylist(), state["target_queue_offset"].to_pylist())) == \
        sorted((d["queue_id"], d["queue_offset"]) for d in deliveries)


def test_dlq_replay_is_consumed_by_the_healed_group(world):
    healed = world["healed"]
    assert healed["complete"], healed
    got = sorted(base64.b64decode(d["body"]).decode() for d in healed["deliveries"])
    assert got == [f"payment {i}" for i in range(DLQ_N)]
    for d in healed["deliveries"]:
        assert d["topic"] == PAYMENTS and d["reconsume_times"] == 0
        assert d["props"]["RLR_ORIGIN_TOPIC"] == f"%DLQ%{G_DLQ}"
        assert not set(d["props"]) & set(STALE)
