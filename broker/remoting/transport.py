"""asyncio TCP transport for the remoting protocol: a server, a client, and a sync client wrapper.

Both ends share :class:`Connection`, because both ends of a RocketMQ connection send requests: the
broker pushes NOTIFY_CONSUMER_IDS_CHANGED to consumers and clients answer GET_CONSUMER_RUNNING_INFO
(section 7.12). Per connection:

* frames are split by :class:`FrameDecoder`; each request runs in its own task, so a long-poll
  pull held for 15 s does not block the offset commits behind it on the same socket (section 1);
  responses are matched to our own requests by ``opaque`` only;
* the handler's return value is the reply (``None`` = no reply); a request flagged oneway is never
  answered; :class:`UnsupportedRequest` becomes REQUEST_CODE_NOT_SUPPORTED, a
  :class:`ProtocolError` (``HeaderError``, ``BodyError``) becomes SYSTEM_ERROR with its text, and any
  other exception is logged with its traceback and also answered SYSTEM_ERROR;
* a frame that cannot be split or whose header cannot be decoded (no opaque to answer to) is a
  :class:`FrameError`: one log line, and only that connection is closed.

TLS (:mod:`broker.remoting.tls`): a server given a :class:`ServerTls` in permissive or enforcing
mode accepts raw sockets itself, peeks at each one's first byte and wraps it in TLS or serves it as
it is (Apache's ``HandshakeHandler``); after that a connection is a :class:`Connection` like any
other, so nothing is added per frame. A disabled server keeps asyncio's own accept path.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future as ThreadFuture
from typing import Any

from broker.remoting import event_loop
from broker.remoting.codes import ResponseCode, request_code_name
from broker.remoting.command import RESPONSE_FLAG, ProtocolError, RemotingCommand, response_frame
from broker.remoting.frame import DEFAULT_MAX_FRAME, FrameDecoder, FrameError
from broker.remoting.tls import (
    FIRST_BYTE_TIMEOUT_S,
    HANDSHAKE_TIMEOUT_S,
    MODE_KEY,
    TLS_HANDSHAKE_RECORD,
    ServerTls,
    TlsMode,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3.0  # Java/C++ default for synchronous calls
DEFAULT_MAX_INFLIGHT = 10_000  # per connection; beyond it requests are answered SYSTEM_BUSY
_READ_CHUNK = 256 * 1024
_LISTEN_BACKLOG = 100  # asyncio.start_server's default

Processor = Callable[[RemotingCommand, "Connection"], Awaitable["RemotingCommand | None"]]
CloseCallback = Callable[["Connection"], Any]
# Takes a request without a task (True), answering it later with ``Connection.answer``; False: the
# request goes to the Processor as usual. For the few request kinds that dominate a server's load.
FastProcessor = Callable[[RemotingCommand, "Connection"], bool]


class RemotingError(Exception):
    """Base of transport failures seen by a caller of ``invoke``."""


class RemotingTimeout(RemotingError, TimeoutError):
    """No response arrived within the timeout."""


class RemotingConnectError(RemotingError, ConnectionError):
    """The peer could not be reached."""


class ConnectionClosed(RemotingError, ConnectionError):
    """The connection closed before the response arrived (or before the request was sent)."""


class UnsupportedRequest(Exception):
    """Raised by a processor for a request code it does not serve: answered with code 3."""

    def __init__(self, code: int | None = None, remark: str | None = None) -> None:
        self.code = code
        self.remark = remark or (f"request type {code} not supported" if code is not None else "request not supported")
        super().__init__(self.remark)


def parse_address(addr: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` → (host, port); ValueError with a readable reason."""
    text = addr.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"{addr!r} is not [ipv6]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"{addr!r} has no port (expected host:port)")
    if not host:
        raise ValueError(f"{addr!r} has no host (expected host:port)")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{addr!r}: port {port_text!r} is not a number in 0-65535")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _peer_of(writer: asyncio.StreamWriter, which: str) -> str:
    info = writer.get_extra_info(which)
    if isinstance(info, tuple) and len(info) >= 2:
        return format_address(str(info[0]), int(info[1]))
    return str(info) if info else "?"


