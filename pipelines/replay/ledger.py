"""Reading and writing ``replay_ledger`` (append-only events) and ``replay_runs`` (one row per run).

Every append carries a Delta app transaction (``app_id``/``app_version``), so a batch that was
committed is never committed twice, whichever process retries it. The current status of a message is
its event with the highest ``event_seq`` (see :mod:`schemas.replay`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipelines.delta_commit import skip_reason
from pipelines.lake import append_arrow, open_table, replace_arrow, scan_arrow, table_exists
from pipelines.storage import Location
from schemas.replay import (
    FAILED,
    LEDGER_STATUSES,
    PLANNED,
    REPLAY_LEDGER_PARTITION_BY,
    REPLAY_LEDGER_SCHEMA,
    REPLAY_LEDGER_TABLE,
    REPLAY_RUNS_SCHEMA,
    REPLAY_RUNS_TABLE,
    SENT,
    SKIPPED,
    UNKNOWN,
)

MESSAGE_KEY = ["broker_name", "commitlog_offset"]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def events_table(columns: dict[str, object]) -> pa.Table:
    """A ledger batch from column values (missing columns are null), cast to the table schema."""
    n = len(next(iter(columns.values())))
    arrays = []
    for field in REPLAY_LEDGER_SCHEMA:
        value = columns.get(field.name)
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, (pa.Array, pa.ChunkedArray)):
            arrays.append(value.cast(field.type))
        else:
            arrays.append(pa.array(value, field.type))
    return pa.table(arrays, schema=REPLAY_LEDGER_SCHEMA)


def next_events(state: pa.Table, status: list[str] | str, *, reason: list[str | None] | str | None = None,
                attempts_add: int = 0, extra: dict[str, object] | None = None) -> pa.Table:
    """Events that follow ``state`` (current ledger rows): same message columns, ``event_seq + 1``,
    the given status/reason, ``attempts`` raised by ``attempts_add``, target columns from ``extra``."""
    n = state.num_rows
    cols: dict[str, object] = {name: state[name] for name in REPLAY_LEDGER_SCHEMA.names if name in state.column_names}
    cols["event_seq"] = pc.add(state["event_seq"], 1)
    cols["status"] = [status] * n if isinstance(status, str) else status
    cols["reason"] = [reason] * n if reason is None or isinstance(reason, str) else reason
    cols["attempts"] = pc.add(state["attempts"], attempts_add)
    cols["recorded_at"] = [utc_now()] * n
    for name in ("target_broker", "target_queue_id", "target_queue_offset", "target_msg_id", "target_offset_msg_id"):
        cols[name] = None
    cols.update(extra or {})
    return events_table(cols)


def append_events(lake: str | Location, events: pa.Table, app_id: str, app_version: int) -> bool:
    """Append one batch of events; False when the batch was committed before (same app id/version)."""
    if events.num_rows == 0:
        return True
    result = append_arrow(lake, REPLAY_LEDGER_TABLE, events, partition_by=REPLAY_LEDGER_PARTITION_BY,
                          app_id=app_id, app_version=app_version)
    return not result.skipped


class LedgerWriter:
    """Appends one task's event batches under its own app id (versions 1, 2, ...).

    Holds the table open and only reads the commits added since its last append
    (``update_incremental``): opening the table for every batch re-reads a log that grows with every
    batch of every task, and the replay stops sending while it commits."""

    def __init__(self, lake: str | Location, app_id: str) -> None:
        self.lake, self.app_id = lake, app_id
        self.version = 0
        self._table = None

    def append(self, events: pa.Table) -> bool:
        """Commit the next batch; False when that app version was committed before."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        self.version += 1
        if events.num_rows == 0:
            return True
        if self._table is None:
            self._table = open_table(self.lake, REPLAY_LEDGER_TABLE)
            if self._table is None:
                return append_events(self.lake, events, self.app_id, self.version)
        else:
            self._table.update_incremental()
        if skip_reason(self._table, self.app_id, self.version) is not None:
            return False
        write_deltalake(self._table, events, mode="append", partition_by=REPLAY_LEDGER_PARTITION_BY,
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(self.app_id, self.version)],
                            custom_metadata={"rocketlake.writer": "replay ledger"}))
        return True


