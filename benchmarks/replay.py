"""Replay speed (lake → our broker, through jobs/replay.py's code) next to the broker's own send speed with the same producer, same run.

    .venv/bin/python benchmarks/replay.py [--messages 50000] [--body-bytes 1024] [--rate 2000]
        [--rate-seconds 10] [--root build/bench/replay] [--json FILE] [--keep]

(``make bench-replay``; a smoke run: ``--messages 300 --rate 200 --root <tmp dir>``, about half a
minute, most of it Spark start-up and the ingest.)

In a fresh directory under ``--root``, for ``--messages`` messages of ``--body-bytes`` (1 KiB):

1. source: a name server and a broker on loopback; the messages are sent to topic ``BenchSource``
   with our Python producer the way a replay task sends (``Producer.send_once``, 64 in flight); the
   broker is stopped and its store ingested into a Delta lake (``jobs/ingest_commitlog.py``, in
   this process);
2. target: a second name server and broker; first the baselines — the same messages sent the same
   way from one process, and from as many processes as the replay runs Spark tasks (local[2]: 2) —
   then three replays of the whole ``BenchSource`` selection with :class:`pipelines.replay.run.Replay`
   (ledger and all) into fresh topics: unthrottled, ``--keep-order``, and ``--rate`` (at most
   ``--rate-seconds`` worth of messages);
3. every send and replay must deliver every message (run SUCCEEDED, sent == planned == selected,
   and the target topic holds that many), else the benchmark fails (exit 1).

Send rates are taken like :meth:`ReplayOutcome.send_rate` (without its minimum span): messages
(and body bytes, MB = 10^6 B) over the span between the first and the last answered send. "vs send"
compares a replay with the baseline that has as many producer processes as the replay had tasks
(one producer per task). A replay's wall time (planning, Spark jobs and tasks, ledger commits) and
messages / wall time are shown beside it. The ``--rate`` run is judged by what the target stored:
(messages - 1) over the span of the store timestamps of the topic's first and last records; the
replay's own send span is printed next to it (it starts at the first answer a task handles, which
under pacing comes only after the first window of sends, so it reads high on short runs).
Goals: replay costs little on top of sending (close to 100 %); ``--rate`` within 5 %.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus  # noqa: E402
from broker.server.launcher import start_broker, start_namesrv  # noqa: E402

log = logging.getLogger("benchmarks.replay")

SOURCE_TOPIC = "BenchSource"
QUEUES = 4
WINDOW = 64                   # = pipelines.replay.sender.TaskSpec.window
SEND_TIMEOUT = 3.0            # = the replay's default --send-timeout
ALL_TIME = (0, 4_102_444_800_000)   # 1970 .. 2100, store time in ms
RATE_GOAL = 0.05
DEFAULT_RATE = 2000.0
SHORT_PACED_S = 5.0           # a paced run shorter than this is dominated by task start skew
SPARK_MASTER = "local[2]"


@dataclass
class Figures:
    name: str
    messages: int
    msg_s: float
    mb_s: float
    wall_s: float
    processes: int = 1           # producer processes (a replay: its Spark tasks, one producer each)
    paced: bool = False


# ---- the producer the way a replay task uses it ----------------------------------------------------------
def body_of(i: int, size: int) -> bytes:
    head = f"bench-{i:09d}:".encode()
    return (head + b"x" * size)[:size]


@dataclass
class Span:
    sent: int = 0
    failed: int = 0
    first: float | None = None   # time.time() of the first and the last answered send
    last: float | None = None
    started: float = 0.0
    ended: float = 0.0
    errors: list[str] = field(default_factory=list)


def send_loop(namesrv: str, topic: str, start: int, n: int, body_bytes: int, barrier=None) -> Span:
    """Messages ``start .. start+n`` to ``topic`` with ``Producer.send_once``, WINDOW in flight:
    TaskSender's loop without the lake (round-robin queues, one attempt each, no retries)."""
    producer = Producer(f"PG_BENCH_{topic}", namesrv, send_timeout=SEND_TIMEOUT, retry_times=0,
                        instance_name=f"bench-{topic}-{start}")
    producer.start()
    span = Span()
    try:
        route = producer.client.route(topic)
        if route is None or not route.write_queues:
            raise RuntimeError(f"{topic} has no route on {namesrv}")
        inflight: set[Future] = set()

        def settle(done) -> None:
            now = time.time()
            for fut in done:
                inflight.discard(fut)
                try:
                    fut.result(0)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    span.failed += 1
                    if len(span.errors) < 3:
                        span.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                span.sent += 1
                span.first = now if span.first is None else span.first
                span.last = now

        if barrier is not None:
            barrier.wait(120)
        span.started = time.time()
        for i in range(start, start + n):
            while len(inflight) >= WINDOW:
                settle(wait(list(inflight), timeout=SEND_TIMEOUT + 10, return_when=FIRST_COMPLETED)[0])
            msg = Message(topic, body_of(i, body_bytes), keys=[f"k{i}"], tags="bench")
            inflight.add(producer.send_once(msg, producer.select_queue(route)))
        while inflight:
            settle(wait(list(inflight), timeout=SEND_TIMEOUT + 10, return_when=FIRST_COMPLETED)[0])
        span.ended = time.time()
    finally:
        producer.shutdown()
    return span