class _CallbackWaiter:
    """A pending request of :meth:`Connection.request_soon`: answered, failed or timed out once,
    through the calls a pending future gets (``done``, ``set_result``, ``set_exception``)."""

    __slots__ = ("_on_outcome", "_done", "timer")

    def __init__(self, on_outcome: Callable[[Any], None]) -> None:
        self._on_outcome = on_outcome
        self._done = False
        self.timer: asyncio.TimerHandle | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, outcome: Any) -> None:
        if self._done:
            return
        self._done = True
        if self.timer is not None:
            self.timer.cancel()
        try:
            self._on_outcome(outcome)
        except Exception:  # noqa: BLE001 - one caller's callback must not stop the connection's reader
            log.exception("response callback failed")

    set_exception = set_result  # the callback tells a response from an error by its type


# =====================================================================================================
# Connection
# =====================================================================================================
class Connection:
    """One TCP connection speaking remoting, usable in both directions."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Processor | None, *,
                 max_frame: int = DEFAULT_MAX_FRAME, name: str = "remoting",
                 max_inflight: int = DEFAULT_MAX_INFLIGHT, fast_handler: FastProcessor | None = None) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._fast_handler = fast_handler
        self._fast_inflight = 0  # requests taken by the fast handler, not answered yet
        self._out: list[bytes] = []  # responses of this loop turn, written together at its end
        self._decoder = FrameDecoder(max_frame)
        self._max_inflight = max_inflight
        self.name = name
        self.peer = _peer_of(writer, "peername")
        self.local = _peer_of(writer, "sockname")
        tls_object: ssl.SSLObject | None = writer.get_extra_info("ssl_object")
        self.tls = tls_object is not None  # TLS or plaintext
        # read now, once: the handshake is done, and the object is gone with the connection
        self._peer_cert = tls_object.getpeercert(binary_form=True) if tls_object is not None else None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._close_callbacks: list[CloseCallback] = []
        self._closed = False
        self._closed_event = asyncio.Event()
        self.attributes: dict[str, Any] = {}  # free slot for processors (client id, broker addr …)

    # --- state ------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def add_close_callback(self, callback: CloseCallback) -> None:
        """Call ``callback(conn)`` once when the connection closes (at once if already closed).

        Coroutine functions are scheduled as tasks; exceptions are logged, never propagated.
        """
        if self._closed:
            self._run_callback(callback)
        else:
            self._close_callbacks.append(callback)

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    def peer_certificate(self) -> bytes | None:
        """The peer's certificate (DER) on a TLS connection that has one; None otherwise."""
        return self._peer_cert

    def __repr__(self) -> str:
        return f"<Connection {self.name} {self.local}<->{self.peer}{' closed' if self._closed else ''}>"

    # --- outgoing ---------------------------------------------------------------------------------
    async def send_request(self, cmd: RemotingCommand, timeout: float = DEFAULT_TIMEOUT_S) -> RemotingCommand:
        """Send ``cmd`` and wait for the response with the same opaque."""
        if self._closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RemotingCommand] = loop.create_future()
        if cmd.opaque in self._pending:
            raise RemotingError(f"opaque {cmd.opaque} already has a request in flight to {self.peer}")
        self._pending[cmd.opaque] = future
        try:
            await self._write(cmd)
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise RemotingTimeout(f"no response to {request_code_name(cmd.code)} opaque={cmd.opaque} from "
                                  f"{self.peer} within {timeout:g}s") from None
        finally:
            self._pending.pop(cmd.opaque, None)
            if future.done() and not future.cancelled():
                # the connection closed while the write was still going: close() failed this
                # future, but the caller gets the write's ConnectionClosed, so nothing awaits it
                # (asyncio would log "Future exception was never retrieved" with a traceback)
                future.exception()

    async def send_oneway(self, cmd: RemotingCommand) -> None:
        """Send ``cmd`` with the oneway flag; no response is expected."""
        cmd.mark_oneway()
        await self._write(cmd)

    def request_soon(self, cmd: RemotingCommand, timeout: float,
                     on_outcome: Callable[[RemotingCommand | BaseException], None]) -> None:
        """:meth:`send_request` without a task or a future, for a caller on the loop's thread:
        ``on_outcome`` gets the response, or the error ``send_request`` would raise (the same
        types and texts). Why: a client's synchronous send went through a task, a future and
        ``wait_for`` each, several times the CPU of the request itself. The frame is written at
        once, without waiting for the transport's buffer to drain (the caller bounds what it has
        in flight, as a thread waiting for each answer does)."""
        if self._closed:
            on_outcome(ConnectionClosed(f"connection to {self.peer} is closed"))
            return
        if cmd.opaque in self._pending:
            on_outcome(RemotingError(f"opaque {cmd.opaque} already has a request in flight to {self.peer}"))
            return
        try:
            frame = cmd.encode()
        except ProtocolError as exc:
            on_outcome(exc)
            return
        waiter = _CallbackWaiter(on_outcome)
        waiter.timer = asyncio.get_running_loop().call_later(timeout, self._expire, cmd.opaque, cmd.code, timeout)
        self._pending[cmd.opaque] = waiter  # answered by _dispatch, failed by close, like a future
        try:
            self._writer.write(frame)
        except (ConnectionError, OSError) as exc:
            self._pending.pop(cmd.opaque, None)
            waiter.set_exception(ConnectionClosed(f"write to {self.peer} failed: {exc}"))
            self.close()

    def _expire(self, opaque: int, code: int, timeout: float) -> None:
        waiter = self._pending.pop(opaque, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(RemotingTimeout(f"no response to {request_code_name(code)} opaque={opaque} from "
                                                 f"{self.peer} within {timeout:g}s"))

    async def _write(self, cmd: RemotingCommand) -> None:
        if self._closed:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        frame = cmd.encode()
        try:
            self._writer.write(frame)
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self.close()
            raise ConnectionClosed(f"write to {self.peer} failed: {exc}") from None

    # --- incoming ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Read until EOF, error or :meth:`close`; then fail pending requests and run callbacks."""
        try:
            while not self._closed:
                data = await self._reader.read(_READ_CHUNK)
                if not data:
                    log.debug("%s: %s closed the connection", self.name, self.peer)
                    break
                for payload in self._decoder.feed(data):
                    try:
                        cmd = RemotingCommand.decode(payload)
                    except ProtocolError as exc:
                        raise FrameError(f"undecodable frame: {exc.detail}") from None
                    self._dispatch(cmd)
        except FrameError as exc:
            # only on this error path: a TLS record where frames were expected says why
            hint = (" (it looks like a TLS handshake: this end speaks plaintext here, "
                    f"{MODE_KEY}=disabled)" if data[:1] == bytes([TLS_HANDSHAKE_RECORD]) else "")
            log.warning("%s: closing connection from %s: %s%s", self.name, self.peer, exc, hint)
        except (ConnectionError, OSError) as exc:
            log.debug("%s: connection %s failed: %s", self.name, self.peer, exc)
        except asyncio.CancelledError:
            self.close()
            raise
        finally:
            self.close()

    def _dispatch(self, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            future = self._pending.pop(cmd.opaque, None)
            if future is None or future.done():
                # Normal for the C++ client's "oneway" calls it never waits for (section 2).
                log.debug("%s: response opaque=%d from %s matches no request", self.name, cmd.opaque, self.peer)
            else:
                future.set_result(cmd)
            return
        if len(self._tasks) + self._fast_inflight >= self._max_inflight:
            log.warning("%s: %s has %d requests in flight; answering SYSTEM_BUSY", self.name, self.peer,
                        len(self._tasks))
            if not cmd.is_oneway:
                self._spawn(self._reply(cmd, cmd.response(ResponseCode.SYSTEM_BUSY,
                                                          remark="too many requests in flight on this connection")))
            return
        if self._fast_handler is not None and not cmd.is_oneway and self._fast_handler(cmd, self):
            self._fast_inflight += 1
            return
        self._spawn(self._handle(cmd))

    def answer(self, request: RemotingCommand, response: RemotingCommand) -> None:
        """The response to a request the fast handler took. No task waits for it: the frame joins
        the others answered in this turn of the loop and they leave in one write (a pipelining
        client gets many replies per system call)."""
        self._fast_inflight -= 1
        if self._closed:
            return
        response.opaque = request.opaque
        response.flag |= RESPONSE_FLAG
        try:
            frame = response.encode()
        except ProtocolError as exc:
            frame = self._encoding_failed(request, exc)
        self._queue_frame(frame)

    def answer_with(self, request: RemotingCommand, code: int, remark: str | None = None,
                    ext: Mapping[str, Any] | None = None, body: bytes = b"") -> None:
        """``answer(request, request.response(code, remark, ext, body))`` with the frame's bytes
        built directly (:func:`response_frame`): the same bytes without a command object per send."""
        self._fast_inflight -= 1
        if self._closed:
            return
        try:
            frame = response_frame(request.opaque, code, remark, ext, body)
        except ProtocolError as exc:
            frame = self._encoding_failed(request, exc)
        self._queue_frame(frame)

    def _encoding_failed(self, request: RemotingCommand, exc: ProtocolError) -> bytes:
        log.error("%s: response to %s for %s cannot be encoded (%s); answering SYSTEM_ERROR", self.name,
                  request_code_name(request.code), self.peer, exc.detail)
        return request.response(ResponseCode.SYSTEM_ERROR, remark="response encoding failed").encode()

    def _queue_frame(self, frame: bytes) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush_out)
        self._out.append(frame)

    def _flush_out(self) -> None:
        frames, self._out = self._out, []
        if self._closed:
            return
        try:
            self._writer.write(b"".join(frames))
        except (ConnectionError, OSError) as exc:
            log.debug("%s: write to %s failed: %s", self.name, self.peer, exc)
            self.close()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, cmd: RemotingCommand) -> None:
        try:
            if self._handler is None:
                raise UnsupportedRequest(cmd.code)
            response = await self._handler(cmd, self)
        except UnsupportedRequest as exc:
            log.info("%s: %s from %s not supported", self.name, request_code_name(cmd.code), self.peer)
            response = cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark=exc.remark)
        except ProtocolError as exc:
            log.info("%s: bad %s from %s: %s", self.name, request_code_name(cmd.code), self.peer, exc.detail)
            response = cmd.response(ResponseCode.SYSTEM_ERROR, remark=exc.detail)
        except asyncio.CancelledError:
            return  # connection closing: nobody to answer
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the connection down
            log.exception("%s: %s from %s failed", self.name, request_code_name(cmd.code), self.peer)
            response = cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")
        if response is None or cmd.is_oneway:
            return
        await self._reply(cmd, response)

    async def _reply(self, request: RemotingCommand, response: RemotingCommand) -> None:
        response.opaque = request.opaque
        response.flag |= RESPONSE_FLAG
        try:
            await self._write(response)
        except ProtocolError as exc:
            log.error("%s: response to %s for %s cannot be encoded (%s); answering SYSTEM_ERROR", self.name,
                      request_code_name(request.code), self.peer, exc.detail)
            try:
                await self._write(request.response(ResponseCode.SYSTEM_ERROR, remark="response encoding failed"))
            except (ConnectionClosed, ProtocolError):
                pass
        except ConnectionClosed:
            log.debug("%s: %s went away before the response to opaque=%d", self.name, self.peer, request.opaque)

    # --- closing ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the socket, fail waiting requests, cancel running handlers, run close callbacks."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
        except (ConnectionError, OSError, RuntimeError):
            pass
        error = ConnectionClosed(f"connection to {self.peer} closed")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        current = asyncio.current_task() if _loop_running() else None
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            self._run_callback(callback)
        self._closed_event.set()

    def _run_callback(self, callback: CloseCallback) -> None:
        try:
            result = callback(self)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                task.add_done_callback(_log_task_error)
        except Exception:  # noqa: BLE001
            log.exception("%s: close callback %r failed", self.name, callback)


