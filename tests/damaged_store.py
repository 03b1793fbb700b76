"""A copy of the golden store with known damage, for tests of what readers and walks find."""

from __future__ import annotations

import shutil
from pathlib import Path


def damaged_copy(golden_store: Path, golden_records: list[dict], into: Path) -> Path:
    """Zeroed records (a short run and one longer than the walk's windows), a broken magic, and a
    torn write after the data of the last segment."""
    store = into / "damaged"
    shutil.copytree(golden_store, store)
    seg0 = store / "commitlog" / "00000000000000000000"
    data = bytearray(seg0.read_bytes())
    for i, j in ((50, 53), (300, 340)):
        a, b = golden_records[i]["phyOffset"], golden_records[j]["phyOffset"]
        data[a:b] = bytes(b - a)
    p = golden_records[120]["phyOffset"]
    data[p + 4:p + 8] = b"\x00\x11\x22\x33"
    seg0.write_bytes(bytes(data))
    last = store / "commitlog" / "00000000000004194304"
    data = bytearray(last.read_bytes())
    end = golden_records[-1]["phyOffset"] + golden_records[-1]["storeSize"] - 4194304
    data[end:end + 50] = b"\x01" * 50
    last.write_bytes(bytes(data))
    return store
