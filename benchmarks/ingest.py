"""End-to-end ingest speed (store → Delta lake with Spark) next to the raw read, decode-only and broker-consumer speeds of the same store, same run.

    .venv/bin/python benchmarks/ingest.py [--sizes-gib 1 4 16] [--master local[2] | spark://HOST:PORT ...]
        [--broker-max-gib 1] [--split-bytes N] [--root build/bench] [--generate-only]

(``make bench-ingest``; a smoke run: ``--sizes-gib 0.01 --broker-max-gib 0.01 --root <tmp dir>``, about
half a minute, most of it Spark start-up.)

For each size (default 1, 4 and 16 GiB), generates (once; reused while the arguments match, see
``bench-spec.json``) a store of about that many GiB of commitlog with ~1 KiB bodies under
``build/bench/ingest-<size>g`` (``--generate-only`` does only this, e.g. ahead of a quiet machine), then
measures on it:

1. raw read: ``readinto`` of the data part of every commitlog file in 8 MiB blocks, cold (pages
   dropped with ``posix_fadvise(DONTNEED)``) and warm;
2. decode only: :func:`broker.store.columnar.iter_decode` over every segment in this process
   (one core, warm page cache), all columns and body CRCs;
3. ingest end to end, once per ``--master`` (default ``local[2]``; ``spark://HOST:PORT`` submits to
   a standalone cluster, e.g. the one ``make cluster-up`` starts, and labels the row with it):
   ``spark-submit --master M jobs/ingest_commitlog.py --store broker-a=STORE --lake <fresh lake>`` as a
   subprocess with the store's pages dropped first (cold); wall time including JVM start, the
   job's own time, and the peak memory of the whole process tree (JVM + Python driver + Python
   workers; on a cluster also every executor JVM and its Python workers) sampled every 0.5 s from
   /proc: RSS, and apart from it the anonymous part (RSS also counts the mapped commitlog pages,
   which are page cache the kernel can drop, not memory the job holds);
4. the broker path, on the smallest size only: a name server and a broker started on the store,
   and one PullConsumer pulling every message of every ``demo-topic-*`` queue (round robin, 32 per
   pull) and appending them to a Delta table with ``deltalake.write_deltalake`` in batches — at
   most ``--broker-max-gib`` GiB of commitlog (it is slow).

MB/s are commitlog bytes (10^6) per second. Goals (issue 12): ingest >= 300 MB/s end to end on
``local[2]`` for the 16 GiB store and >= 10x the broker path; across sizes, seconds per GiB should
stay flat (linear time) and so should the peak memory. Sizes that do not fit in the free disk space
are skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from broker.store.columnar import DecodeStats, iter_decode  # noqa: E402
from broker.store.commitlog import CommitLog  # noqa: E402
from broker.store.consume_queue import list_queues  # noqa: E402
from broker.store.generate import BROKER_NAME, TOPIC_PREFIX, GenerateSpec, generate_store  # noqa: E402
from pipelines.job_args import launch_conf_args  # noqa: E402

log = logging.getLogger("benchmarks.ingest")
GIB = 1 << 30
AVG_RECORD_BYTES = 1233  # measured mean stored record size of a generated store with 1 KiB bodies
SEGMENT_BYTES = GIB
INDEX_SLOTS = 500_000
INDEX_ENTRIES = 2_000_000
GOAL_MBPS = 300.0  # issue 12: 16 GiB of 1 KiB messages on local[2]
LOCAL_MASTER = "local[2]"
GOAL_RATIO = 10.0
DEFAULT_SIZES_GIB = (1.0, 4.0, 16.0)


def say(msg: str) -> None:
    """Progress (not figures) on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def venv_python() -> str:
    py = REPO / ".venv" / "bin" / "python"
    return str(py) if py.exists() else sys.executable


def size_label(gib: float) -> str:
    return f"{gib:g}"


# ---- store -----------------------------------------------------------------------------------------

