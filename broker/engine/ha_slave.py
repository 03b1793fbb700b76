"""A slave's side of replication (Apache 4.x ``HAService.HAClient``), a thread of the store process.

It connects to the master's HA address, reports its max commitlog offset, and appends every transfer
byte for byte where the master says (:meth:`MessageStore.append_replica`); the store's own dispatcher
then builds the consume queues and the index from those records, and its checkpoint runs as usual.
A transfer for any offset but the slave's end (once it holds anything), bytes that break the format,
``haHousekeepingInterval`` of silence or a closed socket drop the connection; the client reconnects
(to the newest master address it was given) after :data:`RECONNECT_S`. The wire format is
:mod:`broker.engine.ha_frames`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

from broker.engine.ha_frames import (
    TRANSFER_HEADER,
    TRANSFER_HEADER_SIZE,
    HAFrameError,
    TransferReader,
    encode_offset_report,
    wait_readable,
)
from broker.engine.message_store import MessageStore, ReplicaError, StoreError
from broker.store.commitlog import CommitLog, list_segments
from broker.store.constants import COMMITLOG_DIR

log = logging.getLogger(__name__)

# Apache waits 5 s before trying a master again; one second keeps a restarted pair quick to resume
RECONNECT_S = 1.0
CONNECT_TIMEOUT_S = 3.0
POLL_S = 0.5
RECV_BYTES = 1 << 20
BEHIND_RETRY_S = 30.0  # a master whose log ends before ours will not change its mind soon


class MasterBehind(ReplicaError):
    """The master's log ends before this slave's: only a restart (which cuts the log back) helps."""


def parse_host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"HA master address {addr!r} is not host:port")
    return host, int(port)


def probe_master_end(addr: str, slave_end: int, timeout_s: float = CONNECT_TIMEOUT_S) -> int | None:
    """At a slave's start, before its store opens: report ``slave_end`` to the master and read its
    first header. A heartbeat at a lower offset means the master's log ends there (a rocketlake
    master answers a slave that is ahead so; an Apache master never does): that offset is returned.
    None when the master agrees, is unreachable or answers otherwise."""
    try:
        with socket.create_connection(parse_host_port(addr), timeout=timeout_s) as sock:
            sock.sendall(encode_offset_report(slave_end))
            header = b""
            while len(header) < TRANSFER_HEADER_SIZE:
                chunk = sock.recv(TRANSFER_HEADER_SIZE - len(header))
                if not chunk:
                    return None
                header += chunk
    except (OSError, ValueError) as exc:
        log.info("HA master %s not reachable to compare logs (%s)", addr, exc)
        return None
    offset, size = TRANSFER_HEADER.unpack(header)
    return offset if size == 0 and 0 <= offset < slave_end else None


def truncate_commitlog(store_dir: str | Path, segment_bytes: int, offset: int) -> int:
    """Cut a (closed) store's commitlog back to ``offset``: later files deleted, the rest of the file
    holding it zeroed (``truncateDirtyFiles``). The store's recovery then trims consume queue units
    and index ends past it (``truncateDirtyLogicFiles``). Returns the bytes cut."""
    cut = 0
    for seg in list_segments(Path(store_dir) / COMMITLOG_DIR, segment_bytes):
        if seg.base >= offset:
            cut += seg.size
            seg.path.unlink()
        elif seg.base + segment_bytes > offset:
            start = offset - seg.base
            with open(seg.path, "r+b") as fh:
                fh.seek(start)
                remaining = max(seg.size - start, 0)
                cut += remaining
                while remaining:
                    n = min(remaining, 1 << 20)
                    fh.write(bytes(n))
                    remaining -= n
                fh.flush()
                os.fsync(fh.fileno())
    return cut


def truncate_ahead_of_master(store_dir: str | Path, segment_bytes: int, master_addr: str | None,
                             cut_back: bool = True) -> int | None:
    """A slave whose log is ahead of its master's (the master lost its tail) cuts it back before
    opening, so the two logs are one history again; returns the new end, or None if nothing was cut.

    Only with ``cut_back`` (``haSlaveCutBackToMaster``): the records past the master's end may be the
    only copy of acknowledged messages (a SYNC_MASTER acknowledged them once this slave had them), so
    by default they are kept and the slave says which range only it holds; it then does not follow
    (its HA client finds the master behind and retries), and nothing is deleted without an operator."""
    if not master_addr:
        return None
    log_ = CommitLog.open(store_dir, segment_bytes)
    if not log_.segments:
        return None
    end = log_.data_end()
    master_end = probe_master_end(master_addr, end)
    if master_end is None:
        return None
    if not cut_back:
        log.error("slave commitlog ends at %d, past its master's end %d: commitlog offsets [%d, %d) are held by "
                  "this slave only; it keeps them and does not follow (copy them to the master or promote this "
                  "slave; haSlaveCutBackToMaster=true cuts them off instead)", end, master_end, master_end, end)
        return None
    cut = truncate_commitlog(store_dir, segment_bytes, master_end)
    log.warning("slave commitlog ended at %d, past its master's end %d: cut back to it (%d bytes)",
                end, master_end, cut)
    return master_end


class HAClient:
    """Replicates a master's commitlog into ``store`` while running (``start``/``stop``)."""

    def __init__(self, store: MessageStore, master_addr: str | None, *, heartbeat_ms: int,
                 housekeeping_ms: int) -> None:
        self.store = store
        self._addr = master_addr or None
        self.heartbeat_s = heartbeat_ms / 1000
        self.housekeeping_s = housekeeping_ms / 1000
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sock: socket.socket | None = None
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ha-client", daemon=True)

    @property
    def master_addr(self) -> str | None:
        return self._addr

    def update_master_address(self, addr: str) -> None:
        """``updateHaMasterAddress``: the address to use from the next connection on."""
        if addr and addr != self._addr:
            log.info("HA master address: %s -> %s", self._addr, addr)
            self._addr = addr
            self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            addr = self._addr
            if addr is None:
                self._wake.wait(RECONNECT_S)
                self._wake.clear()
                continue
            pause = RECONNECT_S
            try:
                self._session(addr)
            except MasterBehind as exc:
                log.error("HA link to master %s: %s", addr, exc)
                pause = BEHIND_RETRY_S
            except (OSError, ValueError, HAFrameError, StoreError) as exc:
                if not self._stop.is_set():
                    log.warning("HA link to master %s: %s; reconnecting in %.0f s", addr, exc, RECONNECT_S)
            finally:
                self.connected.clear()
            self._wake.wait(pause)
            self._wake.clear()

    def _session(self, addr: str) -> None:
        """One connection: report, then append what arrives until an error or a stop."""
        sock = socket.create_connection(parse_host_port(addr), timeout=CONNECT_TIMEOUT_S)
        self._sock = sock
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.housekeeping_s)
            reported = self.store.replica_end
            sock.sendall(encode_offset_report(reported))
            last_report = last_read = time.monotonic()
            self.connected.set()
            log.info("HA link to master %s up; slave commitlog ends at %d", addr, reported)
            frames = TransferReader()
            while not self._stop.is_set():
                ready = wait_readable(sock, POLL_S)
                now = time.monotonic()
                if ready:
                    data = sock.recv(RECV_BYTES)
                    if not data:
                        raise ConnectionError("the master closed the connection")
                    last_read = now
                    for transfer in frames.feed(data):
                        mine = self.store.replica_end
                        if transfer.is_heartbeat and transfer.offset < mine:
                            raise MasterBehind(f"the master's log ends at {transfer.offset}, before this slave's "
                                               f"end {mine}: restart the slave to cut its log back "
                                               f"(haSlaveCutBackToMaster=true) or copy the range to the master")
                        if mine != 0 and transfer.offset != mine:  # HAClient.dispatchReadRequest
                            raise ReplicaError(f"master sent offset {transfer.offset}, slave's log ends at {mine}")
                        if transfer.body:
                            self.store.append_replica(transfer.offset, transfer.body)
                    end = self.store.replica_end
                    if end > reported:  # reportSlaveMaxOffsetPlus: acknowledge at once
                        sock.sendall(encode_offset_report(end))
                        reported, last_report = end, now
                if now - last_report > self.heartbeat_s:
                    sock.sendall(encode_offset_report(reported))
                    last_report = now
                if now - last_read > self.housekeeping_s:
                    raise ConnectionError(f"master silent for {self.housekeeping_s:.0f} s (haHousekeepingInterval)")
        finally:
            self._sock = None
            sock.close()
