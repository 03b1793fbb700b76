"""The interactive ``rocketlake sql`` shell: statements end with ``;`` and may span lines.

Dot commands, at the start of a statement only: ``.tables``, ``.schema NAME``, ``.queries``,
``.run NAME [PARAM=VALUE …]``, ``.format table|csv|json``, ``.help``, ``.quit`` (or end of input).
An error is printed and the shell goes on with the next statement; Ctrl-C drops the statement being
typed or stops the one running. With a terminal, lines are edited with readline and kept in
``~/.rocketlake_sql_history``; piped input is read as is, without prompts, so a script can drive it.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import IO, Callable

import pyarrow as pa

from pipelines.sql.engines import Engine, Result, SqlError
from pipelines.sql.output import TableSink, open_sink
from pipelines.sql.statements import (ParamError, parse_param, pending, resolve_params, split_statements,
                                      statements_of, substitute)

log = logging.getLogger(__name__)

PROMPT, CONTINUATION = "rocketlake> ", "       ...> "
HISTORY_FILE = Path("~/.rocketlake_sql_history")
HISTORY_LENGTH = 1000
SHELL_FORMATS = ("table", "csv", "json")
SCHEMA_CELL_WIDTH = 160

HELP = """\
Statements end with ';' and may span lines. Every lake table is a view under its own name.
  .tables                   the lake's tables
  .schema NAME              columns of a table: engine type and meaning
  .queries                  the ready-made queries
  .run NAME [P=V ...]       run a ready-made query, with parameters
  .format table|csv|json    how results print (now: {fmt})
  .help                     this text
  .quit                     leave (or Ctrl-D)"""


def column_descriptions() -> dict[str, dict[str, str]]:
    """table -> column -> meaning, from the table contracts (schemas.registry)."""
    from schemas.registry import TABLES

    return {name: dict(contract.descriptions) for name, contract in TABLES.items()}


class Shell:
    def __init__(self, engine: Engine, out: IO[str], err: IO[str], *, fmt: str = "table",
                 max_rows: int = 1000, interactive: bool = False) -> None:
        self.engine = engine
        self.out, self.err = out, err
        self.fmt = fmt if fmt in SHELL_FORMATS else "table"
        self.max_rows = max_rows
        self.interactive = interactive
        self.errors = 0

    # ---- input ---------------------------------------------------------------------------------
    def run(self, stdin: IO[str]) -> int:
        """Read and run until ``.quit`` or end of input; 0 (errors were printed as they came)."""
        read = self._reader(stdin)
        buffer = ""
        while True:
            try:
                line = read(CONTINUATION if buffer else PROMPT)
            except KeyboardInterrupt:
                self.err.write("^C\n")
                buffer = ""
                continue
            if line is None:
                break
            if not buffer and line.strip().startswith("."):
                if not self.command(line.strip()):
                    break
                continue
            buffer += line + "\n"
            statements, rest = split_statements(buffer, backslash_escapes=self.engine.backslash_escapes)
            for statement in statements:
                self.statement(statement.text)
            buffer = rest if pending(rest, backslash_escapes=self.engine.backslash_escapes) else ""
        if self.interactive:
            if pending(buffer, backslash_escapes=self.engine.backslash_escapes):
                self.err.write("(the statement without its ';' was not run)\n")
            return 0
        for statement in statements_of(buffer, backslash_escapes=self.engine.backslash_escapes):
            self.statement(statement.text)  # the last statement of piped input may lack its ';'
        return 0

    def _reader(self, stdin: IO[str]) -> Callable[[str], str | None]:
        if not self.interactive:
            def read(_prompt: str) -> str | None:
                line = stdin.readline()
                return None if line == "" else line.rstrip("\n")
            return read
        _start_history()

        def read_tty(prompt: str) -> str | None:
            try:
                return input(prompt)
            except EOFError:
                self.err.write("\n")
                return None
        return read_tty

    # ---- statements ----------------------------------------------------------------------------
    def statement(self, sql: str, params: dict[str, str] | None = None) -> None:
        """Run one statement and print its result, or its error; never raises for the user's mistakes."""
        sink, close = open_sink(self.fmt, out=self.out, max_rows=self.max_rows)
        try:
            if params is not None:
                sql = substitute(sql, params, escape_literal=self.engine.escape_literal,
                                 backslash_escapes=self.engine.backslash_escapes)
            result = self.engine.execute(sql)
            if result is not None:
                try:
                    sink.write(result)
                finally:
                    result.close()
        except (SqlError, ParamError) as exc:
            self._error(str(exc))
        except KeyboardInterrupt:
            self.err.write("^C (statement stopped)\n")
        finally:
            close()

    def _error(self, message: str) -> None:
        self.errors += 1
        self.out.flush()
        self.err.write(f"error: {message}\n")
        self.err.flush()

    # ---- dot commands --------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """Run a dot command; False to leave the shell."""
        name, _, arg = line.partition(" ")
        name, arg = name.rstrip(";"), arg.strip().rstrip(";").strip()
        if name in (".quit", ".exit", ".q"):
            return False
        handler = {".help": self._help, ".tables": self._tables, ".schema": self._schema,
                   ".queries": self._queries, ".run": self._run_saved, ".format": self._format}.get(name)
        if handler is None:
            self._error(f"unknown command {name}; .help lists them")
        else:
            handler(arg)
        return True

    def _help(self, _arg: str) -> None:
        self.out.write(HELP.format(fmt=self.fmt) + "\n")

    def _tables(self, _arg: str) -> None:
        try:
            self.engine.refresh()
        except SqlError as exc:
            self._error(str(exc))
            return
        for name in sorted(self.engine.tables()):
            self.out.write(name + "\n")

    def _schema(self, name: str) -> None:
        if not name:
            self._error("usage: .schema NAME (.tables lists the names)")
            return
        try:
            described = self.engine.execute(f"DESCRIBE {name}")
            table = pa.Table.from_batches(list(described.batches), described.schema) if described else None
        except SqlError as exc:
            self._error(str(exc))
            return
        if table is None or table.num_columns < 2:
            self._error(f"{name}: the engine describes no columns")
            return
        columns = table.column(0).to_pylist()
        types = [str(t) for t in table.column(1).to_pylist()]
        keep = [i for i, c in enumerate(columns) if c and not str(c).startswith("#")]  # Spark's partition notes
        seen: set[str] = set()
        keep = [i for i in keep if not (columns[i] in seen or seen.add(columns[i]))]
        meaning = column_descriptions().get(name.strip('"`').lower(), {})
        rows = pa.table({"column": [columns[i] for i in keep], "type": [types[i] for i in keep],
                         "description": [meaning.get(columns[i], "") for i in keep]})
        if self.fmt == "table":  # descriptions are read whole: wider cells than query results get
            TableSink(self.out, max_rows=len(keep) + 1, cell_width=SCHEMA_CELL_WIDTH).write(
                Result(rows.schema, iter(rows.to_batches())))
            return
        sink, close = open_sink(self.fmt, out=self.out, max_rows=len(keep) + 1)
        try:
            sink.write(Result(rows.schema, iter(rows.to_batches())))
        finally:
            close()

    def _queries(self, _arg: str) -> None:
        from pipelines.sql.queries import describe, list_queries

        self.out.write(describe(list_queries()) + "\n")

    def _run_saved(self, arg: str) -> None:
        from pipelines.sql.queries import find_query

        name, *pairs = arg.split()
        try:
            query = find_query(name) if name else None
            if query is None:
                raise KeyError("usage: .run NAME [PARAM=VALUE ...] (.queries lists them)")
            given = dict(parse_param(p) for p in pairs)
            text = query.text()
            values = resolve_params(text, given, backslash_escapes=self.engine.backslash_escapes)
        except (KeyError, ValueError) as exc:
            self._error(exc.args[0] if exc.args else str(exc))
            return
        for statement in statements_of(text, backslash_escapes=self.engine.backslash_escapes):
            self.statement(statement.text, values)

    def _format(self, arg: str) -> None:
        if arg not in SHELL_FORMATS:
            self._error(f".format takes one of {', '.join(SHELL_FORMATS)} (now: {self.fmt})")
            return
        self.fmt = arg


def _start_history() -> None:
    """Line editing and a history kept across sessions (saved at exit)."""
    try:
        import atexit
        import readline
    except ImportError:  # no readline on this platform: plain input() still works
        return
    path = os.path.expanduser(str(HISTORY_FILE))
    try:
        readline.read_history_file(path)
    except (FileNotFoundError, PermissionError, OSError):
        pass
    readline.set_history_length(HISTORY_LENGTH)

    def save() -> None:
        try:
            readline.write_history_file(path)
        except OSError as exc:
            log.warning("cannot save the SQL history to %s: %s", path, exc)
    atexit.register(save)


def run_shell(engine: Engine, *, fmt: str = "table", max_rows: int = 1000, stdin: IO[str] | None = None,
              out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    stdin = stdin or sys.stdin
    out, err = out or sys.stdout, err or sys.stderr
    interactive = stdin.isatty() and stdin is sys.stdin
    if interactive:
        err.write(f"rocketlake sql on {engine.lake} ({engine.name}): {len(engine.tables())} tables; "
                  ".help for help, .quit to leave\n")
    return Shell(engine, out, err, fmt=fmt, max_rows=max_rows, interactive=interactive).run(stdin)
