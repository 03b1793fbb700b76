"""Reports end to end: Apache's C++ client drives our broker, then ``rocketlake lag`` and
``rocketlake dlq`` run on the stopped store and their tables must equal what the test computed on
its own from what the C++ consumers saw (queue ids, queue offsets, store timestamps).

Groups on ORDERS (4 queues):

* ``CG_REP_ALL`` consumed everything: lag 0 on every queue;
* ``CG_REP_PART`` consumed the first batch, then stopped before the second: lag = the second
  batch's messages in each queue, lag_seconds = newest minus first-unconsumed store time;
* ``CG_REP_NEVER`` only pulled (the C++ PullConsumer keeps offsets in memory): never committed, so
  the whole queue counts as lag, the group known from its heartbeat subscription;

and ``CG_REP_DLQ`` on PAYMENTS fails every message: retryMaxTimes 2, so each message is delivered
three times, goes through SCHEDULE_TOPIC_XXXX and %RETRY% twice and ends in %DLQ%.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import defaultdict

import pyarrow.compute as pc
import pytest

from broker.store.config_files import SubscriptionGroupConfig, SubscriptionGroupTable, config_path
from broker.store.constants import SUBSCRIPTION_GROUP_FILE
from broker.store.message_id import decode_offset_msg_id
from pipelines.lake import scan_arrow
from schemas.reports import CONSUMER_LAG_TABLE, DLQ_MESSAGES_TABLE, DLQ_SUMMARY_TABLE
from tests.broker_harness import ROCKETLAKE, REPO, start_broker, start_namesrv
from tests.cpp_client import ClientProcess, ClientProcesses, create_routed_topic, max_offset, wait_for

ORDERS, PAYMENTS = "ReportOrders", "ReportPayments"
G_ALL, G_PART, G_NEVER, G_DLQ = "CG_REP_ALL", "CG_REP_PART", "CG_REP_NEVER", "CG_REP_DLQ"
PRODUCER = "PG_REPORTS"
QUEUES = 4
N1, N2 = 40, 24
N = N1 + N2
DLQ_N = 3
RETRY_MAX = 2
BROKER_CONFIG = {"messageDelayLevel": " ".join(["1s"] * 18), "mappedFileSizeCommitLog": 1024 * 1024}
SNAPSHOT_TS = "2030-01-01T00:00:00+00:00"


def _order(i: int) -> dict:
    return {"seq": f"o{i}", "mode": "sync", "keys": f"order-{i}", "tags": f"Tag{i % 3}",
            "props": {"seq": f"o{i}"}, "body": f"order {i} " + "x" * (i % 17)}


def _payment(i: int) -> dict:
    return {"seq": f"p{i}", "mode": "sync", "keys": f"pay-{i} pay-common", "tags": "Pay",
            "props": {"seq": f"p{i}"}, "body": f"payment {i}"}


class Run(ClientProcesses):
    """The scenario's C++-client processes, with the two kinds it starts most."""

    def produce(self, name: str, namesrv: str, topic: str, messages: list[dict]) -> dict:
        spec = self.tmp / f"{name}.json"
        spec.write_text(json.dumps({"topic": topic, "messages": messages}))
        res = self.client(name, ["produce.py", namesrv, PRODUCER, str(spec)], timeout=90).result()
        assert res["errors"] == [] and all(r["status"] == 0 for r in res["results"]), res
        return res

    def push(self, name: str, namesrv: str, group: str, topic: str, unique: int, total: int,
             fail: bool = False) -> ClientProcess:
        return self.client(name, ["push_consume.py", namesrv, group, topic, "*", "--unique", str(unique),
                                  "--total", str(total), "--props", "seq", "--timeout", "120", "--settle", "2",
                                  *(["--fail"] if fail else [])], timeout=150)


