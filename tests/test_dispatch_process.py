"""The dispatcher process dies with the store process that started it.

A dispatcher left running after its store process was killed would keep writing consume-queue and
index files under the next broker's recovery (and rewrite index headers from stale memory when it
syncs). The store process is SIGKILLed alone here: its dispatcher must be gone soon after, and the
broker's other processes are then stopped by the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from broker.server.dispatch_process import default_start_method
from broker.server.launcher import iter_proc_stats
from tests.broker_harness import start_broker, start_namesrv

DEADLINE_S = 15.0


def _children(pid: int) -> list[int]:
    return [p for p, state, ppid, _ in iter_proc_stats() if ppid == pid and state != "Z"]


def _is_spawned(pid: int) -> bool:
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_dispatcher_exits_when_store_process_is_killed(tmp_path: Path) -> None:
    ns, ns_addr = start_namesrv(tmp_path)
    broker = start_broker(tmp_path / "store", ns_addr)
    try:
        # the store process is the supervisor's child that itself spawned a process (the dispatcher)
        owners = {c: [g for g in _children(c) if _is_spawned(g)] for c in _children(broker.proc.pid)}
        (store_pid, dispatchers), = [(c, d) for c, d in owners.items() if d]
        (dispatcher_pid,) = dispatchers
        os.kill(store_pid, signal.SIGKILL)
        deadline = time.monotonic() + DEADLINE_S
        while any(p == dispatcher_pid and state != "Z" for p, state, _, _ in iter_proc_stats()):
            assert time.monotonic() < deadline, f"dispatcher {dispatcher_pid} outlived its store process"
            time.sleep(0.02)
    finally:
        broker.kill()
        ns.kill()
        ns.wait()


def test_the_dispatcher_is_forked_from_a_single_threaded_process_and_spawned_otherwise():
    """The store process starts its dispatcher before any thread of its own: a fork, which needs no
    imports. With another thread running, a fork could copy a lock that thread holds: spawn."""
    probe = "from broker.server.dispatch_process import default_start_method as m; print(m())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "fork\n"), out.stderr
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert default_start_method() == "spawn"
    finally:
        release.set()
        other.join()
