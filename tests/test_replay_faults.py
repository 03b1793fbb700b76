"""Replay under faults (issue 9): the job SIGKILLed at random moments and rerun with the same run id,
and the target broker killed in the middle of a run and brought back. Either way the target ends up
holding every selected message exactly once, and the ledger says where each one is."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from broker.cli import run_job
from broker.client import Admin, Message, Producer, PullConsumer
from broker.server.launcher import free_port
from pipelines.lake import scan_arrow
from pipelines.replay import ledger
from pipelines.replay.lineage import replay_key
from tests.broker_harness import REPO, drain, start_broker, start_namesrv
from tests.test_replay import ALL_TIME, _wait_routed

TOPIC, TARGET_TOPIC = "Faults", "FaultsReplay"
N = 400
TARGET_CONFIG = {"autoCreateTopicEnable": False}


@pytest.fixture(scope="module")
def source_lake(tmp_path_factory, spark):
    """N messages in TOPIC (4 queues), stored by a real broker and ingested into a lake."""
    tmp = tmp_path_factory.mktemp("replay-faults")
    ns, ns_addr = start_namesrv(tmp)
    src = start_broker(tmp / "src", ns_addr)
    try:
        with Admin(ns_addr) as admin:
            admin.create_topic(src.addr, TOPIC, queues=4)
        _wait_routed(ns_addr, TOPIC)
        with Producer("faults-producer", ns_addr) as producer:
            for i in range(N):
                producer.send(Message(TOPIC, f"fault body {i} ".encode() * 8, tags=f"t{i % 3}",
                                      keys=[f"fk-{i}"], properties={"seq": str(i)}))
    finally:
        src.stop()
        ns.terminate()
        ns.wait(10)
    lake = tmp / "lake"
    assert run_job("ingest_commitlog.py", ["--store", f"broker-a={tmp / 'src'}", "--lake", str(lake)]) == 0
    offsets = sorted(r["commitlog_offset"] for r in scan_arrow(lake, "messages").to_pylist()
                     if r["topic"] == TOPIC)
    assert len(offsets) == N
    return lake, offsets


class Target:
    """A target cluster with TARGET_TOPIC on one broker that a test may kill and restart on its port."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ns, self.namesrv = start_namesrv(tmp)
        self.port = free_port()
        self.broker = start_broker(tmp / "tgt", self.namesrv, TARGET_CONFIG, port=self.port)
        with Admin(self.namesrv) as admin:
            admin.create_topic(self.broker.addr, TARGET_TOPIC, queues=4)
        _wait_routed(self.namesrv, TARGET_TOPIC)

    def restart(self) -> None:
        self.broker = start_broker(self.tmp / "tgt", self.namesrv, TARGET_CONFIG, port=self.port)
        _wait_routed(self.namesrv, TARGET_TOPIC)

    def messages(self) -> list:
        with PullConsumer("faults-check", self.namesrv) as consumer:
            return drain(consumer, TARGET_TOPIC)

    def close(self) -> None:
        self.broker.stop()
        self.ns.terminate()
        self.ns.wait(10)


@pytest.fixture
def target(tmp_path):
    t = Target(tmp_path)
    yield t
    t.close()


