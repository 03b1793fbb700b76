"""A master's side of replication (Apache 4.x ``HAService`` + ``HAConnection``), threads of the store process.

Why threads of the store process: the bytes a slave may get end at the store's *committed end*
(nothing still being written), which lives in this process's memory and moves under its put lock; a
SYNC_MASTER send must also wait here, in the put path, for the slave's acknowledgement. In this
process both are a function call and a condition variable; another process would need the end
published over shared memory and each acknowledgement sent back over IPC, for no gain: the transfer
itself is ``pread`` + ``sendall``, which release the GIL.

Per slave connection (:class:`SlaveLink`) one thread reads the slave's offset reports (its first one
says where to start; every one acknowledges bytes for SYNC_MASTER sends) and one thread streams
commitlog bytes from the mapped files (:meth:`MessageStore.read_committed`) in batches of at most
``haTransferBatchSize``, with a heartbeat when idle. The wire format is :mod:`broker.engine.ha_frames`.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from broker.engine.ha_frames import (HAFrameError, OffsetReportReader, encode_heartbeat, encode_transfer_header,
                                     wait_readable)
from broker.engine.message_store import MessageStore, PutStatus, StoreError

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often blocked threads look at their stop flag
IDLE_WAIT_S = 0.1  # a writer with nothing to send waits this long for an append (WriteSocketService)


class HAMaster:
    """Accepts slaves on ``host:port`` and tracks how far they have acknowledged (push2SlaveMaxOffset)."""

    def __init__(self, store: MessageStore, host: str, port: int, *, batch_bytes: int, heartbeat_ms: int,
                 housekeeping_ms: int, fallbehind_max: int, sync_timeout_ms: int) -> None:
        self.store = store
        self.host, self.port = host, port
        self.batch_bytes = batch_bytes
        self.heartbeat_s = heartbeat_ms / 1000
        self.housekeeping_s = housekeeping_ms / 1000
        self.fallbehind_max = fallbehind_max
        self.sync_timeout_s = sync_timeout_ms / 1000
        self._links: set[SlaveLink] = set()
        self._lock = threading.Lock()
        self._acked = threading.Condition()  # guards push2slave, notified on each acknowledgement
        self.push2slave = 0
        self._appended = threading.Condition()  # writers wait here for new commitlog bytes
        self._stop = threading.Event()
        self._server: socket.socket | None = None
        self.listening = False
        self._thread = threading.Thread(target=self._accept, name="ha-accept", daemon=True)

    # ---- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((self.host, self.port))
        except OSError as exc:
            server.close()
            raise OSError(f"cannot listen for slaves on {self.host}:{self.port} (haListenPort): {exc}") from exc
        server.listen(16)
        server.settimeout(POLL_S)
        self._server = server
        self.listening = True
        self.store.add_commit_watcher(self._on_commit)
        self._thread.start()
        log.info("HA master listening for slaves on %s:%d", self.host, self.port)

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            try:  # wakes the accept below at once (closing alone leaves it blocked until its timeout)
                self._server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._server.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        with self._appended:
            self._appended.notify_all()
        with self._acked:
            self._acked.notify_all()
        if self._thread.is_alive():
            self._thread.join(5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                if not self._stop.is_set():
                    log.exception("HA accept failed")
                return
            log.info("HA master: slave connected from %s:%d", *peer[:2])
            link = SlaveLink(self, conn, f"{peer[0]}:{peer[1]}")
            with self._lock:
                self._links.add(link)
            link.start()

    def _gone(self, link: "SlaveLink") -> None:
        with self._lock:
            self._links.discard(link)

    # ---- state ---------------------------------------------------------------------------------------
    @property
    def connection_count(self) -> int:
        with self._lock:
            return len(self._links)

    def _on_commit(self, end: int) -> None:
        with self._appended:
            self._appended.notify_all()

    def wait_for_append(self, timeout: float) -> None:
        with self._appended:
            self._appended.wait(timeout)

    def acknowledged(self, offset: int) -> None:
        """A slave holds the commitlog up to ``offset`` (``notifyTransferSome``): it never goes back."""
        with self._acked:
            if offset > self.push2slave:
                self.push2slave = offset
                self._acked.notify_all()

    def is_slave_ok(self, end: int) -> bool:
        """``HAService.isSlaveOK``: a slave is connected and less than ``haSlaveFallbehindMax`` behind ``end``."""
        return self.connection_count > 0 and end - self.push2slave < self.fallbehind_max

    def replica_status(self, end: int) -> PutStatus:
        """A SYNC_MASTER put's wait (``handleHA`` + ``GroupTransferService``): PUT_OK once a slave
        acknowledged ``end``; SLAVE_NOT_AVAILABLE at once when no slave is fit to wait for;
        FLUSH_SLAVE_TIMEOUT when none acknowledged within ``syncFlushTimeout``."""
        if not self.is_slave_ok(end):
            return PutStatus.SLAVE_NOT_AVAILABLE
        with self._acked:
            ok = self._acked.wait_for(lambda: self.push2slave >= end or self._stop.is_set(), self.sync_timeout_s)
        if ok and self.push2slave >= end:
            return PutStatus.PUT_OK
        log.warning("transfer of commitlog up to %d to the slave timed out", end)
        return PutStatus.FLUSH_SLAVE_TIMEOUT


class SlaveLink:
    """One slave's connection: a reader of offset reports and a writer of commitlog bytes."""

    def __init__(self, master: HAMaster, sock: socket.socket, peer: str) -> None:
        self.master = master
        self.sock = sock
        self.peer = peer
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(master.housekeeping_s)  # a send blocked that long: the slave is gone
        self.request_offset: int | None = None  # the slave's first report: where to start
        self.acked = 0
        self._closed = threading.Event()
        self._started = threading.Event()  # the first report arrived

    def start(self) -> None:
        threading.Thread(target=self._read, name=f"ha-read-{self.peer}", daemon=True).start()
        threading.Thread(target=self._write, name=f"ha-write-{self.peer}", daemon=True).start()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
            self.master._gone(self)
            log.info("HA master: slave %s disconnected (acknowledged %d)", self.peer, self.acked)

    def _read(self) -> None:
        """ReadSocketService: offset reports; the link is dropped after ``haHousekeepingInterval`` of silence."""
        reports = OffsetReportReader()
        last_read = time.monotonic()
        try:
            while not self._closed.is_set():
                if not wait_readable(self.sock, POLL_S):
                    if time.monotonic() - last_read > self.master.housekeeping_s:
                        log.warning("HA master: slave %s silent for %.0f s; dropping it", self.peer,
                                    self.master.housekeeping_s)
                        return
                    continue
                data = self.sock.recv(4096)
                if not data:
                    return
                last_read = time.monotonic()
                offset = reports.feed(data)
                if offset is None:
                    continue
                self.acked = offset
                if self.request_offset is None:
                    self.request_offset = offset
                    self._started.set()
                self.master.acknowledged(offset)
        except (OSError, ValueError, HAFrameError) as exc:
            if not self._closed.is_set():
                log.warning("HA master: reading from slave %s failed: %s", self.peer, exc)
        finally:
            self.close()

    def _start_offset(self) -> int:
        """Where the stream starts: the slave's offset, or for an empty slave the first byte of the
        newest commitlog file (WriteSocketService: a new slave does not get the whole history)."""
        if self.request_offset:
            return self.request_offset
        end = self.master.store.commitlog_max_offset
        return max(end - end % self.master.store.settings.segment_bytes, self.master.store.commitlog_min_offset)

    def _write(self) -> None:
        """WriteSocketService: stream committed bytes from the slave's offset; heartbeat when idle."""
        master = self.master
        try:
            while not self._started.wait(POLL_S):
                if self._closed.is_set():
                    return
            offset = self._start_offset()
            end = master.store.commitlog_max_offset
            if offset > end:
                # Apache would wait at the slave's offset and later stream bytes of another history
                # into it; we tell the slave where this log ends (a heartbeat there) and stop: a
                # rocketlake slave cuts its log back to that offset at its next start
                log.error("HA master: slave %s reports offset %d, past this log's end %d; it must be "
                          "truncated (a rocketlake slave does so when it starts)", self.peer, offset, end)
                self.sock.sendall(encode_heartbeat(end))
                return
            log.info("HA master: streaming to slave %s from commitlog offset %d", self.peer, offset)
            last_write = 0.0
            while not self._closed.is_set() and not master._stop.is_set():
                data = master.store.read_committed(offset, master.batch_bytes)
                if data:
                    self.sock.sendall(encode_transfer_header(offset, len(data)))
                    self.sock.sendall(data)
                    offset += len(data)
                    last_write = time.monotonic()
                    continue
                if time.monotonic() - last_write > master.heartbeat_s:
                    self.sock.sendall(encode_heartbeat(offset))
                    last_write = time.monotonic()
                master.wait_for_append(IDLE_WAIT_S)
        except (OSError, StoreError) as exc:
            if not self._closed.is_set():
                log.warning("HA master: streaming to slave %s failed: %s", self.peer, exc)
        finally:
            self.close()
