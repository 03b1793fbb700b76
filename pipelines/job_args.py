"""What every rocketlake Spark job takes on its command line:
``--store [NAME=]PATH|URI ... --lake PATH|URI [--storage-option KEY=VALUE ...]``.

One definition of the store and lake arguments (broker name rules, the default name, storage
options, what makes a store location usable) for the ingest and report jobs, so ``spark-submit
jobs/<any>.py`` and ``rocketlake <any>`` read the same way. Every job calls
:func:`resolve_store_lake`, which turns them into :class:`StoreSpec` values and the lake's
:class:`~pipelines.storage.Location`, or exits with a one-line argparse error (exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping

import pyarrow.fs as pafs

from pipelines.storage import AZURE_SCHEMES, Location, StorageError, parse_storage_options

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_BROKER_NAME = "broker-a"
# Spark properties every spark-submit of a rocketlake job gets (the Makefile and the Airflow DAGs
# get them from this module's command line: `python -m pipelines.job_args [--json]`)
LAUNCH_CONF_FILE = Path(__file__).resolve().parents[1] / "jobs" / "spark-submit.conf"
_BROKER_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True)
class StoreSpec:
    """A broker's store: ``name`` (its broker name), ``path`` (absolute local path or URI, for
    messages) and ``location`` (the same with its storage options; what readers use).
    ``StoreSpec(name, path)`` works as before: the location is derived from the path."""

    name: str
    path: str
    location: Location = field(default=None, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        location = self.location if self.location is not None else Location.parse(self.path)
        object.__setattr__(self, "location", location)
        object.__setattr__(self, "path", location.uri)

    @classmethod
    def parse(cls, text: str, options: Mapping[str, str] | None = None) -> "StoreSpec":
        """``NAME=PATH`` or ``PATH`` (broker name ``broker-a``); PATH may be a URI, ``options`` are
        its storage options. Checks the syntax only (:func:`check_store` looks at the store)."""
        name, sep, path = text.partition("=")
        if not sep or "://" in name:
            name, path = DEFAULT_BROKER_NAME, text
        if not name or not path:
            raise ValueError(f"--store {text!r} is not [NAME=]PATH")
        if not _BROKER_NAME.fullmatch(name):
            raise ValueError(f"--store {text!r}: broker name {name!r} may only use letters, digits, '.', '_' and '-'")
        location = Location.parse(path, options)
        return cls(name, location.uri, location)


def check_store(spec: StoreSpec) -> None:
    """Raise ValueError (a :class:`StorageError` for storage trouble) unless the store's
    ``commitlog/`` lists at least one segment: a location without one is a wrong location (a typo,
    a missing prefix, other credentials), never an empty store with "nothing new"."""
    from pipelines.store_files import StoreFiles

    if spec.location.is_local and not (Path(spec.location.uri) / "commitlog").is_dir():
        raise ValueError(f"--store {spec.name}={spec.path}: {spec.path} has no commitlog/ directory")
    StoreFiles(spec.location).commitlog_segments()


def add_storage_option_arg(ap: argparse.ArgumentParser) -> None:
    """``--storage-option KEY=VALUE`` (repeatable), the one definition every CLI with a remote store
    or lake uses (read back with :func:`pipelines.storage.parse_storage_options`)."""
    ap.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                    help="storage option for remote stores and lakes, delta-rs names (AWS_ENDPOINT_URL, AWS_REGION, "
                         "AWS_ACCESS_KEY_ID, AWS_ALLOW_HTTP, …; repeatable); the same variables from the "
                         "environment apply too, under these")


def add_payload_schemas_arg(ap: argparse.ArgumentParser) -> None:
    """``--payload-schemas FILE`` of the ingest jobs (batch and streaming)."""
    ap.add_argument("--payload-schemas", metavar="FILE|URI", default=None,
                    help="payload declarations to use instead of the lake's own LAKE/_rocketlake/payload_schemas.toml "
                         "(topics whose bodies become typed payload_<topic> tables)")


def add_store_lake_args(ap: argparse.ArgumentParser, *, store_required: bool = True) -> None:
    """``--store`` (repeatable), ``--lake``, ``--storage-option`` (repeatable) and ``--master`` as
    every job has them."""
    ap.add_argument("--store", action="append", required=store_required, default=[], metavar="[NAME=]PATH",
                    help="a broker store (repeatable): a directory or a URI (s3://bucket/store, file://…); "
                         "NAME is the broker name (default broker-a)")
    ap.add_argument("--lake", required=True, metavar="LAKE",
                    help="the lake holding the Delta tables: a directory or a URI (s3://bucket/lake)")
    add_storage_option_arg(ap)
    ap.add_argument("--master", default=None, help="Spark master when not run by spark-submit (default local[2])")


def parse_stores(ap: argparse.ArgumentParser, values: list[str],
                 options: Mapping[str, str] | None = None) -> list[StoreSpec]:
    """The ``--store`` values as specs, each checked (:func:`check_store`); a bad one is an
    argparse error (exit 2, one line on stderr naming the store)."""
    specs = []
    for text in values:
        try:
            specs.append(StoreSpec.parse(text, options))
        except ValueError as exc:
            ap.error(str(exc))
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        ap.error(f"--store: broker name(s) {', '.join(dupes)} given more than once")
    for spec in specs:
        try:
            check_store(spec)
        except ValueError as exc:  # StorageError included: unreachable endpoint, no commitlog there
            ap.error(str(exc))
    return specs


def resolve_store_lake(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[StoreSpec], Location]:
    """``--store``/``--lake``/``--storage-option`` as checked specs and the lake's Location (the
    storage options apply to every store and to the lake, merged over the environment). Any
    problem is an argparse error: a malformed option, a store location without a commitlog, an
    endpoint that does not answer."""
    try:
        options = parse_storage_options(getattr(args, "storage_option", None) or [])
    except StorageError as exc:
        ap.error(str(exc))
    stores = parse_stores(ap, getattr(args, "store", None) or [], options)
    try:
        lake = Location.parse(args.lake, options)
        _check_lake_storage(lake)
    except StorageError as exc:
        ap.error(f"--lake {args.lake}: {exc}")
    except OSError as exc:
        ap.error(f"--lake {args.lake}: cannot reach it ({' '.join(str(exc).split())})")
    return stores, lake


# what an object store's first path level is called, by scheme
_BUCKET_WORD = {"s3": "bucket", "s3a": "bucket", "gs": "bucket", "gcs": "bucket",
                **dict.fromkeys(AZURE_SCHEMES, "container")}


def _check_lake_storage(lake: Location) -> None:
    """A lake need not exist yet, but its storage must answer and an object store's bucket must
    exist (delta-rs would otherwise fail at the first commit, after all the work)."""
    if lake.is_local:
        return
    fs, path = lake.filesystem()
    fs.get_file_info(path)  # raises OSError when the endpoint does not answer
    bucket = path.split("/", 1)[0]
    word = _BUCKET_WORD.get(lake.scheme)
    if word and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        raise StorageError(f"{word} {bucket!r} does not exist (or is not visible with these storage options)")


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
def job_session(app_name: str, master: str | None, warm: Iterable[str] = ()) -> Iterator["SparkSession"]:
    """The job's SparkSession; stopped at the end only if the job created it, so a caller that runs
    a job in-process (``rocketlake <job>`` from a test or a notebook) keeps its own session.

    ``warm``: the modules the job goes on to import, imported on a thread while the session starts.
    Why: the driver's imports (pyarrow, deltalake, the numba kernels loaded from their cache: ~1.5-3 s
    on this machine) and the JVM's SparkContext start (~2 s) are independent, and in sequence they are
    a fixed cost of every job. A failed import is left for the job's own import statement to raise."""
    warm = list(warm)
    warming = threading.Thread(target=_import_all, args=(warm,), name="rocketlake-imports", daemon=True) if warm else None
    if warming is not None:
        warming.start()
    from pyspark.sql import SparkSession

    from pipelines.session import build_session

    owned = SparkSession.getActiveSession() is None
    spark = build_session(app_name, master)
    if warming is not None:
        warming.join()
    try:
        yield spark
    finally:
        if owned:
            spark.stop()


