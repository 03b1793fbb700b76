"""``rocketlake`` command line: one entry point, subcommands delegate to the packages.

Later issues add ``broker``, ``namesrv``, ``ingest``, ``replay`` and ``sql``; this module only parses
arguments, prints, and sets the exit code.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from broker.store.constants import FLUSH_DISK_TYPES

log = logging.getLogger("rocketlake")

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def _iso_to_ms(text: str) -> int:
    """ISO-8601 date/time (naive = UTC) or epoch milliseconds → epoch ms."""
    if text.isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time (e.g. 2026-11-01T12:00:00Z) "
                                         "or epoch milliseconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (binary)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = units.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in units else t
    try:
        value = int(float(number) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 1073741824, 64M, 1G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("size must be > 0")
    return value


def _store_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"store directory {text!r} does not exist")
    if not (path / "commitlog").is_dir() and not (path / "consumequeue").is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a RocketMQ store (no commitlog/ or consumequeue/ inside)")
    return path


def _print_findings(findings, stream=None) -> None:
    stream = stream or sys.stderr  # looked up per call: a default bound at import misses redirection
    for f in findings:
        print(f"finding: {f}", file=stream)


def _cell(text: str) -> str:
    """Table cell text: control characters (CR, ESC, …) would break the one-line rows or drive the terminal."""
    return "".join(c if c.isprintable() else "." for c in text)


# ---- store subcommands ---------------------------------------------------------------------------
def cmd_store_messages(args: argparse.Namespace) -> int:
    from broker.store.inspect import MessageQuery, iter_messages, json_row

    query = MessageQuery(args.topic, args.since, args.until, args.from_offset, args.limit)
    out = sys.stdout
    if args.format == "table":
        header = f"{'OFFSET':>12} {'STORE TIME (UTC)':<23} {'TOPIC':<24} {'QID':>3} {'QOFFSET':>8} " \
                 f"{'TAGS':<10} {'KEYS':<28} BODY"
        print(header, file=out)
    for row in iter_messages(args.store, query):
        if args.format == "jsonl":
            out.write(json.dumps(json_row(row), ensure_ascii=False) + "\n")
        else:
            ts = datetime.fromtimestamp(row["store_timestamp"] / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
            body = _cell(row["body"][:40].decode("utf-8", "replace").replace("\n", " "))
            print(f"{row['commitlog_offset']:>12} {ts:<23} {_cell(row['topic'][:24]):<24} {row['queue_id']:>3} "
                  f"{row['queue_offset']:>8} {_cell((row['tags'] or '')[:10]):<10} "
                  f"{_cell(' '.join(row['keys'])[:28]):<28} {body}", file=out)
    _print_findings(query.findings)
    return EXIT_OK


def cmd_store_queues(args: argparse.Namespace) -> int:
    from broker.store.inspect import queue_summaries, queue_units

    findings: list = []
    summaries = queue_summaries(args.store, args.topic, findings)
    if args.topic and not summaries:
        print(f"error: topic {args.topic!r} has no consume queues in {args.store}", file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        for s in summaries:
            print(json.dumps({"topic": s.topic, "queue_id": s.queue_id, "min_offset": s.min_offset,
                              "max_offset": s.max_offset, "messages": s.messages}, ensure_ascii=False))
    else:
        print(f"{'TOPIC':<32} {'QID':>4} {'MIN':>10} {'MAX':>10} {'MESSAGES':>10}")
        for s in summaries:
            print(f"{s.topic:<32} {s.queue_id:>4} {s.min_offset:>10} {s.max_offset:>10} {s.messages:>10}")
    if args.units:
        for s in summaries:
            for unit in queue_units(args.store, s.topic, s.queue_id):
                print(json.dumps(unit, ensure_ascii=False))
    _print_findings(findings)
    return EXIT_OK


def cmd_store_index(args: argparse.Namespace) -> int:
    from broker.store.inspect import json_row, query_key

    rows = query_key(args.store, args.topic, args.key, args.begin or 0,
                     args.end if args.end is not None else (1 << 63) - 1)
    for row in rows:
        print(json.dumps(json_row(row), ensure_ascii=False))
    print(f"{len(rows)} message(s) with key {args.key!r} in topic {args.topic!r}", file=sys.stderr)
    return EXIT_OK


def cmd_store_verify(args: argparse.Namespace) -> int:
    from broker.store.verify import verify_store

    report = verify_store(args.store, segment_size=args.segment_bytes,
                          message_delay_level=args.message_delay_level, progress=(lambda m: log.info("%s", m)))
    if args.format == "json":
        for f in report.findings:
            print(json.dumps(f.to_dict(), ensure_ascii=False))
    else:
        for f in report.findings:
            print(f)
    print(report.summary(), file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_FINDINGS


def cmd_store_compare(args: argparse.Namespace) -> int:
    from broker.store.replica import ReplicaError, compare_stores

    try:
        report = compare_stores(args.master, args.slave, segment_size=args.segment_bytes)
    except ReplicaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False))
    else:
        for line in report.lines():
            print(line)
    return EXIT_OK if report.ok else EXIT_FINDINGS


def cmd_store_generate(args: argparse.Namespace) -> int:
    from broker.store.generate import GenerateSpec, generate_store

    try:
        spec = GenerateSpec(messages=args.messages, body_bytes=args.body_bytes, topics=args.topics,
                            queues=args.queues, seed=args.seed, segment_bytes=args.segment_bytes,
                            **({"index_slots": args.index_slots, "index_entries": 4 * args.index_slots}
                               if args.index_slots else {}))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def progress(done: int, total: int) -> None:
        print(f"\rgenerating: {done}/{total} messages ({100 * done // max(total, 1)}%)", end="",
              file=sys.stderr, flush=True)

    try:
        result = generate_store(args.store, spec, progress=progress if sys.stderr.isatty() else None)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    mb = result.bytes / 1e6
    print(f"\rgenerated {result.messages} messages, {mb:.1f} MB of commitlog in {result.seconds:.1f} s "
          f"({mb / max(result.seconds, 1e-9):.0f} MB/s) into {args.store}", file=sys.stderr)
    return EXIT_OK


# ---- namesrv subcommands -------------------------------------------------------------------------
def _listen_address(text: str) -> str:
    """``host:port`` (``[v6]:port`` for IPv6) to listen on; port 0 picks a free one."""
    from broker.remoting.transport import parse_address

    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (e.g. 127.0.0.1:9876)") from None
    return text


def positive_float(unit: str):
    """An argparse type: a number > 0 of ``unit`` (the error names the unit)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be > 0")
        return value
    return parse


