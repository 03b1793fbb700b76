"""pipelines.local_writes: data files written with direct I/O hold exactly the bytes written."""

from __future__ import annotations

import errno
import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from pipelines import local_writes
from pipelines.local_writes import BLOCK_BYTES, DirectFile

def _chunks(total: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out, left = [], total
    while left:
        n = min(left, int(rng.choice([1, 7, 4095, 4096, 65_537, 1 << 20, BLOCK_BYTES + 3])))
        out.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        left -= n
    return out


@pytest.mark.parametrize("total", [0, 1, 4096, BLOCK_BYTES, BLOCK_BYTES + 1, 3 * BLOCK_BYTES - 4097])
def test_bytes_written_in_any_pieces_are_the_files_bytes(tmp_path, total):
    """Writes of every size, across blocks and pages, give a file of exactly those bytes, whatever
    its length; tell() counts every byte written."""
    pieces = _chunks(total, total)
    f = DirectFile(str(tmp_path / "data.bin"))
    written = 0
    for p in pieces:
        assert f.write(p) == len(p)
        written += len(p)
        assert f.tell() == written
    f.close()
    assert (tmp_path / "data.bin").read_bytes() == b"".join(pieces)


def test_a_filesystem_refusing_direct_io_gets_plain_writes_of_the_same_bytes(tmp_path, monkeypatch):
    """On this disk the file is opened for direct I/O; where the open is refused (EINVAL, as tmpfs
    did before Linux 6.6), the same buffers are written plainly, with the same bytes."""
    on_disk = DirectFile(str(tmp_path / "a.bin"))
    assert on_disk.direct is bool(getattr(os, "O_DIRECT", 0))
    on_disk.close()
    real_open = os.open

    def refuse_direct(path, flags, *mode):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *mode)

    monkeypatch.setattr(local_writes.os, "open", refuse_direct)
    f = DirectFile(str(tmp_path / "plain.bin"))
    assert not f.direct
    data = _chunks(BLOCK_BYTES + 12_345, 1)
    for p in data:
        f.write(p)
    f.close()
    assert (tmp_path / "plain.bin").read_bytes() == b"".join(data)


def test_a_parquet_file_is_byte_for_byte_the_one_written_to_memory(tmp_path):
    """ParquetWriter over the lake's local output gives the file it writes to a memory buffer."""
    table = pa.table({"offset": np.arange(2_000_000, dtype=np.int64),
                      "key": [f"k{i % 977}" for i in range(2_000_000)]})
    out = local_writes.open_output(pafs.LocalFileSystem(), str(tmp_path / "t.parquet"))
    assert isinstance(out, DirectFile)
    with pq.ParquetWriter(out, table.schema) as w:
        w.write_table(table)
    out.close()
    mem = pa.BufferOutputStream()
    with pq.ParquetWriter(mem, table.schema) as w:
        w.write_table(table)
    assert (tmp_path / "t.parquet").read_bytes() == mem.getvalue().to_pybytes()
    assert pq.read_table(tmp_path / "t.parquet").equals(table)


def test_a_failed_write_is_raised_and_its_blocks_go_back_to_the_pool(tmp_path, monkeypatch):
    """A write the disk refuses (here: ENOSPC on the first block) is raised to the writer; closing
    after it leaves no block behind."""
    monkeypatch.setattr(local_writes, "_POOL", [])
    real = os.pwrite

    def full_disk(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    f = DirectFile(str(tmp_path / "full.bin"))
    monkeypatch.setattr(local_writes.os, "pwrite", full_disk)
    with pytest.raises(OSError, match="No space left"):
        for _ in range(3):
            f.write(bytes(BLOCK_BYTES))
    monkeypatch.setattr(local_writes.os, "pwrite", real)
    f.close()
    assert len(local_writes._POOL) == 2 and f.closed
    again = DirectFile(str(tmp_path / "again.bin"))
    assert not local_writes._POOL  # both blocks reused
    again.write(b"x" * 10)
    again.close()
    assert (tmp_path / "again.bin").read_bytes() == b"x" * 10
