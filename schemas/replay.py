"""Delta tables written by the replay job (issue 9): ``replay_ledger`` and ``replay_runs``.

``replay_ledger`` is an append-only event log: every change of a selected message's state in a run
is one row, and the row with the highest ``event_seq`` for (``run_id``, ``broker_name``,
``commitlog_offset``) is the message's current status. Appends never conflict (concurrent Spark tasks
commit their own batches) and a crash can only lose the newest events, never rewrite older ones.

Statuses: PLANNED (selected, not sent yet), SENT (the target stored it: ``target_*`` say where),
FAILED (the target refused it or could not be reached: it was certainly not stored, a rerun sends
it again), UNKNOWN (sent, no answer: it may or may not be stored; a rerun asks the target by
``replay_key`` before sending anything), SKIPPED (never sent: ``reason`` says why, e.g. over the
target's size limit).
"""

from __future__ import annotations

import pyarrow as pa

from schemas.contract import Allowed, Columns, TableContract, one_of

_TS = pa.timestamp("us", tz="UTC")

PLANNED, SENT, FAILED, UNKNOWN, SKIPPED = "PLANNED", "SENT", "FAILED", "UNKNOWN", "SKIPPED"
LEDGER_STATUSES = (PLANNED, SENT, FAILED, UNKNOWN, SKIPPED)

REPLAY_LEDGER = TableContract(
    name="replay_ledger",
    description="append-only event log of replay runs: the newest event of a message is its status",
    columns=[
        ("run_id", pa.string(), "replay run (partition column)"),
        ("broker_name", pa.string(), "source broker"),
        ("commitlog_offset", pa.int64(), "source record's commitlog offset (with broker_name: the message)"),
        ("event_seq", pa.int32(), "1 = PLANNED; each later event of the same message adds 1; the highest is current"),
        ("status", pa.string(), one_of(LEDGER_STATUSES)),
        ("reason", pa.string(), "why FAILED / UNKNOWN / SKIPPED, or how a SENT was confirmed"),
        ("attempts", pa.int32(), "send attempts so far"),
        ("store_date", pa.date32(), "source row's store_date (the messages partition it is read from)"),
        ("source_topic", pa.string(), "stored topic of the source record"),
        ("source_queue_id", pa.int32(), "source queue id"),
        ("source_queue_offset", pa.int64(), "source queue offset"),
        ("source_msg_id", pa.string(), "source offset message id"),
        ("source_uniq_key", pa.string(), "source UNIQ_KEY (client message id)"),
        ("source_store_time", _TS, "source store time"),
        ("body_bytes", pa.int64(), "payload length"),
        ("replay_key", pa.string(), "key added to KEYS: rlr:<run>:<broker>:<commitlog offset>"),
        ("target_topic", pa.string(), "topic the message is (to be) sent to"),
        ("target_broker", pa.string(), "target broker name (SENT)"),
        ("target_queue_id", pa.int32(), "target queue id (SENT)"),
        ("target_queue_offset", pa.int64(), "target queue offset (SENT)"),
        ("target_msg_id", pa.string(), "UNIQ_KEY of the replayed message (SENT)"),
        ("target_offset_msg_id", pa.string(), "target's offset message id (SENT)"),
        ("recorded_at", _TS, "when this event was recorded"),
    ],
    partition_by=("run_id",),
    key=("run_id", "broker_name", "commitlog_offset", "event_seq"),
    allowed=[Allowed("status", LEDGER_STATUSES)],
)

# run statuses
RUN_RUNNING, RUN_SUCCEEDED, RUN_INCOMPLETE, RUN_DRY_RUN = "RUNNING", "SUCCEEDED", "INCOMPLETE", "DRY_RUN"
RUN_STATUSES = (RUN_RUNNING, RUN_SUCCEEDED, RUN_INCOMPLETE, RUN_DRY_RUN)

REPLAY_RUNS = TableContract(
    name="replay_runs",
    description="one row per replay run: selection, target, operator, counts and status",
    columns=[
        ("run_id", pa.string(), "replay run"),
        ("status", pa.string(), f"{one_of(RUN_STATUSES)} ({RUN_INCOMPLETE}: rerun with the same run id)"),
        ("selection", pa.string(), "the selection as given on the command line"),
        ("target_namesrv", pa.string(), "target name server(s)"),
        ("target_topic", pa.string(), "--target-topic, or null: each message's own (DLQ: original) topic"),
        ("options", pa.string(), "JSON: rate, keep_order, keep_msg_id, max_messages, producer_group"),
        ("operator", pa.string(), "OS user who ran it"),
        ("driver", pa.string(), "host:pid of the driver of the latest attempt"),
        ("dry_run", pa.bool_(), "planned only, nothing sent"),
        ("attempts", pa.int32(), "times the run was started (1 + reruns)"),
        ("planned", pa.int64(), "messages selected"),
        ("planned_bytes", pa.int64(), "payload bytes selected"),
        ("sent", pa.int64(), "messages SENT"),
        ("failed", pa.int64(), "messages FAILED"),
        ("unknown", pa.int64(), "messages UNKNOWN"),
        ("skipped", pa.int64(), "messages SKIPPED"),
        ("pending", pa.int64(), "messages still PLANNED"),
        ("started_at", _TS, "first start"),
        ("ended_at", _TS, "end of the latest attempt (null while RUNNING)"),
        ("message", pa.string(), "summary or the error that stopped the latest attempt"),
    ],
    key=("run_id",),
    allowed=[Allowed("status", RUN_STATUSES)],
)

REPLAY_CONTRACTS: tuple[TableContract, ...] = (REPLAY_LEDGER, REPLAY_RUNS)

REPLAY_LEDGER_TABLE = REPLAY_LEDGER.name
REPLAY_LEDGER_COLUMNS: Columns = list(REPLAY_LEDGER.columns)
REPLAY_LEDGER_SCHEMA = REPLAY_LEDGER.schema
REPLAY_LEDGER_PARTITION_BY = list(REPLAY_LEDGER.partition_by)

REPLAY_RUNS_TABLE = REPLAY_RUNS.name
REPLAY_RUNS_COLUMNS: Columns = list(REPLAY_RUNS.columns)
REPLAY_RUNS_SCHEMA = REPLAY_RUNS.schema
