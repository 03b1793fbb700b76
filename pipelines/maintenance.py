"""Lake maintenance through delta-rs: compaction (OPTIMIZE), VACUUM, checkpoints.

Small appends leave small files: ``consumer_lag`` gains one file per broker and snapshot, the
report tables one per run, ``ingest_runs`` one per run. Readers pay per file (a Spark task, an open,
a footer read), so once a day every table is

1. **compacted**: delta-rs bins each partition's small files into files of about ``target_size``
   (the table's ``delta.targetFileSize``, else delta-rs's default) and commits the swap in one
   ``OPTIMIZE`` commit. Rows, partition values, file statistics and the app transactions that make
   the ingest exactly-once are unchanged; a partition with a single file is left alone, so a
   second run in a row commits nothing.
2. **checkpointed**: a Parquet checkpoint of the log at the new version, so opening the table reads
   one checkpoint plus a few JSON commits instead of every commit since the table was created,
   then expired log entries (older than ``delta.logRetentionDuration``, 30 days by default, and
   older than the checkpoint) are removed.
3. **vacuumed**: data files that the log *removed* (by compaction or by a report replacing its
   rows) more than ``retention_hours`` ago are deleted. Files the log never listed are not touched
   (no ``full`` vacuum), so the files of a write that has not committed yet are safe.

Retention that never breaks a running reader: a reader works on the snapshot it opened (a Spark
job lists the files when it starts, a replay reads the selection for as long as it sends, the SQL
server opens a snapshot per query); it fails if a file of that snapshot is deleted before it has
read it. So files stay ``retention_hours`` after the log removed them: the default is Delta's own
7 days (``delta.deletedFileRetentionDuration``; also a week of time travel), the floor is
:data:`MIN_RETENTION_HOURS` (24 h), longer than any rocketlake job may run (the Airflow DAGs give
every Spark task an ``execution_timeout`` below it), and a table that asks for more through its
``delta.deletedFileRetentionDuration`` gets what it asks for.

Remote lakes: ``lake_dir`` may be a URI (``s3://bucket/lake``) or a
:class:`pipelines.storage.Location` with storage options; every step is delta-rs talking to the
object store with those options (compaction reads and writes Parquet there, VACUUM deletes objects
there), and the table discovery lists through ``pyarrow.fs`` (:func:`pipelines.sql.views.find_tables`).

Concurrent writers: compaction only swaps files it read, so appends (ingest, lag snapshots) that
commit meanwhile do not conflict with it. A report replacing rows in the same files at the same
moment does: whichever commits second fails with a commit conflict and is retried by its scheduler;
data is never lost either way.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Iterable

from pipelines.storage import Location

log = logging.getLogger(__name__)

DEFAULT_RETENTION_HOURS = 7 * 24   # Delta's default delta.deletedFileRetentionDuration
MIN_RETENTION_HOURS = 24           # longer than any job runs (the DAGs' execution_timeout stays below)

_INTERVAL = re.compile(r"^\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)
_UNIT_HOURS = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0, "day": 24.0, "week": 168.0}


@dataclass
class TableMaintenance:
    """What one table went through (numbers from the Delta log, nothing is scanned)."""

    table: str
    version_before: int
    version_after: int = 0
    files_before: int = 0
    files_after: int = 0
    rows_before: int | None = None
    rows_after: int | None = None
    compacted_removed: int = 0       # files the OPTIMIZE commit removed ...
    compacted_added: int = 0         # ... and the files it wrote instead
    checkpoint_version: int | None = None
    vacuumed: list[str] = field(default_factory=list)
    retention_hours: float = DEFAULT_RETENTION_HOURS
    dry_run: bool = False
    seconds: float = 0.0
    error: str | None = None

    def line(self) -> str:
        if self.error:
            return f"{self.table}: FAILED: {self.error}"
        rows = ("?" if self.rows_before is None else str(self.rows_before)) + (
            "" if self.rows_after == self.rows_before else f" -> {self.rows_after}")
        parts = [f"files {self.files_before} -> {self.files_after}"]
        if self.dry_run:
            parts.append("dry run: nothing compacted")
        elif self.compacted_removed:
            parts.append(f"compacted {self.compacted_removed} into {self.compacted_added}")
        else:
            parts.append("nothing to compact")
        parts.append(f"rows {rows}")
        verb = "would vacuum" if self.dry_run else "vacuumed"
        parts.append(f"{verb} {len(self.vacuumed)} file(s) (retention {self.retention_hours:g} h)")
        if self.checkpoint_version is not None:
            parts.append(f"checkpoint at v{self.checkpoint_version}")
        return f"{self.table}: " + ", ".join(parts) + f", v{self.version_before} -> v{self.version_after} in {self.seconds:.1f} s"


def list_tables(lake_dir: str | os.PathLike | Location) -> list[str]:
    """The Delta tables directly under a lake (a local directory or a URI), sorted; [] when the lake
    does not exist (``_quality`` and other ``_``/``.`` directories are not tables). Raises
    ValueError when the lake's storage cannot be listed."""
    from pipelines.sql.views import LakeNotFound, find_tables

    try:
        return list(find_tables(lake_dir))
    except LakeNotFound:
        return []


