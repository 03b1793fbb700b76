"""spark-submit entry: streaming ingest of broker stores into the Delta tables, micro-batch by micro-batch.

    spark-submit jobs/stream_commitlog.py --store [NAME=]PATH ... --lake LAKE --checkpoint DIR
        [--trigger-interval 2s] [--max-batches N] [--until-idle SECONDS] [--split-bytes N]
        [--storage-option KEY=VALUE ...]
    rocketlake ingest --follow --checkpoint DIR ...     # the same, with a local Spark session

Every micro-batch runs the batch ingest of each broker's new records (see :mod:`pipelines.stream`), so
batch runs and this job can alternate on one lake. Runs until SIGTERM/SIGINT (stops after the current
micro-batch), ``--max-batches`` or ``--until-idle``; then one summary line per broker.

Exit status: 0 when stopped as asked; 2 for bad arguments and storage that cannot be used (a store
location that lists no commitlog segment): one line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when not installed


def build_parser() -> argparse.ArgumentParser:
    from pipelines.sources.options import DEFAULT_SPLIT_BYTES
    from pipelines.job_args import add_payload_schemas_arg, add_store_lake_args
    from pipelines.stream_args import add_stream_args

    ap = argparse.ArgumentParser(prog="stream_commitlog.py", description=__doc__.split("\n\n")[0])
    add_store_lake_args(ap)
    add_stream_args(ap)
    ap.add_argument("--split-bytes", type=int, default=DEFAULT_SPLIT_BYTES,
                    help=f"commitlog bytes per Spark task (default {DEFAULT_SPLIT_BYTES >> 20} MiB)")
    add_payload_schemas_arg(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    from pipelines.stream import stream_job

    ap = build_parser()
    return stream_job(ap, ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
