"""One replay task: read its messages' bodies, send them through its own producer, record the ledger.

Runs inside a Spark task (or in the driver for tests). Exactly-once comes from the order of
effects, per batch of messages:

1. append a write-ahead event UNKNOWN ("in flight") for every message of the batch;
2. send them (one attempt per message, :meth:`Producer.send_once`);
3. append each message's outcome: SENT (the broker answered with where it stored it), FAILED (the
   broker refused it or no connection could be made: certainly not stored), UNKNOWN (sent, no
   answer: it may be stored).

A kill between 1 and 3 leaves the batch UNKNOWN, and the next run of the same run id asks the target
by replay key before it sends anything again; a kill before 1 leaves the batch PLANNED, which is
true: nothing of it was sent. Only SYSTEM_BUSY / SERVICE_NOT_AVAILABLE answers (the broker stored
nothing) and connection failures are retried here, after a back-off.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from broker.client.instance import MQClientError
from broker.client.producer import Producer, SendStatus
from broker.remoting.bodies import MessageQueue
from broker.remoting.codes import ResponseCode
from broker.remoting.transport import RemotingConnectError
from pipelines.replay.ledger import LedgerWriter, next_events
from pipelines.replay.lineage import Origin, replay_message
from pipelines.storage import Location, as_location
from schemas.replay import FAILED, SENT, UNKNOWN

log = logging.getLogger(__name__)

BODY_COLUMNS = ["commitlog_offset", "body", "properties", "keys", "tags", "flag"]
RETRY_LATER_CODES = frozenset({ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE})
MAX_BUSY_RETRIES = 30
MAX_CONNECT_ATTEMPTS = 3
UNREACHABLE_AFTER = 20  # consecutive connection failures: the target is down, stop the task
ANY_QUEUE = -1


class Pacer:
    """A token bucket: ``acquire()`` returns at most ``rate`` times a second on average, with at most
    ``burst_s`` seconds of unused rate saved up: enough to make up for the short pause of a ledger
    commit between batches, too little for a flood after a long stall."""

    def __init__(self, rate: float | None, burst_s: float = 0.2, clock=time.monotonic, sleep=time.sleep) -> None:
        if rate is not None and rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = rate
        self.burst_s = burst_s
        self._clock, self._sleep = clock, sleep
        self._next: float | None = None

    def acquire(self) -> None:
        if self.rate is None:
            return
        now = self._clock()
        if self._next is None or self._next < now - self.burst_s:
            self._next = now - self.burst_s if self._next is not None else now
        if self._next > now:
            self._sleep(self._next - now)
        self._next += 1.0 / self.rate


@dataclass(frozen=True)
class TaskSpec:
    """What one replay task needs besides its rows (picklable: shipped to Spark executors)."""

    run_id: str
    run_attempt: int
    task: int
    lake: str | Location        # a Location pickles with its storage options: executors need no environment
    namesrv: str
    producer_group: str
    rate: float | None           # this task's share of --rate (messages/s), None = unthrottled
    keep_order: bool
    keep_msg_id: bool
    send_timeout: float = 3.0
    window: int = 64             # messages in flight (without --keep-order)
    batch: int = 1000            # messages per ledger commit pair
    max_message_size: int | None = None


@dataclass
class TaskResult:
    task: int
    sent: int = 0
    failed: int = 0
    unknown: int = 0
    bytes_sent: int = 0
    first_send: float | None = None   # wall clock (time.time) of the first request sent
    last_send: float | None = None    # ... and of the last answer that confirmed a send
    stopped: str | None = None        # why the task stopped early (target unreachable)
    retries: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class _Outcome:
    status: str | None = None        # None: not settled (never sent, or due for another attempt)
    reason: str | None = None
    attempts: int = 0
    broker: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    msg_id: str | None = None
    offset_msg_id: str | None = None


@dataclass
class _Item:
    index: int
    message: object
    queue: int                       # index into the target's queue list, or ANY_QUEUE
    outcome: _Outcome = field(default_factory=_Outcome)


def read_bodies(file_uri: str, offsets: pa.Array, lake: str | Location | None = None) -> pa.Table:
    """The payload columns of the rows at ``offsets`` in one data file of ``messages`` (a local path
    or a URI, reached with the storage options of ``lake``), sorted by offset."""
    options = as_location(lake).option_map if lake is not None else None
    filesystem, path = Location.parse(file_uri, options).filesystem()
    t = pq.read_table(path, filesystem=filesystem, columns=BODY_COLUMNS,
                      filters=[("commitlog_offset", "in", offsets.to_pylist())])
    return t.sort_by("commitlog_offset")


class TaskSender:
    """Sends one task's rows: ``run(rows)`` with rows = current ledger state + ``_file`` + ``_queue``."""

    def __init__(self, spec: TaskSpec, queues_by_topic: dict[str, list[MessageQueue]]) -> None:
        self.spec = spec
        self.queues_by_topic = queues_by_topic
        self.pacer = Pacer(spec.rate)
        self.result = TaskResult(spec.task)
        self.ledger = LedgerWriter(spec.lake, f"replay:{spec.run_id}:{spec.run_attempt}:{spec.task}")
        self._connect_failures = 0
        self.producer = Producer(spec.producer_group, spec.namesrv, send_timeout=spec.send_timeout, retry_times=0,
                                 instance_name=f"replay-{spec.run_id}-{spec.task}-{os.getpid()}")
        if spec.max_message_size is not None:
            self.producer.max_message_size = spec.max_message_size

    # ---- the batch loop ---------------------------------------------------------------------------------
    def run(self, rows: pa.Table) -> TaskResult:
        self.producer.start()
        try:
            done: pa.Table | None = None   # outcomes of the previous batch, committed with the next mark
            for state, bodies in self._batches(rows):
                inflight = next_events(state, UNKNOWN, reason="in flight", attempts_add=1)
                self.ledger.append(inflight if done is None else pa.concat_tables([done, inflight]))
                done = self._send_batch(state, bodies, inflight)
            if done is not None:
                self.ledger.append(done)
        finally:
            self.producer.shutdown()
        return self.result

    def _batches(self, rows: pa.Table) -> Iterator[tuple[pa.Table, pa.Table]]:
        """(ledger state, bodies) per batch: rows of one data file at a time, ``spec.batch`` at most."""
        files = rows["_file"].to_pylist()
        start = 0
        while start < rows.num_rows:
            end = start + 1
            while end < rows.num_rows and files[end] == files[start]:
                end += 1
            group = rows.slice(start, end - start)
            bodies = read_bodies(files[start], group["commitlog_offset"].combine_chunks(), self.spec.lake)
            for b in range(0, group.num_rows, self.spec.batch):
                yield group.slice(b, self.spec.batch).combine_chunks(), bodies
            start = end

    def _send_batch(self, state: pa.Table, bodies: pa.Table, inflight: pa.Table) -> pa.Table:
        """Send one batch whose in-flight mark is committed; its outcome events (not yet committed).

        The outcomes go into the same commit as the next batch's in-flight mark: one ledger commit
        per batch, so sending pauses once per batch, not twice. A crash before that commit leaves
        this batch UNKNOWN, which a rerun resolves by replay key."""
        at = pc.index_in(state["commitlog_offset"], bodies["commitlog_offset"]).to_pylist()
        missing = [i for i, j in enumerate(at) if j is None]
        if missing:
            raise RuntimeError(f"replay task {self.spec.task}: {len(missing)} selected record(s) are no longer in "
                               f"the messages table (first: commitlog offset "
                               f"{state['commitlog_offset'][missing[0]].as_py()})")
        items = self._items(state, bodies, at)
        if self.result.stopped is None:
            self._send(items)
        for item in items:
            if item.outcome.status is None:   # the task stopped before this one could be sent
                item.outcome.status, item.outcome.reason = FAILED, f"not sent: {self.result.stopped}"
        outcomes = [item.outcome for item in items]
        before = state["attempts"].to_pylist()
        for o, size in zip(outcomes, state["body_bytes"].to_pylist()):
            if o.status == SENT:
                self.result.sent += 1
                self.result.bytes_sent += size
            elif o.status == FAILED:
                self.result.failed += 1
            else:
                self.result.unknown += 1
        return next_events(inflight, [o.status for o in outcomes], reason=[o.reason for o in outcomes],
                           attempts_add=0, extra={
            "attempts": pa.array([b + max(o.attempts, 1) for b, o in zip(before, outcomes)], pa.int32()),
            "target_broker": [o.broker for o in outcomes],
            "target_queue_id": [o.queue_id for o in outcomes],
            "target_queue_offset": [o.queue_offset for o in outcomes],
            "target_msg_id": [o.msg_id for o in outcomes],
            "target_offset_msg_id": [o.offset_msg_id for o in outcomes]})

    def _items(self, state: pa.Table, bodies: pa.Table, at: list[int]) -> list[_Item]:
        s = state.to_pydict()
        b = bodies.take(pa.array(at)).to_pydict()
        items = []
        for i in range(state.num_rows):
            origin = Origin(s["broker_name"][i], s["source_topic"][i], s["source_queue_id"][i],
                            s["source_queue_offset"][i], s["commitlog_offset"][i], s["source_msg_id"][i],
                            s["source_uniq_key"][i], int(s["source_store_time"][i].timestamp() * 1000))
            msg = replay_message(origin, run_id=self.spec.run_id, target_topic=s["target_topic"][i],
                                 body=b["body"][i], properties=b["properties"][i], keys=b["keys"][i],
                                 tags=b["tags"][i], flag=b["flag"][i] or 0, keep_msg_id=self.spec.keep_msg_id)
            items.append(_Item(i, msg, s["_queue"][i]))
        return items

    # ---- sending ----------------------------------------------------------------------------------------
    def _queue_for(self, item: _Item, avoid: str | None) -> MessageQueue:
        queues = self.queues_by_topic[item.message.topic]
        if item.queue != ANY_QUEUE:
            return queues[item.queue % len(queues)]
        route = self.producer.client.route(item.message.topic)
        return self.producer.select_queue(route, avoid) if route is not None else queues[0]

    def _send(self, items: list[_Item]) -> None:
        spec = self.spec
        if spec.keep_order:   # one in flight per target queue, each queue's items in order
            lanes: dict[object, deque[_Item]] = {}
            for item in items:
                lanes.setdefault((item.message.topic, item.queue), deque()).append(item)
            limit = len(lanes)
        else:
            lanes = {None: deque(items)}
            limit = spec.window
        busy: set = set()
        inflight: dict[Future, tuple[object, _Item, MessageQueue]] = {}
        backoff = 0.01
        while (any(lanes.values()) or inflight) and self.result.stopped is None:
            for lane, queue in lanes.items():
                while queue and len(inflight) < limit and (lane is None or lane not in busy):
                    item = queue.popleft()
                    self.pacer.acquire()
                    mq = self._queue_for(item, None)
                    item.outcome.attempts += 1
                    try:
                        fut = self.producer.send_once(item.message, mq)
                    except MQClientError as exc:   # refused before sending (size, no address)
                        item.outcome.status, item.outcome.reason = FAILED, f"not sent: {exc}"
                        continue
                    if self.result.first_send is None:
                        self.result.first_send = time.time()
                    inflight[fut] = (lane, item, mq)
                    if lane is not None:
                        busy.add(lane)
            if not inflight:
                continue
            done, _ = wait(list(inflight), timeout=spec.send_timeout + 10, return_when=FIRST_COMPLETED)
            for fut in done:
                lane, item, mq = inflight.pop(fut)
                busy.discard(lane)
                retry = self._settle(fut, item, mq)
                if retry:
                    self.result.retries += 1
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                    lanes[lane].appendleft(item)
                elif item.outcome.status == SENT:
                    backoff = 0.01
        # stopped: wait for what is in flight, the rest stays unsent (FAILED "not sent")
        for fut in list(inflight):
            _, item, mq = inflight.pop(fut)
            try:
                fut.result(spec.send_timeout + 10)
            except Exception:
                pass
            self._settle(fut, item, mq)

    def _settle(self, fut: Future, item: _Item, mq: MessageQueue) -> bool:
        """Record a finished attempt; True when the message should be sent again (nothing was stored)."""
        o = item.outcome
        now = time.time()
        try:
            res = fut.result(0)
        except MQClientError as exc:
            self._connect_failures = 0
            if exc.code in RETRY_LATER_CODES and o.attempts < MAX_BUSY_RETRIES:
                return True
            o.status, o.reason = FAILED, f"refused by {mq.broker_name}: {exc}"
            return False
        except RemotingConnectError as exc:
            self._connect_failures += 1
            self.producer.faults.failed(mq.broker_name)
            if self._connect_failures >= UNREACHABLE_AFTER:
                self.result.stopped = f"target unreachable ({mq.broker_name}: {exc})"
            if o.attempts < MAX_CONNECT_ATTEMPTS and self.result.stopped is None:
                return True
            o.status, o.reason = FAILED, f"not sent: cannot connect to {mq.broker_name}: {exc}"
            return False
        except Exception as exc:   # timeout, connection closed after the request went out
            o.status, o.reason = UNKNOWN, f"no answer from {mq.broker_name}: {type(exc).__name__}: {exc}"
            return False
        self._connect_failures = 0
        o.status = SENT
        o.reason = None if res.status is SendStatus.SEND_OK else f"stored; broker answered {res.status.name}"
        o.broker, o.queue_id, o.queue_offset = res.queue.broker_name, res.queue.queue_id, res.queue_offset
        o.msg_id, o.offset_msg_id = res.msg_id, res.offset_msg_id
        self.result.last_send = now
        return False
