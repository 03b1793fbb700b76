"""
### rocketlake_ingest: broker stores into the lake, incrementally

Every `ROCKETLAKE_INGEST_EVERY_MINUTES` minutes (default 15) `jobs/ingest_commitlog.py` runs under
`spark-submit` over every configured store: what the stores gained since the last run goes to the
Delta tables `messages`, `consume_queue`, `index_entries`, `corrupt_records` and `ingest_runs`,
exactly once (a retried or overlapping run adds nothing twice: the mark is in each table's commit).

Then one **Asset per table the run updated** is emitted (`rocketlake.<table>`, extra: lake, Delta
version, each broker's mark before and after): a table whose ingest mark did not move is `skipped`
and emits nothing, so a run that found nothing new starts nothing downstream. `rocketlake_reports`
is scheduled on these Assets.

**Settings** (see `rocketlake_airflow/config.py`): Variables `rocketlake_stores`, `rocketlake_lake`
(Params `stores` / `lake` override them for one run), `rocketlake_home`, `rocketlake_python`; the
Spark master is the `spark_default` connection. `max_active_runs=1`: one writer per broker.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, TaskGroup, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

from rocketlake_airflow.assets import INGEST_ASSETS, INGEST_TABLES
from rocketlake_airflow.config import INGEST_EVERY, ConfigError, config_failure, resolve
from rocketlake_airflow.tasks import DEFAULT_ARGS, in_project_python, ingest_marks, spark_job


def split_args(split_bytes: int | None) -> list[str]:
    """``--split-bytes`` for a run that sets it; otherwise the job's own default applies (one place
    holds it: ``pipelines.sources.options.DEFAULT_SPLIT_BYTES``, which this file cannot import)."""
    return [] if split_bytes is None else ["--split-bytes", str(split_bytes)]


@dag(
    dag_id="rocketlake_ingest",
    schedule=INGEST_EVERY,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["rocketlake", "ingest", "spark"],
    doc_md=__doc__,
    params={
        "stores": Param(None, type=["null", "object", "array", "string"],
                        description="broker stores for this run, e.g. {\"broker-a\": \"/data/store\"} "
                                    "(default: Variable rocketlake_stores)"),
        "lake": Param(None, type=["null", "string"], description="lake directory (default: Variable rocketlake_lake)"),
        "split_bytes": Param(None, type=["null", "integer"], minimum=1024 * 1024,
                             description="commitlog bytes per Spark task (default: the ingest job's)"),
    },
)
def rocketlake_ingest():
    @task(multiple_outputs=True)
    def config() -> dict:
        """Resolve stores, lake, project and master; build the ingest's arguments."""
        params = get_current_context()["params"]
        try:
            s = resolve(params)
        except ConfigError as exc:
            raise config_failure(exc) from None
        print(f"rocketlake_ingest: stores {', '.join(s.stores)} -> lake {s.lake} (master {s.master})")
        return {**s.as_dict(), "brokers": s.brokers, "ingest_app": s.job("ingest_commitlog.py"),
                "ingest_args": [*s.store_args, "--lake", s.lake, "--master", s.master,
                                *split_args(params["split_bytes"])]}

    cfg = config()
    before = in_project_python("marks_before", cfg, ingest_marks, lake=cfg["lake"], tables=list(INGEST_TABLES),
                               brokers=cfg["brokers"])
    ingest = spark_job("ingest", cfg, hours=6)
    after = in_project_python("marks_after", cfg, ingest_marks, lake=cfg["lake"], tables=list(INGEST_TABLES),
                              brokers=cfg["brokers"])
    cfg >> before >> ingest >> after

    @task
    def publish(table: str, before: dict, after: dict, lake: str) -> dict:
        """Emit the table's Asset when the ingest moved its mark for any broker, else skip."""
        old, new = before.get(table) or {}, after.get(table) or {}
        moved = {b: [old.get("marks", {}).get(b), m] for b, m in (new.get("marks") or {}).items()
                 if m is not None and m != old.get("marks", {}).get(b)}
        if not moved:
            raise AirflowSkipException(f"{table}: nothing new (v{new.get('version')})")
        extra = {"lake": lake, "table": table, "version": new.get("version"),
                 "version_before": old.get("version"), "marks": moved}
        get_current_context()["outlet_events"][INGEST_ASSETS[table]].extra = extra
        print(f"{table}: v{old.get('version')} -> v{new.get('version')}, marks {moved}")
        return extra

    with TaskGroup("publish", tooltip="one Asset event per table the run updated"):
        for table, asset in INGEST_ASSETS.items():
            publish.override(task_id=table, outlets=[asset])(table, before.output, after.output, cfg["lake"])


rocketlake_ingest()
