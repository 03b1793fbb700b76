"""Streaming ingest (pipelines/stream.py, pipelines/sources/commitlog_stream.py, jobs/stream_commitlog.py).

* The source's offsets: the initial offset is the lake's mark, the latest never passes the complete
  records, and while a process holds the store's lock (a live broker) it stops where the dispatcher got.
* Retention: segments deleted before they were ingested are a ``lost_range`` finding, in the batch
  ingest and in the stream, and both go on from the first remaining segment.
* Arguments: ``--follow`` needs ``--checkpoint``; bad arguments and a store without a commitlog are one
  line and exit 2; ``rocketlake ingest --follow`` runs the stream.
* Live: our broker fed by Apache's C++ client (and our Python producer, whose offset message ids give
  commitlog offsets), the stream job as a spark-submit subprocess that is SIGKILLed and restarted from
  its checkpoint, a batch ingest in between, a broker restart, segment rolls; at the end every
  acknowledged message is in ``messages`` exactly once and the lake equals a batch ingest of the store.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from broker.client import Message, Producer
from broker.cli import main as rocketlake, run_job
from broker.store.commitlog import CommitLog
from broker.store.record_layout import POS_PHYSICAL_OFFSET
from broker.store.generate import GenerateSpec, generate_store
from broker.store.message_id import decode_offset_msg_id
from pipelines.ingest import app_id_for, ingest, ingest_store
from pipelines.job_args import StoreSpec, launch_conf_args
from pipelines.lake import app_version, scan_arrow
from pipelines.sources.commitlog_stream import (
    CommitLogStreamReader,
    broker_holds_store,
    safe_end,
    stream_source_options,
)
from pipelines.storage import Location
from pipelines.store_files import StoreFiles
from pipelines.stream import run_stream
from schemas.messages import MESSAGES_TABLE
from schemas.tables import CONSUME_QUEUE_TABLE, CORRUPT_RECORDS_TABLE, INGEST_RUNS_TABLE
from tests.broker_harness import REPO, start_broker, start_namesrv
from tests.cpp_client import ClientProcesses, create_routed_topic, wait_for
from tests.job_runner import group_alive, pump_lines

BROKER = "broker-a"
SEGMENT = 128 * 1024


def _store(path: Path, messages: int = 600) -> Path:
    generate_store(path, GenerateSpec(messages=messages, body_bytes=256, segment_bytes=SEGMENT, index_slots=1000,
                                      index_entries=4000, seed=3))
    return path


def _record_ends(store: Path) -> list[int]:
    return [r.physical_offset + r.total_size for r in CommitLog.open(store).iter_records()]


def _mark(lake: Path, table: str = MESSAGES_TABLE) -> int:
    return app_version(lake, table, app_id_for(BROKER)) or 0


def _rows(lake: Path, table: str, key: list[str]) -> list[dict]:
    t = scan_arrow(lake, table)
    return t.drop_columns([c for c in ("ingest_run_id",) if c in t.column_names]).sort_by([(k, "ascending") for k in key]).to_pylist()


def _hold_lock(store: Path) -> subprocess.Popen:
    """Another process holding the store's lock, as a live broker does."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from broker.store.store_lock import lock_store; "
                             f"lock_store({str(store)!r}); print('locked', flush=True); sys.stdin.read()"],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _undispatch_last(store: Path) -> int:
    """Zero the consume-queue unit of the last record (as if the dispatcher had not got to it yet);
    returns that record's commitlog offset."""
    best = None
    for f in (store / "consumequeue").rglob("0" * 20):
        data = f.read_bytes()
        for i in range(0, len(data), 20):
            phy, size = struct.unpack_from(">qi", data, i)
            if size <= 0:
                break
            if best is None or phy > best[0]:
                best = (phy, f, i)
    phy, f, i = best
    with open(f, "r+b") as fh:
        fh.seek(i)
        fh.write(bytes(20))
    return phy


