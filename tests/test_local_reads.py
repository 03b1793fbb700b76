"""Local ranged reads: direct I/O for ranges the page cache does not hold, the same bytes either way."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from pipelines import local_reads

SIZE = 3 * (1 << 20) + 4321  # not a whole number of blocks: the last direct read is short


def _uncached_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(SIZE)
    path = tmp_path / "segment"
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())  # clean pages can be dropped
    _drop(path)
    return path, data


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _is_cached(path: Path, offset: int = 0, n: int = SIZE) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return local_reads.is_cached(fd, offset, n)
    finally:
        os.close(fd)


@pytest.fixture()
def direct_calls(monkeypatch):
    """Bytes each direct read returned (the spy keeps the real reads)."""
    calls: list[int] = []
    real = local_reads._read_direct

    def spy(path, view, offset):
        got = real(path, view, offset)
        calls.append(got[0])
        return got

    monkeypatch.setattr(local_reads, "_read_direct", spy)
    return calls


def test_asking_whether_a_range_is_cached_reads_nothing(tmp_path):
    path, _ = _uncached_file(tmp_path)
    if _is_cached(path):
        pytest.skip("this filesystem keeps every page (tmpfs)")
    assert not _is_cached(path) and not _is_cached(path)  # the same answer the second time
    with open(path, "rb") as fh:
        fh.read()
    assert _is_cached(path) and _is_cached(path, SIZE - 10, 10_000)  # bytes past the end count as cached


@pytest.mark.parametrize("offset, length", [(0, SIZE), (4096, 2 << 20), (1234, (2 << 20) + 77),
                                             ((1 << 20) + 17, SIZE), (SIZE - 5000, 1 << 20)])
def test_uncached_ranges_read_directly_give_the_file_bytes(tmp_path, direct_calls, offset, length):
    path, data = _uncached_file(tmp_path)
    if _is_cached(path):
        pytest.skip("this filesystem keeps every page (tmpfs)")
    buf = mmap.mmap(-1, length + 8192, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    at = offset % mmap.PAGESIZE  # buffer and file equally far from a page boundary, as RangeBuffer places them
    with memoryview(buf) as view:
        got = local_reads.read_into(str(path), view[at:at + length], offset)
        want = data[offset:offset + length]
        assert got == len(want) and bytes(view[at:at + got]) == want
    buf.close()
    if length >= local_reads.DIRECT_MIN_BYTES and len(want) >= local_reads.DIRECT_MIN_BYTES:
        assert direct_calls and direct_calls[0] > 0  # the aligned part went around the page cache
    assert not _is_cached(path)  # and did not fill it


def test_cached_and_unaligned_ranges_are_read_plainly(tmp_path, direct_calls):
    path, data = _uncached_file(tmp_path)
    buf = bytearray(SIZE)  # no alignment promised: plain reads
    with memoryview(buf) as view:
        assert local_reads.read_into(str(path), view[1:], 1) == SIZE - 1
    assert bytes(buf[1:]) == data[1:]
    page = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with memoryview(page) as view:  # now cached: read from the page cache
        assert local_reads.read_into(str(path), view, 0) == SIZE and bytes(view) == data
    page.close()
    assert all(got == 0 for got in direct_calls) or not direct_calls


@pytest.mark.parametrize("direct", [(0, False), (8192, False), (4096, True)],
                         ids=["refused", "stopped", "file-ended"])
def test_a_direct_read_that_stops_is_finished_plainly(tmp_path, monkeypatch, direct):
    """O_DIRECT refused (tmpfs), or failing part-way: the rest is read through the page cache.
    A direct read that saw the end of the file ends the read there."""
    path, data = _uncached_file(tmp_path)
    monkeypatch.setattr(local_reads, "is_cached", lambda fd, offset, n: False)
    got_direct, ended = direct

    def partial(path_, view, offset):
        view[:got_direct] = data[offset:offset + got_direct]
        return got_direct, ended

    monkeypatch.setattr(local_reads, "_read_direct", partial)
    buf = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with memoryview(buf) as view:
        got = local_reads.read_into(str(path), view, 0)
        assert got == (got_direct if ended else SIZE)
        assert bytes(view[:got]) == data[:got]
    buf.close()
