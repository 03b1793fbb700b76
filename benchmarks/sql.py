"""SQL over the lake: time to the first result and for a group-by over a large ``messages`` table, per
engine (DuckDB, DataFusion, Spark SQL), next to a plain pyarrow scan of the same files in the same run.

    .venv/bin/python benchmarks/sql.py [--rows 10000000] [--root build/bench/sql]
        [--engines duckdb datafusion spark] [--body-bytes 32]

(``make bench-sql``; a smoke run: ``--rows 2000 --root <tmp dir>``, about half a minute, most of it
Spark start-up.)

The table: ingesting 10M messages would take longer than everything measured here, so a
``messages``-shaped Delta table (the schema of ``schemas/messages.py``, partitioned like the real one
by broker and store date) is synthesised with delta-rs under ``--root``/``lake-<rows>`` and reused by
later runs with the same ``--rows``: 2 brokers, 20 topics, 8 queues, 7 days, three properties and
one or two keys per message, ``--body-bytes`` bodies.

Per engine, through the same :func:`pipelines.sql.engines.open_engine` that ``rocketlake sql`` uses:

* open: the engine and its views over the lake (Spark: the session too, a fresh JVM);
* first batch: ``SELECT * FROM messages`` until its first record batch arrives (results stream);
* group-by: ``SELECT topic, COUNT(*), SUM(store_size), MAX(store_time) FROM messages GROUP BY topic``
  to its last row, twice (the second run with warm page cache and engine caches).

The pyarrow line reads the table's current files (``DeltaTable.file_uris()``) with
``pyarrow.dataset`` and groups with ``Table.group_by``: the floor any engine has to beat. Every
engine's group-by must equal pyarrow's, else the benchmark fails (exit 1). Rows/s = rows / 2nd group-by.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from schemas.messages import MESSAGES_PARTITION_BY, MESSAGES_SCHEMA  # noqa: E402

log = logging.getLogger("benchmarks.sql")

BATCH_ROWS = 500_000
TOPICS, QUEUES, BROKERS, DAYS = 20, 8, 2, 7
START_MS = 1_893_456_000_000  # 2030-01-01T00:00:00Z
GROUP_BY = ("SELECT topic, COUNT(*) AS messages, CAST(SUM(store_size) AS BIGINT) AS bytes, "
            "MAX(store_time) AS last_store_time FROM messages GROUP BY topic ORDER BY topic")
FIRST_BATCH = "SELECT * FROM messages"
ENGINES = ("duckdb", "datafusion", "spark")


@dataclass
class Figures:
    name: str
    open_s: float
    first_batch_s: float
    group_by_s: list[float]


# ---- the synthetic table -------------------------------------------------------------------------------
def _strings(prefix: str, numbers: np.ndarray, width: int = 0) -> pa.Array:
    text = pc.cast(pa.array(numbers), pa.string())
    if width:
        text = pc.utf8_lpad(text, width, "0")
    return pc.binary_join_element_wise(prefix, text, "")


def synth_batch(start: int, n: int, body_bytes: int) -> pa.RecordBatch:
    """Rows ``start`` .. ``start + n`` of the synthetic messages table, built column-wise."""
    i = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng(start)
    topic_no = (rng.zipf(1.6, n) - 1) % TOPICS
    topics = pc.take(pa.array([f"Topic{t:02d}" for t in range(TOPICS)]), pa.array(topic_no))
    size = 150 + body_bytes + rng.integers(0, 100, n, dtype=np.int64)
    broker_no = i % BROKERS
    store_ms = START_MS + (i * 60_000) % (DAYS * 86_400_000)  # a minute apart, over DAYS days
    store_ts = pa.array(store_ms * 1000, pa.timestamp("us", tz="UTC"))
    uniq = _strings("0A0001027F0000000000", i, 12)
    tags = pc.take(pa.array(["TagA", "TagB", "TagC", None]), pa.array(i % 4))
    order_key = _strings("order-", i % 100_000)
    two_keys = (i % 3) == 0
    key_counts = np.where(two_keys, 2, 1)
    key_offsets = np.concatenate([[0], np.cumsum(key_counts)]).astype(np.int32)
    key_values = pc.take(pa.concat_arrays([order_key, _strings("cust-", i % 5_000)]),
                         pa.array(_interleave_keys(n, two_keys)))
    keys = pa.ListArray.from_arrays(pa.array(key_offsets), key_values)
    prop_keys = pa.array(np.tile(np.array(["KEYS", "UNIQ_KEY", "TAGS"], dtype=object), n), pa.string())
    keys_text = pc.if_else(pa.array(two_keys), pc.binary_join_element_wise(order_key, _strings("cust-", i % 5_000), " "),
                           order_key)
    prop_values = pc.take(pa.concat_arrays([keys_text, uniq, pc.fill_null(tags, "")]),
                          pa.array(np.stack([i - start, i - start + n, i - start + 2 * n], axis=1).reshape(-1)))
    properties = pa.MapArray.from_arrays(pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32)), prop_keys, prop_values)
    body = pc.cast(pc.utf8_rpad(_strings("body-", i), body_bytes, "x"), pa.binary())
    offsets = np.cumsum(size) - size + start * (250 + body_bytes)  # batches never overlap
    columns = {
        "commitlog_offset": pa.array(offsets), "store_size": pa.array(size.astype(np.int32)),
        "magic_code": pa.array(np.full(n, -626843477, np.int32)),
        "body_crc": pa.array(rng.integers(0, 2**31 - 1, n, dtype=np.int64).astype(np.int32)),
        "body_crc_ok": pa.array(np.ones(n, bool)), "queue_id": pa.array((i % QUEUES).astype(np.int32)),
        "flag": pa.array(np.zeros(n, np.int32)), "queue_offset": pa.array(i // (TOPICS * QUEUES)),
        "sys_flag": pa.array(np.zeros(n, np.int32)), "transaction_type": pa.array(["NOT"] * n, pa.string()),
        "compression": pa.array(["NONE"] * n, pa.string()), "born_timestamp": pa.array(store_ms - 5),
        "store_timestamp": pa.array(store_ms),
        "born_host": _strings("10.0.0.", i % 50), "store_host": _strings("192.168.0.1", broker_no),
        "reconsume_times": pa.array(np.zeros(n, np.int32)),
        "prepared_transaction_offset": pa.array(np.zeros(n, np.int64)),
        "topic": topics, "real_topic": topics, "properties": properties, "keys": keys, "tags": tags,
        "uniq_key": uniq, "offset_msg_id": _strings("C0A8000A00002A9F", offsets, 16), "body": body,
        "born_time": pa.array((store_ms - 5) * 1000, pa.timestamp("us", tz="UTC")), "store_time": store_ts,
        "broker_name": _strings("broker-", broker_no), "store_date": pc.cast(store_ts, pa.date32()),
        "segment_file": pa.array(["00000000000000000000"] * n, pa.string()),
        "ingest_run_id": pa.array(["bench"] * n, pa.string()), "is_retry": pa.array(np.zeros(n, bool)),
        "is_dlq": pa.array(np.zeros(n, bool)), "consumer_group": pa.nulls(n, pa.string()),
        "origin_msg_id": pa.nulls(n, pa.string()),
    }
    return pa.RecordBatch.from_arrays([columns[f.name].cast(f.type) for f in MESSAGES_SCHEMA], schema=MESSAGES_SCHEMA)


def _interleave_keys(n: int, two_keys: np.ndarray) -> np.ndarray:
    """Indices into [order keys, customer keys]: each row's order key, then its customer key if it has two."""
    rows = np.arange(n)
    idx = np.stack([rows, rows + n], axis=1).reshape(-1)
    keep = np.stack([np.ones(n, bool), two_keys], axis=1).reshape(-1)
    return idx[keep]


