"""A store opened the way the broker's store process opens it, for store-level and handler tests.

``store_process_main`` (broker/server/broker.py) opens the :class:`MessageStore` with external
dispatch, starts an :class:`~broker.server.dispatch_process.ExternalDispatcher` (the dispatcher
process that writes the consume queues and the index), and on shutdown stops the dispatcher before
it closes the store. :class:`DispatchedStore` is that lifecycle in one object, so a test opens,
uses and closes it like a plain store. Its puts become pullable and findable by key only once the
dispatcher process reported them, as in the broker: a test that reads queues right after a put
calls :meth:`DispatchedStore.caught_up` first.

The dispatcher process is forked, as the broker's store process forks it: the test process has
already imported and JIT-compiled what the process runs, so a fork costs milliseconds where a spawn
costs a second, which is what lets every test have its own store and dispatcher. The spawn path
(taken when the starting process runs other threads) is covered by tests/test_external_dispatch.py.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Callable

from broker.server.dispatch_process import ExternalDispatcher
from broker.store.columnar import decode_range
from broker.store.commitlog import CommitLog
from broker.engine.message_store import MessageStore
from broker.engine.store_settings import StoreSettings

DISPATCH_TIMEOUT_S = 30.0  # far beyond any test's dispatch: reaching it means the process is stuck or gone
START_METHOD = "fork"

log = logging.getLogger(__name__)
_running: set["DispatchedStore"] = set()  # open ones: the dispatcher process of each is running


class DispatchedStore(MessageStore):
    """A :class:`MessageStore` in external dispatch mode with its dispatcher process running while it
    is open: started after ``open`` (recovery), stopped before ``close`` (everything appended is
    then dispatched and synced), killed by ``abandon`` (as the kernel kills it with the store
    process)."""

    def __init__(self, store_dir: str | os.PathLike, config: StoreSettings | None = None, *,
                 clock: Callable[[], int] | None = None) -> None:
        super().__init__(store_dir, replace(config or StoreSettings(), external_dispatch=True), clock=clock)
        self.dispatch_process: ExternalDispatcher | None = None

    def open(self):
        report = super().open()
        try:
            self.dispatch_process = ExternalDispatcher(self, logging.WARNING, start_method=START_METHOD)
            self.dispatch_process.start()
        except BaseException:
            self.dispatch_process = None
            super().close()
            raise
        _running.add(self)
        return report

    def caught_up(self) -> None:
        """Wait until the queues and the index hold everything put so far (what a reader of the
        running broker sees once the dispatcher got there)."""
        self.wait_dispatched(DISPATCH_TIMEOUT_S)

    def close(self) -> None:
        _running.discard(self)
        if self.dispatch_process is not None:
            self.dispatch_process.stop()
            self.dispatch_process = None
        super().close()

    def abandon(self) -> None:
        _running.discard(self)
        if self.dispatch_process is not None:
            process = self.dispatch_process.process
            process.kill()
            process.join()
            self.dispatch_process = None
        super().abandon()


def open_stores() -> frozenset[DispatchedStore]:
    """The stores open now (their dispatcher processes running)."""
    return frozenset(_running)


def close_left_open(before: frozenset[DispatchedStore] = frozenset()) -> list[str]:
    """Close the stores opened since ``before`` that are still open (a test failed before its
    ``close``); returns their directories. Why: the dispatcher process is not a daemon (as in the
    broker), so one left running would keep pytest from exiting. Stores open in ``before`` (a
    module-scoped fixture's) are left alone."""
    left = sorted(_running - before, key=lambda st: str(st.store_dir))
    for st in left:
        try:
            st.close()
        except Exception:
            log.exception("closing %s, left open by a test, failed", st.store_dir)
            st.abandon()
    return [str(st.store_dir) for st in left]


def decoded_rows(store: str | os.PathLike, columns: list[str] | None = None) -> list[dict]:
    """Every record of ``store``'s commitlog as the bulk decoder's rows (``columns`` of them, or all),
    checking that the walk found nothing wrong: the expected values tests compare against."""
    log = CommitLog.open(store)
    out: list[dict] = []
    for seg in log.segments:
        table, stats = decode_range(seg.open(), seg.base, log.segment_size, file_name=str(seg.path))
        assert stats.findings == []
        out += (table.select(columns) if columns else table).to_pylist()
    return out
