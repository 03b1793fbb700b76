"""
### rocketlake_replay: send a selection of the lake's messages back to a cluster

**Manual trigger only** ("Trigger DAG" with parameters). One selection, exactly one of:

* `topic` + `since` + `until` (ISO-8601, UTC when no zone), optionally `broker`, `tag`, `key`;
* `where`: a Spark SQL predicate over the `messages` table;
* `dlq_group`: that group's `%DLQ%` messages, back to their original topics (`original_topic` narrows).

`dry_run` is **on by default**: the plan (messages, bytes, source queues, estimated time at `rate`)
is printed and a `DRY_RUN` row recorded in `replay_runs`, nothing is sent. Trigger again with
`dry_run` off to send.

Tasks: `plan` checks the parameters and shows the command; `replay` runs `jobs/replay.py` under
`spark-submit` (its log has the plan and the outcome); `replay_run` returns the run's
`replay_runs` row (XCom). The replay run id is the `run_id` parameter, or `airflow-<this DAG run's
id>`: a retry of `replay` reuses it, so an INCOMPLETE run (exit 1) is finished by the retry and
nothing that was sent is sent again; bad input (exit 2) is not retried. Every message's fate is in
`replay_ledger` under that run id.

**Settings**: Variable `rocketlake_lake` (Param `lake`), `rocketlake_replay_namesrv` (Param `namesrv`).
"""

from __future__ import annotations

import hashlib
import re

import pendulum
from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from rocketlake_airflow.assets import REPLAY_ASSETS
from rocketlake_airflow.config import VAR_REPLAY_NAMESRV, ConfigError, config_failure, lookup, resolve
from rocketlake_airflow.tasks import DEFAULT_ARGS, in_project_python, replay_run_row, spark_job

RUN_ID = r"^[A-Za-z0-9._-]{1,64}$"  # pipelines.replay.lineage.RUN_ID_PATTERN


def default_run_id(dag_run_id: str) -> str:
    """``airflow-<dag run id>`` in the replay's run id alphabet, at most 64 characters."""
    text = "airflow-" + re.sub(r"[^A-Za-z0-9._-]", "-", dag_run_id)
    if len(text) > 64:
        text = text[:55] + "-" + hashlib.sha1(dag_run_id.encode()).hexdigest()[:8]
    return text


def selection_args(params) -> list[str]:
    """The job's selection arguments; ConfigError unless exactly one selection form is complete."""
    forms = [name for name in ("topic", "where", "dlq_group") if params.get(name)]
    if len(forms) != 1:
        raise ConfigError("give exactly one selection: 'topic' (with 'since' and 'until'), 'where' or 'dlq_group'"
                          + (f" (got {', '.join(forms)})" if forms else ""))
    args: list[str] = []
    if forms == ["topic"]:
        if not (params.get("since") and params.get("until")):
            raise ConfigError("'topic' needs 'since' and 'until'")
        args += ["--topic", params["topic"]]
        for name in ("broker", "tag", "key"):
            if params.get(name):
                args += [f"--{name}", str(params[name])]
    elif forms == ["where"]:
        args += ["--where", params["where"]]
    else:
        args += ["--dlq", params["dlq_group"]]
        if params.get("original_topic"):
            args += ["--original-topic", params["original_topic"]]
    for name in ("since", "until"):
        if params.get(name):
            args += [f"--{name}", str(params[name])]
    return args