def table_rows(path: Path) -> int | None:
    """Rows of the Delta table at ``path`` from its log's statistics (None: no table)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(path)):
        return None
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    return int(pc.sum(actions.column("num_records")).as_py() or 0)


def ensure_table(root: Path, rows: int, body_bytes: int) -> Path:
    """The lake holding a ``rows``-row messages table, built unless an earlier run left it."""
    from deltalake import write_deltalake

    lake = root / f"lake-{rows}-b{body_bytes}"
    table = lake / "messages"
    if table_rows(table) == rows:
        print(f"reusing {table}", flush=True)
        return lake
    shutil.rmtree(lake, ignore_errors=True)
    lake.mkdir(parents=True)
    started = time.perf_counter()

    def batches():
        for start in range(0, rows, BATCH_ROWS):
            yield synth_batch(start, min(BATCH_ROWS, rows - start), body_bytes)
    reader = pa.RecordBatchReader.from_batches(MESSAGES_SCHEMA, batches())
    write_deltalake(str(table), reader, partition_by=MESSAGES_PARTITION_BY)
    print(f"synthesised {rows:,} rows into {table} in {time.perf_counter() - started:.1f} s", flush=True)
    return lake


# ---- measurements --------------------------------------------------------------------------------------
def measure_pyarrow(lake: Path) -> tuple[Figures, list[dict]]:
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    started = time.perf_counter()
    dt = DeltaTable(str(lake / "messages"))
    dataset = ds.dataset(dt.file_uris(), format="parquet", partitioning=None)
    opened = time.perf_counter() - started
    started = time.perf_counter()
    next(iter(dataset.to_batches(batch_size=65536)))
    first = time.perf_counter() - started
    runs, result = [], []
    for _ in range(2):
        started = time.perf_counter()
        table = dataset.to_table(columns=["topic", "store_size", "store_time"])
        grouped = table.group_by("topic").aggregate([("topic", "count"), ("store_size", "sum"), ("store_time", "max")])
        result = sorted(({"topic": r["topic"], "messages": r["topic_count"], "bytes": r["store_size_sum"],
                          "last_store_time": r["store_time_max"]} for r in grouped.to_pylist()),
                        key=lambda r: r["topic"])
        runs.append(time.perf_counter() - started)
    return Figures("pyarrow scan", opened, first, runs), result


def measure_engine(name: str, lake: Path) -> tuple[Figures, list[dict]]:
    from pipelines.sql.engines import open_engine

    started = time.perf_counter()
    engine = open_engine(name, lake)
    opened = time.perf_counter() - started
    try:
        started = time.perf_counter()
        result = engine.execute(FIRST_BATCH)
        next(iter(result.batches))
        first = time.perf_counter() - started
        result.close()
        runs, rows = [], []
        for _ in range(2):
            started = time.perf_counter()
            result = engine.execute(GROUP_BY)
            rows = pa.Table.from_batches(list(result.batches), result.schema).to_pylist()
            runs.append(time.perf_counter() - started)
    finally:
        engine.close()
    return Figures(name, opened, first, runs), rows


def report(rows: int, lake: Path, figures: list[Figures]) -> None:
    files = [p for p in (lake / "messages").rglob("*.parquet")]
    mb = sum(p.stat().st_size for p in files) / 1e6
    print(f"\nmessages: {rows:,} rows, {mb:,.1f} MB of Parquet in {len(files)} files ({lake})")
    print(f"{'engine':<14} {'open s':>8} {'first batch s':>14} {'group-by s':>11} {'again s':>9} {'rows/s':>14}")
    for f in figures:
        print(f"{f.name:<14} {f.open_s:>8.2f} {f.first_batch_s:>14.3f} {f.group_by_s[0]:>11.2f} "
              f"{f.group_by_s[1]:>9.2f} {rows / max(f.group_by_s[1], 1e-9):>14,.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows of the messages table (default 10,000,000)")
    ap.add_argument("--root", type=Path, default=Path("build/bench/sql"),
                    help="where the synthetic lake lives (reused when present; default build/bench/sql)")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--body-bytes", type=int, default=32, help="body size (default 32)")
    args = ap.parse_args(argv)
    if args.rows < 1 or args.body_bytes < 8:
        ap.error("--rows must be >= 1 and --body-bytes >= 8")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    lake = ensure_table(args.root, args.rows, args.body_bytes)
    baseline, expected = measure_pyarrow(lake)
    figures, ok = [baseline], True
    for name in args.engines:
        print(f"running {name} …", flush=True)
        fig, rows = measure_engine(name, lake)
        figures.append(fig)
        if rows != expected:
            ok = False
            print(f"error: {name}'s group-by differs from pyarrow's:\n  {rows[:3]}\n  {expected[:3]}", file=sys.stderr)
    report(args.rows, lake, figures)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
