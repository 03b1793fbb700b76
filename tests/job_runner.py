"""What the kill-and-rerun tests need of a job run as a subprocess in its own process group:
its stderr line by line as it is written, and whether anything of the group still runs."""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import IO


def pump_lines(stream: IO[bytes]) -> tuple[queue.Queue, threading.Thread]:
    """A queue that receives ``stream``'s lines (without the newline) as they are written, then None,
    and the thread that fills it (it ends at the stream's EOF: when every writer is gone)."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line.rstrip(b"\n"))
        lines.put(None)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return lines, thread


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` (the job, its JVM, its Python workers) still runs."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            return True
    return False
