"""Task building blocks: a rocketlake job under ``spark-submit``, a lake read in the project's Python,
the retry rule for jobs whose failure a retry cannot fix, and the DAGs' shared defaults."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Callable, Iterable

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.python import ExternalPythonOperator
from airflow.sdk import RetryDecision, RetryPolicy

from rocketlake_airflow.config import MAX_JOB_HOURS, SPARK_CONN_ID

OWNER = "rocketlake"

DEFAULT_ARGS: dict[str, Any] = {
    "owner": OWNER,
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "execution_timeout": timedelta(minutes=30),
}

class SparkJobRetryPolicy(RetryPolicy):
    """Retry a failed ``spark-submit`` (a lost executor, a commit conflict, a broker down) unless the
    failure is one a retry reproduces: an exit code in ``fail_on_exit`` (e.g. 2, bad arguments) or
    job output matching a ``fail_on_output`` pattern (e.g. the validate job's ``FAILED`` verdict: the
    data is wrong, not the run). The provider's error carries the exit code and the output's tail."""

    def __init__(self, fail_on_exit: dict[int, str] | None = None,
                 fail_on_output: dict[str, str] | None = None) -> None:
        self.fail_on_exit = dict(fail_on_exit or {})
        self.fail_on_output = dict(fail_on_output or {})

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context=None) -> RetryDecision:
        text = str(exception)
        code = re.search(r"Error code is: (-?\d+)", text)
        if code and int(code.group(1)) in self.fail_on_exit:
            return RetryDecision.fail(f"exit code {code.group(1)}: {self.fail_on_exit[int(code.group(1))]}")
        for pattern, reason in self.fail_on_output.items():
            if re.search(pattern, text, re.MULTILINE):
                return RetryDecision.fail(reason)
        return RetryDecision.default()

    def serialize(self) -> dict[str, Any]:
        return {"fail_on_exit": {str(k): v for k, v in self.fail_on_exit.items()},
                "fail_on_output": self.fail_on_output}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> "SparkJobRetryPolicy":
        return cls({int(k): v for k, v in data.get("fail_on_exit", {}).items()}, data.get("fail_on_output"))


BAD_ARGUMENTS = {2: "bad arguments or input (argparse, selection, target): a retry fails the same way"}


def spark_job(task_id: str, cfg, *, app_key: str | None = None, args_key: str | None = None,
              outlets: Iterable = (), hours: float = 2, retry_policy: RetryPolicy | None = None,
              **kwargs) -> SparkSubmitOperator:
    """``spark-submit <home>/jobs/<file>.py <args>`` with the project's virtualenv, the application, its
    arguments and the Spark properties coming from the ``config`` task's XCom (``<task_id>_app``,
    ``<task_id>_args``, ``spark_conf``)."""
    if not 0 < hours < MAX_JOB_HOURS + 1e-9:
        raise ValueError(f"{task_id}: a job may run at most {MAX_JOB_HOURS} h (below the VACUUM retention floor)")
    return SparkSubmitOperator(
        task_id=task_id,
        conn_id=SPARK_CONN_ID,
        application=cfg[app_key or f"{task_id}_app"],
        application_args=cfg[args_key or f"{task_id}_args"],
        env_vars=cfg["spark_env"],
        conf=cfg["spark_conf"],
        name=f"rocketlake-{task_id}",
        outlets=list(outlets),
        execution_timeout=timedelta(hours=hours),
        retry_policy=retry_policy or SparkJobRetryPolicy(BAD_ARGUMENTS),
        **kwargs,
    )


class ProjectPythonOperator(ExternalPythonOperator):
    """An ``ExternalPythonOperator`` for the project's virtualenv, which has neither Airflow nor
    pendulum: the callable gets no Airflow context, so the probe for them (a subprocess that prints
    an ImportError traceback into the task log) is skipped."""

    def _iter_serializable_context_keys(self):
        yield from self.BASE_SERIALIZABLE_CONTEXT_KEYS


def in_project_python(task_id: str, cfg, callable_: Callable, **op_kwargs) -> ExternalPythonOperator:
    """``callable_(**op_kwargs)`` in the project's virtualenv (delta-rs, the lake helpers), its
    return value as XCom. The callable imports what it needs itself (its source is what runs)."""
    return ProjectPythonOperator(task_id=task_id, python=cfg["python"], python_callable=callable_,
                                 op_kwargs=op_kwargs, expect_airflow=False, serializer="pickle")


# ---- callables run by the project's Python (self-contained: their source is shipped) ---------------------
def ingest_marks(lake: str, tables: list, brokers: list) -> dict:
    """Per table: its Delta version and each broker's ingest mark (the commitlog offset recorded by
    the ingest's app transaction), None for a table that does not exist yet."""
    from pipelines.ingest import app_id_for
    from pipelines.lake import app_version, table_version

    out = {}
    for table in tables:
        version = table_version(lake, table)
        marks = {b: (app_version(lake, table, app_id_for(b)) if version is not None else None) for b in brokers}
        out[table] = {"version": version, "marks": marks}
    return out


def lag_groups(lake: str, evaluated_at: str) -> list:
    """The group rows of ``consumer_lag_status`` evaluated at ``evaluated_at`` (this run's snapshot)."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    from pipelines.lake import table_exists, table_path

    if not table_exists(lake, "consumer_lag_status"):
        return []
    when = dt.datetime.fromisoformat(evaluated_at.replace("Z", "+00:00")).astimezone(dt.timezone.utc)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    query = ("SELECT broker_name, consumer_group, status, reason, lag_messages, lag_seconds, max_lag_messages, "
             f"max_lag_seconds FROM s WHERE level = 'group' AND evaluated_at = CAST('{stamp}' AS TIMESTAMP) "
             "ORDER BY broker_name, consumer_group")
    # delta-rs's own query engine: no pyarrow dataset threads left behind at interpreter exit
    rows = QueryBuilder().register("s", DeltaTable(table_path(lake, "consumer_lag_status"))).execute(query).read_all()
    return pa.table(rows).to_pylist()


def replay_run_row(lake: str, run_id: str) -> dict:
    """The ``replay_runs`` row of ``run_id`` (JSON-friendly), {} when the table has none."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    from pipelines.lake import table_exists, table_path

    if not table_exists(lake, "replay_runs"):
        return {}
    literal = run_id.replace("'", "''")
    rows = pa.table(QueryBuilder().register("r", DeltaTable(table_path(lake, "replay_runs")))
                    .execute(f"SELECT * FROM r WHERE run_id = '{literal}'").read_all()).to_pylist()
    if not rows:
        return {}
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in rows[-1].items()}
