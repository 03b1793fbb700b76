"""Send messages with the C++ client: ``produce.py NAMESRV GROUP SPEC.json [--access-key AK --secret-key SK]
[--stop-file PATH]`` (the sends stop, and the results are printed, once PATH exists).

SPEC: {"topic": str, "messages": [{"seq", "mode": sync|async|oneway|orderly|batch, "keys"?, "tags"?,
"props": {name: value}, "body": str, "arg"? (orderly), "batch"? (batch id: consecutive messages with
the same id go in one send_batch)}]}. Bodies are text: the binding passes them as C strings (no NULs).
Prints {"results": [{"seqs": [...], "mode", "status", "msg_id", "offset"}], "errors": [...]}, results in
spec order. Async sends report from a librocketmq thread; the script waits (bounded, ASYNC_WAIT seconds)
until every one has called back before it shuts the producer down; one that never did is an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from rocketmq.client import Message, Producer

from _common import add_credential_args, announce_shutdown, emit, set_credentials

ASYNC_WAIT = 60.0


class AsyncSends:
    """Async sends in flight. The callbacks run on a librocketmq thread: every change is under the lock,
    and each send settles once (SendMessageAsync may call the exception callback and then fail too)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pending: dict[str, dict] = {}  # seq -> its slot in results
        self.errors: list[dict] = []
        self.keep: list = []  # the Message objects, alive until shutdown

    def start(self, producer: Producer, msg: Message, seq: str, slot: dict) -> None:
        with self.cond:
            self.pending[seq] = slot
            self.keep.append(msg)

        def on_success(res) -> None:
            self._settle(seq, status=int(res.status), msg_id=res.msg_id, offset=res.offset)

        def on_exception(exc) -> None:
            self._settle(seq, error=f"{type(exc).__name__}: {exc}")

        try:
            producer.send_async(msg, on_success, on_exception)
        except Exception as exc:
            self._settle(seq, error=f"{type(exc).__name__}: {exc}")

    def _settle(self, seq: str, error: str | None = None, **result) -> None:
        with self.cond:
            slot = self.pending.pop(seq, None)
            if slot is None:
                return  # settled already
            if error is None:
                slot.update(result)
            else:
                slot["failed"] = True
                self.errors.append({"seq": seq, "mode": "async", "error": error})
            self.cond.notify_all()

    def wait(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: not self.pending, timeout)
            for seq, slot in list(self.pending.items()):
                slot["failed"] = True
                self.errors.append({"seq": seq, "mode": "async",
                                    "error": f"no callback within {timeout:.0f} s of the last send"})
            self.pending.clear()


def build(topic: str, spec: dict) -> Message:
    msg = Message(topic)
    if spec.get("keys"):
        msg.set_keys(spec["keys"])
    if spec.get("tags"):
        msg.set_tags(spec["tags"])
    for name, value in spec.get("props", {}).items():
        msg.set_property(name, value)
    msg.set_body(spec["body"].encode("utf-8"))
    return msg


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("namesrv")
    p.add_argument("group")
    p.add_argument("spec")
    add_credential_args(p)
    p.add_argument("--stop-file", default=None, help="stop sending once this file exists (and print the results)")
    a = p.parse_args()
    namesrv, group = a.namesrv, a.group
    spec = json.loads(open(a.spec, encoding="utf-8").read())
    topic = spec["topic"]
    # the client's own default limit is 128 KiB; the broker's (maxMessageSize) is 4 MiB
    producer = Producer(group, timeout=10_000, max_message_size=4 * 1024 * 1024)
    producer.set_namesrv_addr(namesrv)
    set_credentials(producer, a)
    producer.start()
    results, errors = [], []
    in_flight = AsyncSends()
    messages = spec["messages"]
    started = time.time()
    i = 0
    while i < len(messages):
        if a.stop_file and os.path.exists(a.stop_file):
            break
        m = messages[i]
        mode = m["mode"]
        try:
            if mode == "batch":
                j = i
                while j < len(messages) and messages[j]["mode"] == "batch" and messages[j]["batch"] == m["batch"]:
                    j += 1
                group_specs = messages[i:j]
                res = producer.send_batch([build(topic, s) for s in group_specs])
                results.append({"seqs": [s["seq"] for s in group_specs], "mode": mode, "status": int(res.status),
                                "msg_id": res.msg_id, "offset": res.offset})
                i = j
                continue
            msg = build(topic, m)
            if mode == "async":
                # its slot keeps the spec order; the callback fills it in
                slot = {"seqs": [m["seq"]], "mode": mode, "status": None, "msg_id": None, "offset": None}
                results.append(slot)
                in_flight.start(producer, msg, m["seq"], slot)
                i += 1
                continue
            if mode == "sync":
                res = producer.send_sync(msg)
            elif mode == "orderly":
                res = producer.send_orderly(msg, m["arg"])
            elif mode == "oneway":
                producer.send_oneway(msg)
                res = None
            else:
                raise ValueError(f"unknown mode {mode}")
            results.append({"seqs": [m["seq"]], "mode": mode, "status": None if res is None else int(res.status),
                            "msg_id": None if res is None else res.msg_id,
                            "offset": None if res is None else res.offset})
        except Exception as exc:  # report, keep going: the test shows every failure
            errors.append({"seq": m["seq"], "mode": mode, "error": f"{type(exc).__name__}: {exc}"})
        i += 1
    in_flight.wait(ASYNC_WAIT)
    elapsed = time.time() - started
    # a failed async send is reported in errors only, like the other modes
    results = [r for r in results if not r.pop("failed", False)]
    errors.extend(in_flight.errors)
    # the result first: a producer has nothing to hand back at shutdown, and librocketmq's shutdown
    # can abort (tests/cpp_client.py: _shutdown_abort), which must not lose what was sent
    emit({"pid": os.getpid(), "results": results, "errors": errors, "elapsed": elapsed})
    announce_shutdown()
    producer.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
