"""Typed payload tables (pipelines.payloads): declarations, the JSON/Avro/Protobuf/text codecs, the rows
of payload_<topic> and payload_quarantine, schema evolution (also through the Delta commit), the
Spark reader on a small store, and ``rocketlake schema infer``. No Spark session: pure Arrow."""

from __future__ import annotations

import datetime as dt
import io
import json
import pickle
import shutil
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from pipelines.payloads import PayloadSchemaError
from pipelines.payloads.declarations import declarations_location, load_declarations
from pipelines.payloads.evolution import adds_fields, check_evolution
from pipelines.payloads.json_codec import JsonCodec
from pipelines.payloads.rows import payload_batches, payload_outputs
from schemas.messages import MESSAGES, MESSAGES_SCHEMA
from schemas.payloads import (PAYLOAD_METADATA_NAMES, PAYLOAD_QUARANTINE, PAYLOAD_QUARANTINE_TABLE,
                              payload_table_name)
from schemas.registry import PAYLOAD_TABLES, contract

FIXTURES = Path(__file__).parent / "payload_fixtures"
UTC = dt.timezone.utc
T0 = 1_793_491_200_000  # 2026-11-01T00:00:00Z


# ---- helpers ------------------------------------------------------------------------------------------
def _declare(tmp_path: Path, text: str, copy: tuple[str, ...] = ()) -> Path:
    """A declarations file in tmp_path (beside copies of the named fixture files)."""
    for name in copy:
        shutil.copy(FIXTURES / name, tmp_path / name)
    path = tmp_path / "payload_schemas.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _messages(rows: list[dict]) -> pa.RecordBatch:
    """``messages`` rows (MESSAGES_SCHEMA) from the fields a test cares about."""
    out = []
    for i, r in enumerate(rows):
        ts = r.get("store_timestamp", T0 + i)
        store_time = dt.datetime.fromtimestamp(ts / 1000, UTC)
        out.append({"commitlog_offset": 1000 * i, "topic": r["topic"], "real_topic": r["topic"], "body": r["body"],
                    "transaction_type": r.get("transaction_type", "NOT"), "queue_id": 0, "queue_offset": i,
                    "store_timestamp": ts, "store_time": store_time, "store_date": store_time.date(),
                    "broker_name": "broker-a", "keys": r.get("keys", []), "tags": r.get("tags"),
                    "uniq_key": f"U{i}", "offset_msg_id": f"ID{i}"})
    return pa.RecordBatch.from_pylist(out, schema=MESSAGES_SCHEMA)


def _by_table(batch: pa.RecordBatch, decls) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for name, part in payload_batches(batch, decls):
        out.setdefault(name, []).extend(part.to_pylist())
    return out


def _payload(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in PAYLOAD_METADATA_NAMES}


def _protobuf_set(tmp_path: Path) -> tuple[Path, type]:
    """A FileDescriptorSet for shop.v1.Shipment (built with descriptor_pb2, no protoc) and its class."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    ts = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(ts)
    fdp = descriptor_pb2.FileDescriptorProto(name="shop/v1/shipment.proto", package="shop.v1", syntax="proto3",
                                             dependency=["google/protobuf/timestamp.proto"])
    status = fdp.enum_type.add(name="Status")
    for n, name in enumerate(["PENDING", "SENT", "DELIVERED"]):
        status.value.add(name=name, number=n)
    parcel = fdp.message_type.add(name="Parcel")
    parcel.field.add(name="weight_g", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    parcel.field.add(name="label", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    m = fdp.message_type.add(name="Shipment")
    m.field.add(name="shipment_id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    m.field.add(name="carrier", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    m.field.add(name="status", number=3, type=F.TYPE_ENUM, type_name=".shop.v1.Status", label=F.LABEL_OPTIONAL)
    m.field.add(name="parcels", number=4, type=F.TYPE_MESSAGE, type_name=".shop.v1.Parcel", label=F.LABEL_REPEATED)
    m.field.add(name="destination", number=5, type=F.TYPE_MESSAGE, type_name=".shop.v1.Parcel",
                label=F.LABEL_OPTIONAL)
    m.field.add(name="sent_at", number=6, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp",
                label=F.LABEL_OPTIONAL)
    m.field.add(name="tracking", number=7, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
    m.field.add(name="counter", number=8, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    m.field.add(name="note", number=9, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, proto3_optional=True,
                oneof_index=0)
    m.oneof_decl.add(name="_note")
    path = tmp_path / "shipment.pb"
    path.write_bytes(descriptor_pb2.FileDescriptorSet(file=[fdp, ts]).SerializeToString())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(ts)
    pool.Add(fdp)
    return path, message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.v1.Shipment"))


# ---- table names and declarations ----------------------------------------------------------------------
def test_table_name_rule():
    assert payload_table_name("Orders") == "payload_orders"
    assert payload_table_name("order-events.v1") == "payload_order_events_v1"
    assert payload_table_name("%DLQ%my-group") == "payload__dlq_my_group"
    assert payload_table_name("Zahlungen-ä") == "payload_zahlungen__"


def test_declarations_load_and_pickle(tmp_path):
    _protobuf_set(tmp_path)
    path = _declare(tmp_path, """
