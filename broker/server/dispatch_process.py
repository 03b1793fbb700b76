"""The dispatcher process: ConsumeQueue and IndexFile built from the CommitLog (Apache's ReputMessageService).

The store process appends and publishes its committed end (a shared integer) and wakes this process;
this process reads the new records back from the commitlog files, writes consume-queue units and
index entries, fsyncs them periodically, and reports which queues grew so the store process can serve
them (and wake long-polling pulls). Dispatch is idempotent, so a crash anywhere is repaired by the
next start's recovery.

Deleting a topic's consume queues (DELETE_TOPIC_IN_BROKER) is a command to this process, because it
holds the queue files open and appends to them: it runs between two dispatch batches (so no unit is
half written), closes the topic's files, removes its directory, remembers the fence below which the
topic's records are not queued again, and acknowledges; the store process waits for that answer.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import select
import threading
import time
from pathlib import Path

from broker.engine.dispatch import Dispatcher, QueueRegistry
from broker.server.linux_process import die_with_parent, exit_without_teardown, set_process_name
from broker.engine.message_store import MessageStore
from broker.engine.store_settings import StoreSettings
from broker.store.commitlog import CommitLog

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 1.0
IDLE_WAIT_S = 0.05
# At least this long between two dispatch passes, as Apache's ReputMessageService sleeps 1 ms
# between its passes: what is appended meanwhile is dispatched (and reported) together. Under a
# moderate load a pass per append would cost this process, and the store process that reads its
# reports, a wake-up per message on cores the senders need.
PASS_INTERVAL_S = 0.001
DELETE_TOPIC_TIMEOUT_S = 30.0
DELETED = "topic-deleted"  # acknowledgement marker on the progress pipe: (DELETED, token, error or None)
# control words shared with the store process (one RawArray): stop asked, topic deletions queued so far
STOP, COMMANDS = 0, 1
COMMAND_GET_TIMEOUT_S = 1.0  # a counted command is on its way through the queue's feeder thread


class Waker:
    """The store process's wake-up of the dispatcher: one byte written to a non-blocking pipe.

    Why not an ``mp.Event``: ``set`` takes the event's lock and notifies its condition (several
    semaphore operations, ~10 µs of Python), and ran once per stored batch; ``write`` is one
    syscall, and a full pipe (the dispatcher already has bytes to read) needs nothing more."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)

    def __call__(self) -> None:
        try:
            os.write(self.fd, b"\0")
        except BlockingIOError:
            pass  # full: the dispatcher has not read the earlier wake-ups yet


def _no_wake() -> None:
    """The wake-up of a stopped dispatcher: nothing to wake."""


