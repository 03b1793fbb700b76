"""``rocketlake sql`` and ``rocketlake maintenance`` on a lake in S3 (a ``moto_server`` process spoken to
over HTTP): the lake ingested from Apache's golden store is copied there as it is (a Delta table's
files are relative to it), and every engine answers the same queries with the same tables over the
S3 copy as over the local lake; commits made there after an engine opened are seen; maintenance
compacts, checkpoints and vacuums there keeping every row; a lake that does not exist or cannot be
reached is one error line and exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.datasource import EqualTo

from broker.cli import main, run_job
from pipelines.lake import append_arrow, scan_arrow
from pipelines.maintenance import maintain_table
from pipelines.sources.delta import FileGroup, load_delta, plan_scan
from pipelines.sql.engines import SqlError, open_engine
from pipelines.sql.server import EXIT_USAGE, ServerConfig, ServerError, serve
from pipelines.sql.views import find_tables, lake_table_paths
from pipelines.storage import Location

ENGINES = ("duckdb", "datafusion", "spark")
ORDERED = "ORDER BY commitlog_offset"
QUERIES = {  # each ordered completely: equal tables, row for row
    "every message column": f"SELECT * FROM messages {ORDERED}",
    "every consume_queue column": "SELECT * FROM consume_queue ORDER BY topic, queue_id, queue_offset",
    "count per topic": ("SELECT topic, COUNT(*) AS n, MAX(store_time) AS last FROM messages "
                        "GROUP BY topic ORDER BY topic"),
    "filter on partition and stats": ("SELECT commitlog_offset, topic, keys, properties FROM messages "
                                      "WHERE broker_name = 'broker-a' AND commitlog_offset BETWEEN 100000 AND 400000 "
                                      f"{ORDERED}"),
    "join": ("SELECT m.commitlog_offset, c.queue_offset FROM messages m JOIN consume_queue c "
             "ON m.broker_name = c.broker_name AND m.commitlog_offset = c.commitlog_offset "
             f"WHERE m.topic LIKE 'Topic%' ORDER BY m.commitlog_offset"),
}


def storage_args(options: dict[str, str]) -> list[str]:
    return [arg for key, value in options.items() for arg in ("--storage-option", f"{key}={value}")]


@pytest.fixture(scope="module")
def local_lake(tmp_path_factory, golden_store, spark) -> Path:
    lake = tmp_path_factory.mktemp("sql_s3") / "lake"
    assert run_job("ingest_commitlog.py", ["--store", f"broker-a={golden_store}", "--lake", str(lake)]) == 0
    return lake


@pytest.fixture(scope="module")
def s3_lake(local_lake, s3_server) -> Location:
    uri = s3_server.upload_dir(local_lake, s3_server.new_bucket(), "lake")
    return Location.parse(uri, s3_server.options)


@pytest.fixture(scope="module")
def engines(local_lake, s3_lake, spark):
    """Each engine twice: over the local lake and over its S3 copy."""
    opened = {(name, where): open_engine(name, lake, **({"spark": spark} if name == "spark" else {}))
              for name in ENGINES for where, lake in (("local", local_lake), ("s3", s3_lake))}
    yield opened
    for engine in opened.values():
        engine.close()


def result_table(engine, sql: str) -> pa.Table:
    result = engine.execute(sql)
    return pa.Table.from_batches(list(result.batches), result.schema)


def sql_run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["sql", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_discovery_lists_the_same_tables(local_lake, s3_lake):
    local = find_tables(local_lake)
    remote = find_tables(s3_lake)
    assert list(remote) == list(local) and {"messages", "consume_queue", "ingest_runs"} <= set(remote)
    assert lake_table_paths(s3_lake)["messages"] == f"{s3_lake.uri}/messages"
    assert all(table.options == s3_lake.options for table in remote.values())  # the options go along


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("query", QUERIES)
def test_same_tables_from_s3_as_from_local(engines, engine, query):
    local = result_table(engines[engine, "local"], QUERIES[query])
    remote = result_table(engines[engine, "s3"], QUERIES[query])
    assert local.num_rows > 0
    assert remote.schema == local.schema
    assert remote.equals(local)


def test_spark_source_plans_on_the_driver_and_reads_s3_on_executors(spark, local_lake, s3_lake, s3_server):
    table = s3_lake.child("consume_queue")
    plan = plan_scan(table)
    assert plan.files and all(f.path.startswith(f"{table.uri}/broker_name=broker-a/") for f in plan.files)
    assert all(isinstance(p, FileGroup) and p.storage == table.options for p in plan.partitions)
    assert plan_scan(table, filters=[EqualTo(("broker_name",), "broker-x")]).files == []  # pruned from the log

    key = [(c, "ascending") for c in ("topic", "queue_id", "queue_offset")]
    df = load_delta(spark, table)
    assert df.toArrow().sort_by(key).equals(scan_arrow(local_lake, "consume_queue").sort_by(key))
    plan_text = df._jdf.queryExecution().toString()
    assert s3_server.options["AWS_SECRET_ACCESS_KEY"] not in plan_text  # Spark redacts the secret options


def test_engines_agree_on_s3(engines):
    sql = "SELECT topic, COUNT(*) AS n FROM messages GROUP BY topic ORDER BY topic"
    answers = [result_table(engines[name, "s3"], sql).to_pylist() for name in ENGINES]
    assert answers[0] == answers[1] == answers[2] and sum(r["n"] for r in answers[0]) == 2001


@pytest.mark.parametrize("engine", ENGINES)
def test_saved_query_on_s3_with_storage_options(engine, local_lake, s3_lake, s3_server, capsys, spark):
    query = ["--engine", engine, "--format", "csv", "--saved", "message_by_key", "--param", "key=order-16"]
    code, local_out, err = sql_run(["--lake", str(local_lake), *query], capsys)
    assert code == 0, err
    assert local_out.count("\n") > 1  # a header and at least one row
    code, remote_out, err = sql_run(["--lake", s3_lake.uri, *storage_args(s3_server.options), *query], capsys)
    assert (code, err) == (0, "")
    assert remote_out == local_out


def test_storage_options_from_the_environment(local_lake, s3_lake, s3_server, capsys, monkeypatch):
    for key, value in s3_server.options.items():
        monkeypatch.setenv(key, value)
    sql = ["--format", "json", "SELECT topic, COUNT(*) AS n FROM messages GROUP BY topic ORDER BY topic"]
    code, remote_out, err = sql_run(["--lake", s3_lake.uri, *sql], capsys)
    assert (code, err) == (0, "")
    code, local_out, _ = sql_run(["--lake", str(local_lake), *sql], capsys)
    assert remote_out == local_out
    # a --storage-option wins over the environment
    code, out, err = sql_run(["--lake", s3_lake.uri, "--storage-option", "AWS_ENDPOINT_URL=http://127.0.0.1:1", *sql],
                             capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: cannot list lake {s3_lake.uri}: ") and err.count("\n") == 1


def test_engines_see_commits_made_in_s3(local_lake, s3_server, tmp_path, spark):
    small = tmp_path / "lake"
    shutil.copytree(local_lake / "ingest_runs", small / "ingest_runs")
    lake = Location.parse(s3_server.upload_dir(small, s3_server.new_bucket(), "lake"), s3_server.options)
    opened = [open_engine(name, lake, **({"spark": spark} if name == "spark" else {})) for name in ENGINES]
    try:
        count = "SELECT COUNT(*) AS n FROM ingest_runs"
        assert [result_table(e, count).column("n").to_pylist() for e in opened] == [[1]] * 3
        table = lake.child("ingest_runs")
        rows = scan_arrow(lake, "ingest_runs")
        write_deltalake(table.delta_uri(), rows, mode="append", storage_options=table.delta_options())
        consume_queue = pa.table({"topic": ["t"], "n": pa.array([7], pa.int64())})
        write_deltalake(lake.child("consume_queue").delta_uri(), consume_queue, storage_options=lake.delta_options())
        for engine in opened:
            assert result_table(engine, count).column("n").to_pylist() == [2]
            assert result_table(engine, "SELECT topic, n FROM consume_queue").to_pylist() == [{"topic": "t", "n": 7}]
            assert set(engine.tables()) == {"consume_queue", "ingest_runs"}
    finally:
        for engine in opened:
            engine.close()


def _many_file_table(lake: Path, name: str, commits: int) -> pa.Table:
    rows = [pa.table({"broker_name": [f"broker-{'ab'[i % 2]}"], "n": pa.array([i], pa.int64())})
            for i in range(commits)]
    for i, row in enumerate(rows):
        append_arrow(lake, name, row, partition_by=["broker_name"], app_id="test", app_version=i + 1)
    return pa.concat_tables(rows).sort_by("n")


def _rows(lake: Location, name: str) -> pa.Table:
    return scan_arrow(lake, name, columns=["broker_name", "n"]).sort_by("n")


def _data_files(table: Location) -> set[str]:
    return {i.path for i in table.list(recursive=True) if i.base_name.endswith(".parquet") and "_delta_log" not in i.path}


def test_maintenance_on_s3_keeps_every_row(tmp_path, s3_server, capsys):
    local = tmp_path / "lake"
    expected = _many_file_table(local, "runs", commits=6)
    _many_file_table(local, "other", commits=3)
    (local / "_quality").mkdir()
    (local / "_quality" / "report.json").write_text("{}")
    uri = s3_server.upload_dir(local, s3_server.new_bucket(), "lake")
    lake = Location.parse(uri, s3_server.options)

    assert run_job("maintenance.py", ["--lake", uri, *storage_args(s3_server.options), "--retention-hours", "48"]) == 0
    out = capsys.readouterr().out
    assert "maintenance runs: files 6 -> 2, compacted 6 into 2, rows 6" in out
    assert "maintenance other: files 3 -> 2" in out and "maintenance: 2 table(s) done, files 9 -> 4" in out
    runs = lake.child("runs")
    assert _rows(lake, "runs").equals(expected)
    dt = DeltaTable(runs.delta_uri(), storage_options=runs.delta_options())
    assert dt.transaction_version("test") == 6  # the exactly-once marks survive compaction
    log = {info.base_name for info in runs.child("_delta_log").list()}
    assert f"{dt.version():020d}.checkpoint.parquet" in log

    # VACUUM deletes the compacted-away objects from the bucket (retention below the floor: test only)
    before = _data_files(runs)
    result = maintain_table(lake, "runs", retention_hours=0, enforce_min_retention=False, compact=False)
    assert result.error is None and len(result.vacuumed) == 6
    after = _data_files(runs)
    assert len(before) == 8 and len(after) == 2
    assert _rows(lake, "runs").equals(expected)


def test_missing_bucket_is_one_error_line(s3_server, capsys, spark):
    missing = "s3://no-such-bucket-rocketlake/lake"
    options = storage_args(s3_server.options)
    for engine in ENGINES:
        code, out, err = sql_run(["--lake", missing, *options, "--engine", engine, "SELECT 1"], capsys)
        assert (code, out) == (2, "")
        assert err == f"error: lake {missing} does not exist: there is no bucket s3://no-such-bucket-rocketlake\n"

    with pytest.raises(SystemExit) as exit_info:
        run_job("maintenance.py", ["--lake", missing, *options])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1] == (f"maintenance.py: error: lake {missing} does not exist: "
                                             "there is no bucket s3://no-such-bucket-rocketlake")

    with pytest.raises(ServerError) as server_error:  # before any JVM or port is touched
        serve(ServerConfig(lake=Location.parse(missing, s3_server.options)))
    assert server_error.value.code == EXIT_USAGE and "there is no bucket" in str(server_error.value)


def test_empty_prefix_and_unreachable_endpoint(s3_server, capsys):
    bucket = s3_server.new_bucket()
    code, out, err = sql_run(["--lake", f"s3://{bucket}/nothing", *storage_args(s3_server.options), "SELECT 1"],
                             capsys)
    assert (code, out) == (2, "")
    assert err == f"error: lake s3://{bucket}/nothing does not exist (nothing is stored under it)\n"

    unreachable = {**s3_server.options, "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}
    code, out, err = sql_run(["--lake", f"s3://{bucket}/lake", *storage_args(unreachable), "SELECT 1"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: cannot list lake s3://{bucket}/lake: ") and err.count("\n") == 1
    with pytest.raises(SqlError, match="cannot list lake"):
        open_engine("datafusion", Location.parse(f"s3://{bucket}/lake", unreachable))

    code, _, err = sql_run(["--lake", f"s3://{bucket}/lake", "--storage-option", "NOEQUALS", "SELECT 1"], capsys)
    assert code == 2 and err == "error: --storage-option 'NOEQUALS' is not KEY=VALUE\n"