def start_job(lake: Path, namesrv: str, log: Path, *args: str) -> subprocess.Popen:
    """``jobs/replay.py`` as spark-submit runs it: its own process group, so SIGKILL takes the JVM
    and the Python workers with it."""
    cmd = [sys.executable, str(REPO / "jobs" / "replay.py"), "--master", "local[2]", "--lake", str(lake),
           "--namesrv", namesrv, *args]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_events(lake: Path, run_id: str, more_than: int, proc: subprocess.Popen, timeout: float = 120) -> int:
    """Wait until the run's ledger holds more than ``more_than`` events (or the job ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        n = ledger.run_events(str(lake), run_id, columns=["event_seq"]).num_rows
        if n > more_than:
            return n
        time.sleep(0.1)
    return -1


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def assert_exactly_once(lake: Path, target: Target, run_id: str, offsets: list[int]) -> None:
    """Every selected message on the target once, and the ledger's SENT rows say where."""
    got = target.messages()
    rkeys = [next(k for k in m.keys if k.startswith("rlr:")) for m in got]
    dupes = {k: c for k, c in Counter(rkeys).items() if c > 1}
    assert not dupes, f"{len(dupes)} message(s) delivered more than once, e.g. {sorted(dupes)[:3]}"
    assert sorted(rkeys) == sorted(replay_key(run_id, "broker-a", o) for o in offsets)
    state = ledger.current_state(ledger.run_events(str(lake), run_id))
    assert state.num_rows == len(offsets) and set(state["status"].to_pylist()) == {"SENT"}
    where = {k: (m.queue_id, m.queue_offset) for k, m in zip(rkeys, got)}
    assert {k: (q, o) for k, q, o in zip(state["replay_key"].to_pylist(), state["target_queue_id"].to_pylist(),
                                         state["target_queue_offset"].to_pylist())} == where


def test_killed_replay_reruns_deliver_every_message_exactly_once(source_lake, target, tmp_path):
    lake, offsets = source_lake
    run_id = "kill-1"
    args = ["--topic", TOPIC, *ALL_TIME, "--target-topic", TARGET_TOPIC, "--run-id", run_id, "--rate", "150"]
    rnd = random.Random(9)
    log = tmp_path / "replay.log"
    seen = 0
    for round_no in range(4):
        proc = start_job(lake, target.namesrv, log, *args)
        if round_no == 0:       # anywhere from start-up through planning and recording
            time.sleep(rnd.uniform(4, 12))
        else:                   # in the middle of sending: after the run's next ledger commit
            seen = max(seen, wait_for_events(lake, run_id, seen, proc))
            time.sleep(rnd.uniform(0.0, 1.5))
        kill(proc)
    final = start_job(lake, target.namesrv, log, *args)
    assert final.wait(300) == 0, log.read_text()[-4000:]
    assert_exactly_once(lake, target, run_id, offsets)
    run = ledger.load_run(str(lake), run_id)
    assert (run.status, run.sent, run.planned, run.unknown, run.failed) == ("SUCCEEDED", N, N, 0, 0)
    assert run.attempts >= 2


def test_target_broker_down_mid_run_then_rerun(source_lake, target, tmp_path):
    lake, offsets = source_lake
    run_id = "down-1"
    args = ["--topic", TOPIC, *ALL_TIME, "--target-topic", TARGET_TOPIC, "--run-id", run_id, "--rate", "150",
            "--send-timeout", "2"]
    log = tmp_path / "replay.log"
    proc = start_job(lake, target.namesrv, log, *args)
    planned = wait_for_events(lake, run_id, 0, proc)            # the plan
    wait_for_events(lake, run_id, planned, proc)                # the batch goes in flight
    time.sleep(1.0)
    target.broker.kill()                                        # kill -9 the whole broker mid-run
    assert proc.wait(300) == 1, log.read_text()[-4000:]         # INCOMPLETE
    text = log.read_text()
    assert "INCOMPLETE" in text and "Traceback" not in text
    state = ledger.current_state(ledger.run_events(str(lake), run_id))
    counts = ledger.status_counts(state)
    assert counts["SENT"] > 0 and counts["SENT"] < N and counts["PLANNED"] == 0
    assert counts["SENT"] + counts["FAILED"] + counts["UNKNOWN"] == N
    assert ledger.load_run(str(lake), run_id).status == "INCOMPLETE"

    # nothing is recorded SENT that the target does not hold
    target.restart()
    held = {next(k for k in m.keys if k.startswith("rlr:")) for m in target.messages()}
    sent = set(ledger.with_status(state, "SENT")["replay_key"].to_pylist())
    assert sent <= held

    rerun = start_job(lake, target.namesrv, log, "--run-id", run_id)
    assert rerun.wait(300) == 0, log.read_text()[-4000:]
    assert_exactly_once(lake, target, run_id, offsets)
