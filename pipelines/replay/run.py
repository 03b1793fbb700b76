"""A replay run from start to end: plan, record, resolve what is uncertain, send, account.

New run: the selection is evaluated on the lake, the target checked, the plan printed; a dry run
records the run (DRY_RUN) and stops there. Otherwise the run row (RUNNING) and the plan (PLANNED /
SKIPPED events, one commit with an app transaction) are recorded, then Spark tasks send.

Rerun with the same ``--run-id``: the recorded plan is the selection (the lake may have grown since);
SENT and SKIPPED messages are done; UNKNOWN ones are looked up on the target by replay key and only
those it does not hold are sent again; when the target cannot be asked, the run stops without
sending anything (no blind resend). A run is SUCCEEDED when every message is SENT or SKIPPED, else
INCOMPLETE (rerun it).
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import time
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from broker.remoting.bodies import MessageQueue
from pipelines.lake import open_table, read_table, table_exists, table_location, table_path
from pipelines.replay import ledger
from pipelines.replay.lineage import replay_key, validate_run_id
from pipelines.replay.selection import Selection, explain_empty, messages_frame, plan_frame
from pipelines.replay.sender import ANY_QUEUE, TaskResult, TaskSender, TaskSpec
from pipelines.replay.target import Target, TargetError, check_topic_allowed, now_ms, queue_list
from pipelines.storage import Location
from schemas.messages import MESSAGES_TABLE
from schemas.replay import (
    FAILED,
    PLANNED,
    REPLAY_LEDGER_SCHEMA,
    RUN_DRY_RUN,
    RUN_INCOMPLETE,
    RUN_RUNNING,
    RUN_SUCCEEDED,
    SENT,
    SKIPPED,
    UNKNOWN,
)
from schemas.tables import CONSUME_QUEUE_TABLE

log = logging.getLogger(__name__)

MIN_TASK_MESSAGES = 500     # fewer messages than this per task are not worth another producer
PLAN_LINES = 40             # source queues listed in the printed plan
MIN_RATE_SPAN_S = 0.5       # sends spread over less time than this get no msg/s figure


class ReplayError(ValueError):
    """Bad input or a run that cannot go on; the message says what and where. Nothing half-recorded."""


@dataclass
class ReplayOptions:
    lake: str | Location            # a directory, a URI, or a Location with its storage options
    namesrv: str
    selection: Selection | None
    target_topic: str | None = None
    rate: float | None = None
    dry_run: bool = False
    run_id: str | None = None
    producer_group: str = "rocketlake-replay"
    keep_order: bool = False
    keep_msg_id: bool = False
    max_messages: int | None = None
    send_timeout: float = 3.0
    batch: int = 1000
    settle_s: float | None = None   # wait before asking the target about UNKNOWN sends (default: send timeout + 2 s)

    def recorded(self) -> dict:
        return {"rate": self.rate, "keep_order": self.keep_order, "keep_msg_id": self.keep_msg_id,
                "max_messages": self.max_messages, "producer_group": self.producer_group,
                "selection": self.selection.to_json() if self.selection else None}


@dataclass
class ReplayOutcome:
    run: ledger.RunRecord
    tasks: list[TaskResult] = field(default_factory=list)
    elapsed_s: float = 0.0
    dry_run: bool = False      # a dry run of a rerun: nothing was done

    @property
    def complete(self) -> bool:
        return self.dry_run or self.run.status in (RUN_SUCCEEDED, RUN_DRY_RUN)

    def send_rate(self) -> tuple[float, float] | None:
        """(messages/s, MB/s) between the first and the last answered send of all tasks."""
        times = [(t.first_send, t.last_send) for t in self.tasks if t.first_send is not None]
        sent = sum(t.sent for t in self.tasks)
        if not times or sent < 2:
            return None
        span = max(b for _, b in times) - min(a for a, _ in times)
        if span < MIN_RATE_SPAN_S:   # a handful of sends: no meaningful rate
            return None
        return sent / span, sum(t.bytes_sent for t in self.tasks) / span / 1e6


def new_run_id() -> str:
    return f"replay-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _driver() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _driver_alive(driver: str) -> bool:
    host, _, pid = driver.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- planning -------------------------------------------------------------------------------------------
def _target_topics(opts: ReplayOptions, plan: pa.Table) -> pa.Array:
    if opts.target_topic is not None:
        return pa.array([opts.target_topic] * plan.num_rows, pa.string())
    return plan["origin_topic"].combine_chunks()


def _check_targets(target: Target, topics: list[str], *, allow_retry: bool) -> tuple[dict[str, list[MessageQueue]], int]:
    queues: dict[str, list[MessageQueue]] = {}
    limit = None
    for topic in topics:
        try:
            check_topic_allowed(topic, allow_retry=allow_retry)
            route = target.route(topic)
        except TargetError as exc:
            raise ReplayError(str(exc)) from None
        queues[topic] = queue_list(route)
        size = target.max_message_size(route)
        limit = size if limit is None else min(limit, size)
    return queues, limit if limit is not None else 0


def plan_events(run_id: str, plan: pa.Table, targets: pa.Array, max_size: int) -> pa.Table:
    """PLANNED (or SKIPPED, over the size limit) events for a new plan."""
    n = plan.num_rows
    over = pc.greater(plan["body_bytes"], max_size)
    status = pc.if_else(over, SKIPPED, PLANNED)
    reason = pc.if_else(over, pa.scalar(f"body over the target's maxMessageSize {max_size}"),
                        pa.scalar(None, pa.string()))
    keys = [replay_key(run_id, b, o) for b, o in zip(plan["broker_name"].to_pylist(),
                                                     plan["commitlog_offset"].to_pylist())]
    cols = {name: plan[name] for name in plan.column_names if name in REPLAY_LEDGER_SCHEMA.names}
    cols.update({"run_id": [run_id] * n, "event_seq": [1] * n, "status": status, "reason": reason,
                 "attempts": [0] * n, "replay_key": keys, "target_topic": targets,
                 "recorded_at": [ledger.utc_now()] * n})
    return ledger.events_table(cols)


def format_plan(run_id: str, plan: pa.Table, events: pa.Table, opts: ReplayOptions) -> str:
    """The plan as an operator reads it before anything is sent."""
    n, total = plan.num_rows, pc.sum(plan["body_bytes"]).as_py() or 0
    skipped = pc.sum(pc.equal(events["status"], SKIPPED).cast(pa.int64())).as_py() or 0
    first = pc.min(plan["source_store_time"]).as_py()
    last = pc.max(plan["source_store_time"]).as_py()
    target = opts.target_topic or ("each message's original topic" if opts.selection and opts.selection.is_dlq
                                   else "the same topic")
    lines = [f"replay plan {run_id}: {n} message(s), {total} bytes ({total / 1e6:.2f} MB), "
             f"store time {first:%Y-%m-%d %H:%M:%S.%f}"[:-3] + f" .. {last:%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC",
             f"  target: {target} via name server {opts.namesrv}"
             + (" (keeping per-queue order)" if opts.keep_order else "")]
    per = (pa.table({"b": plan["broker_name"], "t": plan["source_topic"], "q": plan["source_queue_id"],
                     "to": events["target_topic"], "bytes": plan["body_bytes"]})
           .group_by(["b", "t", "q", "to"]).aggregate([("bytes", "count"), ("bytes", "sum")])
           .sort_by([("b", "ascending"), ("t", "ascending"), ("q", "ascending"), ("to", "ascending")]))
    for row in per.to_pylist()[:PLAN_LINES]:
        lines.append(f"  {row['b']} {row['t']} queue {row['q']} -> {row['to']}: {row['bytes_count']} msgs, "
                     f"{row['bytes_sum']} bytes")
    if per.num_rows > PLAN_LINES:
        lines.append(f"  ... and {per.num_rows - PLAN_LINES} more source queues")
    if skipped:
        lines.append(f"  skipped: {skipped} message(s) over the target's size limit")
    todo = n - skipped
    if opts.rate:
        lines.append(f"  estimated time at {opts.rate:g} msg/s: {todo / opts.rate:.1f} s")
    else:
        lines.append("  no --rate: as fast as the target takes them")
    return "\n".join(lines)


# ---- task assignment ------------------------------------------------------------------------------------
def _source_queue_counts(spark, lake: str | Location, pending: pa.Table) -> dict[tuple[str, str], int]:
    """Queues of each source (broker, topic): from the consume_queue table, else the selection."""
    counts: dict[tuple[str, str], int] = {}
    pairs = {(b, t) for b, t in zip(pending["broker_name"].to_pylist(), pending["source_topic"].to_pylist())}
    if table_exists(lake, CONSUME_QUEUE_TABLE):
        from pyspark.sql import functions as F

        df = (read_table(spark, lake, CONSUME_QUEUE_TABLE)
              .where(F.col("topic").isin(sorted({t for _, t in pairs})))
              .groupBy("broker_name", "topic").agg(F.max("queue_id").alias("q")))
        for row in df.collect():
            counts[(row["broker_name"], row["topic"])] = row["q"] + 1
    for b, t, q in zip(pending["broker_name"].to_pylist(), pending["source_topic"].to_pylist(),
                       pending["source_queue_id"].to_pylist()):
        counts[(b, t)] = max(counts.get((b, t), 0), q + 1)
    return counts


def target_queue_index(broker: str, topic: str, queue_id: int, source_queues: int, target_queues: int) -> int:
    """--keep-order: the source queue's id when source and target have as many queues, else a
    stable hash of the source queue (the same source queue always goes to the same target queue)."""
    if source_queues == target_queues:
        return queue_id
    return zlib.crc32(f"{broker}/{topic}/{queue_id}".encode()) % target_queues


def assign_tasks(pending: pa.Table, parallelism: int, keep_order: bool) -> list[pa.Table]:
    """Split the pending rows (sorted by broker, offset) into task slices. With --keep-order each
    source queue stays in one task (largest first onto the lightest task); without, equal slices."""
    n = pending.num_rows
    if keep_order:
        sources = pa.table({"b": pending["broker_name"], "t": pending["source_topic"], "q": pending["source_queue_id"],
                            "i": pa.array(range(n), pa.int64())})
        groups = sources.group_by(["b", "t", "q"]).aggregate([("i", "list")]).to_pylist()
        tasks = min(parallelism, len(groups))
        loads = [0] * tasks
        members: list[list[int]] = [[] for _ in range(tasks)]
        for g in sorted(groups, key=lambda g: (-len(g["i_list"]), g["b"], g["t"], g["q"])):
            k = loads.index(min(loads))
            loads[k] += len(g["i_list"])
            members[k] += g["i_list"]
        return [pending.take(pa.array(sorted(m), pa.int64())) for m in members if m]
    tasks = max(1, min(parallelism, n // MIN_TASK_MESSAGES))
    bounds = [round(i * n / tasks) for i in range(tasks + 1)]
    return [pending.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(tasks)]


def _run_task(payload: tuple[TaskSpec, bytes, dict[str, list[MessageQueue]]]) -> dict:
    """One Spark task (executor side)."""
    from pyspark import TaskContext

    spec, ipc, queues = payload
    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() > 0:
        raise RuntimeError(f"replay task {spec.task} of run {spec.run_id} failed once and is not retried by Spark "
                           "(a retry could send twice); rerun the replay with the same --run-id")
    rows = pa.ipc.open_stream(ipc).read_all()
    logging.basicConfig(level=logging.INFO)
    t0 = time.monotonic()
    result = TaskSender(spec, queues).run(rows)
    log.info("replay task %d: %d sent, %d failed, %d unknown of %d in %.1f s", spec.task, result.sent, result.failed,
             result.unknown, rows.num_rows, time.monotonic() - t0)
    return result.as_dict()


def execute(spark, slices: list[tuple[TaskSpec, pa.Table]], queues: dict[str, list[MessageQueue]]) -> list[TaskResult]:
    """Run the task slices as Spark tasks, one producer each, all at once."""
    payloads = []
    for spec, rows in slices:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        payloads.append((spec, sink.getvalue().to_pybytes(), queues))
    sc = spark.sparkContext
    sc.setJobDescription(f"replay {slices[0][0].run_id}: {sum(r.num_rows for _, r in slices)} messages")
    results = sc.parallelize(payloads, len(payloads)).map(_run_task).collect()
    return [TaskResult(**r) for r in results]


def locate(lake: str | Location, pending: pa.Table) -> pa.Table:
    """``pending`` with ``_file``: the URI (or local path) of the data file of ``messages`` that holds
    each row now (files can change between runs, e.g. after compaction), in (broker, commitlog
    offset) order.

    Found from the Delta log (each file's broker partition and commitlog_offset range) and, for the
    files whose range admits a wanted offset, their ``commitlog_offset`` column, read by the driver:
    the same for a local lake and one behind a URI (a table read through a Python data source has
    no input file names to ask Spark for)."""
    table = open_table(lake, MESSAGES_TABLE)
    if table is None:
        raise ReplayError(f"{table_path(lake, MESSAGES_TABLE)} is not a Delta table")
    root = table_location(lake, MESSAGES_TABLE)
    wanted = {b: np.unique(pc.filter(pending["commitlog_offset"], pc.equal(pending["broker_name"], b)).to_numpy())
              for b in set(pending["broker_name"].to_pylist())}
    parts: list[pa.Table] = []
    for add in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        offsets = wanted.get(add.get("partition.broker_name"))
        if offsets is None:
            continue
        lo, hi = add.get("min.commitlog_offset"), add.get("max.commitlog_offset")
        if lo is not None and hi is not None:
            offsets = offsets[(offsets >= lo) & (offsets <= hi)]
        if not len(offsets):
            continue
        data_file = root.child(*unquote(add["path"]).split("/"))
        filesystem, path = data_file.filesystem()
        held = pq.read_table(path, filesystem=filesystem, columns=["commitlog_offset"],
                             filters=[("commitlog_offset", "in", offsets.tolist())])["commitlog_offset"]
        parts.append(pa.table({"broker_name": pa.array([add["partition.broker_name"]] * len(held), pa.string()),
                               "commitlog_offset": held.cast(pa.int64()),
                               "_file": pa.array([data_file.uri] * len(held), pa.string())}))
    found = (pa.concat_tables(parts) if parts else
             pa.table({"broker_name": pa.array([], pa.string()), "commitlog_offset": pa.array([], pa.int64()),
                       "_file": pa.array([], pa.string())}))
    # a row in two current files (never written so, but harmless): either file has its body
    found = found.group_by(["broker_name", "commitlog_offset"]).aggregate([("_file", "min")]).rename_columns(
        ["broker_name", "commitlog_offset", "_file"])
    out = pending.join(found, ["broker_name", "commitlog_offset"], join_type="left outer")
    missing = out.filter(pc.is_null(out["_file"]))
    if missing.num_rows:
        row = missing.slice(0, 1).to_pylist()[0]
        raise ReplayError(f"{missing.num_rows} planned message(s) are no longer in the messages table of {lake} "
                          f"(first: broker {row['broker_name']}, commitlog offset {row['commitlog_offset']})")
    return out.sort_by([("broker_name", "ascending"), ("commitlog_offset", "ascending")])


# ---- the run ----------------------------------------------------------------------------------------------
class Replay:
    def __init__(self, spark, opts: ReplayOptions, out: Callable[[str], None] = print) -> None:
        self.spark, self.opts, self.out = spark, opts, out
        self.lake = opts.lake

    def run(self) -> ReplayOutcome:
        opts = self.opts
        started = time.monotonic()
        if opts.run_id is not None:
            try:
                validate_run_id(opts.run_id)
            except ValueError as exc:
                raise ReplayError(str(exc)) from None
        previous = ledger.load_run(self.lake, opts.run_id) if opts.run_id else None
        with Target(opts.namesrv) as target:
            if previous is not None and previous.status != RUN_DRY_RUN:
                outcome = self._resume(previous, target)
            else:
                outcome = self._new(target, previous)
        outcome.elapsed_s = time.monotonic() - started
        return outcome

    # -- new run
    def _new(self, target: Target, previous: ledger.RunRecord | None) -> ReplayOutcome:
        opts = self.opts
        if opts.selection is None:
            raise ReplayError(f"run {opts.run_id!r} is not recorded in {self.lake}: give a selection "
                              "(--topic/--where/--dlq) to start it")
        run_id = opts.run_id or new_run_id()
        messages = messages_frame(self.spark, self.lake)
        plan = plan_frame(messages, opts.selection, opts.max_messages).toArrow()
        if plan.num_rows == 0:
            raise ReplayError(f"empty selection: {explain_empty(self.spark, self.lake, messages, opts.selection)}")
        targets = _target_topics(opts, plan)
        if targets.null_count:
            raise ReplayError("some selected messages have no topic to go back to; give --target-topic")
        queues, max_size = _check_targets(target, sorted(set(targets.to_pylist())),
                                          allow_retry=opts.selection.is_dlq)
        events = plan_events(run_id, plan, targets, max_size)
        self.out(format_plan(run_id, plan, events, opts))
        run = ledger.RunRecord(
            run_id=run_id, status=RUN_DRY_RUN if opts.dry_run else RUN_RUNNING,
            selection=opts.selection.describe(), target_namesrv=opts.namesrv, target_topic=opts.target_topic,
            options=opts.recorded(), operator=getpass.getuser(), driver=_driver(), dry_run=opts.dry_run,
            attempts=0 if opts.dry_run else 1, planned=plan.num_rows,
            planned_bytes=pc.sum(plan["body_bytes"]).as_py() or 0, started_at=ledger.utc_now())
        if opts.dry_run:
            run.ended_at = ledger.utc_now()
            run.counted(events)
            run.message = "dry run: nothing sent"
            ledger.save_run(self.lake, run)
            self.out(f"replay {run_id}: DRY_RUN recorded, nothing sent")
            return ReplayOutcome(run)
        ledger.save_run(self.lake, run)
        ledger.append_events(self.lake, events, f"replay-plan:{run_id}", 1)
        return self._send(run, ledger.current_state(events), target, queues, max_size)

    # -- rerun
    def _resume(self, run: ledger.RunRecord, target: Target) -> ReplayOutcome:
        opts = self.opts
        if opts.selection is not None and opts.selection.describe() != run.selection:
            raise ReplayError(f"run {run.run_id} was started with the selection {run.selection!r}; rerun it with the "
                              f"same selection (or none), or choose a new --run-id")
        if opts.target_topic != run.target_topic and opts.target_topic is not None:
            raise ReplayError(f"run {run.run_id} sends to {run.target_topic or 'the original topics'}, "
                              f"not {opts.target_topic}; choose a new --run-id for another target")
        if opts.namesrv != run.target_namesrv:
            raise ReplayError(f"run {run.run_id} was sent through name server {run.target_namesrv}, not "
                              f"{opts.namesrv}; a rerun must ask the same target")
        if run.status == RUN_RUNNING and _driver_alive(run.driver) and not opts.dry_run:
            raise ReplayError(f"run {run.run_id} is being replayed right now by process {run.driver}")
        state = ledger.current_state(ledger.run_events(self.lake, run.run_id))
        if opts.dry_run:          # say what a rerun would do; touch nothing
            c = ledger.status_counts(state)
            self.out(f"replay {run.run_id}: {run.status}, dry run of a rerun: {c[SENT]} sent, {c[SKIPPED]} skipped "
                     f"(done); {c[PLANNED] + c[FAILED]} to send, {c[UNKNOWN]} unknown to look up on the target "
                     f"first; nothing sent, nothing recorded")
            return ReplayOutcome(run, dry_run=True)
        if state.num_rows == 0:   # killed between recording the run and its plan: plan again
            if opts.selection is None:
                self.opts.selection = Selection.from_json(run.options["selection"])
            return self._new(target, run)
        run.attempts += 1
        run.status, run.driver, run.ended_at, run.message = RUN_RUNNING, _driver(), None, None
        ledger.save_run(self.lake, run.counted(state))
        self.out(f"replay {run.run_id}: rerun {run.attempts}: {run.sent} sent, {run.pending} planned, "
                 f"{run.failed} failed, {run.unknown} unknown, {run.skipped} skipped so far")
        topics = sorted(set(ledger.with_status(state, PLANNED, FAILED, UNKNOWN)["target_topic"].to_pylist()))
        is_dlq = Selection.from_json(run.options["selection"]).is_dlq
        queues, max_size = _check_targets(target, topics, allow_retry=is_dlq) if topics else ({}, 0)
        state = self._resolve_unknown(run, state, target)
        if state is None:
            return ReplayOutcome(run)
        return self._send(run, state, target, queues, max_size)

    def _resolve_unknown(self, run: ledger.RunRecord, state: pa.Table, target: Target) -> pa.Table | None:
        """Ask the target about every UNKNOWN message; record what it holds as SENT and what it does not
        as FAILED (to be sent again). None when it cannot be asked (the run stops, nothing resent)."""
        unknown = ledger.with_status(state, UNKNOWN)
        if unknown.num_rows == 0:
            return state
        last = pc.max(unknown["recorded_at"]).as_py().timestamp()
        settle = self.opts.settle_s if self.opts.settle_s is not None else self.opts.send_timeout + 2
        if time.time() < last + settle:   # a send may still be on its way to the broker
            time.sleep(last + settle - time.time())
        first_ms = int(pc.min(unknown["recorded_at"]).as_py().timestamp() * 1000)
        found_all: dict[str, object] = {}
        errors: list[str] = []
        for topic in sorted(set(unknown["target_topic"].to_pylist())):
            keys = unknown.filter(pc.equal(unknown["target_topic"], topic))["replay_key"].to_pylist()
            try:
                found, errs = target.find(topic, keys, first_ms, now_ms())
            except TargetError as exc:
                found, errs = {}, [str(exc)]
            found_all.update(found)
            errors += errs
        if errors:
            run.status, run.ended_at = RUN_INCOMPLETE, ledger.utc_now()
            run.message = (f"cannot resolve {unknown.num_rows} UNKNOWN message(s): {'; '.join(errors[:3])}. "
                           f"Nothing was resent; rerun with --run-id {run.run_id} once the target answers")
            ledger.save_run(self.lake, run.counted(state))
            self.out(f"replay {run.run_id}: INCOMPLETE: {run.message}")
            return None
        keys = unknown["replay_key"].to_pylist()
        hits = [found_all.get(k) for k in keys]
        statuses = [SENT if h else FAILED for h in hits]
        reasons = ["confirmed on the target by replay key" if h else
                   "not on the target after an unanswered send (checked by replay key): to be sent again"
                   for h in hits]
        events = ledger.next_events(unknown, statuses, reason=reasons, extra={
            "target_broker": [h.broker if h else None for h in hits],
            "target_queue_id": [h.queue_id if h else None for h in hits],
            "target_queue_offset": [h.queue_offset if h else None for h in hits],
            "target_msg_id": [h.uniq_key if h else None for h in hits],
            "target_offset_msg_id": [h.offset_msg_id if h else None for h in hits]})
        ledger.append_events(self.lake, events, f"replay-resolve:{run.run_id}", run.attempts)
        self.out(f"replay {run.run_id}: {sum(1 for h in hits if h)} of {len(hits)} UNKNOWN message(s) found on the "
                 f"target; {sum(1 for h in hits if not h)} will be sent again")
        rest = state.filter(pc.invert(pc.equal(state["status"], UNKNOWN)))
        return ledger.current_state(pa.concat_tables([rest, events]))

    # -- sending
    def _send(self, run: ledger.RunRecord, state: pa.Table, target: Target,
              queues: dict[str, list[MessageQueue]], max_size: int) -> ReplayOutcome:
        opts = self.opts
        options = run.options
        pending = ledger.with_status(state, PLANNED, FAILED)
        results: list[TaskResult] = []
        if pending.num_rows:
            pending = locate(self.lake, pending)
            if options.get("keep_order"):
                counts = _source_queue_counts(self.spark, self.lake, pending)
                qidx = [target_queue_index(b, t, q, counts[(b, t)], len(queues[to]))
                        for b, t, q, to in zip(pending["broker_name"].to_pylist(), pending["source_topic"].to_pylist(),
                                               pending["source_queue_id"].to_pylist(),
                                               pending["target_topic"].to_pylist())]
            else:
                qidx = [ANY_QUEUE] * pending.num_rows
            pending = pending.append_column("_queue", pa.array(qidx, pa.int32()))
            parallelism = self.spark.sparkContext.defaultParallelism
            slices = assign_tasks(pending, parallelism, bool(options.get("keep_order")))
            rate = opts.rate if opts.rate is not None else options.get("rate")   # a rerun may change the pace
            specs = [(TaskSpec(run.run_id, run.attempts, i, self.lake, opts.namesrv, options["producer_group"],
                               rate * s.num_rows / pending.num_rows if rate else None, bool(options.get("keep_order")),
                               bool(options.get("keep_msg_id")), opts.send_timeout, batch=opts.batch,
                               max_message_size=max_size or None), s)
                     for i, s in enumerate(slices)]
            self.out(f"replay {run.run_id}: sending {pending.num_rows} message(s) in {len(specs)} task(s)"
                     + (f" at {rate:g} msg/s" if rate else ""))
            results = execute(self.spark, specs, queues)
        final = ledger.current_state(ledger.run_events(self.lake, run.run_id))
        run.counted(final)
        run.ended_at = ledger.utc_now()
        stopped = sorted({r.stopped for r in results if r.stopped})
        if run.failed or run.unknown or run.pending:
            run.status = RUN_INCOMPLETE
            run.message = (f"{run.failed} failed, {run.unknown} unknown, {run.pending} not sent"
                           + (f" ({'; '.join(stopped)})" if stopped else "")
                           + f": rerun with --run-id {run.run_id}")
        else:
            run.status = RUN_SUCCEEDED
            run.message = f"{run.sent} sent, {run.skipped} skipped"
        ledger.save_run(self.lake, run)
        self.out(f"replay {run.run_id}: {run.status}: {run.sent} sent, {run.failed} failed, {run.unknown} unknown, "
                 f"{run.skipped} skipped, {run.pending} pending")
        if run.message and run.status != RUN_SUCCEEDED:
            self.out(f"replay {run.run_id}: {run.message}")
        return ReplayOutcome(run, results)
