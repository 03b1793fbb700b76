"""
### rocketlake_maintenance: compaction, checkpoints and VACUUM of every lake table

Daily (`ROCKETLAKE_MAINTENANCE_SCHEDULE`, default `@daily`) `jobs/maintenance.py` goes through every
Delta table of the lake with delta-rs (no Spark session): it **compacts** each partition's small
files (`consumer_lag` gains a file with every snapshot, the report tables with every run), writes a
**checkpoint** and drops expired log entries, then **VACUUMs** the files the log removed more than
`retention_hours` ago. The task log has one line per table: files before -> after, rows, files
vacuumed.

Retention that never breaks a running reader: 168 h (Delta's 7 days) by default, 24 h at the least,
and every rocketlake Spark task's `execution_timeout` is below that floor, so no job still reads a
snapshot whose files VACUUM deletes; a table asking for more (`delta.deletedFileRetentionDuration`)
gets more. Only files the log removed are deleted, never those of a write in progress.

**Settings**: Variable `rocketlake_lake` (Param `lake`), `rocketlake_retention_hours` (Param
`retention_hours`); Params `tables` (default: all), `dry_run` (nothing changed, what VACUUM would
delete is listed).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from rocketlake_airflow.config import (
    DEFAULT_RETENTION_HOURS,
    MAINTENANCE_SCHEDULE,
    MIN_RETENTION_HOURS,
    VAR_RETENTION_HOURS,
    ConfigError,
    config_failure,
    lookup,
    resolve,
)
from rocketlake_airflow.tasks import DEFAULT_ARGS, spark_job


@dag(
    dag_id="rocketlake_maintenance",
    schedule=MAINTENANCE_SCHEDULE,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["rocketlake", "maintenance", "delta"],
    doc_md=__doc__,
    params={
        "lake": Param(None, type=["null", "string"], description="lake directory (default: Variable rocketlake_lake)"),
        "tables": Param(None, type=["null", "array"], items={"type": "string"},
                        description="tables to maintain (default: every table of the lake)"),
        "retention_hours": Param(None, type=["null", "number"], minimum=MIN_RETENTION_HOURS,
                                 description=f"VACUUM retention (default: Variable rocketlake_retention_hours, "
                                             f"else {DEFAULT_RETENTION_HOURS}; at least {MIN_RETENTION_HOURS})"),
        "dry_run": Param(False, type="boolean", description="change nothing, list what VACUUM would delete"),
    },
)
def rocketlake_maintenance():
    @task(multiple_outputs=True)
    def config() -> dict:
        """Resolve lake, retention and tables; build the maintenance job's arguments."""
        params = get_current_context()["params"]
        try:
            s = resolve(params, need_stores=False)
            retention = float(lookup(params, "retention_hours", VAR_RETENTION_HOURS, DEFAULT_RETENTION_HOURS))
        except (ConfigError, ValueError) as exc:
            raise config_failure(exc) from None
        if retention < MIN_RETENTION_HOURS:
            raise config_failure(f"retention {retention:g} h is below the {MIN_RETENTION_HOURS} h floor")
        args = ["--lake", s.lake, "--master", s.master, "--retention-hours", f"{retention:g}"]
        if params.get("tables"):
            args += ["--tables", ",".join(params["tables"])]
        if params.get("dry_run"):
            args.append("--dry-run")
        print(f"rocketlake_maintenance: {s.lake}, retention {retention:g} h, tables {params.get('tables') or 'all'}")
        return {**s.as_dict(), "maintenance_app": s.job("maintenance.py"), "maintenance_args": args}

    cfg = config()
    cfg >> spark_job("maintenance", cfg, hours=12)


rocketlake_maintenance()
