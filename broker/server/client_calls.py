"""Requests the broker sends to a connected client, across the broker's processes.

The client registry lives in the store process, connections live in the network processes. A
handler that must ask a client something (Apache's ``Broker2Client.callClient``: running info,
consume a message directly, offsets to reset, consumer status) asks a :class:`ClientCaller` and
gets a :class:`concurrent.futures.Future` back at once, so no request thread of the store process
waits for a client:

1. :class:`IpcClientCaller` (store process) sends ``("call", call_id, serial, ClientRequest)`` to the
   one network process that owns the channel ``(pid, serial)`` (:meth:`IpcServer.send_to`);
2. that network process (:func:`call_client`) sends the request on the connection and waits for the
   response with the same opaque (the transport matches them), within the request's timeout;
3. it sends ``("callrep", call_id, outcome)`` back, and the IPC reader thread completes the future.

A guard timer fails the future if no outcome arrives (the network process died), and every call of
a network process whose IPC link drops fails at once.
"""

from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Protocol

from broker.remoting.command import RemotingCommand
from broker.remoting.transport import Connection, RemotingError, RemotingTimeout

log = logging.getLogger(__name__)

GUARD_MARGIN_S = 2.0  # beyond the call's own timeout, before the store side gives up on a network process


@dataclass(frozen=True)
class ClientRequest:
    """A request for one client connection: code, extFields, body; ``oneway`` expects no answer."""

    code: int
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    timeout_s: float = 10.0
    oneway: bool = False


@dataclass(frozen=True)
class ClientResponse:
    code: int
    remark: str | None = None
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class ClientCallError(Exception):
    """The client could not be asked (connection gone, send failed)."""


class ClientCallTimeout(ClientCallError):
    """The client did not answer within the timeout."""


class ClientCaller(Protocol):
    def call(self, channel: Hashable, request: ClientRequest) -> Future:
        """Future of the :class:`ClientResponse` (None for oneway requests once sent); it fails
        with :class:`ClientCallTimeout` or :class:`ClientCallError`."""


class NoClientTransport:
    """Where no network layer is attached (a BrokerCore on its own): every call fails cleanly."""

    def call(self, channel: Hashable, request: ClientRequest) -> Future:
        future: Future = Future()
        future.set_exception(ClientCallError("no connection to clients in this broker"))
        return future


# ---- outcomes on the IPC link ------------------------------------------------------------------------
OK, TIMEOUT, ERROR = "ok", "timeout", "error"


def _settle(future: Future, outcome: tuple[str, Any]) -> None:
    if future.done():
        return
    kind, value = outcome
    if kind == OK:
        future.set_result(value)
    elif kind == TIMEOUT:
        future.set_exception(ClientCallTimeout(value))
    else:
        future.set_exception(ClientCallError(value))


class IpcClientCaller:
    """Store side: routes a call to the network process owning the channel and waits for its outcome.

    ``send_to(pid, event)`` delivers an event to one network process and says whether it is connected.
    """

    def __init__(self, send_to: Callable[[int, Any], bool]) -> None:
        self._send_to = send_to
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, Future, threading.Timer]] = {}
        self._lock = threading.Lock()

    def call(self, channel: Hashable, request: ClientRequest) -> Future:
        future: Future = Future()
        try:
            pid, serial = channel  # type: ignore[misc]
        except (TypeError, ValueError):
            future.set_exception(ClientCallError(f"channel {channel!r} has no network process"))
            return future
        call_id = next(self._ids)
        timer = threading.Timer(request.timeout_s + GUARD_MARGIN_S, self.on_reply,
                                (call_id, (TIMEOUT, f"no answer through network process {pid} "
                                                    f"within {request.timeout_s:g}s")))
        timer.daemon = True
        with self._lock:
            self._pending[call_id] = (pid, future, timer)
        if not self._send_to(pid, ("call", call_id, serial, request)):
            self.on_reply(call_id, (ERROR, f"network process {pid} holding the connection is gone"))
            return future
        timer.start()
        return future

    def on_reply(self, call_id: int, outcome: tuple[str, Any]) -> None:
        """An outcome from a network process (or the guard timer): complete the call's future."""
        with self._lock:
            entry = self._pending.pop(call_id, None)
        if entry is None:
            return  # already settled (the guard fired first, or a late answer)
        _, future, timer = entry
        timer.cancel()
        _settle(future, outcome)

    def process_gone(self, pid: int) -> None:
        """A network process's IPC link dropped: its calls will never be answered."""
        with self._lock:
            ids = [cid for cid, (owner, _, _) in self._pending.items() if owner == pid]
        for cid in ids:
            self.on_reply(cid, (ERROR, f"network process {pid} holding the connection is gone"))


async def call_client(conn: Connection | None, request: ClientRequest) -> tuple[str, Any]:
    """Network side: send ``request`` on ``conn`` and turn what happens into an IPC outcome."""
    if conn is None or conn.closed:
        return ERROR, "the client's connection is closed"
    cmd = RemotingCommand.request(request.code, request.ext, request.body, oneway=request.oneway)
    try:
        if request.oneway:
            await conn.send_oneway(cmd)
            return OK, None
        resp = await conn.send_request(cmd, request.timeout_s)
    except RemotingTimeout as exc:
        return TIMEOUT, str(exc)
    except (RemotingError, OSError) as exc:
        return ERROR, f"{type(exc).__name__}: {exc}"
    return OK, ClientResponse(resp.code, resp.remark, dict(resp.ext_fields), resp.body)
