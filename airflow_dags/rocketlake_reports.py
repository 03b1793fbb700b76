"""
### rocketlake_reports: DLQ report, audit, data quality

Runs when `rocketlake_ingest` updated a table the reports read (Assets `rocketlake.messages`,
`rocketlake.consume_queue`, `rocketlake.index_entries`, `rocketlake.corrupt_records`: any of them),
or by hand. Each step is a job under `spark-submit`, on the lake as the ingest left it
(`--no-ingest`: the ingest DAG is the only writer of the ingested tables):

1. `dlq_report`: `jobs/dlq_report.py` recomputes `dlq_messages` and `dlq_summary` (Assets).
2. `audit`: `jobs/audit.py` recomputes `audit_findings` and `topic_daily_stats` (Assets).
   Findings are data, the task succeeds with them.
3. `validate`: `jobs/validate.py` runs the Great Expectations suites over every table (results and
   Data Docs under `<lake>/_quality`). **A critical expectation failure fails the run**, without
   retries (the data is wrong, not the run); warnings are logged and pass.

**Settings**: Variables `rocketlake_stores`, `rocketlake_lake` (Params `stores`, `lake`); Param
`skew_ms` (born/store clock skew the message suite allows).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from rocketlake_airflow.assets import AUDIT_ASSETS, DLQ_ASSETS, REPORT_INPUTS
from rocketlake_airflow.config import ConfigError, config_failure, resolve
from rocketlake_airflow.tasks import BAD_ARGUMENTS, DEFAULT_ARGS, SparkJobRetryPolicy, spark_job

VALIDATE_RETRY = SparkJobRetryPolicy(
    BAD_ARGUMENTS,
    {r"^validate \S+: FAILED": "a critical expectation failed: the data is wrong, a retry finds the same"})


@dag(
    dag_id="rocketlake_reports",
    schedule=REPORT_INPUTS,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(hours=18),
    default_args=DEFAULT_ARGS,
    tags=["rocketlake", "reports", "data-quality", "spark"],
    doc_md=__doc__,
    params={
        "stores": Param(None, type=["null", "object", "array", "string"],
                        description="broker stores (default: Variable rocketlake_stores)"),
        "lake": Param(None, type=["null", "string"], description="lake directory (default: Variable rocketlake_lake)"),
        "skew_ms": Param(None, type=["null", "integer"], minimum=0,
                         description="born/store clock skew allowed by the messages suite, ms (default: the job's)"),
    },
)
def rocketlake_reports():
    @task(multiple_outputs=True)
    def config() -> dict:
        """Resolve stores, lake, project and master; build the three jobs' arguments."""
        params = get_current_context()["params"]
        try:
            s = resolve(params)
        except ConfigError as exc:
            raise config_failure(exc) from None
        common = [*s.store_args, "--lake", s.lake, "--master", s.master]
        validate = ["--lake", s.lake, "--master", s.master]
        if params.get("skew_ms") is not None:
            validate += ["--skew-ms", str(params["skew_ms"])]
        print(f"rocketlake_reports: {', '.join(s.stores)} in {s.lake}")
        return {**s.as_dict(),
                "dlq_report_app": s.job("dlq_report.py"), "dlq_report_args": [*common, "--no-ingest"],
                "audit_app": s.job("audit.py"), "audit_args": [*common, "--no-ingest"],
                "validate_app": s.job("validate.py"), "validate_args": validate}

    cfg = config()
    dlq = spark_job("dlq_report", cfg, outlets=DLQ_ASSETS, hours=6)
    audit = spark_job("audit", cfg, outlets=AUDIT_ASSETS, hours=6)
    validate = spark_job("validate", cfg, hours=4, retry_policy=VALIDATE_RETRY)
    cfg >> dlq >> audit >> validate


rocketlake_reports()
