"""``messages`` rows → rows of the payload tables and of ``payload_quarantine``.

Which rows are payload rows: those whose *stored* topic is declared (so a delayed message counts
once, when it lands in its topic, not also as its ``SCHEDULE_TOPIC_XXXX`` copy; a retry or DLQ
copy only when ``%RETRY%g`` / ``%DLQ%g`` is itself declared) and that consumers receive
(transaction type NOT or COMMIT: a PREPARED or ROLLBACK record is never delivered). Rows of other
topics are ignored. Each payload row lands in exactly one place: its topic's ``payload_<topic>``
table when the body decodes, otherwise ``payload_quarantine`` with the reason. Both carry
``broker_name`` and ``commitlog_offset``, the ``messages`` key, to join back to the message (for a
dead letter, its ``messages`` row leads to the original through ``origin_msg_id``).
"""

from __future__ import annotations

import logging
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from broker.store.constants import QUEUED_TRANSACTION_TYPE_NAMES
from pipelines.payloads.declarations import Declarations
from schemas.payloads import PAYLOAD_METADATA_NAMES, PAYLOAD_QUARANTINE, PAYLOAD_QUARANTINE_TABLE

log = logging.getLogger(__name__)

# transaction types of records consumers receive (NOT = no transaction, COMMIT = committed)
DELIVERED_TRANSACTION_TYPES = pa.array(QUEUED_TRANSACTION_TYPE_NAMES, pa.string())


def payload_outputs(declarations: Declarations) -> list[tuple[str, pa.Schema, list[str]]]:
    """``(table name, schema, partition columns)`` of every table :func:`payload_batches` may
    yield for ``declarations``: one per declared topic, then the quarantine."""
    out = [(d.table_name, d.contract.schema, list(d.contract.partition_by)) for d in declarations]
    out.append((PAYLOAD_QUARANTINE_TABLE, PAYLOAD_QUARANTINE.schema, list(PAYLOAD_QUARANTINE.partition_by)))
    return out


def payload_batches(batch: pa.RecordBatch, declarations: Declarations) -> Iterator[tuple[str, pa.RecordBatch]]:
    """``(table name, RecordBatch)`` for the declared-topic rows of a batch of ``messages`` rows
    (every column of :data:`schemas.messages.MESSAGES_SCHEMA`; ``body`` as binary or binary_view):
    one batch per topic that has decoded rows, in topic order, then one quarantine batch when any
    body failed."""
    if batch.num_rows == 0 or not len(declarations):
        return
    topic = batch.column("topic")
    wanted = pa.array(sorted(declarations.topic_names), pa.string())
    mask = pc.and_(pc.is_in(topic, value_set=wanted),
                   pc.is_in(batch.column("transaction_type"), value_set=DELIVERED_TRANSACTION_TYPES))
    if not pc.any(mask).as_py():
        return
    rows = batch.filter(mask)
    quarantined: list[pa.RecordBatch] = []
    for name in sorted(pc.unique(rows.column("topic")).to_pylist()):
        decl = declarations.get(name)
        part = rows.filter(pc.equal(rows.column("topic"), name)) if len(wanted) > 1 else rows
        decoded = decl.codec.decode(part.column("body"))
        if decoded.failures:
            ok = decoded.ok_mask(part.num_rows)
            quarantined.append(_quarantine(part.filter(pa.array(~ok)), [r for _, r in decoded.failures]))
            good = part.filter(pa.array(ok))
            log.debug("topic %s: %d of %d bodies quarantined", name, len(decoded.failures), part.num_rows)
        else:
            good = part
        if good.num_rows:
            schema = decl.contract.schema
            arrays = [good.column(n) for n in PAYLOAD_METADATA_NAMES] + \
                     [c.combine_chunks() for c in decoded.table.columns]
            yield decl.table_name, pa.RecordBatch.from_arrays(arrays, schema=schema)
    if quarantined:
        yield PAYLOAD_QUARANTINE_TABLE, pa.concat_batches(quarantined) if len(quarantined) > 1 else quarantined[0]


def _quarantine(rows: pa.RecordBatch, reasons: list[str]) -> pa.RecordBatch:
    """The failed rows as ``payload_quarantine`` rows (``reasons`` in row order)."""
    values = {"reason": pa.array(reasons, pa.string()), "body": rows.column("body").cast(pa.binary())}
    schema = PAYLOAD_QUARANTINE.schema
    return pa.RecordBatch.from_arrays([values[n] if n in values else rows.column(n) for n in schema.names],
                                      schema=schema)