[topics.Orders]
format = "json"
schema = "orders.schema.json"
key_fields = ["order_id"]

[topics."pay-ments"]
format = "avro"
schema = "payments.avsc"

[topics.Shipments]
format = "protobuf"
schema = "shipment.pb"
message = "shop.v1.Shipment"

[topics.Logs]
format = "text"
""", copy=("orders.schema.json", "payments.avsc"))
    decls = load_declarations(path)
    assert [(d.topic, d.format, d.table_name) for d in decls] == [
        ("Orders", "json", "payload_orders"), ("pay-ments", "avro", "payload_pay_ments"),
        ("Shipments", "protobuf", "payload_shipments"), ("Logs", "text", "payload_logs")]
    orders = decls.get("Orders")
    assert orders.key_fields == ("order_id",)
    assert orders.contract.names[:len(PAYLOAD_METADATA_NAMES)] == list(PAYLOAD_METADATA_NAMES)
    assert orders.contract.description.endswith("the producer keys messages by order_id")
    assert orders.contract.column("order_id").description == "the shop's order id"
    assert orders.contract.column("amount").description == \
        "payload field amount of topic Orders (json orders.schema.json)"
    # the metadata columns are the messages contract's facts
    for name in PAYLOAD_METADATA_NAMES:
        assert orders.contract.column(name) == MESSAGES.column(name)
    again = pickle.loads(pickle.dumps(decls))
    assert [(d.topic, d.schema) for d in again] == [(d.topic, d.schema) for d in decls]
    outputs = payload_outputs(decls)
    assert [(n, p) for n, _, p in outputs] == [
        ("payload_orders", ["store_date"]), ("payload_pay_ments", ["store_date"]),
        ("payload_shipments", ["store_date"]), ("payload_logs", ["store_date"]),
        ("payload_quarantine", ["store_date"])]
    assert outputs[0][1] == orders.contract.schema
    assert outputs[-1][1] == PAYLOAD_QUARANTINE.schema
    # the lake's default place
    lake = tmp_path / "lake"
    (lake / "_rocketlake").mkdir(parents=True)
    shutil.copy(path, declarations_location(lake).uri)
    for name in ("orders.schema.json", "payments.avsc", "shipment.pb"):
        shutil.copy(tmp_path / name, lake / "_rocketlake" / name)
    assert list(load_declarations(lake=lake).topics) == ["Orders", "pay-ments", "Shipments", "Logs"]


def test_quarantine_contract_is_registered():
    assert PAYLOAD_TABLES == ("payload_quarantine",)
    assert contract(PAYLOAD_QUARANTINE_TABLE) is PAYLOAD_QUARANTINE
    assert PAYLOAD_QUARANTINE.names == ["broker_name", "topic", "commitlog_offset", "store_timestamp", "reason",
                                        "body", "store_date"]
    assert PAYLOAD_QUARANTINE.partition_by == ("store_date",)
    assert PAYLOAD_QUARANTINE.column("topic") == MESSAGES.column("topic")
    assert all(f.metadata for f in PAYLOAD_QUARANTINE.schema)


@pytest.mark.parametrize("text, files, message", [
    ('[topics.A]\nformat = "xml"\n', (), "topic 'A': format 'xml' is not one of json, avro, protobuf, text"),
    ('[topics.A]\nformat = "json"\nschema = "nope.json"\n', (),
     "topic 'A': schema file {dir}/nope.json not found"),
    ('[topics.A]\nformat = "json"\n', (), 'topic \'A\': format json needs schema = "FILE" (relative to the '
                                          'declarations file)'),
    ('[topics.A]\nformat = "json"\nschema = "bad.json"\n', ("bad.json",),
     "topic 'A': {dir}/bad.json: not a valid JSON Schema (type: 5 is not valid under any of the given schemas)"),
    ('[topics.A]\nformat = "json"\nschema = "free.json"\n', ("free.json",),
     "topic 'A': {dir}/free.json: field meta: an object needs 'properties' (free-form objects have no columns)"),
    ('[topics.A]\nformat = "json"\nschema = "clash.json"\n', ("clash.json",),
     "topic 'A': payload field(s) 'tags' have the name of a metadata column (broker_name, commitlog_offset, "
     "queue_id, queue_offset, offset_msg_id, uniq_key, keys, tags, store_timestamp, store_time, store_date)"),
    ('[topics.A]\nformat = "protobuf"\nschema = "shipment.pb"\nmessage = "shop.v1.Nope"\n', (),
     "topic 'A': {dir}/shipment.pb: no message 'shop.v1.Nope' in the FileDescriptorSet (it has: "
     "google.protobuf.Timestamp, shop.v1.Parcel, shop.v1.Shipment)"),
    ('[topics.A]\nformat = "protobuf"\nschema = "shipment.pb"\n', (),
     'topic \'A\': format protobuf needs message = "package.MessageName"'),
    ('[topics.A]\nformat = "text"\nschemas = "x"\n', (),
     "topic 'A': unknown key(s) schemas (known: format, key_fields, message, schema)"),
    ('[topics.quarantine]\nformat = "text"\n', (),
     "topic 'quarantine': its table name 'payload_quarantine' is the quarantine's; rename the topic's declaration"),
    ('[topics.Order-X]\nformat = "text"\n[topics.order_x]\nformat = "text"\n', (),
     "topics 'Order-X' and 'order_x' both map to table 'payload_order_x' (lower-cased, non-alphanumerics as '_'); "
     "rename one"),
    ('[topics.A]\nformat = "json"\nschema = "orders.schema.json"\nkey_fields = ["id"]\n', (),
     "topic 'A': key_fields 'id' are not top-level payload fields"),
    ('[topics.A\n', (), "not valid TOML (Expected ']' at the end of a table declaration (at line 1, column 10))"),
    ('', (), "no [topics.NAME] table declared"),
])
def test_declaration_errors_name_the_file_and_the_topic(tmp_path, text, files, message):
    _protobuf_set(tmp_path)
    shutil.copy(FIXTURES / "orders.schema.json", tmp_path)
    (tmp_path / "bad.json").write_text('{"type": 5}')
    (tmp_path / "free.json").write_text('{"type": "object", "properties": {"meta": {"type": "object"}}}')
    (tmp_path / "clash.json").write_text('{"type": "object", "properties": {"tags": {"type": "string"}}}')
    path = _declare(tmp_path, text)
    with pytest.raises(PayloadSchemaError) as info:
        load_declarations(path)
    assert str(info.value) == f"{path}: " + message.format(dir=tmp_path)


def test_a_missing_declarations_file(tmp_path):
    with pytest.raises(PayloadSchemaError, match=r"^.*/lake/_rocketlake/payload_schemas.toml: no payload "
                                                 r"declarations file$"):
        load_declarations(lake=tmp_path / "lake")


# ---- JSON --------------------------------------------------------------------------------------------------
def _orders(tmp_path):
    return load_declarations(_declare(tmp_path, '[topics.Orders]\nformat = "json"\nschema = "orders.schema.json"\n',
                                      copy=("orders.schema.json",)))


def test_json_topic_rows_and_quarantine(tmp_path):
    decls = _orders(tmp_path)
    good = {"order_id": "o-1", "amount": 19.99, "quantity": 3, "paid": True, "note": None,
            "created": "2026-11-01T12:30:00.250+02:00",
            "customer": {"name": "Zoë 支付 🚀", "address": {"city": "Köln", "zip": "50667"}},
            "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": None}], "labels": ["x", "y"]}
    pretty = json.dumps({"order_id": "o-2", "amount": 5, "customer": {"name": "Ann", "address": None}}, indent=2)
    bodies = [json.dumps(good, ensure_ascii=False).encode(),                  # 0 typed
              b'{"order_id": "o-3", "amount": "12"}',                          # 1 wrong type
              pretty.encode(),                                                # 2 typed (raw newlines)
              b'{"order_id": "o-4", "amount": 1,',                             # 3 invalid JSON
              b'{"order_id": "o-5", "amount": 2, "extra": {"ignored": [1]}}',  # 4 typed, unknown field ignored
              b'\xff\xfe',                                                    # 5 not UTF-8
              b'{"amount": 3}',                                               # 6 required field missing
              b'',                                                            # 7 empty
              b'{"order_id": "o-8", "amount": 1, "quantity": 2.5}',            # 8 integer expected
              b'{"order_id": "o-9", "amount": 1, "customer": {"address": {}}}',  # 9 nested required
              b'[1, 2]',                                                      # 10 not an object
              b'{"order_id": "o-11", "amount": 1} {"order_id": "o-12", "amount": 1}',  # 11 two values
              ]
    batch = _messages([{"topic": "Orders", "body": b, "keys": ["k1", "k2"], "tags": "TagA"} for b in bodies]
                      + [{"topic": "Other", "body": b"not json"},
                         {"topic": "Orders", "body": b"{}", "transaction_type": "PREPARED"}])
    got = _by_table(batch, decls)
    assert set(got) == {"payload_orders", PAYLOAD_QUARANTINE_TABLE}
    rows = got["payload_orders"]
    assert [r["commitlog_offset"] for r in rows] == [0, 2000, 4000]
    assert rows[0] == {
        "broker_name": "broker-a", "commitlog_offset": 0, "queue_id": 0, "queue_offset": 0, "offset_msg_id": "ID0",
        "uniq_key": "U0", "keys": ["k1", "k2"], "tags": "TagA", "store_timestamp": T0,
        "store_time": dt.datetime(2026, 11, 1, tzinfo=UTC), "store_date": dt.date(2026, 11, 1),
        "order_id": "o-1", "amount": 19.99, "quantity": 3, "paid": True, "note": None,
        "created": dt.datetime(2026, 11, 1, 10, 30, 0, 250000, tzinfo=UTC),
        "customer": {"name": "Zoë 支付 🚀", "address": {"city": "Köln", "zip": "50667"}},
        "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": None}], "labels": ["x", "y"]}
    assert _payload(rows[1]) == {"order_id": "o-2", "amount": 5.0, "quantity": None, "paid": None, "note": None,
                                 "created": None, "customer": {"name": "Ann", "address": None}, "lines": None,
                                 "labels": None}
    assert _payload(rows[2])["order_id"] == "o-5"
    quarantine = got[PAYLOAD_QUARANTINE_TABLE]
    assert [(q["commitlog_offset"], q["reason"]) for q in quarantine] == [
        (1000, 'field amount: expected number, got string "12"'),
        (3000, "invalid JSON at byte 32: Expecting property name enclosed in double quotes"),
        (5000, "invalid UTF-8 at byte 0"),
        (6000, "field order_id: required, missing or null"),
        (7000, "empty body"),
        (8000, "field quantity: expected integer, got number 2.5"),
        (9000, "field customer.name: required, missing or null"),
        (10000, "expected a JSON object, got array"),
        (11000, "invalid JSON at byte 34: Extra data"),
    ]
    assert quarantine[0] == {"broker_name": "broker-a", "topic": "Orders", "commitlog_offset": 1000,
                             "store_timestamp": T0 + 1, "reason": 'field amount: expected number, got string "12"',
                             "body": bodies[1], "store_date": dt.date(2026, 11, 1)}
    # every declared row (NOT/COMMIT) in exactly one table
    assert len(rows) + len(quarantine) == len(bodies)


def test_json_bad_rows_among_many_keep_the_good_ones_typed():
    codec = JsonCodec.from_json_schema({"type": "object", "properties": {"i": {"type": "integer"},
                                                                         "s": {"type": "string"}}})
    bodies = [json.dumps({"i": i, "s": f"v{i}"}).encode() for i in range(5000)]
    for bad in (7, 2500, 4999):
        bodies[bad] = b'{"i": "x%d"}' % bad
    decoded = codec.decode(bodies)
    assert decoded.failures == [(b, f'field i: expected integer, got string "x{b}"') for b in (7, 2500, 4999)]
    assert decoded.table.column("i").to_pylist() == [i for i in range(5000) if i not in (7, 2500, 4999)]
    assert decoded.table.column("s").to_pylist() == [f"v{i}" for i in range(5000) if i not in (7, 2500, 4999)]


# ---- Avro ---------------------------------------------------------------------------------------------------
def test_avro_topic(tmp_path):
    import fastavro

    decls = load_declarations(_declare(tmp_path, '[topics.Payments]\nformat = "avro"\nschema = "payments.avsc"\n',
                                       copy=("payments.avsc",)))
    schema = fastavro.parse_schema(json.loads((FIXTURES / "payments.avsc").read_text()))
    records = [
        {"payment_id": 1, "order_id": "o-1", "amount": Decimal("19.99"), "method": "CARD",
         "paid_at": dt.datetime(2026, 11, 1, 12, 0, 1, 123000, tzinfo=UTC),
         "payer": {"name": "Zoë 🚀", "email": None}, "refund_of": None,
         "attempts": [{"name": "a", "email": "a@x"}], "labels": {"eu": 1}},
        {"payment_id": -(1 << 62), "order_id": "", "amount": Decimal("-0.01"), "method": "SEPA",
         "paid_at": dt.datetime(1970, 1, 1, tzinfo=UTC), "payer": {"name": "Ж", "email": "ж@x"},
         "refund_of": 1, "attempts": [], "labels": {}},
    ]

    def encode(rec):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schema, rec)
        return out.getvalue()

    bodies = [encode(records[0]), encode(records[0])[:9], encode(records[1]), encode(records[1]) + b"\x00\x01"]
    got = _by_table(_messages([{"topic": "Payments", "body": b} for b in bodies]), decls)
    assert [_payload(r) for r in got["payload_payments"]] == [
        {**records[0], "labels": [("eu", 1)]}, {**records[1], "labels": []}]
    assert [(q["commitlog_offset"], q["reason"]) for q in got[PAYLOAD_QUARANTINE_TABLE]] == [
        (1000, "truncated Avro body (9 bytes)"), (3000, "2 bytes left after the Avro datum")]
    assert decls.get("Payments").contract.column("payment_id").description == "unique per payment"
    assert str(decls.get("Payments").schema.field("amount").type) == "decimal128(12, 2)"


# ---- Protobuf --------------------------------------------------------------------------------------------------
def test_protobuf_topic(tmp_path):
    _, Shipment = _protobuf_set(tmp_path)
    decls = load_declarations(_declare(tmp_path, '[topics.Shipments]\nformat = "protobuf"\nschema = "shipment.pb"\n'
                                                 'message = "shop.v1.Shipment"\n'))
    full = Shipment(shipment_id=(1 << 40), carrier="DHL ✈", status=2, tracking=b"\x00\xff", counter=(1 << 64) - 1,
                    note="fragile")
    full.parcels.add(weight_g=1500, label="böx")
    full.parcels.add(weight_g=-1)
    full.destination.label = "dock 7"
    full.sent_at.seconds, full.sent_at.nanos = 1_793_491_200, 123_456_000
    empty = Shipment()
    bodies = [full.SerializeToString(), full.SerializeToString()[:-4], empty.SerializeToString(),
              b"\x0a\x03abc"]  # field 1 (an int64) sent length-delimited
    got = _by_table(_messages([{"topic": "Shipments", "body": b} for b in bodies]), decls)
    assert [_payload(r) for r in got["payload_shipments"]] == [
        {"shipment_id": 1 << 40, "carrier": "DHL ✈", "status": "DELIVERED",
         "parcels": [{"weight_g": 1500, "label": "böx"}, {"weight_g": -1, "label": ""}],
         "destination": {"weight_g": 0, "label": "dock 7"},
         "sent_at": dt.datetime(2026, 11, 1, 0, 0, 0, 123456, tzinfo=UTC), "tracking": b"\x00\xff",
         "counter": Decimal((1 << 64) - 1), "note": "fragile"},
        {"shipment_id": 0, "carrier": "", "status": "PENDING", "parcels": [], "destination": None, "sent_at": None,
         "tracking": b"", "counter": Decimal(0), "note": None}]
    assert [(q["commitlog_offset"], q["reason"]) for q in got[PAYLOAD_QUARANTINE_TABLE]] == [
        (1000, "invalid protobuf body: Error parsing message with type 'shop.v1.Shipment': Wire format was corrupt"),
        (3000, "field shipment_id (number 1): wire type 2 does not match its declared type")]


# ---- text --------------------------------------------------------------------------------------------------
def test_text_topic(tmp_path):
    decls = load_declarations(_declare(tmp_path, '[topics."app.log"]\nformat = "text"\n'))
    got = _by_table(_messages([{"topic": "app.log", "body": "línea 1\nzwei 🚀".encode()},
                               {"topic": "app.log", "body": b"ok\xc3"}, {"topic": "app.log", "body": b""}]), decls)
    assert [_payload(r) for r in got["payload_app_log"]] == [{"text": "línea 1\nzwei 🚀"}, {"text": ""}]
    assert [(q["commitlog_offset"], q["reason"]) for q in got[PAYLOAD_QUARANTINE_TABLE]] == [
        (1000, "invalid UTF-8 at byte 2")]


def test_several_topics_in_one_batch(tmp_path):
    """Each topic to its table, every failure in one quarantine batch; a %DLQ% topic only when declared."""
    decls = load_declarations(_declare(tmp_path, '[topics.Orders]\nformat = "json"\nschema = "orders.schema.json"\n'
                                                 '[topics."%DLQ%g"]\nformat = "text"\n', copy=("orders.schema.json",)))
    batch = _messages([{"topic": "%DLQ%g", "body": b"dead"}, {"topic": "Orders", "body": b"{"},
                       {"topic": "%RETRY%g", "body": b"{}"}, {"topic": "%DLQ%g", "body": b"\x80"},
                       {"topic": "Orders", "body": b'{"order_id": "a", "amount": 1}', "transaction_type": "COMMIT"}])
    pairs = [(name, b.num_rows) for name, b in payload_batches(batch, decls)]
    assert pairs == [("payload__dlq_g", 1), ("payload_orders", 1), (PAYLOAD_QUARANTINE_TABLE, 2)]
    got = _by_table(batch, decls)
    assert [(q["topic"], q["commitlog_offset"], q["reason"]) for q in got[PAYLOAD_QUARANTINE_TABLE]] == [
        ("%DLQ%g", 3000, "invalid UTF-8 at byte 0"),
        ("Orders", 1000, "invalid JSON at byte 1: Expecting property name enclosed in double quotes")]


# ---- schema evolution -----------------------------------------------------------------------------------------
OLD = pa.schema([("id", pa.int64()), ("customer", pa.struct([("name", pa.string())])),
                 ("lines", pa.list_(pa.struct([("sku", pa.string())]))), ("gone", pa.string())])


def test_additive_changes_are_merged():
    new = pa.schema([("id", pa.int64()), ("customer", pa.struct([("name", pa.string()), ("email", pa.string())])),
                     ("lines", pa.list_(pa.field("element", pa.struct([("sku", pa.string()), ("qty", pa.int64())])))),
                     ("channel", pa.string())])
    merged = check_evolution(OLD, new)
    assert merged == pa.schema([
        ("id", pa.int64()), ("customer", pa.struct([("name", pa.string()), ("email", pa.string())])),
        ("lines", pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int64())]))), ("gone", pa.string()),
        ("channel", pa.string())])
    assert adds_fields(OLD, new) and not adds_fields(OLD, OLD)
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    assert check_evolution(strict, pa.schema([("id", pa.int64())])).field("id").nullable


@pytest.mark.parametrize("new, message", [
    (pa.schema([("id", pa.string())]),
     "field id: type changed from int64 to string (only additive changes are accepted: new nullable fields, "
     "fields becoming nullable)"),
    (pa.schema([("customer", pa.struct([("name", pa.binary())]))]),
     "field customer.name: type changed from string to binary (only additive changes are accepted: new nullable "
     "fields, fields becoming nullable)"),
    (pa.schema([pa.field("channel", pa.string(), nullable=False)]),
     "field channel: a new field must be nullable (rows already in the table have no value for it)"),
])
def test_incompatible_changes_are_refused(new, message):
    with pytest.raises(PayloadSchemaError) as info:
        check_evolution(OLD, new)
    assert str(info.value) == message
    assert not adds_fields(OLD, new)


def test_a_commit_with_new_fields_evolves_the_table(tmp_path):
    from deltalake import DeltaTable

    from pipelines.delta_commit import commit_files
    from pipelines.delta_files import FileSetWriter
    from pipelines.storage import Location

    table = Location.parse(tmp_path / "payload_t")
    v1 = pa.schema([("id", pa.int64()), ("customer", pa.struct([("name", pa.string())])), ("d", pa.string())])
    v2 = pa.schema([("id", pa.int64()), ("customer", pa.struct([("name", pa.string()), ("email", pa.string())])),
                    ("d", pa.string()), ("channel", pa.string())])

    def commit(rows, schema, job):
        w = FileSetWriter(table, schema, ["d"], job)
        w.write(pa.Table.from_pylist(rows, schema=schema))
        return commit_files(table, w.close(), schema=schema, job_id=job, partition_by=["d"])

    commit([{"id": 1, "customer": {"name": "a"}, "d": "x"}], v1, "job1")
    out = commit([{"id": 2, "customer": {"name": "b", "email": "b@x"}, "d": "x", "channel": "web"}], v2, "job2")
    dt_ = DeltaTable(table.uri)
    assert (out.committed, out.version, dt_.version()) == (True, 2, 2)  # version 1: the schema alone
    assert pa.schema(dt_.schema().to_arrow()) == v2
    rows = sorted(dt_.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "customer": {"name": "a", "email": None}, "d": "x", "channel": None},
                    {"id": 2, "customer": {"name": "b", "email": "b@x"}, "d": "x", "channel": "web"}]
    # the same schema again, or one that drops a field: committed as before, no schema commit
    out = commit([{"id": 3, "customer": {"name": "c"}, "d": "x"}], v1, "job3")
    assert (out.version, pa.schema(DeltaTable(table.uri).schema().to_arrow())) == (3, v2)


# ---- the reader on a store ---------------------------------------------------------------------------------
def _store(tmp_path: Path) -> Path:
    from broker.store.commitlog import CommitLogWriter
    from broker.store.compression import compress
    from broker.store.constants import COMPRESSED_FLAG, COMPRESSION_BITS_BY_NAME
    from broker.store.hosts import Host
    from broker.store.message import MessageRecord

    store = tmp_path / "store"
    hosts = dict(born_host=Host(bytes([10, 0, 0, 1]), 5000), store_host=Host(bytes([10, 0, 0, 2]), 10911))
    with CommitLogWriter(store, segment_size=64 * 1024) as w:
        for i in range(60):
            topic, sys_flag = ("Orders", "Noise", "%DLQ%g")[i % 3], 0
            body = json.dumps({"order_id": f"o-{i}", "amount": i / 4}).encode() if topic != "Noise" else b"\x00" * 50
            if i == 30:
                body = b'{"order_id": "o-30", "amount": true}'
            if i == 33:  # a compressed body: the payload is the decompressed bytes
                body = compress(json.dumps({"order_id": "o-33", "amount": 1.5, "note": "x" * 5000}).encode(), "ZLIB")
                sys_flag = COMPRESSED_FLAG | COMPRESSION_BITS_BY_NAME["ZLIB"]
            w.append(MessageRecord(topic=topic, body=body, properties_raw=f"KEYS\x01k{i}\x02UNIQ_KEY\x01U{i:030d}",
                                   queue_id=0, sys_flag=sys_flag, born_timestamp=T0 + i, **hosts),
                     store_timestamp=T0 + 1000 * i)
    return store


def test_reader_splits_and_rows(tmp_path):
    from pipelines.payloads.reader import PayloadReader
    from pipelines.sources.rocketmq import RocketMQReader, store_source_options
    from pipelines.storage import Location

    store = _store(tmp_path)
    decls = _orders(tmp_path)
    options = {**store_source_options(Location.parse(store)), "brokerName": "broker-b", "splitBytes": "8192",
               "fromOffset": "0", "untilOffset": str(1 << 40), "ingestRunId": "run-1"}
    reader = pickle.loads(pickle.dumps(PayloadReader(options, decls)))
    parts = reader.partitions()
    assert len(parts) > 2
    assert [(p.file_name, p.start, p.end) for p in parts] == \
        [(p.file_name, p.start, p.end) for p in RocketMQReader(options).partitions()]
    assert reader.outputs() == payload_outputs(decls)
    tables: dict[str, list[dict]] = {}
    for part in parts:
        for name, batch in reader.read(part):
            assert batch.schema == dict((n, s) for n, s, _ in payload_outputs(decls))[name]
            tables.setdefault(name, []).extend(batch.to_pylist())
    orders = [i for i in range(60) if i % 3 == 0]
    assert [r["order_id"] for r in tables["payload_orders"]] == [f"o-{i}" for i in orders if i != 30]
    assert [r["amount"] for r in tables["payload_orders"]] == [1.5 if i == 33 else i / 4 for i in orders if i != 30]
    assert {r["broker_name"] for r in tables["payload_orders"]} == {"broker-b"}
    assert tables["payload_orders"][0]["keys"] == ["k0"]
    [bad] = tables[PAYLOAD_QUARANTINE_TABLE]
    assert (bad["topic"], bad["reason"], bad["body"]) == ("Orders", "field amount: expected number, got boolean true",
                                                          b'{"order_id": "o-30", "amount": true}')
    # undeclared %DLQ% and Noise rows are not payload rows
    assert len(tables["payload_orders"]) + 1 == len(orders)


# ---- rocketlake schema infer ---------------------------------------------------------------------------------
def _lake_with(tmp_path: Path, rows: list[dict]) -> Path:
    from pipelines.lake import append_arrow

    lake = tmp_path / "lake"
    append_arrow(lake, MESSAGES.name, pa.Table.from_batches([_messages(rows)]), partition_by=MESSAGES.partition_by)
    return lake


def test_schema_infer_cli(tmp_path, capsys):
    from broker.cli import main

    bodies = [{"id": 1, "price": 2, "name": "a", "at": "2026-11-01T00:00:00Z", "customer": {"tier": "gold"},
               "items": [{"sku": "x", "qty": 1}], "flags": []},
              {"id": 2, "price": 2.5, "name": None, "at": "2026-11-02T00:00:00.5+01:00",
               "customer": {"tier": "s", "vip": True}, "items": [{"sku": "y"}], "flags": [True]},
              {"id": 3, "price": 1, "at": "2026-11-03T00:00:00Z", "customer": {"tier": "b"}, "items": [],
               "flags": []}]
    lake = _lake_with(tmp_path, [{"topic": "Orders", "body": json.dumps(b).encode()} for b in bodies]
                      + [{"topic": "Logs", "body": b"plain text"}])
    assert main(["schema", "infer", "--lake", str(lake), "--topic", "Orders", "--sample", "10"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Orders",
        "description": "inferred from 3 message bodies of topic Orders",
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "price": {"type": "number"}, "name": {"type": ["string", "null"]},
            "at": {"type": "string", "format": "date-time"},
            "customer": {"type": "object", "properties": {"tier": {"type": "string"}, "vip": {"type": "boolean"}},
                         "required": ["tier"]},
            "items": {"type": "array", "items": {"type": "object", "properties": {
                "sku": {"type": "string"}, "qty": {"type": "integer"}}, "required": ["sku"]}},
            "flags": {"type": "array", "items": {"type": "boolean"}}},
        "required": ["id", "price", "at", "customer", "items", "flags"]}
    # the inferred schema types the same bodies
    decoded = JsonCodec.from_json_schema(schema).decode([json.dumps(b).encode() for b in bodies])
    assert decoded.failures == [] and decoded.table.column("price").to_pylist() == [2.0, 2.5, 1.0]

    assert main(["schema", "infer", "--lake", str(lake), "--topic", "Nope"]) == 2
    assert capsys.readouterr().err == "error: topic 'Nope': no messages in the lake's messages table\n"
    assert main(["schema", "infer", "--lake", str(lake), "--topic", "Logs"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: topic 'Logs': the body at commitlog offset 3000 is not JSON "
                   "(Expecting value: line 1 column 1 (char 0))\n")
    assert main(["schema", "infer", "--lake", str(tmp_path / "none"), "--topic", "Orders"]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path}/none/messages: no messages table (ingest the store first)\n"
