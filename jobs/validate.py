"""spark-submit entry: Great Expectations suites over the lake's Delta tables (data quality).

    spark-submit jobs/validate.py --lake LAKE_DIR [--store [NAME=]PATH ...] [--tables a,b] [--broker NAME] [--skew-ms N]
        [--storage-option KEY=VALUE ...]
    rocketlake validate --lake LAKE_DIR ...          # the same, with a local Spark session

With ``--store``, first ingests those stores into the lake (incremental, cheap when nothing is new),
so "validate after ingest" is one command. Then runs each table's suite (see
:mod:`pipelines.quality.suites`; tables not in the lake yet are skipped), prints one line per table
and where the results and the Data Docs are (``<lake>/_quality``). Exit 1 when a critical
expectation failed (or a table could not be validated); non-critical failures are WARNING lines and
exit 0.

Stores may be URIs (``--store broker-a=s3://bucket/store``, storage options from the environment
and ``--storage-option``). The lake must be a local directory: Great Expectations keeps its project,
results and Data Docs as plain files under ``<lake>/_quality``. Exit 2 for bad arguments and storage
that cannot be used (one line, no traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when not installed


def _tables(text: str) -> list[str]:
    from pipelines.quality.suites import ALL_TABLES

    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in ALL_TABLES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown table(s) {', '.join(unknown) or repr(text)}; "
                                         f"choose from {', '.join(ALL_TABLES)}")
    return names


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    from pipelines.job_args import add_store_lake_args
    from pipelines.quality.suites import DEFAULT_SKEW_MS

    ap = argparse.ArgumentParser(prog="validate.py", description=__doc__.split("\n\n")[0])
    add_store_lake_args(ap, store_required=False)
    ap.add_argument("--tables", type=_tables, default=None, metavar="A,B",
                    help="validate only these tables (default: all; absent ones are skipped)")
    ap.add_argument("--broker", default=None, metavar="NAME", help="validate only this broker's rows")
    ap.add_argument("--quality-dir", default=None, metavar="DIR",
                    help="local directory for results and Data Docs (default <lake>/_quality; required for a "
                         "lake behind a URI, since GX writes plain files)")
    ap.add_argument("--skew-ms", type=_non_negative, default=DEFAULT_SKEW_MS,
                    help=f"born/store clock skew allowed for messages, ms (default {DEFAULT_SKEW_MS})")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from pipelines.job_args import configure_job_logging, job_session, resolve_store_lake
    from pipelines.quality.runner import SUMMARY_FILE, validate_lake
    from pipelines.storage import StorageError

    configure_job_logging()
    logging.getLogger("great_expectations").setLevel(logging.WARNING)  # per-save INFO lines drown ours

    stores, lake = resolve_store_lake(ap, args)
    if not lake.is_local and args.quality_dir is None:
        ap.error(f"--lake {lake}: a lake behind a URI needs --quality-dir DIR (a local directory for the "
                 "results and Data Docs, which GX writes as plain files)")
    try:
        with job_session("rocketlake-validate", args.master) as spark:
            if stores:
                from pipelines.ingest import ingest

                for summary in ingest(spark, stores, lake):
                    print(f"ingest {summary.line()}", flush=True)
            quality = validate_lake(spark, lake, tables=args.tables, broker=args.broker, skew_ms=args.skew_ms,
                                    results_dir=args.quality_dir)
    except StorageError as exc:
        print(f"{ap.prog}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    for line in quality.lines():
        print(line)
    print(f"results: {Path(quality.results_dir) / SUMMARY_FILE}")
    print(f"data docs: {quality.data_docs_index}")
    print(f"validate {quality.run_id}: {quality.verdict()}", flush=True)
    return quality.exit_code


if __name__ == "__main__":
    sys.exit(main())
