"""Master/slave store comparison (``rocketlake store compare``) and the audit's replica findings.

Slaves are built the honest way: a prefix of a generated master's commitlog bytes, copied at the same
offsets into pre-sized files, then opened as a store (recovery + dispatch build its consume queues and
index, as a slave's own dispatcher does). Expectations come from the columnar decoder's rows of the
master, not from the comparison's own walk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from broker.cli import main as cli_main
from broker.engine.message_store import MessageStore
from broker.engine.store_settings import StoreSettings
from broker.store.commitlog import CommitLog
from broker.store.consume_queue import queue_dir
from broker.store.generate import GenerateSpec, generate_store
from broker.store.replica import AHEAD, DIVERGENT, IN_SYNC, LAGGING, ReplicaError, compare_stores
from tests.store_harness import decoded_rows

SEG = 128 * 1024
CQ_FILE = 6000
SETTINGS = StoreSettings(segment_bytes=SEG, cq_file_bytes=CQ_FILE, index_slots=1000, index_entries=4000)


@pytest.fixture(scope="module")
def master(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("replica") / "master"
    generate_store(store, GenerateSpec(messages=1500, body_bytes=512, segment_bytes=SEG, cq_file_bytes=CQ_FILE,
                                       index_slots=1000, index_entries=4000, seed=3))
    return store


@pytest.fixture(scope="module")
def rows(master) -> list[dict]:
    return decoded_rows(master, ["commitlog_offset", "store_size", "topic", "queue_id", "queue_offset",
                                 "store_timestamp", "offset_msg_id", "compression", "body"])


def _end(rows: list[dict]) -> int:
    return rows[-1]["commitlog_offset"] + rows[-1]["store_size"]


def copy_prefix(src: Path, dst: Path, cut: int, *, from_offset: int = 0) -> None:
    """The commitlog bytes ``[from_offset, cut)`` of ``src`` at the same offsets in ``dst``'s pre-sized files."""
    log = CommitLog.open(src)
    (dst / "commitlog").mkdir(parents=True, exist_ok=True)
    for seg in log.segments:
        if seg.base >= cut or seg.base + SEG <= from_offset:
            continue
        data = seg.path.read_bytes()[:cut - seg.base]
        with open(dst / "commitlog" / seg.name, "wb") as fh:
            fh.truncate(SEG)
            fh.write(data)


def build_slave(master: Path, slave: Path, cut: int, *, from_offset: int = 0) -> Path:
    """A slave holding the master's bytes up to ``cut``, its queues and index built by opening it."""
    copy_prefix(master, slave, cut, from_offset=from_offset)
    store = MessageStore(slave, SETTINGS)
    store.open()
    store.close()
    return slave


def _ref(row: dict) -> tuple:
    return (row["commitlog_offset"], row["topic"], row["queue_id"], row["queue_offset"], row["store_timestamp"],
            row["offset_msg_id"])


def _got(ref) -> tuple:
    return (ref.commitlog_offset, ref.topic, ref.queue_id, ref.queue_offset, ref.store_timestamp, ref.msg_id)


def _cl_file(store: Path, phy: int) -> tuple[str, int]:
    return str(store / "commitlog" / f"{phy - phy % SEG:020d}"), phy % SEG


def test_in_sync(master, rows, tmp_path):
    slave = build_slave(master, tmp_path / "slave", _end(rows))
    report = compare_stores(master, slave)
    assert report.status == IN_SYNC and report.ok
    assert (report.master.min_offset, report.master.max_offset) == (0, _end(rows))
    assert (report.slave.min_offset, report.slave.max_offset) == (0, _end(rows))
    assert (report.lag_bytes, report.lag_ms, report.missing_records, report.first_missing) == (0, 0, 0, None)
    assert (report.compared_from, report.compared_to) == (0, _end(rows))
    assert report.divergence is None and report.ahead_bytes == 0 and report.partial_bytes == 0
    assert report.queue_mismatches == [] and report.notes == []
    assert _got(report.master.last_record) == _ref(rows[-1]) == _got(report.slave.last_record)


