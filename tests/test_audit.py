"""Store audit: nothing on Apache's golden store, each planted defect found with its file and offset.

One audit run (the job's ``main``, ingest included) covers two brokers in one lake: the golden
store and a damaged copy of it, with every defect planted in that one copy, chosen so that none
hides another. A third broker's rows, already in the tables, must survive the run untouched.
"""

from __future__ import annotations

import base64
import dataclasses
import shutil
import struct
from collections import defaultdict
from datetime import date, datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from broker.store.commitlog import CommitLog, CommitLogWriter
from broker.store.config_files import save_topic_fences
from broker.store.consume_queue import ConsumeQueueDispatcher
from broker.store.index_file import IndexFile
from broker.store.java_hash import index_key_hash, java_string_hash
from broker.store.topics import WRAPPER_TOPICS
from pipelines.lake import replace_arrow
from pipelines.reports import audit as A
from schemas.reports import AUDIT_FINDINGS_SCHEMA, TOPIC_DAILY_STATS_SCHEMA
from tests.job_runner import run_job_in_process

SEGMENT = 1 << 20       # golden store_a: mappedFileSizeCommitLog
CQ_FILE = 2000          # mappedFileSizeConsumeQueue
SLOTS = 128             # maxHashSlotNum


def _rows(lake: Path, name: str) -> list[dict]:
    return DeltaTable(str(lake / name)).to_pyarrow_table().to_pylist()


def _queues(records: list[dict]) -> dict[tuple[str, int], list[dict]]:
    out: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in records:
        if r["inConsumeQueue"]:
            out[(r["cqTopic"], r["cqQueueId"])].append(r)
    for units in out.values():
        units.sort(key=lambda r: r["cqLogicOffset"])
    return out


def _cq_place(store: Path, topic: str, qid: int, logical: int) -> tuple[str, int]:
    byte = logical * 20
    return str(store / "consumequeue" / topic / str(qid) / f"{byte - byte % CQ_FILE:020d}"), byte % CQ_FILE


def _cl_place(store: Path, phy: int) -> tuple[str, int]:
    return str(store / "commitlog" / f"{phy - phy % SEGMENT:020d}"), phy % SEGMENT