def ensure_store(store: Path, gib: float, body_bytes: int) -> Path:
    spec_file = store / "bench-spec.json"
    messages = max(1000, int(gib * GIB * 0.99 / AVG_RECORD_BYTES))  # stays inside ceil(gib) segments
    want = {"gib": gib, "body_bytes": body_bytes, "messages": messages, "segment_bytes": SEGMENT_BYTES,
            "index_slots": INDEX_SLOTS, "index_entries": INDEX_ENTRIES}
    if spec_file.exists() and json.loads(spec_file.read_text()) == want:
        say(f"reusing {store} ({messages} messages)")
        return store
    if store.exists():
        shutil.rmtree(store)
    say(f"generating {messages} messages (~{gib:g} GiB of commitlog, ~{body_bytes} B bodies) into {store} …")
    t0 = time.perf_counter()
    step = max(1, messages // 10)
    last = [0]

    def progress(written: int, total: int) -> None:
        if written - last[0] >= step:
            last[0] = written
            say(f"  {written}/{total} messages ({time.perf_counter() - t0:.0f} s)")

    result = generate_store(store, GenerateSpec(messages=messages, body_bytes=body_bytes, segment_bytes=SEGMENT_BYTES,
                                                index_slots=INDEX_SLOTS, index_entries=INDEX_ENTRIES), progress)
    say(f"generated {result.bytes / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s")
    spec_file.write_text(json.dumps(want))
    return store


def drop_cache(root: Path) -> None:
    """Drop every file of ``root`` (a store) from the page cache."""
    for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def segment_extents(cl: CommitLog, data_end: int) -> list[tuple[Path, int, int]]:
    """(path, segment base, bytes holding data) of every segment with data."""
    out = []
    for seg in cl.segments:
        n = min(seg.path.stat().st_size, cl.segment_size, data_end - seg.base)
        if n > 0:
            out.append((seg.path, seg.base, n))
    return out


def raw_read(extents: list[tuple[Path, int, int]]) -> tuple[float, int]:
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    for path, _, length in extents:
        with open(path, "rb", buffering=0) as fh:
            left = length
            while left > 0:
                got = fh.readinto(view[:min(left, len(view))])
                if not got:
                    break
                left -= got
                total += got
    return time.perf_counter() - t0, total


def decode_all(cl: CommitLog, extents: list[tuple[Path, int, int]]) -> tuple[float, int, int, int]:
    """(seconds, records, bytes decoded, findings) of iter_decode over every segment, one process.

    Each segment is decoded up to the end of its data, as the ingest does (``untilOffset``): an
    unbounded decode of the last, preallocated segment also walks its zero-filled tail.
    """
    records = decoded = findings = 0
    t0 = time.perf_counter()
    for path, base, length in extents:
        stats = DecodeStats()
        with open(path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                for batch in iter_decode(mm, base, cl.segment_size, 0, length, file_name=str(path), stats=stats):
                    del batch
            finally:
                mm.close()
        records += stats.records
        decoded += stats.bytes_decoded
        findings += len(stats.findings)
    return time.perf_counter() - t0, records, decoded, findings


# ---- memory of a process tree -------------------------------------------------------------------------

EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


@dataclass
class Memory:
    """Resident memory of a set of processes: all of it, and the anonymous part alone.

    Why both: pages of files a process maps (the commitlog segments the decoder mmaps) count in RSS
    but are page cache the kernel can drop at any time; the anonymous part (heaps, Arrow buffers,
    the JVMs) is what the job really holds."""

    rss: int = 0
    anon: int = 0
    procs: int = 0


def proc_memory(pid: int) -> tuple[int, int] | None:
    """(RSS, anonymous RSS) in bytes from /proc/PID/status; None when the process is gone."""
    rss = anon = None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return (rss or 0, anon or 0) if rss is not None else None


def _is_executor(pid: int) -> bool:
    try:
        return EXECUTOR_MAIN.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def tree_memory(root: int, with_executors: bool = False) -> Memory:
    """Memory of ``root`` and all its live descendants; with ``with_executors`` also of every Spark
    standalone executor JVM on this machine and its descendants (on a cluster the executors and
    their Python workers are children of the worker daemons, not of spark-submit)."""
    from broker.server.launcher import iter_proc_stats

    children: dict[int, list[int]] = {}
    live: list[int] = []
    for pid, state, ppid, _ in iter_proc_stats():
        if state != "Z":
            children.setdefault(ppid, []).append(pid)
            live.append(pid)
    todo = [root] + ([pid for pid in live if _is_executor(pid)] if with_executors else [])
    seen: set[int] = set()
    mem = Memory()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        got = proc_memory(pid)
        if got is None:
            continue
        mem.rss += got[0]
        mem.anon += got[1]
        mem.procs += 1
        todo += children.get(pid, [])
    return mem


class PeakMemory(threading.Thread):
    """Samples :func:`tree_memory` of ``root`` every ``interval`` seconds and keeps the peaks
    (RSS, anonymous RSS and process count each peak on its own)."""

    def __init__(self, root: int, interval: float = 0.5, with_executors: bool = False) -> None:
        super().__init__(daemon=True)
        self.root, self.interval, self.with_executors = root, interval, with_executors
        self.peak = Memory()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while True:
            mem = tree_memory(self.root, self.with_executors)
            self.peak = Memory(max(self.peak.rss, mem.rss), max(self.peak.anon, mem.anon),
                               max(self.peak.procs, mem.procs))
            if self._stop_event.wait(self.interval):
                return

    def stop(self) -> Memory:
        self._stop_event.set()
        self.join()
        return self.peak


# ---- ingest with Spark --------------------------------------------------------------------------------

@dataclass
class IngestResult:
    seconds: float
    job_seconds: float | None
    master: str = LOCAL_MASTER
    rows: dict[str, int] = field(default_factory=dict)
    memory: Memory = field(default_factory=Memory)


def spark_submit_command(store: Path, lake: Path, master: str, split_bytes: int | None) -> list[str]:
    py = venv_python()
    spark_submit = Path(py).parent / "spark-submit"
    cmd = [str(spark_submit) if spark_submit.exists() else "spark-submit", "--master", master,
           "--conf", "spark.ui.showConsoleProgress=false", *launch_conf_args(),
           # the same interpreter for the driver's and the executors' Python workers: on a standalone
           # cluster on this machine the executors would otherwise start whatever python is on PATH
           "--conf", f"spark.pyspark.python={py}", "--conf", f"spark.pyspark.driver.python={py}",
           str(REPO / "jobs" / "ingest_commitlog.py"), "--store", f"{BROKER_NAME}={store}", "--lake", str(lake)]
    if split_bytes:
        cmd += ["--split-bytes", str(split_bytes)]
    return cmd


def run_ingest(store: Path, lake: Path, workdir: Path, split_bytes: int | None,
               master: str = LOCAL_MASTER) -> IngestResult:
    py = venv_python()
    cmd = spark_submit_command(store, lake, master, split_bytes)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=py, PYSPARK_DRIVER_PYTHON=py)
    err_path = workdir / "ingest.log"
    with open(err_path, "w") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True)
        sampler = PeakMemory(proc.pid, with_executors=master != LOCAL_MASTER)
        sampler.start()
        try:
            out, _ = proc.communicate()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            seconds = time.perf_counter() - t0
            sampler.stop()
    if proc.returncode != 0:
        tail = err_path.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"spark-submit exited with {proc.returncode}; last lines of {err_path}:\n" + "\n".join(tail))
    result = IngestResult(seconds, None, master=master, memory=sampler.peak)
    for line in out.splitlines():
        if line.startswith("ingest "):
            say(line)
            result.rows.update({k: int(v) for k, v in re.findall(r"(\w+) \+(\d+)", line)})
            m = re.search(r" in ([0-9.]+) s \(", line)
            if m:
                result.job_seconds = float(m.group(1))
    return result


