"""spark-submit entry: store audit → Delta tables audit_findings and topic_daily_stats.

    spark-submit jobs/audit.py --store [NAME=]PATH ... --lake LAKE [--no-ingest] [--storage-option KEY=VALUE ...]
    rocketlake audit --store [NAME=]PATH ... --lake LAKE [--no-ingest] [--master M]
                     [--replica SLAVE_NAME=MASTER_NAME ...]

Stores and lake are directories or URIs (``s3://bucket/store``, ``s3://bucket/lake``); storage options
come from the environment and ``--storage-option``. A finding in a remote store names its file by URI.

First brings the lake up to date (the ingest job's incremental run; ``--no-ingest`` audits the
tables as they are), then recomputes the given brokers' findings and per-day topic statistics and
replaces their rows (see :mod:`pipelines.reports.audit` for the finding kinds and their rules).
Prints the number of findings per kind and a one-line summary. ``--replica SLAVE=MASTER`` names a
4.x master/slave pair among the ``--store`` brokers: the slave's records are compared with its
master's (``replica_lag``, ``replica_divergent``).

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
    ap.add_argument("--replica", action="append", default=[], metavar="SLAVE_NAME=MASTER_NAME",
                    help="a slave broker and its master, both among the --store names (repeatable): "
                         "reports replication lag and records that differ")
    return ap


def parse_replicas(ap: argparse.ArgumentParser, values: list[str], store_names: list[str]) -> list[tuple[str, str]]:
    """``--replica`` values as (slave, master) pairs; a bad one is an argparse error (exit 2)."""
    from pipelines.reports.audit import check_replicas

    pairs = []
    for text in values:
        slave, sep, master = text.partition("=")
        if not sep or not slave or not master:
            ap.error(f"--replica {text!r} is not SLAVE_NAME=MASTER_NAME")
        pairs.append((slave, master))
    try:
        return check_replicas(pairs, store_names)
    except ValueError as exc:
        ap.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from pipelines.job_args import configure_job_logging, job_session, resolve_store_lake
    from pipelines.reports.audit import KINDS, run_audit
    from pipelines.storage import StorageError

    configure_job_logging()

    stores, lake = resolve_store_lake(ap, args)
    replicas = parse_replicas(ap, args.replica, [spec.name for spec in stores])
    try:
        with job_session("rocketlake-audit", args.master) as spark:
            result = run_audit(spark, stores, lake, ingest_first=not args.no_ingest, replicas=replicas)
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
