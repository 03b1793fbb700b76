"""The store in the mode the broker runs it: a dispatcher process builds the queues and the index.

Most store tests use the inline mode (dispatched with the put, so a pull right after a put finds it).
The multiprocess broker runs :class:`~broker.engine.dispatch.ExternalDispatch` with the dispatcher
process of :mod:`broker.server.dispatch_process`; these tests drive that same pair in-process:
puts become pullable and findable by key once the process reports progress, topic deletion goes
through the process, and a restart recovers what the process wrote.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from broker.engine import GetStatus, MessageStore, StoreSettings
from broker.engine.dispatch import ExternalDispatch, InlineDispatch
from broker.server.dispatch_process import ExternalDispatcher
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from broker.store.properties import encode_properties

SETTINGS = StoreSettings(segment_bytes=64 * 1024, cq_file_bytes=20 * 50, index_slots=64, index_entries=400,
                         store_host=Host(bytes([127, 0, 0, 1]), 10911), fsync_metadata=False,
                         external_dispatch=True)
DEADLINE_S = 30.0


def _wait_dispatched(store: MessageStore) -> None:
    store.wait_dispatched(DEADLINE_S)


def _put(store: MessageStore, topic: str, n: int, start: int = 0) -> list[int]:
    offsets = []
    for i in range(start, start + n):
        res = store.put_message(MessageRecord(topic=topic, body=f"m{i}".encode(), queue_id=i % 2,
                                              properties_raw=encode_properties({"KEYS": f"k{i}"})))
        assert res.ok
        offsets.append(res.physical_offsets[0])
    return offsets


class _Running:
    """An opened store with its dispatcher process, as the broker's store process has them."""

    def __init__(self, root: Path) -> None:
        self.store = MessageStore(root, SETTINGS)
        self.store.open()
        # spawned: the broker forks (tests/store_harness.py does too), this covers the spawn path
        self.dispatcher = ExternalDispatcher(self.store, logging.WARNING, start_method="spawn")
        self.dispatcher.start()

    def close(self) -> None:
        self.dispatcher.stop()
        self.store.close()


@pytest.fixture()
def running(tmp_path: Path):
    r = _Running(tmp_path / "s")
    yield r
    r.close()


def test_puts_become_pullable_and_findable_through_the_process(running):
    store = running.store
    assert isinstance(store._dispatch, ExternalDispatch)
    phys = _put(store, "T", 30)
    _wait_dispatched(store)
    assert [store.max_offset("T", q) for q in (0, 1)] == [15, 15]
    got = store.get_messages("T", 1, 0, 32, 1 << 20, None)
    assert got.status == GetStatus.FOUND and list(got.physical_offsets) == phys[1::2]
    assert store.query_by_key("T", "k7").physical_offsets == (phys[7],)
    assert store.query_by_key("T", "k7").index_end_offset == phys[-1]


def test_topic_deletion_goes_through_the_process(running):
    store = running.store
    _put(store, "Gone", 10)
    _put(store, "Kept", 10)
    _wait_dispatched(store)
    store.delete_topic_queues("Gone")
    assert not (store.store_dir / "consumequeue" / "Gone").exists()
    assert store.max_offset("Gone", 0) == 0 and store.max_offset("Kept", 0) == 5
    _put(store, "Kept", 4, start=10)
    _wait_dispatched(store)
    assert store.max_offset("Kept", 0) == 7 and not (store.store_dir / "consumequeue" / "Gone").exists()


def test_restart_recovers_what_the_process_wrote(tmp_path: Path):
    root = tmp_path / "s"
    first = _Running(root)
    phys = _put(first.store, "T", 40)
    first.close()
    inline = MessageStore(root, replace(SETTINGS, external_dispatch=False))
    report = inline.open()
    try:
        assert isinstance(inline._dispatch, InlineDispatch)
        assert report.redispatched == 0  # the process had dispatched and synced everything
        assert [inline.max_offset("T", q) for q in (0, 1)] == [20, 20]
        assert inline.query_by_key("T", "k39").physical_offsets == (phys[39],)
    finally:
        inline.close()


def test_wait_dispatched_raises_when_nothing_dispatches(tmp_path: Path):
    """An external store whose dispatcher process was never started: the wait names how far behind
    dispatch is instead of hanging."""
    store = MessageStore(tmp_path / "s", SETTINGS)
    store.open()
    try:
        store.wait_dispatched(0)  # nothing appended: nothing to wait for
        _put(store, "T", 1)
        behind = store.commitlog_max_offset
        with pytest.raises(TimeoutError, match=f"still {behind} bytes behind commitlog offset {behind} after 0.01 s"):
            store.wait_dispatched(0.01)
    finally:
        store.close()


def test_dispatched_end_moves_only_after_the_queues(tmp_path: Path):
    """Progress from the dispatcher process is applied queues first: while a queue grows (its
    listener runs) the store still reports the bytes behind, so whoever saw 0 behind finds every
    unit readable."""
    store = MessageStore(tmp_path / "s", SETTINGS)
    store.open()
    try:
        assert store.put_message(MessageRecord(topic="T", body=b"x", queue_id=0)).ok
        end = store.commitlog_max_offset
        seen: list[tuple[int, int]] = []
        store.add_dispatch_listener(lambda topic, qid, nxt: seen.append((store.dispatch_behind_bytes,
                                                                        store.max_offset(topic, qid))))
        store.external_advance([("T", 0, 1, end)], 0, end)
        assert seen == [(end, 1)]
        assert store.dispatch_behind_bytes == 0
        store.wait_dispatched(0)
    finally:
        store.close()
