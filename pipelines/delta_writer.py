"""Write Delta tables from Spark without the Delta Spark jar: a Python Data Source on delta-rs.

``df.write.format("rocketlake_delta").mode("append").option(...).save(TABLE_URI)``:

* every Spark task (``DataSourceArrowWriter.write``, on the executors) writes zstd Parquet files
  through the table's filesystem (:mod:`pipelines.delta_files`: a local directory or ``s3://…``)
  and returns the Delta ``add`` action of each file (relative path, size, partition values, mtime,
  statistics from the file's footer);
* ``commit`` (driver side, in a Python worker the driver JVM starts) commits all of them as ONE Delta
  transaction through delta-rs (:mod:`pipelines.delta_commit`, which checks the app transaction);
  ``abort`` deletes every file the job wrote.

The table is a :class:`~pipelines.storage.Location`: ``save()`` takes a local path, ``file://`` or a
``pyarrow.fs``/delta-rs URI, and its storage options come as ``storage.KEY`` options
(:func:`pipelines.storage.source_options`); they travel pickled with the writer to every task.

Options (all strings):

``partitionBy``  JSON list of partition columns (default none)
``arrowSchema``  base64 of an Arrow IPC-serialised schema the rows are cast to (default: Spark's)
``appId`` / ``appVersion``  exactly-once: the commit carries the Delta ``txn`` action
                 (appId, appVersion); when the table already records a version >= appVersion for
                 the appId the job does not commit, deletes its files and reports ``skipped``
``resultFile``   local file where ``commit``/``abort`` write a JSON report (they run in a separate
                 Python process, so this is how the caller learns the outcome)
``customMetadata`` JSON object added to the commit info
``targetRowsPerFile`` rows after which a task starts a new file per partition (default 1,000,000)
``storage.KEY``  storage option KEY of the table's location

Mode ``overwrite`` replaces the table's content in the same single transaction.

Abort protocol: Spark calls ``abort`` as soon as a task fails while other tasks of the job may
still be writing. ``abort`` first writes the marker ``<table>/_rocketlake_aborted/<job id>``, then
deletes every file of the job it finds; a task checks the marker right after creating each file
and at its end, and removes its own files when it is there. Both go through the filesystem API.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from pipelines.delta_commit import CommitOutcome, commit_files
from pipelines.delta_files import DEFAULT_ROWS_PER_FILE, AddInfo, FileSetWriter, delete_job_files
from pipelines.storage import Location, location_from_source_options

FORMAT_NAME = "rocketlake_delta"
ABORT_MARKER_DIR = "_rocketlake_aborted"  # <table>/_rocketlake_aborted/<job_id>: the job was aborted
ABORT_MARKER_MAX_AGE_S = 7 * 24 * 3600


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass
class DeltaCommitMessage(WriterCommitMessage):
    job_id: str
    partition_id: int
    files: list[AddInfo] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ data source
class RocketlakeDeltaDataSource(DataSource):
    """``format("rocketlake_delta")``: append/overwrite a Delta table through delta-rs."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def writer(self, schema, overwrite: bool) -> "DeltaArrowWriter":
        from pyspark.sql.pandas.types import to_arrow_schema

        opts = {k.lower(): v for k, v in self.options.items()}
        path = opts.get("path")
        if not path:
            raise ValueError(f"{FORMAT_NAME}: save(path) or option('path', …) is required")
        if "arrowschema" in opts:
            arrow_schema = decode_schema(opts["arrowschema"])
        else:
            arrow_schema = to_arrow_schema(schema, timezone="UTC")
        spark_names = [f.name for f in schema.fields]
        if [f.name for f in arrow_schema] != spark_names:
            missing = set(arrow_schema.names) ^ set(spark_names)
            if missing:
                raise ValueError(f"{FORMAT_NAME}: DataFrame columns {spark_names} do not match "
                                 f"the table schema {arrow_schema.names}")
        partition_by = json.loads(opts.get("partitionby") or "[]")
        for col in partition_by:
            if col not in arrow_schema.names:
                raise ValueError(f"{FORMAT_NAME}: partition column {col!r} not in the schema")
        app_id = opts.get("appid")
        app_version = opts.get("appversion")
        if (app_id is None) != (app_version is None):
            raise ValueError(f"{FORMAT_NAME}: appId and appVersion go together")
        return DeltaArrowWriter(
            table=location_from_source_options(path, opts),
            arrow_schema=arrow_schema,
            partition_by=list(partition_by),
            overwrite=overwrite,
            app_id=app_id,
            app_version=int(app_version) if app_version is not None else None,
            result_file=opts.get("resultfile"),
            custom_metadata=json.loads(opts["custommetadata"]) if opts.get("custommetadata") else None,
            rows_per_file=int(opts.get("targetrowsperfile") or DEFAULT_ROWS_PER_FILE),
        )