@dag(
    dag_id="rocketlake_replay",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args=DEFAULT_ARGS,
    tags=["rocketlake", "replay", "spark", "manual"],
    doc_md=__doc__,
    params={
        "topic": Param(None, type=["null", "string"], description="selection: records stored in this topic"),
        "since": Param(None, type=["null", "string"], description="store time >= this (ISO-8601; with topic, dlq_group)"),
        "until": Param(None, type=["null", "string"], description="store time < this (ISO-8601)"),
        "broker": Param(None, type=["null", "string"], description="with topic: only this source broker"),
        "tag": Param(None, type=["null", "string"], description="with topic: only messages with this tag"),
        "key": Param(None, type=["null", "string"], description="with topic: only messages with this key"),
        "where": Param(None, type=["null", "string"], description="selection: Spark SQL predicate over messages"),
        "dlq_group": Param(None, type=["null", "string"], description="selection: this group's %DLQ% messages"),
        "original_topic": Param(None, type=["null", "string"], description="with dlq_group: only this original topic"),
        "target_topic": Param(None, type=["null", "string"],
                              description="send everything here (default: the source topic; DLQ: the original)"),
        "namesrv": Param(None, type=["null", "string"], pattern=r"^[^\s;]+:\d+(;[^\s;]+:\d+)*$",
                         description="target name server(s) host:port[;host:port] "
                                     "(default: Variable rocketlake_replay_namesrv)"),
        "rate": Param(None, type=["null", "number"], exclusiveMinimum=0,
                      description="messages per second (default: unthrottled)"),
        "max_messages": Param(None, type=["null", "integer"], minimum=1, description="replay at most the first N"),
        "dry_run": Param(True, type="boolean", description="plan and record a DRY_RUN, send nothing"),
        "run_id": Param(None, type=["null", "string"], pattern=RUN_ID,
                        description="replay run id; an existing one finishes that run (default: airflow-<DAG run id>)"),
        "lake": Param(None, type=["null", "string"], description="lake directory (default: Variable rocketlake_lake)"),
    },
)
def rocketlake_replay():
    @task(multiple_outputs=True)
    def plan() -> dict:
        """Check the parameters and show what will run (the job prints the message-level plan)."""
        context = get_current_context()
        params = context["params"]
        try:
            s = resolve(params, need_stores=False)
            selection = selection_args(params)
            namesrv = lookup(params, "namesrv", VAR_REPLAY_NAMESRV)
            if not namesrv:
                raise ConfigError(f"no target: set the 'namesrv' parameter or Variable {VAR_REPLAY_NAMESRV}")
        except ConfigError as exc:
            raise config_failure(exc) from None
        run_id = params.get("run_id") or default_run_id(context["dag_run"].run_id)
        args = ["--lake", s.lake, "--namesrv", str(namesrv), "--master", s.master, *selection, "--run-id", run_id]
        if params.get("target_topic"):
            args += ["--target-topic", params["target_topic"]]
        if params.get("rate"):
            args += ["--rate", f"{params['rate']:g}"]
        if params.get("max_messages"):
            args += ["--max-messages", str(params["max_messages"])]
        if params.get("dry_run"):
            args.append("--dry-run")
        print(f"replay run {run_id} ({'DRY RUN: nothing is sent' if params.get('dry_run') else 'SENDS'}) "
              f"from {s.lake} to {namesrv}: {' '.join(selection)}"
              + (f" -> topic {params['target_topic']}" if params.get("target_topic") else ""))
        print("command: spark-submit jobs/replay.py " + " ".join(args))
        return {**s.as_dict(), "run_id": run_id, "replay_app": s.job("replay.py"), "replay_args": args}

    cfg = plan()
    replay = spark_job("replay", cfg, outlets=REPLAY_ASSETS, hours=20)
    row = in_project_python("replay_run", cfg, replay_run_row, lake=cfg["lake"], run_id=cfg["run_id"])

    @task
    def outcome(run: dict, replay_id: str) -> dict:
        """The ``replay_runs`` row of this run (its id links the Airflow run to the lake's records)."""
        if not run:
            raise AirflowFailException(f"replay_runs has no row for run {replay_id}")
        print(f"replay_runs[{replay_id}]: {run['status']}: planned {run['planned']}, sent {run['sent']}, "
              f"failed {run['failed']}, unknown {run['unknown']}, skipped {run['skipped']}; {run.get('message')}")
        return run

    cfg >> replay >> row
    outcome(row.output, cfg["run_id"])


rocketlake_replay()
