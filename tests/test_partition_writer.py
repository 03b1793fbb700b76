"""pipelines.partition_writer: a reader's partitions read and written to Delta by the same Spark task."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pipelines.lake import app_version
from pyspark import cloudpickle
from pipelines.partition_writer import FanOutWrite, PartitionJob, RowsCollect, TableOut, TableWrite, write_partitions

# the Python workers cannot import this test module: ship its classes by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = pa.schema([("part", pa.string()), ("commitlog_offset", pa.int64()), ("value", pa.string())])


class _Reader(DataSourceReader):
    """Partitions 0..n-1, each 100 rows with offsets part*100 .. part*100+99; ``fail`` raises in one."""

    def __init__(self, n: int, fail: int | None = None) -> None:
        self.n, self.fail = n, fail

    def partitions(self):
        return [InputPartition(i) for i in range(self.n)] or [InputPartition(None)]

    def read(self, partition):
        i = partition.value
        if i is None:
            return
        if i == self.fail:
            raise RuntimeError(f"partition {i} failed on purpose")
        for half in range(2):
            lo = i * 100 + half * 50
            yield pa.RecordBatch.from_pydict({
                "part": [f"p{i % 2}"] * 50, "commitlog_offset": list(range(lo, lo + 50)),
                "value": [f"v{o}" for o in range(lo, lo + 50)]}, schema=SCHEMA)


class _Numbered(InputPartition):
    pass


def _wrap(reader: _Reader) -> _Reader:
    # InputPartition(None) is the "nothing to read" marker write_partitions drops; real partitions
    # of this test reader must be a subclass, as the store readers' partitions are
    orig = reader.partitions
    reader.partitions = lambda: [_Numbered(p.value) for p in orig() if p.value is not None]  # type: ignore[method-assign]
    return reader


def _rows(path: str) -> list[tuple]:
    t = pa.table(DeltaTable(path).to_pyarrow_table()).sort_by("commitlog_offset")
    return list(zip(*(t[c].to_pylist() for c in SCHEMA.names)))


def test_all_partitions_in_one_commit_with_app_transaction(spark, tmp_path: Path) -> None:
    res = write_partitions(spark, _wrap(_Reader(5)), tmp_path, "t", schema=SCHEMA, partition_by=["part"],
                           app_id="test.app", app_version=7, offset_range=("commitlog_offset", 30, 420))
    assert res.committed and not res.skipped and res.num_rows == 390
    dt = DeltaTable(res.path)
    assert dt.version() == 0  # one transaction
    assert app_version(tmp_path, "t", "test.app") == 7
    rows = _rows(res.path)
    assert [r[1] for r in rows] == list(range(30, 420))
    assert rows[0] == ("p0", 30, "v30") and rows[-1] == ("p0", 419, "v419")
    # the same app version again: skipped, nothing written, no new files on disk
    files_before = sorted(p for p in Path(res.path).rglob("*.parquet"))
    again = write_partitions(spark, _wrap(_Reader(5)), tmp_path, "t", schema=SCHEMA, partition_by=["part"],
                             app_id="test.app", app_version=7)
    assert again.skipped and not again.committed and DeltaTable(res.path).version() == 0
    assert sorted(p for p in Path(res.path).rglob("*.parquet")) == files_before


def test_failed_task_leaves_no_files_and_no_commit(spark, tmp_path: Path) -> None:
    write_partitions(spark, _wrap(_Reader(2)), tmp_path, "t", schema=SCHEMA, app_id="a", app_version=1)
    before = sorted(p.name for p in Path(tmp_path, "t").rglob("*.parquet"))
    with pytest.raises(Exception, match="failed on purpose"):
        write_partitions(spark, _wrap(_Reader(4, fail=3)), tmp_path, "t", schema=SCHEMA, app_id="a", app_version=2)
    assert DeltaTable(os.path.join(tmp_path, "t")).version() == 0
    assert app_version(tmp_path, "t", "a") == 1
    assert sorted(p.name for p in Path(tmp_path, "t").rglob("*.parquet")) == before


def test_no_partitions_still_records_the_mark(spark, tmp_path: Path) -> None:
    res = write_partitions(spark, _wrap(_Reader(0)), tmp_path, "t", schema=SCHEMA, app_id="a", app_version=5)
    assert res.committed and res.num_rows == 0
    assert app_version(tmp_path, "t", "a") == 5
    assert DeltaTable(res.path).count() == 0


def test_one_job_writes_several_tables_and_collects_rows(spark, tmp_path: Path) -> None:
    """PartitionJob: two tables' files and a collection from one Spark job (the small second table's
    partitions grouped into per-core tasks, each still written to its own files); each table is
    committed on its own, and a table already recorded is skipped without a task."""
    write_partitions(spark, _wrap(_Reader(1)), tmp_path, "done", schema=SCHEMA, app_id="a", app_version=9)
    job = PartitionJob(
        [TableWrite(_wrap(_Reader(4)), tmp_path, "big", SCHEMA, ["part"], "a", 9, order=lambda p: p.value * 10),
         TableWrite(_wrap(_Reader(6)), tmp_path, "small", SCHEMA, [], "a", 9),
         TableWrite(_wrap(_Reader(3)), tmp_path, "done", SCHEMA, [], "a", 9)],
        [RowsCollect(_wrap(_Reader(2)), SCHEMA)])
    job.run(spark)
    assert job.commit("big").num_rows == 400 and job.commit("small").num_rows == 600
    assert job.commit("done").skipped and DeltaTable(os.path.join(tmp_path, "done")).count() == 100
    assert [r[1] for r in _rows(os.path.join(tmp_path, "big"))] == list(range(400))
    assert [r[1] for r in _rows(os.path.join(tmp_path, "small"))] == list(range(600))
    assert len(DeltaTable(os.path.join(tmp_path, "small")).file_uris()) == 6  # one file per partition, none overwritten by a grouped neighbour
    assert sorted(job.rows(SCHEMA).column("commitlog_offset").to_pylist()) == list(range(200))
    assert app_version(tmp_path, "big", "a") == app_version(tmp_path, "small", "a") == 9


class _Routing(_Reader):
    """Each row of _Reader to table ``even`` or ``odd`` by offset, as (table, batch) pairs; rows of
    offsets below 7 also to ``sevens`` (a table the job does not write: dropped)."""

    def read(self, partition):
        import pyarrow.compute as pc
        for batch in super().read(partition):
            odd = pc.equal(pc.bit_wise_and(batch.column("commitlog_offset"), 1), 1)
            yield "even", batch.filter(pc.invert(odd))
            yield "odd", batch.filter(odd)
            yield "sevens", batch.filter(pc.equal(pc.divide(batch.column("commitlog_offset"), 7), 0))


def test_fan_out_write_feeds_several_tables_from_one_read_each_from_its_own_mark(spark, tmp_path: Path) -> None:
    """FanOutWrite: one reader's (table, batch) pairs written to their tables' files in the same task;
    each table filtered by its own offset range and committed with its own version; a table already
    recorded gets nothing; pairs for tables not in the job are dropped."""
    write_partitions(spark, _wrap(_Reader(1)), tmp_path, "odd", schema=SCHEMA, app_id="a", app_version=9)
    job = PartitionJob([FanOutWrite(_wrap(_Routing(4)), tmp_path,
                                    [TableOut("even", SCHEMA, ["part"], 9, ("commitlog_offset", 100, 400)),
                                     TableOut("odd", SCHEMA, [], 9, ("commitlog_offset", 0, 400))],
                                    "a", order=lambda p: p.value)])
    job.run(spark)
    even = job.commit("even")
    assert even.committed and even.num_rows == 150
    assert [r[1] for r in _rows(os.path.join(tmp_path, "even"))] == list(range(100, 400, 2))
    assert job.commit("odd").skipped and DeltaTable(os.path.join(tmp_path, "odd")).count() == 100
    assert not os.path.exists(os.path.join(tmp_path, "sevens"))
    assert app_version(tmp_path, "even", "a") == 9


class _WithSide(_Reader):
    """_Reader's batches, then a SideRows naming the partition (not for the table)."""

    def read(self, partition):
        from pipelines.sources.options import SideRows
        yield from super().read(partition)
        yield SideRows(pa.RecordBatch.from_pydict({"part": [partition.value]}))


