"""The name server process: remoting requests onto :class:`RouteTable`, plus the expiry timer.

Served codes (remoting-protocol.md sections 5, 8.2, 11): REGISTER_BROKER 103, UNREGISTER_BROKER 104,
GET_ROUTEINFO_BY_TOPIC 105, GET_BROKER_CLUSTER_INFO 106, GET_ALL_TOPIC_LIST_FROM_NAMESERVER 206,
DELETE_TOPIC_IN_NAMESRV 216, GET_KVLIST_BY_NAMESPACE 219, GET_TOPICS_BY_CLUSTER 224,
UPDATE_NAMESRV_CONFIG 318, GET_NAMESRV_CONFIG 319, QUERY_DATA_VERSION 322 and the in-memory KV
config 100-102. Anything else is answered 3
(REQUEST_CODE_NOT_SUPPORTED) by the transport.

The config requests speak Java properties text under Apache's ``NamesrvConfig``/``NettyServerConfig``
names, for the settings this name server really has (see :data:`CONFIG_KEYS`); an update changes
the runtime ones and refuses anything else as a whole, with a remark naming the keys.

With an ACL file (``--acl-file``, :mod:`broker.acl`) the admin requests — PUT_KV_CONFIG,
DELETE_KV_CONFIG, DELETE_TOPIC_IN_NAMESRV, UPDATE_NAMESRV_CONFIG — must come signed from an admin
account (or a whitelisted host); the rest stay open, so brokers register and clients look up routes
without credentials, as with Apache 4.9's name server, which has no ACL at all.

Like Java, a broker's routes vanish when its registration connection closes or after
``broker_timeout_s`` without a registration (scanned every ``scan_interval_s``). Nothing is
persisted: brokers re-register every 30 s, so a restarted name server is complete again quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable

from broker.acl.gate import DENIED_CODE, AclGate
from broker.acl.permission import NAMESRV_ADMIN_CODES
from broker.namesrv.route_table import DEFAULT_BROKER_TIMEOUT_S, RouteTable
from broker.remoting import event_loop
from broker.remoting.bodies import (
    BodyError,
    KVTable,
    RegisterBrokerBody,
    TopicList,
    decode_data_version,
    encode_data_version,
    loads_lenient,
)
from broker.remoting.codes import RequestCode, ResponseCode, Version
from broker.remoting.properties_body import CHARSET, PropertiesError, parse_properties, properties_to_text
from broker.remoting.command import RemotingCommand
from broker.remoting.frame import DEFAULT_MAX_FRAME
from broker.remoting.headers import (
    DeleteKVConfigRequestHeader,
    DeleteTopicFromNamesrvRequestHeader,
    GetKVConfigRequestHeader,
    GetKVListByNamespaceRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    PutKVConfigRequestHeader,
    QueryDataVersionRequestHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnRegisterBrokerRequestHeader,
)
from broker.remoting.tls import ServerTls
from broker.remoting.transport import Connection, RemotingServer, UnsupportedRequest, parse_address
from broker.store.config_files import ConfigFileError, DataVersion, TopicConfigTable
from broker.store.crc import body_crc

log = logging.getLogger(__name__)

DEFAULT_PORT = 9876
DEFAULT_SCAN_INTERVAL_S = 5.0
ORDER_TOPIC_NAMESPACE = "ORDER_TOPIC_CONFIG"  # NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG
_CONN_TRACKED = "namesrv.close_hooked"
# Apache's names of the settings this name server has; the second element says whether an update may
# change it while running. scanNotActiveBrokerInterval is in milliseconds (5.x NamesrvConfig).
CONFIG_KEYS = {"listenPort": False, "orderMessageEnable": True, "scanNotActiveBrokerInterval": True}
# NamesrvConfig.configBlackList (4.9.7+): never updatable over the wire
CONFIG_BLACK_LIST = ("configBlackList", "configStorePath", "kvConfigPath")

Handler = Callable[[RemotingCommand, Connection], RemotingCommand]


def no_route_remark(topic: str) -> str:
    return f"No topic route info in name server for the topic: {topic}"


class NameServer:
    """asyncio name server; ``await start()`` binds, ``await stop()`` releases everything."""

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                 broker_timeout_s: float = DEFAULT_BROKER_TIMEOUT_S, scan_interval_s: float = DEFAULT_SCAN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, reuse_port: bool = False,
                 max_frame: int = DEFAULT_MAX_FRAME, acl_file: str | None = None,
                 tls: ServerTls | None = None) -> None:
        if broker_timeout_s <= 0 or scan_interval_s <= 0:
            raise ValueError("broker_timeout_s and scan_interval_s must be > 0")
        self.routes = RouteTable(broker_timeout_s=broker_timeout_s, clock=clock)
        self.kv: dict[str, dict[str, str]] = {}
        self.scan_interval_s = scan_interval_s
        self.order_message_enable = False  # NamesrvConfig.orderMessageEnable: routes carry orderTopicConf
        self.server = RemotingServer(host, port, self.process, name="namesrv", reuse_port=reuse_port,
                                     max_frame=max_frame, tls=tls)  # the broker's TLS modes and rotation
        self._scanner: asyncio.Task[None] | None = None
        # a missing or broken file raises AclConfigError here, before anything listens
        self.acl = AclGate(acl_file, NAMESRV_ADMIN_CODES) if acl_file else None
        self._acl_watch: asyncio.Task[None] | None = None
        self._handlers: dict[int, Handler] = {
            RequestCode.PUT_KV_CONFIG: self._put_kv_config,
            RequestCode.GET_KV_CONFIG: self._get_kv_config,
            RequestCode.DELETE_KV_CONFIG: self._delete_kv_config,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self._get_kv_list,
            RequestCode.REGISTER_BROKER: self._register_broker,
            RequestCode.UNREGISTER_BROKER: self._unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._get_all_topics,
            RequestCode.GET_TOPICS_BY_CLUSTER: self._get_topics_by_cluster,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
            RequestCode.QUERY_DATA_VERSION: self._query_data_version,
            RequestCode.GET_NAMESRV_CONFIG: self._get_config,
            RequestCode.UPDATE_NAMESRV_CONFIG: self._update_config,
        }

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.server.start()
        if self._scanner is None:
            self._scanner = asyncio.ensure_future(self._scan_loop())
        if self.acl is not None and self._acl_watch is None:
            self._acl_watch = asyncio.ensure_future(self.acl.watch())

    async def stop(self) -> None:
        if self._scanner is not None:
            self._scanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scanner
            self._scanner = None
        if self._acl_watch is not None:
            self._acl_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._acl_watch
            self._acl_watch = None
        await self.server.stop()

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        return self.server.address

    async def __aenter__(self) -> NameServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval_s)
            try:
                self.scan_once()
            except Exception:  # noqa: BLE001 - the timer must survive a bug in one scan
                log.exception("broker expiry scan failed")

    def scan_once(self) -> int:
        """Expire silent brokers now and close their connections (Java closes the channel too)."""
        expired = self.routes.scan_expired()
        for info in expired:
            if isinstance(info.channel, Connection) and not info.channel.closed:
                info.channel.close()
        return len(expired)

    # --- dispatch ---------------------------------------------------------------------------------
    async def process(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        handler = self._handlers.get(cmd.code)
        if handler is None:
            raise UnsupportedRequest(cmd.code)
        if self.acl is not None and cmd.code in NAMESRV_ADMIN_CODES:
            denied = self.acl.check(cmd.code, cmd.ext_fields, cmd.body, conn.peer, int(cmd.version or 0))
            if denied is not None:
                return None if cmd.is_oneway else cmd.response(DENIED_CODE, remark=denied.remark)
        return handler(cmd, conn)

    def _on_connection_closed(self, conn: Connection) -> None:
        gone = self.routes.channel_closed(conn)
        if gone:
            log.info("connection %s closed: dropped %s", conn.peer, ", ".join(i.broker_addr for i in gone))

    # --- brokers ----------------------------------------------------------------------------------
    def _register_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = RegisterBrokerRequestHeader.from_command(cmd)
        if header.body_crc32 and body_crc(cmd.body) != header.body_crc32:
            log.warning("REGISTER_BROKER from %s (%s): body crc32 mismatch", header.broker_addr, conn.peer)
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark="crc32 not match")
        table = self._registered_topics(cmd, header)
        timeout_s = header.heartbeat_timeout_millis / 1000 if header.heartbeat_timeout_millis else None
        result = self.routes.register_broker(
            header.cluster_name, header.broker_name, header.broker_addr, header.broker_id, header.ha_server_addr,
            None if table is None else table.topics, None if table is None else table.data_version,
            channel=conn, timeout_s=timeout_s, enable_acting_master=header.enable_acting_master)
        if not conn.attributes.get(_CONN_TRACKED):
            conn.attributes[_CONN_TRACKED] = True
            conn.add_close_callback(self._on_connection_closed)
        order_conf = self.kv.get(ORDER_TOPIC_NAMESPACE)
        reply = RegisterBrokerResponseHeader(ha_server_addr=result.ha_server_addr or "",
                                             master_addr=result.master_addr or "")
        return cmd.response(ext_fields=reply.to_ext(), body=KVTable(dict(order_conf)).encode() if order_conf else b"")

    @staticmethod
    def _registered_topics(cmd: RemotingCommand, header: RegisterBrokerRequestHeader) -> TopicConfigTable | None:
        """The topic table a registration carries; None without a body (Java: empty, version 0)."""
        if not cmd.body:
            return None
        if cmd.version >= Version.V3_0_11:
            return RegisterBrokerBody.decode(cmd.body, compressed=header.compressed).topic_config_table
        data = loads_lenient(cmd.body, "topic config wrapper")  # pre-3.0.11 brokers: the wrapper alone
        if not isinstance(data, dict):
            raise BodyError("topic config wrapper: not an object")
        try:
            return TopicConfigTable.from_json(data)
        except ConfigFileError as exc:
            raise BodyError(f"topic config wrapper: {exc}") from None

    def _unregister_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = UnRegisterBrokerRequestHeader.from_command(cmd)
        self.routes.unregister_broker(header.cluster_name, header.broker_name, header.broker_addr, header.broker_id)
        return cmd.response()

    def _query_data_version(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = QueryDataVersionRequestHeader.from_command(cmd)
        version = decode_data_version(cmd.body) if cmd.body else DataVersion(counter=0, timestamp=0)
        changed = self.routes.data_version_changed(header.cluster_name, header.broker_addr, version)
        if not changed:
            self.routes.touch(header.cluster_name, header.broker_addr)
        known = self.routes.data_version(header.cluster_name, header.broker_addr)
        return cmd.response(ext_fields={"changed": changed},
                            body=encode_data_version(known) if known is not None else b"")

    # --- routes -----------------------------------------------------------------------------------
    def _get_route(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = GetRouteInfoRequestHeader.from_command(cmd)
        route = self.routes.route(header.topic)
        if route is None:
            log.debug("no route for topic %s (asked by %s)", header.topic, conn.peer)
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, remark=no_route_remark(header.topic))
        if self.order_message_enable:
            route.order_topic_conf = self.kv.get(ORDER_TOPIC_NAMESPACE, {}).get(header.topic)
        # Standard JSON for everyone: the C++ client (version 63) accepts quoted keys too (11.1).
        return cmd.response(body=route.encode())

    def _get_cluster_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.response(body=self.routes.cluster_info().encode())

    def _get_all_topics(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.response(body=TopicList(self.routes.topics()).encode())

    def _get_topics_by_cluster(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = GetTopicsByClusterRequestHeader.from_command(cmd)
        return cmd.response(body=TopicList(self.routes.topics_by_cluster(header.cluster)).encode())

    def _delete_topic(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = DeleteTopicFromNamesrvRequestHeader.from_command(cmd)
        self.routes.delete_topic(header.topic, header.cluster_name)
        return cmd.response()

    # --- own config -------------------------------------------------------------------------------
    def config_values(self) -> dict[str, object]:
        """The settings under Apache's names, as GET_NAMESRV_CONFIG answers them."""
        return {"listenPort": self.port, "orderMessageEnable": self.order_message_enable,
                "scanNotActiveBrokerInterval": round(self.scan_interval_s * 1000)}

    def _get_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.response(body=properties_to_text(self.config_values()).encode(CHARSET))

    def _update_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """Apply every key of the body or none: refusals name all offending keys."""
        if not cmd.body:
            return cmd.response()
        try:
            values = parse_properties(cmd.body.decode(CHARSET))
        except (UnicodeDecodeError, PropertiesError) as exc:
            log.warning("UPDATE_NAMESRV_CONFIG from %s: unreadable body: %s", conn.peer, exc)
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"string2Properties error: {exc}")
        if any(key in CONFIG_BLACK_LIST for key in values):
            return cmd.response(ResponseCode.NO_PERMISSION, remark="Can not update config in black list.")
        changes: dict[str, object] = {}
        problems = []
        unknown = sorted(k for k in values if k not in CONFIG_KEYS)
        if unknown:
            problems.append(f"unknown name server config key(s): {', '.join(unknown)} "
                            f"(this name server has: {', '.join(sorted(CONFIG_KEYS))})")
        for key in sorted(k for k in values if k in CONFIG_KEYS):
            text = values[key].strip()
            if not CONFIG_KEYS[key]:
                problems.append(f"{key} cannot be changed while the name server runs")
            elif key == "orderMessageEnable":
                if text.lower() not in ("true", "false"):
                    problems.append(f"{key}: {values[key]!r} is not true or false")
                else:
                    changes[key] = text.lower() == "true"
            elif not text.isdigit() or int(text) <= 0:
                problems.append(f"{key}: {values[key]!r} is not a positive number of milliseconds")
            else:
                changes[key] = int(text)
        if problems:
            log.warning("UPDATE_NAMESRV_CONFIG from %s refused: %s", conn.peer, "; ".join(problems))
            return cmd.response(ResponseCode.INVALID_PARAMETER, remark="; ".join(problems))
        if "orderMessageEnable" in changes:
            self.order_message_enable = bool(changes["orderMessageEnable"])
        if "scanNotActiveBrokerInterval" in changes:
            self.scan_interval_s = int(changes["scanNotActiveBrokerInterval"]) / 1000  # type: ignore[call-overload]
        log.info("name server config updated by %s: %s", conn.peer, changes)
        return cmd.response()

    # --- KV config --------------------------------------------------------------------------------
    def _put_kv_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = PutKVConfigRequestHeader.from_command(cmd)
        self.kv.setdefault(header.namespace, {})[header.key] = header.value
        log.info("kv config put %s/%s", header.namespace, header.key)
        return cmd.response()

    def _get_kv_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = GetKVConfigRequestHeader.from_command(cmd)
        value = self.kv.get(header.namespace, {}).get(header.key)
        if value is None:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND,
                                remark=f"No config item, Namespace: {header.namespace} Key: {header.key}")
        return cmd.response(ext_fields={"value": value})

    def _delete_kv_config(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = DeleteKVConfigRequestHeader.from_command(cmd)
        table = self.kv.get(header.namespace)
        if table is not None:
            table.pop(header.key, None)
            if not table:
                del self.kv[header.namespace]
        return cmd.response()

    def _get_kv_list(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        header = GetKVListByNamespaceRequestHeader.from_command(cmd)
        table = self.kv.get(header.namespace)
        if not table:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, remark=f"No config item, Namespace: {header.namespace}")
        return cmd.response(body=KVTable(dict(table)).encode())


# =====================================================================================================
# Process entry
# =====================================================================================================
async def serve_name_server(listen: str, *, broker_timeout_s: float = DEFAULT_BROKER_TIMEOUT_S,
                            scan_interval_s: float = DEFAULT_SCAN_INTERVAL_S, reuse_port: bool = False,
                            on_ready: Callable[[NameServer], object] | None = None,
                            stop: asyncio.Event | None = None, acl_file: str | None = None,
                            tls: ServerTls | None = None) -> None:
    """Run a name server on ``listen`` ("host:port") until ``stop`` is set or SIGINT/SIGTERM."""
    host, port = parse_address(listen)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    server = NameServer(host, port, broker_timeout_s=broker_timeout_s, scan_interval_s=scan_interval_s,
                        reuse_port=reuse_port, acl_file=acl_file, tls=tls)
    try:
        await server.start()
        log.info("name server listening on %s (broker timeout %gs)", server.address, broker_timeout_s)
        if on_ready is not None:
            result = on_ready(server)
            if isinstance(result, Awaitable):
                await result
        await stop.wait()
        log.info("name server on %s shutting down", server.address)
    finally:
        await server.stop()
        for sig in installed:
            loop.remove_signal_handler(sig)


def run_name_server(listen: str = f"127.0.0.1:{DEFAULT_PORT}", **kwargs: object) -> None:
    """Blocking entry point: serve until SIGINT/SIGTERM (keyword arguments as :func:`serve_name_server`)."""
    event_loop.run(serve_name_server(listen, **kwargs))  # type: ignore[arg-type]