def _send_process(namesrv: str, topic: str, start: int, n: int, body_bytes: int, barrier, out) -> None:
    try:
        out.put(asdict(send_loop(namesrv, topic, start, n, body_bytes, barrier)))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        barrier.abort()
        out.put({"errors": [f"{type(exc).__name__}: {exc}"], "sent": 0, "failed": n})


def send(namesrv: str, topic: str, n: int, body_bytes: int, processes: int = 1) -> Figures:
    """``n`` messages from ``processes`` producer processes (started together), each like one replay task."""
    if processes == 1:
        spans = [send_loop(namesrv, topic, 0, n, body_bytes)]
    else:
        ctx = mp.get_context("spawn")
        barrier, out = ctx.Barrier(processes), ctx.Queue()
        bounds = [n * i // processes for i in range(processes + 1)]
        procs = [ctx.Process(target=_send_process, args=(namesrv, topic, bounds[i], bounds[i + 1] - bounds[i],
                                                         body_bytes, barrier, out)) for i in range(processes)]
        for p in procs:
            p.start()
        try:
            spans = [Span(**out.get(timeout=600)) for _ in procs]
        finally:
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
    sent, failed = sum(s.sent for s in spans), sum(s.failed for s in spans)
    if failed or sent != n:
        errors = [e for s in spans for e in s.errors]
        raise RuntimeError(f"sending to {topic}: {sent} of {n} answered, {failed} failed: {'; '.join(errors[:3])}")
    first, last = min(s.first for s in spans), max(s.last for s in spans)
    wall = max(s.ended for s in spans) - min(s.started for s in spans)
    seconds = last - first if last > first else wall
    name = "send (baseline), " + ("1 process" if processes == 1 else f"{processes} processes")
    return Figures(name, n, n / seconds, n * body_bytes / seconds / 1e6, wall, processes)


# ---- clusters -------------------------------------------------------------------------------------------
class Cluster:
    """A name server and one broker (2 processes, ASYNC_FLUSH) on loopback."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.store = directory / "store"
        self.ns, self.namesrv = start_namesrv(directory)
        try:
            self.broker = start_broker(self.store, self.namesrv)
        except BaseException:
            self._stop_ns()
            raise

    def _stop_ns(self) -> None:
        if self.ns.poll() is None:
            self.ns.terminate()
            self.ns.wait(10)

    def stop(self) -> None:
        try:
            self.broker.stop()
        finally:
            self._stop_ns()

    def create_topics(self, *topics: str) -> None:
        with Admin(self.namesrv) as admin:
            for topic in topics:
                admin.create_topic(self.broker.addr, topic, queues=QUEUES)
            for topic in topics:
                if not admin.wait_writable(topic):
                    raise RuntimeError(f"{topic} is not routed by {self.namesrv} after 30 s")

    def messages_in(self, topic: str, expected: int, timeout: float = 30.0) -> int:
        """Messages ``topic``'s queues hold, once they hold ``expected`` (the consume queues are
        built a little after the append) or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        with Admin(self.namesrv) as admin:
            while True:
                stats = admin.topic_stats(self.broker.addr, topic)
                held = sum(o.max_offset - o.min_offset for o in stats.offset_table.values())
                if held >= expected or time.monotonic() > deadline:
                    return held
                time.sleep(0.1)

    def check_holds(self, topic: str, expected: int) -> None:
        held = self.messages_in(topic, expected)
        if held != expected:
            raise RuntimeError(f"{topic} holds {held} message(s), expected {expected}")

    def store_span_ms(self, topic: str) -> tuple[int, int]:
        """(first, last) store timestamp of ``topic``'s messages: the first and the last record of
        every queue, pulled by offset (what the target saw, whatever the client measured)."""
        first, last = [], []
        with PullConsumer("bench-replay-span", self.namesrv) as consumer:
            for mq in consumer.queues(topic):
                end = consumer.max_offset(mq)
                if end <= 0:
                    continue
                for offset, into in ((0, first), (end - 1, last)):
                    res = consumer.pull(mq, offset, max_nums=1)
                    if res.status is not PullStatus.FOUND or not res.messages:
                        raise RuntimeError(f"cannot pull {mq} at offset {offset}: {res.status.name}")
                    into.append(res.messages[0].store_timestamp)
        if not first:
            raise RuntimeError(f"{topic} holds no messages")
        return min(first), max(last)



