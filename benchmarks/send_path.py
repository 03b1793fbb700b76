"""Broker send throughput and latency, next to the raw append speed of the same bytes, same run.

    .venv/bin/python benchmarks/send_path.py [--seconds 10] [--producers 4] [--threads 4] [--rate 5000]
        [--rates 1000 5000 10000] [--raw-messages 100000] [--skip-cpp] [--skip-sync-flush] [--root DIR]

(``make bench-broker``; a smoke run in seconds: ``--seconds 1 --producers 1 --threads 1
--rates 500 --raw-messages 1000``.)

Starts a name server and a broker (ASYNC_FLUSH, loopback) in a temporary directory, then measures
for 1 KiB messages:

1. raw append: the same records appended in-process with ``CommitLogWriter`` (no network), and a
   plain ``write`` of the same bytes — the ceiling the broker could reach on this machine;
2. pipelined load: 2 processes × 4 connections × 16 requests in flight of pre-encoded frames (the
   load generator costs the shared cores little), then the same generator paced at each of
   ``--rates`` msg/s (open loop) for p50/p99 at fixed offered rates;
3. saturation: ``--producers`` processes × ``--threads`` threads of our Python Producer (sync sends);
4. fixed rate: ``--rate`` msg/s spread over the producers;
5. the C++ client (``rocketmq`` wheel) with the same number of producer processes;
6. phase 2 again on a SYNC_FLUSH broker (``--skip-sync-flush`` leaves it out);
7. replication (``--skip-replication`` leaves it out): the pipelined load on an ASYNC_MASTER and
   then a SYNC_MASTER, each with a slave broker on the same machine, next to phase 2's figure (no
   slave) — with the slave's lag sampled every 50 ms from both brokers' ``commitLogMaxOffset``
   (GET_BROKER_RUNTIME_INFO, what ``mqadmin brokerStatus`` shows): in bytes, and in ms as the time
   from the master holding a byte to the slave holding it; then how long the slave takes to catch up
   after the load stops.

After each phase, the CPU per acknowledged message of each broker process (store, dispatcher,
network processes together) and of the load generator, from /proc.

Goal on 2 cores: >= 20,000 msg/s; p99 < 10 ms at 5,000 msg/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from broker.store.commitlog import CommitLogWriter  # noqa: E402
from broker.store.hosts import Host  # noqa: E402
from broker.store.message import MessageRecord  # noqa: E402
from broker.server.launcher import start_broker, start_namesrv  # noqa: E402

BODY = b"x" * 1024
TOPIC = "BenchTopic"


def raw_append(n: int, directory: Path) -> tuple[float, float, float]:
    """(records/s through CommitLogWriter, MB/s, MB/s of a plain write of the same bytes)."""
    rec = MessageRecord(topic=TOPIC, body=BODY, properties_raw="UNIQ_KEY\x01" + "A" * 32 + "\x02CLUSTER\x01DefaultCluster",
                        born_host=Host(bytes([127, 0, 0, 1]), 5000), store_host=Host(bytes([127, 0, 0, 1]), 10911))
    t0 = time.perf_counter()
    with CommitLogWriter(directory / "append", segment_size=1 << 30) as w:
        for _ in range(n):
            w.append(rec, store_timestamp=1)
        end = w.write_offset
    dt = time.perf_counter() - t0
    data = rec.encode() * 1000
    t1 = time.perf_counter()
    with open(directory / "plain", "wb") as fh:
        for _ in range(n // 1000):
            fh.write(data)
        fh.flush()
    dt_plain = time.perf_counter() - t1
    return n / dt, end / dt / 1e6, len(data) * (n // 1000) / dt_plain / 1e6


def _producer(namesrv: str, seconds: float, threads: int, rate: float, out) -> None:
    import threading

    from broker.client import Message, Producer

    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    with Producer(f"PG_BENCH_{os.getpid()}", namesrv) as producer:
        producer.send(Message(TOPIC, BODY))  # route + connection warm-up
        start, cpu0 = time.perf_counter(), time.process_time()
        deadline = start + seconds
        interval = threads / rate if rate else 0.0

        def run() -> None:
            mine = []
            next_at = time.perf_counter()
            while True:
                now = time.perf_counter()
                if now >= deadline:
                    break
                if interval:
                    if now < next_at:
                        time.sleep(next_at - now)
                    next_at += interval
                t = time.perf_counter()
                try:
                    producer.send(Message(TOPIC, BODY))
                    mine.append(time.perf_counter() - t)
                except Exception:
                    errors[0] += 1
            with lock:
                latencies.extend(mine)

        workers = [threading.Thread(target=run) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        result = {"lat": latencies, "errors": errors[0], "cpu": time.process_time() - cpu0,
                  "elapsed": time.perf_counter() - start}
    out.put(result)


def _run_processes(target, args: tuple, processes: int, seconds: float) -> dict:
    """Run ``target(*args, queue)`` in ``processes`` spawned processes; merge their latencies."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, q)) for _ in range(processes)]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return summarize(results, seconds)


