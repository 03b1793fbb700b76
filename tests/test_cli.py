"""``rocketlake store …`` end to end, in-process (``broker.cli.main``) against Apache's golden store."""

from __future__ import annotations

import base64
import ipaddress
import json
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from broker.cli import main
from broker.store import findings as fk
from broker.store.commitlog import CommitLog
from broker.store.inspect import query_key
from broker.store.properties import decode_properties
from broker.store.verify import verify_store
from schemas.messages import RECORD_FIELD_NAMES
from tests.conftest import REPO_ROOT, load_expected
from tests.golden_fields import expected_row, java_host

VENV_BIN = Path(sys.executable).parent


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "usage: rocketlake" in err
    return err


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _java_host_text(text: str) -> str:
    addr, port = java_host(text)
    ip = ipaddress.ip_address(addr)
    return f"[{ip.compressed}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _as_expected(obj: dict) -> dict:
    """A printed JSON row in expected_row's shape (body bytes, no host fields)."""
    out = {k: v for k, v in obj.items() if k not in ("born_host", "store_host")}
    out["body"] = base64.b64decode(obj["body"])
    return out


def _offsets(rows: list[dict]) -> list[int]:
    return [r["commitlog_offset"] for r in rows]


@pytest.fixture(scope="module")
def golden_lines(golden_store) -> list[dict]:
    """``store messages`` over the whole golden store, parsed (one run shared by the tests)."""
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["store", "messages", str(golden_store)]) == 0
    return _jsonl(buf.getvalue())


# ---- the console script --------------------------------------------------------------------------------

def test_console_script_exists():
    exe = VENV_BIN / "rocketlake"
    assert exe.exists()
    top = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("usage: rocketlake")
    assert "store" in top.stdout
    sub = subprocess.run([str(exe), "store", "messages", "--help"], capture_output=True, text=True, timeout=60,
                         cwd=REPO_ROOT)
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.startswith("usage: rocketlake store messages")
    for option in ("--topic", "--since", "--until", "--from-offset", "--limit", "--format", "STORE_DIR"):
        assert option in sub.stdout


# ---- store messages ------------------------------------------------------------------------------------

def test_messages_every_record_every_field(golden_lines, golden_records):
    assert len(golden_lines) == len(golden_records) == 2001
    for obj, e in zip(golden_lines, golden_records):
        assert list(obj) == RECORD_FIELD_NAMES
        assert _as_expected(obj) == expected_row(e)
        # properties keep the stored order
        assert list(obj["properties"].items()) == list(decode_properties(e["propertiesRaw"]).items())
        assert obj["born_host"] == _java_host_text(e["bornHost"])
        assert obj["store_host"] == _java_host_text(e["storeHost"])


def test_messages_first_and_an_ipv6_record_in_full(golden_lines, golden_records):
    first = golden_lines[0]
    e = golden_records[0]
    assert first == {
        **{k: v for k, v in expected_row(e).items() if k != "body"},
        "born_host": "10.0.132.189:33674", "store_host": "192.168.0.10:10911",
        "body": e["bodyBase64"],
    }
    assert list(first) == RECORD_FIELD_NAMES
    assert first["offset_msg_id"] == "C0A8000A00002A9F0000000000000000"
    v6 = [(o, r) for o, r in zip(golden_lines, golden_records) if o["born_host"] == "[2001:db8::d9e6:108f]:52946"]
    assert v6
    obj, e = v6[0]
    assert _as_expected(obj) == expected_row(e)
    assert obj["sys_flag"] & 0x10
    v6_store = next(o for o in golden_lines if o["store_host"] == "[2001:db8::a]:10911")
    assert len(v6_store["offset_msg_id"]) == 56