# ---- replays --------------------------------------------------------------------------------------------
def send_rate(tasks) -> tuple[float, float] | None:
    """:meth:`ReplayOutcome.send_rate` without its minimum span (a smoke run's sends take milliseconds):
    (messages/s, MB/s) between the first and the last answered send of all tasks."""
    times = [(t.first_send, t.last_send) for t in tasks if t.first_send is not None]
    sent = sum(t.sent for t in tasks)
    if not times or sent < 2:
        return None
    span = max(b for _, b in times) - min(a for a, _ in times)
    if span <= 0:
        return None
    return sent / span, sum(t.bytes_sent for t in tasks) / span / 1e6


def replay(spark, lake: Path, target: Cluster, name: str, topic: str, expected: int, *, keep_order: bool = False,
           rate: float | None = None, max_messages: int | None = None) -> Figures:
    from pipelines.replay.run import Replay, ReplayOptions
    from pipelines.replay.selection import Selection
    from schemas.replay import RUN_SUCCEEDED

    opts = ReplayOptions(lake=str(lake), namesrv=target.namesrv,
                         selection=Selection(topic=SOURCE_TOPIC, since_ms=ALL_TIME[0], until_ms=ALL_TIME[1]),
                         target_topic=topic, keep_order=keep_order, rate=rate, max_messages=max_messages,
                         send_timeout=SEND_TIMEOUT)
    log.info("%s: replaying %d message(s) of %s into %s", name, expected, SOURCE_TOPIC, topic)
    outcome = Replay(spark, opts, out=lambda line: log.info("%s", line)).run()
    run = outcome.run
    held = target.messages_in(topic, expected)
    if run.status != RUN_SUCCEEDED or run.planned != expected or run.sent != expected or held != expected:
        raise RuntimeError(f"{name}: run {run.run_id} {run.status}: planned {run.planned}, sent {run.sent}, "
                           f"failed {run.failed}, unknown {run.unknown}, pending {run.pending}; {topic} holds "
                           f"{held}; expected {expected} ({run.message})")
    rates = send_rate(outcome.tasks)
    if rates is None:
        raise RuntimeError(f"{name}: run {run.run_id} has no send span (sent {run.sent}; tasks: "
                           f"{[t.as_dict() for t in outcome.tasks]})")
    log.info("%s: %.0f msg/s, %.2f MB/s while sending, %.1f s in all", name, rates[0], rates[1], outcome.elapsed_s)
    return Figures(name, run.sent, rates[0], rates[1], outcome.elapsed_s, len(outcome.tasks), paced=rate is not None)