def test_source_offsets_follow_the_lake_and_the_complete_records(spark, tmp_path):
    store = _store(tmp_path / "store")
    ends = _record_ends(store)
    spec, lake = StoreSpec(BROKER, str(store)), Location.parse(str(tmp_path / "lake"))
    reader = CommitLogStreamReader(stream_source_options([spec], lake))
    assert reader.initialOffset() == {BROKER: 0}
    assert reader.latestOffset({BROKER: 0}, None) == {BROKER: ends[-1]}

    ingest_store(spark, spec, lake, until_offset=ends[99])
    assert reader.initialOffset() == {BROKER: ends[99]}
    assert [p.value for p in reader.partitions({BROKER: ends[99]}, {BROKER: ends[-1]})] == [(BROKER, ends[99], ends[-1])]
    assert list(reader.read(reader.partitions({BROKER: 5}, {BROKER: 9})[0])) == [(BROKER, 5, 9)]
    assert reader.partitions({BROKER: 9}, {BROKER: 9}) == []

    # a record still being written (its first bytes, up to before its PHYSICALOFFSET field, at the end of
    # the data) is not offered
    seg = store / "commitlog" / f"{(ends[-1] // SEGMENT) * SEGMENT:020d}"
    with open(seg, "r+b") as fh:
        fh.seek(ends[-2] % SEGMENT)
        head = fh.read(POS_PHYSICAL_OFFSET)
        fh.seek(ends[-1] % SEGMENT)
        fh.write(head)
    assert reader.latestOffset({BROKER: ends[99]}, None) == {BROKER: ends[-1]}

    # a live broker: only as far as its dispatcher got (every table can go to the same end)
    undispatched = _undispatch_last(store)
    dispatched = StoreFiles(store).dispatched_end()
    assert dispatched < ends[-1] and dispatched <= undispatched
    assert not broker_holds_store(spec.location)
    holder = _hold_lock(store)
    try:
        assert broker_holds_store(spec.location)
        assert reader.latestOffset({BROKER: ends[99]}, None) == {BROKER: dispatched}
        assert reader.latestOffset({BROKER: ends[-1]}, None) == {BROKER: ends[-1]}  # never below the start
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert safe_end(spec) == ends[-1]


def _lost_range_case(spark, tmp_path: Path, name: str, mark: int, run) -> tuple[Path, Path]:
    """Ingest ``[0, mark)``, delete the first two segments, then ``run(spec, lake)``; returns store and lake."""
    store = _store(tmp_path / f"store-{name}")
    spec, lake = StoreSpec(BROKER, str(store)), tmp_path / f"lake-{name}"
    ingest_store(spark, spec, lake, until_offset=mark)
    for base in (0, SEGMENT):
        (store / "commitlog" / f"{base:020d}").unlink()
    run(spec, lake)
    return store, lake


def test_segments_deleted_before_ingest_are_a_lost_range_in_batch_and_stream(spark, tmp_path):
    reference = _store(tmp_path / "reference")
    ref_lake = tmp_path / "ref-lake"
    ingest(spark, [StoreSpec(BROKER, str(reference))], ref_lake)
    mark, first = 50_000, 2 * SEGMENT
    ref = [r for r in _rows(ref_lake, MESSAGES_TABLE, ["commitlog_offset"])
           if r["commitlog_offset"] < mark or r["commitlog_offset"] >= first]
    assert ref[-1]["commitlog_offset"] >= first and any(r["commitlog_offset"] < mark for r in ref)

    def batch(spec, lake):
        ingest(spark, [spec], lake)

    def stream(spec, lake):
        state = run_stream(spark, [spec], Location.parse(str(lake)), str(tmp_path / "checkpoint"),
                           trigger_interval="200 milliseconds", max_batches=1, handle_signals=False)
        assert state.batches == 1

    for name, run in (("batch", batch), ("stream", stream)):
        store, lake = _lost_range_case(spark, tmp_path, name, mark, run)
        lost = [r for r in _rows(lake, CORRUPT_RECORDS_TABLE, ["offset"]) if r["reason"].startswith("lost_range")]
        assert lost == [{"broker_name": BROKER, "file": str(store / "commitlog" / f"{first:020d}"), "offset": 0,
                         "reason": f"lost_range: commitlog bytes [{mark}, {first}) were deleted before they were ingested",
                         "bytes_skipped": first - mark}], name
        assert _rows(lake, MESSAGES_TABLE, ["commitlog_offset"]) == ref, name
        runs = scan_arrow(lake, INGEST_RUNS_TABLE).sort_by("from_offset").to_pylist()
        assert [(r["from_offset"], r["to_offset"]) for r in runs] == [(0, mark), (mark, _mark(ref_lake))], name
        assert _mark(lake, CORRUPT_RECORDS_TABLE) == _mark(ref_lake)


# ---- arguments ------------------------------------------------------------------------------------------

def _job(args: list[str], job: str = "stream_commitlog.py") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "jobs" / job), *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=_env())