def _patch(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


@pytest.fixture(scope="module")
def audited(request, spark, golden_store, golden_records, tmp_path_factory) -> SimpleNamespace:
    """Seed a third broker's rows, damage a copy of the golden store, run ``rocketlake audit`` once
    (``broker.cli`` loads and runs ``jobs/audit.py``'s main, as spark-submit would)."""
    root = tmp_path_factory.mktemp("audit")
    lake, store = root / "lake", root / "damaged"
    other_finding = pa.Table.from_pylist([{
        "audit_run_id": "seed", "audited_at": datetime(2026, 1, 1, tzinfo=timezone.utc), "broker_name": "other",
        "kind": A.CRC_MISMATCH, "file": "/x/commitlog/00000000000000000000", "offset": 7, "commitlog_offset": 7,
        "topic": "T", "queue_id": 0, "detail": "seeded"}], schema=AUDIT_FINDINGS_SCHEMA)
    other_stats = pa.Table.from_pylist([{
        "store_date": date(2026, 1, 1), "broker_name": "other", "topic": "T", "messages": 1, "bytes": 100,
        "body_bytes": 10, "distinct_producers": 1, "first_store_time": datetime(2026, 1, 1, tzinfo=timezone.utc),
        "last_store_time": datetime(2026, 1, 1, tzinfo=timezone.utc), "audit_run_id": "seed"}],
        schema=TOPIC_DAILY_STATS_SCHEMA)
    replace_arrow(lake, "audit_findings", other_finding)
    replace_arrow(lake, "topic_daily_stats", other_stats)

    shutil.copytree(golden_store, store)
    for p in [store, *store.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the golden files are read-only
    expect = _damage(store, golden_records)

    rc, out, _ = run_job_in_process(request.config, ["audit", "--store", f"golden={golden_store}",
                                                     "--store", f"damaged={store}", "--lake", str(lake)])
    return SimpleNamespace(rc=rc, out=out.splitlines(), lake=lake, expect=expect,
                           other_finding=other_finding.to_pylist(), other_stats=other_stats.to_pylist())


def test_job_output_and_exit_code(audited):
    assert audited.rc == 0  # findings are data, not a failure
    width = max(map(len, A.KINDS))
    counts = {A.CRC_MISMATCH: 1, A.CORRUPT_REGION: 1, A.CQ_DANGLING: 2, A.CQ_MISMATCH: 1 + 89, A.CQ_MISSING: 3,
              A.CQ_OFFSET_GAP: 1, A.CQ_PHY_NOT_INCREASING: 1, A.INDEX_MISSING_KEY: 1, A.DUPLICATE_UNIQ_KEY: 1,
              A.TRANSACTION_UNRESOLVED: 1, A.COMMIT_WITHOUT_HALF: 1}
    assert audited.out[:-1] == [f"audit {k:<{width}} {counts.get(k, 0)}" for k in A.KINDS]
    assert audited.out[-1].startswith("audit 103 findings (golden 0, damaged 103), 12 topic-day rows, run ")


def test_golden_store_has_no_findings_and_stats_reconcile(audited, golden_records, golden_meta):
    table = DeltaTable(str(audited.lake / "audit_findings"))
    assert table.schema().to_arrow() == AUDIT_FINDINGS_SCHEMA
    assert [r for r in table.to_pyarrow_table().to_pylist() if r["broker_name"] == "golden"] == []

    want: dict[tuple, dict] = {}
    hosts: dict[tuple, set] = defaultdict(set)
    for e in golden_records:
        topic = e["topic"]
        real = (e["properties"].get("REAL_TOPIC") if topic in WRAPPER_TOPICS else None) or topic
        if real in WRAPPER_TOPICS:
            continue
        ts = datetime.fromtimestamp(e["storeTimestamp"] / 1000, timezone.utc)
        key = (ts.date(), "golden", real)
        w = want.setdefault(key, {"messages": 0, "bytes": 0, "body_bytes": 0, "first": ts, "last": ts})
        w["messages"] += 1
        w["bytes"] += e["storeSize"]
        w["body_bytes"] += len(base64.b64decode(e["bodyBase64"]))
        w["first"], w["last"] = min(w["first"], ts), max(w["last"], ts)
        hosts[key].add((e["bornHostIpHex"], e["bornHostPort"]))
    stats = DeltaTable(str(audited.lake / "topic_daily_stats"))
    assert stats.schema().to_arrow() == TOPIC_DAILY_STATS_SCHEMA
    got = {(r["store_date"], r["broker_name"], r["topic"]): r for r in stats.to_pyarrow_table().to_pylist()
           if r["broker_name"] == "golden"}
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        r = got[key]
        assert (r["messages"], r["bytes"], r["body_bytes"], r["distinct_producers"], r["first_store_time"],
                r["last_store_time"]) == (w["messages"], w["bytes"], w["body_bytes"], len(hosts[key]),
                                          w["first"], w["last"])
    # and with the store's own layout: every byte up to the end is a record or a file's BLANK tail
    blanks = sum(b["totalSizeField"] for b in golden_meta["blankRecords"])
    assert sum(r["bytes"] for r in got.values()) == golden_meta["maxPhyOffset"] - blanks
    assert sum(r["messages"] for r in got.values()) == golden_meta["messagesInCommitLog"]


def test_damaged_store_findings(audited):
    found = [r for r in _rows(audited.lake, "audit_findings") if r["broker_name"] == "damaged"]

    def order(t: tuple) -> tuple:
        return t[0], t[1], t[2], -1 if t[3] is None else t[3]

    assert sorted(((r["kind"], r["file"], r["offset"], r["commitlog_offset"]) for r in found), key=order) == \
        sorted(audited.expect, key=order)
    assert len({(r["audit_run_id"], r["audited_at"]) for r in found}) == 1
    by_kind = {r["kind"]: r for r in found}
    [other_topic] = [r for r in found if r["kind"] == A.CQ_MISMATCH and r["topic"] == "TopicOrders"]
    assert other_topic["detail"].startswith("TopicOrders/0 offset 50 -> commitlog ")
    assert "record is in TopicPayments/" in other_topic["detail"]
    moved = [r for r in found if r["kind"] == A.CQ_MISMATCH and r["topic"] == "Topic_Events-v1"]
    assert min(moved, key=lambda r: (r["file"], r["offset"]))["detail"].endswith(": record QUEUEOFFSET is 200")
    assert by_kind[A.CQ_OFFSET_GAP]["detail"] == \
        "Topic_Events-v1/1: logical offsets 200..299 (100 units) are missing; the queue resumes at 300"
    assert by_kind[A.CORRUPT_REGION]["detail"].startswith("corrupt_region: zeroed region inside the log")
    assert by_kind[A.DUPLICATE_UNIQ_KEY]["detail"].endswith("(2 copies): a producer retry stored twice")
    assert by_kind[A.INDEX_MISSING_KEY]["detail"].startswith("key '")
    assert by_kind[A.TRANSACTION_UNRESOLVED]["detail"].endswith(
        "(1 copies, newest at queue offset 0) has no op record: never committed or rolled back")
    assert by_kind[A.TRANSACTION_UNRESOLVED]["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"
    assert by_kind[A.COMMIT_WITHOUT_HALF]["detail"].endswith("where no half message is")


def test_other_brokers_rows_stay(audited):
    assert [r for r in _rows(audited.lake, "audit_findings") if r["broker_name"] == "other"] == audited.other_finding
    stats = _rows(audited.lake, "topic_daily_stats")
    assert [r for r in stats if r["broker_name"] == "other"] == audited.other_stats
    golden = {(r["store_date"], r["topic"]): r["messages"] for r in stats if r["broker_name"] == "golden"}
    damaged = {(r["store_date"], r["topic"]): r["messages"] for r in stats if r["broker_name"] == "damaged"}
    # one TopicOrders/3 record zeroed, one TopicOrders/2 record stored twice
    assert damaged == golden


def test_bad_arguments_exit_2(tmp_path):
    from broker.cli import main

    (tmp_path / "commitlog").mkdir()  # tmp_path itself looks like a store
    for argv in (["--lake", str(tmp_path)], ["--store", str(tmp_path / "nowhere"), "--lake", str(tmp_path)],
                 ["--store", f"a b={tmp_path}", "--lake", str(tmp_path)],
                 ["--store", str(tmp_path), "--store", str(tmp_path), "--lake", str(tmp_path)]):  # same name twice
        with pytest.raises(SystemExit) as exc:
            main(["audit", *argv])
        assert exc.value.code == 2


# ---- a damaged copy: every defect planted, with the findings it must cause -----------------------------

def _damage(store: Path, records: list[dict]) -> set[tuple]:
    """Plant the defects; return the findings they must cause as (kind, file, offset, commitlog_offset)."""
    queues = _queues(records)
    by_phy = {r["phyOffset"]: r for r in records}
    expect: set[tuple] = set()
    used: set[int] = set()

    # 1. a flipped body byte: crc_mismatch at the record
    r = next(r for r in queues[("TopicPayments", 1)] if SEGMENT <= r["phyOffset"] < 2 * SEGMENT
             and not r["compressed"] and r["bodyLength"] >= 16)
    seg = Path(_cl_place(store, r["phyOffset"])[0])
    data = seg.read_bytes()
    body = base64.b64decode(r["bodyRawBase64"])
    at = data.index(body, r["phyOffset"] % SEGMENT) + 5
    _patch(seg, at, bytes([data[at] ^ 0xFF]))
    expect.add((A.CRC_MISMATCH, *_cl_place(store, r["phyOffset"]), r["phyOffset"]))
    used.add(r["phyOffset"])

    # 2. a unit rewritten to point at an earlier record of another topic: the unit mismatches and
    #    goes backwards, and the record it pointed at has no unit any more
    q = queues[("TopicOrders", 0)]
    victim, before = q[50], q[49]
    other = next(x for x in records if x["cqTopic"] == "TopicPayments" and x["phyOffset"] < before["phyOffset"])
    file, pos = _cq_place(store, "TopicOrders", 0, 50)
    _patch(Path(file), pos, struct.pack(">qi", other["phyOffset"], other["storeSize"]))
    expect |= {(A.CQ_MISMATCH, file, pos, other["phyOffset"]), (A.CQ_PHY_NOT_INCREASING, file, pos, other["phyOffset"]),
               (A.CQ_MISSING, file, pos, victim["phyOffset"])}
    used |= {victim["phyOffset"], other["phyOffset"]}

    # 3. a unit pointing one byte into its record: dangling, and the record has no unit
    victim = queues[("TopicOrders", 1)][30]
    file, pos = _cq_place(store, "TopicOrders", 1, 30)
    _patch(Path(file), pos, struct.pack(">q", victim["phyOffset"] + 1))
    expect |= {(A.CQ_DANGLING, file, pos, victim["phyOffset"] + 1), (A.CQ_MISSING, file, pos, victim["phyOffset"])}
    used.add(victim["phyOffset"])

    # 4. a truncated CQ file loses the queue's last unit: that record has no unit
    q = queues[("TopicPayments", 0)]
    victim = q[-1]
    assert victim["phyOffset"] < max(r["phyOffset"] for r in records if r["inConsumeQueue"])  # still dispatched
    file, pos = _cq_place(store, "TopicPayments", 0, victim["cqLogicOffset"])
    with open(file, "r+b") as fh:
        fh.truncate(pos)
    expect.add((A.CQ_MISSING, file, pos, victim["phyOffset"]))
    used.add(victim["phyOffset"])

    # 5. a queue's last CQ file misnamed one file further on: its units come 100 logical offsets
    #    late, so the queue has a gap where that file belonged and each moved unit disagrees with
    #    its record's QUEUEOFFSET (the records still have their units: none is missing)
    q = queues[("Topic_Events-v1", 1)]
    assert len(q) == 289
    file, _ = _cq_place(store, "Topic_Events-v1", 1, 200)
    Path(file).rename(_cq_place(store, "Topic_Events-v1", 1, 300)[0])
    expect.add((A.CQ_OFFSET_GAP, file, 0, None))
    for x in q[200:]:
        expect.add((A.CQ_MISMATCH, *_cq_place(store, "Topic_Events-v1", 1, x["cqLogicOffset"] + 100), x["phyOffset"]))
        used.add(x["phyOffset"])

    # 6. a zeroed index entry: its key is missing, reported at the key's hash slot in that file
    index = sorted((store / "index").iterdir())[5]
    f = IndexFile.open(index)
    entries = f.entries()
    f.close()
    lo, hi = int(entries["phy_offset"].min()), int(entries["phy_offset"].max())
    number = next(int(e["entry"]) for e in entries[200:]
                  if lo < int(e["phy_offset"]) < hi and int(e["phy_offset"]) not in used
                  and by_phy[int(e["phy_offset"])]["inConsumeQueue"])
    phy = int(entries["phy_offset"][number - 1])
    key_hash = int(entries["key_hash"][number - 1])
    r = by_phy[phy]
    keys = [r["uniqKey"], *(r["keys"] or "").split()]
    assert [k for k in keys if index_key_hash(f"{r['topic']}#{k}") == key_hash]
    _patch(index, 40 + SLOTS * 4 + number * 20, bytes(20))
    expect.add((A.INDEX_MISSING_KEY, str(index), 40 + (key_hash % SLOTS) * 4, phy))
    used.add(phy)

    # 7. a producer retry stored twice: the same message appended again with its CQ unit
    q = queues[("TopicOrders", 2)]
    original = q[10]
    assert original["phyOffset"] not in used
    rec = CommitLog.open(store).read_record(original["phyOffset"])
    with CommitLogWriter(store, SEGMENT, queue_offsets={("TopicOrders", 2): len(q)}) as writer:
        copy = writer.append(rec, store_timestamp=records[-1]["storeTimestamp"] + 1)
    with ConsumeQueueDispatcher(store) as dispatcher:
        assert dispatcher.dispatch(copy.record)
    expect.add((A.DUPLICATE_UNIQ_KEY, *_cl_place(store, copy.physical_offset), copy.physical_offset))

    # 8. a zeroed record in the middle of a commitlog file: a corrupt region, and its unit dangles
    r = next(r for r in queues[("TopicOrders", 3)] if 2 * SEGMENT + 10_000 < r["phyOffset"] < 3 * SEGMENT - 100_000)
    assert r["phyOffset"] not in used
    seg, pos = _cl_place(store, r["phyOffset"])
    _patch(Path(seg), pos, bytes(r["storeSize"]))
    expect.add((A.CORRUPT_REGION, seg, pos, r["phyOffset"]))
    expect.add((A.CQ_DANGLING, *_cq_place(store, "TopicOrders", 3, r["cqLogicOffset"]), r["phyOffset"]))

    # 9. a COMMIT record whose PREPAREDTRANSACTIONOFFSET names itself, not its half: a commit without a half
    commit = next(r for r in records if r["transactionType"] == "COMMIT" and r["phyOffset"] not in used
                  and by_phy[r["preparedTransactionOffset"]]["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC")
    rec = CommitLog.open(store).read_record(commit["phyOffset"])
    seg, pos = _cl_place(store, commit["phyOffset"])
    _patch(Path(seg), pos, dataclasses.replace(rec, prepared_transaction_offset=commit["phyOffset"]).encode())
    expect.add((A.COMMIT_WITHOUT_HALF, seg, pos, commit["phyOffset"]))
    used.add(commit["phyOffset"])

    # 10. an op record rewritten to end another half (body "0" -> "9", BODYCRC recomputed): the half at
    #     queue offset 0 is left without an op record
    op = next(r for r in records if r["topic"] == "RMQ_SYS_TRANS_OP_HALF_TOPIC" and r["bodyRawBase64"] == "MA==")
    half = next(r for r in records if r["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC" and r["queueOffset"] == 0)
    assert half["phyOffset"] not in used and op["phyOffset"] not in used
    rec = CommitLog.open(store).read_record(op["phyOffset"])
    seg, pos = _cl_place(store, op["phyOffset"])
    _patch(Path(seg), pos, dataclasses.replace(rec, body=b"9", body_crc=None).encode())
    expect.add((A.TRANSACTION_UNRESOLVED, *_cl_place(store, half["phyOffset"]), half["phyOffset"]))
    used |= {op["phyOffset"], half["phyOffset"]}

    # a topic deleted on the broker (DELETE_TOPIC_IN_BROKER): its queues are gone and its records lie
    # below the fence the broker saved; they are not missing units (no finding expected)
    shutil.rmtree(store / "consumequeue" / "%DLQ%groupA")
    save_topic_fences(store, {"%DLQ%groupA": sum(p.stat().st_size for p in (store / "commitlog").iterdir())},
                      fsync=False)
    return expect


# ---- the checks as functions: repeats cannot be planted in a store (offsets are positions) --------------

def test_queue_offset_checks_on_frames(spark, tmp_path):
    units = spark.createDataFrame(
        [("b", "T", 0, 0, 100, 10), ("b", "T", 0, 1, 200, 10), ("b", "T", 0, 1, 300, 10),   # repeat
         ("b", "T", 0, 2, 250, 10),                                                         # backwards
         ("b", "T", 0, 5, 400, 10),                                                         # gap 3..4
         ("b", "U", 1, 7, 50, 10), ("b", "U", 1, 8, 60, 10)],                               # fine
        "broker_name string, topic string, queue_id int, queue_offset bigint, commitlog_offset bigint, size int")
    empty = spark.createDataFrame([], "broker_name string")
    inputs = A.AuditInputs(empty, units, empty, empty)
    layout = A.StoreLayout("b", "/s", cq_file_size_exceptions={("T", 0): 40})  # 2 units per file
    found = A.queue_offset_findings(inputs, [layout]).collect()
    assert sorted((r.kind, r.file, r.offset, r.commitlog_offset) for r in found) == [
        (A.CQ_OFFSET_GAP, "/s/consumequeue/T/0/00000000000000000040", 20, None),
        (A.CQ_OFFSET_REPEAT, "/s/consumequeue/T/0/00000000000000000000", 20, 300),
        (A.CQ_PHY_NOT_INCREASING, "/s/consumequeue/T/0/00000000000000000040", 0, 250)]

    texts = ["", "a", "TopicOrders#0A01020310921234ABCD47B761390016", "héllo ✓ 你好 🚀", "🚀🚀x",
             "polygenelubricants", "Aa", "BB"]
    df = spark.createDataFrame([(t,) for t in texts], "s string")
    from pyspark.sql import functions as F

    got = df.select("s", A.java_hash_code(F.col("s")).alias("h"), A.index_key_hash_col(F.col("s")).alias("k")).collect()
    assert [(r.s, r.h, r.k) for r in got] == [(t, java_string_hash(t), index_key_hash(t)) for t in texts]
