"""Run the ingest job (jobs/ingest_commitlog.py) so that it stops right after one table's commit:

    python tests/hold_after_commit.py TABLE <ingest_commitlog.py arguments>

The job then logs ``held after TABLE commit`` and waits to be killed. The kill-and-rerun tests use it
to land a kill *between* two tables' commits, which follow each other within milliseconds in the
ingest's single write job: a condition on the log, never a clock. Without the hold (the table not
committed in this run) the job runs to its end as usual."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "jobs"))

HELD_LINE = "held after {table} commit"


def main() -> int:
    table, argv = sys.argv[1], sys.argv[2:]
    from pipelines import partition_writer

    commit = partition_writer.PartitionJob.commit

    def commit_then_hold(self, name: str):
        result = commit(self, name)
        if name == table and not result.skipped:
            logging.getLogger(__name__).warning(HELD_LINE.format(table=table))
            threading.Event().wait()  # until SIGKILL
        return result

    partition_writer.PartitionJob.commit = commit_then_hold
    import ingest_commitlog

    return ingest_commitlog.main(argv)


if __name__ == "__main__":
    sys.exit(main())
