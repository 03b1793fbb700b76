"""One Airflow Asset per lake table: producers list them as outlets, consumers schedule on them.

An Asset names a table of *the* lake of this Airflow deployment (``x-rocketlake://lake/<table>``);
where that lake is (Variable ``rocketlake_lake``) and which Delta version an event stands for ride in
the event's ``extra``. The table names are those of ``schemas/`` (tests/airflow checks that the
ingest writes exactly :data:`INGEST_TABLES`).
"""

from __future__ import annotations

from airflow.sdk import Asset

ASSET_GROUP = "rocketlake"

# written by jobs/ingest_commitlog.py (schemas/messages.py, schemas/tables.py)
INGEST_TABLES = ("messages", "consume_queue", "index_entries", "corrupt_records", "ingest_runs")
# written by the report jobs (schemas/reports.py)
DLQ_TABLES = ("dlq_messages", "dlq_summary")
AUDIT_TABLES = ("audit_findings", "topic_daily_stats")
LAG_TABLES = ("consumer_lag", "consumer_lag_status")
# written by jobs/replay.py (schemas/replay.py)
REPLAY_TABLES = ("replay_runs", "replay_ledger")


def table_asset(table: str) -> Asset:
    return Asset(name=f"rocketlake.{table}", uri=f"x-rocketlake://lake/{table}", group=ASSET_GROUP)


INGEST_ASSETS = {table: table_asset(table) for table in INGEST_TABLES}
DLQ_ASSETS = [table_asset(t) for t in DLQ_TABLES]
AUDIT_ASSETS = [table_asset(t) for t in AUDIT_TABLES]
LAG_ASSETS = [table_asset(t) for t in LAG_TABLES]
REPLAY_ASSETS = [table_asset(t) for t in REPLAY_TABLES]

# what the reports read: a new commit by the ingest to any of them starts rocketlake_reports
# (ingest_runs only logs the runs, a run that found nothing new writes nothing anywhere)
REPORT_INPUTS = (INGEST_ASSETS["messages"] | INGEST_ASSETS["consume_queue"] | INGEST_ASSETS["index_entries"]
                 | INGEST_ASSETS["corrupt_records"])