def _import_all(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (raised again where the job imports it)
            log.debug("warm import of %s failed", name, exc_info=True)


def conf_file_settings(path: Path = LAUNCH_CONF_FILE) -> dict[str, str]:
    """The Spark properties of ``jobs/spark-submit.conf``: ``name value`` lines, ``#`` comments."""
    conf: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            conf[name] = value.strip()
    return conf


def launch_conf(path: Path = LAUNCH_CONF_FILE) -> dict[str, str]:
    """What every launcher passes: :func:`conf_file_settings`, plus Spark's class archive of
    this virtualenv when it has one (:mod:`pipelines.spark_cds`)."""
    from pipelines import spark_cds

    return {**conf_file_settings(path), **spark_cds.launch_conf()}


def launch_conf_args(path: Path = LAUNCH_CONF_FILE) -> list[str]:
    """:func:`launch_conf` as ``spark-submit`` arguments (``--conf name=value`` each)."""
    return [arg for name, value in launch_conf(path).items() for arg in ("--conf", f"{name}={value}")]


def main(argv: list[str] | None = None) -> int:
    """Print :func:`launch_conf_args` for a shell, quoted for ``eval`` (the Makefile's SUBMIT); JSON
    for other callers."""
    import json
    import shlex

    ap = argparse.ArgumentParser(prog="python -m pipelines.job_args",
                                 description="The Spark properties every rocketlake spark-submit passes.")
    ap.add_argument("--json", action="store_true", help="print them as a JSON object instead of --conf arguments")
    args = ap.parse_args(argv)
    if args.json:
        print(json.dumps(launch_conf()))
        return 0
    # shell-quoted: a JVM option list holds spaces, so a shell takes them with eval (the Makefile's SUBMIT)
    print(shlex.join(launch_conf_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
