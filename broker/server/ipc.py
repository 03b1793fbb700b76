"""The link between the network processes and the store process: pickled frames over a Unix socket.

Frames are a 4-byte big-endian length and a pickled *list* of messages ``(kind, id, payload)``:
everything one side has to say in one turn of its loop (the requests of many client connections,
the replies of one stored batch) is one ``pickle.dumps`` and one ``pickle.loads`` — pickling per
message was a large part of the CPU per message of both processes. Messages:

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
import selectors
import socket
import struct
import threading
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
MAX_IPC_FRAME = 64 * 1024 * 1024
READ_CHUNK = 1 << 20  # the most the store's I/O thread reads from one link at once


def pack(kind: str, ident: int, payload: Any) -> bytes:
    """One frame holding one message."""
    return pack_many([(kind, ident, payload)])


def pack_many(messages: list[tuple[str, int, Any]]) -> bytes:
    """One frame holding ``messages`` (raises what ``pickle.dumps`` raises)."""
    data = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


def pack_each(messages: list[tuple[str, int, Any]],
              refused: Callable[[tuple[str, int, Any], Exception], tuple[str, int, Any] | None]) -> bytes:
    """Frames for ``messages``: one frame for all of them, or — when one of them cannot be pickled —
    one frame per message, so that one bad payload does not lose the others. A message that cannot
    be pickled goes to ``refused(message, error)``, which may return a message to send instead."""
    try:
        return pack_many(messages)
    except Exception:
        pass
    frames = []
    for message in messages:
        try:
            frames.append(pack_many([message]))
        except Exception as exc:
            instead = refused(message, exc)
            if instead is not None:
                frames.append(pack_many([instead]))
    return b"".join(frames)


def unpack_frames(buf: bytearray) -> tuple[list[tuple[str, int, Any]], int]:
    """The messages of every whole frame at the start of ``buf`` and how many bytes they took
    (raises ``ValueError`` for a frame longer than ``MAX_IPC_FRAME``)."""
    messages: list[tuple[str, int, Any]] = []
    pos, end = 0, len(buf)
    with memoryview(buf) as view:  # released on return, whatever happens: the caller resizes buf
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(view, pos)
            if size > MAX_IPC_FRAME:
                raise ValueError(f"IPC frame of {size} bytes refused")
            if end - pos - 4 < size:
                break
            with view[pos + 4:pos + 4 + size] as frame:
                messages += pickle.loads(frame)
            pos += 4 + size
    return messages, pos


class IpcServer:
    """Store side: one I/O thread reads every network process's link; sends are stored on that
    thread, other requests run on a thread pool.

    ``handle(payload)`` returns the reply payload for ``req`` frames; ``closed`` frames are passed to
    ``on_closed``. ``broadcast`` sends an event to every connected network process.

    Why one I/O thread that also stores the sends (``lane(payload)`` selects them): everything read
    in one pass over the links — the sends of every network process that arrived meanwhile — goes to
    ``handle_batch`` at once (one lock, one write, one fsync per group), and no send is handed from
    thread to thread on its way (each hand-off is a GIL switch). While a batch is stored, the next
    one gathers in the socket buffers: group commit without a queue. Other requests (pulls, admin)
    may block; they go to the pool.
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
        self._lane = lane if handle_batch is not None else None
        self._handle_batch = handle_batch
        self._max_batch = max_batch
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="broker-core")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(64)
        self._conns: list[tuple[socket.socket, threading.Lock]] = []
        self._conns_lock = threading.Lock()
        self._stopping = False
        self._waiting_sends = 0  # read but not yet stored (GET_BROKER_RUNTIME_INFO's send queue size)
        self._selector = selectors.DefaultSelector()
        # every link is read into this one buffer (one I/O thread reads them all): ``recv(n)`` made
        # a new n-byte object per read, which malloc maps and unmaps at 1 MiB, and each munmap in
        # this many-threaded process is a TLB shoot-down to the other cores
        self._scratch = bytearray(READ_CHUNK)
        self._scratch_view = memoryview(self._scratch)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._io_loop, name="ipc-io", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ---- the I/O thread --------------------------------------------------------------------------
    def _io_loop(self) -> None:
        links: dict[socket.socket, _Link] = {}
        try:
            while not self._stopping:
                sends: list[tuple[_Link, int, Any]] = []
                for key, _ in self._selector.select():
                    sock = key.fileobj
                    if sock is self._sock:
                        self._accept(links)
                    elif sock is self._wake_r:
                        self._wake_r.recv(4096)
                    else:
                        link = links[sock]
                        if not self._read(link, sends):
                            self._drop(link, links)
                for i in range(0, len(sends), self._max_batch):
                    self._store(sends[i:i + self._max_batch])
        finally:
            for link in list(links.values()):
                self._drop(link, links)

    def _accept(self, links: dict[socket.socket, "_Link"]) -> None:
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        link = _Link(conn, threading.Lock())
        links[conn] = link
        with self._conns_lock:
            self._conns.append((conn, link.lock))
        self._selector.register(conn, selectors.EVENT_READ, None)

    def _read(self, link: "_Link", sends: list) -> bool:
        """Take what the link has (it is readable, so this does not block); False at its end."""
        try:
            got = link.sock.recv_into(self._scratch)
        except OSError:
            return False
        if not got:
            return False
        buf = link.buf
        buf += self._scratch_view[:got]
        try:
            messages, pos = unpack_frames(buf)
        except ValueError as exc:
            log.error("%s", exc)
            return False
        for kind, ident, payload in messages:
            if kind == "req":
                if self._lane is not None and self._lane(payload):
                    sends.append((link, ident, payload))
                    self._waiting_sends += 1
                else:
                    self._pool.submit(self._run, link.sock, link.lock, ident, payload)
            elif kind == "closed":
                self._pool.submit(self._on_closed, payload)
            elif kind == "hello":
                link.pid = int(payload)
                with self._conns_lock:
                    self._by_pid[link.pid] = (link.sock, link.lock)
            elif kind == "callrep" and self._on_call_reply is not None:
                self._pool.submit(self._on_call_reply, ident, payload)  # its callbacks build and send replies
        del buf[:pos]
        return True

    def _store(self, sends: list[tuple["_Link", int, Any]]) -> None:
        try:
            replies = self._handle_batch([payload for _, _, payload in sends])
        except Exception as exc:  # the batch handler answers errors itself; this is a last resort
            log.exception("batch of %d requests failed", len(sends))
            replies = [exc] * len(sends)
        self._waiting_sends -= len(sends)
        # one frame (one pickle, one write) per network process for the whole batch
        out: dict[int, tuple[_Link, list[tuple[str, int, Any]]]] = {}
        for (link, ident, _), reply in zip(sends, replies):
            out.setdefault(id(link), (link, []))[1].append(("rep", ident, reply))
        for link, messages in out.values():
            self._send(link.sock, link.lock, pack_each(messages, _refused_reply))

    def _drop(self, link: "_Link", links: dict[socket.socket, "_Link"]) -> None:
        links.pop(link.sock, None)
        try:
            self._selector.unregister(link.sock)
        except (KeyError, ValueError):
            pass
        with self._conns_lock:
            self._conns = [(c, lk) for c, lk in self._conns if c is not link.sock]
            if link.pid is not None and self._by_pid.get(link.pid, (None,))[0] is link.sock:
                del self._by_pid[link.pid]
        link.sock.close()
        if link.pid is not None and self._on_process_gone is not None:
            self._on_process_gone(link.pid)

    def _send(self, conn: socket.socket, lock: threading.Lock, frame: bytes) -> None:
        try:
            with lock:
                conn.sendall(frame)
        except OSError:
            pass  # the network process is gone; the I/O thread cleans up

    def _run(self, conn: socket.socket, lock: threading.Lock, ident: int, payload: Any) -> None:
        reply = self._handle(payload)
        if isinstance(reply, Future):  # answered when a client has answered
            reply.add_done_callback(
                lambda done: self._send(conn, lock, pack_each([("rep", ident, done.result())], _refused_reply)))
            return
        self._send(conn, lock, pack_each([("rep", ident, reply)], _refused_reply))

    def queue_sizes(self) -> dict[str, int]:
        """Requests waiting in the store process: sends read but not stored yet, the others for a
        pool thread (GET_BROKER_RUNTIME_INFO's send/pull/query thread-pool queue sizes). The
        executor's own queue is read so that the request path counts nothing."""
        work = getattr(self._pool, "_work_queue", None)
        return {"send": max(0, self._waiting_sends), "other": work.qsize() if work is not None else 0}

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
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(10)
        for sock in (self._sock, self._wake_r, self._wake_w):
            try:
                sock.close()
            except OSError:
                pass
        self._selector.close()
        self._pool.shutdown(wait=True, cancel_futures=False)


