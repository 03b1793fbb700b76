"""What a replayed message carries: the one rule, used by the sender and by the tests.

A replay is a new event with the original's payload: body, TAGS, KEYS, flag and *user* properties.
Broker and system properties (the Java client's reserved set, :data:`SYSTEM_PROPERTY_NAMES`) are
never copied: a stale ``DELAY`` would route the replay through the schedule topic, ``TRAN_MSG`` would
make it a half message, ``RETRY_TOPIC``/``ORIGIN_MESSAGE_ID`` would make consumers and reports take it
for a redelivery. Lineage properties say where it came from, and a *replay key* in KEYS lets the
target's index answer "did this one land?" (QUERY_MESSAGE, which Apache brokers answer too).
By default the replay gets a fresh UNIQ_KEY (the producer assigns one); ``keep_msg_id`` keeps the
original for consumers that deduplicate on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from broker.client.producer import Message
from broker.store.constants import PROPERTY_UNIQ_KEY, SYSTEM_PROPERTY_NAMES, TRANSIENT_PROPERTY_PREFIX

# lineage properties added to every replayed message
ORIGIN_BROKER = "RLR_ORIGIN_BROKER"
ORIGIN_TOPIC = "RLR_ORIGIN_TOPIC"
ORIGIN_QUEUE_ID = "RLR_ORIGIN_QUEUE_ID"
ORIGIN_QUEUE_OFFSET = "RLR_ORIGIN_QUEUE_OFFSET"
ORIGIN_COMMITLOG_OFFSET = "RLR_ORIGIN_COMMITLOG_OFFSET"
ORIGIN_MSG_ID = "RLR_ORIGIN_MSG_ID"
ORIGIN_UNIQ_KEY = "RLR_ORIGIN_UNIQ_KEY"
ORIGIN_STORE_TIME = "RLR_ORIGIN_STORE_TIME"
RUN_ID = "RLR_RUN_ID"
LINEAGE_PROPERTY_NAMES = (ORIGIN_BROKER, ORIGIN_TOPIC, ORIGIN_QUEUE_ID, ORIGIN_QUEUE_OFFSET, ORIGIN_COMMITLOG_OFFSET,
                          ORIGIN_MSG_ID, ORIGIN_UNIQ_KEY, ORIGIN_STORE_TIME, RUN_ID)

REPLAY_KEY_PREFIX = "rlr"
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")


def validate_run_id(run_id: str) -> str:
    """Run ids go into KEYS (space-separated) and into a Delta partition path: a safe alphabet only."""
    if not RUN_ID_PATTERN.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} may only use 1-64 letters, digits, '.', '_' and '-'")
    return run_id


def replay_key(run_id: str, broker: str, commitlog_offset: int) -> str:
    """``rlr:<run>:<broker>:<commitlog offset>``: unique per selected message and run."""
    return f"{REPLAY_KEY_PREFIX}:{run_id}:{broker}:{commitlog_offset}"


def user_properties(properties: Mapping[str, str] | Sequence[tuple[str, str]] | None) -> dict[str, str]:
    """The properties a producer set itself: everything but the reserved, transient and lineage ones
    (a replay of a replay gets fresh lineage, not two)."""
    items = properties.items() if isinstance(properties, Mapping) else (properties or ())
    return {k: v for k, v in items
            if k not in SYSTEM_PROPERTY_NAMES and k not in LINEAGE_PROPERTY_NAMES
            and not k.startswith(TRANSIENT_PROPERTY_PREFIX)}


@dataclass(frozen=True)
class Origin:
    """Where a selected message was stored (one ``messages`` row)."""

    broker: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    offset_msg_id: str
    uniq_key: str | None
    store_timestamp_ms: int


def replay_message(origin: Origin, *, run_id: str, target_topic: str, body: bytes,
                   properties: Mapping[str, str] | Sequence[tuple[str, str]] | None, keys: Sequence[str] | None,
                   tags: str | None, flag: int = 0, keep_msg_id: bool = False) -> Message:
    """The message a replay sends for ``origin``."""
    props = user_properties(properties)
    props.update({
        ORIGIN_BROKER: origin.broker,
        ORIGIN_TOPIC: origin.topic,
        ORIGIN_QUEUE_ID: str(origin.queue_id),
        ORIGIN_QUEUE_OFFSET: str(origin.queue_offset),
        ORIGIN_COMMITLOG_OFFSET: str(origin.commitlog_offset),
        ORIGIN_MSG_ID: origin.offset_msg_id,
        ORIGIN_STORE_TIME: str(origin.store_timestamp_ms),
        RUN_ID: run_id,
    })
    if origin.uniq_key:
        props[ORIGIN_UNIQ_KEY] = origin.uniq_key
        if keep_msg_id:
            props[PROPERTY_UNIQ_KEY] = origin.uniq_key  # Producer keeps a UNIQ_KEY that is already set
    all_keys = [k for k in (keys or ()) if k] + [replay_key(run_id, origin.broker, origin.commitlog_offset)]
    return Message(topic=target_topic, body=body, tags=tags or None, keys=all_keys, properties=props, flag=flag)
