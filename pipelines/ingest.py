"""Incremental, exactly-once ingest of broker stores into the Delta tables.

Per broker and table, the high-water mark is the commitlog offset the last committed run reached,
stored *in the table's own commit* as the Delta app transaction ``(rocketlake.ingest.<broker>,
end_offset)``. A run reads each table's mark, ingests ``[mark, end)`` and commits the rows and the
new mark together, so a rerun with nothing new adds nothing and a run killed anywhere, when rerun,
leaves no duplicates and no gaps (each table resumes from what it really committed).

* ``messages``: records that *start* in ``[mark, end)``; ``end`` is where complete records end
  (a record a live broker is still writing is left for the next run).
* ``consume_queue`` / ``index_entries``: units and entries whose commitlog offset is in
  ``[mark, dispatched_end)``, where ``dispatched_end`` is how far the broker's dispatcher has
  got, so entries written later for older records are not lost.
* ``corrupt_records``: structural findings of the commitlog walk over ``[mark, end)`` plus every
  record whose body CRC does not match. A segment whose messages splits' decode proves the walk
  would find nothing is not walked again (:mod:`pipelines.walk_pieces`).
* ``ingest_runs``: one row per broker and run.
* ``payload_<topic>`` / ``payload_quarantine``: the typed bodies of the topics the lake's payload
  declarations name (:mod:`pipelines.payloads`), for records that start in ``[mark, end)``, from the
  same splits in the same tasks as ``messages`` (each table from its own mark: a topic declared
  later is back-filled from the start of the store on its first run).

A store may be a local directory or a URI (``s3://bucket/store``): the driver learns the segments,
``dispatched_end`` and the commitlog end through the filesystem (listings and ranged reads,
:mod:`pipelines.store_files`, :mod:`pipelines.commitlog_ranges`), and every task reads its byte
range with ranged reads. Files are named by the store's URI (or absolute path) in ``corrupt_records``,
so the tables of a store and of its copy elsewhere differ only in that root.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from broker.store.constants import COMMITLOG_DIR
from pipelines import commitlog_ranges
from pipelines.commitlog_ranges import segment_files
from pipelines.job_args import StoreSpec
from pipelines.lake import app_version, append_arrow, delta_spark_available, scan_arrow, table_schema, write_table
from pipelines.payloads.evolution import check_evolution
from pipelines import walk_pieces
from pipelines.partition_writer import (FanOutWrite, PartitionJob, TableOut, TableWrite, real_partitions,
                                        collect_partitions)
from pipelines.payloads.declarations import Declarations, declarations_location, load_declarations
from pipelines.payloads.reader import PayloadReader, payload_outputs
from pipelines.sources import register_sources
from pipelines.sources.options import DEFAULT_SPLIT_BYTES, DIRECT_WRITE_OPTION, WALK_PIECES_OPTION
from pipelines.sources.rocketmq import (
    CommitLogFindingsReader,
    CommitLogSplit,
    RocketMQConsumeQueueDataSource,
    RocketMQDataSource,
    RocketMQIndexDataSource,
    store_source_options,
)
from pipelines.storage import Location
from pipelines.store_files import StoreFiles
from schemas.messages import MESSAGES, MESSAGES_TABLE
from schemas.tables import (
    CONSUME_QUEUE,
    CORRUPT_RECORDS,
    INDEX_ENTRIES,
    INGEST_NOTHING_NEW,
    INGEST_RUNS,
    INGEST_SUCCEEDED,
    CONSUME_QUEUE_TABLE,
    CORRUPT_RECORDS_SCHEMA,
    CORRUPT_RECORDS_TABLE,
    INDEX_ENTRIES_TABLE,
    INGEST_RUNS_SCHEMA,
    INGEST_RUNS_TABLE,
)

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    run_id: str
    broker: str
    from_offset: int
    to_offset: int
    rows: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    table_seconds: dict[str, float] = field(default_factory=dict)
    status: str = INGEST_SUCCEEDED

    def line(self) -> str:
        rows = ", ".join(f"{k} +{v}" for k, v in self.rows.items())
        return (f"{self.broker}: offsets [{self.from_offset}, {self.to_offset}) {rows or 'nothing new'} "
                f"in {self.seconds:.1f} s ({self.status})")


def app_id_for(broker: str) -> str:
    return f"rocketlake.ingest.{broker}"


def commitlog_end(store: "str | os.PathLike | Location", known_end: int | None = None) -> int:
    """Offset just past the last complete record (a torn or in-progress tail is not included).
    ``known_end`` (how far the consume queues reach) lets the walk start there."""
    segments, _ = segment_files(StoreFiles(store))
    return commitlog_ranges.commitlog_end(segments, known_end)


def dispatched_end(store: "str | os.PathLike | Location") -> int:
    """How far the consume queues reach into the commitlog (the broker's dispatch progress)."""
    return StoreFiles(store).dispatched_end()


def findings_reader(spec: StoreSpec, start: int, end: int, run_id: str) -> CommitLogFindingsReader:
    """The commitlog walk over ``[start, end)`` for its structural findings (corrupt regions, torn
    tails, bad sizes), one Spark task per segment."""
    return CommitLogFindingsReader({**store_source_options(spec.location), "brokerName": spec.name,
                                    "fromOffset": str(start), "untilOffset": str(end), "ingestRunId": run_id})


def file_findings(store: StoreFiles, broker: str, run_id: str) -> pa.Table:
    """The commitlog's file-level findings (gaps, odd file names), reported by the first run."""
    rows = [{"broker_name": broker, "file": f.file, "offset": f.offset, "reason": f"{f.kind}: {f.detail}",
             "bytes_skipped": f.bytes_skipped, "ingest_run_id": run_id} for f in store.commitlog_findings()]
    return pa.Table.from_pylist(rows, schema=CORRUPT_RECORDS_SCHEMA)


def lost_range_findings(broker: str, first: "commitlog_ranges.SegmentFile", since: int, end: int,
                        run_id: str) -> pa.Table:
    """A finding for commitlog bytes ``[since, first.base)`` (capped at ``end``) that the broker deleted
    (retention) before a run ingested them: the lake cannot have them, and it must say so rather than
    silently resume at the first remaining segment. Named by that segment, at its start."""
    stop = min(first.base, end)
    if stop <= since:
        return CORRUPT_RECORDS_SCHEMA.empty_table()
    log.warning("ingest %s: commitlog bytes [%d, %d) were deleted before they were ingested", broker, since, stop)
    return pa.Table.from_pylist([{
        "broker_name": broker, "file": first.label, "offset": 0,
        "reason": f"lost_range: commitlog bytes [{since}, {stop}) were deleted before they were ingested",
        "bytes_skipped": stop - since, "ingest_run_id": run_id}], schema=CORRUPT_RECORDS_SCHEMA)


def crc_findings(lake: "str | os.PathLike | Location", broker: str, start: int, end: int, run_id: str,
                 store: StoreFiles) -> pa.Table:
    """A finding per record of ``[start, end)`` in the messages table whose body CRC did not match
    (read back from the table just written: three columns, instead of decoding the commitlog again).
    ``file`` names the segment as the walk's findings do (the store's URI or absolute path)."""
    if app_version(lake, MESSAGES_TABLE, app_id_for(broker)) is None:
        return CORRUPT_RECORDS_SCHEMA.empty_table()
    col = pc.field
    bad = scan_arrow(lake, MESSAGES_TABLE, ["segment_file", "commitlog_offset", "body_crc"],
                     (col("broker_name") == broker) & (col("commitlog_offset") >= start)
                     & (col("commitlog_offset") < end) & ~col("body_crc_ok"))
    bad = bad.sort_by("commitlog_offset")
    offsets = pc.subtract(bad["commitlog_offset"], pc.cast(bad["segment_file"], pa.int64()))
    reasons = [f"crc_mismatch: BODYCRC {c} does not match the body" for c in bad["body_crc"].to_pylist()]
    n = bad.num_rows
    files = pa.array([store.label(COMMITLOG_DIR, name) for name in bad["segment_file"].to_pylist()], pa.string())
    return pa.table({"broker_name": pa.array([broker] * n, pa.string()), "file": files,
                     "offset": offsets, "reason": pa.array(reasons, pa.string()),
                     "bytes_skipped": pa.array([0] * n, pa.int64()),
                     "ingest_run_id": pa.array([run_id] * n, pa.string())}).cast(CORRUPT_RECORDS_SCHEMA)


def _split_order(split: CommitLogSplit) -> int:
    """Messages splits in commitlog order (the payload fan-out's splits beside them)."""
    return split.base + split.start


def walk_findings(spark, walk: CommitLogFindingsReader, pieces: pa.Table | None) -> pa.Table:
    """The findings walk's rows: none for a segment whose messages splits' decode proves the walk
    would find nothing (:func:`pipelines.walk_pieces.walk_finds_nothing`); the other segments are
    walked, in one Spark job when there are any. Why: the walk reads the whole store again, and on
    a healthy store its answer is known from the decode already."""
    segments = real_partitions(walk)
    known = walk_pieces.from_table(pieces) if pieces is not None else []
    todo = [s for s in segments if not walk_pieces.walk_finds_nothing(known, s.base, s.start, s.end)]
    log.info("findings walk: %d of %d segment ranges proven clean by the decode, %d to walk",
             len(segments) - len(todo), len(segments), len(todo))
    if not todo:
        return CORRUPT_RECORDS_SCHEMA.empty_table()
    return collect_partitions(spark, walk, CORRUPT_RECORDS_SCHEMA, todo)


def _mark(lake: "str | os.PathLike | Location", table: str, app_id: str) -> int:
    return app_version(lake, table, app_id) or 0


@dataclass
class _RunPlan:
    """What one run of one store writes: each table ``[mark, end)`` (consume queue and index entries
    to ``cq_end``, the dispatcher's progress)."""

    spec: StoreSpec
    lake: "str | os.PathLike | Location"
    app_id: str
    run_id: str
    marks: dict[str, int]
    end: int
    cq_end: int
    split_bytes: int
    payloads: Declarations | None = None

    @property
    def base_options(self) -> dict[str, str]:
        return {**store_source_options(self.spec.location), "brokerName": self.spec.name}

    @property
    def messages_options(self) -> dict[str, str]:
        return {**self.base_options, "splitBytes": str(self.split_bytes),
                "fromOffset": str(self.marks[MESSAGES_TABLE]), "untilOffset": str(self.end),
                "ingestRunId": self.run_id}

    def findings_reader(self) -> CommitLogFindingsReader | None:
        lo = self.marks[CORRUPT_RECORDS_TABLE]
        return findings_reader(self.spec, lo, self.end, self.run_id) if self.end > lo else None

    def payload_write(self) -> FanOutWrite | None:
        """The payload tables' fan-out over the commitlog splits from the lowest of their marks
        (each table keeps only its own ``[mark, end)``), ordered with the messages splits so a
        split's pages are read while cached; None when nothing is declared or all are current."""
        if not self.payloads or not len(self.payloads):
            return None
        outs = [TableOut(name, schema, partition_by, self.end, ("commitlog_offset", self.marks[name], self.end))
                for name, schema, partition_by in payload_outputs(self.payloads) if self.end > self.marks[name]]
        if not outs:
            return None
        lo = min(o.offset_range[1] for o in outs)
        reader = PayloadReader({**self.messages_options, "fromOffset": str(lo)}, self.payloads)
        return FanOutWrite(reader, self.lake, outs, self.app_id, f"ingest {self.spec.name} payloads",
                           order=_split_order)


_QUEUE_SOURCES = ((CONSUME_QUEUE, RocketMQConsumeQueueDataSource), (INDEX_ENTRIES, RocketMQIndexDataSource))


def _write_direct(spark, plan: _RunPlan, record: Callable[[str, Callable], None]) -> pa.Table | None:
    """delta-rs: the tables' files written by ONE Spark job (pipelines.partition_writer), each task
    reading and writing in the same Python worker (bodies go to Parquet straight from the split's
    read buffer), then committed table by table; returns the walk's findings."""
    spec, marks = plan.spec, plan.marks
    writes = []
    if plan.end > marks[MESSAGES_TABLE]:
        options = {**plan.messages_options, DIRECT_WRITE_OPTION: "true", WALK_PIECES_OPTION: "true"}
        writes.append(TableWrite(RocketMQDataSource(options).reader(None),
                                 plan.lake, MESSAGES_TABLE, MESSAGES.schema, list(MESSAGES.partition_by),
                                 plan.app_id, plan.end, ("commitlog_offset", marks[MESSAGES_TABLE], plan.end),
                                 f"ingest {spec.name} {MESSAGES_TABLE}", order=_split_order))
    for contract, source in _QUEUE_SOURCES:
        lo = marks[contract.name]
        if plan.cq_end > lo:  # fromOffset: the index reader skips files wholly below the mark
            writes.append(TableWrite(source({**plan.base_options, "fromOffset": str(lo), DIRECT_WRITE_OPTION: "true"})
                                     .reader(None), plan.lake,
                                     contract.name,
                                     contract.schema, list(contract.partition_by), plan.app_id, plan.cq_end,
                                     ("commitlog_offset", lo, plan.cq_end), f"ingest {spec.name} {contract.name}"))
    payloads = plan.payload_write()
    job = PartitionJob(writes + ([payloads] if payloads else []))
    names = [w.name for w in writes] + [o.name for o in (payloads.outputs if payloads else [])]
    t0 = time.monotonic()
    job.run(spark)
    log.info("ingest %s: files of %s written in %.1f s", spec.name, ", ".join(names) or "no table",
             time.monotonic() - t0)
    walk = plan.findings_reader()
    found = walk_findings(spark, walk, job.side_rows(MESSAGES_TABLE)) if walk else None
    for name in names:  # committed in this order: a rerun resumes each table from its own mark
        record(name, lambda: job.commit(name))
    return found


def _write_with_delta_spark(spark, plan: _RunPlan, record: Callable[[str, Callable], None]) -> pa.Table | None:
    """Delta Spark jar: each table from its data source through Spark's ``delta`` writer (one job
    each); returns the walk's findings."""
    marks = plan.marks
    for contract, source, stop, lo, options in (
            (MESSAGES, RocketMQDataSource, plan.end, marks[MESSAGES_TABLE], plan.messages_options),
            *((c, src, plan.cq_end, marks[c.name], plan.base_options) for c, src in _QUEUE_SOURCES)):
        if stop <= lo:
            continue
        df = (spark.read.options(**options).format(source.name()).load()
              .filter(f"commitlog_offset >= {lo} AND commitlog_offset < {stop}"))
        record(contract.name, lambda: write_table(df, plan.lake, contract.name, app_id=plan.app_id,
                                                  app_version=stop, schema=contract.schema,
                                                  partition_by=contract.partition_by))
    payloads = plan.payload_write()
    if payloads:  # no Spark-side writer for a reader of (table, batch) pairs: delta-rs, as without the jar
        job = PartitionJob([payloads])
        job.run(spark)
        for out in payloads.outputs:
            record(out.name, lambda: job.commit(out.name))
    walk = plan.findings_reader()
    return collect_partitions(spark, walk, CORRUPT_RECORDS_SCHEMA) if walk else None


def lake_payloads(lake: "str | os.PathLike | Location", path: "str | os.PathLike | None" = None) -> Declarations | None:
    """The payload declarations a run uses: ``path`` when given, else the lake's own file when it
    has one (so batch and streaming runs on one lake write the same payload tables), else None.
    Raises :class:`pipelines.payloads.errors.PayloadSchemaError` for a bad file."""
    if path is not None:
        return load_declarations(path, lake=lake)
    where = declarations_location(lake)
    return load_declarations(where) if where.exists() else None


def check_payload_schemas(lake: "str | os.PathLike | Location", payloads: Declarations | None) -> None:
    """Refuse declarations whose schema change a payload table cannot take (before any file is
    written): additive changes evolve the table at its next commit, anything else is an error."""
    for name, schema, _ in payload_outputs(payloads) if payloads else ():
        current = table_schema(lake, name)
        if current is not None:
            check_evolution(current, schema)


def ingest_store(spark, spec: StoreSpec, lake: "str | os.PathLike | Location", *,
                 split_bytes: int = DEFAULT_SPLIT_BYTES, until_offset: int | None = None,
                 payloads: Declarations | None = None) -> RunSummary:
    """One incremental run for one store (``payloads``: see :func:`lake_payloads`; None writes no
    payload table). A store that lists no commitlog segment raises
    :class:`pipelines.storage.StorageError` (it is a wrong location, not an empty store)."""
    started = time.monotonic()
    started_at = datetime.now(timezone.utc)
    run_id = uuid.uuid4().hex
    app_id = app_id_for(spec.name)
    store = StoreFiles(spec.location)
    segments, _ = segment_files(store)
    dispatched = store.dispatched_end()
    end = commitlog_ranges.commitlog_end(segments, dispatched or None)
    if until_offset is not None:
        end = min(end, until_offset)
    cq_end = min(end, dispatched)
    payload_tables = [name for name, _, _ in payload_outputs(payloads)] if payloads else []
    marks = {t: _mark(lake, t, app_id) for t in (MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE,
                                                  CORRUPT_RECORDS_TABLE, INGEST_RUNS_TABLE, *payload_tables)}
    summary = RunSummary(run_id, spec.name, marks[MESSAGES_TABLE], end)
    log.info("ingest %s: %s from %s to %d (run %s)", spec.name, spec.path, marks, end, run_id)

    def record(name: str, run) -> None:
        t0 = time.monotonic()
        result = run()
        summary.table_seconds[name] = time.monotonic() - t0
        log.info("ingest %s: %s %s in %.1f s", spec.name, name,
                 "skipped (already committed)" if result.skipped else f"+{result.num_rows} rows",
                 summary.table_seconds[name])
        if result.skipped:
            summary.skipped.append(name)
        else:
            summary.rows[name] = int(result.num_rows or 0)

    plan = _RunPlan(spec, lake, app_id, run_id, marks, end, cq_end, split_bytes, payloads)
    write = _write_direct if not delta_spark_available(spark) else _write_with_delta_spark
    walk_findings = write(spark, plan, record)
    findings_from = marks[CORRUPT_RECORDS_TABLE]
    for name in (MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE):
        if name not in summary.rows and name not in summary.skipped:
            summary.skipped.append(name)  # already committed up to this run's end
    if end > findings_from:
        if findings_from == 0:
            walk_findings = pa.concat_tables([file_findings(store, spec.name, run_id), walk_findings])
        found = pa.concat_tables([lost_range_findings(spec.name, segments[0], findings_from, end, run_id), walk_findings,
                                  crc_findings(lake, spec.name, findings_from, end, run_id, store)])
        record(CORRUPT_RECORDS_TABLE, lambda: append_arrow(lake, CORRUPT_RECORDS_TABLE, found,
                                                           partition_by=CORRUPT_RECORDS.partition_by,
                                                           app_id=app_id, app_version=end))
    summary.seconds = time.monotonic() - started
    summary.status = INGEST_SUCCEEDED if summary.rows else INGEST_NOTHING_NEW
    if end > marks[INGEST_RUNS_TABLE]:
        run_row = pa.Table.from_pylist([{
            "ingest_run_id": run_id, "broker_name": spec.name, "from_offset": summary.from_offset, "to_offset": end,
            "messages_rows": summary.rows.get(MESSAGES_TABLE, 0),
            "consume_queue_rows": summary.rows.get(CONSUME_QUEUE_TABLE, 0),
            "index_entries_rows": summary.rows.get(INDEX_ENTRIES_TABLE, 0),
            "corrupt_records_rows": summary.rows.get(CORRUPT_RECORDS_TABLE, 0),
            "started_at": started_at, "duration_s": summary.seconds, "status": summary.status}],
            schema=INGEST_RUNS_SCHEMA)
        record(INGEST_RUNS_TABLE, lambda: append_arrow(lake, INGEST_RUNS_TABLE, run_row, partition_by=INGEST_RUNS.partition_by,
                                                      app_id=app_id, app_version=end))
    return summary


def ingest(spark, stores: list[StoreSpec], lake: "str | os.PathLike | Location", *,
           split_bytes: int = DEFAULT_SPLIT_BYTES, until_offset: int | None = None,
           payload_schemas: "str | os.PathLike | None" = None) -> list[RunSummary]:
    """Every store, one after the other; the payload declarations (``payload_schemas`` or the
    lake's own) are loaded and checked against the tables once, before any store is read."""
    payloads = lake_payloads(lake, payload_schemas)
    check_payload_schemas(lake, payloads)
    if delta_spark_available(spark):  # Spark reads the stores as data sources only on that path
        register_sources(spark)
    return [ingest_store(spark, spec, lake, split_bytes=split_bytes, until_offset=until_offset, payloads=payloads)
            for spec in stores]
