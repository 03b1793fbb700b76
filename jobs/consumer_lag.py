"""spark-submit entry: consumer lag snapshot, Burrow-style status and a lag plot.

    spark-submit jobs/consumer_lag.py --store [NAME=]PATH ... --lake LAKE [--window N] [--stop-after-s S]
        [--max-lag-messages GROUP=N ...] [--max-lag-seconds GROUP=S ...] [--group G] [--plot PNG] [--snapshot-ts ISO]
        [--storage-option KEY=VALUE ...]
    rocketlake lag ...                      # the same, with a local Spark session

Stores and lake are directories or URIs (``--store broker-a=s3://bucket/store --lake s3://bucket/lake``);
storage options come from the environment and ``--storage-option``. A store URI that holds no
commitlog, or storage that does not answer, is a one-line error (exit 2).

With ``--store``: one snapshot of every store's consumer offsets against its consume queues is
appended to ``consumer_lag`` (one ``snapshot_ts`` for all stores; a rerun at the same time adds
nothing), the last ``--window`` snapshots of each partition are evaluated Burrow-style and appended
to ``consumer_lag_status``, and a table of the snapshot plus one line per group are printed.
``--group G --plot PNG`` then renders G's lag over time; without ``--store`` it only plots what the
table already holds.

Where the work runs: the snapshot (one row per queue and group) and the evaluation (N snapshots
per partition, however long the history) are small and computed on the driver with pyarrow,
written with delta-rs (see :mod:`pipelines.reports.consumer_lag`, :mod:`pipelines.reports.lag_status`);
a Spark job per few rows would only add seconds. The plot reads the group's whole history, which
grows with every run: once the Delta log says it holds millions of candidate rows the aggregation
runs in Spark and only the per-snapshot, per-topic aggregate reaches the driver (see
:func:`pipelines.reports.lag_plot.load_lag_series`).
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when not installed


def build_parser() -> argparse.ArgumentParser:
    from pipelines.job_args import add_store_lake_args
    from pipelines.reports.lag_status import DEFAULT_STOP_AFTER_S, DEFAULT_WINDOW

    ap = argparse.ArgumentParser(prog="consumer_lag.py", description=__doc__.split("\n\n")[0])
    add_store_lake_args(ap, store_required=False)
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                    help=f"snapshots per partition the status looks at (default {DEFAULT_WINDOW})")
    ap.add_argument("--stop-after-s", type=float, default=DEFAULT_STOP_AFTER_S,
                    help="offset unchanged for this long with lag > 0 is STOP, shorter is STALL "
                         f"(default {DEFAULT_STOP_AFTER_S:g})")
    ap.add_argument("--max-lag-messages", action="append", default=[], metavar="GROUP=N",
                    help="lag above N messages makes a partition at least WARN (repeatable; '*=N' for all groups)")
    ap.add_argument("--max-lag-seconds", action="append", default=[], metavar="GROUP=S",
                    help="lag above S seconds makes a partition at least WARN (repeatable; '*=S' for all groups)")
    ap.add_argument("--group", default=None, help="only print this group; the group to --plot")
    ap.add_argument("--plot", default=None, metavar="PNG", help="render --group's lag over time to this PNG file")
    ap.add_argument("--snapshot-ts", default=None, metavar="ISO",
                    help="time to record the snapshot at (ISO 8601, default now; naive means UTC)")
    return ap


def _snapshot_ts(ap: argparse.ArgumentParser, text: str | None) -> datetime:
    if text is None:
        return datetime.now(timezone.utc)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        ap.error(f"--snapshot-ts {text!r} is not an ISO 8601 time (e.g. 2030-01-01T12:00:00Z)")
    return (when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when).astimezone(timezone.utc)


def _check_args(ap: argparse.ArgumentParser, args: argparse.Namespace, stores: list) -> None:
    if args.window < 1:
        ap.error("--window must be >= 1")
    if not math.isfinite(args.stop_after_s) or args.stop_after_s <= 0:
        ap.error("--stop-after-s must be a number > 0")
    if args.plot and not args.group:
        ap.error("--plot needs --group")
    if not stores and not args.plot:
        ap.error("nothing to do: give --store to take a snapshot, or --group G --plot PNG to plot the table")
    if not stores and (args.max_lag_messages or args.max_lag_seconds or args.snapshot_ts):
        ap.error("--max-lag-*/--snapshot-ts only apply with --store")


def _thresholds(ap: argparse.ArgumentParser, args: argparse.Namespace):
    from pipelines.reports.lag_status import Thresholds, parse_thresholds

    try:
        return Thresholds(parse_thresholds(args.max_lag_messages, int, "--max-lag-messages"),
                          parse_thresholds(args.max_lag_seconds, float, "--max-lag-seconds"))
    except ValueError as exc:
        ap.error(str(exc))


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}".rstrip("0").rstrip(".")


def print_report(snapshot, status, group: str | None) -> None:
    """The snapshot as a compact table with each partition's status, then one line per group."""
    part_status = {(r["broker_name"], r["consumer_group"], r["topic"], r["queue_id"]): r["status"]
                   for r in status.to_pylist() if r["level"] == "partition"}
    header = ("broker", "group", "topic", "queue", "offset", "max", "lag", "lag_s", "status")
    lines = [header]
    for r in snapshot.to_pylist():
        if group is not None and r["consumer_group"] != group:
            continue
        key = (r["broker_name"], r["consumer_group"], r["topic"], r["queue_id"])
        lines.append((r["broker_name"], r["consumer_group"], r["topic"], str(r["queue_id"]),
                      "-" if r["consumer_offset"] is None else str(r["consumer_offset"]), str(r["max_offset"]),
                      str(r["lag_messages"]), _num(r["lag_seconds"]), part_status.get(key, "-")))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = {3, 4, 5, 6, 7}
    for line in lines:
        cells = [cell.rjust(w) if i in numeric else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths))]
        print("  ".join(cells).rstrip(), flush=True)
    for r in status.to_pylist():
        if r["level"] != "group" or (group is not None and r["consumer_group"] != group):
            continue
        print(f"group {r['consumer_group']} on {r['broker_name']}: {r['status']} lag={r['lag_messages']} "
              f"lag_s={_num(r['lag_seconds'])} ({r['reason']})", flush=True)