def test_messages_topic_filter(capsys, golden_store, golden_records):
    code, out, err = _run(capsys, "store", "messages", golden_store, "--topic", "TopicOrders")
    assert code == 0 and err == ""
    want = [e["phyOffset"] for e in golden_records
            if e["topic"] == "TopicOrders" or e["properties"].get("REAL_TOPIC") == "TopicOrders"
            and e["topic"] in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC")]
    rows = _jsonl(out)
    assert _offsets(rows) == want
    assert {r["real_topic"] for r in rows} == {"TopicOrders"}
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--topic", "NoSuchTopic")
    assert (code, out) == (0, "")


@pytest.mark.parametrize("since_fmt,until_fmt", [("iso", "iso"), ("ms", "ms"), ("iso", "ms")])
def test_messages_time_window(capsys, golden_store, golden_records, since_fmt, until_fmt):
    lo, hi = golden_records[100]["storeTimestamp"], golden_records[900]["storeTimestamp"]
    since = _iso(lo) if since_fmt == "iso" else str(lo)
    until = _iso(hi) if until_fmt == "iso" else str(hi)
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--since", since, "--until", until)
    assert code == 0
    assert _offsets(_jsonl(out)) == [e["phyOffset"] for e in golden_records if lo <= e["storeTimestamp"] <= hi]


def test_messages_naive_iso_is_utc_and_empty_window(capsys, golden_store, golden_records):
    ts = golden_records[10]["storeTimestamp"]
    naive = _iso(ts).rstrip("Z")
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--since", naive, "--until", naive)
    assert code == 0
    assert _offsets(_jsonl(out)) == [e["phyOffset"] for e in golden_records if e["storeTimestamp"] == ts]
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--since", str(ts + 1), "--until", str(ts))
    assert (code, out) == (0, "")


def test_messages_from_offset_and_limit(capsys, golden_store, golden_records):
    offsets = [e["phyOffset"] for e in golden_records]
    # exactly at a record, inside a record, inside a BLANK, past the end
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--from-offset", offsets[500])
    assert code == 0 and _offsets(_jsonl(out)) == offsets[500:]
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--from-offset", offsets[500] + 1, "--limit", 10)
    assert code == 0 and _offsets(_jsonl(out)) == offsets[501:511]
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--from-offset", 1047938 + 5, "--limit", 2)
    assert code == 0 and _offsets(_jsonl(out)) == [1048576, offsets[offsets.index(1048576) + 1]]
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--from-offset", 10**12)
    assert (code, out) == (0, "")
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--limit", 1)
    assert _offsets(_jsonl(out)) == [0]
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--limit", 3000)
    assert len(_jsonl(out)) == 2001
    # limit after the filters
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--topic", "%DLQ%groupA", "--limit", 5,
                        "--from-offset", 500_000)
    assert _offsets(_jsonl(out)) == [e["phyOffset"] for e in golden_records
                                     if e["topic"] == "%DLQ%groupA" and e["phyOffset"] >= 500_000][:5]


def test_messages_table_format(capsys, golden_store, golden_records):
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--format", "table", "--limit", 5)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 6
    assert lines[0].split()[:4] == ["OFFSET", "STORE", "TIME", "(UTC)"]
    for line, e in zip(lines[1:], golden_records):
        cells = line.split()
        assert int(cells[0]) == e["phyOffset"]
        assert f"{cells[1]} {cells[2]}" == datetime.fromtimestamp(
            e["storeTimestamp"] / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        assert cells[3] == e["topic"]
    assert lines[1].split()[3:7] == ["Topic_Events-v1", "0", "0", "TagB"]
    # one line per record even when bodies hold CR, ESC or other control characters
    code, out, _ = _run(capsys, "store", "messages", golden_store, "--format", "table")
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) == 2 + len(golden_records)
    assert [int(line.split()[0]) for line in lines[1:-1]] == [e["phyOffset"] for e in golden_records]
    assert all(c.isprintable() for c in out.replace("\n", ""))