def _cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*ROCKETLAKE, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"rocketlake {' '.join(args)} → {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reports")
    store = tmp / "store"
    groups = SubscriptionGroupTable()
    groups.put(SubscriptionGroupConfig(group_name=G_DLQ, retry_max_times=RETRY_MAX))
    groups.save(config_path(store, SUBSCRIPTION_GROUP_FILE))
    ns_proc, namesrv = start_namesrv(tmp)
    run = Run(tmp)
    broker = start_broker(store, namesrv, BROKER_CONFIG)
    try:
        for topic, queues in ((ORDERS, QUEUES), (PAYMENTS, QUEUES), (f"%RETRY%{G_DLQ}", 1)):
            create_routed_topic(broker.addr, namesrv, topic, queues)
        run.produce("produce-1", namesrv, ORDERS, [_order(i) for i in range(N1)])
        part = run.push("push-part", namesrv, G_PART, ORDERS, N1, N1).result()  # shutdown commits
        run.produce("produce-2", namesrv, ORDERS, [_order(i) for i in range(N1, N)])
        every = run.push("push-all", namesrv, G_ALL, ORDERS, N, N)
        never = run.client("pull-never", ["pull_consume.py", namesrv, G_NEVER, ORDERS, "*", "--unique", str(N),
                                          "--props", "seq", "--timeout", "120"], timeout=150)
        failing = run.push("push-dlq", namesrv, G_DLQ, PAYMENTS, DLQ_N, DLQ_N * (1 + RETRY_MAX), fail=True)
        failing.wait_line("started")
        for i in range(DLQ_N):  # one at a time: the C wrapper would send the rest of a batch back unseen
            run.produce(f"produce-pay{i}", namesrv, PAYMENTS, [_payment(i)])
            wait_for(f"p{i} in the DLQ", lambda: max_offset(broker.addr, f"%DLQ%{G_DLQ}", 0) >= i + 1, 60)
        results = {"part": part, "all": every.result(), "never": never.result(), "dlq": failing.result()}
        dlq_read = run.client("pull-dlq", ["pull_consume.py", namesrv, "CG_REP_DLQ_READER", f"%DLQ%{G_DLQ}", "*",
                                           "--unique", str(DLQ_N), "--props", "seq", "--timeout", "60"],
                              timeout=90).result()
        results["dlq_records"] = dlq_read
    finally:
        run.kill_all()
        broker.stop()
        ns_proc.send_signal(signal.SIGTERM)
        ns_proc.wait(10)
    lake = tmp / "lake"
    results["lag_out"] = _cli("lag", "--store", f"broker-a={store}", "--lake", str(lake),
                              "--snapshot-ts", SNAPSHOT_TS).stdout
    results["dlq_out"] = _cli("dlq", "--store", f"broker-a={store}", "--lake", str(lake)).stdout
    results["lake"] = str(lake)
    return results