def run_python_producers(namesrv: str, processes: int, threads: int, seconds: float, rate: float = 0.0) -> dict:
    return _run_processes(_producer, (namesrv, seconds, threads, rate / processes if rate else 0.0), processes,
                          seconds)


CPP_SCRIPT = r"""
import json, sys, time
from rocketmq.client import Producer, Message
ns, seconds = sys.argv[1], float(sys.argv[2])
p = Producer("PG_CPP_BENCH"); p.set_namesrv_addr(ns); p.start()
body = b"x" * 1024
m = Message("BenchTopic"); m.set_body(body); p.send_sync(m)
lat, errors = [], 0
start, cpu0 = time.perf_counter(), time.process_time()
deadline = start + seconds
while time.perf_counter() < deadline:
    m = Message("BenchTopic"); m.set_body(body)
    t = time.perf_counter()
    try:
        p.send_sync(m); lat.append(time.perf_counter() - t)
    except Exception:
        errors += 1
cpu, elapsed = time.process_time() - cpu0, time.perf_counter() - start
p.shutdown()
print(json.dumps({"lat": lat, "errors": errors, "cpu": cpu, "elapsed": elapsed}))
"""


def run_cpp_producers(namesrv: str, processes: int, seconds: float, workdir: Path) -> dict:
    env = dict(os.environ, HOME=str(workdir))
    procs = [subprocess.Popen([sys.executable, "-c", CPP_SCRIPT, namesrv, str(seconds)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, cwd=workdir) for _ in range(processes)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return summarize(results, seconds)


def _send_frames(ext: dict[str, str]) -> tuple[bytes, bytes]:
    """A SEND_MESSAGE_V2 frame split around its opaque: ``prefix + str(opaque) + suffix`` is the JSON
    header of request ``opaque`` (the layout ``RemotingCommand.encode`` writes; checked here)."""
    from broker.remoting.codes import RequestCode
    from broker.remoting.command import RemotingCommand

    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, BODY)
    cmd.opaque = _OPAQUE_MARK
    header = cmd.encode_json_header()
    prefix, sep, suffix = header.partition(b'"opaque":%d' % _OPAQUE_MARK)
    assert sep, "the JSON header has no opaque to patch"
    return prefix + b'"opaque":', suffix


_OPAQUE_MARK = 987654321


def _pipelined(broker_addr: str, seconds: float, connections: int, window: int, rate: float, out) -> None:
    """A load generator that costs the broker's cores little: raw frames pre-encoded once (only
    the opaque changes), replies parsed for their opaque and code only, ``window`` requests in
    flight per connection — or, with ``rate`` > 0, an open-loop paced load of ``rate`` msg/s over
    all connections, latency counted from each send's scheduled time (no coordinated omission)."""
    import asyncio
    import json
    import struct

    from broker.remoting.headers import SendMessageRequestHeader

    host, _, port = broker_addr.rpartition(":")
    ext = SendMessageRequestHeader(producer_group="PG_PIPE", topic=TOPIC, default_topic="TBW102",
                                   default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=0, flag=0,
                                   properties="WAIT\x01true", reconsume_times=0, unit_mode=False,
                                   batch=False).to_ext(v2=True)
    two_ints = struct.Struct(">II")
    lat: list[float] = []
    errors = [0]
    last_ack = [0.0]

    class Lane(asyncio.Protocol):
        def __init__(self, qid: int) -> None:
            self.prefix, self.suffix = _send_frames(dict(ext, e=str(qid)))
            self.sent: dict[int, float] = {}
            self.buf = bytearray()
            self.next_opaque = 1
            self.transport: asyncio.Transport | None = None
            self.done = asyncio.get_running_loop().create_future()

        def connection_made(self, transport) -> None:
            self.transport = transport

        def send(self, at: float) -> None:
            opaque = self.next_opaque
            self.next_opaque += 1
            header = self.prefix + str(opaque).encode() + self.suffix
            self.sent[opaque] = at
            self.transport.write(two_ints.pack(4 + len(header) + len(BODY), len(header)) + header + BODY)

        def data_received(self, data: bytes) -> None:
            self.buf += data
            pos, buf, now = 0, self.buf, time.perf_counter()
            replies = 0
            while len(buf) - pos >= 8:
                total, hlen = two_ints.unpack_from(buf, pos)
                if len(buf) - pos < 4 + total:
                    break
                header = json.loads(bytes(buf[pos + 8:pos + 8 + (hlen & 0xFFFFFF)]))
                pos += 4 + total
                at = self.sent.pop(header["opaque"], None)
                if at is None:
                    continue
                if header["code"] == 0:
                    lat.append(now - at)
                    last_ack[0] = now
                else:
                    errors[0] += 1
                replies += 1
            del buf[:pos]
            if not rate and time.perf_counter() < deadline:
                for _ in range(replies):
                    self.send(time.perf_counter())
            if not self.sent and time.perf_counter() >= deadline and not self.done.done():
                self.done.set_result(None)

        def connection_lost(self, exc) -> None:
            errors[0] += len(self.sent)
            if not self.done.done():
                self.done.set_result(None)

    async def run() -> None:
        nonlocal deadline, start, cpu0
        loop = asyncio.get_running_loop()
        lanes = []
        for i in range(connections):
            lane = Lane(i % 4)
            await loop.create_connection(lambda lane=lane: lane, host, int(port))
            lanes.append(lane)
        start, cpu0 = time.perf_counter(), time.process_time()
        deadline = start + seconds
        if rate:  # open loop: send whatever is due, then sleep until the next is
            interval = connections / rate
            due = [start + i * interval / connections for i in range(connections)]
            while True:
                now = time.perf_counter()
                if now >= deadline:
                    break
                for i, lane in enumerate(lanes):
                    while due[i] <= now and due[i] < deadline:
                        lane.send(due[i])
                        due[i] += interval
                await asyncio.sleep(max(0.0, min(due) - time.perf_counter()))
        else:
            for lane in lanes:
                for _ in range(window):
                    lane.send(time.perf_counter())
        await asyncio.wait_for(asyncio.gather(*(lane.done for lane in lanes if lane.sent)), 30.0)
        for lane in lanes:
            lane.transport.close()

    deadline = start = cpu0 = 0.0
    asyncio.run(run())
    out.put({"lat": lat, "errors": errors[0], "cpu": time.process_time() - cpu0,
             "elapsed": max(last_ack[0], deadline) - start})


def run_pipelined(broker_addr: str, processes: int, connections: int, window: int, seconds: float,
                  rate: float = 0.0) -> dict:
    return _run_processes(_pipelined, (broker_addr, seconds, connections, window, rate / processes), processes,
                          seconds)


class CpuMeter:
    """CPU seconds (user + system, from /proc) of the broker's processes by name and of the load
    generators, over one phase: the figures behind "CPU per message for each process"."""

    def __init__(self, broker_pgid: int) -> None:
        self.pgid = broker_pgid
        self.start: dict[int, float] = {}

    def _broker_pids(self) -> dict[int, str]:
        from broker.server.launcher import iter_proc_stats
        from broker.server.linux_process import process_name

        return {pid: process_name(pid) for pid, state, _, group in iter_proc_stats()
                if group == self.pgid and state != "Z"}

    @staticmethod
    def _cpu(pid: int) -> float:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> "CpuMeter":
        self.names = self._broker_pids()
        self.start = {pid: self._cpu(pid) for pid in self.names}
        return self

    def __exit__(self, *exc) -> None:
        self.used: dict[str, float] = {}
        for pid, name in self.names.items():
            if name.startswith("rl-"):
                key = "network" if name.startswith("rl-net") else name[3:]
                self.used[key] = self.used.get(key, 0.0) + self._cpu(pid) - self.start[pid]

    def per_message(self, result: dict) -> str:
        """CPU per acknowledged message: each broker process kind, the load generator (measured in
        its own processes over the sending phase, without their start-up), and the sum."""
        messages = result["msgs"]
        self.used["load generator"] = result["cpu"]
        # a fixed order, whatever order the processes started in (pids)
        order = {name: i for i, name in enumerate(("store", "dispatch", "network", "load generator"))}
        used = sorted(self.used.items(), key=lambda item: order.get(item[0], len(order)))
        parts = [f"{name} {1e6 * sec / max(messages, 1):.0f}" for name, sec in used]
        total = sum(self.used.values())
        return f"cpu per message (us): {', '.join(parts)}; total {1e6 * total / max(messages, 1):.0f}"


def summarize(results: list[dict], seconds: float) -> dict:
    """Merge the load processes' results: acknowledged msg/s over the phase (until the last
    acknowledgement: a backlog drained after the deadline does not count as sustained rate),
    latency percentiles, errors, and the load generators' own CPU seconds."""
    lat = sorted(x for r in results for x in r["lat"])
    errors = sum(r["errors"] for r in results)
    cpu = sum(r["cpu"] for r in results)
    elapsed = max([seconds, *(r["elapsed"] for r in results)])
    if not lat:
        return {"msgs": 0, "rate": 0.0, "p50_ms": None, "p99_ms": None, "errors": errors, "cpu": cpu}
    return {"msgs": len(lat), "rate": len(lat) / elapsed, "p50_ms": 1000 * statistics.median(lat),
            "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], "errors": errors, "cpu": cpu}


def line(name: str, r: dict) -> str:
    p50 = f"{r['p50_ms']:.2f}" if r["p50_ms"] is not None else "-"
    p99 = f"{r['p99_ms']:.2f}" if r["p99_ms"] is not None else "-"
    return f"{name:<44} {r['rate']:>10,.0f} msg/s   p50 {p50:>7} ms   p99 {p99:>7} ms   errors {r['errors']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--producers", type=int, default=4, help="producer processes")
    ap.add_argument("--threads", type=int, default=4, help="threads per Python producer process")
    ap.add_argument("--rate", type=float, default=5000.0, help="fixed-rate phase of the Python producers, msg/s in total")
    ap.add_argument("--rates", type=float, nargs="*", default=[1000.0, 5000.0, 10000.0],
                    help="offered rates of the paced pipelined load, msg/s in total (default 1000 5000 10000)")
    ap.add_argument("--skip-cpp", action="store_true")
    ap.add_argument("--skip-sync-flush", action="store_true", help="no SYNC_FLUSH phases at the end")
    ap.add_argument("--skip-replication", action="store_true", help="no master/slave phases at the end")
    ap.add_argument("--raw-messages", type=int, default=100_000,
                    help="records of the raw-append measurement (default 100000, at least 1000)")
    ap.add_argument("--root", type=Path, default=None,
                    help="directory the temporary name-server/broker directory is made in (default: system temp)")
    args = ap.parse_args(argv)
    if args.raw_messages < 1000:
        ap.error("--raw-messages must be >= 1000")
    if args.seconds <= 0 or args.producers < 1 or args.threads < 1:
        ap.error("--seconds must be > 0, --producers and --threads >= 1")
    if any(r <= 0 for r in args.rates):
        ap.error("--rates must be > 0")
    if args.root is not None:
        args.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rocketlake-bench-", dir=args.root) as tmp:
        tmp = Path(tmp)
        recs, mbs, plain = raw_append(args.raw_messages, tmp)
        print(f"{'raw append (CommitLogWriter, in-process)':<44} {recs:>10,.0f} msg/s   {mbs:,.0f} MB/s "
              f"(plain write of the same bytes: {plain:,.0f} MB/s)")
        ns, ns_addr = start_namesrv(tmp)
        broker = start_broker(tmp / "store", ns_addr, {"mappedFileSizeCommitLog": 1 << 30})
        try:
            pipe = pipelined_phases(broker, args, "")
            with CpuMeter(broker.proc.pid) as cpu:
                sat = run_python_producers(ns_addr, args.producers, args.threads, args.seconds)
            print(line(f"python producers {args.producers}x{args.threads} (saturation)", sat))
            print("  " + cpu.per_message(sat))
            fixed = run_python_producers(ns_addr, args.producers, args.threads, args.seconds, args.rate)
            print(line(f"python producers at {args.rate:,.0f} msg/s", fixed))
            if not args.skip_cpp:
                with CpuMeter(broker.proc.pid) as cpu:
                    cpp = run_cpp_producers(ns_addr, args.producers, args.seconds, tmp)
                print(line(f"C++ producers x{args.producers} (sync)", cpp))
                print("  " + cpu.per_message(cpp))
            print(f"broker vs raw append: {max(sat['rate'], pipe['rate']) / recs:.1%} "
                  "(goal: >= 20,000 msg/s; p99 < 10 ms at 5,000 msg/s)")
            broker.stop()
            if not args.skip_sync_flush:
                sync_flush_phases(tmp, ns_addr, args)
            if not args.skip_replication:
                replication_phases(tmp, ns_addr, args, pipe)
        finally:
            broker.stop()
            ns.terminate()
            ns.wait(10)
    return 0


def pipelined_phases(broker, args: argparse.Namespace, label: str) -> dict:
    """The pipelined load at saturation, then paced at each of ``args.rates``; returns the first."""
    run_pipelined(broker.addr, 1, 1, 1, min(1.0, args.seconds))  # topic, routes and connections warm
    with CpuMeter(broker.proc.pid) as cpu:
        pipe = run_pipelined(broker.addr, 2, 4, 16, args.seconds)
    print(line(f"{label}pipelined load: 2 procs x 4 conns x 16 in flight", pipe))
    print("  " + cpu.per_message(pipe))
    for rate in args.rates:
        with CpuMeter(broker.proc.pid) as cpu:
            paced = run_pipelined(broker.addr, 2, 4, 0, args.seconds, rate)
        print(line(f"{label}pipelined at {rate:,.0f} msg/s offered", paced))
        print("  " + cpu.per_message(paced))
    return pipe


def sync_flush_phases(tmp: Path, ns_addr: str, args: argparse.Namespace) -> None:
    """The pipelined and paced loads again on a SYNC_FLUSH broker: every acknowledgement waits for
    its group's fsync (the figures the ASYNC_FLUSH goals are reported beside)."""
    broker = start_broker(tmp / "store-sync", ns_addr, {"mappedFileSizeCommitLog": 1 << 30,
                                                        "flushDiskType": "SYNC_FLUSH"})
    try:
        pipelined_phases(broker, args, "SYNC_FLUSH ")
    finally:
        broker.stop()


def commitlog_max_offset(addr: str) -> int:
    """The broker's ``commitLogMaxOffset`` from GET_BROKER_RUNTIME_INFO (a slave's: what it holds)."""
    from broker.remoting.codes import RequestCode
    from broker.remoting.command import RemotingCommand
    from broker.remoting.transport import SyncRemotingClient

    with SyncRemotingClient(addr) as client:
        reply = client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), timeout=5)
    return int(json.loads(reply.body)["table"]["commitLogMaxOffset"])