def test_messages_on_a_damaged_store_prints_findings(capsys, golden_store, golden_records, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(golden_store, store)
    victim = golden_records[20]
    seg = CommitLog.open(store).segment_for(victim["phyOffset"])
    with open(seg.path, "r+b") as fh:
        fh.seek(victim["phyOffset"] - seg.base + 4)
        fh.write(b"\x12\x34\x56\x78")  # bad magic: the record is skipped
    code, out, err = _run(capsys, "store", "messages", store)
    assert code == 0
    assert _offsets(_jsonl(out)) == [e["phyOffset"] for e in golden_records if e is not victim]
    assert f"{seg.path}@{victim['phyOffset'] - seg.base}: {fk.BAD_MAGIC}" in err


# ---- store queues / index ------------------------------------------------------------------------------

def test_queues_min_max(capsys, golden_store, golden_expected):
    expected = load_expected(golden_expected, "expected_queues.json")["queues"]
    code, out, err = _run(capsys, "store", "queues", golden_store, "--format", "json")
    assert code == 0 and err == ""
    got = {(r["topic"], r["queue_id"]): (r["min_offset"], r["max_offset"], r["messages"]) for r in _jsonl(out)}
    want = {(t, int(q)): (v["minOffset"], v["maxOffset"], v["maxOffset"] - v["minOffset"])
            for t, qs in expected.items() for q, v in qs.items()}
    # Apache also answers for delay-level queues that were never written; only queues on disk are listed
    never_written = {k: v for k, v in want.items() if k not in got}
    assert set(never_written) == {("SCHEDULE_TOPIC_XXXX", q) for q in range(9)}
    assert set(never_written.values()) == {(0, 0, 0)}
    assert got == {k: v for k, v in want.items() if k in got}
    assert len(got) == 22
    code, out, _ = _run(capsys, "store", "queues", golden_store)
    lines = out.splitlines()
    assert lines[0].split() == ["TOPIC", "QID", "MIN", "MAX", "MESSAGES"]
    assert [tuple(line.split()) for line in lines[1:]] == [
        (t, str(q), *(str(n) for n in v)) for (t, q), v in sorted(got.items())]


def test_queues_units_and_topic(capsys, golden_store, golden_expected):
    expected = load_expected(golden_expected, "expected_queues.json")["queues"]["%DLQ%groupA"]["0"]
    code, out, _ = _run(capsys, "store", "queues", golden_store, "--topic", "%DLQ%groupA", "--units",
                        "--format", "json")
    assert code == 0
    rows = _jsonl(out)
    assert rows[0] == {"topic": "%DLQ%groupA", "queue_id": 0, "min_offset": 0, "max_offset": 33, "messages": 33}
    units = rows[1:]
    assert [[u["queue_offset"], u["commitlog_offset"], u["size"], u["tags_code"]] for u in units] == \
        expected["entries"]
    err = _run(capsys, "store", "queues", golden_store, "--topic", "NoSuchTopic")
    assert err[0] == 2 and "has no consume queues" in err[2]


def test_index_queries(capsys, golden_store, golden_expected):
    queries = load_expected(golden_expected, "expected_index.json")["queries"]
    picked = [q for q in queries if len(q["verifiedPhyOffsets"]) != 1] + queries[:5]
    assert any(not q["verifiedPhyOffsets"] for q in picked)  # keys that are not there
    assert any("😀" in q["key"] for q in picked) and any("用户" in q["key"] for q in picked)
    for q in picked:
        code, out, err = _run(capsys, "store", "index", golden_store, "--topic", q["topic"], "--key", q["key"])
        assert code == 0
        rows = _jsonl(out)
        assert _offsets(rows) == q["verifiedPhyOffsets"], q["indexKey"]
        assert all(q["key"] in r["keys"] or r["uniq_key"] == q["key"] for r in rows)
        assert all(list(r) == RECORD_FIELD_NAMES for r in rows)
        assert f"{len(rows)} message(s)" in err


def test_index_time_window(capsys, golden_store, golden_expected, golden_records):
    q = next(q for q in load_expected(golden_expected, "expected_index.json")["queries"]
             if q["key"] == "order-0" and q["topic"] == "TopicOrders")
    ts = {e["phyOffset"]: e["storeTimestamp"] for e in golden_records}
    stamps = sorted(ts[o] for o in q["verifiedPhyOffsets"])
    lo, hi = stamps[3], stamps[-4]
    code, out, _ = _run(capsys, "store", "index", golden_store, "--topic", "TopicOrders", "--key", "order-0",
                        "--begin", _iso(lo), "--end", str(hi))
    assert code == 0
    got = _offsets(_jsonl(out))
    # the index keeps whole seconds since the file's begin time (Apache's timeDiff), so an entry's time
    # is in (storeTimestamp - 1000, storeTimestamp]: the window is exact to within that second
    assert got == [r["commitlog_offset"] for r in query_key(golden_store, "TopicOrders", "order-0", lo, hi)]
    assert got == sorted(got) and set(got) < set(q["verifiedPhyOffsets"])
    assert {o for o in q["verifiedPhyOffsets"] if lo + 1000 <= ts[o] <= hi} <= set(got)
    assert all(lo <= ts[o] <= hi + 999 for o in got)
    whole = ["--begin", "1970-01-01T00:00:00Z", "--end", _iso(stamps[-1] + 1000)]
    code, out, _ = _run(capsys, "store", "index", golden_store, "--topic", "TopicOrders", "--key", "order-0", *whole)
    assert _offsets(_jsonl(out)) == q["verifiedPhyOffsets"]
    code, out, err = _run(capsys, "store", "index", golden_store, "--topic", "TopicOrders", "--key", "order-0",
                          "--end", str(stamps[0] - 5000))
    assert (code, out) == (0, "") and "0 message(s)" in err


# ---- store verify / generate ---------------------------------------------------------------------------

def test_verify_golden_exit_0(capsys, golden_store):
    code, out, err = _run(capsys, "store", "verify", golden_store)
    assert code == 0
    assert out == ""
    assert "5 commitlog files, 2001 records" in err and "no findings" in err


def test_verify_damaged_copy_exit_1(capsys, golden_store, golden_records, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(golden_store, store)
    victim = next(e for e in golden_records[300:] if e["bodyLength"] > 100 and not e["compressed"])
    seg = CommitLog.open(store).segment_for(victim["phyOffset"])
    body_pos = victim["phyOffset"] - seg.base + victim["storeSize"] - victim["propertiesLength"] - 2 \
        - victim["topicLength"] - 1 - 10
    with open(seg.path, "r+b") as fh:
        fh.seek(body_pos)
        byte = fh.read(1)
        fh.seek(body_pos)
        fh.write(bytes([byte[0] ^ 0x55]))
    code, out, err = _run(capsys, "store", "verify", store)
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"{seg.path}@{victim['phyOffset'] - seg.base}: {fk.CRC_MISMATCH}: BODYCRC ")
    assert "crc_mismatch=1" in err
    code, out, _ = _run(capsys, "store", "verify", store, "--format", "json")
    assert code == 1
    assert [(f["file"], f["offset"], f["kind"], f["physical_offset"]) for f in _jsonl(out)] == [
        (str(seg.path), victim["phyOffset"] - seg.base, fk.CRC_MISMATCH, victim["phyOffset"])]


def test_generate_then_verify(capsys, tmp_path):
    store = tmp_path / "gen"
    code, out, err = _run(capsys, "store", "generate", store, "--messages", 400, "--segment-bytes", "256K",
                          "--index-slots", 500, "--seed", 3, "--body-bytes", 512)
    assert code == 0 and out == ""
    assert "generated 400 messages" in err
    assert sorted(p.name for p in (store / "commitlog").iterdir())[0] == "0" * 20
    assert all(p.stat().st_size == 256 * 1024 for p in (store / "commitlog").iterdir())
    code, out, err = _run(capsys, "store", "verify", store)
    assert (code, out) == (0, "")
    assert "400 records" in err and "no findings" in err
    report = verify_store(store)
    assert report.records == 400 and report.findings == []
    code, out, _ = _run(capsys, "store", "messages", store, "--limit", 3)
    assert _offsets(_jsonl(out))[0] == 0
    # a second generate into the same directory is refused
    code, out, err = _run(capsys, "store", "generate", store, "--messages", 10, "--segment-bytes", "256K")
    assert code == 2 and "already holds a commitlog" in err
    # a spec the generator rejects
    code, out, err = _run(capsys, "store", "generate", tmp_path / "x", "--messages", 10, "--segment-bytes", "1K")
    assert code == 2 and err.startswith("error: --segment-bytes")


# ---- usage errors --------------------------------------------------------------------------------------

def test_missing_store_dir(capsys, tmp_path):
    err = _usage_error(capsys, "store", "messages", tmp_path / "nope")
    assert "does not exist" in err


def test_dir_that_is_not_a_store(capsys, tmp_path):
    for command in ("messages", "queues", "verify"):
        err = _usage_error(capsys, "store", command, tmp_path)
        assert "is not a RocketMQ store" in err


@pytest.mark.parametrize("args,message", [
    (["--limit", "0"], "argument --limit: must be > 0"),
    (["--limit", "-3"], "argument --limit"),
    (["--limit", "ten"], "is not a whole number"),
    (["--since", "notatime"], "argument --since: 'notatime' is not an ISO-8601 time"),
    (["--until", "2026-13-45"], "argument --until"),
    (["--from-offset", "-5"], "argument --from-offset: -5 must be >= 0"),
    (["--from-offset=-1"], "must be >= 0"),
    (["--format", "xml"], "invalid choice"),
])
def test_bad_message_arguments(capsys, golden_store, args, message):
    err = _usage_error(capsys, "store", "messages", golden_store, *args)
    assert message in err


def test_bad_other_arguments(capsys, golden_store, tmp_path):
    assert "required: --key" in _usage_error(capsys, "store", "index", golden_store, "--topic", "T")
    assert "--segment-bytes" in _usage_error(capsys, "store", "verify", golden_store, "--segment-bytes", "lots")
    assert "required: --messages" in _usage_error(capsys, "store", "generate", tmp_path / "g")
    assert "invalid choice" in _usage_error(capsys, "store", "nothing")
    _usage_error(capsys)
    assert not (tmp_path / "g").exists()