_positive_seconds = positive_float("seconds")


def _add_namesrv_tls_arguments(p: argparse.ArgumentParser) -> None:
    """The broker's TLS settings (Apache's names, in the help) as name server flags."""
    from broker.remoting import tls

    p.add_argument("--tls-mode", choices=[m.value for m in tls.TlsMode], default=tls.TlsMode.DISABLED.value,
                   help=f"{tls.MODE_KEY}: disabled (default), permissive (TLS and plaintext on one port) or "
                        "enforcing (TLS only)")
    p.add_argument("--tls-cert", default="", metavar="PEM", help=f"{tls.CERT_PATH_KEY}: certificate chain "
                                                                 "(reloaded when it changes)")
    p.add_argument("--tls-key", default="", metavar="PEM", help=f"{tls.KEY_PATH_KEY}: its private key")
    p.add_argument("--tls-key-password", default="", metavar="TEXT", help=f"{tls.KEY_PASSWORD_KEY}")
    p.add_argument("--tls-trust-cert", default="", metavar="PEM",
                   help=f"{tls.TRUST_CERT_PATH_KEY}: CA certificates client certificates are verified against")
    p.add_argument("--tls-need-client-auth", choices=[a.value for a in tls.ClientAuth],
                   default=tls.ClientAuth.NONE.value, help=f"{tls.NEED_CLIENT_AUTH_KEY} (default none)")


