"""Spark SQL over the lake: the views of :func:`pipelines.sql.views.register_lake_views`.

The session is the running one when there is one (a job, the tests), else a local one from
:func:`pipelines.session.build_session` (UTC, loopback), stopped again on :meth:`close`. A remote
lake's tables are read by :mod:`pipelines.sources.delta` with the lake's storage options, which
travel with each read to the executors (no Hadoop ``s3a`` configuration involved).

Results stream in order, as Arrow, without passing through Python rows (they would lose types:
binary as bytearray, timestamps in the driver's local zone): ``mapInArrow`` hands each partition's
Arrow batches to a function on the executors and ``toLocalIterator`` fetches the partitions one at a
time, in order (``toArrow`` would hold the whole result, and its batches arrive unordered). But
``toLocalIterator`` holds a whole partition in the driver JVM, and a scan's partition can be half a
table: so with a local master (what ``rocketlake sql`` starts) each partition is written to an
Arrow IPC file in a temporary directory and only its path travels, the file is read batch by
batch and deleted; with a cluster master (no shared disk) the batches travel as IPC bytes.

Spark's errors arrive as ``PySparkException`` with the logical plan appended to analysis errors and,
for every error with a query context, a JSON record with the JVM stack trace logged to stderr by
PySpark's ``SQLQueryContextLogger``: the plan is cut, the logger is muted while a statement runs,
and the position is shown the way Spark shows it for runtime errors (``== SQL (line l, position
p) ==`` and carets).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa

from pipelines.sql.engines import Result, SqlError, guarded, lake_tables, no_rows
from pipelines.storage import Location

log = logging.getLogger(__name__)

IPC_COLUMN, PATH_COLUMN = "ipc", "path"
SPILL_COMPRESSION = "lz4"  # the spill files: a few times smaller, cheap to read


def arrow_batches_to_ipc(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side, cluster master: each batch as one row of Arrow IPC stream bytes."""
    for batch in batches:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        yield pa.RecordBatch.from_arrays([pa.array([sink.getvalue().to_pybytes()], pa.binary())],
                                         names=[IPC_COLUMN])


