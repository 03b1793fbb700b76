"""tests/airflow run in .venv-airflow (`make test-airflow`). Airflow reads AIRFLOW_HOME when it is
first imported and creates it: point it at a temporary directory before any test module imports
Airflow, so a test run never writes ~/airflow (each `airflow dags test` gets its own home anyway)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_HOME = tempfile.mkdtemp(prefix="rocketlake-airflow-home-")
os.environ["AIRFLOW_HOME"] = _HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"


@pytest.fixture(scope="session", autouse=True)
def _remove_airflow_home():
    yield
    shutil.rmtree(_HOME, ignore_errors=True)