def _socket_peer(sock: socket.socket) -> str:
    try:
        info = sock.getpeername()
    except OSError:
        return "?"
    return format_address(str(info[0]), int(info[1])) if isinstance(info, tuple) else str(info)


async def _peek_first_byte(loop: asyncio.AbstractEventLoop, sock: socket.socket, timeout: float) -> bytes:
    """The connection's first byte, left in the socket (MSG_PEEK) for whoever reads it next; b"" when
    the peer closed without sending anything."""
    readable = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: readable.done() or readable.set_result(None))
    try:
        await asyncio.wait_for(readable, timeout)
    finally:
        loop.remove_reader(sock.fileno())
    return sock.recv(1, socket.MSG_PEEK)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def _log_task_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())


# =====================================================================================================
# Server
# =====================================================================================================
class RemotingServer:
    """Accepts remoting connections and hands each request to ``processor(cmd, conn)``.

    ``tls`` (permissive or enforcing) serves TLS on the port, rotating the certificate when its
    files change; None or disabled serves plaintext only."""

    def __init__(self, host: str, port: int, processor: Processor, *, max_frame: int = DEFAULT_MAX_FRAME,
                 name: str = "remoting", reuse_port: bool = False, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                 on_connection: Callable[[Connection], Any] | None = None,
                 fast_handler: FastProcessor | None = None, tls: ServerTls | None = None) -> None:
        self.host = host
        self.fast_handler = fast_handler
        self.requested_port = port
        self.processor = processor
        self.max_frame = max_frame
        self.name = name
        self.reuse_port = reuse_port
        self.max_inflight = max_inflight
        self.on_connection = on_connection
        self.connections: set[Connection] = set()
        self.tls = tls if tls is not None and tls.mode is not TlsMode.DISABLED else None
        self._server: asyncio.base_events.Server | None = None
        self._listeners: list[socket.socket] = []  # TLS modes: sockets we accept on ourselves
        self._acceptors: list[asyncio.Task[None]] = []
        self._handshaking: set[asyncio.Task[Any]] = set()  # accepted sockets not yet a Connection
        self._runners: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Bind and listen. ``reuse_port`` sets SO_REUSEPORT so several processes share one port."""
        if self._server is not None or self._listeners:
            return
        if self.reuse_port and not hasattr(socket, "SO_REUSEPORT"):
            raise OSError("SO_REUSEPORT is not available on this platform")
        if self.tls is not None:
            await self._start_tls_listeners()
            log.info("%s: listening on %s (%s=%s)", self.name, self.address, MODE_KEY, self.tls.mode.value)
            return
        self._server = await asyncio.start_server(self._accept, self.host, self.requested_port,
                                                  reuse_address=True, reuse_port=self.reuse_port or None)
        log.info("%s: listening on %s", self.name, self.address)

    @property
    def port(self) -> int:
        """The bound port (useful after binding port 0)."""
        if self._listeners:
            return int(self._listeners[0].getsockname()[1])
        if self._server is None or not self._server.sockets:
            raise RuntimeError(f"{self.name} is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(reader, writer, self.processor, max_frame=self.max_frame, name=self.name,
                          max_inflight=self.max_inflight, fast_handler=self.fast_handler)
        self.connections.add(conn)
        log.debug("%s: connection from %s", self.name, conn.peer)
        task = asyncio.current_task()
        if task is not None:
            self._runners.add(task)
        try:
            if self.on_connection is not None:
                self.on_connection(conn)
            await conn.run()
        finally:
            self.connections.discard(conn)
            if task is not None:
                self._runners.discard(task)

    # --- TLS modes: our own accept loop, so the first byte can be looked at before it is read -----
    async def _start_tls_listeners(self) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.requested_port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        seen = set()
        try:
            for family, kind, proto, _, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                sock = socket.socket(family, kind, proto)
                self._listeners.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self.reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.listen(_LISTEN_BACKLOG)
                sock.setblocking(False)
        except OSError:
            self._close_listeners()
            raise
        assert self.tls is not None
        self._acceptors = [asyncio.ensure_future(self._accept_loop(sock)) for sock in self._listeners]
        self._acceptors.append(asyncio.ensure_future(self.tls.watch()))

    def _close_listeners(self) -> None:
        for sock in self._listeners:
            sock.close()
        self._listeners = []

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # EMFILE and the like: the listener itself is fine
                log.warning("%s: accept failed: %s", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            self._spawn_runner(self._serve_socket(sock))

    def _spawn_runner(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._runners.add(task)
        task.add_done_callback(self._runners.discard)

    async def _serve_socket(self, sock: socket.socket) -> None:
        """Peek at the first byte, refuse what the mode does not allow, then serve the connection."""
        task = asyncio.current_task()
        assert task is not None
        self._handshaking.add(task)
        try:
            streams = await self._open_streams(sock)
        except asyncio.CancelledError:
            sock.close()
            raise
        finally:
            self._handshaking.discard(task)
        if streams is not None:
            await self._accept(*streams)

    async def _open_streams(self, sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        assert self.tls is not None
        loop = asyncio.get_running_loop()
        peer = _socket_peer(sock)
        try:
            first = await _peek_first_byte(loop, sock, FIRST_BYTE_TIMEOUT_S)
        except (asyncio.TimeoutError, OSError) as exc:
            log.info("%s: %s sent nothing (%s); closing", self.name, peer, exc or "timed out")
            sock.close()
            return None
        if not first:
            log.debug("%s: %s closed before sending anything", self.name, peer)
            sock.close()
            return None
        wants_tls = first[0] == TLS_HANDSHAKE_RECORD
        if not wants_tls and self.tls.mode is TlsMode.ENFORCING:
            log.warning("%s: refusing %s: it speaks plaintext but %s=enforcing requires TLS", self.name, peer,
                        MODE_KEY)
            sock.close()
            return None
        reader = asyncio.StreamReader(limit=2 ** 16, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            if wants_tls:
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol, sock, ssl=self.tls.context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
            else:
                transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
            log.warning("%s: TLS handshake with %s failed: %s", self.name, peer, str(exc) or type(exc).__name__)
            sock.close()
            return None
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def serve_forever(self) -> None:
        await self.start()
        if self._server is None:
            await asyncio.gather(*self._acceptors)
            return
        await self._server.serve_forever()

    async def stop(self) -> None:
        """Stop listening and close every connection (held requests are cancelled)."""
        if self._server is None and not self._listeners:
            return
        if self._server is not None:
            self._server.close()
        for task in self._acceptors:
            task.cancel()
        self._close_listeners()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
        current = asyncio.current_task()
        for task in list(self._handshaking):  # not a connection yet: nothing to close but the socket
            task.cancel()
        runners = [t for t in self._runners if not t.done() and t is not current]
        if runners:
            await asyncio.wait(runners, timeout=5)
        if self._acceptors:
            await asyncio.wait(self._acceptors, timeout=5)
            self._acceptors = []
        self._server = None
        log.info("%s: stopped", self.name)

    close = stop

    async def __aenter__(self) -> RemotingServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# =====================================================================================================
# Client
# =====================================================================================================
class RemotingClient:
    """Request/response client with one lazily (re)opened connection per address.

    ``on_request(cmd, conn)`` serves requests the server sends us (None ⇒ REQUEST_CODE_NOT_SUPPORTED,
    and nothing for oneway ones). ``before_request(cmd)`` runs on every request we send, just before
    it goes out (Java's ``RPCHook.doBeforeRequest``: ACL signing, :mod:`broker.acl.signature`).
    ``tls`` (from :func:`broker.remoting.tls.client_context`) makes every connection TLS, as Apache's
    client does with ``tls.enable``; a failed handshake is a RemotingConnectError.
    """

    def __init__(self, addr: str | None = None, *, on_request: Processor | None = None,
                 max_frame: int = DEFAULT_MAX_FRAME, connect_timeout: float = DEFAULT_TIMEOUT_S,
                 name: str = "client", before_request: Callable[[RemotingCommand], None] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.default_addr = addr
        self.before_request = before_request
        self.tls = tls
        self.on_request = on_request
        self.max_frame = max_frame
        self.connect_timeout = connect_timeout
        self.name = name
        self._connections: dict[str, Connection] = {}
        self._runners: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    def _resolve(self, addr: str | None) -> str:
        target = addr or self.default_addr
        if not target:
            raise RemotingConnectError("no address: pass addr or call connect(addr) first")
        return target

    async def connect(self, addr: str | None = None) -> Connection:
        """Open (or reuse) the connection to ``addr``; it also becomes the default address."""
        target = self._resolve(addr)
        if addr:
            self.default_addr = addr
        return await self._connection(target)

    async def _connection(self, addr: str) -> Connection:
        if self._closed:
            raise ConnectionClosed(f"{self.name} is closed")
        conn = self._connections.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._connections.get(addr)
            if conn is not None and not conn.closed:
                return conn
            try:
                host, port = parse_address(addr)
            except ValueError as exc:
                raise RemotingConnectError(str(exc)) from None
            try:
                opening = (asyncio.open_connection(host, port) if self.tls is None else
                           asyncio.open_connection(host, port, ssl=self.tls, server_hostname=host,
                                                   ssl_handshake_timeout=self.connect_timeout))
                reader, writer = await asyncio.wait_for(opening, self.connect_timeout)
            except (OSError, asyncio.TimeoutError) as exc:
                reason = exc if str(exc) else ("timed out" if isinstance(exc, asyncio.TimeoutError)
                                               else f"{type(exc).__name__} (a TLS or plaintext mismatch?)")
                raise RemotingConnectError(f"cannot connect to {addr}: {reason}") from None
            conn = Connection(reader, writer, self.on_request, max_frame=self.max_frame, name=self.name)
            self._connections[addr] = conn
            runner = asyncio.ensure_future(conn.run())
            self._runners[addr] = runner
            log.debug("%s: connected to %s", self.name, addr)
            return conn

    async def invoke(self, cmd: RemotingCommand, timeout: float = DEFAULT_TIMEOUT_S, *,
                     addr: str | None = None) -> RemotingCommand:
        """Send a request and return the response (RemotingTimeout / ConnectionClosed on failure)."""
        conn = await self._connection(self._resolve(addr))
        if self.before_request is not None:
            self.before_request(cmd)
        return await conn.send_request(cmd, timeout)

    def invoke_soon(self, addr: str | None, cmd: RemotingCommand, timeout: float,
                    on_outcome: Callable[[RemotingCommand | BaseException], None]) -> None:
        """:meth:`invoke` for a caller on the loop's thread, with a callback: the response or the
        error goes to ``on_outcome``. Over an open connection no task is made
        (:meth:`Connection.request_soon`); the first request to an address connects through
        :meth:`invoke`."""
        try:
            target = self._resolve(addr)
        except RemotingError as exc:
            on_outcome(exc)
            return
        conn = self._connections.get(target)
        if conn is None or conn.closed or self._closed:
            task = asyncio.ensure_future(self.invoke(cmd, timeout, addr=target))
            task.add_done_callback(lambda done: on_outcome(
                ConnectionClosed(f"{self.name} is closed") if done.cancelled() else done.exception() or done.result()))
            return
        if self.before_request is not None:
            try:
                self.before_request(cmd)
            except Exception as exc:  # noqa: BLE001 - what invoke would raise, handed to the caller
                on_outcome(exc)
                return
        conn.request_soon(cmd, timeout, on_outcome)

    async def invoke_oneway(self, cmd: RemotingCommand, *, addr: str | None = None) -> None:
        conn = await self._connection(self._resolve(addr))
        if self.before_request is not None:
            self.before_request(cmd)
        await conn.send_oneway(cmd)

    async def close(self) -> None:
        self._closed = True
        for conn in self._connections.values():
            conn.close()
        runners = [t for t in self._runners.values() if not t.done()]
        if runners:
            await asyncio.wait(runners, timeout=5)
        self._connections.clear()
        self._runners.clear()

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SyncRemotingClient:
    """Blocking facade over :class:`RemotingClient`, run on a private event-loop thread.

    For producers and tools written as plain synchronous code. ``on_request`` runs on that thread.
    """

    def __init__(self, addr: str | None = None, **kwargs: Any) -> None:
        self._loop = event_loop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="remoting-client-loop", daemon=True)
        self._thread.start()
        self._client = RemotingClient(addr, **kwargs)

    def _call(self, coro: Awaitable[Any], timeout: float | None) -> Any:
        future: ThreadFuture[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return future.result(timeout)

    def connect(self, addr: str | None = None) -> Connection:
        """Open (or reuse) the connection; the Connection is for looking at (``peer``,
        ``peer_certificate()``): its coroutines belong to this client's loop thread."""
        return self._call(self._client.connect(addr), self._client.connect_timeout + 5)

    def invoke(self, cmd: RemotingCommand, timeout: float = DEFAULT_TIMEOUT_S, *,
               addr: str | None = None) -> RemotingCommand:
        return self._call(self._client.invoke(cmd, timeout, addr=addr), timeout + self._client.connect_timeout + 5)

    def invoke_oneway(self, cmd: RemotingCommand, *, addr: str | None = None) -> None:
        self._call(self._client.invoke_oneway(cmd, addr=addr), self._client.connect_timeout + 5)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self._client.close(), 10)
        finally:
            event_loop.stop_loop_thread(self._loop, self._thread)

    def __enter__(self) -> SyncRemotingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
