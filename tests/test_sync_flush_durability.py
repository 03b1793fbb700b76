"""SYNC_FLUSH acknowledges a put only once its bytes are durable — proven per put, not at the end.

A SIGKILL keeps the page cache, and "the flushed offset equals the end after all threads joined"
also holds for ASYNC_FLUSH, so neither can tell an early acknowledgement from a real one. Here the
test watches the system calls themselves: :class:`DurabilityProbe` wraps ``os.pwrite`` and
``os.fsync``/``os.fdatasync``/``os.sync`` and records, per commitlog file, how far the bytes
written *before* a sync call began are durable once it returned. At the moment each put (or each
send of the broker's request layer) returns, every one of its records must lie inside that durable
prefix and the bytes there must be the record. Two negative controls keep the check honest: an
ASYNC_FLUSH store and a store whose flush acknowledges before its fsync ran both fail it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.headers import SendMessageRequestHeader
from broker.server.broker import store_settings
from broker.engine.message_store import MessageStore, PutResult, PutStatus
from broker.server.metadata import BrokerMetadata
from broker.engine.store_settings import StoreSettings
from broker.store.constants import ASYNC_FLUSH, SYNC_FLUSH
from broker.server.processors import BrokerCore, Request
from broker.server.settings import BrokerSettings
from broker.store.batch import BatchItem, encode_batch
from broker.store.commitlog import offset_to_file_name
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from broker.store.message_id import decode_offset_msg_id
from broker.store.properties import encode_properties

SEGMENT = 64 * 1024  # small files: the puts below roll over several of them
BORN = Host(bytes([192, 168, 1, 20]), 40001)
WAIT_S = 30.0  # deadline of condition waits (a loaded 2-core machine), never a sleep


@dataclass(frozen=True)
class Violation:
    what: str
    offset: int
    end_in_file: int
    durable_in_file: int


class DurabilityProbe:
    """Which commitlog bytes a sync call has made durable, from the system calls the process makes.

    Model: ``fsync(fd)`` (or ``fdatasync``) makes durable every byte of that file written before the
    call began; ``os.sync()`` does so for every file. Files are identified by path (the store opens a
    segment once to write and once to read and syncs either descriptor). Nothing of the store's own
    bookkeeping (``_flushed_offset``) is trusted. ``gate`` holds every commitlog sync before it
    reaches the disk, so a test can look at the store while a flush is in flight."""

    def __init__(self, commitlog_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dir = str(commitlog_dir.resolve())
        self.written: dict[str, int] = {}  # file → end of the bytes pwritten so far
        self.durable: dict[str, int] = {}  # file → end of the bytes a finished sync covered
        self.syncs = 0  # commitlog sync calls that finished
        self.syncs_started = 0
        self.gate = threading.Event()
        self.gate.set()
        self._lock = threading.Lock()
        real_pwrite, real_fsync, real_fdatasync, real_sync = os.pwrite, os.fsync, os.fdatasync, os.sync

        def pwrite(fd, data, offset):
            n = real_pwrite(fd, data, offset)
            path = self._commitlog_path(fd)
            if path is not None:
                with self._lock:
                    self.written[path] = max(self.written.get(path, 0), offset + n)
            return n

        def file_sync(real):
            def sync(fd):
                path = self._commitlog_path(fd if isinstance(fd, int) else fd.fileno())
                if path is None:
                    return real(fd)
                with self._lock:
                    covered = self.written.get(path, 0)  # what was written before this call began
                    self.syncs_started += 1
                self.gate.wait()
                real(fd)
                with self._lock:
                    self.durable[path] = max(self.durable.get(path, 0), covered)
                    self.syncs += 1
            return sync

        def sync_all():
            with self._lock:
                covered = dict(self.written)
            real_sync()
            with self._lock:
                for path, end in covered.items():
                    self.durable[path] = max(self.durable.get(path, 0), end)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fsync", file_sync(real_fsync))
        monkeypatch.setattr(os, "fdatasync", file_sync(real_fdatasync))
        monkeypatch.setattr(os, "sync", sync_all)

    def _commitlog_path(self, fd: int) -> str | None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        return path if os.path.dirname(path) == self.dir else None

    def violations(self, records: list[tuple[int, int]], what: str) -> list[Violation]:
        """``(physical offset, size)`` records (one entry each) not inside their file's durable
        prefix, or behind an earlier file that is not durable to its end (its closing BLANK: recovery
        stops at a file that ends in zeros and would drop the later files). The bytes at a durable
        record must be a record of that size: the acknowledged offsets must be real."""
        out = []
        with self._lock:
            durable, written = dict(self.durable), dict(self.written)
        for offset, size in records:
            base = offset - offset % SEGMENT
            path = os.path.join(self.dir, offset_to_file_name(base))
            end = offset - base + size
            earlier = [p for p in written if int(os.path.basename(p)) < base and durable.get(p, 0) < written[p]]
            if durable.get(path, 0) < end or earlier:
                out.append(Violation(what, offset, end, durable.get(path, 0)))
                continue
            with open(path, "rb") as fh:
                fh.seek(offset - base)
                assert int.from_bytes(fh.read(4), "big") == size, f"{what}: no {size}-byte record at {offset}"
        return out


def _records(result: PutResult) -> list[tuple[int, int]]:
    assert result.status is PutStatus.PUT_OK, result.status
    return [(r.physical_offset, r.total_size) for r in result.records]


def _msg(body: bytes, queue_id: int = 0, **props: str) -> MessageRecord:
    return MessageRecord(topic="DurableTopic", body=body, properties_raw=encode_properties(props), queue_id=queue_id,
                         flag=0, sys_flag=0, born_timestamp=1_790_000_000_000, born_host=BORN)


def _open_store(root: Path, flush: str, monkeypatch: pytest.MonkeyPatch, **kw) -> tuple[MessageStore, DurabilityProbe]:
    s = StoreSettings(segment_bytes=SEGMENT, cq_file_bytes=20 * 64, index_slots=64, index_entries=1024,
                      message_delay_level="1s", fsync_metadata=False, flush_disk_type=flush, **kw)
    store = MessageStore(root, s)
    store.open()
    return store, DurabilityProbe(root / "commitlog", monkeypatch)


def _checked_putters(store: MessageStore, probe: DurabilityProbe, n_threads: int, rounds: int) -> tuple[list, int]:
    """Threads putting singles, 4.x batches and multi-put groups (``put_many``, as the broker hands
    over sends that arrived together); each put is checked the moment it returns."""
    violations: list[Violation] = []
    puts = 0
    lock = threading.Lock()
    errors: list[BaseException] = []

    def putter(n: int) -> None:
        nonlocal puts
        try:
            for i in range(rounds):
                body = f"{n}-{i}-".encode() * (1 + (n * 7 + i) % 60)  # sizes vary: files roll mid-run
                kind = i % 3
                if kind == 0:
                    results = [store.put_message(_msg(body, n % 4, KEYS=f"k{n}-{i}"))]
                elif kind == 1:
                    results = [store.put_messages([_msg(body + bytes([j]), n % 4) for j in range(3)])]
                else:
                    results = store.put_many([([_msg(body, q)], False, True) for q in range(3)])
                found = [v for r in results for v in probe.violations(_records(r), f"put {n}-{i}")]
                with lock:
                    violations.extend(found)
                    puts += len(results)
        except BaseException as exc:  # surfaced by the caller
            errors.append(exc)

    threads = [threading.Thread(target=putter, args=(n,)) for n in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return violations, puts


def test_every_sync_flush_put_is_durable_when_it_returns(tmp_path, monkeypatch):
    store, probe = _open_store(tmp_path / "s", SYNC_FLUSH, monkeypatch)
    try:
        violations, puts = _checked_putters(store, probe, n_threads=6, rounds=30)
        assert violations == []
        assert puts == 6 * (10 + 10 + 10 * 3)
        assert len(probe.durable) >= 2  # the puts rolled over to a second commitlog file
        assert probe.syncs >= 1
    finally:
        store.close()


def test_group_commit_waits_for_the_sync_that_covers_it(tmp_path, monkeypatch):
    """Put A's fsync is held at the gate; B and C append meanwhile. Neither may return while that
    sync is in flight (it began before their bytes were written), and once it is released one more
    sync covers both of them: group commit, and still every put durable when it returns."""
    store, probe = _open_store(tmp_path / "s", SYNC_FLUSH, monkeypatch)
    try:
        store.put_message(_msg(b"warm-up"))  # the first sync also covers the tail file of open()
        probe.gate.clear()
        returned: dict[str, list[Violation]] = {}
        lock = threading.Lock()

        def put(name: str) -> None:
            result = store.put_message(_msg(name.encode() * 100))
            found = probe.violations(_records(result), name)
            with lock:
                returned[name] = found

        syncs_before, started_before = probe.syncs, probe.syncs_started
        a = threading.Thread(target=put, args=("A",))
        a.start()
        deadline = time.monotonic() + WAIT_S
        while probe.syncs_started == started_before and time.monotonic() < deadline:
            a.join(0.01)  # until A's sync is at the gate
        assert probe.syncs_started == started_before + 1
        others = [threading.Thread(target=put, args=(name,)) for name in ("B", "C")]
        for t in others:
            t.start()
        deadline = time.monotonic() + WAIT_S
        while store.max_offset("DurableTopic", 0) < 4 and time.monotonic() < deadline:
            others[0].join(0.01)  # until B and C are appended (and dispatched): both wait for a sync now
        assert store.max_offset("DurableTopic", 0) == 4
        assert returned == {}  # nobody answered while the only sync in flight is held
        probe.gate.set()
        for t in [a, *others]:
            t.join(WAIT_S)
        assert returned == {"A": [], "B": [], "C": []}
        assert probe.syncs == syncs_before + 2  # A's sync, then one shared by B and C
    finally:
        probe.gate.set()
        store.close()


# ---- negative controls: the check is not vacuous ------------------------------------------------------------
def test_async_flush_fails_the_check(tmp_path, monkeypatch):
    """ASYNC_FLUSH answers before any fsync: every record of every put must be reported."""
    store, probe = _open_store(tmp_path / "s", ASYNC_FLUSH, monkeypatch, flush_interval_ms=600_000)
    try:
        violations, puts = _checked_putters(store, probe, n_threads=3, rounds=6)
        assert puts == 3 * (2 + 2 + 2 * 3)
        assert len(violations) == 3 * (2 * 1 + 2 * 3 + 2 * 3)  # singles, batches of 3, groups of 3
        assert probe.syncs == 0
    finally:
        store.close()


def test_flush_that_acknowledges_before_its_fsync_fails_the_check(tmp_path, monkeypatch):
    """A SYNC_FLUSH store whose flush starts the fsync but returns without waiting for it (the bug
    the per-put check exists for) is caught on every put, while the real fsyncs still land later."""
    real_sync_to = MessageStore._sync_to
    pending: list[threading.Thread] = []

    def early(self, offset):
        t = threading.Thread(target=real_sync_to, args=(self, offset))
        t.start()
        pending.append(t)
        return True

    store, probe = _open_store(tmp_path / "s", SYNC_FLUSH, monkeypatch)
    monkeypatch.setattr(MessageStore, "_sync_to", early)
    probe.gate.clear()
    try:
        results = [store.put_message(_msg(f"early-{i}".encode())) for i in range(5)]
        assert [len(probe.violations(_records(r), "early")) for r in results] == [1] * 5
        probe.gate.set()
        for t in pending:
            t.join(WAIT_S)
        assert [probe.violations(_records(r), "later") for r in results] == [[]] * 5
    finally:
        probe.gate.set()
        store.close()


# ---- the broker's request layer (what the store process runs for SEND_MESSAGE*) ----------------------------
def _send_request(i: int, batch: bool) -> Request:
    header = SendMessageRequestHeader(producer_group="DurablePG", topic="DurableSends", default_topic="TBW102",
                                      default_topic_queue_nums=4, queue_id=i % 4, sys_flag=0,
                                      born_timestamp=1_790_000_000_000, flag=0,
                                      properties=None if batch else encode_properties({"KEYS": f"s{i}"}),
                                      reconsume_times=0, unit_mode=False, batch=batch)
    if batch:
        body = encode_batch([BatchItem(f"batch-{i}-{j}".encode() * 40) for j in range(4)])
        return Request(RequestCode.SEND_BATCH_MESSAGE, header.to_ext(v2=True), body, channel=("t", i),
                       peer="127.0.0.1:40001")
    return Request(RequestCode.SEND_MESSAGE_V2, header.to_ext(v2=True), f"send-{i}".encode() * (10 + i % 50),
                   channel=("t", i), peer="127.0.0.1:40001")


@pytest.mark.parametrize("flush", [SYNC_FLUSH, ASYNC_FLUSH])
def test_broker_send_replies_only_after_the_fsync(tmp_path, monkeypatch, flush):
    """``BrokerCore.send_messages`` with the store settings the broker's store process derives
    from its config (``store_settings``): under SYNC_FLUSH no reply is produced before its records
    are durable, singles and batches, several sends per call and several calling threads (the IPC
    server's send lane); the same run under ASYNC_FLUSH reports every reply (negative control)."""
    settings = BrokerSettings(flush_disk_type=flush, flush_interval_commit_log=600_000,
                              mapped_file_size_commit_log=SEGMENT, mapped_file_size_consume_queue=20 * 64,
                              max_hash_slot_num=64, max_index_num=1024, message_delay_level="1s")
    root = tmp_path / "s"
    store = MessageStore(root, store_settings(settings))
    store.open()
    probe = DurabilityProbe(root / "commitlog", monkeypatch)
    core = BrokerCore(store, BrokerMetadata(store), cluster_name="DefaultCluster", broker_name="broker-a",
                      broker_addr=settings.broker_addr, max_message_size=settings.max_message_size)
    reported: list[int] = []
    records = 0
    lock = threading.Lock()
    errors: list[BaseException] = []

    def sender(n: int) -> None:
        nonlocal records
        try:
            for i in range(8):
                reqs = [_send_request(n * 100 + i * 3 + k, batch=k == 2) for k in range(3)]
                replies = core.send_messages(reqs)
                for reply in replies:
                    assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
                    located = []
                    for msg_id in reply.ext["msgId"].split(","):
                        offset = decode_offset_msg_id(msg_id).physical_offset
                        with open(root / "commitlog" / offset_to_file_name(offset - offset % SEGMENT), "rb") as fh:
                            fh.seek(offset % SEGMENT)
                            located.append((offset, int.from_bytes(fh.read(4), "big")))
                    bad = probe.violations(located, reply.ext["msgId"])
                    with lock:
                        reported.append(len(bad))
                        records += len(located)
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert len(reported) == 4 * 8 * 3 and records == 4 * 8 * (2 + 4)
        if flush == SYNC_FLUSH:
            assert sum(reported) == 0
            assert len(probe.durable) >= 2  # the sends rolled over commitlog files
        else:
            assert sum(reported) == records and probe.syncs == 0
    finally:
        core.metadata.close()
        store.close()