@dataclass(eq=False)
class _Link:
    """One network process's connection as the I/O thread sees it."""

    sock: socket.socket
    lock: threading.Lock  # writers: the I/O thread, pool threads, broadcasts
    buf: bytearray = field(default_factory=bytearray)
    pid: int | None = None


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
        self._pending: dict[int, asyncio.Future | Callable[[Any], None]] = {}
        self._transport: asyncio.Transport | None = None
        self._out: list[tuple[str, int, Any]] = []
        self._buf = bytearray()
        self.closed = asyncio.Event()

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: self, self.path)
        self._write(("hello", 0, os.getpid()))  # channels are (pid, serial): calls find us by pid

    # ---- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        messages, pos = unpack_frames(buf)
        del buf[:pos]
        for kind, ident, payload in messages:
            if kind == "rep":
                waiter = self._pending.pop(ident, None)
                if waiter is not None:
                    _settle(waiter, payload, failed=False)
            elif kind == "event":
                try:
                    self._on_event(payload)
                except Exception:
                    log.exception("IPC event handler failed")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()
        waiters, self._pending = self._pending, {}
        for waiter in waiters.values():
            _settle(waiter, ConnectionError("store process is gone"), failed=True)

    # ---- writing -------------------------------------------------------------------------------
    def _write(self, message: tuple[str, int, Any]) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(message)

    def _flush(self) -> None:
        messages, self._out = self._out, []
        if messages and self._transport is not None and not self._transport.is_closing():
            self._transport.write(pack_each(messages, self._refused))

    def _refused(self, message: tuple[str, int, Any], error: Exception) -> None:  # sends nothing instead
        """A request that cannot be pickled fails alone: its caller gets the pickling error."""
        kind, ident, _ = message
        log.error("IPC %s message %d not sent: %r", kind, ident, error)
        if kind != "req":
            return
        waiter = self._pending.pop(ident, None)
        if waiter is not None:
            _settle(waiter, error, failed=True)

    async def call(self, payload: Any) -> Any:
        if self._transport is None or self.closed.is_set():
            raise ConnectionError("store process is gone")
        ident = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[ident] = fut
        self._write(("req", ident, payload))
        return await fut

    def submit(self, payload: Any, callback: Callable[[Any], None]) -> None:
        """``call`` without a future: ``callback(reply)`` runs as soon as the reply is read, or
        ``callback(ConnectionError)`` when the store process is gone (the send path: no task and
        no future per message). A payload that cannot be pickled gives ``callback(error)``."""
        if self._transport is None or self.closed.is_set():
            callback(ConnectionError("store process is gone"))
            return
        ident = next(self._ids)
        self._pending[ident] = callback
        self._write(("req", ident, payload))

    def send_call_reply(self, call_id: int, outcome: Any) -> None:
        """The outcome of a ``call`` event (a request the store process made to one of our clients)."""
        if self._transport is not None and not self.closed.is_set():
            self._write(("callrep", call_id, outcome))

    def notify_closed(self, channel: Any) -> None:
        if self._transport is not None and not self.closed.is_set():
            self._write(("closed", 0, channel))

    async def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()


def _refused_reply(message: tuple[str, int, Any], error: Exception) -> tuple[str, int, Any]:
    """Store side: a reply that cannot be pickled is replaced by the error (what a failed handler
    gives), so its caller is answered rather than left waiting."""
    kind, ident, payload = message
    log.error("IPC reply %d (%s) not picklable: %r", ident, type(payload).__name__, error)
    return ("rep", ident, RuntimeError(f"reply not picklable: {error!r}"))


def _settle(waiter: "asyncio.Future[Any] | Callable[[Any], None]", outcome: Any, *, failed: bool) -> None:
    """Hand a request's outcome to whoever waits for it: a callback gets the reply or the error
    itself (it tells them apart), a future gets a result or an exception."""
    if not isinstance(waiter, asyncio.Future):
        _call(waiter, outcome)
    elif not waiter.done():
        if failed:
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)


def _call(callback: Callable[[Any], None], outcome: Any) -> None:
    try:
        callback(outcome)
    except Exception:  # one reply's handling must not stop the link's reader
        log.exception("IPC reply callback failed")
