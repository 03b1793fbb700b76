"""Payload tables: ``payload_<topic>`` (typed bodies of a declared topic) and ``payload_quarantine``
(the bodies that did not decode), see :mod:`pipelines.payloads`.

The quarantine is one fixed table (:data:`PAYLOAD_QUARANTINE`). A payload table's columns depend on
its topic's declared schema, so its contract is built by :func:`payload_contract`: the metadata
columns (:data:`PAYLOAD_METADATA_NAMES`, taken with their types and descriptions from the
``messages`` contract, so they are the same facts) followed by the payload's fields.

Table names (:func:`payload_table_name`): ``payload_`` + the topic lower-cased with every character
outside ``[a-z0-9]`` replaced by ``_`` (``Orders`` → ``payload_orders``, ``order-events.v1`` →
``payload_order_events_v1``). Two declared topics that map to the same name, or a topic that maps
to ``payload_quarantine``, are refused by the declarations.
"""

from __future__ import annotations

import re

import pyarrow as pa

from schemas.contract import Column, TableContract, description_of
from schemas.messages import MESSAGES

TABLE_PREFIX = "payload_"
_NOT_NAME_CHAR = re.compile(r"[^a-z0-9]")

# the facts each payload row repeats from its message, in this order (names and types: messages)
PAYLOAD_METADATA_NAMES: tuple[str, ...] = (
    "broker_name", "commitlog_offset", "queue_id", "queue_offset", "offset_msg_id", "uniq_key", "keys", "tags",
    "store_timestamp", "store_time", "store_date")
PAYLOAD_METADATA_COLUMNS: tuple[Column, ...] = tuple(MESSAGES.column(n) for n in PAYLOAD_METADATA_NAMES)
PAYLOAD_PARTITION_BY: tuple[str, ...] = ("store_date",)
PAYLOAD_KEY: tuple[str, ...] = ("broker_name", "commitlog_offset")

PAYLOAD_QUARANTINE = TableContract(
    name="payload_quarantine",
    description="message bodies of declared payload topics that did not decode with the topic's declared schema",
    columns=[
        MESSAGES.column("broker_name"),
        MESSAGES.column("topic"),
        MESSAGES.column("commitlog_offset"),
        MESSAGES.column("store_timestamp"),
        ("reason", pa.string(), "why the body did not decode (e.g. 'field amount: expected number, got string')"),
        ("body", pa.binary(), "the body as the producer sent it (decompressed), unchanged"),
        MESSAGES.column("store_date"),
    ],
    partition_by=PAYLOAD_PARTITION_BY,
    key=PAYLOAD_KEY,
    required=("topic", "reason"),
)

PAYLOAD_QUARANTINE_TABLE = PAYLOAD_QUARANTINE.name
PAYLOAD_QUARANTINE_COLUMNS = list(PAYLOAD_QUARANTINE.columns)
PAYLOAD_QUARANTINE_SCHEMA = PAYLOAD_QUARANTINE.schema
PAYLOAD_QUARANTINE_PARTITION_BY = list(PAYLOAD_QUARANTINE.partition_by)


def payload_table_name(topic: str) -> str:
    """``payload_<topic>`` with the topic lower-cased and every character outside ``[a-z0-9]``
    replaced by ``_`` (the module doc's rule)."""
    return TABLE_PREFIX + _NOT_NAME_CHAR.sub("_", topic.lower())


def payload_contract(topic: str, payload: pa.Schema, *, table_name: str | None = None,
                     source: str = "", key_fields: tuple[str, ...] = ()) -> TableContract:
    """The contract of topic ``topic``'s payload table: metadata columns, then ``payload``'s fields
    (a field's description: its ``comment`` metadata when the schema documented it, else a generic
    one naming ``source``). ``key_fields`` (payload fields the producer uses as message keys) are
    named in the table's description. A payload field named like a metadata column is refused (ValueError):
    the row would hold two facts under one name."""
    clash = [f.name for f in payload if f.name in PAYLOAD_METADATA_NAMES]
    if clash:
        raise ValueError(f"payload field(s) {', '.join(map(repr, clash))} of topic {topic!r} have the name of "
                         f"a metadata column ({', '.join(PAYLOAD_METADATA_NAMES)})")
    where = f" ({source})" if source else ""
    keyed = f"; the producer keys messages by {', '.join(key_fields)}" if key_fields else ""
    columns = list(PAYLOAD_METADATA_COLUMNS) + [
        (f.name, f.type, description_of(f) or f"payload field {f.name} of topic {topic}{where}") for f in payload]
    return TableContract(
        name=table_name or payload_table_name(topic),
        description=f"one row per message of topic {topic} whose body decoded{where}; typed payload fields "
                    f"after the message columns{keyed}",
        columns=columns,
        partition_by=PAYLOAD_PARTITION_BY,
        key=PAYLOAD_KEY,
        required=("commitlog_offset",),
    )
