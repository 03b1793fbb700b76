"""Servers a program starts for itself (launcher: tests, benchmarks, the demo) stop cleanly when that
program dies without stopping them, e.g. killed by a test's timeout; they used to run on for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker.server.launcher import REPO


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


def test_name_server_and_broker_stop_cleanly_when_their_starter_is_killed(tmp_path):
    starter = f"""
import os, signal, sys
from pathlib import Path
from broker.server.launcher import start_broker, start_namesrv
tmp = Path({str(tmp_path)!r})
ns, addr = start_namesrv(tmp)
broker = start_broker(tmp / "store", addr, processes=1)
print(ns.pid, broker.proc.pid, flush=True)
signal.pause()
"""
    proc = subprocess.Popen([sys.executable, "-c", starter], cwd=REPO, stdout=subprocess.PIPE, text=True)
    ns_pid, broker_pid = map(int, proc.stdout.readline().split())
    assert (tmp_path / "store" / "abort").exists()  # a running broker's marker
    proc.send_signal(signal.SIGKILL)  # no chance to stop anything
    proc.wait()
    deadline = time.monotonic() + 120
    while not (_gone(ns_pid) and _gone(broker_pid)):
        assert time.monotonic() < deadline, "the name server or the broker outlived its starter"
        time.sleep(0.1)
    assert not (tmp_path / "store" / "abort").exists()  # the broker stopped cleanly, not killed
    log = next(tmp_path.glob("broker-*.log")).read_text()
    assert "is gone; stopping" in log and "store closed cleanly" in log
