"""broker.server.linux_process.exit_without_teardown: a broker process whose work ended cleanly ends
as soon as Python's exit begins (its log flushed, exit status 0), and nothing changes in a process
that is not a multiprocessing child (a test running a process's target in its own process)."""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
from pathlib import Path

from broker.server.linux_process import exit_without_teardown


def _child(log_path: str, marker: str) -> None:
    logging.basicConfig(filename=log_path, level=logging.INFO, format="%(message)s")
    # registered first, so it would run after exit_without_teardown's handler: it must not run
    atexit.register(lambda: Path(marker).write_text("teardown ran"))
    logging.getLogger("child").info("stopped cleanly")
    exit_without_teardown()


def test_a_child_that_stopped_cleanly_exits_0_with_its_log_flushed_and_no_teardown(tmp_path):
    log_path, marker = tmp_path / "child.log", tmp_path / "teardown"
    proc = mp.get_context("spawn").Process(target=_child, args=(str(log_path), str(marker)))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert log_path.read_text() == "stopped cleanly\n"
    assert not marker.exists()


def test_outside_a_multiprocessing_child_it_changes_nothing():
    before = atexit._ncallbacks()
    exit_without_teardown()
    assert atexit._ncallbacks() == before