class DeltaArrowWriter(DataSourceArrowWriter):
    """Pickled to every task and to the commit/abort worker: keep it plain data."""

    def __init__(self, *, table: Location, arrow_schema: pa.Schema, partition_by: list[str],
                 overwrite: bool, app_id: str | None, app_version: int | None,
                 result_file: str | None, custom_metadata: dict | None, rows_per_file: int) -> None:
        self.table = table
        self.arrow_schema = arrow_schema
        self.partition_by = partition_by
        self.overwrite = overwrite
        self.app_id = app_id
        self.app_version = app_version
        self.result_file = result_file
        self.custom_metadata = custom_metadata
        self.rows_per_file = max(1, rows_per_file)
        self.job_id = uuid.uuid4().hex  # one per write job: names every file the job writes

    # ---------------------------------------------------------------------------------- executors
    def write(self, iterator: Iterator[pa.RecordBatch], part_id: int | None = None) -> DeltaCommitMessage:
        """``part_id`` names the files (default: the Spark partition id); a caller that writes several
        inputs in one Spark task gives each its own."""
        files = self.task_files(part_id)
        try:
            for batch in iterator:
                files.write(batch)
        except BaseException:
            files.discard()
            raise
        return files.close()

    def task_files(self, part_id: int | None = None) -> "TaskFiles":
        """The files of one task, fed batch by batch (a task that writes several tables from one
        reader keeps one of these per table)."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if part_id is None:
            part_id = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        # the marker check runs after each file exists: a task still running when the driver
        # aborted (abort writes its marker before it looks for the job's files) sees the marker
        # and removes its own files
        return TaskFiles(self, part_id, FileSetWriter(self.table, self.arrow_schema, self.partition_by,
                                                      f"part-{part_id:05d}-{self.job_id}-a{attempt}",
                                                      rows_per_file=self.rows_per_file,
                                                      on_new_file=self._raise_if_aborted))

    # ------------------------------------------------------------------------------------- driver
    def finish(self, messages: list[DeltaCommitMessage | None]) -> CommitOutcome:
        """Commit every task's files in one transaction (files deleted when skipped or failed)."""
        infos = [info for m in messages if m is not None for info in m.files]
        metadata = {"rocketlake.writer": FORMAT_NAME, **(self.custom_metadata or {})}
        try:
            outcome = commit_files(self.table, infos, schema=self.arrow_schema, job_id=self.job_id,
                                   partition_by=self.partition_by, overwrite=self.overwrite,
                                   app_id=self.app_id, app_version=self.app_version, metadata=metadata)
        except BaseException:
            self._delete(infos)
            raise
        if outcome.skipped:
            self._delete(infos)
        return outcome

    def commit(self, messages: list[DeltaCommitMessage | None]) -> None:
        self._report(**asdict(self.finish(messages)))

    def abort(self, messages: list[DeltaCommitMessage | None]) -> None:
        marker_dir = self.table.child(ABORT_MARKER_DIR)
        marker_dir.child(self.job_id).write_bytes(f"{time.time()}\n".encode())
        _expire_markers(marker_dir, keep=self.job_id)
        infos = [info for m in messages if m is not None for info in m.files]
        self._delete(infos)
        self._report(committed=False, skipped=False, version=None, num_files=0, num_rows=0,
                     reason="aborted: a write task failed")

    # ------------------------------------------------------------------------------------ helpers
    def _raise_if_aborted(self) -> None:
        fs, root = self.table.filesystem()
        if fs.get_file_info(f"{root}/{ABORT_MARKER_DIR}/{self.job_id}").type != pafs.FileType.NotFound:
            raise RuntimeError(f"{FORMAT_NAME}: write job {self.job_id} was aborted")

    def _delete(self, infos: list[AddInfo]) -> None:
        """Remove the listed files and any other file of this job (from tasks that never reported)."""
        delete_job_files(self.table, self.job_id, infos, skip_dirs=("_delta_log", ABORT_MARKER_DIR))

    def _report(self, **result: Any) -> None:
        if not self.result_file:
            return
        result["job_id"] = self.job_id
        result["time"] = time.time()
        tmp = f"{self.result_file}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
        os.replace(tmp, self.result_file)


class TaskFiles:
    """One task's files of one table: :meth:`write` batches, then :meth:`close` (the commit message
    for the driver) or :meth:`discard` (a failed task leaves nothing behind)."""

    def __init__(self, writer: DeltaArrowWriter, part_id: int, files: FileSetWriter) -> None:
        self.writer = writer
        self.part_id = part_id
        self.files = files

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.files.write(pa.Table.from_batches([batch]))

    def close(self) -> DeltaCommitMessage:
        try:
            done = self.files.close()
            self.writer._raise_if_aborted()
        except BaseException:
            self.files.discard()
            raise
        return DeltaCommitMessage(job_id=self.writer.job_id, partition_id=self.part_id, files=done)

    def discard(self) -> None:
        self.files.discard()


def _expire_markers(marker_dir: Location, keep: str) -> None:
    """Remove abort markers older than ABORT_MARKER_MAX_AGE_S (no task of theirs still runs)."""
    fs, _ = marker_dir.filesystem()
    now = time.time()
    for info in marker_dir.list():
        try:
            if (info.type == pafs.FileType.File and info.base_name != keep and info.mtime is not None
                    and now - info.mtime.timestamp() > ABORT_MARKER_MAX_AGE_S):
                fs.delete_file(info.path)
        except OSError:
            pass


def register(spark) -> None:
    """Register the data source with a session (idempotent)."""
    from pipelines.session import register_data_source

    register_data_source(spark, RocketlakeDeltaDataSource)
