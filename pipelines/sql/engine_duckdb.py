"""DuckDB over the lake: each Delta table a view under its own name (the default engine).

Local lake: views on ``delta_scan``. Why views on ``delta_scan`` rather than tables attached once:
``delta_scan`` reads the Delta log when a query runs, so a long-lived connection (the shell) sees
every commit made since, with no refresh. The delta extension is loaded from its wheel
(:mod:`pipelines.duckdb_delta`): no download, no network.

Remote lake (``s3://…``): each table is an Arrow dataset of its current snapshot, opened by delta-rs
with the lake's storage options and read through ``pyarrow.fs`` (see
:func:`pipelines.duckdb_delta.arrow_source`); before each statement every table's log is brought up
to date (``update_incremental`` reads only new entries) and a table whose version moved is
registered again, so the shell sees new commits there too.

Either way the set of tables is refreshed before each statement (a table created by a report job
after the shell started appears, a removed one goes). The session time zone is UTC, so
``CAST(ts AS DATE)`` and timestamp output agree with Spark's and DataFusion's.
"""

from __future__ import annotations

import logging

import duckdb

from pipelines.sql.engines import (Result, SqlError, guarded, lake_tables, no_rows, quote_identifier,
                                   sql_quote_escape)
from pipelines.storage import Location

log = logging.getLogger(__name__)

BATCH_ROWS = 65536
QUERY_TYPES = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN, duckdb.StatementType.CALL,
                         duckdb.StatementType.PRAGMA, duckdb.StatementType.RELATION})


class DuckDBEngine:
    name = "duckdb"
    backslash_escapes = False

    def __init__(self, lake: Location) -> None:
        from pipelines.duckdb_delta import connect

        self.lake = lake
        self._tables: dict[str, str] = {}      # name -> table path or URI
        self._remote: dict[str, object] = {}   # name -> DeltaTable of a remote table's registered snapshot
        tables = lake_tables(lake)  # before connecting: a wrong --lake fails fast
        try:
            self._con = connect(delta=lake.is_local)
        except (RuntimeError, duckdb.Error) as exc:  # the delta extension missing or not loadable
            raise SqlError(f"cannot start DuckDB with its delta extension: {exc}", self.name) from None
        self._con.execute("SET TimeZone = 'UTC'")
        self._sync(tables)

    def tables(self) -> dict[str, str]:
        return dict(self._tables)

    def refresh(self) -> None:
        self._sync(lake_tables(self.lake))

    def _sync(self, tables: dict[str, Location]) -> None:
        for name in self._tables.keys() - tables.keys():
            if self._remote.pop(name, None) is not None:
                self._con.unregister(name)
            else:
                self._con.execute(f"DROP VIEW IF EXISTS {quote_identifier(name)}")
            del self._tables[name]
        for name, table in tables.items():
            if table.is_local:
                if self._tables.get(name) != table.uri:  # delta_scan reads the log per query: no refresh needed
                    self._con.execute(f"CREATE OR REPLACE VIEW {quote_identifier(name)} AS "
                                      f"SELECT * FROM delta_scan('{sql_quote_escape(table.uri)}')")
            else:
                self._sync_remote(name, table)
            if self._tables.get(name) != table.uri:
                log.debug("duckdb: %s -> %s", name, table.uri)
            self._tables[name] = table.uri

    def _sync_remote(self, name: str, table: Location) -> None:
        """(Re-)register the remote table's current snapshot when it is new or its version moved."""
        from pipelines.delta_commit import open_delta
        from pipelines.duckdb_delta import arrow_source
        from pipelines.sql.views import one_line

        dt = self._remote.get(name)
        try:
            if dt is None or self._tables.get(name) != table.uri:
                dt = open_delta(table, missing_ok=False)
            else:
                before = dt.version()
                dt.update_incremental()
                if dt.version() == before:
                    return
            source = arrow_source(dt, table)
        except Exception as exc:  # a table deleted or rewritten under us, the storage gone: the user's to fix
            raise SqlError(f"cannot read Delta table {name} at {table}: {one_line(exc)}", self.name) from None
        self._con.register(name, source)
        self._remote[name] = dt
        log.debug("duckdb: %s registered at version %d", name, dt.version())

    def execute(self, sql: str) -> Result | None:
        self.refresh()
        try:
            statements = self._con.extract_statements(sql)
            self._con.execute(sql)  # execute, not sql(): its errors carry "LINE n:" and the caret
            reader = self._con.to_arrow_reader(BATCH_ROWS)
        except duckdb.Error as exc:
            raise SqlError(str(exc), self.name) from None
        if no_rows(reader.schema):
            return None
        if statements and statements[-1].type not in QUERY_TYPES:
            done = reader.read_all()  # a command's "Count"/"Success" line: worth showing only with rows
            if done.num_rows == 0:
                return None
            return Result(done.schema, iter(done.to_batches()))
        return Result(reader.schema, guarded(iter(reader), self._translate), reader.close)

    def _translate(self, exc: BaseException) -> SqlError | None:
        return SqlError(str(exc), self.name) if isinstance(exc, duckdb.Error) else None

    def escape_literal(self, value: str) -> str:
        return sql_quote_escape(value)

    def close(self) -> None:
        self._con.close()

