"""``rocketlake sql-server``: Spark's Thrift JDBC/ODBC server (HiveServer2 protocol) over the lake.

    rocketlake sql-server --lake LAKE [--port 10000] [--host 127.0.0.1] [--master local[2]]
        [--storage-option KEY=VALUE ...]      # LAKE: a directory or a URI (s3://bucket/lake, …)
    beeline -u jdbc:hive2://127.0.0.1:10000/ -e 'SELECT count(*) FROM messages'

How it runs: a SparkSession driven from Python (so the delta-rs Python Data Source of
:mod:`pipelines.sources.delta` can plan and read), every lake table registered by
:func:`pipelines.sql.views.register_lake_views` as a temporary view and as ``global_temp.<name>``,
then ``HiveThriftServer2.startWithContext`` through py4j. With
``spark.sql.hive.thriftServer.singleSession=true`` every JDBC connection shares that one session,
so the views answer to their plain names (``messages``, ``consume_queue``, …). Serves until
SIGINT/SIGTERM.

What the PySpark 4.2.0 wheel allows (checked with its jars): ``spark-hive-thriftserver``,
``spark-hive`` and the Hive 2.3.10 client/beeline jars are bundled, so the Thrift server starts
with the *in-memory* catalog (``spark.sql.catalogImplementation`` stays ``in-memory``; no
``metastore_db/``). Hive support (a Derby metastore in the working directory) would also load but
buys nothing here: the lake is read through views, not metastore tables. The server still creates
a throw-away in-memory Derby "execution Hive" for HiveServer2's own session handling. Python data
sources cannot back catalog tables in 4.2.0 (``CREATE TABLE … USING`` drops the options), hence
views. Concurrency caveat: see "Plans" in :mod:`pipelines.sources.delta`.

Loopback by default: the Thrift port binds to ``--host`` (127.0.0.1) and the Spark UI is off.
Exit codes: 0 after a signal, 2 for bad input (no tables at ``--lake``, a lake URI that does not
exist or cannot be reached, a malformed ``--storage-option``), 1 when the server cannot
start (port in use, JVM failure) — one ``error:`` line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines.storage import Location

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_PORT = 10000
DEFAULT_HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0
THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


class ServerError(Exception):
    """A failure to report as one line (exit code in ``code``)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ServerConfig:
    lake: str | Location          # a path, a URI, or a Location with storage options
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    master: str = "local[2]"


def jdbc_url(host: str, port: int) -> str:
    return f"jdbc:hive2://{host}:{port}/"


