"""Read and write in the same Spark task: a data-source reader's partitions straight into Delta files.

Why this exists: ``spark.read.format("rocketmq")…write.format("rocketlake_delta")`` moves every row
from the reading Python worker into the JVM (Arrow → UnsafeRow) and back out to the writing Python
worker (UnsafeRow → Arrow). For the messages table, whose bodies are most of the bytes, those two
hops cost more than decoding and Parquet encoding together. Here Spark only schedules the work:
``spark.range(n, numPartitions=n).mapInArrow`` runs one task per reader partition, and the task
calls ``reader.read(partition)`` and hands the batches to :class:`~pipelines.delta_writer.DeltaArrowWriter`
in the same worker. Only the files' ``add`` actions travel back to the driver, which commits them all
as ONE Delta transaction (with the app transaction) through :mod:`pipelines.delta_commit`, exactly as
the data-source writer does. The lake may be a local directory or a URI (``s3://…``) with storage
options: the tasks write through the table's pickled :class:`~pipelines.storage.Location`.

Used for the delta-rs engine. With the Delta Spark jar, :func:`pipelines.lake.write_table` on the
data-source DataFrame is the path (Spark's own ``delta`` writer then does the Parquet encoding).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pipelines.delta_files import DEFAULT_ROWS_PER_FILE, AddInfo
from pipelines.delta_writer import DeltaArrowWriter, DeltaCommitMessage
from pipelines.lake import WriteResult, already_recorded, result_from_outcome, table_location
from pipelines.storage import Location

log = logging.getLogger(__name__)

_RESULT_SCHEMA = "commit_message string"


def _worker_logging() -> None:
    """Python workers start with no logging set up: send INFO lines to stderr (the executor's log)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _describe(part: InputPartition) -> str:
    value = getattr(part, "value", None)
    if hasattr(part, "start") and hasattr(part, "end") and hasattr(part, "file_name"):
        return f"{part.file_name} [{part.start}, {part.end})"
    return str(value if value is not None else part)


def _in_range(batch: pa.RecordBatch, column: str, lo: int, hi: int) -> pa.RecordBatch:
    col = batch.column(column)
    mask = pc.and_(pc.greater_equal(col, lo), pc.less(col, hi))
    return batch if pc.all(mask).as_py() else batch.filter(mask)


def write_partitions(spark, reader: DataSourceReader, lake_dir: str | os.PathLike | Location, name: str, *,
                     schema: pa.Schema, partition_by: Iterable[str] = (),
                     app_id: str | None = None, app_version: int | None = None,
                     offset_range: tuple[str, int, int] | None = None,
                     label: str | None = None) -> WriteResult:
    """Append every row ``reader`` yields to ``<lake_dir>/<name>`` in one Delta commit (delta-rs).

    ``offset_range=(column, lo, hi)`` keeps the rows with ``lo <= column < hi`` (applied in the task).
    ``app_id``/``app_version``: as :func:`pipelines.lake.write_table` (skipped when already recorded).
    Each task logs one progress line: partition i/n, what it covered, rows, seconds.
    """
    skipped = already_recorded(lake_dir, name, app_id, app_version, "delta-rs")
    if skipped is not None:
        return skipped
    table = table_location(lake_dir, name)
    parts = [p for p in reader.partitions() if type(p) is not InputPartition]  # noqa: E721 (the empty marker)
    if table.is_local:
        os.makedirs(table.uri, exist_ok=True)
    return _run(spark, reader, parts, table, schema=schema, partition_by=list(partition_by),
                app_id=app_id, app_version=app_version, offset_range=offset_range, label=label or name)


def _run(spark, reader: DataSourceReader, parts: list[InputPartition], table: Location, *,
         schema: pa.Schema, partition_by: list[str], app_id: str | None, app_version: int | None,
         offset_range: tuple[str, int, int] | None, label: str) -> WriteResult:
    writer = DeltaArrowWriter(table=table, arrow_schema=schema, partition_by=partition_by,
                              overwrite=False, app_id=app_id, app_version=app_version,
                              result_file=None, custom_metadata=None,
                              rows_per_file=DEFAULT_ROWS_PER_FILE)
    total = len(parts)

    def produce(part: InputPartition) -> Iterator[pa.RecordBatch]:
        for batch in reader.read(part):
            if offset_range is not None:
                batch = _in_range(batch, *offset_range)
            if batch.num_rows:
                yield batch

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _worker_logging()
        for batch in batches:
            for index in batch.column(0).to_pylist():
                part = parts[index]
                t0 = time.monotonic()
                message = writer.write(produce(part))
                rows = sum(f.num_records for f in message.files)
                log.info("%s: partition %d/%d %s: %d rows, %d files in %.1f s", label, index + 1, total,
                         _describe(part), rows, len(message.files), time.monotonic() - t0)
                yield pa.RecordBatch.from_pydict({"commit_message": [json.dumps(asdict(message))]})

    messages: list[DeltaCommitMessage] = []
    try:
        if parts:
            rows = spark.range(0, total, 1, total).mapInArrow(task, _RESULT_SCHEMA).collect()
            for row in rows:
                data = json.loads(row.commit_message)
                files = [AddInfo(**f) for f in data.pop("files")]
                messages.append(DeltaCommitMessage(files=files, **data))
    except BaseException:
        writer.abort([])  # removes every file of this job, also from tasks that never reported
        raise
    return result_from_outcome(str(table), writer.finish(messages))


def collect_partitions(spark, reader: DataSourceReader, schema: pa.Schema) -> pa.Table:
    """Every row ``reader`` yields, read in parallel by Spark tasks and collected on the driver
    (for small results of a scan over large inputs, e.g. the commitlog walk's findings)."""
    from schemas.spark import spark_ddl

    parts = [p for p in reader.partitions() if type(p) is not InputPartition]  # noqa: E721 (the empty marker)
    if not parts:
        return schema.empty_table()

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from reader.read(parts[index])

    rows = spark.range(0, len(parts), 1, len(parts)).mapInArrow(task, spark_ddl(schema)).toArrow()
    return pa.table(rows).select(schema.names).cast(schema)
