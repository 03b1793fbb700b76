"""
### rocketlake_lag: consumer lag snapshots, status, alert

Every `ROCKETLAKE_LAG_EVERY_MINUTES` minutes (default 5) `jobs/consumer_lag.py` takes one snapshot
of every store's consumer offsets into `consumer_lag`, evaluates the last `window` snapshots of
every partition Burrow-style into `consumer_lag_status`, and prints the table.

The snapshot is recorded at the run's time (`run_after`), so a retried task adds nothing twice.
`lag_status` reads this run's group rows back; **`alert` fails** (no retry: the data would not
change) when a group is `ERR` (a partition STOPped, STALLed or REWound) or over its threshold
(`lag_messages` > `max_lag_messages`, `lag_seconds` > `max_lag_seconds`). Its
`on_failure_callback` is the alert hook: it logs one line per group; point it at a notifier
(e.g. `SmtpNotifier`, a Slack notifier) to page someone.

**Settings**: Variables `rocketlake_stores`, `rocketlake_lake` (Params `stores`, `lake`),
thresholds from Params `max_lag_messages` / `max_lag_seconds` (`{"group": N, "*": N}`), else
Variables `rocketlake_lag_max_messages` / `rocketlake_lag_max_seconds`; Params `window` (10) and
`stop_after_s` (600).
"""

from __future__ import annotations

import logging
from datetime import timedelta, timezone

import pendulum
from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from rocketlake_airflow.assets import LAG_ASSETS
from rocketlake_airflow.config import (
    LAG_EVERY,
    VAR_LAG_MAX_MESSAGES,
    VAR_LAG_MAX_SECONDS,
    ConfigError,
    config_failure,
    lookup,
    parse_thresholds,
    resolve,
)
from rocketlake_airflow.tasks import DEFAULT_ARGS, in_project_python, lag_groups, spark_job

log = logging.getLogger("rocketlake.lag")


def lag_alerts(groups: list[dict]) -> list[str]:
    """One line per group that is ERR or over a threshold."""
    out = []
    for g in groups:
        over = []
        if g.get("max_lag_messages") is not None and (g.get("lag_messages") or 0) > g["max_lag_messages"]:
            over.append(f"lag {g['lag_messages']} > {g['max_lag_messages']} messages")
        if g.get("max_lag_seconds") is not None and (g.get("lag_seconds") or 0) > g["max_lag_seconds"]:
            over.append(f"lag {g['lag_seconds']:g} s > {g['max_lag_seconds']:g} s")
        if g.get("status") == "ERR" or over:
            out.append(f"{g['broker_name']}/{g['consumer_group']}: {g['status']}"
                       + (f" ({'; '.join(over)})" if over else "") + f": {g.get('reason')}")
    return out


def log_lag_alert(context) -> None:
    """The alert hook (``on_failure_callback`` of ``alert``): replace or extend with a notifier."""
    log.error("rocketlake lag alert (%s, run %s): %s", context["dag"].dag_id, context["run_id"],
              context.get("exception"))


@dag(
    dag_id="rocketlake_lag",
    schedule=LAG_EVERY,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=30),
    default_args=DEFAULT_ARGS,
    tags=["rocketlake", "lag", "monitoring", "spark"],
    doc_md=__doc__,
    params={
        "stores": Param(None, type=["null", "object", "array", "string"],
                        description="broker stores (default: Variable rocketlake_stores)"),
        "lake": Param(None, type=["null", "string"], description="lake directory (default: Variable rocketlake_lake)"),
        "max_lag_messages": Param({}, type=["null", "object"],
                                  description="{\"group\": N, \"*\": N}: lag above N messages alerts "
                                              "(default: Variable rocketlake_lag_max_messages)"),
        "max_lag_seconds": Param({}, type=["null", "object"],
                                 description="{\"group\": S, \"*\": S}: lag above S seconds alerts "
                                             "(default: Variable rocketlake_lag_max_seconds)"),
        "window": Param(10, type="integer", minimum=1, description="snapshots per partition the status looks at"),
        "stop_after_s": Param(600, type="number", exclusiveMinimum=0,
                              description="offset unchanged this long with lag > 0 is STOP, shorter is STALL"),
    },
)
def rocketlake_lag():
    @task(multiple_outputs=True)
    def config() -> dict:
        """Resolve the settings; the snapshot time is the run's time (a retry records nothing twice)."""
        context = get_current_context()
        params = context["params"]
        try:
            s = resolve(params)
            msgs = parse_thresholds(lookup(params, "max_lag_messages", VAR_LAG_MAX_MESSAGES), "max_lag_messages", int)
            secs = parse_thresholds(lookup(params, "max_lag_seconds", VAR_LAG_MAX_SECONDS), "max_lag_seconds", float)
        except ConfigError as exc:
            raise config_failure(exc) from None
        snapshot_ts = context["dag_run"].run_after.astimezone(timezone.utc).isoformat()
        args = [*s.store_args, "--lake", s.lake, "--master", s.master, "--snapshot-ts", snapshot_ts,
                "--window", str(params["window"]), "--stop-after-s", f"{params['stop_after_s']:g}"]
        args += [a for t in msgs for a in ("--max-lag-messages", t)]
        args += [a for t in secs for a in ("--max-lag-seconds", t)]
        print(f"rocketlake_lag: snapshot at {snapshot_ts} of {', '.join(s.stores)}; thresholds {msgs + secs or 'none'}")
        return {**s.as_dict(), "snapshot_ts": snapshot_ts, "lag_snapshot_app": s.job("consumer_lag.py"),
                "lag_snapshot_args": args}

    cfg = config()
    snapshot = spark_job("lag_snapshot", cfg, outlets=LAG_ASSETS, hours=0.5)
    status = in_project_python("lag_status", cfg, lag_groups, lake=cfg["lake"], evaluated_at=cfg["snapshot_ts"])

    @task(on_failure_callback=log_lag_alert)
    def alert(groups: list) -> int:
        """Fail when a group is ERR or over its threshold (AirflowFailException: no retry)."""
        for g in groups:
            print(f"{g['broker_name']}/{g['consumer_group']}: {g['status']} lag={g['lag_messages']} "
                  f"lag_s={g['lag_seconds']} ({g['reason']})")
        alerts = lag_alerts(groups)
        if alerts:
            raise AirflowFailException(f"{len(alerts)} consumer group(s) need attention: " + " | ".join(alerts))
        return len(groups)

    cfg >> snapshot >> status
    alert(status.output)


rocketlake_lag()