class WakeWaiter:
    """The dispatcher's side of :class:`Waker`: wait up to a timeout for a wake-up, then drain."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def wait(self, timeout_s: float) -> None:
        if self._poll.poll(int(timeout_s * 1000)):
            try:
                os.read(self.fd, 65536)
            except BlockingIOError:
                pass


def _report(out, item: object) -> None:
    """One message on the progress pipe: plain pickle (its items are tuples of str and int; the
    ForkingPickler that ``Connection.send`` builds per call is for handles, which never go here)."""
    out.send_bytes(pickle.dumps(item, pickle.HIGHEST_PROTOCOL))


def _run_commands(commands, dispatcher: Dispatcher, out, count: int) -> int:
    """Run ``count`` topic deletions, ``(topic, fence, token)`` each, answered on ``out`` with
    ``(DELETED, token, None)`` or the error text; returns how many it got (the rest, not yet
    through the queue, are run by a later pass)."""
    done = 0
    while done < count:
        try:
            topic, fence, token = commands.get(timeout=COMMAND_GET_TIMEOUT_S)
        except queue_mod.Empty:
            return done
        done += 1
        try:
            dispatcher.drop_topic(topic, fence)
            error = None
        except Exception as exc:  # answer it: the store process must not wait for ever
            log.exception("deleting the consume queues of %s failed", topic)
            error = f"{type(exc).__name__}: {exc}"
        _report(out, (DELETED, token, error))
    return done


def dispatcher_main(store_dir: str, settings: StoreSettings, start_offset: int, committed, wake, control,
                    out, log_level: int, parent_pid: int, commands=None) -> None:
    """The process's loop. ``wake`` is the read end of the wake-up pipe (a Connection), ``control``
    the shared words indexed by STOP and COMMANDS, ``out`` the write end of the progress pipe:
    progress reports, deletion acknowledgements and a final None."""
    # force: a forked dispatcher inherits the store process's handler, which would label its lines [store]
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s [dispatch] %(name)s: %(message)s",
                        force=True)
    # a dispatcher outliving a killed store process would go on writing consume-queue and index
    # files under the next broker's recovery, and its last sync would write index headers from its
    # stale memory over what recovery repaired (the loop below also polls the parent)
    die_with_parent(parent_pid)
    set_process_name("rl-dispatch")
    store_path = Path(store_dir)
    registry = QueueRegistry(store_path, settings.cq_file_bytes)
    dispatcher = Dispatcher(store_path, settings, registry)
    dispatcher.next_offset = start_offset
    grown: dict[tuple[str, int], int] = {}
    dispatcher.add_listener(lambda topic, qid, nxt: grown.__setitem__((topic, qid), nxt))
    last_sync = time.monotonic()
    commitlog: CommitLog | None = None  # listed again only when the committed end passes its last file
    waiter = WakeWaiter(wake.fileno())
    commands_done = 0
    log.info("dispatching %s from commitlog offset %d", store_dir, start_offset)
    try:
        while True:
            waiter.wait(IDLE_WAIT_S)
            if os.getppid() != parent_pid:
                log.error("the store process %d is gone; exiting without writing anything more", parent_pid)
                os._exit(1)
            if commands is not None and control[COMMANDS] != commands_done:
                commands_done += _run_commands(commands, dispatcher, out, control[COMMANDS] - commands_done)
            end = committed.value
            if end > dispatcher.next_offset:
                if commitlog is None or not commitlog.segments or \
                        end > commitlog.segments[-1].base + settings.segment_bytes:
                    if commitlog is not None:
                        commitlog.close()
                    commitlog = CommitLog.open(store_path, settings.segment_bytes)  # a new file was rolled
                # a slave's log may start at its master's newest file, past where an empty log began
                dispatcher.catch_up(max(dispatcher.next_offset, commitlog.min_offset), end, commitlog)
                dispatcher.next_offset = max(dispatcher.next_offset, end)
                report = [(t, q, nxt, registry.get(t, q).max_phy_end) for (t, q), nxt in grown.items()]
                grown.clear()
                _report(out, (report, dispatcher.last_store_timestamp, dispatcher.next_offset))
                time.sleep(PASS_INTERVAL_S)
            if time.monotonic() - last_sync >= SYNC_INTERVAL_S:
                dispatcher.sync()
                last_sync = time.monotonic()
            if control[STOP] and dispatcher.next_offset >= committed.value:
                break
    finally:
        dispatcher.sync()
        dispatcher.close()
        _report(out, None)  # done: everything up to the committed end is dispatched and synced
        log.info("dispatcher stopped at commitlog offset %d", dispatcher.next_offset)
    exit_without_teardown()


def default_start_method() -> str:
    """How the dispatcher process is started when the caller does not say: ``fork`` while this
    process runs a single thread, ``spawn`` otherwise.

    Why fork: the store process has imported everything the dispatcher runs (numba and its cached
    kernels included) before it starts the dispatcher, so a forked dispatcher is ready at once where a
    spawned one imports and loads all of it again: 2.4-3.8 s of CPU per broker start, measured, on
    the cores the starting network processes need. The store process starts its dispatcher right
    after recovery, before any thread of its own. A fork copies only the calling thread (a lock held
    by another thread would stay locked in the child), hence spawn whenever other threads run. The
    store's ``lock`` is a POSIX record lock, which a forked child does not hold."""
    return "fork" if threading.active_count() == 1 else "spawn"


