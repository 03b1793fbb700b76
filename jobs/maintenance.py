"""spark-submit entry: compact (OPTIMIZE), checkpoint and VACUUM the lake's Delta tables with delta-rs.

    spark-submit jobs/maintenance.py --lake LAKE [--tables a,b] [--retention-hours N] [--target-size BYTES]
        [--no-compact] [--no-vacuum] [--no-checkpoint] [--dry-run] [--storage-option KEY=VALUE ...]
    rocketlake maintenance --lake LAKE ...       # the same, in-process

LAKE is a directory or a URI (``s3://bucket/lake``, ``file://…``); a remote lake's storage options
come from the environment and ``--storage-option`` (delta-rs names, e.g. ``AWS_ENDPOINT_URL``).

Every table of the lake by default (``--tables`` for some). Prints one line per table: active files
before -> after, rows (from the Delta log), files vacuumed, the checkpoint version. No Spark session
is started: delta-rs does the work on the driver (see :mod:`pipelines.maintenance` for what each step
does and why the retention never breaks a running reader).

Exit status: 0 when every table was maintained, 1 when one or more failed (the others are still
done), 2 for bad arguments (e.g. a retention below the safe floor, a lake that does not exist or
cannot be reached) — one line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when not installed


def _tables(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no table names in {text!r}")
    return names


def _hours(text: str) -> float:
    from pipelines.maintenance import check_retention

    try:
        return check_retention(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc) if "retention" in str(exc) else f"{text!r} is not a number of hours") from None


def _bytes(text: str) -> int:
    from broker.cli import _size

    return _size(text)


def build_parser() -> argparse.ArgumentParser:
    from pipelines.maintenance import DEFAULT_RETENTION_HOURS, MIN_RETENTION_HOURS
    from pipelines.sql.cli import add_lake_args

    ap = argparse.ArgumentParser(prog="maintenance.py", description=__doc__.split("\n\n")[0])
    add_lake_args(ap, required=True)
    ap.add_argument("--tables", type=_tables, default=None, metavar="A,B",
                    help="maintain only these tables (default: every table in the lake)")
    ap.add_argument("--retention-hours", type=_hours, default=float(DEFAULT_RETENTION_HOURS), metavar="N",
                    help=f"keep files the log removed for N hours before deleting them (default {DEFAULT_RETENTION_HOURS}, "
                         f"Delta's 7 days; at least {MIN_RETENTION_HOURS}: longer than any job runs)")
    ap.add_argument("--target-size", type=_bytes, default=None, metavar="BYTES",
                    help="compacted file size (e.g. 128M; default: the table's delta.targetFileSize or delta-rs's)")
    ap.add_argument("--no-compact", action="store_true", help="skip the compaction (OPTIMIZE)")
    ap.add_argument("--no-vacuum", action="store_true", help="skip the VACUUM")
    ap.add_argument("--no-checkpoint", action="store_true", help="skip the checkpoint and log clean-up")
    ap.add_argument("--dry-run", action="store_true", help="change nothing; list what VACUUM would delete")
    ap.add_argument("--master", default=None, help=argparse.SUPPRESS)  # accepted like every job's; no Spark here
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from pipelines.job_args import configure_job_logging
    from pipelines.maintenance import maintain_lake
    from pipelines.sql.cli import lake_location
    from pipelines.sql.views import find_tables

    configure_job_logging()
    try:
        lake = lake_location(args)
        found = find_tables(lake)  # a missing or unreachable lake is a bad --lake: exit 2
    except ValueError as exc:
        ap.error(str(exc))
    tables = args.tables if args.tables is not None else list(found)
    if not tables:
        print(f"maintenance: no Delta tables in {lake}", flush=True)
        return 0
    results = maintain_lake(lake, tables, retention_hours=args.retention_hours, compact=not args.no_compact,
                            vacuum=not args.no_vacuum, checkpoint=not args.no_checkpoint,
                            target_size=args.target_size, dry_run=args.dry_run)
    for r in results:
        print(f"maintenance {r.line()}", flush=True)
    failed = [r.table for r in results if r.error]
    before = sum(r.files_before for r in results if not r.error)
    after = sum(r.files_after for r in results if not r.error)
    print(f"maintenance: {len(results) - len(failed)} table(s) done, files {before} -> {after}"
          + (f"; FAILED: {', '.join(failed)}" if failed else "") + (" (dry run)" if args.dry_run else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
