"""``rocketlake sql-server``: the Thrift JDBC server over a lake built from the golden store,
queried with the wheel's beeline from another process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

import pyspark
from broker.server.launcher import free_port
from pipelines.lake import append_arrow, scan_arrow
from pipelines.sources.rocketmq import ConsumeQueueReader, RocketMQReader
from schemas.messages import MESSAGES_PARTITION_BY
from tests.conftest import REPO_ROOT, load_expected

SPARK_HOME = Path(pyspark.__file__).parent
BEELINE = SPARK_HOME / "bin" / "beeline"
START_TIMEOUT_S = 240


def _read_all(reader) -> pa.Table:
    return pa.Table.from_batches([b for p in reader.partitions() for b in reader.read(p)])


@pytest.fixture(scope="module")
def lake(golden_store, tmp_path_factory) -> Path:
    """messages and consume_queue of the golden store, decoded by the project's readers in this
    process and committed with delta-rs (no Spark here: the server is the only JVM)."""
    lake = tmp_path_factory.mktemp("sql_server_lake")
    options = {"path": str(golden_store), "brokerName": "broker-a"}
    append_arrow(lake, "messages", _read_all(RocketMQReader(options)), partition_by=MESSAGES_PARTITION_BY)
    append_arrow(lake, "consume_queue", _read_all(ConsumeQueueReader(options)), partition_by=["broker_name"])
    return lake


def _env() -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=str(SPARK_HOME), PYSPARK_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _rocketlake(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], env=_env(), capture_output=True,
                          text=True, timeout=120, **kwargs)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _beeline(port: int, sql: str) -> list[str]:
    result = subprocess.run([str(BEELINE), "-u", f"jdbc:hive2://127.0.0.1:{port}/", "--silent=true",
                             "--showHeader=false", "--outputformat=csv2", "-e", sql],
                            env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [line for line in result.stdout.splitlines() if line.strip()]


def test_beeline_queries_the_lake(lake, golden_expected, tmp_path):
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log_file:
        server = subprocess.Popen([sys.executable, "-m", "broker.cli", "sql-server", "--lake", str(lake),
                                   "--port", str(port)], cwd=tmp_path, env=_env(),
                                  stdout=log_file, stderr=subprocess.STDOUT)
    try:
        # ready when it says so: it prints the beeline line once its own check sees the port listen,
        # which can be a poll interval after the port opens
        deadline = time.monotonic() + START_TIMEOUT_S
        while f"beeline -u jdbc:hive2://127.0.0.1:{port}/" not in log_path.read_text():
            assert server.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "server did not say it was ready:\n" + log_path.read_text()[-3000:]
            time.sleep(0.5)
        assert _listening(port)

        queues = load_expected(golden_expected, "expected_queues.json")["queues"]
        per_topic = Counter({t: sum(len(q["entries"]) for q in qs.values()) for t, qs in queues.items()})
        rows = _beeline(port, "SELECT count(*) FROM messages;"
                              "SELECT topic, count(*) FROM consume_queue GROUP BY topic ORDER BY topic;"
                              "SELECT count(*) FROM global_temp.consume_queue WHERE broker_name = 'broker-a';")
        assert rows[0] == "2001"
        assert rows[1:-1] == [f"{t},{n}" for t, n in sorted(per_topic.items())]
        assert sum(per_topic.values()) == 1986 and rows[-1] == "1986"

        # a commit made while the server runs is visible to the next statement
        more = scan_arrow(lake, "consume_queue").slice(0, 5)
        i = more.schema.get_field_index("broker_name")
        more = more.set_column(i, more.schema.field(i), pa.array(["broker-z"] * 5, pa.string()))
        append_arrow(lake, "consume_queue", more, partition_by=["broker_name"])
        assert _beeline(port, "SELECT count(*) FROM consume_queue; "
                              "SELECT count(*) FROM consume_queue WHERE broker_name = 'broker-z';") == ["1991", "5"]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait()
    assert code == 0, log_path.read_text()[-3000:]
    assert not (tmp_path / "derby.log").exists() and not (tmp_path / "spark-warehouse").exists()


def test_lake_without_tables_exits_2(tmp_path):
    result = _rocketlake("sql-server", "--lake", str(tmp_path), "--port", str(free_port()))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: no Delta tables under {tmp_path} (expected <lake>/<table>/_delta_log/)"


def test_port_in_use_exits_1(lake):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _rocketlake("sql-server", "--lake", str(lake), "--port", str(port))
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: port {port} on 127.0.0.1 is in use"
    assert "Traceback" not in result.stderr
