"""Running jobs from tests. In-process: ``rocketlake <job>`` on the test session's SparkSession,
its stdout and stderr captured. As a subprocess in its own process group (the kill-and-rerun
tests): its stderr line by line as it is written, and whether anything of the group still runs."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import threading
from pathlib import Path
from typing import IO

import pytest


def run_job_in_process(config: pytest.Config, argv: list[str], cwd: Path | None = None) -> tuple[int, str, str]:
    """``rocketlake *argv`` (``broker.cli``: a job's ``main`` on the active SparkSession) in this
    process, from ``cwd`` when given: its exit status, stdout and stderr.

    The jobs print to ``sys.stdout``, so pytest's own capturing is set aside for the run (else live
    logging, when on, swaps ``sys.stdout`` back under the redirect); the root-logger handlers the job's
    ``logging.basicConfig`` adds are removed afterwards, and the working directory is restored."""
    from broker.cli import main

    capman = config.pluginmanager.getplugin("capturemanager")
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        with (capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()), \
                (contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext()), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
    return rc, out.getvalue(), err.getvalue()


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