class LagSampler:
    """Samples the master's and the slave's ``commitLogMaxOffset`` every ``interval`` s on a thread.

    Lag in bytes is the difference at one sample; lag in ms, for each master sample, is the time
    until the slave's offset passed it, interpolated between the two slave samples around that moment
    (the time a byte the master held took to be on the slave)."""

    def __init__(self, master: str, slave: str, interval: float = 0.05) -> None:
        import threading

        self.master, self.slave, self.interval = master, slave, interval
        self.samples: list[tuple[float, int, int]] = []  # (monotonic s, master offset, slave offset)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            # the slave read between two reads of the master: the master's offset at that moment is
            # taken as their midpoint (one read after the other would count the time between as lag)
            before, held, after = (commitlog_max_offset(self.master), commitlog_max_offset(self.slave),
                                   commitlog_max_offset(self.master))
            self.samples.append((t, (before + after) // 2, held))
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t)))

    def __enter__(self) -> "LagSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        lag_bytes = [max(0, m - s) for _, m, s in self.samples]
        lag_ms = []
        for i, (t, m, s) in enumerate(self.samples):
            if s >= m:
                lag_ms.append(0.0)
                continue
            # the moment the slave's offset passed m, interpolated between the two samples around it
            prev_t, prev_s = t, s
            for t2, _, s2 in self.samples[i + 1:]:
                if s2 >= m:
                    lag_ms.append(1000 * (prev_t + (t2 - prev_t) * (m - prev_s) / (s2 - prev_s) - t))
                    break
                prev_t, prev_s = t2, s2
        pct = lambda xs, q: sorted(xs)[min(len(xs) - 1, int(len(xs) * q))] if xs else 0  # noqa: E731
        return {"samples": len(self.samples), "bytes_mean": statistics.fmean(lag_bytes) if lag_bytes else 0,
                "bytes_max": max(lag_bytes, default=0), "ms_p50": pct(lag_ms, 0.5), "ms_p99": pct(lag_ms, 0.99),
                "ms_max": max(lag_ms, default=0)}


