"""Wall-clock time as the store writes it: epoch milliseconds (STORETIMESTAMP, index file names,
DataVersion timestamps, statistics). One function, so every component can take a fake clock in
tests and fall back to the same real one."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch (Java's ``System.currentTimeMillis``)."""
    return time.time_ns() // 1_000_000
