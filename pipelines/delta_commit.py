"""Commit written data files to a Delta table: the one place that checks the app transaction.

The second half of a Delta write, shaped as delta-rs shapes its own writer (the first half,
writing the Parquet files, is :mod:`pipelines.delta_files`). :func:`commit_files` opens the table
with delta-rs against its URI and storage options, skips the commit when the table already
records ``app_version`` (or later) for ``app_id`` (the Delta ``txn`` action), and otherwise commits
every ``add`` in ONE transaction that also records ``(app_id, app_version)`` — creating the table
when it does not exist. Used by the Spark data-source writer (:mod:`pipelines.delta_writer`) and by
:mod:`pipelines.partition_writer`. The driver-side small-table writes of :mod:`pipelines.lake`
(``append_arrow``, ``replace_arrow``) stay on ``deltalake.write_deltalake``: it does the same
split internally and adds schema checks and predicate overwrites these tables need.

Concurrent commits on S3 (deltalake 1.6.6): delta-rs commits ``_delta_log/N.json`` with a
conditional put (``If-None-Match: *``; its S3 store defaults to ``conditional_put=etag``), so of
two writers racing for version N exactly one wins and the other re-reads the log, checks for
conflicts (a concurrent ``txn`` of the same appId is one) and retries at N+1. That is safe on AWS S3
(conditional writes since 2024), MinIO, Cloudflare R2 and the moto server of the tests, with no
locking provider: ``AWS_S3_LOCKING_PROVIDER=dynamodb`` is no longer supported by delta-rs 1.x
(ignored with an error log line), and ``AWS_S3_ALLOW_UNSAFE_RENAME=true`` is only for stores
without conditional writes, where a concurrent commit can overwrite another. Our default is to set
neither: one committing driver per table needs nothing more, and several are still safe. When the
unsafe option is given anyway a warning is logged. Either way every commit reads its version's log
entry back (one small read) and fails with ``CommitLostError`` unless the entry carries this job's
id: a lost commit is reported, never silent (the caller removes the job's files; the app version
was not recorded, so a rerun writes the data again, exactly once).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Mapping, Sequence

import pyarrow as pa

from pipelines.delta_files import AddInfo
from pipelines.storage import Location

log = logging.getLogger(__name__)

JOB_ID_KEY = "rocketlake.jobId"  # commitInfo key naming the write job of a commit
SCHEMA_EVOLUTION_KEY = "rocketlake.schemaEvolutionFor"  # commitInfo key of a schema-only commit before a job's
UNSAFE_RENAME_OPTION = "AWS_S3_ALLOW_UNSAFE_RENAME"
_TRUE = ("1", "true", "yes", "on")


class CommitLostError(RuntimeError):
    """The commit went through delta-rs, but the log entry of its version belongs to another writer."""


@dataclass(frozen=True)
class CommitOutcome:
    committed: bool
    skipped: bool              # app_id already at app_version or later: nothing committed
    version: int | None        # the commit's version (skipped: the table's current version)
    num_files: int
    num_rows: int
    reason: str | None = None


def open_delta(table: Location, *, missing_ok: bool = True):
    """``deltalake.DeltaTable`` of ``table`` (storage options applied); None when there is no
    Delta table there (``missing_ok=False``: delta-rs's ``TableNotFoundError`` instead)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(table.delta_uri(), storage_options=table.delta_options())
    except TableNotFoundError:
        if missing_ok:
            return None
        raise


def skip_reason(dt, app_id: str | None, app_version: int | None) -> str | None:
    """Why a write of ``(app_id, app_version)`` must not commit to ``dt`` (None: it may).
    The exactly-once rule: a version not greater than the recorded one is a replay."""
    if app_id is None or dt is None:
        return None
    seen = dt.transaction_version(app_id)
    if seen is None or seen < app_version:
        return None
    return f"appId {app_id!r} already at version {seen} >= {app_version}"


def commit_files(table: Location, files: Sequence[AddInfo], *, schema: pa.Schema, job_id: str,
                 partition_by: Sequence[str] = (), overwrite: bool = False,
                 app_id: str | None = None, app_version: int | None = None,
                 metadata: Mapping[str, str] | None = None) -> CommitOutcome:
    """Commit ``files`` (already written under ``table``) as ONE Delta transaction.

    ``overwrite``: the transaction also removes every current file. ``app_id``/``app_version``:
    skipped (``CommitOutcome.skipped``) when already recorded, else recorded with the data.
    ``metadata`` goes into the commit info beside ``rocketlake.jobId``. When ``schema`` adds
    nullable columns to an existing table's, the table's schema is evolved first
    (:func:`_evolve_schema`); otherwise ``schema`` only describes a new table. The caller owns the files:
    it deletes them when the outcome is ``skipped`` or this raises (then nothing was committed)."""
    from deltalake.schema import Schema as DeltaSchema
    from deltalake.transaction import (AddAction, CommitProperties, Transaction,
                                       create_table_with_add_actions)

    if (app_id is None) != (app_version is None):
        raise ValueError("app_id and app_version go together")
    _warn_if_unsafe(table)
    num_rows = sum(f.num_records for f in files)
    dt = open_delta(table)
    reason = skip_reason(dt, app_id, app_version)
    if reason is not None:
        return CommitOutcome(False, True, dt.version(), 0, 0, reason)
    if dt is not None and _evolve_schema(dt, table, schema, job_id):
        dt = open_delta(table, missing_ok=False)
    actions = [AddAction(path=f.path, size=f.size, partition_values=f.partition_values,
                         modification_time=f.modification_time, data_change=True, stats=f.stats)
               for f in files]
    props = CommitProperties(
        custom_metadata={**(metadata or {}), JOB_ID_KEY: job_id},
        app_transactions=[Transaction(app_id, int(app_version))] if app_id is not None else None)
    base = dt.version() if dt is not None else -1
    try:
        if dt is not None:
            dt.create_write_transaction(actions, "overwrite" if overwrite else "append", schema=schema,
                                        partition_by=list(partition_by) or None, commit_properties=props)
        else:
            create_table_with_add_actions(table.delta_uri(), DeltaSchema.from_arrow(schema), actions,
                                          mode="error", partition_by=list(partition_by) or None,
                                          storage_options=table.delta_options(), commit_properties=props)
    except Exception:
        # an error after the log entry was written (a lost response, a failing post-commit hook)
        # must not make the caller delete files a committed version refers to
        version = find_commit(table, base, job_id)
        if version is None:
            raise
        log.warning("%s: delta-rs reported an error, but version %d holds job %s: committed",
                    table, version, job_id)
    else:
        version = find_commit(table, base, job_id)
        if version is None:
            raise CommitLostError(f"{table}: the commit of job {job_id} is not in the Delta log after "
                                  f"version {base} (another writer overwrote it: does the store honour "
                                  f"conditional puts? see {__name__})")
    return CommitOutcome(True, False, version, len(files), num_rows)


def _evolve_schema(dt, table: Location, schema: pa.Schema, job_id: str) -> bool:
    """When ``schema`` (the files') adds nullable fields to the table's, top-level or inside structs,
    and the change is additive (:mod:`pipelines.payloads.evolution`), commit the merged schema
    first, as its own metadata-only version, and return True. Anything else (the same fields, or a
    change that is not additive) changes nothing here: the add actions are committed as before.

    Why a separate version: delta-rs's ``create_write_transaction`` commits add actions against the
    table's current metadata and ignores the schema it is given for an existing table; an empty
    ``write_deltalake(schema_mode="merge")`` is delta-rs's own way to commit a new schema. The data
    commit follows, with the app transaction; if it never happens, the table has gained nullable
    columns and no rows, which a rerun finds already merged."""
    from deltalake import CommitProperties, write_deltalake

    from pipelines.payloads.evolution import adds_fields, check_evolution

    current = pa.schema(dt.schema().to_arrow())
    if not adds_fields(current, schema):
        return False
    merged = check_evolution(current, schema)
    write_deltalake(table.delta_uri(), merged.empty_table(), mode="append", schema_mode="merge",
                    partition_by=list(dt.metadata().partition_columns) or None,
                    storage_options=table.delta_options(),
                    commit_properties=CommitProperties(custom_metadata={SCHEMA_EVOLUTION_KEY: job_id}))
    added = [f.name for f in merged if f.name not in current.names]
    log.info("%s: schema evolved for job %s (new columns: %s)", table, job_id, ", ".join(added) or "nested only")
    return True


def find_commit(table: Location, after: int, job_id: str) -> int | None:
    """The version after ``after`` whose commit info names ``job_id`` (None: none does). Reads the
    log entries ``after+1, after+2, …`` until one is ours or missing: one small read normally."""
    fs, root = table.filesystem()
    version = after + 1
    while True:
        try:
            with fs.open_input_file(f"{root}/_delta_log/{version:020d}.json") as fh:
                data = fh.readall()
        except FileNotFoundError:
            return None
        for line in data.splitlines():
            if line.startswith(b'{"commitInfo"'):
                if json.loads(line)["commitInfo"].get(JOB_ID_KEY) == job_id:
                    return version
                break
        version += 1


_warned: set[str] = set()


def _warn_if_unsafe(table: Location) -> None:
    value = table.option_map.get(UNSAFE_RENAME_OPTION) or table.option_map.get(UNSAFE_RENAME_OPTION.lower())
    if value is not None and value.strip().lower() in _TRUE and table.uri not in _warned:
        _warned.add(table.uri)
        log.warning("%s: %s=true: commits are not protected against concurrent writers (see %s)",
                    table, UNSAFE_RENAME_OPTION, __name__)
