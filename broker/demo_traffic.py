"""Sample traffic for ``make demo``: orders and payments, a group that keeps up, one that lags, one
that fails every message into the DLQ. Uses only rocketlake's client against a running broker.

    python -m broker.demo_traffic --namesrv 127.0.0.1:9876 [--orders 400] [--payments 150]
    python -m broker.demo_traffic --start STORE_DIR      # also starts (and cleanly stops) a name server and broker
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from broker.client import Admin, Message, Producer, PushConsumer
from broker.store.config_files import SubscriptionGroupConfig

log = logging.getLogger("demo")

ORDERS, PAYMENTS = "Orders", "Payments"
KEEPS_UP, LAGS, FAILS = "demo-keeps-up", "demo-lags", "demo-fails"
DEMO_DELAY_LEVELS = " ".join(["1s"] * 18)  # retries come back after a second (Makefile's verify uses the same)


def run(namesrv: str, orders: int, payments: int, timeout_s: float = 90.0) -> dict:
    with Admin(namesrv) as admin:
        brokers = admin.broker_addrs()
        if not brokers:
            raise SystemExit(f"no broker registered with the name server {namesrv}")
        addr = next(iter(brokers.values()))
        admin.create_topic(addr, ORDERS, queues=4)
        admin.create_topic(addr, PAYMENTS, queues=2)
        admin.create_subscription_group(addr, SubscriptionGroupConfig(FAILS, retry_max_times=2))
    seen = {KEEPS_UP: 0, LAGS: 0, FAILS: 0}

    def counter(group):
        def on_message(_msg):
            seen[group] += 1
        return on_message

    def fail(_msg):
        seen[FAILS] += 1
        raise RuntimeError("payment service unavailable")

    keeps_up = PushConsumer(KEEPS_UP, namesrv, counter(KEEPS_UP), topic=ORDERS).start()
    lags = PushConsumer(LAGS, namesrv, counter(LAGS), topic=ORDERS).start()
    fails = PushConsumer(FAILS, namesrv, fail, topic=PAYMENTS).start()
    time.sleep(1.0)
    with Producer("demo-producer", namesrv) as producer:
        for i in range(orders):
            producer.send(Message(ORDERS, json.dumps({"order": i, "amount": 10 + i % 90}).encode(),
                                  tags="created" if i % 3 else "paid", keys=[f"order-{i}", f"customer-{i % 50}"]))
            if i == orders // 3:
                lags.shutdown()  # this group stops consuming a third of the way in: it lags from here on
        for i in range(payments):
            producer.send(Message(PAYMENTS, json.dumps({"payment": i, "order": i}).encode(), tags="card",
                                  keys=[f"payment-{i}", f"order-{i}"]))
    deadline = time.time() + timeout_s
    while time.time() < deadline and (seen[KEEPS_UP] < orders or seen[FAILS] < 3 * payments):
        time.sleep(0.5)
    keeps_up.shutdown()
    fails.shutdown()
    with Admin(namesrv) as admin:
        summary = {}
        for group, topic in ((KEEPS_UP, ORDERS), (LAGS, ORDERS), (FAILS, PAYMENTS)):
            stats = admin.consumer_progress(addr, group, topic)
            summary[group] = {"topic": topic,
                              "broker_offset": sum(w.broker_offset for w in stats.offset_table.values()),
                              "consumer_offset": sum(w.consumer_offset for w in stats.offset_table.values()),
                              "lag": sum(w.lag for w in stats.offset_table.values()),
                              "delivered": seen[group]}
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--namesrv", help="name server of a running broker")
    ap.add_argument("--start", metavar="STORE_DIR", help="start a name server and a broker on this store first")
    ap.add_argument("--orders", type=int, default=400)
    ap.add_argument("--payments", type=int, default=150)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if bool(args.namesrv) == bool(args.start):
        ap.error("give exactly one of --namesrv or --start")
    if args.start:
        from pathlib import Path

        from broker.server.launcher import start_broker, start_namesrv

        store = Path(args.start).resolve()
        store.parent.mkdir(parents=True, exist_ok=True)
        ns, ns_addr = start_namesrv(store.parent)
        broker = start_broker(store, ns_addr, {"messageDelayLevel": DEMO_DELAY_LEVELS,
                                               "mappedFileSizeCommitLog": 4 * 1024 * 1024})
        print(f"name server {ns_addr}, broker {broker.addr}, store {store}", flush=True)
        try:
            summary = run(ns_addr, args.orders, args.payments)
        finally:
            code = broker.stop()
            ns.terminate()
            ns.wait(10)
        print(f"broker stopped cleanly (exit {code})")
    else:
        summary = run(args.namesrv, args.orders, args.payments)
    print(f"{'GROUP':<16} {'TOPIC':<10} {'BROKER OFFSET':>14} {'CONSUMER OFFSET':>16} {'LAG':>6} {'DELIVERED':>10}")
    for group, s in summary.items():
        print(f"{group:<16} {s['topic']:<10} {s['broker_offset']:>14} {s['consumer_offset']:>16} {s['lag']:>6} "
              f"{s['delivered']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
