"""``rocketlake sql``: SQL over the lake's Delta tables, one query, a file of them, or a shell.

    rocketlake sql --lake LAKE "SELECT topic, count(*) FROM messages GROUP BY topic"
    rocketlake sql --lake LAKE -f report.sql --format csv --output report.csv
    rocketlake sql --lake LAKE --saved message_by_key --param key=order-1
    rocketlake sql --list-queries
    rocketlake sql --lake LAKE                       # the interactive shell
    rocketlake sql --lake s3://bucket/lake --storage-option AWS_ENDPOINT_URL=http://127.0.0.1:9000 …

Every Delta table directly under LAKE is a view under its own name. LAKE is a directory or a URI
(``s3://``, ``gs://``, ``abfs://``, ``file://`` …); storage options (delta-rs names) come from the
environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) and ``--storage-option KEY=VALUE``, which wins.
Exit codes: 0 done; 2 for anything the user can fix — bad arguments, a lake that does not exist,
cannot be reached or holds no table, a query the engine rejects (its message is printed, with the
position where the engine gives one) — and never a Python traceback.
The parser is registered by :func:`broker.cli.build_parser`; engines load only when a query runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import IO

EXIT_OK, EXIT_USAGE = 0, 2
FORMATS = ("table", "csv", "json", "parquet")   # the sinks of pipelines.sql.output
DEFAULT_MAX_ROWS = 1000                         # table format: rows shown at most


def _param(text: str) -> tuple[str, str]:
    from pipelines.sql.statements import parse_param

    try:
        return parse_param(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def add_lake_args(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    """``--lake`` and ``--storage-option``, as ``sql``, ``sql-server`` and ``maintenance`` take them
    (:func:`lake_location` reads them back)."""
    p.add_argument("--lake", metavar="LAKE", required=required,
                   help="the lake: a directory or a URI (s3://bucket/lake, file://…) holding the Delta tables")
    from pipelines.job_args import add_storage_option_arg

    add_storage_option_arg(p)


def lake_location(args: argparse.Namespace):
    """``--lake`` with ``--storage-option`` as a :class:`pipelines.storage.Location`; raises
    :class:`pipelines.storage.StorageError` (a ValueError) for a malformed option or URI."""
    from pipelines.storage import Location, parse_storage_options

    return Location.parse(args.lake, parse_storage_options(args.storage_option))


def add_sql_parser(sub: argparse._SubParsersAction) -> None:
    """``rocketlake sql``: registered by :func:`broker.cli.build_parser`."""
    from pipelines.sql.engines import DEFAULT_ENGINE, ENGINES

    p = sub.add_parser(
        "sql", help="SQL over the lake's Delta tables (DuckDB, DataFusion or Spark SQL), or a shell",
        description="Run QUERY (several may be separated by ';'), the statements of -f FILE, or a "
                    "ready-made query (--saved NAME, see --list-queries) over every Delta table under "
                    "--lake (a directory or a URI such as s3://bucket/lake), each a view named after its directory (messages, consume_queue, consumer_lag, "
                    "dlq_messages, …). Without any of them: an interactive shell. Exit 2 when the engine "
                    "rejects a statement or the lake holds no table.",
        epilog="Parameters: a query may use ${NAME} placeholders, filled by --param NAME=VALUE or by the "
               "defaults its comments declare ('-- @param NAME = DEFAULT | description'); inside a string "
               "literal the value is escaped.")
    p.add_argument("query", nargs="?", metavar="QUERY", help="SQL to run (omit for the shell)")
    add_lake_args(p)
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                   help=f"default {DEFAULT_ENGINE} (embedded, no JVM); datafusion = delta-rs QueryBuilder; "
                        "spark = a local Spark session")
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="table (default; at most --max-rows rows), csv (with a header row), json (JSON lines), "
                        "parquet (needs --output)")
    p.add_argument("-o", "--output", metavar="FILE", help="write results here instead of stdout")
    p.add_argument("-f", "--file", metavar="FILE", help="run the statements of FILE (';'-separated)")
    p.add_argument("--saved", metavar="NAME", help="run the ready-made query NAME (see --list-queries)")
    p.add_argument("--param", action="append", type=_param, default=[], metavar="NAME=VALUE",
                   help="value for a ${NAME} placeholder (repeatable)")
    p.add_argument("--list-queries", action="store_true", help="list the ready-made queries and exit")
    p.add_argument("--max-rows", type=_positive, default=DEFAULT_MAX_ROWS,
                   help=f"rows a table shows at most (default {DEFAULT_MAX_ROWS})")
    p.set_defaults(func=cmd_sql)


def _fail(message: str, err: IO[str]) -> int:
    err.write(f"error: {message}\n")
    err.flush()
    return EXIT_USAGE


def _source(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(text, where it came from) of the statements to run; (None, None) for the shell. Raises
    ValueError for a source the user has to fix."""
    given = [name for name, value in (("QUERY", args.query), ("-f", args.file), ("--saved", args.saved)) if value]
    if len(given) > 1:
        raise ValueError(f"give one of QUERY, -f FILE or --saved NAME, not {' and '.join(given)}")
    if args.query:
        return args.query, None
    if args.file:
        path = Path(args.file)
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            hint = ""
            if not path.exists():
                from pipelines.sql.queries import QUERIES_DIR

                if (QUERIES_DIR / f"{path.stem}.sql").is_file() and path.parent == Path("."):
                    hint = f" (a ready-made query is called that: --saved {path.stem})"
            raise ValueError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}{hint}") from None
    if args.saved:
        from pipelines.sql.queries import find_query

        try:
            query = find_query(args.saved)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        return query.text(), str(query.path)
    return None, None