def test_lagging_at_a_record_boundary(master, rows, tmp_path):
    k = 1200
    cut = rows[k]["commitlog_offset"]
    slave = build_slave(master, tmp_path / "slave", cut)
    report = compare_stores(master, slave)
    assert report.status == LAGGING and report.ok
    assert report.slave_end == cut == report.slave.max_offset
    assert report.lag_bytes == _end(rows) - cut
    assert report.lag_ms == rows[-1]["store_timestamp"] - rows[k - 1]["store_timestamp"]
    assert report.missing_records == len(rows) - k
    assert _got(report.first_missing) == _ref(rows[k])
    assert (report.first_missing.file, report.first_missing.file_offset) == _cl_file(master, cut)
    assert _got(report.slave.last_record) == _ref(rows[k - 1])
    assert report.divergence is None and report.queue_mismatches == [] and report.partial_bytes == 0


def test_torn_tail_is_lag_not_divergence(master, rows, tmp_path):
    """The slave received half of the next record after its dispatcher's last run (HA ships byte
    ranges); and a torn copy that recovery cut back to the record boundary."""
    k = 900
    cut, size = rows[k]["commitlog_offset"], rows[k]["store_size"]
    slave = build_slave(master, tmp_path / "slave", cut)
    copy_prefix(master, slave, cut + size // 2, from_offset=cut)  # the torn tail arrives
    report = compare_stores(master, slave)
    assert report.status == LAGGING
    assert report.slave_end == cut and report.partial_bytes == size // 2
    assert report.missing_records == len(rows) - k and _got(report.first_missing) == _ref(rows[k])
    assert report.lag_bytes == _end(rows) - cut and report.divergence is None

    recovered = build_slave(master, tmp_path / "recovered", cut + size // 2)  # recovery zeroes the torn bytes
    report = compare_stores(master, recovered)
    assert (report.status, report.slave_end, report.partial_bytes) == (LAGGING, cut, 0)
    assert report.missing_records == len(rows) - k


def test_one_flipped_body_byte_is_divergence_at_that_byte(master, rows, tmp_path):
    k = next(i for i in range(700, len(rows)) if rows[i]["compression"] == "NONE" and len(rows[i]["body"]) > 100)
    row = rows[k]
    slave = build_slave(master, tmp_path / "slave", _end(rows))
    path, pos = _cl_file(slave, row["commitlog_offset"])
    data = bytearray(Path(path).read_bytes())
    body_at = data.find(row["body"], pos)
    assert pos < body_at < pos + row["store_size"]
    data[body_at + 10] ^= 0x01
    Path(path).write_bytes(data)
    report = compare_stores(master, slave)
    assert report.status == DIVERGENT and not report.ok
    d = report.divergence
    phy = row["commitlog_offset"] + body_at + 10 - pos
    assert d.commitlog_offset == phy
    assert (d.master_file, d.master_file_offset) == _cl_file(master, phy)
    assert (d.slave_file, d.slave_file_offset) == _cl_file(slave, phy)
    assert _got(d.master_record) == _ref(row) == _got(d.slave_record)  # the header is intact on both
    assert report.compared_to == phy and report.lag_bytes == 0 and report.queue_mismatches == []
    assert any(line.startswith("divergence: first differing byte at commitlog ") for line in report.lines())


def test_slave_ahead_of_its_master(master, rows, tmp_path):
    k = 1300
    cut = rows[k]["commitlog_offset"]
    short_master = build_slave(master, tmp_path / "old-master", cut)  # a master that lost its tail
    report = compare_stores(short_master, master)
    assert report.status == AHEAD and not report.ok
    assert report.ahead_bytes == _end(rows) - cut and _got(report.first_ahead) == _ref(rows[k])
    assert report.lag_bytes == 0 and report.divergence is None


def test_slave_started_at_a_newer_file_and_expired_master_files(master, rows, tmp_path):
    base = 3 * SEG
    slave = build_slave(master, tmp_path / "slave", _end(rows), from_offset=base)
    report = compare_stores(master, slave)
    assert report.status == IN_SYNC and report.compared_from == base and report.queue_mismatches == []
    assert report.notes == [f"the slave's first file starts at {base}, above the master's 0 "
                            "(it began replicating at a newer file)"]
    expired = tmp_path / "expired"
    shutil.copytree(master, expired)
    for name in ("00000000000000000000", f"{SEG:020d}"):
        (expired / "commitlog" / name).unlink()
    full = build_slave(master, tmp_path / "full", _end(rows))
    report = compare_stores(expired, full)
    assert report.status == IN_SYNC and report.compared_from == 2 * SEG
    assert report.notes == [f"the master's files below {2 * SEG} expired; compared from there"]


def test_consume_queue_disagreement(master, rows, tmp_path):
    slave = build_slave(master, tmp_path / "slave", _end(rows))
    row = rows[1000]
    qdir = queue_dir(slave, row["topic"], row["queue_id"])
    byte = row["queue_offset"] * 20
    cq_file = qdir / f"{byte - byte % CQ_FILE:020d}"
    data = bytearray(cq_file.read_bytes())
    data[byte % CQ_FILE + 12:byte % CQ_FILE + 20] = (12345).to_bytes(8, "big")  # tagsCode
    cq_file.write_bytes(data)
    report = compare_stores(master, slave)
    assert report.status == DIVERGENT and report.divergence is None
    [m] = report.queue_mismatches
    assert (m.topic, m.queue_id, m.queue_offset) == (row["topic"], row["queue_id"], row["queue_offset"])
    assert m.slave_unit[:2] == (row["commitlog_offset"], row["store_size"]) and m.slave_unit[2] == 12345
    assert m.master_unit[:2] == m.slave_unit[:2] and m.master_unit[2] != 12345
    assert (m.slave_file, m.slave_file_offset) == (str(cq_file), byte % CQ_FILE)


def _other_geometry(tmp_path: Path) -> Path:
    """A store whose commitlog files are twice the size of the master's."""
    other = tmp_path / "other"
    generate_store(other, GenerateSpec(messages=50, body_bytes=256, segment_bytes=2 * SEG, cq_file_bytes=CQ_FILE,
                                       index_slots=100, index_entries=400, seed=5))
    return other


def test_errors_name_the_store(master, rows, tmp_path):
    other = _other_geometry(tmp_path)
    with pytest.raises(ReplicaError, match=rf"master {master} uses {SEG} bytes, slave {other} uses {2 * SEG} bytes"):
        compare_stores(master, other)
    with pytest.raises(ReplicaError, match=rf"slave store {tmp_path / 'nope'}: no such directory"):
        compare_stores(master, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReplicaError, match="master store .*empty: no commitlog/ directory"):
        compare_stores(tmp_path / "empty", master)


def test_cli(master, rows, tmp_path, capsys):
    in_sync = build_slave(master, tmp_path / "in-sync", _end(rows))
    lagging = build_slave(master, tmp_path / "lagging", rows[1400]["commitlog_offset"])
    assert cli_main(["store", "compare", str(master), str(in_sync)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "status: in_sync" and "lag: 0 bytes, 0 ms" in out
    assert cli_main(["store", "compare", str(master), str(lagging), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["status"], got["missing_records"]) == (LAGGING, 100)
    assert got["first_missing"]["commitlog_offset"] == rows[1400]["commitlog_offset"]
    assert cli_main(["store", "compare", str(lagging), str(master)]) == 1  # the "slave" is ahead
    assert capsys.readouterr().out.splitlines()[0] == "status: ahead"
    with pytest.raises(SystemExit) as exc:
        cli_main(["store", "compare", str(master), str(tmp_path / "nope")])
    assert exc.value.code == 2
    other = _other_geometry(tmp_path)
    assert cli_main(["store", "compare", str(master), str(other)]) == 2
    assert "different commitlog file sizes" in capsys.readouterr().err


def test_lake_rows_and_audit_of_a_replica_pair(spark, master, rows, tmp_path, capsys):
    """Master and a lagging slave with one flipped body byte, ingested under two names by ``rocketlake
    audit --replica``: the slave's rows equal the master's wherever both hold a record (but the flipped
    one), and the audit reports exactly the planted lag and divergence."""
    from deltalake import DeltaTable

    k, flipped = 1200, next(i for i in range(600, 1200) if rows[i]["compression"] == "NONE")
    cut, row = rows[k]["commitlog_offset"], rows[flipped]
    slave = build_slave(master, tmp_path / "slave", cut)
    path, pos = _cl_file(slave, row["commitlog_offset"])
    data = bytearray(Path(path).read_bytes())
    data[data.find(row["body"], pos)] ^= 0x01
    Path(path).write_bytes(data)
    lake = tmp_path / "lake"
    assert cli_main(["audit", "--store", f"m1={master}", "--store", f"s1={slave}", "--lake", str(lake),
                     "--replica", "s1=m1"]) == 0
    assert "audit replica_lag" in capsys.readouterr().out

    messages = DeltaTable(str(lake / "messages")).to_pyarrow_table()
    lineage = {"broker_name", "ingest_run_id"}
    by_broker: dict[str, dict[int, dict]] = {"m1": {}, "s1": {}}
    for r in messages.to_pylist():
        by_broker[r["broker_name"]][r["commitlog_offset"]] = {c: v for c, v in r.items() if c not in lineage}
    assert sorted(by_broker["m1"]) == [r["commitlog_offset"] for r in rows]
    assert sorted(by_broker["s1"]) == [r["commitlog_offset"] for r in rows[:k]]
    differing = {off for off, r in by_broker["s1"].items() if r != by_broker["m1"][off]}
    assert differing == {row["commitlog_offset"]}
    s, m = by_broker["s1"][row["commitlog_offset"]], by_broker["m1"][row["commitlog_offset"]]
    assert {c for c in s if s[c] != m[c]} == {"body", "body_crc_ok"}

    findings = [f for f in DeltaTable(str(lake / "audit_findings")).to_pyarrow_table().to_pylist()
                if f["kind"].startswith("replica_")]
    lag = [f for f in findings if f["kind"] == "replica_lag"]
    div = [f for f in findings if f["kind"] == "replica_divergent"]
    assert len(findings) == 2 and len(lag) == 1 and len(div) == 1
    first = rows[k]
    assert (lag[0]["broker_name"], lag[0]["commitlog_offset"], lag[0]["topic"], lag[0]["queue_id"]) == \
        ("s1", cut, first["topic"], first["queue_id"])
    assert (lag[0]["file"], lag[0]["offset"]) == _cl_file(master, cut)
    lag_ms = rows[-1]["store_timestamp"] - rows[k - 1]["store_timestamp"]
    assert lag[0]["detail"] == (
        f"replica of m1: {_end(rows) - cut} bytes and {lag_ms} ms behind (slave ends at commitlog offset {cut}, "
        f"master at {_end(rows)}); {len(rows) - k} records missing, the first at commitlog offset {cut} "
        f"({first['topic']}/{first['queue_id']} offset {first['queue_offset']}, store time {first['store_timestamp']})")
    assert (div[0]["broker_name"], div[0]["commitlog_offset"], div[0]["topic"], div[0]["queue_id"]) == \
        ("s1", row["commitlog_offset"], row["topic"], row["queue_id"])
    assert (div[0]["file"], div[0]["offset"]) == _cl_file(slave, row["commitlog_offset"])
    assert div[0]["detail"].startswith(f"replica of m1: record at commitlog offset {row['commitlog_offset']} "
                                       "differs from master m1's in: body_crc_ok, body (")


@pytest.mark.parametrize("replica, message", [
    ("s1=nobody", "--replica s1=nobody: nobody is not one of the --store names (m1, s1)"),
    ("s1=s1", "--replica s1=s1: a broker cannot be its own master"),
    ("s1", "--replica 's1' is not SLAVE_NAME=MASTER_NAME"),
])
def test_audit_refuses_bad_replica_pairs(master, tmp_path, capsys, replica, message):
    """Checked before any Spark session starts: exit 2 and one line naming the pair."""
    with pytest.raises(SystemExit) as exc:
        cli_main(["audit", "--store", f"m1={master}", "--store", f"s1={master}", "--lake", str(tmp_path / "lake"),
                  "--replica", replica])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"audit.py: error: {message}"