def _by_queue(deliveries: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for d in deliveries:
        out[d["queue_id"]].append(d)
    for ds in out.values():
        ds.sort(key=lambda d: d["queue_offset"])
    return out


def _lag_rows(world, group: str) -> dict[int, dict]:
    t = scan_arrow(world["lake"], CONSUMER_LAG_TABLE, None,
                   (pc.field("consumer_group") == group) & (pc.field("topic") == ORDERS))
    rows = t.to_pylist()
    assert len(rows) == len({r["queue_id"] for r in rows}), rows  # one snapshot: one row per queue
    return {r["queue_id"]: r for r in rows}


def test_consumers_saw_what_the_scenario_needs(world):
    assert world["part"]["complete"] and len(world["part"]["deliveries"]) == N1
    assert world["all"]["complete"] and len({d["props"]["seq"] for d in world["all"]["deliveries"]}) == N
    assert world["never"]["complete"]
    assert world["dlq"]["complete"] and len(world["dlq"]["deliveries"]) == DLQ_N * (1 + RETRY_MAX)


def test_group_that_consumed_everything_has_no_lag(world):
    queues = _by_queue(world["all"]["deliveries"])
    rows = _lag_rows(world, G_ALL)
    assert sorted(rows) == sorted(queues) == list(range(QUEUES))
    for q, ds in queues.items():
        r = rows[q]
        assert [d["queue_offset"] for d in ds] == list(range(len(ds)))
        assert (r["consumer_offset"], r["min_offset"], r["max_offset"]) == (len(ds), 0, len(ds))
        assert (r["lag_messages"], r["lag_seconds"], r["lost_messages"]) == (0, 0.0, 0)
        assert r["newest_store_timestamp_ms"] == ds[-1]["store_timestamp"]
        assert r["next_store_timestamp_ms"] is None
        assert r["snapshot_ts"].isoformat() == SNAPSHOT_TS


def test_group_that_consumed_part_has_the_exact_lag(world):
    queues = _by_queue(world["all"]["deliveries"])
    first_batch = {d["props"]["seq"] for d in world["part"]["deliveries"]}
    assert first_batch == {f"o{i}" for i in range(N1)}
    rows = _lag_rows(world, G_PART)
    assert sorted(rows) == list(range(QUEUES))
    total_lag = 0
    for q, ds in queues.items():
        consumed = [d for d in ds if d["props"]["seq"] in first_batch]
        behind = [d for d in ds if d["props"]["seq"] not in first_batch]
        assert ds[:len(consumed)] == consumed  # the first batch sits first in every queue
        r = rows[q]
        assert (r["consumer_offset"], r["max_offset"], r["lag_messages"]) == (len(consumed), len(ds), len(behind))
        if behind:
            assert r["next_store_timestamp_ms"] == behind[0]["store_timestamp"]
            assert r["lag_seconds"] == (ds[-1]["store_timestamp"] - behind[0]["store_timestamp"]) / 1000
        else:
            assert r["lag_seconds"] == 0.0
        assert r["lost_messages"] == 0
        total_lag += r["lag_messages"]
    assert total_lag == N2


def test_group_that_never_committed_lags_by_the_whole_queue(world):
    queues = _by_queue(world["all"]["deliveries"])
    rows = _lag_rows(world, G_NEVER)
    assert sorted(rows) == list(range(QUEUES))
    for q, ds in queues.items():
        r = rows[q]
        assert r["consumer_offset"] is None and r["offset_source"] == "none"
        assert (r["min_offset"], r["max_offset"], r["lag_messages"]) == (0, len(ds), len(ds))
        assert r["next_store_timestamp_ms"] == ds[0]["store_timestamp"]
        assert r["lag_seconds"] == (ds[-1]["store_timestamp"] - ds[0]["store_timestamp"]) / 1000


def test_dlq_messages_and_retry_histories(world):
    by_seq: dict[str, list[dict]] = defaultdict(list)
    for d in world["dlq"]["deliveries"]:
        by_seq[d["props"]["seq"]].append(d)
    dlq_records = {d["props"]["seq"]: d for d in world["dlq_records"]["deliveries"]}
    assert sorted(by_seq) == sorted(dlq_records) == [f"p{i}" for i in range(DLQ_N)]
    rows = scan_arrow(world["lake"], DLQ_MESSAGES_TABLE).to_pylist()
    assert len(rows) == DLQ_N
    by_offset = {r["dlq_commitlog_offset"]: r for r in rows}
    for seq, deliveries in by_seq.items():
        deliveries.sort(key=lambda d: d["reconsume_times"])
        assert [d["reconsume_times"] for d in deliveries] == list(range(1 + RETRY_MAX))
        original, retries = deliveries[0], deliveries[1:]
        rec = dlq_records[seq]
        r = by_offset[rec["commit_log_offset"]]
        assert (r["consumer_group"], r["dlq_topic"], r["original_topic"]) == (G_DLQ, f"%DLQ%{G_DLQ}", PAYMENTS)
        assert decode_offset_msg_id(r["original_msg_id"]).physical_offset == original["commit_log_offset"]
        assert r["keys"] == original["keys"].split(" ") and r["tags"] == "Pay"
        assert r["reconsume_times"] == RETRY_MAX + 1
        assert int(r["first_born_time"].timestamp() * 1000) == original["born_timestamp"]
        assert int(r["original_store_time"].timestamp() * 1000) == original["store_timestamp"]
        assert int(r["dlq_store_time"].timestamp() * 1000) == rec["store_timestamp"]
        assert r["time_to_dlq_s"] == (rec["store_timestamp"] - original["born_timestamp"]) / 1000
        history = r["retry_history"]
        # each retry: a SCHEDULE_TOPIC_XXXX record (waiting for its delay level), then its re-put into
        # %RETRY%<group>, which is what the consumer received
        assert [(h["topic"], h["attempt"]) for h in history] == [
            (t, a) for a in range(1, RETRY_MAX + 1) for t in ("SCHEDULE_TOPIC_XXXX", f"%RETRY%{G_DLQ}")]
        put_back = [h for h in history if h["topic"] == f"%RETRY%{G_DLQ}"]
        assert [h["commitlog_offset"] for h in put_back] == [d["commit_log_offset"] for d in retries]
        assert [int(h["store_time"].timestamp() * 1000) for h in put_back] == [d["store_timestamp"] for d in retries]
        offsets = [h["commitlog_offset"] for h in history]
        assert offsets == sorted(offsets) and offsets[0] > original["commit_log_offset"]
        assert offsets[-1] < rec["commit_log_offset"]


def test_dlq_summary(world):
    [row] = scan_arrow(world["lake"], DLQ_SUMMARY_TABLE).to_pylist()
    dlq = scan_arrow(world["lake"], DLQ_MESSAGES_TABLE).to_pylist()
    ttd = sorted(r["time_to_dlq_s"] for r in dlq)
    assert (row["consumer_group"], row["original_topic"], row["messages"], row["distinct_originals"]) == \
        (G_DLQ, PAYMENTS, DLQ_N, DLQ_N)
    assert row["max_time_to_dlq_s"] == ttd[-1] and row["p50_time_to_dlq_s"] == ttd[1]
    assert row["top_keys"][0] == "pay-common" and row["top_tags"] == ["Pay"]
    assert row["replayed"] == 0
    assert G_DLQ in world["dlq_out"]
