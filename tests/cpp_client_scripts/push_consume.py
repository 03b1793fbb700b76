"""Consume with the C++ PushConsumer until enough messages arrived, then wait ``settle`` seconds more
(to catch extra deliveries) and shut down (which commits the offsets).

``push_consume.py NAMESRV GROUP TOPIC EXPRESSION --unique N --total N --props a,b,c [--fail]
[--timeout S] [--settle S] [--orderly] [--threads N] [--access-key AK --secret-key SK]``: stops once ``N`` distinct values of property ``seq`` and
``total`` deliveries were seen (or at the timeout). ``--fail`` answers RECONSUME_LATER for every
message (status 1 returned from the raw callback: a raising Python callback leaves the C return value
to chance). Prints {"deliveries": [...], "complete": bool, ...}.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from rocketmq.client import PushConsumer, RecvMessage, dll
from rocketmq.ffi import _CConsumeStatus
from rocketmq.exceptions import ffi_check

from _common import add_credential_args, delivery, emit, set_credentials


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("namesrv")
    p.add_argument("group")
    p.add_argument("topic")
    p.add_argument("expression")
    p.add_argument("--unique", type=int, required=True)
    p.add_argument("--total", type=int, default=0)
    p.add_argument("--props", default="seq")
    p.add_argument("--fail", action="store_true")
    p.add_argument("--orderly", action="store_true")
    p.add_argument("--threads", type=int, default=1,
                   help="consume threads (default 1: with more, librocketmq 1.2.3 may store a smaller "
                        "offset after a larger one, as two batches of a queue finish out of order)")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--settle", type=float, default=2.0)
    add_credential_args(p)
    a = p.parse_args()
    names = [n for n in a.props.split(",") if n]
    lock = threading.Lock()
    deliveries: list[dict] = []
    seqs: set[str] = set()
    done = threading.Event()
    status = (_CConsumeStatus.RECONSUME_LATER if a.fail else _CConsumeStatus.CONSUME_SUCCESS).value

    def on_message(_consumer, cmsg):
        try:
            d = delivery(RecvMessage(cmsg), names)
            with lock:
                deliveries.append(d)
                if "seq" in d["props"]:
                    seqs.add(d["props"]["seq"])
                if len(seqs) >= a.unique and len(deliveries) >= a.total:
                    done.set()
        except Exception as exc:  # never let an exception cross the C boundary
            sys.stderr.write(f"callback error: {exc!r}\n")
        return status

    consumer = PushConsumer(a.group, orderly=a.orderly)
    consumer.set_namesrv_addr(a.namesrv)
    consumer.set_thread_count(a.threads)
    set_credentials(consumer, a)
    # one message per callback: with larger batches the C wrapper stops at the first failure and the
    # rest of the batch is sent back without ever reaching the callback
    consumer.set_message_batch_max_size(1)
    ffi_check(dll.Subscribe(consumer._handle, a.topic.encode(), a.expression.encode()))
    consumer._register_callback(on_message)
    started = time.time()
    consumer.start()
    sys.stdout.write(f"started pid={os.getpid()}\n")
    sys.stdout.flush()
    complete = done.wait(a.timeout)
    completed_at = time.time()
    if complete:
        time.sleep(a.settle)
    consumer.shutdown()
    with lock:
        result = {"pid": os.getpid(), "complete": complete, "deliveries": list(deliveries),
                  "started_at": started, "completed_at": completed_at, "unique": len(seqs)}
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
