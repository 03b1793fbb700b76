"""Start a real name server and broker as separate processes on loopback (tests, demo, benchmarks).

Each runs in its own session (a terminal's Ctrl-C reaches the starter, which stops them in order) and
with ``--stop-with-parent``: a starter that dies without stopping them (a timeout's SIGKILL) does not
leave them running."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

REPO = Path(__file__).resolve().parents[2]
ROCKETLAKE = [sys.executable, "-m", "broker.cli"]


def iter_proc_stats():
    """``(pid, state, ppid, pgid)`` of every process in /proc (ones that vanish meanwhile are skipped)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields_ = stat[stat.rindex(")") + 2:].split()
        yield int(name), fields_[0], int(fields_[1]), int(fields_[2])


def live_group_pids(pgid: int) -> list[int]:
    """Processes of a process group that have not exited yet (zombies have released everything)."""
    return sorted(pid for pid, state, _, group in iter_proc_stats() if group == pgid and state != "Z")


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED_PORT = 10_000


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections and to ``bind(port 0)``."""
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A loopback port that is free now and stays free until a server started soon after binds it.

    A port taken with ``bind(port 0)`` comes from the kernel's ephemeral range, which every outgoing
    connection of the machine draws from too: between the pick and the server's own bind, a Spark
    executor's or a client's connect can take it (a clean-clone run lost the Spark master's bind
    that way). So the pick is a random free port below that range, where only servers go."""
    low, _ = _ephemeral_range()
    if low - 1 <= LOWEST_PICKED_PORT:
        with socket.socket() as s:  # no room below the range on this machine
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOWEST_PICKED_PORT, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free loopback port in {LOWEST_PICKED_PORT}-{low - 1} after 200 tries")


def wait_port(port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@dataclass
class BrokerHandle:
    store: Path
    port: int
    namesrv: str
    proc: subprocess.Popen
    log: Path

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the supervisor and every broker process (its whole process group), and wait until
        none is left (a dying network process may otherwise still hold the port)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        deadline = time.monotonic() + 30
        while live_group_pids(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def start_namesrv(tmp: Path, extra_args: Sequence[str] = ()) -> tuple[subprocess.Popen, str]:
    """A name server on a free loopback port; ``extra_args`` are more ``namesrv start`` flags (TLS)."""
    port = free_port()
    log = open(tmp / f"namesrv-{port}.log", "w")
    proc = subprocess.Popen([*ROCKETLAKE, "namesrv", "start", "--listen", f"127.0.0.1:{port}", "--stop-with-parent",
                             *extra_args], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_port(port, proc=proc)
    return proc, f"127.0.0.1:{port}"


def start_broker(store: Path, namesrv: str, config: dict | None = None, port: int | None = None,
                 processes: int = 2) -> BrokerHandle:
    port = port or free_port()
    store.mkdir(parents=True, exist_ok=True)
    cfg = store.parent / f"broker-{port}.toml"
    lines = [f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {str(v).lower() if isinstance(v, bool) else v}"
             for k, v in (config or {}).items()]
    cfg.write_text("\n".join(lines).replace("'", '"') + "\n")
    log_path = store.parent / f"broker-{port}.log"
    log = open(log_path, "a")
    log_start = log.tell()  # a restart appends to the same log: only what this start writes counts
    proc = subprocess.Popen([*ROCKETLAKE, "--log-level", "INFO", "broker", "start", "--store", str(store),
                             "--listen", f"127.0.0.1:{port}", "--namesrv", namesrv, "--config", str(cfg),
                             "--processes", str(processes), "--stop-with-parent"],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_port(port, proc=proc)
    _wait_started(log_path, log_start, f"listening on 127.0.0.1:{port}, store", proc)
    return BrokerHandle(store, port, namesrv, proc, log_path)


def _wait_started(log_path: Path, offset: int, line: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Wait for the broker's own "listening" line: the port answers as soon as the FIRST network
    process listens, the line comes once every one of them does (``Broker.start``), so a caller's
    connections are spread over all of them (SO_REUSEPORT) from the start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            if line.encode() in fh.read():
                return
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} before it started; see {log_path}")
        time.sleep(0.05)
    raise TimeoutError(f"broker did not finish starting in {timeout} s; see {log_path}")


@contextmanager
def cluster(tmp: Path, config: dict | None = None) -> Iterator[BrokerHandle]:
    ns, ns_addr = start_namesrv(tmp)
    broker = start_broker(tmp / "store", ns_addr, config)
    try:
        yield broker
    finally:
        broker.stop()
        ns.send_signal(signal.SIGTERM)
        ns.wait(10)