def port_available(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound now (with SO_REUSEADDR, as the Thrift socket does)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ServerError(f"cannot resolve --host {host!r}: {exc.strerror}", EXIT_USAGE) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError:
            return False
    return True


def wait_listening(host: str, port: int, timeout: float, alive=lambda: True) -> bool:
    """Poll until a TCP connect to ``host:port`` succeeds (False on timeout or when ``alive()`` fails)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def start_session(config: ServerConfig, scratch: str):
    """The Python-driven SparkSession the Thrift server runs on (UTC, single session, UI off;
    the warehouse directory in ``scratch`` rather than ``./spark-warehouse``)."""
    from pipelines.session import build_session

    extra = {
        "spark.sql.hive.thriftServer.singleSession": "true",  # static: must be set at build time
        "spark.sql.warehouse.dir": os.path.join(scratch, "warehouse"),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    return build_session("rocketlake-sql-server", config.master, extra)


def start_thrift_server(spark, config: ServerConfig, scratch: str):
    """``HiveThriftServer2.startWithContext`` on ``spark``; returns the JVM server object."""
    jvm = spark.sparkContext._jvm
    # the execution Hive boots an in-memory Derby, which writes derby.log to the working directory
    jvm.java.lang.System.setProperty("derby.stream.error.file", os.path.join(scratch, "derby.log"))
    # HiveThriftServer2 builds its Hive conf from the session's Hadoop conf, which copies the SQL
    # confs (as builder options these keys would be dropped: not "spark.*")
    spark.conf.set("hive.server2.thrift.bind.host", config.host)
    spark.conf.set("hive.server2.thrift.port", str(config.port))
    spark.conf.set("hive.server2.transport.mode", "binary")
    server_class = jvm
    for part in THRIFT_SERVER_CLASS.split("."):
        server_class = getattr(server_class, part)
    return server_class.startWithContext(spark._jsparkSession.sqlContext())


def serve(config: ServerConfig, ready=None, stop: threading.Event | None = None) -> int:
    """Run the server until ``stop`` is set (the CLI sets it on SIGINT/SIGTERM).

    ``ready(tables)`` is called once the port accepts connections. Raises :class:`ServerError`."""
    from pipelines.sql.views import register_lake_views, tables_or_error

    try:
        tables_or_error(config.lake)  # before starting a JVM: a wrong --lake fails fast
    except ValueError as exc:
        raise ServerError(str(exc), EXIT_USAGE) from None
    if not 0 < config.port < 65536:
        raise ServerError(f"--port {config.port} is not a TCP port (1-65535)", EXIT_USAGE)
    if not port_available(config.host, config.port):
        raise ServerError(f"port {config.port} on {config.host} is in use")
    stop = stop or threading.Event()
    scratch = tempfile.mkdtemp(prefix="rocketlake-sql-server-")
    spark = None
    server = None
    try:
        try:
            spark = start_session(config, scratch)
        except Exception as exc:  # no Java, JVM start failure, …
            raise ServerError(f"could not start Spark: {_first_line(exc)}") from None
        try:
            tables = register_lake_views(spark, config.lake, global_views=True)
        except ValueError as exc:  # the lake changed since the check above
            raise ServerError(str(exc), EXIT_USAGE) from None
        try:
            server = start_thrift_server(spark, config, scratch)
        except Exception as exc:  # py4j error: the JVM's message, first line
            raise ServerError(f"could not start the Thrift server: {_first_line(exc)}") from None
        if not wait_listening(config.host, config.port, START_TIMEOUT_S, alive=lambda: not stop.is_set()):
            if stop.is_set():
                return EXIT_OK
            raise ServerError(f"the Thrift server did not listen on {config.host}:{config.port} "
                              f"within {START_TIMEOUT_S:g} s")
        log.info("serving %d tables on %s", len(tables), jdbc_url(config.host, config.port))
        if ready is not None:
            ready(tables)
        while not stop.wait(1.0):  # a timed wait: signal handlers run promptly
            pass
        return EXIT_OK
    finally:
        if server is not None:
            try:
                server.stop()
            except Exception as exc:  # the JVM may already be going down
                log.debug("Thrift server stop: %s", exc)
        if spark is not None:
            spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:
            pass
    return text.splitlines()[0] if text else type(exc).__name__


def cmd_sql_server(args: argparse.Namespace) -> int:
    from pipelines.sql.cli import lake_location

    try:
        lake = lake_location(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = ServerConfig(lake=lake, host=args.host, port=args.port, master=args.master)
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def ready(tables: dict[str, str]) -> None:
        url = jdbc_url(config.host, config.port)
        print(f"rocketlake sql-server: {len(tables)} tables ({', '.join(tables)}) on {url}\n"
              f"connect with: beeline -u {url}", file=sys.stderr, flush=True)

    try:
        return serve(config, ready=ready, stop=stop)
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def add_sql_server_parser(sub: argparse._SubParsersAction) -> None:
    """``rocketlake sql-server``: registered by :func:`broker.cli.build_parser`."""
    from pipelines.sql.cli import add_lake_args

    p = sub.add_parser("sql-server", help="serve the lake's tables over JDBC/ODBC (HiveServer2 protocol)",
                       description="Spark's Thrift JDBC/ODBC server with every Delta table under --lake as a "
                                   "view of the same name; serves until SIGINT/SIGTERM. Exit 2 on bad input, "
                                   "1 when the server cannot start.")
    add_lake_args(p, required=True)
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"Thrift port (default {DEFAULT_PORT})")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: loopback only)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.set_defaults(func=cmd_sql_server)