def test_side_rows_come_back_to_the_driver_and_not_to_the_table(spark, tmp_path: Path) -> None:
    """A reader's SideRows reach PartitionJob.side_rows (every task's), and the table gets only the
    batches; a write that yielded none, or a table already recorded, has None."""
    write_partitions(spark, _wrap(_Reader(1)), tmp_path, "done", schema=SCHEMA, app_id="a", app_version=9)
    job = PartitionJob([TableWrite(_wrap(_WithSide(3)), tmp_path, "t", SCHEMA, [], "a", 9, order=lambda p: p.value),
                        TableWrite(_wrap(_Reader(2)), tmp_path, "plain", SCHEMA, [], "a", 9),
                        TableWrite(_wrap(_WithSide(2)), tmp_path, "done", SCHEMA, [], "a", 9)])
    job.run(spark)
    assert sorted(job.side_rows("t").column("part").to_pylist()) == [0, 1, 2]
    assert job.side_rows("plain") is None and job.side_rows("done") is None and job.side_rows("other") is None
    assert job.commit("t").num_rows == 300
    assert [r[1] for r in _rows(os.path.join(tmp_path, "t"))] == list(range(300))


def test_a_collection_of_chosen_partitions_reads_only_those(spark) -> None:
    from pipelines.partition_writer import collect_partitions

    reader = _wrap(_Reader(4))
    got = collect_partitions(spark, reader, SCHEMA, [_Numbered(1), _Numbered(3)])
    assert sorted(got.column("commitlog_offset").to_pylist()) == [*range(100, 200), *range(300, 400)]


