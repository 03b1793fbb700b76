"""The replay part of ``make demo``: bring the demo broker back, "fix" the failing consumer, and replay.

    python -m pipelines.replay.demo --start STORE_DIR --lake LAKE_DIR [--spark-submit PATH]

Starts a name server and the demo broker on its store again (the replay target is the same cluster,
as when an operator drains a DLQ after a fix), then runs the replay job twice with spark-submit, the
way an operator would:

1. ``--dlq demo-fails``: the dead letters of the group that failed every payment, back to ``Payments``,
   while a healthy consumer of ``demo-fails`` (the fixed service) runs and receives them;
2. ``--topic Orders --since .. --until ..``: the first half (by store time) of the ingested orders
   into a new topic ``OrdersReplayed`` (created first with ``rocketlake admin updateTopic``'s call:
   replays never auto-create topics).

Prints each command, the job's plan and outcome, what the healed consumer received, and the
``replay_runs`` rows. Exit 0 when both runs SUCCEEDED and the consumer got every DLQ message.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.compute as pc

from broker.client import Admin, PushConsumer
from broker.demo_traffic import DEMO_DELAY_LEVELS, FAILS, ORDERS, PAYMENTS
from broker.store.topics import dlq_topic
from pipelines.lake import scan_arrow
from schemas.replay import REPLAY_RUNS_TABLE

log = logging.getLogger("demo.replay")

REPLAYED_TOPIC = "OrdersReplayed"
CONSUME_WAIT_S = 60.0


def _iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat(timespec="milliseconds")


def first_half_of_orders(lake: str) -> tuple[str, str, int]:
    """(since, until, count): the first half of the ingested Orders by store time."""
    t = scan_arrow(lake, "messages", columns=["topic", "store_time"])
    times = sorted(t.filter(pc.equal(t["topic"], ORDERS))["store_time"].to_pylist())
    if not times:
        raise SystemExit(f"no {ORDERS} messages in {lake}: run the ingest first")
    cut = times[len(times) // 2]
    return _iso(times[0]), _iso(cut), sum(1 for x in times if x < cut)


def submit(spark_submit: str, lake: str, namesrv: str, *args: str) -> int:
    cmd = [spark_submit, "--master", "local[2]", "--conf", "spark.ui.showConsoleProgress=false",
           "jobs/replay.py", "--lake", lake, "--namesrv", namesrv, *args]
    print(f"$ {shlex.join(cmd)}", flush=True)
    env = dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
               PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    with open(Path(lake).parent / "replay.log", "ab") as err:
        return subprocess.run(cmd, env=env, stderr=err, cwd=Path(__file__).resolve().parents[2]).returncode


def print_runs(lake: str, run_ids: list[str]) -> None:
    rows = [r for r in scan_arrow(lake, REPLAY_RUNS_TABLE).to_pylist() if r["run_id"] in run_ids]
    print(f"{'RUN':<22} {'STATUS':<11} {'PLANNED':>8} {'SENT':>6} {'FAILED':>7} {'UNKNOWN':>8} {'SKIPPED':>8}  SELECTION")
    for r in sorted(rows, key=lambda r: r["started_at"]):
        print(f"{r['run_id']:<22} {r['status']:<11} {r['planned']:>8} {r['sent']:>6} {r['failed']:>7} "
              f"{r['unknown']:>8} {r['skipped']:>8}  {r['selection']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--start", required=True, metavar="STORE_DIR", help="the demo broker's store")
    ap.add_argument("--lake", required=True, metavar="LAKE_DIR", help="the demo lake (ingested)")
    ap.add_argument("--spark-submit", default=str(Path(sys.executable).parent / "spark-submit"),
                    help="spark-submit to run the job with (default: the one beside this Python)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from broker.server.launcher import start_broker, start_namesrv

    store, lake = Path(args.start).resolve(), str(Path(args.lake).resolve())
    t = scan_arrow(lake, "messages", columns=["topic"])
    dlq_count = pc.sum(pc.equal(t["topic"], dlq_topic(FAILS)).cast("int64")).as_py() or 0
    since, until, half = first_half_of_orders(lake)
    ns, namesrv = start_namesrv(store.parent)
    broker = start_broker(store, namesrv, {"messageDelayLevel": DEMO_DELAY_LEVELS,
                                           "mappedFileSizeCommitLog": 4 * 1024 * 1024,
                                           "autoCreateTopicEnable": False})
    print(f"name server {namesrv}, broker {broker.addr} (store {store}) back up as the replay target", flush=True)
    received: list[str] = []
    lock = threading.Lock()

    def healed(msg) -> None:   # the fixed payment service: succeeds on every message
        with lock:
            received.append(msg.properties.get("RLR_ORIGIN_MSG_ID", "?"))

    consumer = None
    try:
        with Admin(namesrv) as admin:
            admin.create_topic(broker.addr, REPLAYED_TOPIC, queues=4)
            admin.wait_writable(REPLAYED_TOPIC)
        consumer = PushConsumer(FAILS, namesrv, healed, topic=PAYMENTS).start()
        time.sleep(1.0)
        print(f"== replay the {dlq_count} dead letters of {FAILS} back to {PAYMENTS} (consumer fixed)", flush=True)
        rc_dlq = submit(args.spark_submit, lake, namesrv, "--dlq", FAILS, "--run-id", "demo-dlq")
        deadline = time.monotonic() + CONSUME_WAIT_S
        while time.monotonic() < deadline and len(received) < dlq_count:
            time.sleep(0.2)
        print(f"{FAILS} (fixed) received {len(received)} of {dlq_count} replayed dead letters", flush=True)
        print(f"== replay the first half of {ORDERS} by store time ({half} messages) into {REPLAYED_TOPIC}",
              flush=True)
        rc_range = submit(args.spark_submit, lake, namesrv, "--topic", ORDERS, "--since", since, "--until", until,
                          "--target-topic", REPLAYED_TOPIC, "--run-id", "demo-orders-range", "--rate", "2000")
    finally:
        if consumer is not None:
            consumer.shutdown()
        broker.stop()
        ns.terminate()
        ns.wait(10)
    print("== replay runs (replay_runs)")
    print_runs(lake, ["demo-dlq", "demo-orders-range"])
    ok = rc_dlq == 0 and rc_range == 0 and len(received) >= dlq_count
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # pyarrow's scan threads over delta-rs's Python filesystem handler can still be winding down
    # at interpreter teardown and abort it ("terminate called without an active exception") after
    # all the work is done; skip the teardown instead of failing the demo on it
    os._exit(code)
