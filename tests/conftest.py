"""Shared fixtures: the golden Apache RocketMQ store lives in ../shared beside the repository."""

from __future__ import annotations

import gc
import gzip
import json
import os
import sys
from importlib import metadata
from pathlib import Path

import pytest


def _airflow_installed() -> bool:
    """Whether Airflow is installed (by its distribution: an import would find tests/airflow itself)."""
    try:
        metadata.version("apache-airflow")
        return True
    except metadata.PackageNotFoundError:
        return False


# tests/airflow need Airflow, which has its own virtualenv (`make test-airflow`); the project's
# .venv does not have it, so its suite leaves that folder out
collect_ignore = [] if _airflow_installed() else ["airflow"]

REPO_ROOT = Path(__file__).resolve().parents[1]
GOLDEN_ROOT = REPO_ROOT.parent / "shared" / "golden" / "rocketmq-4.9.8"


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(
            f"golden data missing: {path} not found. The tests read ../shared/golden beside the "
            "repository (as CI lays it out); clone the repo next to the shared/ folder.",
            pytrace=False,
        )
    return path


# Stores, dispatchers and clients a test opens sit in reference cycles, so their pipes and files are
# closed only by a full garbage collection, which is rare. Over the whole suite the test process
# passed 1,024 open descriptors, where select() refuses them: py4j's callback server thread (started
# late, by the first foreachBatch) died on it and a stream test hung for good. Past this many open
# descriptors a test's teardown collects.
FD_COLLECT_THRESHOLD = 256


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem) -> None:
    if len(os.listdir("/proc/self/fd")) > FD_COLLECT_THRESHOLD:
        gc.collect()


@pytest.fixture(autouse=True)
def _no_dispatcher_left_running():
    """Close the stores a test opened and left open, with their dispatcher processes running (see
    tests/store_harness.py); looked up only if a test imported the harness, so other tests pay
    nothing."""
    harness = sys.modules.get("tests.store_harness")
    before = harness.open_stores() if harness is not None else frozenset()
    yield
    harness = sys.modules.get("tests.store_harness")
    if harness is not None:
        harness.close_left_open(before)


@pytest.fixture(scope="session")
def golden_store() -> Path:
    """Apache RocketMQ 4.9.8's own store (read-only: copy it before damaging it)."""
    return _require(GOLDEN_ROOT / "store_a")


@pytest.fixture(scope="session")
def golden_expected() -> Path:
    return _require(GOLDEN_ROOT / "store_a_expected")


@pytest.fixture(scope="session")
def golden_records(golden_expected: Path) -> list[dict]:
    """What Apache's MessageDecoder read from every commitlog record, in offset order."""
    with gzip.open(golden_expected / "expected.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="session")
def golden_meta(golden_expected: Path) -> dict:
    return json.loads((golden_expected / "expected_meta.json").read_text())


def load_expected(golden_expected: Path, name: str) -> dict:
    return json.loads((golden_expected / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole run (UI off, 2 shuffle partitions, UTC)."""
    from pipelines.session import build_session

    session = build_session("rocketlake-tests", "local[2]", for_tests=True)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 HTTP server process on loopback for the whole run (see tests/s3_server.py)."""
    from tests.s3_server import start_s3_server, stop_s3_server

    server = start_s3_server()
    yield server
    stop_s3_server(server)


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory, golden_store, golden_records):
    """The remote-lake ingest tests' two stores (tests/remote_lakes.py), by broker name."""
    from tests.remote_lakes import make_stores

    return make_stores(tmp_path_factory.mktemp("stores"), golden_store, golden_records)


@pytest.fixture(scope="module")
def two_stores_lake(spark, two_stores, tmp_path_factory):
    """``two_stores`` ingested into a local lake: what a remote lake's tables must equal."""
    from pipelines.ingest import ingest
    from pipelines.job_args import StoreSpec
    from tests.remote_lakes import SPLIT_BYTES

    lake = tmp_path_factory.mktemp("local-lake")
    ingest(spark, [StoreSpec(name, str(path)) for name, path in two_stores.items()], str(lake), split_bytes=SPLIT_BYTES)
    return lake


@pytest.fixture(scope="session")
def azurite():
    """An Azurite (Azure Blob emulator) process on loopback for the whole run (see tests/azurite_server.py)."""
    from tests.azurite_server import start_azurite, stop_azurite

    server = start_azurite()
    yield server
    stop_azurite(server)


@pytest.fixture()
def failing_df(spark):
    """30 ids over 3 partitions whose task with id 25 raises ``ValueError("bad row 25")``: a write
    that fails in an executor, for the "a failed write leaves nothing" tests (local and S3 lakes)."""
    from pyspark.sql import functions as F

    @F.udf("long")
    def boom(x):
        if x == 25:
            raise ValueError("bad row 25")
        return x

    return spark.range(0, 30, 1, numPartitions=3).select(boom("id").alias("id"))