class ExternalDispatcher:
    """Store-process side: starts the dispatcher process and feeds its progress into the store.

    ``start_method``: :func:`default_start_method` unless given (tests fork from their
    multi-threaded process on purpose: it already imported and compiled everything the dispatcher
    runs); the dispatcher's code is the same either way."""

    def __init__(self, store: MessageStore, log_level: int, start_method: str | None = None) -> None:
        self.start_method = start_method or default_start_method()
        ctx = mp.get_context(self.start_method)
        self.store = store
        start = store.dispatched_offset
        self._committed = ctx.Value("q", start, lock=False)
        # wake-ups and progress go through plain pipes: an mp.Event's set and an mp.Queue's put/get
        # (a feeder thread, locks) cost both processes more per pass than the pass's report itself
        wake_r, wake_w = ctx.Pipe(duplex=False)
        self._wake = Waker(wake_w.fileno())
        self._wake_conn = wake_w  # keeps the fd open
        self._control = ctx.RawArray("q", 2)
        self._out, out_w = ctx.Pipe(duplex=False)
        self._out_poll = select.poll()
        self._out_poll.register(self._out.fileno(), select.POLLIN)
        self._commands = ctx.Queue()
        self.process = ctx.Process(target=dispatcher_main, name="rocketlake-dispatch",
                                   args=(str(store.store_dir), store.settings, start, self._committed,
                                         wake_r, self._control, out_w, log_level, os.getpid(),
                                         self._commands),
                                   daemon=False)
        self._child_ends = [wake_r, out_w]  # the child's copies; ours close once it started
        self._reader = threading.Thread(target=self._read, name="dispatch-progress", daemon=True)
        self._done = threading.Event()
        self._lock = threading.Lock()  # puts finish on many threads: the published end never goes back
        self._acks: dict[int, list] = {}  # token -> [threading.Event, error text or None]
        self._next_token = 0

    def start(self) -> None:
        self.process.start()
        log.info("dispatcher process %d started (%s)", self.process.pid, self.start_method)
        for conn in self._child_ends:  # so the progress pipe reads EOF when the process is gone
            conn.close()
        self._child_ends = []
        self._reader.start()
        self.store.set_commit_listener(self.committed)
        self.store.set_topic_deleter(self.delete_topic)

    def delete_topic(self, topic: str, fence: int, timeout: float = DELETE_TOPIC_TIMEOUT_S) -> None:
        """Have the dispatcher process remove ``topic``'s consume queues; returns once it did.
        Raises RuntimeError when it failed, did not answer in time or is not running."""
        with self._lock:
            self._next_token += 1
            token = self._next_token
            ack = self._acks[token] = [threading.Event(), None]
        try:
            if self._done.is_set() or not self.process.is_alive():
                raise RuntimeError("the dispatcher process is not running")
            with self._lock:
                self._commands.put((topic, fence, token))
                self._control[COMMANDS] += 1
            self._wake()
            if not ack[0].wait(timeout):
                raise RuntimeError(f"the dispatcher process did not delete the queues of {topic} "
                                   f"within {timeout:g} s")
            if ack[1] is not None:
                raise RuntimeError(f"the dispatcher process could not delete the queues of {topic}: {ack[1]}")
        finally:
            with self._lock:
                self._acks.pop(token, None)

    def committed(self, end: int) -> None:
        with self._lock:
            if end > self._committed.value:
                self._committed.value = end
        self._wake()

    def _read(self) -> None:
        while True:
            item = EOFError
            if self._out_poll.poll(1000):
                try:
                    item = pickle.loads(self._out.recv_bytes())
                except EOFError:
                    pass
            elif self.process.is_alive():
                continue
            if item is EOFError:
                log.error("dispatcher process exited with %s", self.process.exitcode)
                self._done.set()
                return
            if item is None:
                self._done.set()
                return
            if item[0] == DELETED:
                with self._lock:
                    ack = self._acks.get(item[1])
                if ack is not None:
                    ack[1] = item[2]
                    ack[0].set()
                continue
            queues, last_ts, dispatched_end = item
            try:
                self.store.external_advance(queues, last_ts, dispatched_end)
            except Exception:
                log.exception("applying dispatch progress failed")

    def stop(self, timeout: float = 60.0) -> None:
        """Let the dispatcher finish everything committed, sync, and exit."""
        self._control[STOP] = 1
        self._wake()
        self._done.wait(timeout)
        self.process.join(timeout)
        if self.process.is_alive():
            log.error("dispatcher process did not stop; killing it (recovery will re-dispatch)")
            self.process.kill()
            self.process.join()
        self._release()

    def _release(self) -> None:
        """Close this side's pipes and command queue once the process is gone, rather than leave their
        descriptors to the garbage collector: a test process opens a store (and a dispatcher) per
        test, and past 1,024 open descriptors ``select`` (py4j's callback server) fails."""
        self._wake = _no_wake  # the descriptor number may be reused once closed: never write to it again
        self._wake_conn.close()
        self._commands.close()
        self._commands.join_thread()
        if self._done.is_set():  # the reader thread has returned
            self._out.close()
