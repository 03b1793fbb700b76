"""Pull every message of a topic with the C++ PullConsumer (it pulls queue by queue from offset 0,
keeping offsets in memory): ``pull_consume.py NAMESRV GROUP TOPIC EXPRESSION --unique N --props a,b``
(``--access-key AK --secret-key SK`` to sign).
Repeats ``pull`` until ``N`` distinct ``seq`` values were seen or the timeout passes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from rocketmq.client import PullConsumer

from _common import add_credential_args, delivery, emit, set_credentials


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("namesrv")
    p.add_argument("group")
    p.add_argument("topic")
    p.add_argument("expression")
    p.add_argument("--unique", type=int, required=True)
    p.add_argument("--props", default="seq")
    p.add_argument("--timeout", type=float, default=60.0)
    add_credential_args(p)
    a = p.parse_args()
    names = [n for n in a.props.split(",") if n]
    consumer = PullConsumer(a.group)
    consumer.set_namesrv_addr(a.namesrv)
    set_credentials(consumer, a)
    consumer.start()
    deliveries, seqs, rounds = [], set(), 0
    deadline = time.time() + a.timeout
    while len(seqs) < a.unique and time.time() < deadline:
        rounds += 1
        got = 0
        for msg in consumer.pull(a.topic, a.expression, max_num=32):
            d = delivery(msg, names)
            deliveries.append(d)
            seqs.add(d["props"].get("seq"))
            got += 1
        if not got:
            time.sleep(0.2)
    consumer.shutdown()
    emit({"pid": os.getpid(), "complete": len(seqs) >= a.unique, "deliveries": deliveries, "rounds": rounds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
