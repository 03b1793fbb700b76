"""Linux process controls the broker's processes use (``prctl``), best effort elsewhere.

* a name per process (``rl-store``, ``rl-dispatch``, ``rl-net-0`` …) in ``/proc/PID/comm``, so
  ``top``/``ps -o comm`` and the send benchmark's CPU-per-process figures can tell the spawned
  processes apart (they all run the same ``python -c "from multiprocessing.spawn …"`` command line);
* death with the parent, for a child that must never outlive it (the dispatcher);
* an exit without the interpreter's teardown, for a child whose work ended cleanly.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PR_SET_NAME = 15
_COMM_MAX = 15  # bytes of a task name, without the NUL

# Request threads hand the GIL to each other constantly; Python's default 5 ms switch interval
# would put that much latency on a contended hand-off.
GIL_SWITCH_INTERVAL_S = 0.0002


def _prctl(option: int, arg: int | bytes) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(option, arg, 0, 0, 0) != 0:
            log.warning("prctl(%d) failed: errno %d", option, ctypes.get_errno())
            return False
        return True
    except (OSError, AttributeError):
        return False


def set_process_name(name: str) -> None:
    """Name this process (at most 15 bytes are kept, as the kernel does)."""
    _prctl(_PR_SET_NAME, name.encode("utf-8")[:_COMM_MAX])


def process_name(pid: int) -> str:
    """The name of a process (``/proc/PID/comm``), '' when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies; exits at once if the parent is
    already gone (it died before ``prctl`` took effect). Without ``prctl`` the caller must poll
    ``os.getppid()`` itself."""
    if not _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL):
        log.warning("prctl(PR_SET_PDEATHSIG) is not available; the parent's death is noticed by polling")
    if os.getppid() != parent_pid:
        os._exit(1)


def terminate_when_orphaned(poll_s: float = 0.5) -> None:
    """SIGTERM this process (its own clean stop) once the process that started it is gone.

    For servers a program starts for itself (tests, benchmarks, the demo: ``--stop-with-parent``): a
    starter killed before it could stop them (a timeout's SIGKILL) left them running for good,
    because they run in their own session. The parent is polled rather than ``PR_SET_PDEATHSIG``
    asked for, because the kernel sends that one when the *thread* that forked exits."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        log.warning("the process that started this one (pid %d) is gone; stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def exit_without_teardown() -> None:
    """Called by a broker process's target once its work has ended cleanly: the process then ends as
    soon as Python's exit begins, without tearing the interpreter down.

    Why: the teardown of an interpreter that loaded numba's compiled kernels takes ~0.25 s (the
    loaded machine code's and LLVM's destructors), and every broker stop paid it twice in a row: the
    dispatcher's (the store process joins it) and then the store process's own. Nothing is lost:
    multiprocessing has run its finalizers before Python's exit begins, and the logs and standard
    streams are flushed here. Only in a multiprocessing child; a no-op in any other process (a test
    running a target in its own process must keep its exit status)."""
    if mp.parent_process() is None:
        return

    def end_now() -> None:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(0)

    atexit.register(end_now)  # atexit runs last-registered first: before every other handler
