"""One background thread per process, for I/O that overlaps a task's own work."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable


class ProcessThread:
    """A single worker thread of this process, started on first use and made again in a forked
    child (threads do not survive a fork, and Spark's Python workers are forked from its daemon).
    One thread: the reads or writes it runs go to one disk in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
                self._pid = os.getpid()
            pool = self._pool
        return pool.submit(fn, *args, **kwargs)
