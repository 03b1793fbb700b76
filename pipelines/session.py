"""SparkSession with the settings every rocketlake job and test needs.

Local runs bind to loopback and use the current interpreter for Python workers; every session uses
UTC and writes Parquet timestamps as microseconds (what Delta readers such as delta-rs and DuckDB
expect), and enables filter pushdown into Python data sources.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from pipelines.job_args import launch_conf

BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}

LOCAL_TEST_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "2g",
}


def prepare_local_environment() -> None:
    """Environment a local Spark needs on this kind of machine (no-ops when already set)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _master_given_outside() -> bool:
    """True under spark-submit (its JVM, which holds ``--master``, hands the driver a gateway port)
    or when ``PYSPARK_SUBMIT_ARGS`` names a master (``--master X`` or ``--conf spark.master=X``);
    then the builder must not override it."""
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    return ("PYSPARK_GATEWAY_PORT" in os.environ or "spark.master" in submit_args
            or "--master" in submit_args.split())


def build_session(app_name: str = "rocketlake", master: str | None = None,
                  extra_conf: dict[str, str] | None = None, *, for_tests: bool = False) -> SparkSession:
    """``getOrCreate`` a session; ``master`` None keeps what spark-submit set (else ``local[2]``)."""
    prepare_local_environment()
    builder = SparkSession.builder.appName(app_name)
    if master is None and not _master_given_outside():
        # Spark itself never reads SPARK_MASTER; honour it here (e.g. spark://127.0.0.1:7077)
        master = os.environ.get("SPARK_MASTER") or None
    if master is not None:
        builder = builder.master(master)
    elif not _master_given_outside():
        builder = builder.master("local[2]")
    # jobs/spark-submit.conf too, so a session started from Python (`rocketlake ingest`, tests) gets
    # the JVM options a spark-submit gets (under spark-submit they are already in force)
    conf = {**BASE_CONF, **launch_conf()}
    if for_tests:
        conf.update(LOCAL_TEST_CONF)
    conf.update(extra_conf or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def register_data_source(spark: SparkSession, source: type) -> None:
    """Register a Python data source with ``spark``; a source the session already sees is kept.

    A session made with ``newSession()`` sees the sources of the session it came from, and PySpark
    4.2.0 refuses to register one of those again (DATA_SOURCE_ALREADY_EXISTS) although the session
    that registered it may do so freely."""
    from pyspark.errors import AnalysisException

    try:
        spark.dataSource.register(source)
    except AnalysisException as exc:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
