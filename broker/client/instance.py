"""What every rocketlake client shares: one event-loop thread, connections, routes, fault tracking.

Only the standard remoting protocol is used (route lookups on the name server, V2 send headers,
PULL_MESSAGE, offsets), so the same clients work against an Apache RocketMQ cluster.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from broker.acl.signature import SessionCredentials
from broker.remoting import event_loop
from broker.remoting.bodies import MessageQueue, TopicRouteData
from broker.remoting.codes import PermName, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.tls import ClientTlsConfig, client_context
from broker.remoting.transport import RemotingClient, UnsupportedRequest

log = logging.getLogger(__name__)

ROUTE_TTL_S = 30.0


class MQClientError(Exception):
    """A request failed; ``code`` is the broker's response code (or None for transport errors)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class TopicRoute:
    data: TopicRouteData
    fetched: float
    write_queues: list[MessageQueue] = field(default_factory=list)
    read_queues: list[MessageQueue] = field(default_factory=list)
    masters: dict[str, str] = field(default_factory=dict)  # broker name -> master address
    # broker name -> where pulls go: the master, else the lowest-id slave (findBrokerAddressInSubscribe)
    readers: dict[str, str] = field(default_factory=dict)


def build_route(topic: str, data: TopicRouteData) -> TopicRoute:
    """Queues a producer may write to (writable, broker has a master) and a consumer may read."""
    masters = {b.broker_name: b.broker_addrs[0] for b in data.broker_datas if 0 in b.broker_addrs}
    readers = {b.broker_name: b.broker_addrs[min(b.broker_addrs)] for b in data.broker_datas if b.broker_addrs}
    route = TopicRoute(data, time.monotonic(), masters=masters, readers=readers)
    for q in sorted(data.queue_datas, key=lambda q: q.broker_name):
        if q.perm & PermName.WRITE and q.broker_name in masters:
            route.write_queues += [MessageQueue(topic, q.broker_name, i) for i in range(q.write_queue_nums)]
        if q.perm & PermName.READ:
            route.read_queues += [MessageQueue(topic, q.broker_name, i) for i in range(q.read_queue_nums)]
    return route