# ---- the broker path ------------------------------------------------------------------------------

@dataclass
class BrokerResult:
    seconds: float
    startup_seconds: float
    messages: int
    bytes: int
    queues: int
    memory: Memory


def run_broker_path(store: Path, lake: Path, workdir: Path, max_bytes: int, batch_rows: int) -> BrokerResult:
    import pyarrow as pa
    from deltalake import write_deltalake

    from broker.client.consumer import PullConsumer, PullStatus
    from broker.server.launcher import start_broker, start_namesrv

    schema = pa.schema([("commitlog_offset", pa.int64()), ("topic", pa.string()), ("queue_id", pa.int32()),
                        ("queue_offset", pa.int64()), ("body", pa.binary()),
                        ("store_timestamp", pa.timestamp("ms", tz="UTC"))])
    local = [(t, q) for t, q in list_queues(store) if t.startswith(TOPIC_PREFIX)]
    t_start = time.perf_counter()
    ns_proc, ns_addr = start_namesrv(workdir)
    broker = None
    try:
        config = {"brokerName": BROKER_NAME, "mappedFileSizeCommitLog": SEGMENT_BYTES,
                  "maxHashSlotNum": INDEX_SLOTS, "maxIndexNum": INDEX_ENTRIES}
        broker = start_broker(store, ns_addr, config)
        with PullConsumer("bench-ingest-reader", ns_addr, timeout=30.0) as consumer:
            queues = []
            for topic in sorted({t for t, _ in local}):
                ids = {q for t, q in local if t == topic}
                deadline = time.monotonic() + 60
                while True:  # the broker registers its topics with the name server shortly after listening
                    try:
                        found = [mq for mq in consumer.queues(topic) if mq.queue_id in ids]
                    except Exception:
                        found = []
                    if found or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                if not found:
                    raise RuntimeError(f"no route for {topic} after 60 s (see {broker.log})")
                queues += found
            startup = time.perf_counter() - t_start
            say(f"broker up in {startup:.1f} s; pulling {len(queues)} queues of {TOPIC_PREFIX}* "
                f"(at most {max_bytes / GIB:g} GiB) …")
            drop_cache(store)
            sampler = PeakMemory(os.getpid())
            sampler.start()
            cols: dict[str, list] = {name: [] for name in schema.names}
            messages = pulled = 0

            def flush() -> None:
                if cols["commitlog_offset"]:
                    write_deltalake(str(lake), pa.table(cols, schema=schema), mode="append")
                    for v in cols.values():
                        v.clear()

            t0 = time.perf_counter()
            offsets = {mq: 0 for mq in queues}
            active = list(queues)
            next_report = time.monotonic() + 15
            while active and pulled < max_bytes:
                for mq in list(active):
                    res = consumer.pull(mq, offsets[mq], 32)
                    if res.status is PullStatus.FOUND and res.messages:
                        for m in res.messages:
                            cols["commitlog_offset"].append(m.physical_offset)
                            cols["topic"].append(m.topic)
                            cols["queue_id"].append(m.queue_id)
                            cols["queue_offset"].append(m.queue_offset)
                            cols["body"].append(m.payload)
                            cols["store_timestamp"].append(m.store_timestamp)
                            pulled += m.total_size
                        messages += len(res.messages)
                    if res.next_begin_offset > offsets[mq]:
                        offsets[mq] = res.next_begin_offset
                    elif res.status is not PullStatus.FOUND:
                        active.remove(mq)  # no new message: this queue is drained
                    if len(cols["commitlog_offset"]) >= batch_rows:
                        flush()
                    if pulled >= max_bytes:
                        break
                if time.monotonic() > next_report:
                    next_report += 15
                    el = time.perf_counter() - t0
                    say(f"  broker path: {messages} messages, {pulled / 1e6:.0f} MB in {el:.0f} s "
                        f"({pulled / 1e6 / el:.1f} MB/s)")
            flush()
            seconds = time.perf_counter() - t0
            peak = sampler.stop()
        return BrokerResult(seconds, startup, messages, pulled, len(queues), peak)
    finally:
        if broker is not None:
            code = broker.stop()
            if code not in (0, -signal.SIGTERM):
                say(f"broker exited with {code} (log: {broker.log})")
            cfg = store.parent / f"broker-{broker.port}.toml"
            cfg.unlink(missing_ok=True)
            if code in (0, -signal.SIGTERM):
                broker.log.unlink(missing_ok=True)
        ns_proc.send_signal(signal.SIGTERM)
        try:
            ns_proc.wait(10)
        except subprocess.TimeoutExpired:
            ns_proc.kill()
            ns_proc.wait()


