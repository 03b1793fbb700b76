"""The broker's supervisor: starts its processes, forwards SIGTERM/SIGINT, and stops them in order.

Process layout (see the README's architecture section for the reasons):

* **supervisor** (the ``rocketlake broker start`` process, this module): starts the others and
  stops them in order: network first (no new requests), then the store (flush, checkpoint,
  remove ``abort``).
* **store process** (:mod:`broker.server.broker`): the store, the request layer, replication.
* **dispatcher process** (started by the store process, :mod:`broker.server.dispatch_process`).
* **network processes** (``requestProcesses``, default = cores; :mod:`broker.server.network_process`).

Every child is spawned, so each imports only what its target's module imports: the supervisor and
the network processes never import the storage engine; the store process's and the network
processes' entry points are reached through :func:`_store_main` and :func:`_network_main`, so that
this module imports neither. The network processes start together with the store process and wait
for it, which overlaps their start-ups; each process that stopped cleanly ends without the
interpreter's teardown (:func:`~broker.server.linux_process.exit_without_teardown`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from broker.remoting.tls import ServerTls, client_context
from broker.server.linux_process import exit_without_teardown, terminate_when_orphaned
from broker.server.settings import BrokerSettings

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0


def _store_main(*args) -> None:
    """The store process's target (imported in the child only)."""
    from broker.server.broker import store_process_main

    store_process_main(*args)
    exit_without_teardown()


def _network_main(*args) -> None:
    """A network process's target (imported in the child only: the supervisor would import the
    network side just to start it, on the start-up's critical path)."""
    from broker.server.network_process import network_process_main

    network_process_main(*args)


@dataclass
@dataclass
class BrokerProcesses:
    store: mp.Process
    network: list[mp.Process]
    socket_dir: str


class Broker:
    """Starts and stops one broker (store process + network processes)."""

    def __init__(self, settings: BrokerSettings, store_dir: str | os.PathLike, log_level: int = logging.WARNING,
                 config_path: str | os.PathLike | None = None) -> None:
        self.settings = settings
        # UPDATE_BROKER_CONFIG writes runtime changes back here (absolute: the store process may chdir)
        self.config_path = str(Path(config_path).resolve()) if config_path is not None else None
        self.store_dir = str(Path(store_dir).resolve())
        # the ACL file is found and checked now: a missing or broken one stops the start with its error
        self.acl_path: str | None = None
        if settings.acl_enable:
            from broker.acl.config import acl_file_location, load_rules

            self.acl_path = str(acl_file_location(settings.acl_file_path, self.config_path))
            load_rules(self.acl_path)
        self.log_level = log_level
        self.procs: BrokerProcesses | None = None
        self._ctx = mp.get_context("spawn")

    def start(self) -> None:
        """Start every process; TlsConfigError (naming the setting and file) before any starts when
        TLS is on (tlsMode, useTLS) and a certificate or key it needs cannot be loaded."""
        ServerTls(self.settings.server_tls())
        client_tls = self.settings.client_tls()
        if client_tls is not None:
            client_context(client_tls)
        Path(self.store_dir).mkdir(parents=True, exist_ok=True)
        sock_dir = tempfile.mkdtemp(prefix="rocketlake-broker-")
        socket_path = os.path.join(sock_dir, "store.sock")
        store_ready = self._ctx.Event()
        store = self._ctx.Process(target=_store_main, name="rocketlake-store",
                                  args=(self.settings, self.store_dir, socket_path, store_ready, self.log_level,
                                        self.config_path))
        store.start()
        self.procs = BrokerProcesses(store, [], sock_dir)
        # the network processes start with the store process, so that their start-ups (imports,
        # mostly) overlap its own; each connects to the store and listens once store_ready is set
        waits = []
        for i in range(self.settings.request_processes):
            net_ready = self._ctx.Event()
            proc = self._ctx.Process(target=_network_main, name=f"rocketlake-net-{i}",
                                     args=(self.settings, socket_path, store_ready, net_ready, self.log_level, i,
                                           self.acl_path))
            proc.start()
            self.procs.network.append(proc)
            waits.append((net_ready, proc, f"network process {i}"))
        self._wait(store_ready, store, "store process")
        for net_ready, proc, what in waits:
            self._wait(net_ready, proc, what)
        log.info("broker %s listening on %s:%d (%d network processes)", self.settings.broker_name,
                 self.settings.listen_host, self.settings.listen_port, len(self.procs.network))

    def _wait(self, ready, proc: mp.Process, what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.wait(0.1):
            if not proc.is_alive():
                self.stop()
                raise RuntimeError(f"{what} exited with code {proc.exitcode} during start-up (see its log)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{what} did not start within {READY_TIMEOUT_S:.0f} s")

    @property
    def pids(self) -> list[int]:
        if self.procs is None:
            return []
        return [p.pid for p in [self.procs.store, *self.procs.network] if p.pid]

    def alive(self) -> bool:
        return self.procs is not None and self.procs.store.is_alive() and all(p.is_alive() for p in self.procs.network)

    def stop(self, timeout: float = 30.0) -> None:
        """Clean shutdown: network processes first, then the store (flush, checkpoint, no abort)."""
        if self.procs is None:
            return
        for proc in self.procs.network:
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs.network:
            proc.join(timeout)
        if self.procs.store.is_alive():
            self.procs.store.terminate()
            self.procs.store.join(timeout)
        for proc in [*self.procs.network, self.procs.store]:
            if proc.is_alive():
                log.error("%s did not stop in %.0f s; killing it", proc.name, timeout)
                proc.kill()
                proc.join()
        shutil.rmtree(self.procs.socket_dir, ignore_errors=True)
        self.procs = None

    def kill(self) -> None:
        """``kill -9`` every process at once (crash tests)."""
        if self.procs is None:
            return
        for proc in [self.procs.store, *self.procs.network]:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
        for proc in [self.procs.store, *self.procs.network]:
            proc.join()
        shutil.rmtree(self.procs.socket_dir, ignore_errors=True)
        self.procs = None

    def __enter__(self) -> "Broker":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_broker(settings: BrokerSettings, store_dir: str, log_level: int = logging.WARNING,
               config_path: str | os.PathLike | None = None, stop_with_parent: bool = False) -> int:
    """Foreground broker for the CLI: runs until SIGTERM/SIGINT, then stops cleanly
    (``stop_with_parent``: also once the process that started it is gone)."""
    broker = Broker(settings, store_dir, log_level, config_path)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if stop_with_parent:
        terminate_when_orphaned()
    broker.start()
    print(f"broker {settings.broker_name} listening on {settings.listen_host}:{settings.listen_port}, "
          f"store {store_dir}", flush=True)
    try:
        while not stop.wait(1.0):
            if not broker.alive():
                log.error("a broker process died; stopping the broker")
                broker.stop()
                return 1
    finally:
        broker.stop()
    return 0