def take_snapshot(args: argparse.Namespace, lake, stores: list, snapshot_ts: datetime, thresholds) -> None:
    """Snapshot -> consumer_lag, evaluation -> consumer_lag_status, printed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipelines.reports.consumer_lag import append_snapshot, snapshot_stores
    from pipelines.reports.lag_status import append_status, evaluate, load_window

    snapshot = snapshot_stores([(s.name, s.location) for s in stores], snapshot_ts)
    written = append_snapshot(lake, snapshot)
    history = load_window(lake, [s.name for s in stores], args.window, until=snapshot_ts)
    status = evaluate(history, window=args.window, stop_after_s=args.stop_after_s, thresholds=thresholds)
    # only partitions in this run's snapshot (a store without groups now must not re-report old rows)
    ts_type = snapshot.schema.field("snapshot_ts").type
    status = status.filter(pc.field("evaluated_at") == pa.scalar(snapshot_ts, type=ts_type))
    appended = append_status(lake, status.filter(pc.field("broker_name").isin(written))) if written else 0
    print_report(snapshot, status, args.group)
    stamp = snapshot_ts.isoformat().replace("+00:00", "Z")
    print(f"consumer_lag: {snapshot.num_rows} rows at {stamp}"
          + (f", appended for {', '.join(written)}" if written else ", already recorded: nothing appended")
          + f"; consumer_lag_status: {appended} rows appended", flush=True)


def plot(ap: argparse.ArgumentParser, args: argparse.Namespace, lake, spark) -> None:
    from pipelines.reports.lag_plot import load_lag_series, render_lag_plot

    series = load_lag_series(lake, args.group, spark)
    if series.num_rows == 0:
        ap.error(f"--group {args.group!r}: no consumer_lag rows for this group in {lake}")
    path = render_lag_plot(series, args.group, args.plot)
    snapshots = len(set(series.column("snapshot_ts").to_pylist()))
    topics = len(set(series.column("topic").to_pylist()))
    print(f"plot: {path} ({snapshots} snapshots, {topics} topics of group {args.group})", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from pipelines.job_args import configure_job_logging, job_session, resolve_store_lake
    from pipelines.storage import StorageError

    configure_job_logging()

    stores, lake = resolve_store_lake(ap, args)
    _check_args(ap, args, stores)
    thresholds = _thresholds(ap, args)
    snapshot_ts = _snapshot_ts(ap, args.snapshot_ts)

    try:
        with job_session("rocketlake-consumer-lag", args.master) as spark:
            if stores:
                take_snapshot(args, lake, stores, snapshot_ts, thresholds)
            if args.plot:
                plot(ap, args, lake, spark)
    except StorageError as exc:  # a store URI with no store, storage that does not answer
        print(f"{ap.prog}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
