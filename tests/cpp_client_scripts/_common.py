"""Shared bits of the C++-client scripts (run in their own process: a librocketmq crash must not take
the test runner down). Each script prints exactly one JSON document as the last line of stdout, or
right before :data:`SHUTDOWN_MARKER` when it reports before shutting its client down."""

from __future__ import annotations

import base64
import json
import sys
import time


def text(value) -> str | None:
    """A c_char_p result (bytes, or None) as str; '' (what the C++ client returns for "absent") → None."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return value or None


def delivery(msg, prop_names: list[str]) -> dict:
    """Everything the binding exposes about a received message, JSON-ready."""
    body = msg.body or b""
    props = {}
    for name in prop_names:
        v = text(msg.get_property(name))
        if v is not None:
            props[name] = v
    return {
        "topic": msg.topic,
        "id": msg.id,
        "tags": text(msg.tags),
        "keys": text(msg.keys),
        "body": base64.b64encode(body).decode("ascii"),
        "props": props,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commit_log_offset": msg.commit_log_offset,
        "reconsume_times": msg.reconsume_times,
        "store_size": msg.store_size,
        "born_timestamp": msg.born_timestamp,
        "store_timestamp": msg.store_timestamp,
        "received_at": time.time(),
    }


def add_credential_args(parser) -> None:
    """``--access-key``/``--secret-key``: sign every request (ACL), as ``set_session_credentials`` does."""
    parser.add_argument("--access-key", default=None)
    parser.add_argument("--secret-key", default=None)


def set_credentials(client, args) -> None:
    """Credentials from :func:`add_credential_args` onto a producer or consumer (channel "": the
    client's default, which it sends as OnsChannel)."""
    if args.access_key is not None:
        client.set_session_credentials(args.access_key, args.secret_key or "", "")


# Printed after the result by a script that shuts its client down last (tests/cpp_client.py accepts
# librocketmq's known abort in shutdown() only after this line)
SHUTDOWN_MARKER = "shutting down"


def announce_shutdown() -> None:
    sys.stdout.write(SHUTDOWN_MARKER + "\n")
    sys.stdout.flush()


def emit(result: dict) -> None:
    sys.stdout.write("\n" + json.dumps(result, ensure_ascii=True) + "\n")
    sys.stdout.flush()
