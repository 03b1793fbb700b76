"""Send messages with the C++ client: ``produce.py NAMESRV GROUP SPEC.json``.

SPEC: {"topic": str, "messages": [{"seq", "mode": sync|oneway|orderly|batch, "keys"?, "tags"?,
"props": {name: value}, "body": str, "arg"? (orderly), "batch"? (batch id: consecutive messages with
the same id go in one send_batch)}]}. Bodies are text: the binding passes them as C strings (no NULs).
Prints {"results": [{"seqs": [...], "mode", "status", "msg_id", "offset"}], "errors": [...]}.
"""

from __future__ import annotations

import json
import os
import sys
import time

from rocketmq.client import Message, Producer

from _common import emit


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
    namesrv, group, spec_path = sys.argv[1:4]
    spec = json.loads(open(spec_path, encoding="utf-8").read())
    topic = spec["topic"]
    # the client's own default limit is 128 KiB; the broker's (maxMessageSize) is 4 MiB
    producer = Producer(group, timeout=10_000, max_message_size=4 * 1024 * 1024)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    results, errors = [], []
    messages = spec["messages"]
    started = time.time()
    i = 0
    while i < len(messages):
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
    elapsed = time.time() - started
    producer.shutdown()
    emit({"pid": os.getpid(), "results": results, "errors": errors, "elapsed": elapsed})
    return 0


if __name__ == "__main__":
    sys.exit(main())