# ---- one size ------------------------------------------------------------------------------------------

@dataclass
class SizeResult:
    gib: float
    data_bytes: int
    records: int
    raw_cold: float
    raw_warm: float
    decode_mbps: float
    decode_mps: float
    ingests: list[IngestResult] = field(default_factory=list)  # one per --master, in order
    broker: BrokerResult | None = None

    def mbps(self, ing: IngestResult) -> float:
        return self.data_bytes / 1e6 / ing.seconds

    def mps(self, ing: IngestResult) -> float:
        return ing.rows.get("messages", self.records) / ing.seconds

    @property
    def ingest(self) -> IngestResult:
        """The first master's run (local[2] unless --master says otherwise): the goal's figure."""
        return self.ingests[0]

    @property
    def ingest_mbps(self) -> float:
        return self.mbps(self.ingest)

    @property
    def ingest_mps(self) -> float:
        return self.mps(self.ingest)


def needed_bytes(store: Path, gib: float, with_broker: float) -> int:
    """Rough free space one size needs: the store (unless already there), the lake, the broker lake."""
    store_ready = (store / "bench-spec.json").exists()
    return int(((0 if store_ready else 1.15 * gib) + 1.0 * gib + with_broker + 0.5) * GIB)


def mb(n: float) -> str:
    return f"{n / 1e6:,.0f}"


