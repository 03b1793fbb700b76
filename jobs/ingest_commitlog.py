"""spark-submit entry: broker stores → Delta tables (messages, consume_queue, index_entries, …).

    spark-submit jobs/ingest_commitlog.py --store [NAME=]PATH ... --lake LAKE_DIR [--split-bytes N] [--until-offset N]

Incremental and exactly-once (see :mod:`pipelines.ingest`); ends with one summary line per broker.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when not installed


def build_parser() -> argparse.ArgumentParser:
    from pipelines.ingest import DEFAULT_SPLIT_BYTES

    ap = argparse.ArgumentParser(prog="ingest_commitlog.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", action="append", required=True, metavar="[NAME=]PATH",
                    help="a broker store (repeatable); NAME is the broker name (default broker-a)")
    ap.add_argument("--lake", required=True, metavar="LAKE_DIR", help="directory holding the Delta tables")
    ap.add_argument("--split-bytes", type=int, default=DEFAULT_SPLIT_BYTES,
                    help="commitlog bytes per Spark task (default 128 MiB)")
    ap.add_argument("--until-offset", type=int, default=None, help="ingest only records starting before this offset")
    ap.add_argument("--master", default=None, help="Spark master when not run by spark-submit (default local[2])")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pipelines.ingest import StoreSpec, ingest
    from pipelines.session import build_session

    try:
        stores = [StoreSpec.parse(s) for s in args.store]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.split_bytes <= 0:
        print("error: --split-bytes must be > 0", file=sys.stderr)
        return 2
    spark = build_session("rocketlake-ingest", args.master)
    try:
        for summary in ingest(spark, stores, args.lake, split_bytes=args.split_bytes, until_offset=args.until_offset):
            print(f"ingest {summary.line()}", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
