"""Streaming ingest: a Structured Streaming query over :mod:`pipelines.sources.commitlog_stream` whose
micro-batches run the batch ingest.

Why the batch ingest per micro-batch: ``foreachBatch`` collects the source's ``(broker, start, end)``
ranges and, per broker whose lake mark is below ``end``, calls
:func:`pipelines.ingest.ingest_store` with ``until_offset=end``. Each micro-batch therefore decodes
``[mark, end)`` with the same columnar decoder, split planning and single Spark job as a batch run
and commits every table with the same per-broker app-transaction marks. The lake's marks, not Spark's
checkpoint, decide where a batch starts: batch runs and streaming runs can alternate on one lake
(a micro-batch whose range a batch run already committed adds nothing), a micro-batch killed half
way is finished by the next run of either kind, and the checkpoint only keeps Spark's own
bookkeeping (which it needs to restart the query).

:func:`run_stream` runs the query until it is told to stop (SIGTERM/SIGINT: after the current
micro-batch), until ``max_batches`` micro-batches ran, or until no new data came for ``until_idle``
seconds.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from pipelines.ingest import DEFAULT_SPLIT_BYTES, app_id_for, check_payload_schemas, ingest_store, lake_payloads
from pipelines.payloads.declarations import Declarations, declarations_source
from pipelines.payloads.errors import PayloadSchemaError
from pipelines.payloads.reader import payload_outputs
from pipelines.job_args import StoreSpec
from pipelines.lake import app_version
from pipelines.session import register_data_source
from pipelines.sources.commitlog_stream import CommitLogStreamDataSource, stream_source_options
from pipelines.storage import Location
from pipelines.stream_args import DEFAULT_TRIGGER_INTERVAL, parse_interval
from schemas.messages import MESSAGES_TABLE
from schemas.tables import CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE, INGEST_RUNS_TABLE

log = logging.getLogger(__name__)

@dataclass
class StreamState:
    """What the micro-batches did, shared by Spark's foreachBatch thread and the job's main thread."""

    stores: dict[str, StoreSpec]
    lake: Location
    split_bytes: int
    payload_schemas: str | None = None  # the declarations file given to the job (None: the lake's own)
    payloads: Declarations | None = None  # re-read when the file changes (refresh_payloads)
    payload_bytes: bytes | None = None
    payloads_read: bool = False
    error: BaseException | None = None  # what stopped the stream from inside a micro-batch
    batches: int = 0
    last_data_at: float = field(default_factory=time.monotonic)
    runs: dict[str, int] = field(default_factory=dict)  # per broker: ingest runs, messages rows, last end
    rows: dict[str, int] = field(default_factory=dict)
    reach: dict[str, int] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)
    busy: threading.Lock = field(default_factory=threading.Lock)


# the tables whose marks show a run complete: ingest_runs is committed last; the queue tables may stop
# short of a run's end (where the dispatcher had got), so a later range still finishes them
_MARKED_TABLES = (MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE, INGEST_RUNS_TABLE)


def _complete_mark(lake: Location, broker: str, payloads: Declarations | None = None) -> int:
    """How far the lake holds the broker in every table: the lowest of the tables' marks (a run killed
    between its commits leaves some lower, and the next micro-batch finishes that run; a payload
    topic declared since has its table back-filled)."""
    app_id = app_id_for(broker)
    tables = _MARKED_TABLES + tuple(name for name, _, _ in payload_outputs(payloads)) if payloads else _MARKED_TABLES
    return min(app_version(lake, table, app_id) or 0 for table in tables)


def refresh_payloads(state: StreamState) -> None:
    """Read the payload declarations again when they changed (``rocketlake schema install`` while
    the stream runs: the declarations file or a schema file it names): the next micro-batch writes
    with them, an additive change evolving the tables. A file that no longer loads or checks raises
    :class:`PayloadSchemaError` (the stream stops with that message); a removed lake file means no
    payload tables from here on; an explicitly given file must exist."""
    where = declarations_source(state.payload_schemas, lake=state.lake)
    present = where.exists()
    if not present and state.payload_schemas is not None:
        raise PayloadSchemaError(f"{where}: no payload declarations file")
    if state.payloads_read and _fingerprint(where, state.payloads) == state.payload_bytes:
        return
    payloads = lake_payloads(state.lake, state.payload_schemas) if present else None
    check_payload_schemas(state.lake, payloads)
    if state.payloads_read or payloads is not None:
        log.info("stream: payload declarations %s", "removed: no payload tables" if payloads is None else
                 f"{'re' if state.payloads_read else ''}loaded: {', '.join(sorted(payloads.topic_names))}")
    state.payloads, state.payload_bytes, state.payloads_read = payloads, _fingerprint(where, payloads), True


def _fingerprint(where: Location, payloads: Declarations | None) -> bytes | None:
    """The declarations file's bytes and those of the schema files ``payloads`` names (a change to
    any of them is a change); None without the file."""
    if not where.exists():
        return None
    parts = [where.read_bytes()]
    for decl in payloads or ():
        if decl.schema_file:
            schema = Location.parse(decl.schema_file, where.option_map)
            parts.append(schema.read_bytes() if schema.exists() else b"(missing)")
    return b"\0".join(parts)


def write_batch(spark, state: StreamState, ranges: Sequence[tuple[str, int, int]], epoch_id: int) -> None:
    """One micro-batch: the batch ingest of ``[mark, end)`` for every broker with ``end > mark``."""
    refresh_payloads(state)
    for broker, start, end in sorted(ranges):
        mark = _complete_mark(state.lake, broker, state.payloads)
        if end <= mark:
            log.info("stream batch %d %s: [%d, %d) already in the lake (mark %d)", epoch_id, broker, start, end, mark)
            continue
        t0 = time.monotonic()
        summary = ingest_store(spark, state.stores[broker], state.lake, split_bytes=state.split_bytes,
                               until_offset=end, payloads=state.payloads)
        state.runs[broker] = state.runs.get(broker, 0) + 1
        state.rows[broker] = state.rows.get(broker, 0) + summary.rows.get(MESSAGES_TABLE, 0)
        state.reach[broker] = summary.to_offset
        log.info("stream batch %d %s: [%d, %d) +%d rows in %.1f s", epoch_id, broker, summary.from_offset,
                 summary.to_offset, summary.rows.get(MESSAGES_TABLE, 0), time.monotonic() - t0)


def run_stream(spark, stores: Sequence[StoreSpec], lake: Location, checkpoint: str, *,
               trigger_interval: str = parse_interval(DEFAULT_TRIGGER_INTERVAL), split_bytes: int = DEFAULT_SPLIT_BYTES,
               max_batches: int | None = None, until_idle: float | None = None,
               handle_signals: bool = True, payload_schemas: str | None = None) -> StreamState:
    """Run the streaming ingest until a stop condition (module docstring); returns what it did.
    ``payload_schemas``: as the batch ingest's (default: the lake's own declarations, if any)."""
    state = StreamState({s.name: s for s in stores}, lake, split_bytes, payload_schemas)
    refresh_payloads(state)  # a bad file stops the job before the query starts
    register_data_source(spark, CommitLogStreamDataSource)

    def on_batch(df, epoch_id: int) -> None:
        with state.busy:
            if state.stopping.is_set():
                return  # told to stop: leave the range to the next run (the lake's marks say where)
            ranges = [(r["broker"], int(r["start"]), int(r["end"])) for r in df.collect()]
            state.batches += 1
            if ranges:
                state.last_data_at = time.monotonic()
            try:
                write_batch(spark, state, ranges, epoch_id)
            except PayloadSchemaError as exc:  # the job's error, not the query's: stop and say it
                state.error = exc
                state.stopping.set()
                return
            if max_batches is not None and state.batches >= max_batches:
                state.stopping.set()

    previous = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        def on_signal(signum, _frame) -> None:
            log.info("stream: %s received, stopping after the current micro-batch", signal.Signals(signum).name)
            state.stopping.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    query = (spark.readStream.format(CommitLogStreamDataSource.name())
             .options(**stream_source_options(stores, lake)).load()
             .writeStream.foreachBatch(on_batch)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=trigger_interval)
             .queryName("rocketlake-stream")
             .start())
    log.info("stream: started (%s, trigger every %s, checkpoint %s)",
             ", ".join(f"{s.name}={s.path}" for s in stores), trigger_interval, checkpoint)
    idle_from: float | None = None  # the idle clock starts with the query's first trigger (start-up is not idle)
    try:
        while query.isActive and not state.stopping.is_set():
            query.awaitTermination(0.5)
            if idle_from is None and (state.batches or query.lastProgress is not None):
                idle_from = time.monotonic()
            if (until_idle is not None and idle_from is not None
                    and time.monotonic() - max(idle_from, state.last_data_at) >= until_idle):
                log.info("stream: no new data for %.0f s, stopping", until_idle)
                state.stopping.set()
        if query.isActive:
            with state.busy:  # the micro-batch under way ends first; later ones return at once
                pass
            query.stop()
        if query.exception() is not None:
            raise query.exception()
        if state.error is not None:
            raise state.error
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if query.isActive:
            query.stop()
    log.info("stream: stopped after %d micro-batch(es)", state.batches)
    return state


def check_stream_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Argument rules argparse cannot express: one-line errors (exit 2)."""
    if getattr(args, "follow", True) and not args.checkpoint:
        ap.error("--follow needs --checkpoint DIR (the streaming query's checkpoint)")
    if getattr(args, "until_offset", None) is not None:
        ap.error("--until-offset cannot be combined with --follow (a stream has no end offset)")
    if getattr(args, "split_bytes", 1) <= 0:
        ap.error("--split-bytes must be > 0")


