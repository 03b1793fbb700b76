"""What ``rocketlake sql`` needs from a SQL engine, and the factory that opens one over a lake.

Three engines answer the same SQL over the same Delta tables: DuckDB (embedded, the default: no
JVM, starts in a fraction of a second), DataFusion through delta-rs's ``QueryBuilder``, and Spark
SQL. Each exposes every Delta table directly under the lake as a view named after its directory
and hands results back as a stream of Arrow record batches, so the output code
(:mod:`pipelines.sql.output`) is shared and never holds a whole result.

Every engine error a user can cause (syntax, unknown table or column, a runtime failure such as a
bad cast, a lake without tables, a lake URI that does not exist or cannot be reached) is raised as
:class:`SqlError` carrying the engine's own message, position included where the engine gives one;
the CLI prints it and exits 2, the shell prints it and goes on.

The lake is a :class:`pipelines.storage.Location`: a local directory or a URI (``s3://bucket/lake``)
with its storage options, which each engine hands to its reader (see the engine modules for how).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

if TYPE_CHECKING:  # pyarrow loads with the engines, not when `rocketlake` builds its parser
    import pyarrow as pa

    from pipelines.storage import Location

ENGINES = ("duckdb", "datafusion", "spark")
DEFAULT_ENGINE = "duckdb"


class SqlError(Exception):
    """A query or lake problem, worded by the engine (message only: no Python traceback)."""

    def __init__(self, message: str, engine: str | None = None) -> None:
        super().__init__(message.strip())
        self.engine = engine


@dataclass
class Result:
    """A statement's result: its Arrow schema and its record batches, pulled lazily.

    ``close`` releases the engine's cursor when the reader stops early (a capped table)."""

    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    close: Callable[[], None] = field(default=lambda: None)


class Engine(Protocol):
    """A SQL engine with every lake table registered as a view under its own name."""

    name: str
    lake: Location
    backslash_escapes: bool  # string literals read '\'' as a quote (Spark)

    def tables(self) -> dict[str, str]:
        """Table name -> Delta table path or URI, as of the last refresh."""
        ...

    def refresh(self) -> None:
        """Pick up tables created or removed, and commits, since the last statement."""
        ...

    def execute(self, sql: str) -> Result | None:
        """Run one statement against the lake's current versions; None when it returns no rows
        (DDL, SET). Raises :class:`SqlError`."""
        ...

    def escape_literal(self, value: str) -> str:
        """``value`` made safe inside a single-quoted string literal of this engine."""
        ...

    def close(self) -> None:
        ...


def lake_tables(lake: Location) -> dict[str, Location]:
    """``pipelines.sql.views.tables_or_error`` with its errors (no such lake, storage unreachable,
    no Delta table in it) turned into :class:`SqlError`: a wrong ``--lake`` is the user's to fix."""
    from pipelines.sql.views import tables_or_error

    try:
        return tables_or_error(lake)
    except (ValueError, OSError) as exc:
        raise SqlError(str(exc)) from None


def quote_identifier(name: str) -> str:
    """``"name"`` for DuckDB and DataFusion (a double quote inside doubled)."""
    return '"' + name.replace('"', '""') + '"'


def sql_quote_escape(value: str) -> str:
    """Standard SQL: a quote inside a literal is doubled."""
    return value.replace("'", "''")


def no_rows(schema: pa.Schema) -> bool:
    """A result with no columns is a command's (CREATE VIEW, SET …): nothing to print."""
    return len(schema) == 0


def guarded(batches: Iterator[pa.RecordBatch], translate: Callable[[BaseException], SqlError | None]
            ) -> Iterator[pa.RecordBatch]:
    """``batches`` with the engine's errors raised while pulling them (a failing cast, a file gone
    missing) turned into :class:`SqlError` by ``translate`` (None: not the user's, re-raise)."""
    try:
        yield from batches
    except BaseException as exc:  # pyo3 panics derive from BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        error = translate(exc)
        if error is None:
            raise
        raise error from None


def open_engine(name: str, lake: str | os.PathLike | Location, **options) -> Engine:
    """The engine ``name`` (one of :data:`ENGINES`) over ``lake`` (a path, a URI, or a Location with
    storage options); raises :class:`SqlError` when the lake holds no Delta table or cannot be
    reached. ``options`` go to the engine (``spark=`` a session to reuse)."""
    from pipelines.storage import Location, StorageError

    if name == "duckdb":
        from pipelines.sql.engine_duckdb import DuckDBEngine as cls
    elif name == "datafusion":
        from pipelines.sql.engine_datafusion import DataFusionEngine as cls
    elif name == "spark":
        from pipelines.sql.engine_spark import SparkEngine as cls
    else:
        raise ValueError(f"unknown engine {name!r} (one of {', '.join(ENGINES)})")
    try:
        location = Location.parse(lake)
    except StorageError as exc:
        raise SqlError(str(exc)) from None
    return cls(location, **options)