def _stop_with_parent(args: argparse.Namespace) -> None:
    if args.stop_with_parent:
        from broker.server.linux_process import terminate_when_orphaned

        terminate_when_orphaned()


def cmd_namesrv_start(args: argparse.Namespace) -> int:
    from broker.remoting import event_loop

    from broker.namesrv.server import serve_name_server
    from broker.remoting.tls import ServerTls, ServerTlsConfig, TlsConfigError

    def ready(server) -> None:
        print(f"name server listening on {server.address}", file=sys.stderr, flush=True)

    from broker.acl.errors import AclConfigError

    if args.acl_enable and not args.acl_file:
        print("error: --acl-enable needs --acl-file (the name server has no config file to find it beside)",
              file=sys.stderr)
        return EXIT_USAGE
    acl_file = str(args.acl_file.resolve()) if args.acl_enable else None
    try:
        tls = ServerTls(ServerTlsConfig(mode=args.tls_mode, cert_path=args.tls_cert, key_path=args.tls_key,
                                        key_password=args.tls_key_password, trust_cert_path=args.tls_trust_cert,
                                        need_client_auth=args.tls_need_client_auth))
    except TlsConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _stop_with_parent(args)
    try:
        event_loop.run(serve_name_server(args.listen, broker_timeout_s=args.broker_timeout, on_ready=ready, tls=tls,
                                      acl_file=acl_file))
    except AclConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"error: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK


# ---- broker subcommands --------------------------------------------------------------------------
def cmd_broker_start(args: argparse.Namespace) -> int:
    from broker.remoting.transport import parse_address
    from broker.server.supervisor import run_broker
    from broker.server.settings import BrokerSettings, SettingsError, load_settings

    overrides: dict = {"broker_name": args.name, "namesrv_addr": args.namesrv,
                       "flush_disk_type": args.flush_disk_type, "request_processes": args.processes}
    host = None
    if args.listen:
        host, port = parse_address(args.listen)
        overrides.update(listen_host=host, listen_port=port)
    try:
        settings = load_settings(args.config, **overrides)
        if host not in (None, "0.0.0.0", "::", "") and settings.broker_ip1 == BrokerSettings().broker_ip1:
            # no brokerIP1 configured: clients reach us where we listen
            settings = settings.with_overrides(broker_ip1=host)
        store = args.store or (Path(settings.store_path_root_dir).expanduser() if settings.store_path_root_dir else None)
        if store is None:
            raise SettingsError("no store directory: give --store or storePathRootDir in the config file")
        settings = settings.with_overrides(store_path_root_dir=str(Path(store).resolve()))
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from broker.acl.errors import AclConfigError
    from broker.remoting.tls import TlsConfigError

    try:
        return run_broker(settings, str(store), logging.getLogger().level, args.config,
                          stop_with_parent=args.stop_with_parent)
    except (AclConfigError, TlsConfigError) as exc:  # aclEnable with a missing/broken ACL file; unusable TLS files
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FINDINGS


# ---- schema subcommands -----------------------------------------------------------------------------
def cmd_schema_infer(args: argparse.Namespace) -> int:
    from pipelines.payloads.infer import InferError, infer_topic_schema
    from pipelines.storage import Location, StorageError, parse_storage_options

    try:
        lake = Location.parse(args.lake, parse_storage_options(args.storage_option))
        schema = infer_topic_schema(lake, args.topic, args.sample, args.broker)
    except (InferError, StorageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(schema, indent=2, ensure_ascii=False))
    return EXIT_OK


