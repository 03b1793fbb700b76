"""DuckDB over the lake: each Delta table a view on ``delta_scan`` (the default engine).

Why views on ``delta_scan`` rather than tables attached once: ``delta_scan`` reads the Delta log
when a query runs, so a long-lived connection (the shell) sees every commit made since, with no
refresh. The set of tables is refreshed before each statement (a table created by a report job
after the shell started appears, a removed one goes). The delta extension is loaded from its wheel
(:mod:`pipelines.duckdb_delta`): no download, no network. The session time zone is UTC, so
``CAST(ts AS DATE)`` and timestamp output agree with Spark's and DataFusion's.
"""

from __future__ import annotations

import logging

import duckdb

from pipelines.sql.engines import (Result, SqlError, guarded, lake_tables, no_rows, quote_identifier,
                                   sql_quote_escape)

log = logging.getLogger(__name__)

BATCH_ROWS = 65536
QUERY_TYPES = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN, duckdb.StatementType.CALL,
                         duckdb.StatementType.PRAGMA, duckdb.StatementType.RELATION})


class DuckDBEngine:
    name = "duckdb"
    backslash_escapes = False

    def __init__(self, lake: str) -> None:
        from pipelines.duckdb_delta import connect

        self.lake = lake
        self._tables: dict[str, str] = {}
        paths = lake_tables(lake)  # before connecting: a wrong --lake fails fast
        try:
            self._con = connect()
        except (RuntimeError, duckdb.Error) as exc:  # the delta extension missing or not loadable
            raise SqlError(f"cannot start DuckDB with its delta extension: {exc}", self.name) from None
        self._con.execute("SET TimeZone = 'UTC'")
        self._sync(paths)

    def tables(self) -> dict[str, str]:
        return dict(self._tables)

    def refresh(self) -> None:
        self._sync(lake_tables(self.lake))

    def _sync(self, paths: dict[str, str]) -> None:
        for name in self._tables.keys() - paths.keys():
            self._con.execute(f"DROP VIEW IF EXISTS {quote_identifier(name)}")
        for name, path in paths.items():
            if self._tables.get(name) != path:  # delta_scan reads the log per query: no refresh needed
                self._con.execute(f"CREATE OR REPLACE VIEW {quote_identifier(name)} AS "
                                  f"SELECT * FROM delta_scan('{sql_quote_escape(path)}')")
        if paths != self._tables:
            log.debug("duckdb: views %s", sorted(paths))
        self._tables = dict(paths)

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

