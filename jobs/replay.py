"""spark-submit entry: replay a selection of the lake's messages through a producer, exactly once.

    spark-submit jobs/replay.py --lake LAKE --namesrv HOST:PORT[;HOST:PORT] SELECTION [--target-topic T]
        [--rate MSGS_PER_S] [--dry-run] [--run-id ID] [--producer-group G] [--keep-order] [--keep-msg-id]
        [--max-messages N] [--storage-option KEY=VALUE ...]

SELECTION is one of: --topic T --since ISO --until ISO [--broker B] [--queue Q] [--tag TAG] [--key K];
--where "SQL predicate over messages"; --dlq GROUP [--original-topic T] [--since ISO] [--until ISO].
Prints the plan, then sends; every message's fate is in the replay_ledger table and the run in
replay_runs. Rerun with the same --run-id to finish an interrupted or incomplete run: what was sent is
never sent again. LAKE is a directory or a URI (s3://bucket/lake, file://...); its storage options come
from the environment and --storage-option and travel with it to the tasks that send. Exit 0:
SUCCEEDED or DRY_RUN; 1: INCOMPLETE (rerun it); 2: bad input, or a lake that cannot be used.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when not installed

from broker.cli import _iso_to_ms, _positive, positive_float  # noqa: E402 - after the path set-up

log = logging.getLogger("rocketlake.replay")


def _run_id(text: str) -> str:
    from pipelines.replay.lineage import validate_run_id

    try:
        return validate_run_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from pipelines.sql.cli import add_lake_args

    ap = argparse.ArgumentParser(prog="replay.py", description=__doc__.split("\n\n")[0],
                                 epilog="Selection forms: " + __doc__.split("\n\n")[2].split("\n")[0])
    add_lake_args(ap, required=True)
    ap.add_argument("--namesrv", required=True, metavar="HOST:PORT[;HOST:PORT]", help="target cluster's name server(s)")
    ap.add_argument("--master", default=None, help="Spark master when not run by spark-submit (default local[2])")
    sel = ap.add_argument_group("selection (one of --topic, --where, --dlq)")
    sel.add_argument("--topic", help="records stored in this topic (with --since and --until)")
    sel.add_argument("--where", metavar="PREDICATE", help="Spark SQL predicate over the messages table")
    sel.add_argument("--dlq", metavar="GROUP", help="the group's %%DLQ%% messages, back to their original topics")
    sel.add_argument("--since", type=_iso_to_ms, metavar="ISO", help="store time >= this (ISO-8601, UTC if no zone, or epoch ms)")
    sel.add_argument("--until", type=_iso_to_ms, metavar="ISO", help="store time < this")
    sel.add_argument("--broker", help="only this source broker")
    sel.add_argument("--queue", type=int, help="only this source queue id (with --topic)")
    sel.add_argument("--tag", help="only messages with this tag (with --topic)")
    sel.add_argument("--key", help="only messages with this key (with --topic)")
    sel.add_argument("--original-topic", help="with --dlq: only messages first sent to this topic")
    ap.add_argument("--target-topic", help="send everything to this topic (default: the source topic; --dlq: "
                                           "each message's original topic)")
    ap.add_argument("--rate", type=positive_float("messages per second"), help="messages per second over all tasks (default: unthrottled)")
    ap.add_argument("--dry-run", action="store_true", help="plan and record the run (DRY_RUN), send nothing")
    ap.add_argument("--run-id", type=_run_id, help="name the run; rerun with the same id to finish it (default: generated)")
    ap.add_argument("--producer-group", default="rocketlake-replay", help="producer group (default rocketlake-replay)")
    ap.add_argument("--keep-order", action="store_true",
                    help="keep per-queue order: one message in flight per target queue (slower)")
    ap.add_argument("--keep-msg-id", action="store_true", help="keep the original UNIQ_KEY (default: a fresh one)")
    ap.add_argument("--max-messages", type=_positive, help="replay at most the first N selected (commitlog order)")
    ap.add_argument("--send-timeout", type=positive_float("seconds"), default=3.0, help="seconds to wait for a send's answer (default 3)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from pipelines.job_args import configure_job_logging, job_session, resolve_store_lake
    from pipelines.replay.run import Replay, ReplayError, ReplayOptions
    from pipelines.replay.selection import Selection, SelectionError
    from pipelines.replay.target import TargetError
    from pipelines.storage import StorageError

    _, lake = resolve_store_lake(ap, args)  # a malformed option or a lake that does not answer: exit 2
    selection = None
    if any(v is not None for v in (args.topic, args.where, args.dlq)):
        try:
            selection = Selection(topic=args.topic, where=args.where, dlq_group=args.dlq, since_ms=args.since,
                                  until_ms=args.until, broker=args.broker, queue=args.queue, tag=args.tag,
                                  key=args.key, original_topic=args.original_topic)
        except SelectionError as exc:
            ap.error(str(exc))
    elif args.run_id is None:
        ap.error("give a selection (--topic, --where or --dlq), or --run-id of a run to finish")
    configure_job_logging()
    opts = ReplayOptions(lake=lake, namesrv=args.namesrv, selection=selection, target_topic=args.target_topic,
                         rate=args.rate, dry_run=args.dry_run, run_id=args.run_id, producer_group=args.producer_group,
                         keep_order=args.keep_order, keep_msg_id=args.keep_msg_id, max_messages=args.max_messages,
                         send_timeout=args.send_timeout)
    try:
        with job_session("rocketlake-replay", args.master) as spark:
            outcome = Replay(spark, opts, out=lambda line: print(line, flush=True)).run()
    except (ReplayError, SelectionError, TargetError, StorageError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    rate = outcome.send_rate()
    if rate is not None:
        print(f"replay {outcome.run.run_id}: {rate[0]:.0f} msg/s, {rate[1]:.2f} MB/s while sending, "
              f"{outcome.elapsed_s:.1f} s in all", flush=True)
    return 0 if outcome.complete else 1


if __name__ == "__main__":
    sys.exit(main())