def _env() -> dict[str, str]:
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                PYSPARK_DRIVER_PYTHON=sys.executable)


@pytest.mark.parametrize("job, args, error", [
    ("ingest_commitlog.py", ["--follow"], "--follow needs --checkpoint DIR (the streaming query's checkpoint)"),
    ("ingest_commitlog.py", ["--follow", "--checkpoint", "{tmp}/c", "--until-offset", "9"],
     "--until-offset cannot be combined with --follow (a stream has no end offset)"),
    ("ingest_commitlog.py", ["--checkpoint", "{tmp}/c"], "--checkpoint, --max-batches and --until-idle go with --follow"),
    ("stream_commitlog.py", [], "the following arguments are required: --checkpoint"),
    ("stream_commitlog.py", ["--checkpoint", "{tmp}/c", "--trigger-interval", "soon"],
     "argument --trigger-interval: 'soon' is not an interval like 5s, 500ms or 1m"),
    ("stream_commitlog.py", ["--checkpoint", "{tmp}/c", "--max-batches", "0"],
     "argument --max-batches: '0' is not a positive integer"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, job, args, error):
    store = _store(tmp_path / "store", 10)
    argv = ["--store", f"{BROKER}={store}", "--lake", str(tmp_path / "lake"),
            *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    with pytest.raises(SystemExit) as exited:  # in-process: the checks come before any Spark session
        run_job(job, argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"{job}: error: {error}"


def test_store_without_commitlog_is_an_error(tmp_path):
    (tmp_path / "empty" / "commitlog").mkdir(parents=True)
    out = _job(["--store", f"{BROKER}={tmp_path / 'empty'}", "--lake", str(tmp_path / "lake"),
                "--checkpoint", str(tmp_path / "c")])
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1].startswith(f"stream_commitlog.py: error: {tmp_path / 'empty'} lists no commitlog segment")


def test_rocketlake_ingest_follow_runs_the_stream(spark, tmp_path):
    store = _store(tmp_path / "store", 200)
    lake = tmp_path / "lake"
    argv = ["--store", f"{BROKER}={store}", "--lake", str(lake), "--follow", "--checkpoint", str(tmp_path / "c"),
            "--trigger-interval", "200ms", "--max-batches", "1"]
    declared = tmp_path / "payload_schemas.toml"  # the stream writes the payload tables too
    declared.write_text('[topics.demo-topic-0]\nformat = "text"\n')
    assert rocketlake(["ingest", *argv, "--payload-schemas", str(declared)]) == 0
    assert _mark(lake) == _mark(lake, INGEST_RUNS_TABLE) == _record_ends(store)[-1]
    assert scan_arrow(lake, MESSAGES_TABLE, ["commitlog_offset"]).num_rows == 200
    import pyarrow.compute as pc

    topic0 = set(scan_arrow(lake, MESSAGES_TABLE, ["commitlog_offset", "topic", "transaction_type"],
                            (pc.field("topic") == "demo-topic-0")
                            & pc.field("transaction_type").isin(["NOT", "COMMIT"]))["commitlog_offset"].to_pylist())
    typed = scan_arrow(lake, "payload_demo_topic_0", ["commitlog_offset"])["commitlog_offset"].to_pylist()
    quarantined = (scan_arrow(lake, "payload_quarantine", ["commitlog_offset"])["commitlog_offset"].to_pylist()
                   if (lake / "payload_quarantine").exists() else [])
    assert topic0 and sorted(typed + quarantined) == sorted(topic0)
    assert _mark(lake, "payload_demo_topic_0") == _mark(lake)


# ---- live: broker, C++ producers, the stream job killed and restarted, a batch run, a broker restart ------

TOPIC = "StreamLive"
CPP_BATCH = 150  # messages per C++ producer process
LIVE_SEGMENT = 512 * 1024  # several commitlog files roll over during the test
CONFIG = {"mappedFileSizeCommitLog": LIVE_SEGMENT}
STREAM_DEADLINE_S = 240  # guards against a hung step, never a pass condition
BATCH_LINE = re.compile(r"stream batch \d+ broker-a: \[(\d+), (\d+)\) \+(\d+) rows")


class Producers:
    """C++ producer processes one after another plus a Python producer thread, until stopped; what each
    acknowledged is kept (C++: the UNIQ_KEY and queue offset; Python: the commitlog offset)."""

    def __init__(self, tmp: Path, namesrv: str) -> None:
        self.tmp, self.namesrv = tmp, namesrv
        self.clients = ClientProcesses(tmp)
        self.stop = threading.Event()
        self.cpp: list[dict] = []  # {"uniq", "queue_offset", "body"}
        self.py: list[tuple[int, bytes]] = []
        self.failures: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(f,), daemon=True) for f in (self._cpp, self._python)]
        for t in self.threads:
            t.start()

    @property
    def acked(self) -> int:
        return len(self.cpp) + len(self.py)

    def _run(self, body) -> None:
        try:
            body()
        except BaseException as exc:  # surfaced by finish()
            self.failures.append(exc)

    def _cpp(self) -> None:
        n = 0
        while not self.stop.is_set():
            msgs = [{"seq": f"c{n}-{i}", "mode": "sync", "keys": f"c{n}-{i}", "tags": "cpp",
                     "props": {"seq": f"c{n}-{i}"}, "body": f"cpp {n} {i} " + "x" * (i % 97)} for i in range(CPP_BATCH)]
            spec = self.tmp / f"cpp-{n}.json"
            spec.write_text(json.dumps({"topic": TOPIC, "messages": msgs}))
            res = self.clients.client(f"cpp-{n}", ["produce.py", self.namesrv, "PG_STREAM_CPP", str(spec)],
                                      timeout=180).result()
            by_seq = {m["seq"]: m for m in msgs}
            for r in res["results"]:
                if r["status"] == 0:
                    self.cpp.append({"uniq": r["msg_id"], "queue_offset": r["offset"],
                                     "body": by_seq[r["seqs"][0]]["body"].encode()})
            n += 1
            self.stop.wait(0.5)  # a steady load that leaves the 2 cores room for Spark, not a saturating one

    def _python(self) -> None:
        with Producer("PG_STREAM_PY", self.namesrv) as producer:
            i = 0
            while not self.stop.is_set():
                body = f"py-{i}-".encode() * (1 + i % 30)
                try:
                    res = producer.send(Message(TOPIC, body, keys=[f"p{i}"]))
                except Exception:  # the broker is restarting: not acknowledged, try the next one
                    time.sleep(0.2)
                    continue
                self.py.append((decode_offset_msg_id(res.offset_msg_id).physical_offset, body))
                i += 1
                time.sleep(0.01)  # a light second load: the C++ producers are the main one

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(240)
        assert not any(t.is_alive() for t in self.threads) and not self.failures, self.failures


class StreamJob:
    """``spark-submit jobs/stream_commitlog.py`` in its own process group; its log read as it is written."""

    def __init__(self, store: Path, lake: Path, checkpoint: Path, log: Path) -> None:
        cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", *launch_conf_args(),
               "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
               str(REPO / "jobs" / "stream_commitlog.py"), "--store", f"{BROKER}={store}", "--lake", str(lake),
               "--checkpoint", str(checkpoint), "--trigger-interval", "1s", "--split-bytes", str(LIVE_SEGMENT // 2)]
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.lines, self.pump = pump_lines(self.proc.stdout)
        self.seen: list[str] = []
        self.deadline = time.monotonic() + STREAM_DEADLINE_S

    def wait_line(self, what: str, predicate) -> str:
        """Read the log until a line satisfies ``predicate`` (the job ending first fails the test)."""
        while True:
            try:
                raw = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert time.monotonic() < self.deadline, f"no {what} within {STREAM_DEADLINE_S} s:\n{self.tail()}"
                continue
            assert raw is not None, f"the stream job ended before {what}:\n{self.tail()}"
            self.log.write(raw + b"\n")
            line = raw.decode("utf-8", "replace")
            self.seen.append(line)
            if predicate(line):
                return line

    def tail(self) -> str:
        return "\n".join(self.seen[-40:])

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        while group_alive(self.proc.pid):  # nothing of it may still write when the next run starts
            time.sleep(0.05)
        self.pump.join(30)
        self.log.close()

    def terminate(self) -> int:
        """SIGTERM to the Python driver (the JVM would only take the driver down with it): the job stops
        after the current micro-batch and exits 0."""
        driver = [pid for pid in _group_pids(self.proc.pid)
                  if (cmd := _cmdline(pid)).split(b"\0")[0].endswith(b"python") and b"stream_commitlog.py" in cmd]
        assert len(driver) == 1, driver
        os.kill(driver[0], signal.SIGTERM)
        self.wait_line("the stop", lambda line: "stream: stopped after" in line)
        rc = self.proc.wait(60)
        self.pump.join(30)
        while (raw := self.lines.get()) is not None:
            self.seen.append(raw.decode("utf-8", "replace"))
            self.log.write(raw + b"\n")
        self.log.close()
        return rc


def _cmdline(pid: int) -> bytes:
    """A process's command line; b"" once it has exited (Spark's short-lived Python workers come and
    go between listing the group and reading this: the flake seen in a clean-clone run)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def _group_pids(pgid: int) -> list[int]:
    from broker.server.launcher import live_group_pids

    return live_group_pids(pgid)


def _batch_rows(line: str) -> int:
    return int(BATCH_LINE.search(line).group(3))


def _phase(what: str, t0: list[float]) -> None:
    """Where the live test's time goes (shown with the output of a failing run)."""
    print(f"[{time.monotonic() - t0[0]:6.1f} s] {what}", flush=True)


def test_stream_follows_a_live_broker_through_kills_batch_runs_and_restarts(spark, tmp_path):
    t0 = [time.monotonic()]
    store, lake, checkpoint = tmp_path / "store", tmp_path / "lake", tmp_path / "checkpoint"
    spec = StoreSpec(BROKER, str(store))
    ns, namesrv = start_namesrv(tmp_path)
    broker = start_broker(store, namesrv, CONFIG)
    producers = None
    stream = None
    try:
        create_routed_topic(broker.addr, namesrv, TOPIC, 4)
        producers = Producers(tmp_path, namesrv)
        wait_for("the first acknowledged sends", lambda: producers.acked >= 200, 60)

        # 1. the stream ingests while the producers send; SIGKILLed in the middle of a micro-batch
        _phase("producers running", t0)
        stream = StreamJob(store, lake, checkpoint, tmp_path / "stream.log")
        stream.wait_line("a micro-batch's files", lambda line: "files of messages" in line)
        _phase("killing the stream mid-batch", t0)
        stream.kill()
        killed_at = _mark(lake)

        _phase("stream killed", t0)
        # 2. a batch ingest in between, while the producers go on
        assert run_job("ingest_commitlog.py", ["--store", f"{BROKER}={store}", "--lake", str(lake)]) == 0
        batch_end = _mark(lake)
        assert batch_end > killed_at

        _phase("batch ingest done", t0)
        # 3. the stream again, from its checkpoint: it goes on from the lake's mark
        stream = StreamJob(store, lake, checkpoint, tmp_path / "stream.log")
        line = stream.wait_line("a micro-batch after the batch run",
                                lambda line: bool(BATCH_LINE.search(line)) and _batch_rows(line) > 0)
        assert int(BATCH_LINE.search(line).group(1)) >= batch_end

        _phase("restarted stream ingested", t0)
        # 4. the broker restarts under the stream (and the producers)
        broker.stop()
        broker = start_broker(store, namesrv, CONFIG, port=broker.port)
        restarted_end = StoreFiles(store).dispatched_end()
        acked = producers.acked
        wait_for("sends acknowledged by the restarted broker", lambda: producers.acked >= acked + 100, 90)
        stream.wait_line("a micro-batch past the restart",
                         lambda line: bool(BATCH_LINE.search(line)) and int(BATCH_LINE.search(line).group(2)) > restarted_end)

        _phase("micro-batch past the broker restart", t0)
        # 5. the producers stop; the stream catches up with everything the store holds
        producers.finish()
        wait_for("the dispatcher to reach the end of the commitlog",
                 lambda: StoreFiles(store).dispatched_end() == safe_end(StoreSpec(BROKER, str(store))) > 0
                 and StoreFiles(store).dispatched_end() == CommitLog.open(store).data_end(), 60)
        _phase("store settled", t0)
        end = CommitLog.open(store).data_end()
        wait_for("the lake's marks to reach the store's end",
                 lambda: all(_mark(lake, t) == end for t in (MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INGEST_RUNS_TABLE)),
                 120, interval=0.5,
                 detail=lambda: f"marks {_mark(lake)} / {_mark(lake, INGEST_RUNS_TABLE)}, end {end}\n{stream.tail()}")
        _phase("lake caught up", t0)
        assert stream.terminate() == 0
        assert any("stopping after the current micro-batch" in line for line in stream.seen)
    finally:
        if producers is not None:
            producers.stop.set()
            producers.clients.kill_all()
        if stream is not None and stream.proc.poll() is None:
            stream.kill()
        broker.stop()
        ns.send_signal(signal.SIGTERM)
        ns.wait(10)

    assert len(list((store / "commitlog").iterdir())) >= 3  # the commitlog rolled over
    msgs = scan_arrow(lake, MESSAGES_TABLE, ["commitlog_offset", "topic", "uniq_key", "queue_offset", "body"])
    offsets = msgs["commitlog_offset"].to_pylist()
    assert len(offsets) == len(set(offsets))  # nothing twice
    mine = msgs.filter(pc.equal(msgs["topic"], TOPIC))
    by_offset = dict(zip(mine["commitlog_offset"].to_pylist(), mine["body"].to_pylist()))
    assert {o: by_offset.get(o) for o, _ in producers.py} == dict(producers.py)  # every Python ack, its body
    uniq = mine["uniq_key"].to_pylist()
    by_uniq = {u: (q, b) for u, q, b in zip(uniq, mine["queue_offset"].to_pylist(), mine["body"].to_pylist())}
    assert len(uniq) == len(set(uniq))
    assert {a["uniq"]: by_uniq.get(a["uniq"]) for a in producers.cpp} == \
        {a["uniq"]: (a["queue_offset"], a["body"]) for a in producers.cpp}  # every C++ ack once, where it said

    _phase("checks of the acks done", t0)
    # the lake the stream (and the batch run between) wrote equals one batch ingest of the store
    fresh = tmp_path / "fresh-lake"
    ingest(spark, [spec], fresh)
    assert _rows(lake, MESSAGES_TABLE, ["commitlog_offset"]) == _rows(fresh, MESSAGES_TABLE, ["commitlog_offset"])
    cq_key = ["topic", "queue_id", "queue_offset"]
    assert _rows(lake, CONSUME_QUEUE_TABLE, cq_key) == _rows(fresh, CONSUME_QUEUE_TABLE, cq_key)
    ends = sorted(r["to_offset"] for r in scan_arrow(lake, INGEST_RUNS_TABLE).to_pylist())
    assert len(ends) == len(set(ends)) >= 4 and ends[-1] == end  # runs of both kinds, each range once


def test_payload_declarations_are_picked_up_while_the_stream_runs(tmp_path):
    """refresh_payloads (called by every micro-batch): a declarations file installed, changed
    additively or removed while the stream runs is used from the next micro-batch on; an
    incompatible change stops the stream with its message; an explicit file that is missing too."""
    import json as _json

    from pipelines.payloads.errors import PayloadSchemaError
    from pipelines.payloads.reader import payload_outputs
    from pipelines.stream import StreamState, refresh_payloads
    from pipelines.lake import append_arrow

    lake = tmp_path / "lake"
    state = StreamState({}, Location.parse(str(lake)), 1 << 20)
    refresh_payloads(state)
    assert state.payloads is None
    conf = lake / "_rocketlake"
    conf.mkdir(parents=True)

    def declare(props: dict) -> None:
        (conf / "o.json").write_text(_json.dumps({"type": "object", "properties": props}))
        (conf / "payload_schemas.toml").write_text('[topics.O]\nformat = "json"\nschema = "o.json"\n')

    declare({"a": {"type": "integer"}})
    refresh_payloads(state)
    first = state.payloads
    assert first.topic_names == {"O"} and first.get("O").schema.names == ["a"]
    refresh_payloads(state)
    assert state.payloads is first  # unchanged file: not read again
    name, schema, partition_by = payload_outputs(first)[0]
    append_arrow(lake, name, schema.empty_table(), partition_by=partition_by)  # the table exists now
    declare({"a": {"type": "integer"}, "b": {"type": ["string", "null"]}})
    refresh_payloads(state)
    assert state.payloads.get("O").schema.names == ["a", "b"]
    declare({"a": {"type": "string"}})
    with pytest.raises(PayloadSchemaError, match="a"):
        refresh_payloads(state)
    assert state.payloads.get("O").schema.names == ["a", "b"]  # the stream stops; nothing was swapped
    (conf / "payload_schemas.toml").unlink()
    refresh_payloads(state)
    assert state.payloads is None
    with pytest.raises(PayloadSchemaError, match="no payload declarations file"):
        refresh_payloads(StreamState({}, Location.parse(str(lake)), 1 << 20, str(tmp_path / "missing.toml")))