class _HeapProbe(_Reader):
    """One row per partition: how many objects the worker's collector holds frozen while it reads."""

    def read(self, partition):
        import gc
        yield pa.RecordBatch.from_pydict({"part": [str(partition.value)], "commitlog_offset": [gc.get_freeze_count()],
                                          "value": [None]}, schema=SCHEMA)


def test_tasks_run_with_the_workers_imports_frozen_out_of_the_collector(spark) -> None:
    """PySpark's daemon runs a full collection after every task of a reused worker: with the worker's
    long-lived objects frozen (what was alive when the task started), it no longer walks them."""
    from pipelines.partition_writer import collect_partitions

    got = collect_partitions(spark, _wrap(_HeapProbe(3)), SCHEMA)
    assert got.num_rows == 3
    assert min(got.column("commitlog_offset").to_pylist()) > 10_000  # pyspark and pyarrow's own, at least


class _PoolingReader(_Reader):
    """A large input's reader that leaves a map in the worker's commitlog read pool, as a split does."""

    def read(self, partition):
        from pipelines import commitlog_ranges

        commitlog_ranges._release(commitlog_ranges._Map(1 << 20))
        yield from super().read(partition)


class _PoolProbe(_Reader):
    """A small input's reader: one row per partition, holding how many maps the worker's pool keeps."""

    def read(self, partition):
        from pipelines import commitlog_ranges

        yield pa.RecordBatch.from_pydict({"part": [str(partition.value)], "commitlog_offset": [len(commitlog_ranges._POOL)],
                                          "value": [None]}, schema=SCHEMA)


def test_a_worker_gives_back_its_split_read_maps_before_the_small_inputs(spark, tmp_path: Path) -> None:
    """The maps pooled for the large inputs' reads are unmapped before a worker's group of small
    inputs: their peak memory would otherwise grow with the store. (Both Python workers run large
    tasks first, so without it a small input finds maps in its worker's pool.)"""
    large = TableWrite(_wrap(_PoolingReader(8)), str(tmp_path), "large", SCHEMA, ["part"], app_id="t", app_version=1,
                       order=lambda p: p.value)
    small = TableWrite(_wrap(_PoolProbe(6)), str(tmp_path), "small", SCHEMA, ["part"], app_id="t", app_version=1)
    job = PartitionJob([large, small])
    job.run(spark)
    for name in ("large", "small"):
        job.commit(name)
    left = pa.table(DeltaTable(str(tmp_path / "small")).to_pyarrow_table())["commitlog_offset"].to_pylist()
    assert left == [0] * 6
