"""Run the quality suites over the lake's Delta tables and keep what they found.

Layout under ``<lake>/_quality`` (local filesystem):

* ``gx/``: the file-backed Great Expectations project (``great_expectations.yml``, suites, validation
  definitions, checkpoints, and the validation result store GX keeps in ``gx/uncommitted``). The
  suites are rewritten from :mod:`pipelines.quality.suites` on every run: code is the definition.
* ``results/<run_id>/<table>.json``: the GX validation result of each table, as GX serialises it;
  ``results/<run_id>/summary.json``: per table its status, expectations evaluated and passed, and
  the failed ones with their critical flag (what the job's exit code is decided on).
* ``data_docs/index.html``: the Data Docs site (static HTML, every run's results, built locally).

How GX is used (1.x API, pyspark 4.2, offline):

* Spark DataFrame datasource (``context.data_sources.add_spark``), one dataframe asset and one
  whole-dataframe batch definition per table, one validation definition and one checkpoint per table
  (``rocketlake.<table>``): a checkpoint passes the same ``batch_parameters`` to all its
  validations, so one checkpoint cannot feed each table its own DataFrame. All tables of one run
  share a GX run name (our run id), so Data Docs group them. The checkpoints carry no
  ``UpdateDataDocsAction``: it re-renders the index page per checkpoint (about a quarter of a
  five-table run); the run instead builds this run's pages, the suites' pages and the index once, with
  ``context.build_data_docs(resource_identifiers=...)``, which is what that action calls.
* Each table is validated with ``result_format`` BOOLEAN_ONLY first (about 40% fewer Spark jobs: the
  per-expectation "fetch some unexpected values" job is skipped) and, only when something failed,
  again with SUMMARY on the same cached DataFrame, so failures come with unexpected counts and
  samples; passing expectations are recorded as passed without counts.
* The DataFrame is filtered to ``--broker`` if given, projected to the columns the suite reads and
  persisted by us (the datasource's own ``persist`` is off) then unpersisted after the table: the
  ``messages`` bodies never go into the cache, and a run over every table does not keep them all
  cached.
* Offline: analytics are disabled (``GX_ANALYTICS_ENABLED=false`` in the environment and
  ``analytics_enabled: false`` in the project config; GX 1.24 has no sender left, this keeps it so),
  the context is ``mode="file"`` (never the Cloud context, whatever ``GX_CLOUD_*`` variables say),
  progress bars are off, and the only Data Docs site is a local ``TupleFilesystemStoreBackend``.
  Nothing in the job opens a connection. The HTML is another matter, for the browser that opens it:
  GX's page header loads GX's logo from S3 with the context id appended, which
  :func:`localise_data_docs` points at the site's own copy; the pages also link Bootstrap, jQuery,
  bootstrap-table, Font Awesome and Vega from public CDNs (GX ships no local copy), so offline they
  render unstyled and the index's run table (drawn by bootstrap-table) stays empty. The validation
  pages are plain HTML: ``summary.json`` names each table's page (``data_docs_page``).
* ``UnexpectedRowsExpectation`` on Spark registers the batch as the temp view ``tmp_view`` in the
  session (GX's fixed name): do not run two validations in one session at the same time.

A table that does not exist yet in the lake (report tables before their job ran) is skipped with a
log line and reported as ``skipped``. A table whose validation itself fails (unreadable table, GX
error) is reported as ``error`` and counts as a critical failure.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from pipelines.storage import Location
from pipelines.quality.suites import (
    ALL_TABLES,
    DEFAULT_SKEW_MS,
    build_suite,
    expectation_label,
    is_critical,
    suite_columns,
)

log = logging.getLogger(__name__)

QUALITY_DIR = "_quality"
GX_DIR = "gx"              # created by GX inside QUALITY_DIR (the project root)
RESULTS_DIR = "results"
DATA_DOCS_DIR = "data_docs"
SUMMARY_FILE = "summary.json"
SITE_NAME = "rocketlake"
DATASOURCE_NAME = "rocketlake_lake"
BATCH_DEFINITION_NAME = "whole_table"
CHECKPOINT_PREFIX = "rocketlake."
# Two passes: every table once with BOOLEAN_ONLY (pass/fail per expectation: the aggregate metrics,
# bundled into few Spark jobs); a table with a failure again with SUMMARY (unexpected counts and a
# sample of values: one more job per expectation, which on a clean table would only scan for nothing)
QUICK_RESULT_FORMAT = "BOOLEAN_ONLY"
DETAIL_RESULT_FORMAT = "SUMMARY"

PASSED, WARNING, FAILED, SKIPPED, ERROR = "passed", "warning", "failed", "skipped", "error"

# the site's files sit beside gx/, not in gx/uncommitted: relative to the GX root so a moved lake keeps working
_SITE_CONFIG: dict[str, Any] = {
    "class_name": "SiteBuilder",
    "show_how_to_buttons": False,
    "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": f"../{DATA_DOCS_DIR}/"},
    "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
}


@dataclass
class ExpectationFailure:
    """One failed expectation of a table (failed = unmet, or GX could not evaluate it)."""

    expectation: str                    # label: type(columns)
    expectation_type: str
    critical: bool
    unexpected_count: int | None = None
    observed_value: Any = None
    exception: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"expectation": self.expectation, "type": self.expectation_type, "critical": self.critical,
                "unexpected_count": self.unexpected_count, "observed_value": self.observed_value,
                "exception": self.exception}

    def text(self) -> str:
        detail = (f" [{self.unexpected_count} unexpected]" if self.unexpected_count
                  else f" [error: {self.exception}]" if self.exception else "")
        return self.expectation + detail


@dataclass
class TableResult:
    table: str
    status: str                          # passed | warning | failed | skipped | error
    evaluated: int = 0
    successful: int = 0
    failures: list[ExpectationFailure] = field(default_factory=list)
    result_file: str | None = None       # the GX result JSON
    reason: str | None = None            # why skipped / error
    seconds: float = 0.0
    data_docs_page: str | None = None    # this run's GX validation page of the table

    @property
    def success(self) -> bool | None:
        """True when no critical expectation failed; None when the table was not validated."""
        if self.status == SKIPPED:
            return None
        return self.status in (PASSED, WARNING)

    @property
    def critical_failures(self) -> list[ExpectationFailure]:
        return [f for f in self.failures if f.critical]

    @property
    def warnings(self) -> list[ExpectationFailure]:
        return [f for f in self.failures if not f.critical]

    def line(self) -> str:
        """``messages: 9/9 expectations passed`` / ``messages: FAILED (critical): ...``."""
        if self.status == SKIPPED:
            return f"{self.table}: skipped ({self.reason})"
        if self.status == ERROR:
            return f"{self.table}: ERROR: {self.reason}"
        text = f"{self.table}: {self.successful}/{self.evaluated} expectations passed"
        if self.critical_failures:
            text = f"{self.table}: FAILED (critical): " + "; ".join(f.text() for f in self.critical_failures)
        if self.warnings:
            text += "; WARNING: " + "; ".join(f.text() for f in self.warnings)
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "success": self.success, "evaluated": self.evaluated,
                "successful": self.successful, "failed_expectations": [f.to_dict() for f in self.failures],
                "result_file": self.result_file, "data_docs_page": self.data_docs_page, "reason": self.reason,
                "seconds": round(self.seconds, 3)}


@dataclass
class QualitySummary:
    run_id: str
    lake: str
    started_at: datetime
    results_dir: str
    data_docs_index: str | None
    tables: list[TableResult]
    broker: str | None = None
    skew_ms: int = DEFAULT_SKEW_MS
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No critical failure and no table that could not be validated."""
        return all(t.status not in (FAILED, ERROR) for t in self.tables)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def table(self, name: str) -> TableResult:
        return next(t for t in self.tables if t.table == name)

    @property
    def warnings(self) -> list[tuple[str, ExpectationFailure]]:
        return [(t.table, f) for t in self.tables for f in t.warnings]

    @property
    def critical_failures(self) -> list[tuple[str, ExpectationFailure]]:
        return [(t.table, f) for t in self.tables for f in t.critical_failures]

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "lake": self.lake, "started_at": self.started_at.isoformat(),
                "broker": self.broker, "skew_ms": self.skew_ms, "success": self.ok, "exit_code": self.exit_code,
                "data_docs_index": self.data_docs_index, "seconds": round(self.seconds, 3),
                "tables": {t.table: t.to_dict() for t in self.tables}}

    def lines(self) -> list[str]:
        return [t.line() for t in self.tables]

    def verdict(self) -> str:
        """``OK``, ``OK with 2 warning(s)`` or ``FAILED: ...``: the run in a few words."""
        counts = {s: sum(t.status == s for t in self.tables) for s in (PASSED, WARNING, FAILED, SKIPPED, ERROR)}
        tables = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        if self.ok:
            head = f"OK with {len(self.warnings)} warning(s)" if self.warnings else "OK"
        else:
            head = f"FAILED: {len(self.critical_failures)} critical expectation(s) failed"
        return f"{head} (tables: {tables})"


