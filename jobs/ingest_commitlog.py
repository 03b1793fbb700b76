"""spark-submit entry: broker stores → Delta tables (messages, consume_queue, index_entries, …).

    spark-submit jobs/ingest_commitlog.py --store [NAME=]PATH ... --lake LAKE [--split-bytes N] [--until-offset N]
        [--storage-option KEY=VALUE ...]
        [--follow --checkpoint DIR [--trigger-interval 2s] [--max-batches N] [--until-idle SECONDS]]
    rocketlake ingest ...                   # the same, with a local Spark session

Stores and lake are directories or URIs (``--store broker-a=s3://bucket/store --lake s3://bucket/lake``);
storage options (delta-rs names) come from the environment and ``--storage-option``. Incremental and
exactly-once (see :mod:`pipelines.ingest`); ends with one summary line per broker. ``--follow`` keeps
ingesting as the stores grow: it is the streaming job, ``jobs/stream_commitlog.py`` (:mod:`pipelines.stream`).

Exit status: 0 when every store was ingested (nothing new included); 2 for bad arguments and for
storage that cannot be used and for payload declarations that cannot be (see ``rocketlake schema install``;
a store location that lists no commitlog segment, an endpoint or bucket
that does not answer): one line on stderr, no traceback.
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

    ap = argparse.ArgumentParser(prog="ingest_commitlog.py", description=__doc__.split("\n\n")[0])
    add_store_lake_args(ap)
    ap.add_argument("--split-bytes", type=int, default=DEFAULT_SPLIT_BYTES,
                    help=f"commitlog bytes per Spark task (default {DEFAULT_SPLIT_BYTES >> 20} MiB)")
    ap.add_argument("--until-offset", type=int, default=None, help="ingest only records starting before this offset")
    add_payload_schemas_arg(ap)
    add_stream_args(ap, follow=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.follow:
        from pipelines.stream import stream_job

        return stream_job(ap, args)
    if args.checkpoint or args.max_batches or args.until_idle:
        ap.error("--checkpoint, --max-batches and --until-idle go with --follow")
    if args.split_bytes <= 0:
        ap.error("--split-bytes must be > 0")
    from pipelines.job_args import configure_job_logging, job_session, resolve_store_lake
    from pipelines.payloads.errors import PayloadSchemaError
    from pipelines.storage import StorageError

    configure_job_logging()

    stores, lake = resolve_store_lake(ap, args)
    try:
        with job_session("rocketlake-ingest", args.master, warm=["pipelines.ingest"]) as spark:
            from pipelines.ingest import ingest

            for summary in ingest(spark, stores, lake, split_bytes=args.split_bytes, until_offset=args.until_offset,
                                  payload_schemas=args.payload_schemas):
                print(f"ingest {summary.line()}", flush=True)
    except (StorageError, PayloadSchemaError) as exc:
        print(f"{ap.prog}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
