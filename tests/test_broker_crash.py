"""Crash test: SIGKILL a SYNC_FLUSH broker at random moments while producers send, restart it, repeat.

Several producer threads send continuously with plain SEND_MESSAGE requests (our own remoting
client, one connection each, no retries: every attempt carries a fresh UNIQ_KEY and KEYS token).
An attempt answered with code 0 is *acknowledged*; everything else (connection closed by the kill,
connection refused while the broker restarts, any other code) is *unacknowledged*. After several
kill/restart rounds and a final clean stop, the store must hold:

* every acknowledged message exactly once, at the queue, queue offset and msgId the broker answered,
  with the body that was sent;
* unacknowledged messages at most once and never torn (intact CRC, the body that was sent);
* no record the producers did not send, and gap-free queue offsets per queue;
* ConsumeQueues and IndexFiles that agree with the CommitLog (``verify_store`` finds nothing), and
  an index that finds every acknowledged message by UNIQ_KEY and by KEYS.

Small files (1 MiB commitlog, 300-unit consume queue files, 4000-entry index files) make the kills
land around file rolls too. The randomness is seeded; the assertions do not depend on timing.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import SendMessageRequestHeader
from broker.remoting.transport import SyncRemotingClient
from broker.store.columnar import DecodeStats, iter_decode
from broker.store.commitlog import CommitLog
from broker.store.constants import ABORT_FILE
from broker.store.index_file import LONG_MAX, IndexService
from broker.store.verify import verify_store
from tests.broker_harness import BrokerHandle, free_port, live_group_pids, start_broker, start_namesrv

SEED = 20240611
SEGMENT = 1024 * 1024
CONFIG = {
    "flushDiskType": "SYNC_FLUSH",
    "mappedFileSizeCommitLog": SEGMENT,
    "mappedFileSizeConsumeQueue": 6000,  # 300 units per file
    "maxHashSlotNum": 1000,
    "maxIndexNum": 4000,
}
TOPICS = ("CrashTopicA", "CrashTopicB")
QUEUES = 4  # defaultTopicQueueNums in our requests
PRODUCERS = 6
KILLS = 5
FIRST_ACK_TIMEOUT_S = 60.0
MIN_ACKS = 3000  # enough for every file kind to roll over (commitlog, consume queue, index)
FINAL_PHASE_TIMEOUT_S = 90.0


# =====================================================================================================
# producer side
# =====================================================================================================
def body_for(uniq: str, size: int) -> bytes:
    """Deterministic body of ``size`` bytes for a message: a torn or mixed-up body cannot match."""
    unit = f"<{uniq}>".encode()
    return (unit * (size // len(unit) + 1))[:size]


@dataclass
class Attempt:
    topic: str
    key: str
    size: int


@dataclass
class Ack:
    queue_id: int
    queue_offset: int
    msg_id: str


@dataclass
class Ledger:
    """What one producer thread tried and what the broker acknowledged (thread-private)."""

    attempts: dict[str, Attempt] = field(default_factory=dict)
    acks: dict[str, Ack] = field(default_factory=dict)
    codes: Counter = field(default_factory=Counter)  # non-zero response codes
    errors: Counter = field(default_factory=Counter)  # transport exceptions by type


class Producer(threading.Thread):
    def __init__(self, index: int, addr: str, stop: threading.Event, seed: int) -> None:
        super().__init__(name=f"crash-producer-{index}", daemon=True)
        self.index = index
        self.addr = addr
        self.stop_event = stop
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.acked = 0  # read by the main thread (monotonic counter; a stale read is harmless)

    def request(self, seq: int) -> tuple[str, RemotingCommand]:
        uniq = f"C0DE{self.index:04X}{seq:024X}"  # 32 hex digits, like a client UNIQ_KEY
        key = f"ck-{self.index}-{seq}"
        topic = self.rng.choice(TOPICS)
        size = self.rng.randint(100, 3000)
        queue_id = self.rng.choice([-1, -1, 0, 1, 2, 3])
        props = f"KEYS\x01{key}\x02TAGS\x01Tag{seq % 3}\x02UNIQ_KEY\x01{uniq}\x02WAIT\x01true\x02"
        header = SendMessageRequestHeader(producer_group="CrashPG", topic=topic, default_topic="TBW102",
                                          default_topic_queue_nums=QUEUES, queue_id=queue_id, sys_flag=0,
                                          born_timestamp=int(time.time() * 1000), flag=0, properties=props,
                                          reconsume_times=0, unit_mode=False, batch=False)
        self.ledger.attempts[uniq] = Attempt(topic, key, size)
        return uniq, RemotingCommand.request(RequestCode.SEND_MESSAGE, header.to_ext(), body_for(uniq, size))

    def run(self) -> None:
        client = SyncRemotingClient(self.addr, connect_timeout=1.0)
        seq = 0
        try:
            while not self.stop_event.is_set():
                seq += 1
                uniq, cmd = self.request(seq)
                try:
                    resp = client.invoke(cmd, timeout=10.0)
                except Exception as exc:  # killed broker: closed/refused/timed out
                    self.ledger.errors[type(exc).__name__] += 1
                    time.sleep(0.02)
                    continue
                if resp.code == ResponseCode.SUCCESS:
                    ext = resp.ext_fields
                    self.ledger.acks[uniq] = Ack(int(ext["queueId"]), int(ext["queueOffset"]), ext["msgId"])
                    self.acked += 1
                else:
                    self.ledger.codes[resp.code] += 1
        finally:
            client.close()


# =====================================================================================================
# process helpers
# =====================================================================================================


def kill_broker(broker: BrokerHandle) -> None:
    """SIGKILL every broker process and wait until all are really gone.

    ``BrokerHandle.kill`` waits for the supervisor only; a network process can still be exiting (and
    its listening socket still accepting) for a moment, which would let the next ``start_broker``
    believe the new broker is up when the old one answered its port probe.
    """
    pgid = broker.proc.pid
    broker.kill()
    deadline = time.monotonic() + 15
    while live_group_pids(pgid):
        if time.monotonic() > deadline:
            for pid in live_group_pids(pgid):
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"broker processes {live_group_pids(pgid)} survived SIGKILL")
        time.sleep(0.01)


def total_acked(producers: list[Producer]) -> int:
    return sum(p.acked for p in producers)


def wait_for_acks(producers: list[Producer], more_than: int, broker: BrokerHandle) -> None:
    deadline = time.monotonic() + FIRST_ACK_TIMEOUT_S
    while total_acked(producers) <= more_than:
        assert broker.proc.poll() is None, f"broker exited with {broker.proc.returncode}; see {broker.log}"
        assert time.monotonic() < deadline, f"no send acknowledged within {FIRST_ACK_TIMEOUT_S} s after start"
        time.sleep(0.01)


# =====================================================================================================
# store readers
# =====================================================================================================
def decode_commitlog(store: Path) -> tuple[dict[str, list], list]:
    """Every record of the commitlog as columns, and every decoder finding."""
    cols = ("commitlog_offset", "uniq_key", "topic", "queue_id", "queue_offset", "offset_msg_id", "body",
            "body_crc_ok", "keys")
    out: dict[str, list] = {c: [] for c in cols}
    findings = []
    log_ = CommitLog.open(store, SEGMENT)
    findings += log_.findings
    for seg in log_.segments:
        stats = DecodeStats()
        for batch in iter_decode(seg.open(), seg.base, log_.segment_size, file_name=str(seg.path), stats=stats):
            for c in cols:
                out[c] += batch.column(c).to_pylist()
        findings += stats.findings
    return out, findings


# =====================================================================================================
# the test
# =====================================================================================================
@pytest.fixture()
def namesrv(tmp_path: Path):
    proc, addr = start_namesrv(tmp_path)
    yield addr
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except Exception:
        proc.kill()


def test_sigkill_rounds_lose_nothing_acknowledged(tmp_path: Path, namesrv: str) -> None:
    rng = random.Random(SEED)
    store = tmp_path / "store"
    port = free_port()
    broker = start_broker(store, namesrv, CONFIG, port=port)
    stop = threading.Event()
    producers = [Producer(i, broker.addr, stop, SEED + i) for i in range(PRODUCERS)]
    started = time.monotonic()
    round_acks = []
    try:
        for p in producers:
            p.start()
        for _ in range(KILLS):
            before = total_acked(producers)
            wait_for_acks(producers, before, broker)  # the (re)started broker really serves
            time.sleep(rng.uniform(0.3, 2.0))
            kill_broker(broker)
            round_acks.append(total_acked(producers) - before)
            assert (store / ABORT_FILE).exists(), "a killed broker must leave the abort marker behind"
            broker = start_broker(store, namesrv, CONFIG, port=port)
        before = total_acked(producers)
        wait_for_acks(producers, before, broker)
        time.sleep(1.0)
        deadline = time.monotonic() + FINAL_PHASE_TIMEOUT_S
        while total_acked(producers) < MIN_ACKS and time.monotonic() < deadline:
            time.sleep(0.05)  # slow machine: keep sending until the files must have rolled
    finally:
        stop.set()
        for p in producers:
            p.join(30)
        code = broker.stop()
    elapsed = time.monotonic() - started
    assert code == 0, f"clean stop exited with {code}; see {broker.log}"
    assert not (store / ABORT_FILE).exists(), "a clean stop must remove the abort marker"

    # ---- the restart log: one normal start, then one abnormal recovery per kill ----------------------
    log_text = broker.log.read_text(errors="replace")
    assert log_text.count("store opened: abnormal recovery") == KILLS, log_text[-3000:]
    assert log_text.count("store opened: normal recovery") == 1
    assert log_text.count("store closed cleanly") == 1

    # ---- merge what the producers saw ------------------------------------------------------------------
    attempts: dict[str, Attempt] = {}
    acks: dict[str, Ack] = {}
    codes, errors = Counter(), Counter()
    for p in producers:
        assert not p.is_alive()
        attempts.update(p.ledger.attempts)
        acks.update(p.ledger.acks)
        codes.update(p.ledger.codes)
        errors.update(p.ledger.errors)
    assert len(acks) >= MIN_ACKS, f"too few acknowledged sends to mean anything: {len(acks)}"
    # a slow disk may answer FLUSH_DISK_TIMEOUT (stored, not confirmed); a stopping broker SERVICE_NOT_AVAILABLE
    allowed = {ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.SYSTEM_BUSY}
    assert set(codes) <= allowed, f"unexpected response codes {codes}"

    # ---- the commitlog: every acknowledged message exactly once, nothing twice or torn -----------------
    recs, findings = decode_commitlog(store)
    assert not findings, [str(f) for f in findings[:10]]
    counts = Counter(recs["uniq_key"])
    unknown = [k for k in counts if k not in attempts]
    assert not unknown, f"records nobody sent: {unknown[:5]}"
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"messages stored more than once: {list(twice.items())[:5]}"
    missing = [k for k in acks if counts.get(k, 0) != 1]
    assert not missing, f"{len(missing)} acknowledged messages are not in the commitlog, e.g. {missing[:5]}"
    row_of = {k: i for i, k in enumerate(recs["uniq_key"])}
    for uniq, i in row_of.items():
        a = attempts[uniq]
        assert recs["body_crc_ok"][i], uniq
        assert recs["topic"][i] == a.topic, uniq
        assert recs["body"][i] == body_for(uniq, a.size), f"{uniq}: body differs from what was sent"
        assert recs["keys"][i] == [a.key], uniq
    for uniq, ack in acks.items():
        i = row_of[uniq]
        got = (recs["queue_id"][i], recs["queue_offset"][i], recs["offset_msg_id"][i])
        assert got == (ack.queue_id, ack.queue_offset, ack.msg_id), f"{uniq}: stored {got}, acknowledged {ack}"

    # gap-free queue offsets: the recovered counters continued exactly where the queues ended
    per_queue: dict[tuple[str, int], list[int]] = {}
    for topic, qid, qoff in zip(recs["topic"], recs["queue_id"], recs["queue_offset"]):
        per_queue.setdefault((topic, qid), []).append(qoff)
    for q, offsets in per_queue.items():
        assert sorted(offsets) == list(range(len(offsets))), f"queue {q} offsets have gaps or repeats"

    # ---- ConsumeQueues and IndexFiles agree with the CommitLog ------------------------------------------
    report = verify_store(store, segment_size=SEGMENT)
    assert report.ok, report.summary() + "\n" + "\n".join(str(f) for f in report.findings[:20])
    assert report.records == len(recs["uniq_key"])
    assert report.cq_units == len(recs["uniq_key"])
    assert report.segments >= 2, "the commitlog should have rolled over at least once"
    assert report.index_files >= 2, "the index should have rolled over at least once"
    cq_files = [len(list(d.iterdir())) for d in (store / "consumequeue").glob("*/*")]
    assert max(cq_files) >= 2, "some consume queue should have rolled over"

    commitlog = CommitLog.open(store, SEGMENT)
    with IndexService(store) as index:
        for uniq, ack in acks.items():
            a = attempts[uniq]
            phy = recs["commitlog_offset"][row_of[uniq]]
            assert index.query(a.topic, uniq, 0, LONG_MAX, commitlog) == [phy], f"index misses UNIQ_KEY {uniq}"
            assert index.query(a.topic, a.key, 0, LONG_MAX, commitlog) == [phy], f"index misses KEYS {a.key}"

    print(f"\ncrash test: {KILLS} kills in {elapsed:.1f} s; {len(attempts)} sends, {len(acks)} acknowledged "
          f"(per round {round_acks}), {len(counts) - len(acks)} unacknowledged but stored, "
          f"errors {dict(errors)}, codes {dict(codes)}; {report.summary()}")