# ---- the run --------------------------------------------------------------------------------------------
@dataclass
class Results:
    source: Figures
    baselines: dict[int, Figures]        # by producer processes
    plain: Figures
    ordered: Figures
    paced: Figures
    stored_rate: float                   # the --rate run as the target stored it

    def versus(self, r: Figures) -> float | None:
        base = self.baselines.get(r.processes)
        return None if r.paced or base is None else r.msg_s / base.msg_s


def measure(args: argparse.Namespace, work: Path, rate_n: int) -> Results:
    n, size = args.messages, args.body_bytes
    # 1. the source, sent like a replay task sends, then ingested into the lake
    src = Cluster(work / "source")
    try:
        src.create_topics(SOURCE_TOPIC)
        log.info("sending %d x %d B to %s (source broker) …", n, size, SOURCE_TOPIC)
        source = send(src.namesrv, SOURCE_TOPIC, n, size)
        source.name = "send, source broker (makes the source)"
        src.check_holds(SOURCE_TOPIC, n)
        log.info("source: %.0f msg/s, %.2f MB/s", source.msg_s, source.mb_s)
    finally:
        src.stop()

    from broker.cli import run_job
    from pipelines.session import build_session

    spark = build_session("rocketlake-bench-replay", SPARK_MASTER,
                          {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
    try:
        lake = work / "lake"
        log.info("ingesting %s into %s …", src.store, lake)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):   # the job's summary line is progress here, not a figure
            rc = run_job("ingest_commitlog.py", ["--store", f"broker-a={src.store}", "--lake", str(lake)])
        if rc != 0:
            raise RuntimeError(f"ingest_commitlog.py exited {rc}")
        log.info("ingest: %.1f s", time.perf_counter() - t0)

        # 2. the target: baselines, then the replays; same broker, same run
        tasks = spark.sparkContext.defaultParallelism
        tgt = Cluster(work / "target")
        try:
            counts = sorted({1, tasks})
            tgt.create_topics(*(f"BenchBaseline{p}" for p in counts), "ReplayPlain", "ReplayOrdered", "ReplayRate")
            baselines = {}
            for p in counts:
                log.info("baseline: sending %d x %d B from %d process(es) …", n, size, p)
                baselines[p] = send(tgt.namesrv, f"BenchBaseline{p}", n, size, p)
                tgt.check_holds(f"BenchBaseline{p}", n)
                log.info("baseline, %d process(es): %.0f msg/s, %.2f MB/s", p, baselines[p].msg_s, baselines[p].mb_s)
            plain = replay(spark, lake, tgt, "replay", "ReplayPlain", n)
            ordered = replay(spark, lake, tgt, "replay --keep-order", "ReplayOrdered", n, keep_order=True)
            paced = replay(spark, lake, tgt, f"replay --rate {args.rate:g}", "ReplayRate", rate_n, rate=args.rate,
                           max_messages=rate_n if rate_n < n else None)
            first_ms, last_ms = tgt.store_span_ms("ReplayRate")
        finally:
            tgt.stop()
    finally:
        spark.stop()
    stored_rate = (rate_n - 1) / max(last_ms - first_ms, 1) * 1000
    return Results(source, baselines, plain, ordered, paced, stored_rate)


# ---- report ---------------------------------------------------------------------------------------------
def report(args: argparse.Namespace, res: Results) -> None:
    n, size = args.messages, args.body_bytes
    print(f"== replay benchmark: {n:,} messages of {size} B; name server + broker (2 processes) on loopback; "
          f"Spark {SPARK_MASTER}")
    print(f"{'':<42} {'messages':>9} {'msg/s':>9} {'MB/s':>7} {'vs send':>7}   {'wall s':>6} {'msg/s e2e':>9} "
          f"{'procs':>5}")
    for r in [res.source, *res.baselines.values(), res.plain, res.ordered, res.paced]:
        ratio = res.versus(r)
        print(f"{r.name:<42} {r.messages:>9,} {r.msg_s:>9,.0f} {r.mb_s:>7.2f} "
              f"{'-' if ratio is None else f'{ratio:.0%}':>7}   {r.wall_s:>6.1f} {r.messages / r.wall_s:>9,.0f} "
              f"{r.processes:>5}")
    parts = [f"{res.versus(r):.0%}{label} ({r.processes} task(s))"
             for r, label in ((res.plain, ""), (res.ordered, " with --keep-order")) if res.versus(r) is not None]
    print("replay / send with as many producers: " + ", ".join(parts) + " (msg/s while sending; goal: close to 100 %)")
    error = res.stored_rate / args.rate - 1
    span_error = res.paced.msg_s / args.rate - 1
    print(f"--rate {args.rate:g} msg/s over {res.paced.messages:,} messages: the target stored them at "
          f"{res.stored_rate:,.1f} msg/s, error {error:+.2%} (goal: within {RATE_GOAL:.0%}: "
          f"{'met' if abs(error) <= RATE_GOAL else 'NOT met'}); the replay's own send span: "
          f"{res.paced.msg_s:,.1f} msg/s, error {span_error:+.2%}")
    if res.paced.messages / args.rate < SHORT_PACED_S:
        print(f"   (a short paced run, {res.paced.messages / args.rate:.1f} s: the Spark tasks' start skew weighs "
              "in; give more --messages or a lower --rate)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "messages": n, "body_bytes": size, "source_send": asdict(res.source),
            "baselines": [asdict(b) for b in res.baselines.values()], "replay": asdict(res.plain),
            "replay_keep_order": asdict(res.ordered), "replay_rate": asdict(res.paced),
            "replay_vs_send": res.versus(res.plain), "keep_order_vs_send": res.versus(res.ordered),
            "rate_target": args.rate, "rate_stored": res.stored_rate, "rate_error": error,
            "rate_send_span": res.paced.msg_s, "rate_send_span_error": span_error}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--messages", type=int, default=50_000, help="messages in the source (default 50000)")
    ap.add_argument("--body-bytes", type=int, default=1024, help="body size (default 1024)")
    ap.add_argument("--rate", type=float, default=None,
                    help=f"the --rate replay's target, msg/s (default {DEFAULT_RATE:g}, or less so that the "
                         "paced replay of --messages lasts --rate-seconds)")
    ap.add_argument("--rate-seconds", type=float, default=10.0,
                    help="the --rate replay sends at most rate x this many messages (default 10)")
    ap.add_argument("--root", type=Path, default=REPO / "build" / "bench" / "replay",
                    help="a fresh run-* directory for stores and lake is made here (default build/bench/replay)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (stores, lake, logs) afterwards")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON to FILE")
    args = ap.parse_args(argv)
    if args.messages < 2 or args.body_bytes < 16 or (args.rate is not None and args.rate <= 0) or args.rate_seconds <= 0:
        ap.error("--messages must be >= 2, --body-bytes >= 16, --rate and --rate-seconds > 0")
    if args.rate is None:
        args.rate = float(max(1, min(DEFAULT_RATE, round(args.messages / args.rate_seconds))))
    rate_n = min(args.messages, int(args.rate * args.rate_seconds))
    if rate_n < 2:
        ap.error("--rate x --rate-seconds must be >= 2 messages")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    log.info("working in %s", work)
    try:
        results = measure(args, work, rate_n)
    except RuntimeError as exc:
        print(f"FAILED: {exc}", file=sys.stderr, flush=True)
        if not args.keep:
            print("(rerun with --keep to look at the stores, lake and logs)", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            log.info("kept %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
