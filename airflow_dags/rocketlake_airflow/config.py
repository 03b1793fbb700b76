"""Settings of the rocketlake DAGs: a run's Params first, then Airflow Variables, then defaults.

They are resolved when a DAG runs, by its first task (``config``), never while the file is parsed
(a Variable lookup at parse time would hit the metadata database on every parse of the folder).
That task logs what it resolved and hands the Spark tasks their arguments through XCom.

=============================== ==================================================== ==========================
Airflow Variable                what                                                 default
=============================== ==================================================== ==========================
``rocketlake_stores``           broker stores: JSON ``{"broker-a": "/data/store"}``,  none: required by ingest,
                                or ``NAME=PATH`` items separated by commas            lag and reports
``rocketlake_lake``             the lake directory (absolute path)                    none: required
``rocketlake_home``             the rocketlake checkout on the worker (``jobs/``)     the checkout this DAG
                                                                                      folder belongs to
``rocketlake_python``           the project's Python (its virtualenv has PySpark,      ``<home>/.venv/bin/python``
                                delta-rs; ``spark-submit`` sits beside it)
``rocketlake_lag_max_messages`` lag thresholds, JSON ``{"group": N, "*": N}``         ``{}`` (none)
``rocketlake_lag_max_seconds``  the same in seconds of lag                            ``{}`` (none)
``rocketlake_replay_namesrv``   the replay's target name server(s) ``host:port``      none: required by replay
``rocketlake_retention_hours``  VACUUM retention of the maintenance DAG                168 (7 days, min 24)
=============================== ==================================================== ==========================

The Spark master is the Airflow connection ``spark_default`` (type Spark; host ``local[2]``,
``yarn``, ``spark://host:7077``, ``k8s://https://host``; extras such as ``deploy-mode``): the
provider passes it to ``spark-submit``, and the config task passes the same master to the job's
``--master`` (``pipelines.session`` would otherwise pick ``local[2]`` inside a ``spark-submit``).

Schedules are fixed when the file is parsed, from environment variables of the DAG processor:
``ROCKETLAKE_INGEST_EVERY_MINUTES`` (default 15), ``ROCKETLAKE_LAG_EVERY_MINUTES`` (5) and
``ROCKETLAKE_MAINTENANCE_SCHEDULE`` (``@daily``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

SPARK_CONN_ID = "spark_default"

VAR_STORES = "rocketlake_stores"
VAR_LAKE = "rocketlake_lake"
VAR_HOME = "rocketlake_home"
VAR_PYTHON = "rocketlake_python"
VAR_LAG_MAX_MESSAGES = "rocketlake_lag_max_messages"
VAR_LAG_MAX_SECONDS = "rocketlake_lag_max_seconds"
VAR_REPLAY_NAMESRV = "rocketlake_replay_namesrv"
VAR_RETENTION_HOURS = "rocketlake_retention_hours"

DEFAULT_RETENTION_HOURS = 168      # pipelines.maintenance.DEFAULT_RETENTION_HOURS
MIN_RETENTION_HOURS = 24           # pipelines.maintenance.MIN_RETENTION_HOURS
# Every Spark task's execution_timeout stays below MIN_RETENTION_HOURS: no job reads a snapshot
# longer than VACUUM keeps the files that snapshot needs.
MAX_JOB_HOURS = 20

_BROKER_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    value = int(text)  # a bad value is an import error of the DAG file, shown in the UI
    if value < 1:
        raise ValueError(f"{name}={value} must be >= 1")
    return value


INGEST_EVERY = timedelta(minutes=_env_int("ROCKETLAKE_INGEST_EVERY_MINUTES", 15))
LAG_EVERY = timedelta(minutes=_env_int("ROCKETLAKE_LAG_EVERY_MINUTES", 5))
MAINTENANCE_SCHEDULE = os.environ.get("ROCKETLAKE_MAINTENANCE_SCHEDULE", "").strip() or "@daily"


class ConfigError(ValueError):
    """A setting is missing or wrong: the run fails at once (a retry would read the same)."""


def default_home() -> Path:
    """The checkout this DAG folder sits in (``<home>/airflow_dags/rocketlake_airflow/config.py``)."""
    return Path(__file__).resolve().parents[2]


def _variable(key: str) -> str | None:
    from airflow.sdk import Variable

    value = Variable.get(key, default=None)
    return None if value is None or str(value).strip() == "" else str(value).strip()


def lookup(params: Mapping[str, Any] | None, param: str | None, variable: str | None, default: Any = None) -> Any:
    """The run's Param ``param`` when set (not None/empty), else Variable ``variable``, else ``default``."""
    if param and params is not None:
        value = params.get(param)
        if value not in (None, "", [], {}):
            return value
    if variable:
        value = _variable(variable)
        if value is not None:
            return value
    return default


def _json_or_text(value: Any) -> Any:
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"not valid JSON: {value!r} ({exc})") from None
    return value


