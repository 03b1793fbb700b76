"""What every rocketlake Spark job takes on its command line: ``--store [NAME=]PATH ... --lake LAKE_DIR``.

One definition of the store argument (broker name rules, the default name) for the ingest and
report jobs, so ``spark-submit jobs/<any>.py`` and ``rocketlake <any>`` read the same way.
"""

from __future__ import annotations

import argparse
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_BROKER_NAME = "broker-a"
_BROKER_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True)
class StoreSpec:
    name: str
    path: str

    @classmethod
    def parse(cls, text: str) -> "StoreSpec":
        """``NAME=PATH`` or ``PATH`` (broker name ``broker-a``)."""
        name, sep, path = text.partition("=")
        if not sep:
            name, path = DEFAULT_BROKER_NAME, text
        if not name or not path:
            raise ValueError(f"--store {text!r} is not [NAME=]PATH")
        if not _BROKER_NAME.fullmatch(name):
            raise ValueError(f"--store {text!r}: broker name {name!r} may only use letters, digits, '.', '_' and '-'")
        if "://" not in path and not (Path(path) / "commitlog").is_dir():
            raise ValueError(f"--store {text!r}: {path} has no commitlog/ directory")
        return cls(name, path)


def add_store_lake_args(ap: argparse.ArgumentParser, *, store_required: bool = True) -> None:
    """``--store`` (repeatable), ``--lake`` and ``--master`` as every job has them."""
    ap.add_argument("--store", action="append", required=store_required, default=[], metavar="[NAME=]PATH",
                    help="a broker store (repeatable); NAME is the broker name (default broker-a)")
    ap.add_argument("--lake", required=True, metavar="LAKE_DIR", help="directory holding the Delta tables")
    ap.add_argument("--master", default=None, help="Spark master when not run by spark-submit (default local[2])")


def parse_stores(ap: argparse.ArgumentParser, values: list[str]) -> list[StoreSpec]:
    """The ``--store`` values as specs; a bad one is an argparse error (exit 2, message on stderr)."""
    specs = []
    for text in values:
        try:
            specs.append(StoreSpec.parse(text))
        except ValueError as exc:
            ap.error(str(exc))
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        ap.error(f"--store: broker name(s) {', '.join(dupes)} given more than once")
    return specs


def add_no_ingest_arg(ap: argparse.ArgumentParser) -> None:
    """``--no-ingest`` for the report jobs that read the ingested tables."""
    ap.add_argument("--no-ingest", action="store_true",
                    help="use the Delta tables as they are, without ingesting what is new in the stores first")


def configure_job_logging() -> None:
    """INFO for the job's own progress; py4j's connection chatter stays out (spark-submit merges the
    Python driver's stderr into its stdout, so it would land between a job's results)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


@contextmanager
def job_session(app_name: str, master: str | None) -> Iterator["SparkSession"]:
    """The job's SparkSession; stopped at the end only if the job created it, so a caller that runs
    a job in-process (``rocketlake <job>`` from a test or a notebook) keeps its own session."""
    from pyspark.sql import SparkSession

    from pipelines.session import build_session

    owned = SparkSession.getActiveSession() is None
    spark = build_session(app_name, master)
    try:
        yield spark
    finally:
        if owned:
            spark.stop()
