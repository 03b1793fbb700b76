"""Dispatcher CPU per record: the per-record path vs the compiled run walk, on one generated store.

A store is generated (``broker/store/generate.py``), its commitlog copied into two fresh stores, and
each is dispatched from offset 0 by one :class:`~broker.engine.dispatch.Dispatcher` — the old way
(``catch_up_per_record``: decode, properties, hashes, one unit at a time) and the new
(``catch_up``: :func:`~broker.store.dispatch_fields.scan_run` runs). Rounds alternate old/new so
both see the same machine load; CPU time (``time.process_time``) per record is reported, and the
consume-queue and index files of the two must be byte-identical (exit status 1 otherwise).

    make bench-dispatch BENCH_ARGS="--messages 50000"
"""

from __future__ import annotations

import argparse
import filecmp
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's broker, not whichever one the venv has installed

from broker.engine.dispatch import Dispatcher, QueueRegistry  # noqa: E402
from broker.engine.store_settings import StoreSettings  # noqa: E402
from broker.store.commitlog import CommitLog  # noqa: E402
from broker.store.constants import COMMITLOG_DIR, CONSUME_QUEUE_DIR, INDEX_DIR  # noqa: E402
from broker.store.generate import GenerateSpec, generate_store  # noqa: E402

log = logging.getLogger("bench-dispatch")
CLOCK_MS = 1_700_000_000_000  # index file names come from the clock: a fixed one makes them comparable


def tree_differences(a: Path, b: Path) -> list[str]:
    """Relative paths that differ between two directory trees (missing on one side or other bytes)."""
    names_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()} if a.exists() else set()
    names_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()} if b.exists() else set()
    out = sorted(str(p) for p in names_a ^ names_b)
    out += sorted(str(p) for p in names_a & names_b if not filecmp.cmp(a / p, b / p, shallow=False))
    return out


def dispatch_once(source: Path, target: Path, settings: StoreSettings, per_record: bool) -> tuple[float, int]:
    """Dispatch ``source``'s commitlog into a fresh ``target``; (CPU seconds of the dispatch —
    not of the copy nor of the final fsyncs —, records changed)."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    shutil.copytree(source / COMMITLOG_DIR, target / COMMITLOG_DIR)
    dispatcher = Dispatcher(target, settings, QueueRegistry(target, settings.cq_file_bytes), clock=lambda: CLOCK_MS)
    commitlog = CommitLog.open(target, settings.segment_bytes)
    end = commitlog.data_end()  # the live dispatcher follows up to the writer's published end
    try:
        start = time.process_time()
        run = dispatcher.catch_up_per_record if per_record else dispatcher.catch_up
        changed = run(0, end, commitlog)
        cpu = time.process_time() - start
        dispatcher.sync()
        return cpu, changed
    finally:
        commitlog.close()
        dispatcher.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000, help="records to generate (default 50000)")
    ap.add_argument("--body-bytes", type=int, default=256, help="body size of the generated messages")
    ap.add_argument("--rounds", type=int, default=3, help="old/new rounds, interleaved (the best counts)")
    ap.add_argument("--root", type=Path, default=None, help="work directory (default: a temporary one)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    root = args.root or Path(tempfile.mkdtemp(prefix="bench-dispatch-"))
    settings = StoreSettings(segment_bytes=64 << 20, cq_file_bytes=20 * 300_000, index_slots=500_000,
                             index_entries=2_000_000, fsync_metadata=False)
    try:
        source = root / "source"
        if source.exists():
            shutil.rmtree(source)
        spec = GenerateSpec(messages=args.messages, body_bytes=args.body_bytes, segment_bytes=settings.segment_bytes,
                            cq_file_bytes=settings.cq_file_bytes, index_slots=settings.index_slots,
                            index_entries=settings.index_entries)
        generate_store(source, spec)
        dispatch_once(source, root / "warm", settings, per_record=False)  # numba's cache load / first compile
        old: list[float] = []
        new: list[float] = []
        changed = {}
        for _ in range(max(1, args.rounds)):
            cpu, changed["old"] = dispatch_once(source, root / "old", settings, per_record=True)
            old.append(cpu)
            cpu, changed["new"] = dispatch_once(source, root / "new", settings, per_record=False)
            new.append(cpu)
        diffs = [f"{kind}/{d}" for kind in (CONSUME_QUEUE_DIR, INDEX_DIR)
                 for d in tree_differences(root / "old" / kind, root / "new" / kind)]
        n = args.messages
        print(f"records: {n}  changed old/new: {changed['old']}/{changed['new']}")
        print(f"per-record path : {min(old) / n * 1e6:8.2f} us/record CPU (rounds: "
              + ", ".join(f"{t / n * 1e6:.2f}" for t in old) + ")")
        print(f"compiled runs   : {min(new) / n * 1e6:8.2f} us/record CPU (rounds: "
              + ", ".join(f"{t / n * 1e6:.2f}" for t in new) + ")")
        print(f"speed-up        : {min(old) / max(min(new), 1e-9):8.1f} x")
        if diffs or changed["old"] != changed["new"]:
            print(f"OUTPUT DIFFERS: {diffs[:20]}")
            return 1
        print("consume queues and index files: byte-identical")
        return 0
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
