"""Every Delta table the project writes, by name: the one place to look a table's contract up.

Grouped by the job that writes them. A writer that adds a table declares its
:class:`~schemas.contract.TableContract` in the schema module of its job and lists it here;
``tests/test_schemas.py`` fails when a ``*_TABLE`` name in ``pipelines/`` or ``schemas/`` has no
contract.
"""

from __future__ import annotations

from schemas.contract import TableContract
from schemas.messages import MESSAGES
from schemas.payloads import PAYLOAD_QUARANTINE
from schemas.replay import REPLAY_CONTRACTS
from schemas.reports import REPORT_CONTRACTS
from schemas.tables import CONSUME_QUEUE, CORRUPT_RECORDS, INDEX_ENTRIES, INGEST_RUNS

INGEST_CONTRACTS: tuple[TableContract, ...] = (MESSAGES, CONSUME_QUEUE, INDEX_ENTRIES, CORRUPT_RECORDS, INGEST_RUNS)

TABLES: dict[str, TableContract] = {c.name: c for c in INGEST_CONTRACTS + REPORT_CONTRACTS + REPLAY_CONTRACTS}

INGEST_TABLES: tuple[str, ...] = tuple(c.name for c in INGEST_CONTRACTS)
REPORT_TABLES: tuple[str, ...] = tuple(c.name for c in REPORT_CONTRACTS)
REPLAY_TABLES: tuple[str, ...] = tuple(c.name for c in REPLAY_CONTRACTS)

# tables written only for declared payload topics (see the module doc)
PAYLOAD_CONTRACTS: dict[str, TableContract] = {c.name: c for c in (PAYLOAD_QUARANTINE,)}
PAYLOAD_TABLES: tuple[str, ...] = tuple(PAYLOAD_CONTRACTS)


def contract(name: str) -> TableContract:
    """The contract of table ``name``; a KeyError that lists the known tables otherwise."""
    found = TABLES.get(name) or PAYLOAD_CONTRACTS.get(name)
    if found is None:
        raise KeyError(f"no table {name!r}; known: {', '.join([*TABLES, *PAYLOAD_CONTRACTS])}") from None
    return found