def measure_size(gib: float, args: argparse.Namespace, with_broker: bool) -> SizeResult:
    store = ensure_store(args.root / f"ingest-{size_label(gib)}g", gib, args.body_bytes)
    cl = CommitLog.open(store)
    data_start = cl.min_offset
    data_end = cl.data_end()
    data_bytes = data_end - data_start
    extents = segment_extents(cl, data_end)
    say(f"store {store}: {len(cl.segments)} segment(s), {mb(data_bytes)} MB of commitlog")

    drop_cache(store)
    cold_s, read_bytes = raw_read(extents)
    warm_s, _ = raw_read(extents)
    raw_cold, raw_warm = read_bytes / 1e6 / cold_s, read_bytes / 1e6 / warm_s
    say(f"raw read cold {raw_cold:.0f} MB/s, warm {raw_warm:.0f} MB/s")

    dec_s, records, decoded, findings = decode_all(cl, extents)
    say(f"decode only {decoded / 1e6 / dec_s:.0f} MB/s ({records / dec_s:,.0f} messages/s), {findings} findings")
    result = SizeResult(gib, data_bytes, records, raw_cold, raw_warm, decoded / 1e6 / dec_s, records / dec_s)

    workdir = Path(tempfile.mkdtemp(prefix=f"ingest-{size_label(gib)}g-", dir=args.root))
    try:
        for master in args.master:
            drop_cache(store)
            say(f"spark-submit --master {master} jobs/ingest_commitlog.py (cold page cache) …")
            ing = run_ingest(store, workdir / "lake", workdir, args.split_bytes, master)
            say(f"ingest on {master}: {ing.seconds:.1f} s wall, peak RSS {ing.memory.rss / 2**20:.0f} MiB "
                f"(anonymous {ing.memory.anon / 2**20:.0f} MiB)")
            if ing.rows.get("messages") not in (None, records):
                say(f"WARNING: messages table got {ing.rows.get('messages')} rows, decode saw {records} records")
            shutil.rmtree(workdir / "lake", ignore_errors=True)
            result.ingests.append(ing)
        if with_broker:
            result.broker = run_broker_path(store, workdir / "broker-lake", workdir,
                                            int(args.broker_max_gib * GIB), args.batch_rows)
            b = result.broker
            say(f"broker path {b.bytes / 1e6 / b.seconds:.1f} MB/s ({b.messages / b.seconds:,.0f} messages/s)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.remove_stores:
        shutil.rmtree(store, ignore_errors=True)
    return result


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def print_size(r: SizeResult) -> None:
    print(f"== {r.gib:g} GiB store: {mb(r.data_bytes)} MB of commitlog, {r.records:,} messages")
    print(f"raw read      cold {r.raw_cold:8.0f} MB/s   warm {r.raw_warm:8.0f} MB/s")
    print(f"decode only        {r.decode_mbps:8.0f} MB/s   ({r.decode_mps:,.0f} messages/s, one process, warm)")
    for ing in r.ingests:
        job = f", job itself {ing.job_seconds:.1f} s" if ing.job_seconds else ""
        print(f"ingest e2e         {r.mbps(ing):8.1f} MB/s   ({r.mps(ing):,.0f} messages/s; "
              f"{ing.seconds:.1f} s wall incl. JVM start{job}; cold; master {ing.master})")
        if ing.job_seconds:
            print(f"ingest, job time   {r.data_bytes / 1e6 / ing.job_seconds:8.1f} MB/s   "
                  f"(without spark-submit/JVM start-up; master {ing.master})")
        print("ingest rows        " + ", ".join(f"{k} {v:,}" for k, v in ing.rows.items()))
        where = ("JVM + Python driver/workers" if ing.master == LOCAL_MASTER
                 else "driver JVM + Python, executor JVMs + their Python workers")
        print(f"ingest peak memory {mib(ing.memory.rss):>8} MiB RSS, {mib(ing.memory.anon)} MiB anonymous "
              f"(process tree: {where}, up to {ing.memory.procs} processes; master {ing.master})")
    if r.broker:
        b = r.broker
        print(f"broker path        {b.bytes / 1e6 / b.seconds:8.1f} MB/s   ({b.messages / b.seconds:,.0f} messages/s; "
              f"{b.messages:,} messages, {mb(b.bytes)} MB from {b.queues} queues in {b.seconds:.1f} s; "
              f"broker start {b.startup_seconds:.1f} s not counted; peak RSS {mib(b.memory.rss)} MiB)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--sizes-gib", type=float, nargs="+", default=list(DEFAULT_SIZES_GIB), metavar="GIB",
                    help="store sizes in GiB of commitlog (default: 1 4 16)")
    ap.add_argument("--master", action="append", metavar="MASTER",
                    help="Spark master of the ingest runs, e.g. spark://127.0.0.1:7077 for the standalone "
                         "cluster of `make cluster-up`; repeat it to run the ingest on several "
                         f"(default: {LOCAL_MASTER})")
    ap.add_argument("--broker-max-gib", type=float, default=1.0,
                    help="GiB of commitlog the broker path pulls at most, on the smallest size (default 1; 0 skips it)")
    ap.add_argument("--body-bytes", type=int, default=1024)
    ap.add_argument("--split-bytes", type=int, default=None, help="passed to the ingest job (default: the job's)")
    ap.add_argument("--batch-rows", type=int, default=50_000, help="rows per Delta append on the broker path")
    ap.add_argument("--root", type=Path, default=REPO / "build" / "bench",
                    help="where stores ingest-<size>g and temporary lakes go (default build/bench)")
    ap.add_argument("--remove-stores", action="store_true", help="delete each generated store after measuring it")
    ap.add_argument("--generate-only", action="store_true",
                    help="only generate (or check) the stores, measure nothing (e.g. ahead of a quiet machine)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if any(g <= 0 for g in args.sizes_gib):
        ap.error("--sizes-gib must be > 0")
    args.master = args.master or [LOCAL_MASTER]
    for master in args.master:
        if not re.fullmatch(r"local(\[(\d+|\*)\])?|spark://[^/:\s]+:\d+(,[^/:\s]+:\d+)*", master):
            ap.error(f"--master {master!r}: expected local[N] or spark://HOST:PORT")
    args.root = args.root.resolve()
    args.root.mkdir(parents=True, exist_ok=True)
    sizes = sorted(set(args.sizes_gib))

    results: list[SizeResult] = []
    skipped: list[str] = []
    for i, gib in enumerate(sizes):
        with_broker = i == 0 and args.broker_max_gib > 0
        store = args.root / f"ingest-{size_label(gib)}g"
        need = needed_bytes(store, gib, min(args.broker_max_gib, gib) if with_broker else 0.0)
        free = shutil.disk_usage(args.root).free
        if need > free:
            msg = (f"skipping {gib:g} GiB: needs about {need / GIB:.1f} GiB free (store + lake), "
                   f"only {free / GIB:.1f} GiB free under {args.root}")
            say(msg)
            skipped.append(msg)
            continue
        if args.generate_only:
            ensure_store(store, gib, args.body_bytes)
            continue
        r = measure_size(gib, args, with_broker)
        results.append(r)
        print_size(r)
        sys.stdout.flush()

    if args.generate_only:
        return 0
    if not results:
        print("nothing measured: " + "; ".join(skipped))
        return 1
    print("== summary")
    ref = results[-1]
    print(f"ingest end to end  {ref.ingest_mbps:8.1f} MB/s   {ref.ingest_mps:,.0f} messages/s   "
          f"({ref.gib:g} GiB store, {ref.ingest.master}; goal {GOAL_MBPS:.0f} MB/s: "
          f"{'met' if ref.ingest_mbps >= GOAL_MBPS else 'NOT met'}, {ref.ingest_mbps / GOAL_MBPS:.0%} of it)")
    for ing in ref.ingests[1:]:
        print(f"ingest end to end  {ref.mbps(ing):8.1f} MB/s   {ref.mps(ing):,.0f} messages/s   "
              f"({ref.gib:g} GiB store, {ing.master})")
    print(f"decode only        {ref.decode_mbps:8.0f} MB/s   {ref.decode_mps:,.0f} messages/s (one process)")
    print(f"raw read           {ref.raw_cold:8.0f} MB/s cold, {ref.raw_warm:.0f} MB/s warm")
    print(f"peak memory        {mib(ref.ingest.memory.rss):>8} MiB RSS, {mib(ref.ingest.memory.anon)} MiB anonymous "
          f"(ingest process tree, {ref.ingest.master})")
    with_b = next((r for r in results if r.broker), None)
    if with_b:
        b = with_b.broker
        b_mbps = b.bytes / 1e6 / b.seconds
        ratio = with_b.ingest_mbps / b_mbps if b_mbps else float("inf")
        print(f"ingest / broker path  {ratio:8.1f}x   ({with_b.ingest_mbps:.1f} vs {b_mbps:.1f} MB/s on the "
              f"{with_b.gib:g} GiB store; goal >= {GOAL_RATIO:.0f}x: {'met' if ratio >= GOAL_RATIO else 'NOT met'})")
    if len(results) > 1 or len(args.master) > 1:
        print("size      master                     MB/s   s/GiB (wall)   s/GiB (job)   peak RSS MiB   peak anon MiB")
        for r in results:
            gib_data = r.data_bytes / GIB
            for ing in r.ingests:
                job = f"{ing.job_seconds / gib_data:11.1f}" if ing.job_seconds else f"{'-':>11}"
                print(f"{r.gib:5g} GiB  {ing.master:22s} {r.mbps(ing):8.1f}   {ing.seconds / gib_data:12.1f}   {job}   "
                      f"{mib(ing.memory.rss):>12}   {mib(ing.memory.anon):>13}")
    for msg in skipped:
        print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
