"""spark-submit entry: store audit → Delta tables audit_findings and topic_daily_stats.

    spark-submit jobs/audit.py --store [NAME=]PATH ... --lake LAKE [--no-ingest] [--storage-option KEY=VALUE ...]
    rocketlake audit --store [NAME=]PATH ... --lake LAKE [--no-ingest] [--master M]

Stores and lake are directories or URIs (``s3://bucket/store``, ``s3://bucket/lake``); storage options
come from the environment and ``--storage-option``. A finding in a remote store names its file by URI.

First brings the lake up to date (the ingest job's incremental run; ``--no-ingest`` audits the
tables as they are), then recomputes the given brokers' findings and per-day topic statistics and
replaces their rows (see :mod:`pipelines.reports.audit` for the finding kinds and their rules).
Prints the number of findings per kind and a one-line summary.

Exit status: 0 when the audit ran, findings or not: findings are data, written to the table for
whoever reads it (alerting belongs to the consumer of ``audit_findings``, not to the job's exit
code, so a scheduler does not retry a run that worked). 2 for bad arguments and for storage that
cannot be used (a store URI without a store, an endpoint that does not answer): one line, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when not installed


def build_parser() -> argparse.ArgumentParser:
    from pipelines.job_args import add_no_ingest_arg, add_store_lake_args

    ap = argparse.ArgumentParser(prog="audit.py", description=__doc__.split("\n\n")[0])
    add_store_lake_args(ap)
    add_no_ingest_arg(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from pipelines.job_args import configure_job_logging, job_session, resolve_store_lake
    from pipelines.reports.audit import KINDS, run_audit
    from pipelines.storage import StorageError

    configure_job_logging()

    stores, lake = resolve_store_lake(ap, args)
    try:
        with job_session("rocketlake-audit", args.master) as spark:
            result = run_audit(spark, stores, lake, ingest_first=not args.no_ingest)
    except StorageError as exc:
        print(f"{ap.prog}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    counts = result.counts()
    width = max(len(k) for k in KINDS)
    for kind in KINDS:
        print(f"audit {kind:<{width}} {counts[kind]}", flush=True)
    print(f"audit {result.line()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
