"""``rocketlake sql`` on the lake ingested from Apache's golden store: DuckDB, DataFusion and Spark SQL
answer the same queries with the same values, which are what Apache's own decoder read; every output
format; -f files; errors (exit 2, the engine's message and position, no traceback); the shell; and
views that see commits made after they were opened."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from broker.cli import main, run_job
from pipelines.lake import append_arrow, scan_arrow
from pipelines.sql.engines import SqlError, open_engine
from tests.golden_fields import expected_row

ENGINES = ("duckdb", "datafusion", "spark")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# body length has no function common to the three engines (see queries/topic_bytes_per_day.sql)
BODY_LENGTH = {"duckdb": "octet_length(body)", "spark": "octet_length(body)",
               "datafusion": "length(encode(body, 'hex')) / 2"}


@pytest.fixture(scope="module")
def lake(tmp_path_factory, golden_store):
    lake = tmp_path_factory.mktemp("sql") / "lake"
    assert run_job("ingest_commitlog.py", ["--store", f"broker-a={golden_store}", "--lake", str(lake)]) == 0
    return lake


@pytest.fixture(scope="module")
def engines(lake, spark):
    opened = {"duckdb": open_engine("duckdb", lake), "datafusion": open_engine("datafusion", lake),
              "spark": open_engine("spark", lake, spark=spark)}
    yield opened
    for engine in opened.values():
        engine.close()


def rows(engine, sql: str) -> list[dict]:
    result = engine.execute(sql)
    table = pa.Table.from_batches(list(result.batches), result.schema)
    return table.to_pylist(maps_as_pydicts="lossy")


def ms(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, timezone.utc)


def sql_run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["sql", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---- the same answers from the three engines, equal to Apache's ----------------------------------------
def _topic_counts(golden):
    return [{"topic": t, "n": n} for t, n in sorted(Counter(e["topic"] for e in golden).items())]


def _body_bytes(golden):
    sums: dict[str, int] = defaultdict(int)
    for e in golden:
        sums[e["topic"]] += len(base64.b64decode(e["bodyBase64"]))
    return [{"topic": t, "body_bytes": b, "records": sum(1 for e in golden if e["topic"] == t)}
            for t, b in sorted(sums.items())]


def _join_per_queue(golden):
    per: dict[tuple, list[int]] = defaultdict(list)
    for e in golden:
        if e["inConsumeQueue"]:
            per[(e["cqTopic"], e["cqQueueId"])].append(e["cqLogicOffset"])
    return [{"topic": t, "queue_id": q, "units": len(v), "first_offset": min(v), "last_offset": max(v),
             "same_offset": sum(1 for e in golden if e["inConsumeQueue"] and (e["cqTopic"], e["cqQueueId"]) == (t, q)
                                and e["cqLogicOffset"] == e["queueOffset"])}
            for (t, q), v in sorted(per.items())]


def _map_access(golden):
    out = []
    for e in golden:
        props = e["properties"]
        if "userId" in props:
            out.append({"commitlog_offset": e["phyOffset"], "user_id": props["userId"],
                        "uniq": props.get("UNIQ_KEY"), "tags": props.get("TAGS")})
    return out


def _keys_contain(golden, key):
    return [{"commitlog_offset": r["commitlog_offset"], "keys": r["keys"], "first_key": r["keys"][0]}
            for r in map(expected_row, golden) if key in r["keys"]]


def _times(golden):
    return [{"commitlog_offset": e["phyOffset"], "store_time": ms(e["storeTimestamp"]),
             "born_time": ms(e["bornTimestamp"]), "store_date": ms(e["storeTimestamp"]).date(),
             "day": ms(e["storeTimestamp"]).date()} for e in golden[:150]]


def _one_message(golden):
    e = golden[2]
    r = expected_row(e)
    return [{"keys": r["keys"], "properties": r["properties"], "tags": r["tags"], "uniq_key": r["uniq_key"],
             "body": r["body"], "offset_msg_id": r["offset_msg_id"]}]


CROSS_ENGINE = {
    "count per topic": ("SELECT topic, COUNT(*) AS n FROM messages GROUP BY topic ORDER BY topic", _topic_counts),
    "body bytes per topic": ("SELECT topic, CAST(SUM({body_length}) AS BIGINT) AS body_bytes, COUNT(*) AS records "
                             "FROM messages GROUP BY topic ORDER BY topic", _body_bytes),
    "join with consume_queue": (
        "SELECT c.topic, c.queue_id, COUNT(*) AS units, MIN(c.queue_offset) AS first_offset, "
        "MAX(c.queue_offset) AS last_offset, "
        "CAST(SUM(CASE WHEN c.queue_offset = m.queue_offset THEN 1 ELSE 0 END) AS BIGINT) AS same_offset "
        "FROM messages m JOIN consume_queue c ON c.broker_name = m.broker_name "
        "AND c.commitlog_offset = m.commitlog_offset GROUP BY c.topic, c.queue_id ORDER BY c.topic, c.queue_id",
        _join_per_queue),
    "map access on properties": (
        "SELECT commitlog_offset, properties['userId'] AS user_id, properties['UNIQ_KEY'] AS uniq, "
        "properties['TAGS'] AS tags FROM messages WHERE properties['userId'] IS NOT NULL ORDER BY commitlog_offset",
        _map_access),
    "array keys": ("SELECT commitlog_offset, keys, {first_key} AS first_key FROM messages "
                   "WHERE array_contains(keys, 'order-7') ORDER BY commitlog_offset",
                   lambda g: _keys_contain(g, "order-7")),
    "timestamps": ("SELECT commitlog_offset, store_time, born_time, store_date, CAST(store_time AS DATE) AS day "
                   "FROM messages ORDER BY commitlog_offset LIMIT 150", _times),
    "one message": ("SELECT keys, properties, tags, uniq_key, body, offset_msg_id FROM messages "
                    "WHERE commitlog_offset = {offset}", _one_message),
}
FIRST_KEY = {"duckdb": "keys[1]", "datafusion": "keys[1]", "spark": "keys[0]"}  # Spark indexes from 0


@pytest.mark.parametrize("name", sorted(CROSS_ENGINE))
def test_engines_agree_with_apache(name, engines, golden_records):
    sql, expected = CROSS_ENGINE[name]
    answers = {}
    for engine_name, engine in engines.items():
        text = sql.format(body_length=BODY_LENGTH[engine_name], first_key=FIRST_KEY[engine_name],
                          offset=golden_records[2]["phyOffset"])
        answers[engine_name] = rows(engine, text)
    assert answers["duckdb"] == answers["datafusion"] == answers["spark"]
    assert answers["duckdb"] == expected(golden_records)


def test_table_sizes(engines):
    for engine in engines.values():
        assert rows(engine, "SELECT COUNT(*) AS n FROM messages") == [{"n": 2001}]
        assert rows(engine, "SELECT COUNT(*) AS n FROM consume_queue") == [{"n": 1986}]


# ---- CLI: formats ---------------------------------------------------------------------------------------
def test_table_format(lake, capsys, golden_records):
    code, out, err = sql_run(["--lake", str(lake), "SELECT topic, COUNT(*) AS n FROM messages GROUP BY topic "
                              "ORDER BY n DESC, topic"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["topic", "n"] and set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["TopicOrders", "636"]
    assert lines[-1] == "(8 rows)"


def test_table_format_caps_and_previews_binary(lake, capsys):
    code, out, _ = sql_run(["--lake", str(lake), "--max-rows", "5", "SELECT commitlog_offset, body, properties "
                            "FROM messages ORDER BY commitlog_offset"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2 + 5 + 1 and lines[-1].startswith("(first 5 rows shown, more not fetched")
    assert "(1919 B)" in lines[2]  # a 1919-byte body: a preview and its size
    assert all(len(line) < 250 for line in lines)


def test_csv_has_a_header_and_base64_bodies(lake, capsys, golden_records):
    code, out, _ = sql_run(["--lake", str(lake), "--format", "csv", "SELECT commitlog_offset, keys, properties, body, "
                            "store_time FROM messages ORDER BY commitlog_offset"], capsys)
    assert code == 0
    csv.field_size_limit(1 << 30)  # some golden bodies are larger than csv's default field limit
    records = list(csv.reader(io.StringIO(out)))
    assert records[0] == ["commitlog_offset", "keys", "properties", "body", "store_time"]
    assert len(records) == 1 + 2001
    for row, e in zip(records[1:], golden_records):
        want = expected_row(e)
        assert int(row[0]) == e["phyOffset"]
        assert json.loads(row[1]) == want["keys"] and json.loads(row[2]) == want["properties"]
        assert base64.b64decode(row[3]) == want["body"]
        assert row[4] == ms(e["storeTimestamp"]).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@pytest.mark.parametrize("engine", ENGINES)
def test_json_lines(engine, lake, capsys, golden_records, spark):
    code, out, err = sql_run(["--lake", str(lake), "--engine", engine, "--format", "json",
                              "SELECT commitlog_offset, topic, keys, properties, body, store_time, store_date, "
                              "body_crc_ok FROM messages ORDER BY commitlog_offset LIMIT 40"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 40
    for line, e in zip(lines, golden_records):
        want = expected_row(e)
        got = json.loads(line)
        assert list(got) == ["commitlog_offset", "topic", "keys", "properties", "body", "store_time", "store_date",
                             "body_crc_ok"]
        assert got["commitlog_offset"] == e["phyOffset"] and got["topic"] == e["topic"]
        assert got["keys"] == want["keys"] and got["properties"] == want["properties"]
        assert base64.b64decode(got["body"]) == want["body"]
        assert datetime.fromisoformat(got["store_time"].replace("Z", "+00:00")) == ms(e["storeTimestamp"])
        assert got["store_date"] == ms(e["storeTimestamp"]).date().isoformat()
        assert got["body_crc_ok"] is e["bodyCRCValid"]


def test_parquet_file_reads_back_equal(lake, capsys, tmp_path, engines, golden_records):
    out_file = tmp_path / "out.parquet"
    sql = ("SELECT commitlog_offset, topic, keys, properties, body, store_time FROM messages "
           "ORDER BY commitlog_offset")
    code, out, err = sql_run(["--lake", str(lake), "--format", "parquet", "--output", str(out_file), sql], capsys)
    assert code == 0, err
    assert out == ""
    back = pq.read_table(out_file).to_pylist(maps_as_pydicts="lossy")
    assert back == rows(engines["duckdb"], sql)
    assert [r["body"] for r in back] == [expected_row(e)["body"] for e in golden_records]
    # DataFusion's view types are written as plain string/binary
    code, _, err = sql_run(["--lake", str(lake), "--engine", "datafusion", "--format", "parquet", "--output",
                            str(tmp_path / "df.parquet"), sql], capsys)
    assert code == 0, err
    assert pq.read_table(tmp_path / "df.parquet").to_pylist(maps_as_pydicts="lossy") == back


def test_parquet_needs_output(lake, capsys):
    code, out, err = sql_run(["--lake", str(lake), "--format", "parquet", "SELECT 1"], capsys)
    assert code == 2 and "--format parquet needs --output FILE" in err


def test_file_of_statements(lake, capsys, tmp_path):
    script = tmp_path / "report.sql"
    script.write_text("-- two results; a ';' in a comment or 'a literal;' does not split\n"
                      "SELECT COUNT(*) AS messages, 'a;b' AS s FROM messages;\n\n"
                      "/* the queues */\n"
                      "SELECT COUNT(*) AS units FROM consume_queue\n", encoding="utf-8")
    code, out, err = sql_run(["--lake", str(lake), "-f", str(script), "--format", "csv"], capsys)
    assert code == 0, err
    assert out == "messages,s\n2001,a;b\n\nunits\n1986\n"


# ---- CLI: errors ----------------------------------------------------------------------------------------
BAD = {  # engine -> [(sql, words the message must contain)]
    "duckdb": [("SELEC topic FROM messages", ["Parser Error", "LINE 1:", "^"]),
               ("SELECT topic FROM nosuch", ["Catalog Error", "nosuch", "LINE 1:"]),
               ("SELECT foo FROM messages", ["Binder Error", '"foo"', "LINE 1:"]),
               ("SELECT CAST(topic AS INTEGER) FROM messages", ["Conversion Error"])],
    "datafusion": [("SELEC topic FROM messages", ["ParserError", "Line: 1, Column: 1"]),
                   ("SELECT topic FROM nosuch", ["nosuch", "not found"]),
                   ("SELECT foo FROM messages", ["No field named foo"])],
    "spark": [("SELEC topic FROM messages", ["PARSE_SYNTAX_ERROR", "line 1, pos 0"]),
              ("SELECT topic FROM nosuch", ["TABLE_OR_VIEW_NOT_FOUND", "`nosuch`", "== SQL (line 1, position 19) =="]),
              ("SELECT foo FROM messages", ["UNRESOLVED_COLUMN", "`foo`", "^^^"]),
              ("SELECT CAST(topic AS INT) FROM messages", ["CAST_INVALID_INPUT", "== SQL (line 1, position 8) =="])],
}


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_queries_exit_2_with_the_engines_message(engine, lake, capsys, spark):
    for sql, words in BAD[engine]:
        code, out, err = sql_run(["--lake", str(lake), "--engine", engine, sql], capsys)
        assert code == 2, (sql, out, err)
        assert err.startswith("error: ") and "Traceback" not in err + out, err
        for word in words:
            assert word in err, (sql, word, err)
        assert "SQLQueryContextLogger" not in err and "\tat org.apache" not in err


def test_error_in_a_file_names_statement_and_line(lake, capsys, tmp_path):
    script = tmp_path / "bad.sql"
    script.write_text("SELECT 1 AS one;\n-- the second one is wrong\nSELECT\n  nope\nFROM messages;\nSELECT 3;\n")
    code, out, err = sql_run(["--lake", str(lake), "-f", str(script)], capsys)
    assert code == 2
    assert out.startswith("one") and "(1 row)" in out  # the first result was printed
    assert err.startswith(f"error: {script}, statement 2 (line 3): Binder Error")
    assert "LINE 4:" in err  # the engine's line is the file's line


@pytest.mark.parametrize("engine", ENGINES)
def test_lake_without_tables(engine, tmp_path, capsys, spark):
    (tmp_path / "empty").mkdir()
    code, out, err = sql_run(["--lake", str(tmp_path / "empty"), "--engine", engine, "SELECT 1"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: no Delta tables under") and str(tmp_path / "empty") in err
    code, _, err = sql_run(["--lake", str(tmp_path / "missing"), "SELECT 1"], capsys)
    assert code == 2 and "does not exist" in err


def test_usage_errors(lake, capsys, tmp_path):
    assert sql_run(["SELECT 1"], capsys)[0] == 2
    code, _, err = sql_run(["--lake", str(lake), "-f", str(tmp_path / "none.sql")], capsys)
    assert code == 2 and "cannot read" in err
    code, _, err = sql_run(["--lake", str(lake), "--param", "key=1", "SELECT 1"], capsys)
    assert code == 2 and "--param key: not used by the query" in err
    code, _, err = sql_run(["--lake", str(lake), "SELECT '${who}'"], capsys)
    assert code == 2 and "--param who=VALUE" in err
    code, _, err = sql_run(["--lake", str(lake), "--saved", "no_such_query"], capsys)
    assert code == 2 and "no ready-made query" in err


def test_params_are_escaped_inside_literals(lake, capsys):
    code, out, err = sql_run(["--lake", str(lake), "--format", "csv", "--param", "v=it's", "SELECT '${v}' AS v"],
                             capsys)
    assert code == 0, err
    assert out == "v\nit's\n"


def test_real_process_no_traceback(lake):
    """A separate process: what a user sees (exit code, stderr) without pytest's capture."""
    bad = subprocess.run([sys.executable, "-m", "broker.cli", "sql", "--lake", str(lake), "SELECT * FROM nope"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "Catalog Error" in bad.stderr and "Traceback" not in bad.stderr
    good = subprocess.run([sys.executable, "-m", "broker.cli", "sql", "--lake", str(lake), "--format", "json",
                           "SELECT COUNT(*) AS n FROM messages"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert good.returncode == 0 and good.stdout == '{"n": 2001}\n', good.stderr


def test_list_queries(capsys):
    code, out, _ = sql_run(["--list-queries"], capsys)
    assert code == 0
    for name in ("message_by_key", "message_path", "lagging_groups", "dlq_volume", "topic_bytes_per_day",
                 "audit_findings_by_kind"):
        assert f"{name}  —  " in out


# ---- the shell --------------------------------------------------------------------------------------------
SHELL_INPUT = """\
.tables
.schema messages
SELECT topic,
       COUNT(*) AS n
FROM messages
GROUP BY topic
ORDER BY topic;
SELEC 1;
SELECT COUNT(*) AS units FROM consume_queue; SELECT 'x;y' AS s;
.format json
SELECT 2 AS two;
.bogus
.quit
SELECT 'never run';
"""


@pytest.mark.parametrize("engine", ["duckdb", "datafusion"])
def test_shell_with_piped_input(engine, lake, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(SHELL_INPUT))
    code, out, err = sql_run(["--lake", str(lake), "--engine", engine], capsys)
    assert code == 0
    assert "rocketlake>" not in out  # no prompts for piped input
    tables = out.split("column")[0].split()
    assert tables == ["consume_queue", "index_entries", "ingest_runs", "messages"] or \
        tables == ["consume_queue", "corrupt_records", "index_entries", "ingest_runs", "messages"]
    assert "body_crc_ok" in out and "stored BODYCRC equals the CRC recomputed" in out  # .schema with meanings
    assert "TopicOrders" in out and "(8 rows)" in out           # the statement spread over 5 lines
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and ("syntax error" in err or "ParserError" in err)  # SELEC and .bogus
    assert "unknown command .bogus" in err
    assert "units" in out and "1986" in out and "x;y" in out   # the good statements after the error
    assert out.rstrip().endswith('{"two": 2}')                 # .format json, and nothing after .quit
    assert "never run" not in out and "Traceback" not in err


def test_shell_in_a_real_process(lake):
    run = subprocess.run([sys.executable, "-m", "broker.cli", "sql", "--lake", str(lake)],
                         input=".tables\nSELECT COUNT(*)\n  AS n FROM messages;\nSELECT nope FROM messages;\n"
                               "SELECT 1 AS one\n", capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0
    assert "messages" in run.stdout and "2001" in run.stdout and "(1 row)" in run.stdout
    assert run.stdout.rstrip().endswith("(1 row)") and "one" in run.stdout  # a last statement without ';'
    assert "Binder Error" in run.stderr and "Traceback" not in run.stderr


# ---- views see new commits --------------------------------------------------------------------------------
def test_views_see_new_commits(lake, tmp_path, capsys, spark):
    small = tmp_path / "lake"
    sample = scan_arrow(lake, "messages").sort_by("commitlog_offset")
    append_arrow(small, "messages", sample.slice(0, 10), partition_by=["broker_name", "store_date"])
    opened = {"duckdb": open_engine("duckdb", small), "datafusion": open_engine("datafusion", small),
              "spark": open_engine("spark", small, spark=spark)}
    try:
        count = "SELECT COUNT(*) AS n, MAX(commitlog_offset) AS last FROM messages"
        for engine in opened.values():
            assert rows(engine, count) == [{"n": 10, "last": sample["commitlog_offset"][9].as_py()}]
        append_arrow(small, "messages", sample.slice(10, 5), partition_by=["broker_name", "store_date"])
        append_arrow(small, "consume_queue", scan_arrow(lake, "consume_queue").slice(0, 3))  # a new table
        for name, engine in opened.items():  # the same, long-lived engine objects (as in the shell)
            assert rows(engine, count) == [{"n": 15, "last": sample["commitlog_offset"][14].as_py()}], name
            assert rows(engine, "SELECT COUNT(*) AS n FROM consume_queue") == [{"n": 3}], name
            assert sorted(engine.tables()) == ["consume_queue", "messages"]
    finally:
        for engine in opened.values():
            engine.close()
    append_arrow(small, "messages", sample.slice(15, 1), partition_by=["broker_name", "store_date"])
    for engine in ENGINES:  # and a fresh rocketlake sql call
        code, out, err = sql_run(["--lake", str(small), "--engine", engine, "--format", "csv",
                                  "SELECT COUNT(*) AS n FROM messages"], capsys)
        assert (code, out) == (0, "n\n16\n"), err


def test_engine_errors_are_sql_errors(engines):
    for engine in engines.values():
        with pytest.raises(SqlError):
            rows(engine, "SELECT * FROM nowhere")
        # the golden store's only day, as a date literal
        assert rows(engine, "SELECT COUNT(*) AS n FROM messages WHERE store_date = DATE '2026-11-21'") == [{"n": 2001}]


@pytest.mark.parametrize("engine", ENGINES)
def test_ordered_results_stream_in_order(engine, lake, capsys, golden_records, spark):
    """All 2001 rows, ordered, through each engine's stream (Spark: partition files read in order)."""
    code, out, err = sql_run(["--lake", str(lake), "--engine", engine, "--format", "csv",
                              "SELECT commitlog_offset, store_size FROM messages ORDER BY commitlog_offset DESC"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "commitlog_offset,store_size"
    assert lines[1:] == [f"{e['phyOffset']},{e['storeSize']}" for e in reversed(golden_records)]


# ---- the pieces: statement splitting, parameters, value printing ------------------------------------------
def test_statement_splitting():
    from pipelines.sql.statements import pending, split_statements, statements_of

    text = ("-- a ; in a comment\nSELECT 'a;''b' AS x, \"c;d\" FROM t; /* ; /* nested ; */ */ SELECT $$e;f$$\n"
            ";\nSELECT 3")
    assert [(s.text, s.line) for s in statements_of(text)] == [
        ("SELECT 'a;''b' AS x, \"c;d\" FROM t", 2), ("SELECT $$e;f$$", 2), ("SELECT 3", 4)]
    done, rest = split_statements("SELECT 1; SELECT 'open;")
    assert [s.text for s in done] == ["SELECT 1"] and rest == " SELECT 'open;" and pending(rest)
    assert not pending("  -- just a comment\n") and pending("/* open")
    # Spark reads \' inside a literal as a quote; DuckDB does not
    assert [s.text for s in statements_of(r"SELECT 'a\';' ; SELECT 2", backslash_escapes=True)] == \
        [r"SELECT 'a\';'", "SELECT 2"]
    assert [s.text for s in statements_of(r"SELECT 'a\';' ; SELECT 2")] == [r"SELECT 'a\'", "' ; SELECT 2"]
    assert statements_of("SELECT 1").pop().padded() == "SELECT 1"
    assert statements_of("\n\n  SELECT 1").pop().padded() == "\n\nSELECT 1"


def test_parameters():
    from pipelines.sql.statements import ParamError, declared_params, resolve_params, substitute

    text = "-- @param key = order-1 | a key\n-- @param n | how many\n-- ${unused} in a comment\n" \
           "SELECT * FROM messages WHERE array_contains(keys, '${key}') LIMIT ${n}"
    assert [(p.name, p.default, p.description) for p in declared_params(text)] == \
        [("key", "order-1", "a key"), ("n", None, "how many")]
    with pytest.raises(ParamError, match="--param n=VALUE"):
        resolve_params(text, {})
    values = resolve_params(text, {"n": "5", "key": "O'Brien"})
    sql = substitute(text, values, escape_literal=lambda v: v.replace("'", "''"))
    assert sql.endswith("array_contains(keys, 'O''Brien') LIMIT 5") and "${unused}" in sql
    spark_sql = substitute(text, values, escape_literal=lambda v: v.replace("\\", "\\\\").replace("'", "\\'"),
                           backslash_escapes=True)
    assert spark_sql.endswith("array_contains(keys, 'O\\'Brien') LIMIT 5")


def test_value_printing():
    from decimal import Decimal

    from pipelines.sql.output import bytes_preview, cell_value, iso_timestamp, json_value, text_value, unique_names

    aware = datetime(2026, 11, 21, 5, 51, 18, 915000, tzinfo=timezone.utc)
    assert iso_timestamp(aware) == "2026-11-21T05:51:18.915Z"
    assert iso_timestamp(aware.astimezone(timezone(timedelta(hours=8)))) == "2026-11-21T05:51:18.915Z"
    assert iso_timestamp(datetime(2030, 1, 1, 0, 0, 0, 1)) == "2030-01-01T00:00:00.000001"  # no zone: no Z
    assert json_value({"k": [b"\x00\xff", Decimal("12"), Decimal("1.5"), float("nan")]}) == \
        {"k": ["AP8=", 12, 1.5, "NaN"]}
    assert text_value(None) == "" and text_value(True) == "true" and text_value([1, "a"]) == '[1,"a"]'
    assert bytes_preview(b"\x00\x01") == "0x0001" and bytes_preview("é".encode() * 40).endswith("… (80 B)")
    assert cell_value("line\nbreak\x1b") == "line.break." and cell_value(None) == "NULL"
    assert len(cell_value("x" * 500)) == 60
    assert unique_names(["topic", "topic", "n", "topic"]) == ["topic", "topic_2", "n", "topic_3"]