def stream_job(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The streaming job behind ``jobs/stream_commitlog.py`` and ``ingest_commitlog.py --follow``:
    checks the arguments and the stores, runs :func:`run_stream`, prints one line per broker at the
    end. Storage trouble is a one-line error (exit 2), as in the batch job."""
    import sys

    from pipelines.job_args import configure_job_logging, job_session, resolve_store_lake
    from pipelines.payloads.errors import PayloadSchemaError
    from pipelines.storage import StorageError

    check_stream_args(ap, args)
    configure_job_logging()
    stores, lake = resolve_store_lake(ap, args)
    checkpoint = Location.parse(args.checkpoint).uri
    try:
        with job_session("rocketlake-stream", args.master) as spark:
            state = run_stream(spark, stores, lake, checkpoint, trigger_interval=args.trigger_interval,
                               split_bytes=getattr(args, "split_bytes", DEFAULT_SPLIT_BYTES),
                               max_batches=args.max_batches, until_idle=args.until_idle,
                               payload_schemas=args.payload_schemas)
    except (StorageError, PayloadSchemaError) as exc:
        print(f"{ap.prog}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    for spec in stores:
        reach = state.reach.get(spec.name)
        print(f"stream {spec.name}: {state.runs.get(spec.name, 0)} run(s), messages +{state.rows.get(spec.name, 0)}"
              + (f", lake mark {reach}" if reach is not None else ", nothing new"), flush=True)
    return 0
