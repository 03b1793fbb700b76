"""Reports and replay on object storage: the golden store uploaded to an S3 endpoint (a ``moto_server``
process, spoken to over HTTP by pyarrow's and delta-rs's own S3 clients), the lake there too.

The lag, DLQ and audit jobs run in-process (their ``main``, as ``rocketlake <job>`` runs them) once
with store and lake on S3, storage options given with ``--storage-option``, and once on local
directories; every report table must be the same (run ids and audit times aside, and the store root
in file names: an S3 store's files are named by their URI). A replay dry run plans the same selection
from either lake. Errors a user can make with URIs (nothing there, an endpoint that does not answer)
are one line and exit 2.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from broker.cli import run_job
from pipelines.job_args import StoreSpec
from pipelines.lake import scan_arrow
from pipelines.reports.audit import read_layout
from pipelines.storage import Location
from schemas.replay import REPLAY_RUNS_TABLE
from schemas.reports import (
    AUDIT_FINDINGS_TABLE,
    CONSUMER_LAG_STATUS_TABLE,
    CONSUMER_LAG_TABLE,
    DLQ_MESSAGES_TABLE,
    DLQ_SUMMARY_TABLE,
    TOPIC_DAILY_STATS_TABLE,
)

BROKER = "broker-a"
SNAPSHOT_TS = "2030-01-01T00:00:00Z"
ALL_TIME = ["--since", "2000-01-01", "--until", "2100-01-01"]
# columns that differ between two runs by design: fresh run ids and audit times
RUN_COLUMNS = {"audit_run_id", "audited_at"}


def _options(server) -> list[str]:
    return [f"--storage-option={key}={value}" for key, value in sorted(server.options.items())]


def _run(capsys, job: str, argv: list[str]) -> str:
    assert run_job(job, argv) == 0, capsys.readouterr()
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def runs(spark, s3_server, golden_store, tmp_path_factory):
    """Lag, DLQ (ingest first) and audit, on S3 and locally; returns both lakes and the store roots."""
    bucket = s3_server.new_bucket()
    store_uri = s3_server.upload_dir(golden_store, bucket, "store")
    remote = {"store": store_uri, "lake": f"s3://{bucket}/lake", "extra": _options(s3_server)}
    local = {"store": str(golden_store), "lake": str(tmp_path_factory.mktemp("reports-s3") / "lake"), "extra": []}
    for where in (local, remote):
        store = ["--store", f"{BROKER}={where['store']}", "--lake", where["lake"], *where["extra"]]
        for job, args in (("consumer_lag.py", ["--snapshot-ts", SNAPSHOT_TS]), ("dlq_report.py", []),
                          ("audit.py", ["--no-ingest"])):
            rc = run_job(job, store + args)
            assert rc == 0, f"{job} on {where['lake']} exited {rc}"
    return {"local": local, "remote": remote, "options": s3_server.options}


def _lake(run: dict, options: dict) -> Location:
    return Location.parse(run["lake"], options if "://" in run["lake"] else None)


def _table(runs, which: str, name: str) -> pa.Table:
    """A report table with run-specific columns dropped, store roots made equal, rows sorted."""
    run = runs[which]
    table = scan_arrow(_lake(run, runs["options"]), name)
    table = table.drop_columns([c for c in table.column_names if c in RUN_COLUMNS])
    if "file" in table.column_names:
        root = run["store"].rstrip("/")
        table = table.set_column(table.column_names.index("file"), "file", pa.array(
            [None if f is None else f.replace(root, "STORE", 1) for f in table["file"].to_pylist()], pa.string()))
    sortable = [c for c in table.column_names
                if not (pa.types.is_list(table.schema.field(c).type) or pa.types.is_map(table.schema.field(c).type)
                        or pa.types.is_struct(table.schema.field(c).type))]
    return table.sort_by([(c, "ascending") for c in sortable])


@pytest.mark.parametrize("name", [CONSUMER_LAG_TABLE, CONSUMER_LAG_STATUS_TABLE, DLQ_MESSAGES_TABLE,
                                  DLQ_SUMMARY_TABLE, AUDIT_FINDINGS_TABLE, TOPIC_DAILY_STATS_TABLE])
def test_report_tables_on_s3_equal_the_local_ones(runs, name):
    local, remote = _table(runs, "local", name), _table(runs, "remote", name)
    assert remote.schema == local.schema
    assert remote.to_pylist() == local.to_pylist()


def test_the_reports_hold_rows(runs):
    """The comparison above means something: the golden store has lag, DLQ messages and traffic."""
    for name in (CONSUMER_LAG_TABLE, CONSUMER_LAG_STATUS_TABLE, DLQ_MESSAGES_TABLE, DLQ_SUMMARY_TABLE,
                 TOPIC_DAILY_STATS_TABLE):
        assert _table(runs, "remote", name).num_rows > 0, name


def test_audit_layout_of_an_s3_store_is_read_off_its_listing(runs, golden_store):
    """CQ file sizes and index geometry (what findings' file/offset come from) from an S3 listing
    equal those of the local directory; only the root differs."""
    remote = read_layout(StoreSpec.parse(f"{BROKER}={runs['remote']['store']}", runs["options"]))
    local = read_layout(StoreSpec.parse(f"{BROKER}={golden_store}"))
    assert remote.root == runs["remote"]["store"] and local.root == str(golden_store)
    assert (remote.cq_file_size, remote.cq_file_size_exceptions, remote.index_slots, remote.default_index_slots) == \
        (local.cq_file_size, local.cq_file_size_exceptions, local.index_slots, local.default_index_slots)
    assert remote.cq_file_size == 2000 and set(remote.index_slots.values()) == {128}  # golden store_a's geometry


# ---- replay from an S3 lake: a dry run plans what the local lake plans; a real run sends it -------------
@pytest.fixture(scope="module")
def target(runs, tmp_path_factory):
    """A name server and an empty broker with the replays' target topics (a dry run checks its route)."""
    from broker.client import Admin
    from tests.broker_harness import start_broker, start_namesrv

    tmp = tmp_path_factory.mktemp("reports-s3-target")
    ns, ns_addr = start_namesrv(tmp)
    broker = start_broker(tmp / "tgt", ns_addr, {"autoCreateTopicEnable": False})
    try:
        with Admin(ns_addr) as admin:
            for topic in ("OrdersDry", "OrdersFromS3"):
                admin.create_topic(broker.addr, topic, queues=4)
                assert admin.wait_writable(topic), f"{topic} not routed"
        yield ns_addr
    finally:
        broker.stop()
        ns.terminate()
        ns.wait(10)


def test_replay_dry_run_from_an_s3_lake_plans_what_the_local_lake_plans(runs, target, capsys):
    plans = {}
    for which in ("local", "remote"):
        run = runs[which]
        out = _run(capsys, "replay.py", ["--lake", run["lake"], *run["extra"], "--namesrv", target,
                                         "--topic", "TopicOrders", *ALL_TIME, "--target-topic", "OrdersDry",
                                         "--dry-run", "--run-id", "dry-s3", "--rate", "100"])
        assert "replay dry-s3: DRY_RUN recorded, nothing sent" in out
        plans[which] = [line for line in out.splitlines() if line.startswith(("replay plan", "  "))]
        [row] = [r for r in scan_arrow(_lake(run, runs["options"]), REPLAY_RUNS_TABLE).to_pylist()
                 if r["run_id"] == "dry-s3"]
        assert (row["run_id"], row["status"], row["sent"], row["dry_run"]) == ("dry-s3", "DRY_RUN", 0, True)
        plans[which].append((row["planned"], row["planned_bytes"], row["selection"]))
    assert plans["remote"] == plans["local"]
    assert plans["local"][-1][0] > 0


# ---- errors ---------------------------------------------------------------------------------------------
def _fails_with(capsys, job: str, argv: list[str], message: str) -> None:
    try:
        rc = run_job(job, argv)
    except SystemExit as exc:  # argparse's ap.error
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err and "Traceback" not in err, err


@pytest.mark.parametrize("job, args", [("consumer_lag.py", ["--snapshot-ts", SNAPSHOT_TS]),
                                       ("dlq_report.py", ["--no-ingest"]), ("audit.py", ["--no-ingest"])])
def test_a_store_uri_with_no_store_is_an_error(runs, s3_server, capsys, job, args):
    bucket = runs["remote"]["lake"].split("/")[2]
    _fails_with(capsys, job, ["--store", f"{BROKER}=s3://{bucket}/no-store-here", "--lake", runs["remote"]["lake"],
                              *runs["remote"]["extra"], *args], f"s3://{bucket}/no-store-here")


def test_an_unreachable_endpoint_is_an_error(runs, capsys):
    from broker.server.launcher import free_port

    dead = f"--storage-option=AWS_ENDPOINT_URL=http://127.0.0.1:{free_port()}"
    _fails_with(capsys, "consumer_lag.py", ["--store", f"{BROKER}={runs['remote']['store']}", "--lake",
                                            runs["remote"]["lake"], *runs["remote"]["extra"], dead,
                                            "--snapshot-ts", SNAPSHOT_TS], "127.0.0.1")


def test_replay_from_an_s3_lake_sends_each_selected_message_once(runs, target, capsys):
    """The executors read bodies and write the ledger through the lake's storage options: every
    planned message arrives once, with the body the lake holds for it."""
    from broker.client import PullConsumer
    from pipelines.replay import ledger
    from tests.broker_harness import drain

    remote = runs["remote"]
    lake = _lake(remote, runs["options"])
    out = _run(capsys, "replay.py", ["--lake", remote["lake"], *remote["extra"], "--namesrv", target,
                                     "--topic", "TopicOrders", *ALL_TIME, "--target-topic", "OrdersFromS3",
                                     "--run-id", "send-s3"])
    state = ledger.current_state(ledger.run_events(lake, "send-s3"))
    planned = state.num_rows
    assert f"replay plan send-s3: {planned} message(s)" in out and f"SUCCEEDED: {planned} sent, 0 failed" in out
    assert planned > 0 and set(state["status"].to_pylist()) == {"SENT"}
    offsets = sorted(state["commitlog_offset"].to_pylist())
    bodies = {r["commitlog_offset"]: r["body"] for r in scan_arrow(lake, "messages").to_pylist()}
    with PullConsumer("reports-s3-check", target) as consumer:
        got = drain(consumer, "OrdersFromS3")
    assert sorted(int(m.properties["RLR_ORIGIN_COMMITLOG_OFFSET"]) for m in got) == offsets
    assert all(m.payload == bodies[int(m.properties["RLR_ORIGIN_COMMITLOG_OFFSET"])] for m in got)  # decompressed
    [row] = [r for r in scan_arrow(lake, REPLAY_RUNS_TABLE).to_pylist() if r["run_id"] == "send-s3"]
    assert (row["status"], row["sent"], row["planned"]) == ("SUCCEEDED", planned, planned)


def test_validate_an_s3_lake_with_local_results(runs, tmp_path, capsys):
    """validate reads the tables on S3 and writes GX's results and Data Docs to --quality-dir; the
    verdict per table equals the local lake's."""
    import json

    verdicts = {}
    for which, extra in (("remote", runs["remote"]["extra"]), ("local", [])):
        out_dir = tmp_path / which
        rc = run_job("validate.py", ["--lake", runs[which]["lake"], *extra, "--quality-dir", str(out_dir),
                                     "--tables", "messages,dlq_messages,audit_findings"])
        out = capsys.readouterr().out
        assert rc == 0, out
        summary = json.loads(next(out_dir.glob("results/*/summary.json")).read_text())
        verdicts[which] = {name: (t["status"], t["evaluated"], t["successful"]) for name, t in summary["tables"].items()}
        assert summary["data_docs_index"].startswith(str(out_dir)), summary["data_docs_index"]
    assert verdicts["remote"] == verdicts["local"]
    assert set(verdicts["remote"]) == {"messages", "dlq_messages", "audit_findings"}
    assert {status for status, *_ in verdicts["remote"].values()} <= {"passed", "warning"}


def test_validate_an_s3_lake_without_a_results_directory_is_an_error(runs, capsys):
    _fails_with(capsys, "validate.py", ["--lake", runs["remote"]["lake"], *runs["remote"]["extra"]], "--quality-dir")
