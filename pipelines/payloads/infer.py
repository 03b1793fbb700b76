"""``rocketlake schema infer``: a JSON Schema proposed from a topic's bodies in the lake.

A starting point for a declaration, not a contract: it says what the sampled bodies had. Types are
JSON's (an integer field that also held ``2.5`` is ``number``); a field missing from some bodies is
left out of ``required``; a field that was null in some is ``["type", "null"]``; objects nest;
an array's ``items`` merge every element seen (``{}`` when only empty arrays were seen); a field
with values of several kinds lists them all (``["integer", "string"]``), which the JSON codec then
refuses until a person decides. Strings that all parse as ISO-8601 date-times with a zone get
``"format": "date-time"``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable

import pyarrow.compute as pc
import pyarrow.fs as pafs

from pipelines.payloads.json_codec import json_kind
from pipelines.storage import Location
from schemas.messages import MESSAGES_TABLE

DEFAULT_SAMPLE = 1000
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,6})?([Zz]|[+-]\d{2}:\d{2})$")
_ORDER = ("boolean", "integer", "number", "string", "array", "object", "null")


class InferError(ValueError):
    """Nothing to infer from (no messages, bodies that are not JSON objects): one line for users."""


def sample_bodies(lake: "str | os.PathLike | Location", topic: str, sample: int = DEFAULT_SAMPLE,
                  broker: str | None = None) -> list[tuple[int, bytes]]:
    """Up to ``sample`` ``(commitlog offset, body)`` of messages stored in ``topic`` (pruned on the
    broker partition when ``broker`` is given); fewer reads than a full scan: the dataset stops
    after ``sample`` matching rows."""
    from pipelines.delta_commit import open_delta
    from pipelines.lake import table_location

    table = table_location(lake, MESSAGES_TABLE)
    dt = open_delta(table)
    if dt is None:
        raise InferError(f"{table}: no messages table (ingest the store first)")
    flt = pc.field("topic") == topic
    if broker is not None:
        flt = flt & (pc.field("broker_name") == broker)
    fs, root = table.filesystem()  # through the location's filesystem, as pipelines.lake reads
    dataset = dt.to_pyarrow_dataset(filesystem=pafs.SubTreeFileSystem(root, fs))
    rows = dataset.head(sample, columns=["commitlog_offset", "body"], filter=flt)
    return list(zip(rows.column("commitlog_offset").to_pylist(), rows.column("body").to_pylist()))


def infer_json_schema(bodies: Iterable[tuple[int, bytes]], topic: str) -> dict:
    """The JSON Schema of ``bodies`` (``(commitlog offset, body)``, the offset names a bad body)."""
    merged: dict | None = None
    count = 0
    for offset, body in bodies:
        try:
            value = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InferError(f"topic {topic!r}: the body at commitlog offset {offset} is not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise InferError(f"topic {topic!r}: the body at commitlog offset {offset} is not a JSON object")
        merged = _merge(merged, _schema_of(value)) if merged is not None else _schema_of(value)
        count += 1
    if merged is None:
        raise InferError(f"topic {topic!r}: no messages in the lake's messages table")
    return {"$schema": SCHEMA_DIALECT, "title": topic,
            "description": f"inferred from {count} message bodies of topic {topic}", **_finish(merged)}


# A working schema: {"types": set of JSON kinds, "props": {name: (schema, times seen)}, "rows": objects
# seen, "items": schema or None, "date_time": all strings were date-times}
def _schema_of(value: Any) -> dict:
    kind = json_kind(value)
    node: dict = {"types": {kind}, "props": {}, "rows": 0, "items": None, "date_time": None}
    if kind == "object":
        node["rows"] = 1
        node["props"] = {k: (_schema_of(v), 1) for k, v in value.items()}
    elif kind == "array":
        for item in value:
            node["items"] = _schema_of(item) if node["items"] is None else _merge(node["items"], _schema_of(item))
    elif kind == "string":
        node["date_time"] = bool(_DATE_TIME.match(value))
    return node


def _merge(a: dict, b: dict) -> dict:
    props = dict(a["props"])
    for name, (schema, seen) in b["props"].items():
        if name in props:
            props[name] = (_merge(props[name][0], schema), props[name][1] + seen)
        else:
            props[name] = (schema, seen)
    items = a["items"] if b["items"] is None else b["items"] if a["items"] is None else _merge(a["items"], b["items"])
    date_time = a["date_time"] if b["date_time"] is None else b["date_time"] if a["date_time"] is None \
        else a["date_time"] and b["date_time"]
    return {"types": a["types"] | b["types"], "props": props, "rows": a["rows"] + b["rows"], "items": items,
            "date_time": date_time}


def _finish(node: dict) -> dict:
    types = set(node["types"])
    if {"integer", "number"} <= types:
        types.discard("integer")
    names = sorted(types, key=_ORDER.index)
    out: dict[str, Any] = {"type": names[0] if len(names) == 1 else names}
    if "object" in types:
        out["properties"] = {k: _finish(s) for k, (s, _) in node["props"].items()}
        required = [k for k, (s, seen) in node["props"].items() if seen == node["rows"] and "null" not in s["types"]]
        if required:
            out["required"] = required
    if "array" in types:
        out["items"] = _finish(node["items"]) if node["items"] is not None else {}
    if "string" in types and node["date_time"]:
        out["format"] = "date-time"
    return out




def infer_topic_schema(lake: "str | os.PathLike | Location", topic: str, sample: int = DEFAULT_SAMPLE,
                       broker: str | None = None) -> dict:
    """:func:`infer_json_schema` over :func:`sample_bodies`; :class:`InferError` when there is
    nothing to infer from."""
    if sample <= 0:
        raise InferError("--sample must be > 0")
    return infer_json_schema(sample_bodies(lake, topic, sample, broker), topic)