def spill_partition(directory: str):
    """Executor side, local master: the partition's batches into one Arrow IPC file under
    ``directory`` (the driver's disk), and a single row with its path."""
    def spill(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import uuid

        path, sink, writer = None, None, None
        try:
            for batch in batches:
                if writer is None:
                    path = os.path.join(directory, f"{uuid.uuid4().hex}.arrows")
                    sink = pa.OSFile(path, "wb")
                    writer = pa.ipc.new_stream(sink, batch.schema,
                                               options=pa.ipc.IpcWriteOptions(compression=SPILL_COMPRESSION))
                writer.write_batch(batch)
        finally:
            if writer is not None:
                writer.close()
            if sink is not None:
                sink.close()
        if path is not None:
            yield pa.RecordBatch.from_arrays([pa.array([path], pa.string())], names=[PATH_COLUMN])
    return spill



# which engine's views a session holds now: engines sharing a session (notebooks, tests) register
# their lakes' views under the same names, so each re-registers its own before it queries
_VIEW_OWNERS: dict[int, object] = {}

class SparkEngine:
    name = "spark"
    backslash_escapes = True

    def __init__(self, lake: Location, spark=None) -> None:
        from pyspark.sql import SparkSession

        self.lake = lake
        self._markers: dict[str, str] = {}
        self._tables: dict[str, str] = {}
        lake_tables(lake)  # a wrong --lake fails before a JVM starts
        self._owns_session = False
        if spark is None:
            spark = SparkSession.getActiveSession()
        if spark is None:
            from pipelines.session import build_session

            try:
                spark = build_session("rocketlake-sql", extra_conf={"spark.ui.showConsoleProgress": "false"})
            except Exception as exc:  # no Java, no free port, …: the user's to fix, not a traceback
                raise SqlError(f"cannot start a local Spark session (Spark needs Java 17): {exc}", self.name) from None
            spark.sparkContext.setLogLevel("FATAL")  # task failures: the CLI prints Spark's message once
            self._owns_session = True
        # An active session is used as it is: the lake's views replace that session's temporary views
        # of the same names. (Not a newSession(): PySpark 4.2.0 lets a derived session neither
        # register nor find a Python data source its parent registered.)
        self.spark = spark
        self.refresh()

    def tables(self) -> dict[str, str]:
        return dict(self._tables)

    def refresh(self) -> None:
        """Register the views again when a table appeared, went, or got a new commit (the view of a
        data source may have its schema and files fixed when it was made)."""
        tables = lake_tables(self.lake)
        paths = {name: table.uri for name, table in tables.items()}
        markers = {name: _log_marker(table) for name, table in tables.items()}
        if markers == self._markers and _VIEW_OWNERS.get(id(self.spark)) is self:
            return
        from pipelines.sql.views import register_lake_views

        for name in self._tables.keys() - paths.keys():
            self.spark.catalog.dropTempView(name)
        try:
            with _quiet_query_context_logger():
                registered = register_lake_views(self.spark, self.lake)
        except Exception as exc:
            raise SqlError(_message(exc, ""), self.name) from None
        self._tables = dict(registered) if registered else dict(paths)
        self._markers = markers
        _VIEW_OWNERS[id(self.spark)] = self

    def execute(self, sql: str) -> Result | None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.refresh()
        with _quiet_query_context_logger():
            try:
                df = self.spark.sql(sql)  # parse and analysis errors; commands run here
            except Exception as exc:
                raise _sql_error(exc, sql) from None
        try:
            schema = to_arrow_schema(df.schema, timezone="UTC")
        except Exception:  # a type Arrow cannot carry (intervals, variant): show its text form
            df = df.selectExpr(*[f"CAST(`{f.name.replace('`', '``')}` AS STRING) AS `{f.name.replace('`', '``')}`"
                                 for f in df.schema.fields])
            schema = to_arrow_schema(df.schema, timezone="UTC")
        if no_rows(schema):
            return None
        if self.spark.sparkContext.master.startswith("local"):
            directory = tempfile.mkdtemp(prefix="rocketlake-sql-")
            rows = df.mapInArrow(spill_partition(directory), f"{PATH_COLUMN} string").toLocalIterator()
            batches = _read_spilled(rows, schema, directory)
        else:
            rows = df.mapInArrow(arrow_batches_to_ipc, f"{IPC_COLUMN} binary").toLocalIterator()
            batches = _decode(rows, schema)
        stream = guarded(batches, lambda exc: _translate(exc, sql))
        return Result(schema, stream, stream.close)

    def escape_literal(self, value: str) -> str:
        return value.replace("\\", "\\\\").replace("'", "\\'")

    def close(self) -> None:
        if self._owns_session:
            self.spark.stop()


def _decode(rows, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Driver side, cluster master: IPC bytes back to batches, cast to the result schema
    (timestamps in UTC)."""
    with _quiet_query_context_logger():
        for row in rows:
            for batch in pa.ipc.open_stream(bytes(row[0])):
                yield batch if batch.schema == schema else batch.cast(schema)


def _read_spilled(rows, schema: pa.Schema, directory: str) -> Iterator[pa.RecordBatch]:
    """Driver side, local master: each partition's file in order, batch by batch, deleted once
    read; the directory goes when the stream ends or is closed early."""
    try:
        with _quiet_query_context_logger():
            for row in rows:
                path = row[0]
                try:
                    with pa.OSFile(path, "rb") as source:
                        for batch in pa.ipc.open_stream(source):
                            yield batch if batch.schema == schema else batch.cast(schema)
                finally:
                    os.remove(path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _log_marker(table: Location) -> str:
    """The newest Delta log entry's name: changes with every commit, costs one directory listing
    (one LIST request on an object store)."""
    try:
        entries = [info.base_name for info in table.child("_delta_log").list() if info.base_name.endswith(".json")]
    except OSError:
        return ""
    return max(entries, default="")


@contextmanager
def _quiet_query_context_logger():
    """Mute PySpark's ``SQLQueryContextLogger``, which logs every SQL error with its JVM stack trace
    to stderr before the exception reaches us (the CLI prints the message itself)."""
    from pyspark.logger import PySparkLogger

    logger = PySparkLogger.getLogger("SQLQueryContextLogger")
    before = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = before


def _translate(exc: BaseException, sql: str) -> SqlError | None:
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return _sql_error(exc, sql) if isinstance(exc, (PySparkException, Py4JError)) else None


def _sql_error(exc: BaseException, sql: str) -> SqlError:
    return SqlError(_message(exc, sql), "spark")


def _message(exc: BaseException, sql: str) -> str:
    """Spark's message, without the analysed plan or a Python worker's traceback, with the
    position as carets under the statement's line when Spark gives a query context."""
    from py4j.protocol import Py4JJavaError

    text = _java_cause(exc.java_exception) if isinstance(exc, Py4JJavaError) else str(exc)
    text = re.sub(r"(; line \d+ pos \d+);\n.*", r"\1", text, flags=re.S)  # the plan after the position
    text = _without_traceback(text)
    if "== SQL" not in text:
        text += _caret_block(exc, sql)
    return text.strip()


def _java_cause(throwable) -> str:
    """The innermost cause's text: "Exception thrown in awaitResult" wraps what actually failed."""
    seen = 0
    while throwable.getCause() is not None and seen < 20:
        throwable, seen = throwable.getCause(), seen + 1
    return str(throwable.getMessage() or throwable.toString())


def _without_traceback(text: str) -> str:
    """A Python worker's failure arrives with its traceback: keep the text before it and the
    exception line (``pyarrow.lib.ArrowInvalid: …``), which is what the user can act on."""
    head, marker, rest = text.partition("Traceback (most recent call last):")
    if not marker:
        return text
    lines = [line for line in rest.splitlines() if line.strip() and not line.startswith((" ", "\t"))]
    last = [line for line in lines if not line.lstrip().startswith("SQLSTATE")]
    return (head.rstrip() + " " + (last[-1] if last else "")).strip()


def _caret_block(exc: BaseException, sql: str) -> str:
    try:
        contexts = exc.getQueryContext()  # type: ignore[attr-defined]
    except Exception:
        return ""
    for ctx in contexts or []:
        try:
            start, stop = int(ctx.startIndex()), int(ctx.stopIndex())
        except Exception:
            continue
        if not 0 <= start <= stop < len(sql):
            continue
        line_no = sql.count("\n", 0, start) + 1
        line_start = sql.rfind("\n", 0, start) + 1
        line_end = sql.find("\n", start)
        line = sql[line_start:None if line_end == -1 else line_end]
        width = min(stop, len(line) + line_start - 1) - start + 1
        return (f"\n== SQL (line {line_no}, position {start - line_start + 1}) ==\n{line}\n"
                f"{' ' * (start - line_start)}{'^' * max(width, 1)}")
    return ""
