"""spark-submit entry: dead-letter-queue analysis → Delta tables dlq_messages and dlq_summary.

    spark-submit jobs/dlq_report.py --store [NAME=]PATH ... --lake LAKE [--no-ingest] [--storage-option KEY=VALUE ...]
    rocketlake dlq ...                      # the same, with a local Spark session

Stores and lake are directories or URIs (``s3://bucket/store``, ``s3://bucket/lake``); storage options
come from the environment and ``--storage-option``. Storage that cannot be used is a one-line error
(exit 2).

First brings the lake's ``messages`` table up to date for the given stores (incremental ingest,
cheap when nothing is new) unless ``--no-ingest``; then recomputes both tables for those brokers in
full and replaces their rows, one commit per table (see :mod:`pipelines.reports.dlq` for what every
column means). Prints the dlq_summary rows as a table and a one-line total.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when not installed

SUMMARY_COLUMNS = [  # (header, dlq_summary column)
    ("date", "store_date"), ("broker", "broker_name"), ("group", "consumer_group"), ("topic", "original_topic"),
    ("msgs", "messages"), ("originals", "distinct_originals"), ("p50_s", "p50_time_to_dlq_s"),
    ("p95_s", "p95_time_to_dlq_s"), ("max_s", "max_time_to_dlq_s"), ("replayed", "replayed"),
    ("top_keys", "top_keys"), ("top_tags", "top_tags"),
]


def build_parser() -> argparse.ArgumentParser:
    from pipelines.job_args import add_no_ingest_arg, add_store_lake_args

    ap = argparse.ArgumentParser(prog="dlq_report.py", description=__doc__.split("\n\n")[0])
    add_store_lake_args(ap)
    add_no_ingest_arg(ap)
    return ap


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return ",".join(value) or "-"
    return str(value)


def format_summary(rows: list[dict]) -> str:
    """The dlq_summary rows as a compact fixed-width table (header line first)."""
    table = [[h for h, _ in SUMMARY_COLUMNS]] + [[_cell(r[c]) for _, c in SUMMARY_COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(SUMMARY_COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table)


def total_line(report, brokers: list[str]) -> str:
    rows = report.messages
    groups = len(set(zip(rows["broker_name"].to_pylist(), rows["consumer_group"].to_pylist())))
    originals = len({(b, o) for b, o in zip(rows["broker_name"].to_pylist(), rows["original_msg_id"].to_pylist())
                     if o is not None})
    return (f"dlq: {rows.num_rows} DLQ messages ({originals} distinct originals) in {groups} group(s) "
            f"on {len(brokers)} broker(s) {', '.join(brokers)}; dlq_messages v{report.messages_write.version}, "
            f"dlq_summary v{report.summary_write.version}")


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from pipelines.ingest import ingest
    from pipelines.job_args import configure_job_logging, job_session, resolve_store_lake
    from pipelines.reports.dlq import run_dlq_report
    from pipelines.storage import StorageError

    configure_job_logging()

    stores, lake = resolve_store_lake(ap, args)
    brokers = [s.name for s in stores]
    try:
        with job_session("rocketlake-dlq", args.master) as spark:
            if not args.no_ingest:
                for summary in ingest(spark, stores, lake):
                    print(f"ingest {summary.line()}", flush=True)
            report = run_dlq_report(spark, lake, brokers)
    except StorageError as exc:
        print(f"{ap.prog}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(format_summary(report.summary.to_pylist()))
    print(total_line(report, brokers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