def cmd_schema_install(args: argparse.Namespace) -> int:
    from pipelines.payloads.declarations import install_declarations
    from pipelines.payloads.errors import PayloadSchemaError
    from pipelines.storage import Location, StorageError, parse_storage_options

    try:
        lake = Location.parse(args.lake, parse_storage_options(args.storage_option))
        from pipelines.ingest import check_payload_schemas
        from pipelines.payloads.declarations import load_declarations

        check_payload_schemas(lake, load_declarations(args.file))  # refused before anything is copied
        installed = install_declarations(args.file, lake)
    except (PayloadSchemaError, StorageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for decl in installed:
        print(f"{decl.topic}: {decl.format} -> {decl.table_name} ({len(decl.schema)} payload columns)")
    return EXIT_OK


# ---- Spark jobs -------------------------------------------------------------------------------------
# rocketlake COMMAND → jobs/<file>.py, run in-process (same options as spark-submit of that file)
JOB_COMMANDS: dict[str, tuple[str, str]] = {
    "ingest": ("ingest_commitlog.py", "ingest broker stores (directories or URIs) into Delta tables"),
    "lag": ("consumer_lag.py", "consumer lag snapshot, Burrow-style status, lag plot"),
    "dlq": ("dlq_report.py", "dead-letter-queue analysis (dlq_messages, dlq_summary)"),
    "audit": ("audit.py", "store audit (audit_findings, topic_daily_stats)"),
    "validate": ("validate.py", "Great Expectations suites over the Delta tables"),
    "replay": ("replay.py", "send a selection of the lake's messages back through a producer, exactly once"),
    "maintenance": ("maintenance.py", "compact (OPTIMIZE), checkpoint and VACUUM the lake's Delta tables"),
}


def run_job(file_name: str, argv: list[str]) -> int:
    """``jobs/<file_name>``'s ``main(argv)`` in this process (the jobs are files for spark-submit,
    not modules of a package, so they are loaded by path)."""
    import importlib.util

    job = Path(__file__).resolve().parents[1] / "jobs" / file_name
    spec = importlib.util.spec_from_file_location(job.stem, job)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def cmd_job(args: argparse.Namespace, extra: list[str]) -> int:
    """Same as ``spark-submit jobs/<file>.py``, with a local Spark session."""
    return run_job(JOB_COMMANDS[args.command][0], extra)


# ---- parser ----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocketlake", description="Batch analytics and replay over Apache RocketMQ broker stores.")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    store = sub.add_parser("store", help="inspect, verify or generate a broker store offline",
                           description="Offline tools for an Apache RocketMQ store directory (broker up or down).")
    ssub = store.add_subparsers(dest="store_command", required=True, metavar="SUBCOMMAND")

    p = ssub.add_parser("messages", help="dump messages as JSON lines or a table",
                        description="One JSON object per CommitLog message record, in offset order.")
    p.add_argument("store", type=_store_dir, metavar="STORE_DIR")
    p.add_argument("--topic", help="only this topic (stored topic or, for delayed/half messages, the real topic)")
    p.add_argument("--since", type=_iso_to_ms, help="store time >= this (ISO-8601, UTC if no zone, or epoch ms)")
    p.add_argument("--until", type=_iso_to_ms, help="store time <= this (ISO-8601 or epoch ms)")
    p.add_argument("--from-offset", type=_non_negative, help="start at this commitlog offset")
    p.add_argument("--limit", type=_positive, help="stop after N messages")
    p.add_argument("--format", choices=["jsonl", "table"], default="jsonl")
    p.set_defaults(func=cmd_store_messages)

    p = ssub.add_parser("queues", help="min/max offsets per topic and queue",
                        description="ConsumeQueue min/max logical offsets per topic/queue.")
    p.add_argument("store", type=_store_dir, metavar="STORE_DIR")
    p.add_argument("--topic")
    p.add_argument("--units", action="store_true", help="also print every unit as a JSON line")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_store_queues)

    p = ssub.add_parser("index", help="look messages up by key through the IndexFiles",
                        description="Messages whose KEYS or UNIQ_KEY equal KEY (like mqadmin queryMsgByKey, no 64-result cap).")
    p.add_argument("store", type=_store_dir, metavar="STORE_DIR")
    p.add_argument("--topic", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--begin", type=_iso_to_ms, help="store time >= this")
    p.add_argument("--end", type=_iso_to_ms, help="store time <= this")
    p.set_defaults(func=cmd_store_index)

    p = ssub.add_parser("verify", help="check CRCs, CQ/CommitLog agreement and torn tails (exit 1 on findings)",
                        description="Integrity check. Prints one finding per line (file@offset: kind: detail); exit 1 if any.")
    p.add_argument("store", type=_store_dir, metavar="STORE_DIR")
    p.add_argument("--segment-bytes", type=_size, help="commitlog file size if it cannot be read off the files")
    p.add_argument("--message-delay-level", metavar="LEVELS",
                   help="the broker's messageDelayLevel, to check SCHEDULE_TOPIC_XXXX deliver times "
                        "(default Apache's '1s 5s 10s 30s 1m ... 2h')")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_store_verify)

    p = ssub.add_parser("compare", help="compare a master's store with its slave's (exit 1 on divergence or a slave ahead)",
                        description="Replication check of a 4.x master/slave pair, offline: commitlog ranges, lag in "
                                    "bytes, ms and records, the first byte where the slave differs (file, offset, "
                                    "record on both sides), slave data past the master's end, and ConsumeQueue "
                                    "agreement. Exit 0 when the slave is in sync or only lagging, 1 on divergence "
                                    "or a slave ahead, 2 on bad arguments or stores that cannot be compared.")
    p.add_argument("master", type=_store_dir, metavar="MASTER_STORE_DIR")
    p.add_argument("slave", type=_store_dir, metavar="SLAVE_STORE_DIR")
    p.add_argument("--segment-bytes", type=_size, help="commitlog file size if it cannot be read off the files")
    p.add_argument("--json", action="store_true", help="one JSON object instead of one fact per line")
    p.set_defaults(func=cmd_store_compare)

    p = ssub.add_parser("generate", help="write a synthetic, realistic store",
                        description="Generate a store (CommitLog, ConsumeQueue, IndexFile, config, checkpoint).")
    p.add_argument("store", type=Path, metavar="STORE_DIR")
    p.add_argument("--messages", type=_non_negative, required=True)
    p.add_argument("--body-bytes", type=_non_negative, default=1024, help="average body size (default 1024)")
    p.add_argument("--topics", type=_positive, default=4)
    p.add_argument("--queues", type=_positive, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--segment-bytes", type=_size, default=1 << 30, help="commitlog file size (default 1G)")
    p.add_argument("--index-slots", type=_positive,
                   help="index hash slots per file (entries = 4 x slots; default Apache's 5,000,000)")
    p.set_defaults(func=cmd_store_generate)

    schema = sub.add_parser("schema", help="payload schemas of the lake's topics",
                            description="Tools for the payload declarations (typed per-topic tables).")
    schsub = schema.add_subparsers(dest="schema_command", required=True, metavar="SUBCOMMAND")
    p = schsub.add_parser("infer", help="propose a JSON Schema from a topic's message bodies",
                          description="Reads up to N bodies of TOPIC from the lake's messages table and prints a "
                                      "JSON Schema for them (types, nullability, nesting) on stdout.")
    p.add_argument("--lake", required=True, metavar="LAKE_DIR|URI")
    p.add_argument("--topic", required=True, help="stored topic whose bodies are JSON objects")
    p.add_argument("--sample", type=_positive, default=1000, metavar="N", help="bodies to read (default 1000)")
    p.add_argument("--broker", help="only this broker's messages")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="delta-rs storage option for a remote lake (repeatable)")
    p.set_defaults(func=cmd_schema_infer)
    p = schsub.add_parser("install", help="check a payload declarations file and install it in the lake",
                          description="Checks FILE (formats, schema files, table names, and that each payload "
                                      "table can take its schema: additive changes only) and copies it with its "
                                      "schema files to LAKE/_rocketlake/, where every ingest run finds it.")
    p.add_argument("file", metavar="FILE", help="payload_schemas.toml (schema paths relative to it)")
    p.add_argument("--lake", required=True, metavar="LAKE_DIR|URI")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="delta-rs storage option for a remote lake (repeatable)")
    p.set_defaults(func=cmd_schema_install)

    namesrv = sub.add_parser("namesrv", help="run a RocketMQ name server",
                             description="A name server speaking the RocketMQ remoting protocol (brokers register, "
                                         "clients look up routes).")
    nsub = namesrv.add_subparsers(dest="namesrv_command", required=True, metavar="SUBCOMMAND")
    p = nsub.add_parser("start", help="serve until SIGINT/SIGTERM",
                        description="Serve routes on LISTEN until SIGINT/SIGTERM; logs go to stderr.")
    p.add_argument("--listen", type=_listen_address, default="127.0.0.1:9876",
                   help="host:port to listen on (default 127.0.0.1:9876; port 0 = any free port)")
    p.add_argument("--broker-timeout", type=_positive_seconds, default=120.0, metavar="SECONDS",
                   help="drop a broker silent for this long (default 120)")
    p.add_argument("--acl-enable", action="store_true",
                   help="admin requests (KV config, topic deletion, config update) need an admin account of the "
                        "ACL file (Apache's plain_acl.yml); routes and registration stay open")
    p.add_argument("--acl-file", type=Path, default=None, metavar="FILE", help="the ACL file (plain_acl.yml)")
    p.add_argument("--stop-with-parent", action="store_true",
                   help="stop cleanly (as on SIGTERM) when the process that started this one exits (for programs "
                        "that start their own servers: tests, benchmarks, the demo)")
    _add_namesrv_tls_arguments(p)
    p.set_defaults(func=cmd_namesrv_start)

    broker = sub.add_parser("broker", help="run a RocketMQ-compatible broker",
                            description="A multiprocessing broker speaking the RocketMQ remoting protocol; it "
                                        "writes the standard Apache RocketMQ store.")
    bsub = broker.add_subparsers(dest="broker_command", required=True, metavar="SUBCOMMAND")
    p = bsub.add_parser("start", help="serve until SIGINT/SIGTERM (clean shutdown: flush, checkpoint)",
                        description="Start the store process and the network processes; SIGTERM stops cleanly.")
    p.add_argument("--store", type=Path, default=None, metavar="DIR",
                   help="store directory, created if missing (default: storePathRootDir of the config file)")
    p.add_argument("--listen", type=_listen_address, default=None,
                   help="host:port to listen on (default 127.0.0.1:10911)")
    p.add_argument("--namesrv", default=None, help="name server address(es), host:port;host:port")
    p.add_argument("--name", default=None, help="broker name (default broker-a)")
    p.add_argument("-c", "--config", type=Path, default=None, metavar="FILE",
                   help="broker settings under Apache's broker.conf names: our broker.toml, or Apache's own "
                        "broker.conf (Java properties: .conf/.properties, or any file that is not TOML)")
    p.add_argument("--flush-disk-type", choices=FLUSH_DISK_TYPES, default=None)
    p.add_argument("--processes", type=_positive, default=None, help="network processes (default: cores)")
    p.add_argument("--stop-with-parent", action="store_true",
                   help="stop cleanly (as on SIGTERM) when the process that started this one exits (for programs "
                        "that start their own servers: tests, benchmarks, the demo)")
    p.set_defaults(func=cmd_broker_start)

    from broker.admin_cli import add_admin_parser  # here: admin_cli imports this module's helpers

    add_admin_parser(sub)

    from pipelines.sql.cli import add_sql_parser  # rocketlake sql: engines load only when a query runs

    add_sql_parser(sub)

    from pipelines.sql.server import add_sql_server_parser  # no Spark import until the command runs

    add_sql_server_parser(sub)

    for name, (file_name, help_text) in JOB_COMMANDS.items():
        p = sub.add_parser(name, help=f"{help_text} (same as spark-submit jobs/{file_name})",
                           description=f"Runs jobs/{file_name} in-process; 'rocketlake {name} --help' lists its options.",
                           add_help=False)
        p.set_defaults(func=cmd_job, passthrough=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        return args.func(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=getattr(logging, args.log_level), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        return args.func(args)
    except BrokenPipeError:  # `rocketlake store messages … | head`
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
