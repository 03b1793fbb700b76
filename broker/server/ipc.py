"""The link between the network processes and the store process: pickled frames over a Unix socket.

Frames are a 4-byte big-endian length and a pickled tuple ``(kind, id, payload)``:

* network → store: ``("hello", 0, pid)`` once (which network process this link is),
  ``("req", id, Request)``, ``("closed", 0, channel)`` and ``("callrep", call_id, outcome)``;
* store → network: ``("rep", id, Reply)`` and ``("event", 0, event)`` where an event is
  ``("grew", [(topic, queue_id, max_offset), …])`` (for long polling),
  ``("notify", group, channels)`` (NOTIFY_CONSUMER_IDS_CHANGED to send) or, to one network process
  only, ``("call", call_id, serial, ClientRequest)`` (a request for one of its client connections,
  answered by ``callrep``; see :mod:`broker.server.client_calls`).

A handler may answer with a :class:`concurrent.futures.Future` of its reply (a reply that waits for
a client): the reply frame is sent when the future completes, and no pool thread waits for it.

Only processes of one broker talk over this socket (it lives in a private temporary directory), so
pickle is safe here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import queue
import socket
import struct
import threading
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
MAX_IPC_FRAME = 64 * 1024 * 1024


def pack(kind: str, ident: int, payload: Any) -> bytes:
    data = pickle.dumps((kind, ident, payload), protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


class IpcServer:
    """Store side: one reader thread per network process, requests run on a thread pool.

    ``handle(kind, payload)`` returns the reply payload for ``req`` frames; ``closed`` frames are
    passed to ``on_closed``. ``broadcast`` sends an event to every connected network process.
    """

    def __init__(self, path: str, handle: Callable[[Any], Any], on_closed: Callable[[Any], None],
                 workers: int = 16, *, lane: Callable[[Any], bool] | None = None,
                 handle_batch: Callable[[list[Any]], list[Any]] | None = None, max_batch: int = 512,
                 on_call_reply: Callable[[int, Any], None] | None = None,
                 on_process_gone: Callable[[int], None] | None = None) -> None:
        self.path = path
        self._handle = handle
        self._on_closed = on_closed
        self._on_call_reply = on_call_reply
        self._on_process_gone = on_process_gone
        self._by_pid: dict[int, tuple[socket.socket, threading.Lock]] = {}
        # The lane: requests ``lane(payload)`` selects (sends) queue up for one thread that hands
        # everything waiting to ``handle_batch`` at once — one lock, one write, one fsync per group.
        self._lane = lane if handle_batch is not None else None
        self._handle_batch = handle_batch
        self._max_batch = max_batch
        self._lane_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lane_thread = threading.Thread(target=self._lane_loop, name="ipc-lane", daemon=True)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="broker-core")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(64)
        self._conns: list[tuple[socket.socket, threading.Lock]] = []
        self._conns_lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._accept_loop, name="ipc-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if self._lane is not None:
            self._lane_thread.start()

    def _lane_loop(self) -> None:
        while True:
            first = self._lane_queue.get()
            if first is None:
                return
            items = [first]
            while len(items) < self._max_batch:
                try:
                    item = self._lane_queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._lane_queue.put(None)
                    break
                items.append(item)
            try:
                replies = self._handle_batch([payload for _, _, _, payload in items])
            except Exception as exc:  # the batch handler answers errors itself; this is a last resort
                log.exception("batch of %d requests failed", len(items))
                replies = [exc] * len(items)
            # one write per network process for the whole batch (its replies are consecutive frames)
            out: dict[int, tuple[socket.socket, threading.Lock, list[bytes]]] = {}
            for (conn, lock, ident, _), reply in zip(items, replies):
                out.setdefault(id(conn), (conn, lock, []))[2].append(pack("rep", ident, reply))
            for conn, lock, frames in out.values():
                self._send(conn, lock, b"".join(frames))

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            lock = threading.Lock()
            with self._conns_lock:
                self._conns.append((conn, lock))
            threading.Thread(target=self._read_loop, args=(conn, lock), name="ipc-read", daemon=True).start()

    def _send(self, conn: socket.socket, lock: threading.Lock, frame: bytes) -> None:
        try:
            with lock:
                conn.sendall(frame)
        except OSError:
            pass  # the network process is gone; its reader thread cleans up

    def _read_loop(self, conn: socket.socket, lock: threading.Lock) -> None:
        pid: int | None = None
        # buffered: frames that arrived together (a network process writes many at once) are taken
        # from one recv instead of two system calls each
        stream = conn.makefile("rb", buffering=1 << 20)
        try:
            while True:
                head = stream.read(4)
                if len(head) < 4:
                    return
                (size,) = _LEN.unpack(head)
                if size > MAX_IPC_FRAME:
                    log.error("IPC frame of %d bytes refused", size)
                    return
                data = stream.read(size)
                if len(data) < size:
                    return
                kind, ident, payload = pickle.loads(data)
                if kind == "req":
                    if self._lane is not None and self._lane(payload):
                        self._lane_queue.put((conn, lock, ident, payload))
                    else:
                        self._pool.submit(self._run, conn, lock, ident, payload)
                elif kind == "closed":
                    self._pool.submit(self._on_closed, payload)
                elif kind == "hello":
                    pid = int(payload)
                    with self._conns_lock:
                        self._by_pid[pid] = (conn, lock)
                elif kind == "callrep" and self._on_call_reply is not None:
                    self._pool.submit(self._on_call_reply, ident, payload)  # its callbacks build and send replies
        except OSError:
            return
        finally:
            stream.close()
            with self._conns_lock:
                self._conns = [(c, lk) for c, lk in self._conns if c is not conn]
                if pid is not None and self._by_pid.get(pid, (None,))[0] is conn:
                    del self._by_pid[pid]
            conn.close()
            if pid is not None and self._on_process_gone is not None:
                self._on_process_gone(pid)

    def _run(self, conn: socket.socket, lock: threading.Lock, ident: int, payload: Any) -> None:
        reply = self._handle(payload)
        if isinstance(reply, Future):  # answered when a client has answered
            reply.add_done_callback(lambda done: self._send(conn, lock, pack("rep", ident, done.result())))
            return
        self._send(conn, lock, pack("rep", ident, reply))

    def queue_sizes(self) -> dict[str, int]:
        """Requests waiting in the store process: sends for the lane, the others for a pool thread
        (GET_BROKER_RUNTIME_INFO's send/pull/query thread-pool queue sizes). The executor's own
        queue is read so that the request path counts nothing."""
        work = getattr(self._pool, "_work_queue", None)
        return {"send": self._lane_queue.qsize(), "other": work.qsize() if work is not None else 0}

    def send_to(self, pid: int, event: Any) -> bool:
        """Send an event to one network process; False when no process with that pid is connected."""
        with self._conns_lock:
            target = self._by_pid.get(pid)
        if target is None:
            return False
        self._send(target[0], target[1], pack("event", 0, event))
        return True

    def broadcast(self, event: Any) -> None:
        frame = pack("event", 0, event)
        with self._conns_lock:
            conns = list(self._conns)
        for conn, lock in conns:
            self._send(conn, lock, frame)

    def close(self) -> None:
        self._stopping = True
        try:
            self._sock.close()
        except OSError:
            pass
        with self._conns_lock:
            for conn, _ in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._lane_queue.put(None)
        self._pool.shutdown(wait=True, cancel_futures=False)


class IpcClient(asyncio.Protocol):
    """Network-process side (asyncio): ``await call(request)`` → reply; events go to ``on_event``.

    Frames written during one turn of the event loop leave in one ``write`` at its end (the
    requests of many client connections, decoded from one read each, travel together), and the
    reply frames are cut from the read buffer here rather than through two awaited reads each:
    this process is on the send path of every message."""

    def __init__(self, path: str, on_event: Callable[[Any], None]) -> None:
        self.path = path
        self._on_event = on_event
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._buf = bytearray()
        self.closed = asyncio.Event()

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: self, self.path)
        self._write(pack("hello", 0, os.getpid()))  # channels are (pid, serial): calls find us by pid

    # ---- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if end - pos - 4 < size:
                break
            kind, ident, payload = pickle.loads(buf[pos + 4:pos + 4 + size])
            pos += 4 + size
            if kind == "rep":
                fut = self._pending.pop(ident, None)
                if fut is not None and not fut.done():
                    fut.set_result(payload)
            elif kind == "event":
                try:
                    self._on_event(payload)
                except Exception:
                    log.exception("IPC event handler failed")
        del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("store process is gone"))
        self._pending.clear()

    # ---- writing -------------------------------------------------------------------------------
    def _write(self, frame: bytes) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(frame)

    def _flush(self) -> None:
        frames, self._out = self._out, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(frames))

    async def call(self, payload: Any) -> Any:
        if self._transport is None or self.closed.is_set():
            raise ConnectionError("store process is gone")
        ident = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[ident] = fut
        self._write(pack("req", ident, payload))
        return await fut

    def send_call_reply(self, call_id: int, outcome: Any) -> None:
        """The outcome of a ``call`` event (a request the store process made to one of our clients)."""
        if self._transport is not None and not self.closed.is_set():
            self._write(pack("callrep", call_id, outcome))

    def notify_closed(self, channel: Any) -> None:
        if self._transport is not None and not self.closed.is_set():
            self._write(pack("closed", 0, channel))

    async def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()
