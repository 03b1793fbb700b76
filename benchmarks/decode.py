"""Decode speed of one CommitLog segment next to the raw read speed of the same file, same run.

    .venv/bin/python benchmarks/decode.py [--gib 1] [--body-bytes 1024] [--store build/bench/decode]

(``make bench-decode``; a smoke run in seconds: ``--gib 0.01 --store <tmp dir>``.)

Generates (once; reused while the arguments match) a store whose first segment is a full 1 GiB
file, then measures on that file, in one process (= one core):

* raw read: ``readinto`` of the whole file in 8 MiB blocks, cold (pages dropped from the page
  cache with ``posix_fadvise(DONTNEED)``) and warm (second read);
* decode: :func:`broker.store.columnar.iter_decode` over an mmap of the same file, all columns and
  body CRCs, cold and warm; plus a decode without CRC checks, and one with the bodies left as views
  into the mapped file (``body_view``: what the ingest does, its Parquet writer reads them there).

Prints MB/s, messages/s and the decode/raw ratio (goal: decode >= 50 % of raw read).
"""

from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import resource
import sys
import time
from pathlib import Path

from broker.store.columnar import DecodeStats, iter_decode
from broker.store.commitlog import CommitLog
from broker.store.generate import GenerateSpec, generate_store

log = logging.getLogger("benchmarks.decode")
RECORD_OVERHEAD = 230  # header + topic + typical generated properties


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_read(path: Path) -> float:
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(view):
            pass
    return time.perf_counter() - t0


def decode(path: Path, base: int, size: int, verify_crc: bool = True,
           body_view: bool = False) -> tuple[float, DecodeStats]:
    stats = DecodeStats()
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        for batch in iter_decode(mm, base, size, stats=stats, verify_crc=verify_crc, body_view=body_view):
            del batch
    return time.perf_counter() - t0, stats


def _decode_split(args: tuple[str, int, int, int, int]) -> tuple[int, int]:
    path, base, size, start, end = args
    stats = DecodeStats()
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        for batch in iter_decode(mm, base, size, start, end, stats=stats):
            del batch
    return stats.records, stats.bytes_decoded


def decode_parallel(path: Path, base: int, size: int, workers: int) -> tuple[float, int, int]:
    """The segment cut into ``workers`` byte ranges decoded by separate processes, as Spark tasks do."""
    from concurrent.futures import ProcessPoolExecutor

    bounds = [size * i // workers for i in range(workers + 1)]
    jobs = [(str(path), base, size, a, b) for a, b in zip(bounds, bounds[1:])]
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_decode_split, [(str(path), base, size, 0, 1)] * workers))  # warm the workers
        t0 = time.perf_counter()
        results = list(pool.map(_decode_split, jobs))
        elapsed = time.perf_counter() - t0
    return elapsed, sum(r for r, _ in results), sum(b for _, b in results)


def ensure_store(store: Path, gib: float, body_bytes: int) -> Path:
    spec_file = store / "bench-spec.json"
    segment = int(gib * (1 << 30))
    want = {"gib": gib, "body_bytes": body_bytes}
    if spec_file.exists() and json.loads(spec_file.read_text()) == want:
        return store
    if store.exists():
        import shutil
        shutil.rmtree(store)
    messages = int(segment * 1.02 / (body_bytes + RECORD_OVERHEAD)) + 1000
    print(f"generating {messages} messages ({gib} GiB segment, ~{body_bytes} B bodies) into {store} …",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    result = generate_store(store, GenerateSpec(messages=messages, body_bytes=body_bytes, segment_bytes=segment,
                                                index_slots=500_000, index_entries=2_000_000))
    print(f"generated {result.bytes / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    spec_file.write_text(json.dumps(want))
    return store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="segment size in GiB (default 1)")
    ap.add_argument("--body-bytes", type=int, default=1024)
    ap.add_argument("--store", type=Path, default=Path("build/bench/decode"))
    args = ap.parse_args(argv)
    if args.gib <= 0 or args.body_bytes <= 0:
        ap.error("--gib and --body-bytes must be > 0")
    logging.basicConfig(level=logging.WARNING)
    store = ensure_store(args.store, args.gib, args.body_bytes)
    cl = CommitLog.open(store)
    seg = cl.segments[0]
    size = seg.size

    drop_cache(seg.path)
    raw_cold = raw_read(seg.path)
    raw_warm = raw_read(seg.path)
    drop_cache(seg.path)
    dec_cold, stats = decode(seg.path, seg.base, cl.segment_size)
    dec_warm, stats = decode(seg.path, seg.base, cl.segment_size)
    dec_nocrc, _ = decode(seg.path, seg.base, cl.segment_size, verify_crc=False)
    dec_view, _ = decode(seg.path, seg.base, cl.segment_size, body_view=True)
    workers = os.cpu_count() or 1
    par_s, par_records, par_bytes = decode_parallel(seg.path, seg.base, cl.segment_size, workers)
    assert par_records == stats.records, "split decode must see every record exactly once"
    mb = size / 1e6
    data_mb = stats.bytes_decoded / 1e6
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"segment {seg.path} ({mb:.0f} MB, {stats.records} messages, {data_mb:.0f} MB of records)")
    print(f"raw read   cold {mb / raw_cold:8.0f} MB/s   warm {mb / raw_warm:8.0f} MB/s")
    print(f"decode     cold {data_mb / dec_cold:8.0f} MB/s   warm {data_mb / dec_warm:8.0f} MB/s   "
          f"({stats.records / dec_warm:,.0f} messages/s per core, warm)")
    print(f"decode, no CRC  {'':8}       warm {data_mb / dec_nocrc:8.0f} MB/s   "
          f"({stats.records / dec_nocrc:,.0f} messages/s per core)")
    print(f"decode, body views    warm {data_mb / dec_view:8.0f} MB/s   "
          f"({stats.records / dec_view:,.0f} messages/s per core; the ingest's decode)")
    print(f"decode, {workers} processes (byte-range splits), warm {par_bytes / 1e6 / par_s:8.0f} MB/s   "
          f"({par_records / par_s:,.0f} messages/s)")
    print(f"decode/raw ratio: cold {raw_cold / dec_cold * data_mb / mb:6.1%}   warm {raw_warm / dec_warm * data_mb / mb:6.1%}"
          f"   {workers}-process/cold read {raw_cold / par_s * par_bytes / size:6.1%}   (goal >= 50%)")
    print(f"peak RSS {peak:.0f} MiB; findings: {len(stats.findings)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
