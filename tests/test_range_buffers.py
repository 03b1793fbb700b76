"""pipelines.commitlog_ranges.RangeBuffer: pooled maps reused without giving their pages back, and
every view holding exactly the file's bytes (zeros past what was read), whatever a map held before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from broker.store.record_scan import find_record_start
from pipelines import commitlog_ranges
from pipelines.commitlog_ranges import RangeBuffer, segment_files
from pipelines.store_files import StoreFiles


@pytest.fixture()
def seg(golden_store: Path):
    return segment_files(StoreFiles(golden_store))[0][0]


@pytest.fixture()
def empty_pool(monkeypatch):
    """An empty pool, and every range read as if the page cache did not hold it (a cached range is
    mapped from the file instead of read into a pooled map)."""
    monkeypatch.setattr(commitlog_ranges, "_POOL", [])
    monkeypatch.setattr(commitlog_ranges.local_reads, "range_cached", lambda *a: False)
    return commitlog_ranges._POOL


def _file_bytes(seg, lo: int, hi: int) -> bytes:
    with open(seg.location.uri, "rb") as fh:
        fh.seek(lo)
        return fh.read(hi - lo)


def test_a_pooled_map_serves_smaller_and_larger_ranges_without_shrinking(seg, empty_pool):
    """Pieces of changing sizes (as a split's growing pieces are) reuse one map: it only grows, and
    each buffer is exactly its range's bytes."""
    maps, sizes = [], []
    for lo, hi in ((0, 900_000), (4096, 104_096), (8192, 1_000_000), (0, 20_000)):
        rb = RangeBuffer(seg, lo, hi, to_file_end=False)
        try:
            assert len(rb.buf) == hi - lo
            assert bytes(rb.buf) == _file_bytes(seg, lo, hi)
            maps.append(rb._map)
            sizes.append(len(rb._map.mm))
        finally:
            rb.close()
    assert all(m is maps[0] for m in maps)
    assert sizes == [900_000, 900_000, 991_808, 991_808]
    assert empty_pool == [maps[0]]


def test_what_a_map_held_before_reads_as_zeros_past_the_bytes_read(seg, empty_pool):
    """A buffer to the file's end holds the bytes read and zeros after them, though the map it
    reuses held other bytes there."""
    with RangeBuffer(seg, 0, seg.data_len, to_file_end=False) as full:
        assert np.frombuffer(full.buf, np.uint8)[200_000:].any()
    with RangeBuffer(seg, 0, 100_000) as head:
        assert len(head.buf) == seg.data_len
        got = np.frombuffer(head.buf, np.uint8)
        assert bytes(head.buf[:head.read_end]) == _file_bytes(seg, 0, head.read_end)
        assert not got[head.read_end:].any()


def test_a_map_arrow_still_points_into_is_not_handed_out_again(seg, empty_pool):
    """Zero-copy bodies keep their map: a buffer made while they live gets another map, and the
    bodies' bytes stay the file's."""
    rb = RangeBuffer(seg, 0, 300_000, to_file_end=False)
    held = pa.py_buffer(memoryview(rb.buf)[1000:2000])
    first = rb._map
    rb.close()
    with RangeBuffer(seg, 500_000, 800_000, to_file_end=False) as other:
        assert other._map is not first
    assert held.to_pybytes() == _file_bytes(seg, 1000, 2000)
    del held
    with RangeBuffer(seg, 500_000, 800_000, to_file_end=False) as again:
        assert again._map is first
        assert again.lo == 499_712  # down to a page boundary
        assert bytes(again.buf) == _file_bytes(seg, again.lo, 800_000)


def test_a_worker_done_with_splits_gives_its_pooled_maps_back(seg, empty_pool):
    """give_back unmaps every pooled map (also one Arrow still points into: its bytes stay valid
    until the array goes), and reads after it work on fresh maps."""
    from pipelines import worker_memory

    with RangeBuffer(seg, 0, 300_000, to_file_end=False) as a, RangeBuffer(seg, 0, 100_000, to_file_end=False) as b:
        held = pa.py_buffer(memoryview(b.buf)[10:20])
        maps = [a._map, b._map]
    assert {id(m) for m in empty_pool} == {id(m) for m in maps} and len(empty_pool) == 2
    spans = sum(len(m.mm) for m in maps)
    assert worker_memory.give_back() >= spans > 0
    assert empty_pool == []
    assert maps[0].mm.closed
    assert held.to_pybytes() == _file_bytes(seg, 10, 20)
    with RangeBuffer(seg, 0, 4096, to_file_end=False) as c:
        assert c._map not in maps
        assert bytes(c.buf) == _file_bytes(seg, 0, 4096)


def test_record_search_over_a_memoryview_finds_what_it_finds_over_bytes(seg):
    """find_record_start over a buffer without ``find`` (a view of a pooled map) searches window
    by window and gives the same starts as over the same bytes."""
    data = _file_bytes(seg, 0, seg.data_len)
    view = memoryview(bytearray(data))
    for pos in (0, 1, 777, 50_000, 333_333, seg.data_len - 5000):
        want = find_record_start(data, pos, seg.data_len, seg.base, seg.segment_size)
        assert find_record_start(view, pos, seg.data_len, seg.base, seg.segment_size) == want
        assert want is not None and want >= pos
    assert find_record_start(view, 0, 0, seg.base, seg.segment_size) is None