def _open(lake_dir: str | os.PathLike | Location, name: str):
    from pipelines.lake import open_table, table_path

    dt = open_table(lake_dir, name)
    if dt is None:
        raise ValueError(f"no Delta table at {table_path(lake_dir, name)}")
    return dt


def interval_hours(text: str | None) -> float | None:
    """Hours of a Delta interval property (``interval 7 days``, ``168 hours``); None if unset or unreadable."""
    if not text:
        return None
    m = _INTERVAL.match(text)
    if not m:
        return None
    unit = m.group(2).lower().rstrip("s")
    if unit not in _UNIT_HOURS:
        return None
    return float(m.group(1)) * _UNIT_HOURS[unit]


def check_retention(retention_hours: float) -> float:
    """``retention_hours`` if it is safe for running readers, else ValueError."""
    if retention_hours != retention_hours or retention_hours < MIN_RETENTION_HOURS:  # NaN or too short
        raise ValueError(f"retention of {retention_hours:g} h is shorter than {MIN_RETENTION_HOURS} h: files a "
                         "running job still reads could be deleted (see pipelines.maintenance)")
    return float(retention_hours)


def _file_stats(dt) -> tuple[int, int | None]:
    """(active data files, rows per the log's statistics or None when a file has none)."""
    actions = dt.get_add_actions(flatten=True)
    files = actions.num_rows
    if files == 0:
        return 0, 0
    import pyarrow as pa

    records = pa.table(actions).column("num_records").to_pylist() if "num_records" in actions.column_names else [None]
    return files, (None if any(r is None for r in records) else int(sum(records)))


def maintain_table(lake_dir: str | os.PathLike | Location, name: str, *,
                   retention_hours: float = DEFAULT_RETENTION_HOURS,
                   compact: bool = True, vacuum: bool = True, checkpoint: bool = True,
                   target_size: int | None = None, dry_run: bool = False,
                   enforce_min_retention: bool = True) -> TableMaintenance:
    """Compact, checkpoint and vacuum ``<lake_dir>/<name>`` (see the module doc).

    ``dry_run``: nothing is written or deleted; ``vacuumed`` lists what would be deleted.
    ``enforce_min_retention=False`` lets a test vacuum with a retention below the floor (never
    from the job: files of a running reader's snapshot would go).
    """
    started = time.monotonic()
    if enforce_min_retention:
        check_retention(retention_hours)
    dt = _open(lake_dir, name)
    result = TableMaintenance(name, dt.version(), dry_run=dry_run)
    result.files_before, result.rows_before = _file_stats(dt)
    asked = interval_hours(dt.metadata().configuration.get("delta.deletedFileRetentionDuration"))
    result.retention_hours = max(retention_hours, asked or 0.0)  # a table asking for longer gets it

    if compact and not dry_run:
        metrics = dt.optimize.compact(target_size=target_size)
        result.compacted_removed = int(metrics.get("numFilesRemoved", 0))
        result.compacted_added = int(metrics.get("numFilesAdded", 0))
        dt = _open(lake_dir, name)
    if checkpoint and not dry_run:
        dt.create_checkpoint()
        dt.cleanup_metadata()
        result.checkpoint_version = dt.version()
    if vacuum:
        # our own floor replaces delta-rs's check against the 7-day default (which it applies even
        # to tables that never set the property); a table's explicit longer retention is kept above
        result.vacuumed = dt.vacuum(retention_hours=math.ceil(result.retention_hours), dry_run=dry_run,
                                    enforce_retention_duration=False)
        dt = _open(lake_dir, name)
    result.version_after = dt.version()
    result.files_after, result.rows_after = _file_stats(dt)
    result.seconds = time.monotonic() - started
    log.info("maintenance %s", result.line())
    return result


def maintain_lake(lake_dir: str | os.PathLike | Location, tables: Iterable[str] | None = None,
                  **options) -> list[TableMaintenance]:
    """:func:`maintain_table` for each of ``tables`` (default: every table of the lake). A table that
    fails is reported with its error and the others still run."""
    if options.get("enforce_min_retention", True):
        check_retention(options.get("retention_hours", DEFAULT_RETENTION_HOURS))  # before touching any table
    from pipelines.sql.views import one_line

    results = []
    for name in (list(tables) if tables is not None else list_tables(lake_dir)):
        try:
            results.append(maintain_table(lake_dir, name, **options))
        except Exception as exc:  # noqa: BLE001 - one table's failure must not stop the others
            log.exception("maintenance of %s failed", name)
            results.append(TableMaintenance(name, -1, error=f"{type(exc).__name__}: {one_line(exc)}"))
    return results