def parse_stores(value: Any, source: str = VAR_STORES) -> list[str]:
    """``NAME=PATH`` items from a mapping, a list or a string (JSON, or comma/newline separated)."""
    value = _json_or_text(value)
    if isinstance(value, Mapping):
        items = [f"{name}={path}" for name, path in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    elif isinstance(value, str):
        items = [part.strip() for part in re.split(r"[,\n]", value) if part.strip()]
    else:
        raise ConfigError(f"{source}: expected a mapping, a list or a string, not {type(value).__name__}")
    if not items:
        raise ConfigError(f"{source}: no stores given")
    out, names = [], set()
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = "broker-a", item
        name, path = name.strip(), os.path.expanduser(path.strip())
        if not _BROKER_NAME.fullmatch(name):
            raise ConfigError(f"{source}: broker name {name!r} may only use letters, digits, '.', '_' and '-'")
        if name in names:
            raise ConfigError(f"{source}: broker {name!r} given twice")
        if "://" not in path:
            if not os.path.isabs(path):
                raise ConfigError(f"{source}: store path {path!r} of {name} must be absolute")
            if not os.path.isdir(os.path.join(path, "commitlog")):
                raise ConfigError(f"{source}: {path} (broker {name}) is not a RocketMQ store: no commitlog/ in it")
        names.add(name)
        out.append(f"{name}={path}")
    return out


def parse_thresholds(value: Any, source: str, kind: type) -> list[str]:
    """``GROUP=N`` arguments from ``{"group": N, "*": N}`` (or a JSON string of it)."""
    value = _json_or_text(value)
    if value in (None, "", {}):
        return []
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: expected a JSON object {{\"group\": limit, \"*\": limit}}, not {value!r}")
    out = []
    for group, limit in sorted(value.items()):
        try:
            number = kind(limit)
        except (TypeError, ValueError):
            raise ConfigError(f"{source}: limit {limit!r} of group {group!r} is not a number") from None
        if number < 0:
            raise ConfigError(f"{source}: limit of group {group!r} must be >= 0")
        out.append(f"{group}={number:g}" if kind is float else f"{group}={number}")
    return out


def spark_master(conn_id: str = SPARK_CONN_ID) -> str:
    """The master ``spark-submit`` gets from the connection (the provider's rule, simplified)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConfigError(f"no Airflow connection {conn_id!r}: add one of type Spark whose host is the master "
                          "(local[2], yarn, spark://host:7077, ...)") from None
    host = (conn.host or "").strip()
    if conn.conn_type == "spark" and host and ("://" in host or not conn.port):
        master = host
    else:
        master = f"{conn.conn_type}://{host}"
    return f"{master}:{conn.port}" if conn.port else master


@dataclass(frozen=True)
class Settings:
    home: str
    python: str
    lake: str
    stores: tuple[str, ...]
    master: str

    def job(self, file_name: str) -> str:
        return os.path.join(self.home, "jobs", file_name)

    @property
    def store_args(self) -> list[str]:
        return [arg for store in self.stores for arg in ("--store", store)]

    @property
    def brokers(self) -> list[str]:
        return [store.partition("=")[0] for store in self.stores]

    @property
    def spark_env(self) -> dict[str, str]:
        """Environment of ``spark-submit``: the project's virtualenv first on PATH (its
        ``spark-submit``), and the project's Python for the driver and the Python workers."""
        bin_dir = os.path.dirname(self.python)
        return {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", os.defpath),
                "PYSPARK_PYTHON": self.python, "PYSPARK_DRIVER_PYTHON": self.python}

    def spark_conf(self) -> dict[str, str]:
        """The Spark properties of every job's ``spark-submit``: job output without Spark's INFO
        chatter, and what every rocketlake launcher passes (``jobs/spark-submit.conf``'s JVM options,
        Spark's class archive of the project's virtualenv), asked of the project's Python
        (``python -m pipelines.job_args --json``): Airflow's Python cannot import the project."""
        try:
            out = subprocess.run([self.python, "-m", "pipelines.job_args", "--json"], cwd=self.home,
                                 capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"{self.python} -m pipelines.job_args: {exc}") from None
        if out.returncode != 0:
            raise ConfigError(f"{self.python} -m pipelines.job_args exited {out.returncode}: "
                              f"{out.stderr.strip()[-500:]}")
        return {"spark.ui.showConsoleProgress": "false", "spark.log.level": "WARN", **json.loads(out.stdout)}

    def as_dict(self) -> dict[str, Any]:
        return {"home": self.home, "python": self.python, "lake": self.lake, "stores": list(self.stores),
                "master": self.master, "spark_env": self.spark_env, "spark_conf": self.spark_conf()}


def resolve(params: Mapping[str, Any] | None, *, need_stores: bool = True, need_master: bool = True) -> Settings:
    """Every shared setting, checked (a missing store or lake fails here, in words, not in Spark)."""
    home = str(lookup(params, None, VAR_HOME, str(default_home())))
    if not os.path.isfile(os.path.join(home, "jobs", "ingest_commitlog.py")):
        raise ConfigError(f"{home} is not a rocketlake checkout (no jobs/ingest_commitlog.py): set Variable {VAR_HOME}")
    python = str(lookup(params, None, VAR_PYTHON, os.path.join(home, ".venv", "bin", "python")))
    if not (os.path.isabs(python) and os.access(python, os.X_OK)):
        raise ConfigError(f"project Python {python!r} is not an absolute path to an executable: run 'make venv' "
                          f"in {home} or set Variable {VAR_PYTHON}")
    lake = lookup(params, "lake", VAR_LAKE)
    if not lake:
        raise ConfigError(f"no lake: set Variable {VAR_LAKE} (or the run's 'lake' parameter)")
    lake = os.path.expanduser(str(lake))
    if "://" not in lake and not os.path.isabs(lake):
        raise ConfigError(f"lake {lake!r} must be an absolute path")
    stores: list[str] = []
    if need_stores:
        value = lookup(params, "stores", VAR_STORES)
        if value is None:
            raise ConfigError(f"no stores: set Variable {VAR_STORES} to {{\"broker-a\": \"/path/to/store\"}} "
                              "(or the run's 'stores' parameter)")
        stores = parse_stores(value)
    master = spark_master() if need_master else ""
    return Settings(home, python, lake, tuple(stores), master)


def config_failure(exc: Exception):
    """The exception that fails a config task without retries (the settings would not change)."""
    from airflow.sdk.exceptions import AirflowFailException

    return AirflowFailException(f"rocketlake settings: {exc}")