def replication_phases(tmp: Path, ns_addr: str, args: argparse.Namespace, no_slave: dict) -> None:
    """The pipelined load on an ASYNC_MASTER and on a SYNC_MASTER, each with a slave on this machine
    (its three processes share the two cores with the master's and the load's), beside ``no_slave``
    (phase 2 of the same run): send rate, p99, and the slave's lag."""
    from broker.server.launcher import free_port

    rates = {"no slave": no_slave}
    for role in ("ASYNC_MASTER", "SYNC_MASTER"):
        ha_port = free_port()
        name = f"bench-{role.lower()}"
        common = {"mappedFileSizeCommitLog": 1 << 30, "brokerName": name}
        master = start_broker(tmp / f"store-{role}", ns_addr, {**common, "brokerRole": role, "haListenPort": ha_port})
        slave = None
        try:
            slave = start_broker(tmp / f"store-{role}-slave", ns_addr,
                                 {**common, "brokerRole": "SLAVE", "brokerId": 1,
                                  "haMasterAddress": f"127.0.0.1:{ha_port}"})
            run_pipelined(master.addr, 1, 1, 1, min(1.0, args.seconds))  # topic, routes, connections, HA link
            with CpuMeter(master.proc.pid) as cpu, LagSampler(master.addr, slave.addr) as lag:
                pipe = run_pipelined(master.addr, 2, 4, 16, args.seconds)
            print(line(f"{role} + slave: pipelined load", pipe))
            print("  " + cpu.per_message(pipe))
            lag_stats = lag.summary()
            target, t0 = commitlog_max_offset(master.addr), time.monotonic()
            while commitlog_max_offset(slave.addr) < target and time.monotonic() - t0 < 60:
                time.sleep(0.01)
            caught_up = time.monotonic() - t0
            print(f"  slave lag under load ({lag_stats['samples']} samples): {lag_stats['bytes_mean'] / 1024:,.0f} KiB "
                  f"mean, {lag_stats['bytes_max'] / 1024:,.0f} KiB max; {lag_stats['ms_p50']:.0f} ms p50, "
                  f"{lag_stats['ms_p99']:.0f} ms p99, {lag_stats['ms_max']:.0f} ms max; "
                  f"caught up {1000 * caught_up:.0f} ms after the load stopped")
            rates[role] = pipe
        finally:
            if slave is not None:
                slave.stop()
            master.stop()
    print("send rate, same run: " + "; ".join(f"{k} {v['rate']:,.0f} msg/s (p99 {v['p99_ms'] or 0:.1f} ms)"
                                              for k, v in rates.items()))


if __name__ == "__main__":
    sys.exit(main())
