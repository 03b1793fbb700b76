"""The ingest writes typed payload tables: a store written by our broker, declarations in the lake.

Round 1: JSON orders (nested, lists, unicode, nulls), text notes, malformed bodies and an undeclared
topic; the batch ingest writes ``payload_orders`` and ``payload_notes`` with the values sent, the
bad bodies in ``payload_quarantine`` with their reason, and nothing twice on a rerun. Round 2: more
traffic and a declaration that adds a field (the table evolves, old rows read null), then a topic
declared late (its table is back-filled from the start of the store), then an incompatible change
(refused before any file is written).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.client import Message, Producer
from broker.store.message_id import decode_offset_msg_id
from pipelines.ingest import ingest
from pipelines.job_args import StoreSpec
from pipelines.lake import scan_arrow, table_version
from pipelines.payloads.errors import PayloadSchemaError
from pipelines.reports.audit import run_audit
from schemas.messages import MESSAGES_TABLE
from tests.broker_harness import cluster

ORDER_SCHEMA = {
    "type": "object", "required": ["order_id", "amount"],
    "properties": {
        "order_id": {"type": "string"}, "amount": {"type": "number"}, "note": {"type": ["string", "null"]},
        "customer": {"type": "object", "properties": {"name": {"type": "string"}, "vip": {"type": "boolean"}}},
        "lines": {"type": "array", "items": {"type": "object",
                                             "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}}},
    },
}


def _declare(lake: Path, orders: dict, extra: str = "") -> None:
    conf = lake / "_rocketlake"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "orders.schema.json").write_text(json.dumps(orders))
    (conf / "payload_schemas.toml").write_text(
        '[topics.Orders]\nformat = "json"\nschema = "orders.schema.json"\n\n'
        '[topics.Notes]\nformat = "text"\n' + extra)


def _order(i: int) -> dict:
    return {"order_id": f"o-{i}", "amount": 10.5 + i, "note": None if i % 2 else f"bitte schnell ✓ {i}",
            "customer": {"name": f"Zoë {i}", "vip": i % 3 == 0},
            "lines": [{"sku": f"s{j}", "qty": j + 1} for j in range(i % 3)]}


def _send(store_root: Path, messages: list[tuple[str, bytes]]) -> list[int]:
    """Send through our broker; the commitlog offset of each acknowledged message, in order."""
    with cluster(store_root) as broker, Producer("PG_PAYLOAD", broker.namesrv) as producer:
        return [decode_offset_msg_id(producer.send(Message(topic, body)).offset_msg_id).physical_offset
                for topic, body in messages]


def _rows(lake: str, table: str) -> dict[int, dict]:
    return {r["commitlog_offset"]: r for r in scan_arrow(lake, table).to_pylist()}


def test_batch_ingest_writes_typed_payload_tables_and_quarantine(spark, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _declare(lake, ORDER_SCHEMA)
    sent = [("Orders", json.dumps(_order(i), ensure_ascii=False).encode()) for i in range(6)]
    sent += [("Notes", "grüße, 日本".encode()), ("Notes", b"\xff\xfe not utf-8"),
             ("Orders", b'{"order_id": "bad", "amount": '),               # truncated JSON
             ("Orders", b'{"order_id": "o-x", "amount": "lots"}'),         # a string where a number goes
             ("Other", b"undeclared topic: no payload table")]
    offsets = _send(tmp_path, sent)
    spec = StoreSpec("broker-a", str(tmp_path / "store"))

    [run] = ingest(spark, [spec], str(lake))
    assert run.rows["payload_orders"] == 6 and run.rows["payload_notes"] == 1
    assert run.rows["payload_quarantine"] == 3

    orders = _rows(str(lake), "payload_orders")
    assert sorted(orders) == offsets[:6]
    for i, off in enumerate(offsets[:6]):
        row, want = orders[off], _order(i)
        assert {k: row[k] for k in want} == want  # typed values equal what the producer sent
        assert (row["broker_name"], row["keys"], row["offset_msg_id"][-16:]) == ("broker-a", [], f"{off:016X}")
    notes = _rows(str(lake), "payload_notes")
    assert [r["text"] for r in notes.values()] == ["grüße, 日本"]

    quarantine = _rows(str(lake), "payload_quarantine")
    assert sorted(quarantine) == [offsets[7], offsets[8], offsets[9]]
    assert [quarantine[o]["body"] for o in (offsets[7], offsets[8], offsets[9])] == [
        sent[7][1], sent[8][1], sent[9][1]]  # raw bodies kept, never dropped
    assert quarantine[offsets[7]]["topic"] == "Notes" and "UTF-8" in quarantine[offsets[7]]["reason"]
    assert "JSON" in quarantine[offsets[8]]["reason"]
    assert "amount" in quarantine[offsets[9]]["reason"]
    # every declared-topic record is in exactly one of the two; the messages table has them all
    messages = _rows(str(lake), MESSAGES_TABLE)
    declared = {o for o, (t, _) in zip(offsets, sent) if t in ("Orders", "Notes")}
    assert set(orders) | set(notes) | set(quarantine) == declared and len(messages) == len(sent)

    # the audit counts them, placed at their records
    audit = run_audit(spark, [spec], str(lake), ingest_first=False)
    found = [r for r in audit.findings.to_pylist() if r["kind"] == "payload_quarantined"]
    assert sorted((r["commitlog_offset"], r["offset"], r["topic"], r["detail"]) for r in found) == sorted(
        (o, o, quarantine[o]["topic"] if "topic" in quarantine[o] else t, quarantine[o]["reason"])
        for o, t in ((offsets[7], "Notes"), (offsets[8], "Orders"), (offsets[9], "Orders")))
    assert {r["file"] for r in found} == {str(tmp_path / "store" / "commitlog" / ("0" * 20))}

    versions = {t: table_version(str(lake), t) for t in ("payload_orders", "payload_notes", "payload_quarantine")}
    [again] = ingest(spark, [spec], str(lake))
    assert not again.rows and {t: table_version(str(lake), t) for t in versions} == versions

    # round 2: the schema gains a field; new rows carry it, old rows read null
    evolved = json.loads(json.dumps(ORDER_SCHEMA))
    evolved["properties"]["coupon"] = {"type": ["string", "null"]}
    _declare(lake, evolved, '\n[topics.Other]\nformat = "text"\n')
    more = _send(tmp_path, [("Orders", json.dumps({**_order(7), "coupon": "XMAS"}).encode())])
    [run2] = ingest(spark, [spec], str(lake))
    assert run2.rows["payload_orders"] == 1
    assert run2.rows["payload_other"] == 1  # declared late: back-filled from the start of the store
    orders = _rows(str(lake), "payload_orders")
    assert orders[more[0]]["coupon"] == "XMAS" and orders[offsets[0]]["coupon"] is None
    assert [r["text"] for r in _rows(str(lake), "payload_other").values()] == ["undeclared topic: no payload table"]

    # an incompatible change is refused before anything is read or written
    broken = json.loads(json.dumps(evolved))
    broken["properties"]["amount"] = {"type": "string"}
    _declare(lake, broken)
    before = table_version(str(lake), "payload_orders")
    with pytest.raises(PayloadSchemaError, match="amount"):
        ingest(spark, [spec], str(lake))
    assert table_version(str(lake), "payload_orders") == before


def test_schema_install_checks_then_copies_into_the_lake(tmp_path: Path) -> None:
    """``rocketlake schema install``: the demo's declarations land in LAKE/_rocketlake with their
    schema files; a broken file is refused and leaves the installed one as it was."""
    import subprocess

    from tests.broker_harness import ROCKETLAKE

    demo = Path(__file__).resolve().parents[1] / "pipelines" / "payloads" / "demo" / "payload_schemas.toml"
    lake = tmp_path / "lake"
    ok = subprocess.run([*ROCKETLAKE, "schema", "install", str(demo), "--lake", str(lake)],
                        capture_output=True, text=True, check=True)
    assert ok.stdout.splitlines() == ["Orders: json -> payload_orders (2 payload columns)",
                                      "Payments: json -> payload_payments (2 payload columns)"]
    conf = lake / "_rocketlake"
    assert sorted(p.name for p in conf.iterdir()) == ["orders.schema.json", "payload_schemas.toml",
                                                      "payments.schema.json"]
    assert (conf / "payload_schemas.toml").read_bytes() == demo.read_bytes()

    bad = tmp_path / "bad.toml"
    bad.write_text('[topics.Orders]\nformat = "xml"\n')
    res = subprocess.run([*ROCKETLAKE, "schema", "install", str(bad), "--lake", str(lake)],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("error: ") and "'xml' is not one of json, avro, protobuf, text" in res.stderr
    assert (conf / "payload_schemas.toml").read_bytes() == demo.read_bytes()
