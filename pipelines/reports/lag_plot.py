"""Lag over time for one consumer group, as a PNG (``rocketlake lag --group G --plot lag.png``).

Two panels sharing the time axis, one line per topic: lag in messages (summed over the topic's
queues and brokers at each snapshot) and lag in seconds (the worst queue). Rendering uses
matplotlib's Agg backend, so no display is needed.

The series comes from the ``consumer_lag`` history, which grows by one snapshot per run: a long
history is aggregated in Spark (only the snapshots x topics aggregate reaches the driver), a short
one by the driver with pyarrow (see :func:`load_lag_series`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.storage import Location
from schemas.reports import CONSUMER_LAG_TABLE

log = logging.getLogger(__name__)

SERIES_SCHEMA = pa.schema([
    pa.field("snapshot_ts", pa.timestamp("us", tz="UTC")),
    pa.field("topic", pa.string()),
    pa.field("lag_messages", pa.int64()),
    pa.field("lag_seconds", pa.float64()),
])


def lag_series(rows: pa.Table) -> pa.Table:
    """``consumer_lag`` rows of one group -> (snapshot_ts, topic, sum lag_messages, max lag_seconds),
    sorted by topic then time."""
    if rows.num_rows == 0:
        return SERIES_SCHEMA.empty_table()
    agg = rows.group_by(["snapshot_ts", "topic"], use_threads=False).aggregate(
        [("lag_messages", "sum"), ("lag_seconds", "max")])
    agg = agg.rename_columns({"lag_messages_sum": "lag_messages", "lag_seconds_max": "lag_seconds"})
    return agg.select(SERIES_SCHEMA.names).cast(SERIES_SCHEMA).sort_by(
        [("topic", "ascending"), ("snapshot_ts", "ascending")])


SPARK_MIN_ROWS = 2_000_000  # below this many candidate rows a driver-side scan beats starting Spark jobs


def candidate_rows(lake: str | os.PathLike | Location, group: str) -> int:
    """Rows of ``consumer_lag`` in files whose ``consumer_group`` statistics admit ``group``, from
    the Delta log alone (no data read). Files without statistics count in full; string statistics
    may be truncated prefixes, so a file is kept when ``group`` could lie between them."""
    from pipelines.lake import open_table

    table = open_table(lake, CONSUMER_LAG_TABLE)
    if table is None:
        return 0
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    records = actions.column("num_records").to_pylist()
    if "min.consumer_group" not in actions.column_names:
        return sum(n or 0 for n in records)
    total = 0
    for n, lo, hi in zip(records, actions.column("min.consumer_group").to_pylist(),
                         actions.column("max.consumer_group").to_pylist()):
        if lo is None or hi is None or (lo <= group and group[:len(hi)] <= hi):
            total += n or 0
    return total


def load_lag_series(lake: str | os.PathLike | Location, group: str, spark=None, *, spark_min_rows: int = SPARK_MIN_ROWS) -> pa.Table:
    """The plotted series of ``group`` from the lake (empty when the table or the group has no rows).

    The history grows by one snapshot per run. With a Spark session and at least
    ``spark_min_rows`` candidate rows (:func:`candidate_rows`) the aggregation runs in Spark and
    only the (snapshots x topics) aggregate reaches the driver; smaller histories are scanned on
    the driver with pyarrow (column pruning, file statistics on ``consumer_group``), which answers
    in milliseconds where a Spark job costs seconds. Both give the same table.
    """
    from pipelines.lake import read_table, scan_arrow, table_exists

    if not table_exists(lake, CONSUMER_LAG_TABLE):
        return SERIES_SCHEMA.empty_table()
    if spark is None or candidate_rows(lake, group) < spark_min_rows:
        rows = scan_arrow(lake, CONSUMER_LAG_TABLE, columns=["snapshot_ts", "topic", "lag_messages", "lag_seconds"],
                          filter=pc.field("consumer_group") == group)
        return lag_series(rows)
    from pyspark.sql import functions as F

    log.info("aggregating the lag history of group %s in Spark", group)
    df = (read_table(spark, lake, CONSUMER_LAG_TABLE)
          .where(F.col("consumer_group") == group)
          .groupBy("snapshot_ts", "topic")
          .agg(F.sum("lag_messages").alias("lag_messages"), F.max("lag_seconds").alias("lag_seconds")))
    return df.toArrow().select(SERIES_SCHEMA.names).cast(SERIES_SCHEMA).sort_by(
        [("topic", "ascending"), ("snapshot_ts", "ascending")])


def render_lag_plot(series: pa.Table, group: str, path: str | os.PathLike) -> Path:
    """Write the PNG; ``series`` as :func:`lag_series` returns it (must not be empty)."""
    if series.num_rows == 0:
        raise ValueError(f"no lag rows for group {group!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6.5), constrained_layout=True)
    try:
        for topic in sorted(set(series.column("topic").to_pylist())):
            rows = series.filter(pc.field("topic") == topic)
            times = [ts.replace(tzinfo=None) for ts in rows.column("snapshot_ts").to_pylist()]
            top.plot(times, rows.column("lag_messages").to_pylist(), marker="o", markersize=3, label=topic)
            seconds = [float("nan") if s is None else s for s in rows.column("lag_seconds").to_pylist()]
            bottom.plot(times, seconds, marker="o", markersize=3, label=topic)
        top.set_title(f"Consumer lag of group {group}")
        top.set_ylabel("lag (messages, sum of queues)")
        bottom.set_ylabel("lag (seconds, worst queue)")
        bottom.set_xlabel("snapshot time (UTC)")
        for ax in (top, bottom):
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
        top.legend(loc="upper left", fontsize="small", title="topic")
        bottom.xaxis.set_major_formatter(mdates.ConciseDateFormatter(bottom.xaxis.get_major_locator()))
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
    log.info("wrote %s (%d points, group %s)", path, series.num_rows, group)
    return path