def local_ip() -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent for UDP connect
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class ClientInstance:
    """Event-loop thread + RemotingClient + name-server routes for one client object.

    ``credentials`` sign every request (ACL); ``tls`` makes every connection TLS, the name servers'
    and the brokers' alike (Apache's client ``tls.enable``); TlsConfigError when its files cannot be used."""

    def __init__(self, namesrv_addr: str, instance_name: str = "DEFAULT", timeout: float = 3.0,
                 credentials: SessionCredentials | None = None, tls: ClientTlsConfig | None = None) -> None:
        context = client_context(tls) if tls is not None else None  # before a thread starts: errors leak nothing
        self.namesrv_addrs = [a.strip() for a in namesrv_addr.replace(",", ";").split(";") if a.strip()]
        if not self.namesrv_addrs:
            raise ValueError("a name server address (host:port) is required")
        self.timeout = timeout
        self.client_id = f"{local_ip()}@{os.getpid()}#{instance_name}"
        self._loop = event_loop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rocketlake-client", daemon=True)
        self._thread.start()
        # with credentials every request is signed as Apache's AclClientRPCHook signs it
        self._remoting = RemotingClient(on_request=self._on_request, tls=context,
                                        before_request=credentials.sign_request if credentials else None)
        self._routes: dict[str, TopicRoute] = {}
        self._routes_lock = threading.Lock()
        self._ns_index = 0
        # code -> handler(cmd) for requests a broker sends us (Java's ClientRemotingProcessor); a handler
        # returns the response (None: plain SUCCESS) and runs on a worker thread, so a listener that
        # takes its time (CONSUME_MESSAGE_DIRECTLY) never holds up the event loop
        self.request_handlers: dict[int, Callable[[RemotingCommand], RemotingCommand | None]] = {}

    async def _on_request(self, cmd: RemotingCommand, conn) -> RemotingCommand | None:
        handler = self.request_handlers.get(cmd.code)
        if handler is None:
            raise UnsupportedRequest(cmd.code)
        response = await asyncio.get_running_loop().run_in_executor(None, handler, cmd)
        if cmd.is_oneway:
            return None
        return response if response is not None else cmd.response(ResponseCode.SUCCESS)

    # ---- requests ----------------------------------------------------------------------------------
    def invoke_future(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> Future:
        """The response to ``cmd`` as a Future, from any thread. Handed to the loop thread as one
        callback (no coroutine, task or asyncio future per request over an open connection: a
        producer's synchronous send costs a fraction of what it did)."""
        out: Future = Future()

        def settle(outcome: RemotingCommand | BaseException) -> None:
            if out.done():  # cancelled by its caller: nobody wants the outcome
                return
            if isinstance(outcome, BaseException):
                out.set_exception(outcome)
            else:
                out.set_result(outcome)

        self._loop.call_soon_threadsafe(self._remoting.invoke_soon, addr, cmd, timeout or self.timeout, settle)
        return out

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        return self.invoke_future(addr, cmd, timeout).result((timeout or self.timeout) + 5)

    def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        asyncio.run_coroutine_threadsafe(self._remoting.invoke_oneway(cmd, addr=addr), self._loop).result(
            self.timeout + 5)

    def invoke_namesrv(self, cmd_factory) -> RemotingCommand:
        """Ask the name servers in turn until one answers."""
        last: Exception | None = None
        for i in range(len(self.namesrv_addrs)):
            addr = self.namesrv_addrs[(self._ns_index + i) % len(self.namesrv_addrs)]
            try:
                return self.invoke(addr, cmd_factory())
            except Exception as exc:  # try the next name server
                last = exc
                self._ns_index += 1
        raise MQClientError(f"no name server answered ({', '.join(self.namesrv_addrs)}): {last}")

    # ---- routes ---------------------------------------------------------------------------------------
    def route(self, topic: str, refresh: bool = False) -> TopicRoute | None:
        with self._routes_lock:
            cached = self._routes.get(topic)
        if cached is not None and not refresh and time.monotonic() - cached.fetched < ROUTE_TTL_S:
            return cached
        resp = self.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                   {"topic": topic}))
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            return None
        route = build_route(topic, TopicRouteData.decode(resp.body))
        with self._routes_lock:
            self._routes[topic] = route
        return route

    def broker_addr(self, broker_name: str, topic: str | None = None) -> str:
        with self._routes_lock:
            for route in self._routes.values():
                if broker_name in route.masters:
                    return route.masters[broker_name]
        if topic is not None:
            route = self.route(topic, refresh=True)
            if route and broker_name in route.masters:
                return route.masters[broker_name]
        raise MQClientError(f"no address known for broker {broker_name}")

    def read_addr(self, broker_name: str, topic: str) -> str:
        """Where a pull from ``broker_name`` goes: its master, or a slave while the route has no master."""
        route = self.route(topic)
        if route is not None and broker_name in route.readers:
            return route.readers[broker_name]
        return self.broker_addr(broker_name, topic)

    def known_brokers(self) -> dict[str, str]:
        with self._routes_lock:
            out: dict[str, str] = {}
            for route in self._routes.values():
                out.update(route.masters)
            return out

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._remoting.close(), self._loop).result(10)
        except Exception:
            pass
        event_loop.stop_loop_thread(self._loop, self._thread)


def session_credentials(access_key: str | None, secret_key: str | None,
                        security_token: str | None = None) -> SessionCredentials | None:
    """The ACL credentials a client was given (None: it sends unsigned requests); both keys or neither."""
    if access_key is None and secret_key is None:
        if security_token is not None:
            raise ValueError("security_token needs access_key and secret_key")
        return None
    return SessionCredentials(access_key or "", secret_key or "", security_token)


class ClientLifecycle:
    """start/shutdown/context-manager plumbing shared by the producer and the consumers."""

    namesrv_addr: str
    instance_name: str
    timeout: float
    credentials: SessionCredentials | None = None
    tls: ClientTlsConfig | None = None
    _client: ClientInstance | None = None

    def start(self):
        self._client = ClientInstance(self.namesrv_addr, self.instance_name, self.timeout, self.credentials, self.tls)
        return self

    def shutdown(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def client(self) -> ClientInstance:
        if self._client is None:
            raise MQClientError(f"{type(self).__name__} is not started")
        return self._client