def cmd_sql(args: argparse.Namespace, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    if args.list_queries:
        from pipelines.sql.queries import describe, list_queries

        out.write(describe(list_queries()) + "\n")
        return EXIT_OK
    if not args.lake:
        return _fail("--lake LAKE is required (the directory or URI holding the Delta tables)", err)
    try:
        lake = lake_location(args)
    except ValueError as exc:
        return _fail(str(exc), err)
    if args.format == "parquet" and not args.output:
        return _fail("--format parquet needs --output FILE", err)
    try:
        text, origin = _source(args)
    except ValueError as exc:
        return _fail(str(exc), err)
    if text is None and args.format == "parquet":
        return _fail("--format parquet needs a query (QUERY, -f FILE or --saved NAME), not the shell", err)

    from pipelines.sql.engines import SqlError, open_engine

    try:
        engine = open_engine(args.engine, lake)
    except SqlError as exc:
        return _fail(str(exc), err)
    try:
        if text is None:
            from pipelines.sql.shell import run_shell

            if args.param:
                return _fail("--param applies to a query; in the shell use .run NAME PARAM=VALUE", err)
            if not args.output:
                return run_shell(engine, fmt=args.format, max_rows=args.max_rows, out=out, err=err)
            try:
                with open(args.output, "w", encoding="utf-8", newline="") as results:
                    return run_shell(engine, fmt=args.format, max_rows=args.max_rows, out=results, err=err)
            except OSError as exc:
                return _fail(f"cannot write {args.output}: {exc.strerror or exc}", err)
        return run_script(engine, text, dict(args.param), origin, args.format, args.output, args.max_rows, out, err)
    finally:
        engine.close()


def run_script(engine, text: str, params: dict[str, str], origin: str | None, fmt: str, output: str | None,
               max_rows: int, out: IO[str], err: IO[str]) -> int:
    """Run every statement of ``text`` in order, writing each result; stop at the first error."""
    from pipelines.sql.engines import SqlError
    from pipelines.sql.output import open_sink
    from pipelines.sql.statements import ParamError, resolve_params, statements_of, substitute

    escapes = engine.backslash_escapes
    try:
        values = resolve_params(text, params, backslash_escapes=escapes)
    except ParamError as exc:
        return _fail(str(exc), err)
    statements = statements_of(text, backslash_escapes=escapes)
    if not statements:
        return _fail(f"no SQL statement in {origin or 'the query'}", err)
    try:
        sink, close = open_sink(fmt, out=out, path=output, max_rows=max_rows)
    except OSError as exc:
        return _fail(f"cannot write {output}: {exc.strerror or exc}", err)
    try:
        for number, statement in enumerate(statements, 1):
            sql = substitute(statement.padded(), values, escape_literal=engine.escape_literal,
                             backslash_escapes=escapes)
            try:
                result = engine.execute(sql)
                if result is not None:
                    try:
                        sink.write(result)
                    finally:
                        result.close()
            except SqlError as exc:
                sink.abort()
                where = ""
                if origin or len(statements) > 1:
                    where = f"{origin + ', ' if origin else ''}statement {number} (line {statement.line}): "
                out.flush()
                return _fail(where + str(exc), err)
    finally:
        close()
    return EXIT_OK