# ---- the GX project ------------------------------------------------------------------------------------
def quality_dir(lake, results_dir: str | os.PathLike | None = None) -> Path:
    """``results_dir`` when given, else ``<lake>/_quality``: beside the tables (not a Delta table, so
    no reader lists it as one), so the results travel with the lake. GX's file context and Data Docs
    site are plain local files, so a lake behind a URI needs ``results_dir``."""
    if results_dir is not None:
        return Path(results_dir)
    location = Location.parse(lake)
    if not location.is_local:
        raise ValueError(f"quality results for the lake {location} need a local directory (--quality-dir): "
                         "GX's results and Data Docs are plain files")
    return Path(location.uri) / QUALITY_DIR


def data_docs_index(lake, results_dir: str | os.PathLike | None = None) -> Path:
    return quality_dir(lake, results_dir) / DATA_DOCS_DIR / "index.html"


def open_context(lake, results_dir: str | os.PathLike | None = None):
    """The file-backed GX context of the lake (``<lake>/_quality/gx``), created on first use and set
    up for offline use: analytics off, no progress bars, our local Data Docs site only."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    root = quality_dir(lake, results_dir)
    root.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=str(root))
    if context.config.analytics_enabled is not False:
        context.enable_analytics(False)  # saves the project config
    bars = context.variables.progress_bars  # a ProgressBarsConfig when set, a plain dict once read back
    if not isinstance(bars, dict):
        bars = {} if bars is None else {"globally": bars.globally, "metric_calculations": bars.metric_calculations}
    if bars.get("globally") is not False or bars.get("metric_calculations") is not False:
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        context.variables.save()
    sites = context.list_data_docs_sites()
    for name in [n for n in sites if n != SITE_NAME]:
        context.delete_data_docs_site(name)  # GX's default local_site under gx/uncommitted
    if SITE_NAME not in context.list_data_docs_sites():
        context.add_data_docs_site(site_name=SITE_NAME, site_config=dict(_SITE_CONFIG))
    elif context.list_data_docs_sites()[SITE_NAME] != _SITE_CONFIG:
        context.update_data_docs_site(site_name=SITE_NAME, site_config=dict(_SITE_CONFIG))
    return context


def _checkpoint(context, table: str, suite):
    """Datasource/asset/batch definition (kept if present), suite, validation definition and
    checkpoint (replaced) of ``table``."""
    import great_expectations as gx

    try:
        source = context.data_sources.get(DATASOURCE_NAME)
    except (KeyError, ValueError):
        source = None
    if source is None:
        source = context.data_sources.add_spark(name=DATASOURCE_NAME, persist=False)
    try:
        asset = source.get_asset(table)
    except LookupError:
        asset = source.add_dataframe_asset(name=table)
    try:
        batch_definition = asset.get_batch_definition(BATCH_DEFINITION_NAME)
    except KeyError:
        batch_definition = asset.add_batch_definition_whole_dataframe(BATCH_DEFINITION_NAME)
    suite = context.suites.add_or_update(suite)
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=table, data=batch_definition, suite=suite))
    # no UpdateDataDocsAction: it renders the index page again for every table; the run builds the
    # site once at the end for all its results (see validate_lake)
    return context.checkpoints.add_or_update(gx.Checkpoint(
        name=CHECKPOINT_PREFIX + table, validation_definitions=[definition], result_format=QUICK_RESULT_FORMAT,
        actions=[]))


# ---- one table ----------------------------------------------------------------------------------------
def _exception_message(info: dict | None) -> str | None:
    """GX's error for an expectation it could not evaluate: either ``{"raised_exception": ...,
    "exception_message": ...}`` or, when a metric failed (a missing column), that shape keyed by
    metric id."""
    if not info:
        return None
    if "raised_exception" in info:
        return info.get("exception_message") if info.get("raised_exception") else None
    messages = [v.get("exception_message") for v in info.values() if isinstance(v, dict)]
    return "; ".join(dict.fromkeys(m for m in messages if m)) or None


def _failure(result) -> ExpectationFailure:
    config = result.expectation_config
    exception = _exception_message(result.exception_info)
    body = result.result or {}
    observed = body.get("observed_value")
    if config.type == "unexpected_rows_expectation":
        unexpected = observed if isinstance(observed, int) else None
        observed = None
    else:
        unexpected = body.get("unexpected_count")
    try:
        json.dumps(observed)
    except (TypeError, ValueError):
        observed = str(observed)
    return ExpectationFailure(expectation_label(config.type, dict(config.kwargs), config.description),
                              config.type, is_critical(config.meta), unexpected, observed, exception)


def _read(spark, lake: str, table: str, columns: list[str], broker: str | None):
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pipelines.lake import read_table

    df = read_table(spark, lake, table)
    if broker is not None and "broker_name" in df.columns:
        df = df.where(F.col("broker_name") == broker)
    present = [c for c in columns if c in df.columns]  # a missing one fails its expectation, not the read
    if present:
        df = df.select(*present)
    return df.persist(StorageLevel.MEMORY_AND_DISK)


def _validate_table(spark, context, lake: str, table: str, run_dir: Path, run_identifier, *,
                    broker: str | None = None, skew_ms: int = DEFAULT_SKEW_MS) -> tuple[TableResult, list]:
    """Validate one existing table; writes ``<run_dir>/<table>.json``. Also returns the GX
    identifiers of its validation result and suite, for the Data Docs build."""
    from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

    started = time.monotonic()
    suite = build_suite(table, skew_ms=skew_ms)
    checkpoint = _checkpoint(context, table, suite)
    df = _read(spark, lake, table, suite_columns(suite), broker)
    try:
        outcome = checkpoint.run(batch_parameters={"dataframe": df}, run_id=run_identifier)
        [(result_id, result)] = outcome.run_results.items()
        if not result.success:
            # the quick pass only says which expectations failed: again for counts and samples; GX
            # stores it under the same result id (same suite, run and batch), replacing the quick one
            [definition] = checkpoint.validation_definitions
            result = definition.run(batch_parameters={"dataframe": df}, result_format=DETAIL_RESULT_FORMAT,
                                    run_id=run_identifier, checkpoint_id=checkpoint.id)
    finally:
        df.unpersist()
    path = run_dir / f"{table}.json"
    path.write_text(json.dumps(result.to_json_dict(), indent=2, sort_keys=True, default=str) + "\n",
                    encoding="utf-8")
    failures = [_failure(r) for r in result.results if not r.success]
    stats = result.statistics
    status = FAILED if any(f.critical for f in failures) else WARNING if failures else PASSED
    return (TableResult(table, status, int(stats["evaluated_expectations"]), int(stats["successful_expectations"]),
                        failures, str(path), seconds=time.monotonic() - started),
            [result_id, ExpectationSuiteIdentifier(name=table)])


# GX's page header shows its logo from GX's S3 bucket with the context id appended (a beacon each time
# a page is opened); the same image ships in the site's static/images
_REMOTE_IMAGE = re.compile(r"https://great-expectations-web-assets\.s3\.[\w.-]+\.amazonaws\.com/([\w.-]+)(\?[^\"']*)?")


def localise_data_docs(site_dir: Path, *, since: float = 0.0) -> int:
    """Point the pages written since ``since`` (epoch s), and the site's style sheets, at the site's
    own copy of GX's images instead of GX's S3 bucket; returns the files changed. The
    Bootstrap/jQuery/Vega links stay (nothing local to replace them with): offline, pages render
    unstyled and the index's table, which those scripts draw, stays empty; the validation pages are
    plain HTML and readable."""
    images = site_dir / "static" / "images"
    changed = 0
    pages = [p for p in site_dir.rglob("*.html") if p.stat().st_mtime >= since - 1]
    for path in pages + sorted((site_dir / "static").rglob("*.css")):
        text = path.read_text(encoding="utf-8")
        local = os.path.relpath(images, path.parent).replace(os.sep, "/")

        def to_local(match: re.Match) -> str:
            name = match.group(1) if (images / match.group(1)).is_file() else "logo-long.png"
            return f"{local}/{name}"

        new_text = _REMOTE_IMAGE.sub(to_local, text)
        if new_text != text:
            path.write_text(new_text, encoding="utf-8")
            changed += 1
    return changed


# ---- the lake ----------------------------------------------------------------------------------------
def new_run_id(now: datetime) -> str:
    """Sortable and unique: ``20260101T120000Z-1a2b3c4d``."""
    return f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


def validate_lake(spark, lake: "str | os.PathLike | Location", *, tables: Iterable[str] | None = None,
                  broker: str | None = None, skew_ms: int = DEFAULT_SKEW_MS, context=None,
                  run_id: str | None = None, results_dir: str | os.PathLike | None = None) -> QualitySummary:
    """Run the suites of ``tables`` (default: all, in :data:`ALL_TABLES` order) against the lake.

    Writes the per-table result JSON and ``summary.json`` under ``<lake>/_quality/results/<run_id>``
    and updates the Data Docs site; returns the summary (``exit_code`` 1 on a critical failure).
    ``context`` lets a caller reuse one GX context (``open_context(lake)``) across runs;
    ``results_dir`` puts results and Data Docs there instead of ``<lake>/_quality`` (needed for a
    lake behind a URI).
    """
    from great_expectations.core.run_identifier import RunIdentifier

    from pipelines.lake import table_exists

    lake = Location.parse(lake)
    names = list(ALL_TABLES if tables is None else tables)
    unknown = [t for t in names if t not in ALL_TABLES]
    if unknown:
        raise ValueError(f"no quality suite for table(s) {', '.join(unknown)}; known: {', '.join(ALL_TABLES)}")
    started_at = datetime.now(timezone.utc)
    started = time.monotonic()
    run_id = run_id or new_run_id(started_at)
    context = context if context is not None else open_context(lake, results_dir)
    run_dir = quality_dir(lake, results_dir) / RESULTS_DIR / run_id
    run_dir.mkdir(parents=True, exist_ok=False)
    run_identifier = RunIdentifier(run_name=run_id, run_time=started_at)

    results: list[TableResult] = []
    docs_resources: list = []
    for table in names:
        if not table_exists(lake, table):
            log.info("quality %s: table does not exist in %s, skipped", table, lake)
            results.append(TableResult(table, SKIPPED, reason="table does not exist"))
            continue
        try:
            outcome, resources = _validate_table(spark, context, lake, table, run_dir, run_identifier,
                                                 broker=broker, skew_ms=skew_ms)
            docs_resources.extend(resources)
        except Exception as exc:  # one unreadable table must not hide the others' results
            log.exception("quality %s: validation could not run", table)
            outcome = TableResult(table, ERROR, reason=f"{type(exc).__name__}: {exc}")
        log_line = log.warning if outcome.status in (WARNING, FAILED, ERROR) else log.info
        log_line("quality %s", outcome.line())
        results.append(outcome)

    index = data_docs_index(lake, results_dir)
    try:
        # this run's pages and the index, once (what UpdateDataDocsAction does per checkpoint); with
        # nothing validated and no site yet, the whole (empty) site, so there is always one to open
        if docs_resources or not index.exists():
            context.build_data_docs(site_names=[SITE_NAME], resource_identifiers=docs_resources or None)
    except Exception:  # the results are kept either way: a rendering problem must not fail the run
        log.exception("quality: building the Data Docs site failed")
    localise_data_docs(index.parent, since=started_at.timestamp())
    for result in results:
        if result.status not in (SKIPPED, ERROR):
            pages = sorted((index.parent / "validations" / result.table / run_id).glob("*/*.html"))
            result.data_docs_page = str(pages[-1]) if pages else None
    summary = QualitySummary(run_id, str(lake), started_at, str(run_dir), str(index) if index.exists() else None,
                             results, broker, skew_ms, time.monotonic() - started)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary.to_dict(), indent=2, default=str) + "\n",
                                        encoding="utf-8")
    if summary.warnings:
        log.warning("quality run %s: %d non-critical expectation(s) failed: %s", run_id, len(summary.warnings),
                    "; ".join(f"{t}: {f.expectation}" for t, f in summary.warnings))
    return summary
