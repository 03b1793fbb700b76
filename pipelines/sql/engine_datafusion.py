"""DataFusion over the lake, through delta-rs's ``QueryBuilder`` (no JVM, no DuckDB).

A table registered with ``QueryBuilder.register`` is frozen at the Delta version it had then, and a
name cannot be registered twice. So before each statement every table's ``DeltaTable`` is brought
up to date (``update_incremental`` reads only the new log entries) and a table whose version moved
is dropped and registered again: one ``QueryBuilder`` lives as long as the engine, so views and
settings a user creates in the shell survive, and every query still sees the latest commits.

A remote lake (``s3://…``) is read by delta-rs's own object store: each ``DeltaTable`` is opened
with the lake's storage options, nothing else changes.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from pipelines.sql.engines import (Result, SqlError, guarded, lake_tables, no_rows, quote_identifier,
                                   sql_quote_escape)
from pipelines.storage import Location

log = logging.getLogger(__name__)


class DataFusionEngine:
    name = "datafusion"
    backslash_escapes = False

    def __init__(self, lake: Location) -> None:
        from deltalake import QueryBuilder

        self.lake = lake
        self._qb = QueryBuilder()
        self._tables: dict[str, object] = {}    # name -> DeltaTable as registered
        self._paths: dict[str, str] = {}
        self._versions: dict[str, int] = {}
        self.refresh()

    def tables(self) -> dict[str, str]:
        return dict(self._paths)

    def refresh(self) -> None:
        from pipelines.delta_commit import open_delta
        from pipelines.sql.views import one_line

        tables = lake_tables(self.lake)
        for name in list(self._tables):
            if name not in tables or tables[name].uri != self._paths.get(name):
                self._drop(name)
        for name, location in tables.items():
            table = self._tables.get(name)
            try:
                if table is None:
                    table = open_delta(location, missing_ok=False)
                else:
                    table.update_incremental()
                    if table.version() == self._versions[name]:
                        continue
                    self._drop(name)
                self._qb.register(name, table)
            except Exception as exc:  # a table deleted or rewritten under us: the user's to fix
                raise SqlError(f"cannot read Delta table {name} at {location}: {one_line(exc)}", self.name) from None
            self._tables[name], self._paths[name], self._versions[name] = table, location.uri, table.version()
            log.debug("datafusion: %s registered at version %d", name, table.version())

    def _drop(self, name: str) -> None:
        self._run(f"DROP TABLE IF EXISTS {quote_identifier(name)}").read_all()
        for registry in (self._tables, self._paths, self._versions):
            registry.pop(name, None)

    def _run(self, sql: str) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_stream(self._qb.execute(sql))

    def execute(self, sql: str) -> Result | None:
        self.refresh()
        try:
            reader = self._run(sql)  # planning errors (syntax, unknown names) are raised here
        except BaseException as exc:  # BaseException: a pyo3 PanicException is the engine's answer too
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise _sql_error(exc) from None
        if no_rows(reader.schema):
            reader.read_all()
            return None
        return Result(reader.schema, guarded(iter(reader), _sql_error), reader.close)

    def escape_literal(self, value: str) -> str:
        return sql_quote_escape(value)

    def close(self) -> None:
        self._tables.clear()


def _sql_error(exc: BaseException) -> SqlError:
    """DataFusion's message without the wrappers delta-rs adds around it."""
    message = str(exc)
    for prefix in ("External error: ", "Generic DeltaTable error: "):
        message = message.removeprefix(prefix)
    return SqlError(message, "datafusion")