def run_events(lake: str | Location, run_id: str, columns: list[str] | None = None) -> pa.Table:
    """Every event of one run (partition-pruned on run_id)."""
    if not table_exists(lake, REPLAY_LEDGER_TABLE):
        return REPLAY_LEDGER_SCHEMA.empty_table()
    return scan_arrow(lake, REPLAY_LEDGER_TABLE, columns=columns, filter=ds.field("run_id") == run_id)


def current_state(events: pa.Table, keys: list[str] = MESSAGE_KEY) -> pa.Table:
    """The newest event (highest ``event_seq``) of every message, sorted by ``keys``."""
    if events.num_rows == 0:
        return events
    t = events.sort_by([(k, "ascending") for k in keys] + [("event_seq", "ascending")])
    last = np.ones(t.num_rows, dtype=bool)
    last[:-1] = False
    for k in keys:
        v = t[k].to_numpy(zero_copy_only=False)
        last[:-1] |= v[1:] != v[:-1]
    return t.filter(pa.array(last))


def status_counts(state: pa.Table) -> dict[str, int]:
    counts = {s: 0 for s in LEDGER_STATUSES}
    if state.num_rows:
        for row in state.group_by("status").aggregate([("status", "count")]).to_pylist():
            counts[row["status"]] = row["status_count"]
    return counts


def with_status(state: pa.Table, *statuses: str) -> pa.Table:
    return state.filter(pc.is_in(state["status"], pa.array(list(statuses))))


# ---- replay_runs ------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    run_id: str
    status: str
    selection: str
    target_namesrv: str
    target_topic: str | None
    options: dict
    operator: str
    driver: str
    dry_run: bool
    attempts: int
    planned: int
    planned_bytes: int
    started_at: datetime
    ended_at: datetime | None = None
    sent: int = 0
    failed: int = 0
    unknown: int = 0
    skipped: int = 0
    pending: int = 0
    message: str | None = None

    def counted(self, state: pa.Table) -> "RunRecord":
        c = status_counts(state)
        self.sent, self.failed, self.unknown, self.skipped, self.pending = (
            c[SENT], c[FAILED], c[UNKNOWN], c[SKIPPED], c[PLANNED])
        return self

    def to_table(self) -> pa.Table:
        row = {name: getattr(self, name) for name in REPLAY_RUNS_SCHEMA.names}
        row["options"] = json.dumps(self.options, sort_keys=True)
        return pa.Table.from_pylist([row], schema=REPLAY_RUNS_SCHEMA)

    @classmethod
    def from_row(cls, row: dict) -> "RunRecord":
        values = dict(row)
        values["options"] = json.loads(values["options"] or "{}")
        return cls(**values)


def save_run(lake: str | Location, run: RunRecord) -> None:
    """Replace the run's row (one commit; other runs' rows stay)."""
    replace_arrow(lake, REPLAY_RUNS_TABLE, run.to_table(), predicate=f"run_id = '{run.run_id}'")


def load_run(lake: str | Location, run_id: str) -> RunRecord | None:
    if not table_exists(lake, REPLAY_RUNS_TABLE):
        return None
    rows = scan_arrow(lake, REPLAY_RUNS_TABLE, filter=ds.field("run_id") == run_id).to_pylist()
    return RunRecord.from_row(rows[-1]) if rows else None


def sent_dlq_replays(lake: str | os.PathLike | Location) -> pa.Table:
    """(broker_name, dlq_commitlog_offset, run_id, recorded_at) of every %DLQ% source record whose
    current status is SENT in some run: the DLQ report marks those DLQ messages replayed."""
    empty = pa.table({"broker_name": pa.array([], pa.string()), "dlq_commitlog_offset": pa.array([], pa.int64()),
                      "run_id": pa.array([], pa.string()),
                      "recorded_at": pa.array([], REPLAY_LEDGER_SCHEMA.field("recorded_at").type)})
    if not table_exists(lake, REPLAY_LEDGER_TABLE):
        return empty
    events = scan_arrow(lake, REPLAY_LEDGER_TABLE, columns=[
        "run_id", "broker_name", "commitlog_offset", "event_seq", "status", "source_topic", "recorded_at"],
        filter=pc.starts_with(ds.field("source_topic"), pattern="%DLQ%"))
    if events.num_rows == 0:
        return empty
    t = current_state(events, ["run_id", *MESSAGE_KEY])
    t = t.filter(pc.equal(t["status"], SENT))
    return t.select(["broker_name", "commitlog_offset", "run_id", "recorded_at"]).rename_columns(
        ["broker_name", "dlq_commitlog_offset", "run_id", "recorded_at"])
