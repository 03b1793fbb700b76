"""Broker send throughput and latency, next to the raw append speed of the same bytes, same run.

    .venv/bin/python benchmarks/send_path.py [--seconds 10] [--producers 4] [--threads 4] [--rate 5000]
        [--raw-messages 100000] [--skip-cpp] [--root DIR]

(``make bench-broker``; a smoke run in seconds: ``--seconds 1 --producers 1 --threads 1
--raw-messages 1000``.)

Starts a name server and a broker (ASYNC_FLUSH, loopback) in a temporary directory, then measures
for 1 KiB messages:

1. raw append: the same records appended in-process with ``CommitLogWriter`` (no network), and a
   plain ``write`` of the same bytes — the ceiling the broker could reach on this machine;
2. saturation: ``--producers`` processes × ``--threads`` threads of our Python Producer (sync sends);
3. fixed rate: ``--rate`` msg/s spread over the producers, to read p50/p99 at a realistic load;
   before these, a pipelined load (pre-built requests, many in flight, little client CPU) shows what
   the broker itself sustains;
4. the C++ client (``rocketmq`` wheel) with the same number of producer processes.

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
        deadline = time.perf_counter() + seconds
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
    out.put((latencies, errors[0]))


def _run_processes(target, args: tuple, processes: int, seconds: float) -> dict:
    """Run ``target(*args, queue)`` in ``processes`` spawned processes; merge their latencies."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, q)) for _ in range(processes)]
    for p in procs:
        p.start()
    lat, errors = [], 0
    for _ in procs:
        got, err = q.get()
        lat += got
        errors += err
    for p in procs:
        p.join()
    return summarize(lat, seconds, errors)


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
deadline = time.perf_counter() + seconds
while time.perf_counter() < deadline:
    m = Message("BenchTopic"); m.set_body(body)
    t = time.perf_counter()
    try:
        p.send_sync(m); lat.append(time.perf_counter() - t)
    except Exception:
        errors += 1
p.shutdown()
print(json.dumps({"lat": lat, "errors": errors}))
"""


def run_cpp_producers(namesrv: str, processes: int, seconds: float, workdir: Path) -> dict:
    env = dict(os.environ, HOME=str(workdir))
    procs = [subprocess.Popen([sys.executable, "-c", CPP_SCRIPT, namesrv, str(seconds)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, cwd=workdir) for _ in range(processes)]
    lat, errors = [], 0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        data = json.loads(out.decode().strip().splitlines()[-1])
        lat += data["lat"]
        errors += data["errors"]
    return summarize(lat, seconds, errors)


def _pipelined(namesrv: str, broker_addr: str, seconds: float, connections: int, window: int, out) -> None:
    """Minimal-CPU load: pre-built SEND_MESSAGE_V2 requests, ``window`` in flight per connection."""
    import asyncio

    from broker.remoting.codes import RequestCode
    from broker.remoting.command import RemotingCommand
    from broker.remoting.headers import SendMessageRequestHeader
    from broker.remoting.transport import RemotingClient

    ext = SendMessageRequestHeader(producer_group="PG_PIPE", topic=TOPIC, default_topic="TBW102",
                                   default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=0, flag=0,
                                   properties="WAIT\x01true", reconsume_times=0, unit_mode=False,
                                   batch=False).to_ext(v2=True)

    async def run() -> tuple[list[float], int]:
        clients = [RemotingClient(broker_addr) for _ in range(connections)]
        for c in clients:
            await c.connect()
        lat: list[float] = []
        errors = 0
        deadline = time.perf_counter() + seconds

        async def lane(client, qid: int) -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, dict(ext, e=str(qid)), BODY)
                t = time.perf_counter()
                resp = await client.invoke(cmd, 10.0)
                if resp.code == 0:
                    lat.append(time.perf_counter() - t)
                else:
                    errors += 1

        await asyncio.gather(*(lane(c, (i * window + j) % 4) for i, c in enumerate(clients) for j in range(window)))
        for c in clients:
            await c.close()
        return lat, errors

    out.put(asyncio.run(run()))


def run_pipelined(namesrv: str, broker_addr: str, processes: int, connections: int, window: int,
                  seconds: float) -> dict:
    return _run_processes(_pipelined, (namesrv, broker_addr, seconds, connections, window), processes, seconds)


def summarize(lat: list[float], seconds: float, errors: int) -> dict:
    lat = sorted(lat)
    if not lat:
        return {"msgs": 0, "rate": 0.0, "p50_ms": None, "p99_ms": None, "errors": errors}
    return {"msgs": len(lat), "rate": len(lat) / seconds, "p50_ms": 1000 * statistics.median(lat),
            "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], "errors": errors}


def line(name: str, r: dict) -> str:
    p50 = f"{r['p50_ms']:.2f}" if r["p50_ms"] is not None else "-"
    p99 = f"{r['p99_ms']:.2f}" if r["p99_ms"] is not None else "-"
    return f"{name:<44} {r['rate']:>10,.0f} msg/s   p50 {p50:>7} ms   p99 {p99:>7} ms   errors {r['errors']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--producers", type=int, default=4, help="producer processes")
    ap.add_argument("--threads", type=int, default=4, help="threads per Python producer process")
    ap.add_argument("--rate", type=float, default=5000.0, help="fixed-rate phase, msg/s in total")
    ap.add_argument("--skip-cpp", action="store_true")
    ap.add_argument("--raw-messages", type=int, default=100_000,
                    help="records of the raw-append measurement (default 100000, at least 1000)")
    ap.add_argument("--root", type=Path, default=None,
                    help="directory the temporary name-server/broker directory is made in (default: system temp)")
    args = ap.parse_args(argv)
    if args.raw_messages < 1000:
        ap.error("--raw-messages must be >= 1000")
    if args.seconds <= 0 or args.producers < 1 or args.threads < 1:
        ap.error("--seconds must be > 0, --producers and --threads >= 1")
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
            pipe = run_pipelined(ns_addr, broker.addr, 2, 4, 16, args.seconds)
            print(line("pipelined load: 2 procs x 4 conns x 16 in flight", pipe))
            sat = run_python_producers(ns_addr, args.producers, args.threads, args.seconds)
            print(line(f"python producers {args.producers}x{args.threads} (saturation)", sat))
            fixed = run_python_producers(ns_addr, args.producers, args.threads, args.seconds, args.rate)
            print(line(f"python producers at {args.rate:,.0f} msg/s", fixed))
            if not args.skip_cpp:
                cpp = run_cpp_producers(ns_addr, args.producers, args.seconds, tmp)
                print(line(f"C++ producers x{args.producers} (sync)", cpp))
            print(f"broker vs raw append: {max(sat['rate'], pipe['rate']) / recs:.1%} (goal: >= 20,000 msg/s; p99 < 10 ms at 5,000 msg/s)")
        finally:
            broker.stop()
            ns.terminate()
            ns.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
