"""The dispatcher process dies with the store process that started it.

A dispatcher left running after its store process was killed would keep writing consume-queue and
index files under the next broker's recovery (and rewrite index headers from stale memory when it
syncs). The store process is SIGKILLed alone here: its dispatcher must be gone soon after, and the
broker's other processes are then stopped by the test.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

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
