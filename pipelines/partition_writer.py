"""Read and write in the same Spark task: data-source readers' partitions straight into Delta files.

Why this exists: ``spark.read.format("rocketmq")…write.format("rocketlake_delta")`` moves every row
from the reading Python worker into the JVM (Arrow → UnsafeRow) and back out to the writing Python
worker (UnsafeRow → Arrow). For the messages table, whose bodies are most of the bytes, those two
hops cost more than decoding and Parquet encoding together. Here Spark only schedules the work:
``spark.range(n, numPartitions=n).mapInArrow`` runs the tasks, and a task calls
``reader.read(partition)`` and hands the batches to :class:`~pipelines.delta_writer.DeltaArrowWriter`
in the same worker. Only the files' ``add`` actions (and small collected rows) travel back to the
driver, which commits each table as ONE Delta transaction (with the app transaction) through
:mod:`pipelines.delta_commit`, exactly as the data-source writer does. :class:`PartitionJob` runs
several tables' writes as one Spark job (the ingest's four inputs); :func:`write_partitions` is the
one-table case. A :class:`FanOutWrite` feeds several tables from one reader (the payload tables). The lake may be a local directory or a URI (``s3://…``) with storage options: the
tasks write through the table's pickled :class:`~pipelines.storage.Location`.

Used for the delta-rs engine. With the Delta Spark jar, :func:`pipelines.lake.write_table` on the
data-source DataFrame is the path (Spark's own ``delta`` writer then does the Parquet encoding).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pipelines.delta_files import DEFAULT_ROWS_PER_FILE, AddInfo
from pipelines.delta_writer import DeltaArrowWriter, DeltaCommitMessage, TaskFiles
from pipelines.lake import WriteResult, already_recorded, result_from_outcome, table_location
from pipelines.sources.options import SideRows
from pipelines.storage import Location
from pipelines import worker_memory

log = logging.getLogger(__name__)


def _worker_logging() -> None:
    """Python workers start with no logging set up: send INFO lines to stderr (the executor's log)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _freeze_heap() -> None:
    """Move every object alive now into the collector's permanent generation (``gc.freeze``).

    Why: PySpark's daemon runs a full ``gc.collect()`` each time a reused Python worker finishes a
    task, and a full collection walks every tracked object, most of them the modules the worker
    imported (pyspark, pyarrow, numba, pandas). Measured on a 4 GiB ingest: 25 such collections of
    80-150 ms each, ~2 CPU-s of a job that frees nothing with them. A task starts right after such a
    collection, so what is alive then is the worker's long-lived state, not garbage; once frozen it is
    no longer walked. What the tasks allocate is collected as before."""
    gc.freeze()


def _describe(part: InputPartition) -> str:
    value = getattr(part, "value", None)
    if hasattr(part, "start") and hasattr(part, "end") and hasattr(part, "file_name"):
        return f"{part.file_name} [{part.start}, {part.end})"
    return str(value if value is not None else part)


def _in_range(batch: pa.RecordBatch, column: str, lo: int, hi: int) -> pa.RecordBatch:
    col = batch.column(column)
    mask = pc.and_(pc.greater_equal(col, lo), pc.less(col, hi))
    return batch if pc.all(mask).as_py() else batch.filter(mask)


@dataclass
class TableWrite:
    """One table's share of a job: every row ``reader`` yields goes to ``<lake>/<name>``.

    ``offset_range=(column, lo, hi)`` keeps the rows with ``lo <= column < hi`` (applied in the task).
    ``app_id``/``app_version``: as :func:`pipelines.lake.write_table` (skipped when already recorded).
    ``label`` starts each task's progress line (default: the table name)."""

    reader: DataSourceReader
    lake: "str | os.PathLike | Location"
    name: str
    schema: pa.Schema
    partition_by: list[str] = field(default_factory=list)
    app_id: str | None = None
    app_version: int | None = None
    offset_range: tuple[str, int, int] | None = None
    label: str | None = None
    order: Callable[[InputPartition], Any] | None = None


@dataclass
class TableOut:
    """One table a :class:`FanOutWrite` feeds: rows with ``lo <= column < hi`` (``offset_range``)
    committed with ``app_version`` (each table resumes from its own mark)."""

    name: str
    schema: pa.Schema
    partition_by: list[str] = field(default_factory=list)
    app_version: int | None = None
    offset_range: tuple[str, int, int] | None = None


@dataclass
class FanOutWrite:
    """One reader, several tables: ``reader.read(part)`` yields ``(table name, RecordBatch)`` pairs
    and each goes to its table's files in the same task (the payload tables of the topics that a
    commitlog split holds are decoded once, not once per table). Pairs for a table that is not
    among ``outputs`` (or already recorded) are dropped."""

    reader: DataSourceReader
    lake: "str | os.PathLike | Location"
    outputs: list[TableOut]
    app_id: str | None = None
    label: str | None = None
    order: Callable[[InputPartition], Any] | None = None


def _fan_out(w: TableWrite) -> FanOutWrite:
    """A one-table write as the general case (its reader yields bare batches)."""
    return FanOutWrite(w.reader, w.lake, [TableOut(w.name, w.schema, list(w.partition_by), w.app_version,
                                                   w.offset_range)], w.app_id, w.label or w.name, w.order)


@dataclass
class RowsCollect:
    """A reader whose (few) rows come back to the driver, e.g. the commitlog walk's findings;
    ``parts``: only these of its partitions (default: all)."""

    reader: DataSourceReader
    schema: pa.Schema
    parts: list[InputPartition] | None = None


class PartitionJob:
    """Several tables' writes and row collections run as ONE Spark job, then committed table by
    table in the order the caller chooses (:meth:`commit`).

    Why one job: each Spark job pays its own start and ends with a tail where one core waits for the
    other's last task. The ingest writes three inputs (commitlog splits, consume queues, index
    files); as one job of ordered tasks (largest inputs first) the small ones fill the tail of the
    large, and both cores stay busy to the end. A write's reader may also yield
    :class:`~pipelines.sources.options.SideRows` (a commitlog split's walk pieces): they come back
    to the driver (:meth:`side_rows`) instead of going to the table. A failed job removes every file it wrote
    (:meth:`run` raises); files of a table whose commit is never made (the driver killed between two
    commits) are left unreferenced, as a killed single write leaves them, and never read."""

    def __init__(self, writes: "list[TableWrite | FanOutWrite]", collects: list[RowsCollect] = ()) -> None:
        self.writes = [w if isinstance(w, FanOutWrite) else _fan_out(w) for w in writes]
        self.fanned = [isinstance(w, FanOutWrite) for w in writes]  # readers yielding (table, batch)
        self.collects = list(collects)
        self.results: dict[str, WriteResult] = {}
        self.messages: dict[str, list[DeltaCommitMessage]] = {}
        self.writers: dict[str, DeltaArrowWriter] = {}
        self.collected: list[pa.Table] = []
        self.side: dict[int, list[pa.Table]] = {}
        self._tables: dict[str, Location] = {}
        self._large = 0

    def run(self, spark) -> None:
        """Write every table's files and collect the rows (nothing is committed yet)."""
        tasks, totals = self._plan()
        if not tasks:
            return
        writes, writers, collects = self.writes, self.writers, self.collects
        seen: dict[tuple[int, int], int] = {}
        ordinal: list[int] = []  # partition i/n of its own table, as the progress lines count them
        for kind, i, _ in tasks:
            seen[(kind, i)] = seen.get((kind, i), 0) + 1
            ordinal.append(seen[(kind, i)])
        units = _units(len(tasks), self._large, max(1, int(spark.sparkContext.defaultParallelism)))

        fanned = self.fanned
        n_large = self._large

        def collect_rows(i: int, part: InputPartition) -> bytes:
            schema = collects[i].schema
            return _ipc(schema, (rows.cast(schema) if rows.schema != schema else rows
                                 for rows in collects[i].reader.read(part)))

        def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            _worker_logging()
            _freeze_heap()
            for batch in batches:
                for u in batch.column(0).to_pylist():
                    if units[u] and units[u][0] >= n_large:  # this worker is done with the large inputs
                        worker_memory.give_back()
                    for index in units[u]:
                        kind, i, part = tasks[index]
                        if kind == 1:
                            yield _result(kind, i, None, None, collect_rows(i, part))
                            continue
                        w = writes[i]
                        t0 = time.monotonic()
                        side: list[pa.RecordBatch] = []
                        done = _write_part(w, fanned[i], part, {o.name: writers[o.name] for o in w.outputs
                                                                if o.name in writers}, index, side)
                        log.info("%s: partition %d/%d %s: %s in %.1f s", w.label or w.outputs[0].name,
                                 ordinal[index], totals[i], _describe(part), _counts(done, fanned[i]),
                                 time.monotonic() - t0)
                        for name, message in done.items():
                            yield _result(kind, i, name, json.dumps(asdict(message)), None)
                        if side:
                            yield _result(_SIDE, i, None, None, _ipc(side[0].schema, side))

        try:
            rows = spark.range(0, len(units), 1, len(units)).mapInArrow(task, _RESULT_SCHEMA).toArrow()
        except BaseException:
            self.abort()
            raise
        rows = pa.table(rows)
        for kind, index, table, message, data in zip(*(rows.column(n).to_pylist()
                                                       for n in ("kind", "index", "table", "commit_message", "rows"))):
            if kind == 1:
                self.collected.append(pa.ipc.open_stream(data).read_all())
                continue
            if kind == _SIDE:
                self.side.setdefault(index, []).append(pa.ipc.open_stream(data).read_all())
                continue
            payload = json.loads(message)
            files = [AddInfo(**f) for f in payload.pop("files")]
            self.messages[table].append(DeltaCommitMessage(files=files, **payload))

    def _plan(self) -> tuple[list[tuple[int, int, InputPartition]], dict[int, int]]:
        """The job's tasks as (kind, index, partition), kind 0 a write and 1 a collection, in the order
        they run: the first write's (the largest: commitlog splits, in its ``order``) and the
        collections', then the other writes' smaller tasks, which fill the last round of the large
        ones. Also makes the writers; tables already recorded are skipped."""
        large: list[tuple[int, int, InputPartition]] = []
        small: list[tuple[int, int, InputPartition]] = []
        totals: dict[int, int] = {}
        order_of: dict[tuple[int, int], Callable[[InputPartition], Any] | None] = {}
        for i, w in enumerate(self.writes):
            live = 0
            for out in w.outputs:
                skipped = already_recorded(w.lake, out.name, w.app_id, out.app_version, "delta-rs")
                if skipped is not None:
                    self.results[out.name] = skipped
                    continue
                table = self._tables[out.name] = table_location(w.lake, out.name)
                if table.is_local:
                    os.makedirs(table.uri, exist_ok=True)
                self.writers[out.name] = DeltaArrowWriter(
                    table=table, arrow_schema=out.schema, partition_by=list(out.partition_by), overwrite=False,
                    app_id=w.app_id, app_version=out.app_version, result_file=None, custom_metadata=None,
                    rows_per_file=DEFAULT_ROWS_PER_FILE)
                self.messages[out.name] = []
                live += 1
            if not live:
                continue
            parts = real_partitions(w.reader)
            totals[i] = len(parts)
            if not order_of or w.order is not None:  # the first write that runs, and ordered ones
                order_of[(0, i)] = w.order
                large.extend((0, i, p) for p in parts)
            else:
                small.extend((0, i, p) for p in parts)
        if large and all(order_of[(kind, i)] is not None for kind, i, _ in large):
            large.sort(key=lambda t: order_of[(t[0], t[1])](t[2]))  # stable
        for j, c in enumerate(self.collects):
            large.extend((1, j, p) for p in (real_partitions(c.reader) if c.parts is None else c.parts))
        self._large = len(large)
        return large + small, totals

    def commit(self, name: str) -> WriteResult:
        """Commit table ``name``'s files in one Delta transaction (with its app transaction)."""
        if name in self.results:
            return self.results[name]
        writer = self.writers[name]
        self.results[name] = result_from_outcome(str(self._tables[name]), writer.finish(self.messages[name]))
        return self.results[name]

    def abort(self) -> None:
        """Remove every file of every table of this job (also of tasks that never reported)."""
        for writer in self.writers.values():
            writer.abort([])

    def rows(self, schema: pa.Schema) -> pa.Table:
        """The collected rows (all collections share ``schema``)."""
        return pa.concat_tables([schema.empty_table(), *(t.cast(schema) for t in self.collected)])

    def side_rows(self, table: str) -> pa.Table | None:
        """The :class:`~pipelines.sources.options.SideRows` of the write that feeds ``table``, all its
        tasks' together; None when it yielded none (e.g. the table was already recorded)."""
        for i, w in enumerate(self.writes):
            if any(o.name == table for o in w.outputs):
                got = self.side.get(i)
                return pa.concat_tables(got) if got else None
        return None


def _units(n_tasks: int, n_large: int, cores: int) -> list[list[int]]:
    """Task indexes per Spark task: one per large input; the small ones (queues, index files: tens of
    ms each, where a Spark task costs ~50 ms to start here) dealt round robin into one group per core.
    A worker starts a group with :func:`pipelines.worker_memory.give_back`: it has no large input left."""
    small = list(range(n_large, n_tasks))
    return [[k] for k in range(n_large)] + [small[g::cores] for g in range(min(cores, len(small)))]


_RESULT_SCHEMA = "kind int, index int, table string, commit_message string, rows binary"
_SIDE = 2  # a result's kind: a write task's side rows (0: a table's commit message, 1: collected rows)


def _ipc(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> bytes:
    """``batches`` as one Arrow IPC stream (how a task's rows travel back to the driver)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as out:
        for b in batches:
            out.write_batch(b)
    return sink.getvalue().to_pybytes()


def _result(kind: int, index: int, table: str | None, message: str | None, rows: bytes | None) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"kind": pa.array([kind], pa.int32()), "index": pa.array([index], pa.int32()),
                                       "table": pa.array([table], pa.string()),
                                       "commit_message": pa.array([message], pa.string()),
                                       "rows": pa.array([rows], pa.binary())})


def _counts(done: dict[str, DeltaCommitMessage], fanned: bool) -> str:
    """``N rows, M files`` (per table for a fan-out) for a task's progress line."""
    def one(m: DeltaCommitMessage) -> str:
        return f"{sum(f.num_records for f in m.files)} rows, {len(m.files)} files"
    if not fanned:
        return one(next(iter(done.values())))
    return "; ".join(f"{t} {one(m)}" for t, m in done.items()) or "no rows"


def _write_part(w: FanOutWrite, fanned: bool, part: InputPartition, writers: dict[str, DeltaArrowWriter],
                part_id: int, side: list[pa.RecordBatch]) -> dict[str, DeltaCommitMessage]:
    """One input of a write into its tables' files (the commit messages by table; a one-table write
    always reports, even with no rows); the reader's side rows go to ``side``."""
    outs = {o.name: o for o in w.outputs if o.name in writers}
    single = None if fanned else w.outputs[0].name
    files: dict[str, TaskFiles] = {} if fanned else {single: writers[single].task_files(part_id)}
    try:
        for item in w.reader.read(part):
            if isinstance(item, SideRows):
                side.append(item.batch)
                continue
            name, batch = (single, item) if single else item
            out = outs.get(name)
            if out is None:
                continue
            if out.offset_range is not None:
                batch = _in_range(batch, *out.offset_range)
            if batch.num_rows:
                sink = files.get(name)
                if sink is None:
                    sink = files[name] = writers[name].task_files(part_id)
                sink.write(batch)
        return {name: sink.close() for name, sink in files.items()}
    except BaseException:
        for sink in files.values():
            sink.discard()
        raise


def real_partitions(reader: DataSourceReader) -> list[InputPartition]:
    """The reader's partitions without the "nothing to read" marker (a bare ``InputPartition``)."""
    return [p for p in reader.partitions() if type(p) is not InputPartition]  # noqa: E721 (the empty marker)


def write_partitions(spark, reader: DataSourceReader, lake_dir: str | os.PathLike | Location, name: str, *,
                     schema: pa.Schema, partition_by: Iterable[str] = (),
                     app_id: str | None = None, app_version: int | None = None,
                     offset_range: tuple[str, int, int] | None = None,
                     label: str | None = None) -> WriteResult:
    """Append every row ``reader`` yields to ``<lake_dir>/<name>`` in one Delta commit (delta-rs):
    a :class:`PartitionJob` of one :class:`TableWrite`. Each task logs one progress line:
    partition i/n, what it covered, rows, seconds."""
    job = PartitionJob([TableWrite(reader, lake_dir, name, schema, list(partition_by), app_id, app_version,
                                   offset_range, label)])
    job.run(spark)
    return job.commit(name)


def collect_partitions(spark, reader: DataSourceReader, schema: pa.Schema,
                       parts: list[InputPartition] | None = None) -> pa.Table:
    """Every row ``reader`` yields (of ``parts`` only, when given), read in parallel by Spark tasks
    and collected on the driver (for small results of a scan over large inputs, e.g. the commitlog
    walk's findings)."""
    job = PartitionJob([], [RowsCollect(reader, schema, parts)])
    job.run(spark)
    return job.rows(schema)
