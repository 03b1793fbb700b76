"""The broker's processes and how they are started and stopped.

Process layout (see the README's architecture section for the reasons):

* **supervisor** (the ``rocketlake broker start`` process): starts the others, forwards SIGTERM/SIGINT,
  and stops them in order: network first (no new requests), then the store (flush, checkpoint,
  remove ``abort``).
* **store process**: owns the store directory — CommitLog append and flush (group commit for
  SYNC_FLUSH), the schedule service, the transaction check service
  (:mod:`broker.server.transaction_check`), the request layer's metadata (topics, groups, consumer and
  delay offsets: :class:`~broker.server.metadata.BrokerMetadata`), the client registry, and
  name-server registration (every 30 s and right after a topic is created), and replication: a
  master's HA service, a slave's HA client and metadata sync (README "Replication"). It serves the network
  processes over a Unix socket (:mod:`broker.server.ipc`) with
  :class:`~broker.server.processors.BrokerCore`: sends on the link's I/O thread, in groups, the
  other requests on a thread pool.
* **dispatcher process** (started by the store process): builds ConsumeQueue and IndexFile from the
  CommitLog like Apache's ReputMessageService, and reports which queues grew
  (:mod:`broker.server.dispatch_process`).
* **network processes** (``requestProcesses``, default = cores): each accepts on the same TCP port
  (SO_REUSEPORT), decodes frames and headers, refuses what the ACL refuses (:mod:`broker.acl`,
  with ``aclEnable``) before anything is forwarded, drafts plain sends (:mod:`broker.server.send_draft`:
  their records are encoded here), forwards requests to the store process, encodes the replies,
  parks long-polling pulls until their queue grows, and sends NOTIFY_CONSUMER_IDS_CHANGED to its
  own connections.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from broker.acl.config import acl_file_location, load_rules
from broker.acl.gate import DENIED_CODE, AclGate
from broker.remoting.bodies import RegisterBrokerBody
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnRegisterBrokerRequestHeader,
)
from broker.remoting.tls import ServerTls, client_context
from broker.remoting.transport import Connection, RemotingServer, SyncRemotingClient
from broker.engine.ha_master import HAMaster
from broker.engine.ha_slave import HAClient
from broker.server.linux_process import set_process_name
from broker.engine.message_store import MessageStore
from broker.server.metadata import BrokerMetadata
from broker.server.offsets import TopicConfigManager
from broker.engine.store_settings import StoreSettings
from broker.server.processors import SEND_CODES, BrokerCore, Reply, Request
from broker.server.send_draft import SendDrafter
from broker.server.schedule import ScheduleService
from broker.server.settings import BrokerSettings
from broker.server.settings.declared import SLAVE, SYNC_MASTER
from broker.server.slave_sync import SlaveSynchronize
from broker.store.hosts import Host

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
SLAVE_RETRY_S = 1.0


def store_settings(s: BrokerSettings) -> StoreSettings:
    return StoreSettings(
        segment_bytes=s.mapped_file_size_commit_log, cq_file_bytes=s.mapped_file_size_consume_queue,
        index_slots=s.max_hash_slot_num, index_entries=s.max_index_num, flush_disk_type=s.flush_disk_type,
        flush_interval_ms=s.flush_interval_commit_log, sync_flush_timeout_ms=s.sync_flush_timeout,
        checkpoint_interval_ms=s.flush_interval_consume_queue, persist_interval_ms=s.flush_consumer_offset_interval,
        message_delay_level=s.message_delay_level, default_topic_queue_nums=s.default_topic_queue_nums,
        access_message_in_memory_max_ratio=s.access_message_in_memory_max_ratio,
        max_message_size=s.max_message_size, store_host=Host.parse(s.broker_addr),
        cluster_name=s.broker_cluster_name, broker_name=s.broker_name,
        check_crc_on_recover=s.check_crc_on_recover, auto_create_topic_enable=s.auto_create_topic_enable,
        auto_create_subscription_group=s.auto_create_subscription_group, external_dispatch=True)


# =====================================================================================================
# store process
# =====================================================================================================
class NameServerRegistrar:
    """Registers the broker's topics with every name server: periodically and when topics change."""

    def __init__(self, settings: BrokerSettings, topics: TopicConfigManager,
                 on_master: Callable[[str | None, str], None] | None = None, ha_server_addr: str = "") -> None:
        self.settings = settings
        self.topics = topics
        self.ha_server_addr = ha_server_addr  # what slaves connect to ("" when nothing listens)
        # a slave learns its master's remoting and HA addresses from the result (RegisterBrokerResult);
        # until it has them, it registers again every second instead of every period
        self.on_master = on_master
        self.master_known = on_master is None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="namesrv-register", daemon=True)
        tls = settings.client_tls()
        context = client_context(tls) if tls is not None else None  # useTLS: registration over TLS
        self._clients = {addr: SyncRemotingClient(addr, tls=context) for addr in settings.namesrv_addrs}

    def start(self) -> None:
        if self._clients:
            self._thread.start()

    def changed(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        period = max(10_000, min(60_000, self.settings.register_name_server_period)) / 1000
        while not self._stop.is_set():
            try:
                self.register_once()
            except Exception:  # keep registering: a name server forgets a broker silent for 2 minutes
                log.exception("name server registration failed")
            self._wake.wait(period if self.master_known else min(period, SLAVE_RETRY_S))
            self._wake.clear()

    def _header(self) -> dict[str, str]:
        s = self.settings
        return RegisterBrokerRequestHeader(broker_name=s.broker_name, broker_addr=s.broker_addr,
                                           cluster_name=s.broker_cluster_name, ha_server_addr=self.ha_server_addr,
                                           broker_id=s.broker_id).to_ext()

    def register_once(self) -> None:
        with self.topics.lock:  # request threads create topics meanwhile
            body = RegisterBrokerBody(self.topics.table).encode()
        for addr, client in self._clients.items():
            try:
                resp = client.invoke(RemotingCommand.request(RequestCode.REGISTER_BROKER, self._header(), body),
                                     timeout=3.0)
                if resp.code != ResponseCode.SUCCESS:
                    log.warning("name server %s refused registration: %s %s", addr, resp.code, resp.remark)
                elif self.on_master is not None:
                    result = RegisterBrokerResponseHeader.from_ext(resp.ext_fields)
                    if result.master_addr:
                        self.master_known = True
                        self.on_master(result.ha_server_addr, result.master_addr)
            except Exception as exc:
                log.warning("cannot register with name server %s: %s", addr, exc)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        s = self.settings
        ext = UnRegisterBrokerRequestHeader(broker_name=s.broker_name, broker_addr=s.broker_addr,
                                            cluster_name=s.broker_cluster_name, broker_id=s.broker_id).to_ext()
        for addr, client in self._clients.items():
            try:
                client.invoke(RemotingCommand.request(RequestCode.UNREGISTER_BROKER, ext), timeout=2.0)
            except Exception as exc:
                log.info("unregister from %s failed: %s", addr, exc)
            client.close()


class _GrowthBatcher:
    """Coalesces "queue grew" notices into one IPC event every few ms (long-polling wake-ups)."""

    def __init__(self, send, interval_s: float = 0.002) -> None:
        self._send = send
        self._pending: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._interval = interval_s
        self._stop = False
        threading.Thread(target=self._run, name="grow-events", daemon=True).start()

    def grew(self, topic: str, queue_id: int, max_offset: int) -> None:
        with self._lock:
            self._pending[(topic, queue_id)] = max_offset
        self._event.set()

    def _run(self) -> None:
        while not self._stop:
            self._event.wait()
            time.sleep(self._interval)
            self._event.clear()
            with self._lock:
                items, self._pending = self._pending, {}
            if items:
                self._send(("grew", [(t, q, o) for (t, q), o in items.items()]))

    def stop(self) -> None:
        self._stop = True
        self._event.set()


# Request threads hand the GIL to each other constantly; Python's default 5 ms switch interval
# would put that much latency on a contended hand-off.
GIL_SWITCH_INTERVAL_S = 0.0002


def store_process_main(settings: BrokerSettings, store_dir: str, socket_path: str, ready, log_level: int,
                       config_path: str | None = None) -> None:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    set_process_name("rl-store")
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s [store] %(name)s: %(message)s")
    from broker.server.client_calls import IpcClientCaller
    from broker.server.ipc import IpcServer

    from broker.server.dispatch_process import ExternalDispatcher

    if settings.broker_role == SLAVE:
        from broker.engine.ha_slave import truncate_ahead_of_master

        truncate_ahead_of_master(store_dir, settings.mapped_file_size_commit_log, settings.ha_master_address,
                                 settings.ha_slave_cut_back)
    store = MessageStore(store_dir, store_settings(settings))
    report = store.open()
    log.info("store opened: %s", report.summary() if hasattr(report, "summary") else report)
    dispatcher = ExternalDispatcher(store, log_level)
    dispatcher.start()
    store.start_background()
    metadata = BrokerMetadata(store)
    metadata.start()
    schedule = ScheduleService(store, metadata.delay_offsets)
    replication = start_replication(store, settings)
    slave_sync: SlaveSynchronize | None = None
    on_master: Callable[[str | None, str], None] | None = None
    if settings.broker_role == SLAVE:  # its delay topic fills from its master's log: no schedule service
        slave_sync = SlaveSynchronize(metadata)
        slave_sync.start()

        def follow_master(ha_addr: str | None, master_addr: str) -> None:
            if ha_addr and not settings.ha_master_address:  # a configured address stays (Apache's rule)
                replication.update_master_address(ha_addr)
            slave_sync.set_master_addr(master_addr)
        on_master = follow_master
    else:
        schedule.start()
    ha_addr = "" if isinstance(replication, HAMaster) and not replication.listening else settings.ha_server_addr
    registrar = NameServerRegistrar(settings, metadata.topics, on_master, ha_addr)
    core = BrokerCore(store, metadata, cluster_name=settings.broker_cluster_name, broker_name=settings.broker_name,
                      broker_addr=settings.broker_addr, max_message_size=settings.max_message_size,
                      auto_create_topic=settings.auto_create_topic_enable, on_topics_changed=registrar.changed,
                      settings=settings, config_path=config_path)
    server: IpcServer | None = None
    caller = IpcClientCaller(lambda pid, event: server.send_to(pid, event))
    core.admin_clients.caller = caller
    from broker.server.transaction_check import TransactionCheckService

    transaction_check = TransactionCheckService(core, caller)  # asks producers about open half messages

    def handle(req: Request):
        reply = core.process(req)
        for note in reply.notify:
            server.broadcast(("notify", note.group, note.channels))
        reply.notify = []
        return reply if reply.deferred is None else reply.deferred  # a Future: answered when a client answers

    def on_closed(channel) -> None:
        for note in core.channel_closed(channel):
            server.broadcast(("notify", note.group, note.channels))

    def handle_sends(reqs: list[Request]) -> list[Reply]:
        return core.send_messages(reqs)

    server = IpcServer(socket_path, handle, on_closed, lane=lambda req: req.code in SEND_CODES,
                       handle_batch=handle_sends, on_call_reply=caller.on_reply,
                       on_process_gone=caller.process_gone)
    core.stats.queue_sizes = server.queue_sizes
    growth = _GrowthBatcher(server.broadcast)
    store.add_dispatch_listener(growth.grew)
    server.start()
    registrar.start()
    transaction_check.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ready.set()

    def expire_clients() -> None:
        while not stop.wait(10):
            for note in core.clients.scan_expired():
                server.broadcast(("notify", note.group, note.channels))

    threading.Thread(target=expire_clients, name="client-expiry", daemon=True).start()
    stop.wait()
    log.info("store process stopping")
    registrar.stop()
    transaction_check.stop()
    schedule.stop()
    server.close()
    replication.stop()
    if slave_sync is not None:
        slave_sync.stop()
    dispatcher.stop()  # everything appended is in the consume queues and the index
    growth.stop()
    metadata.close()  # no request runs any more: every committed offset is written, under the store's lock
    store.close()
    log.info("store closed cleanly")


def start_replication(store: MessageStore, settings: BrokerSettings) -> HAMaster | HAClient:
    """The HA side of the role: a master accepts slaves (and a SYNC_MASTER's sends wait for one); a
    slave refuses sends and replicates its master (:mod:`broker.engine.ha_master`, :mod:`broker.engine.ha_slave`)."""
    if settings.broker_role == SLAVE:
        store.slave_mode = True
        client = HAClient(store, settings.ha_master_address or None, heartbeat_ms=settings.ha_send_heartbeat_interval,
                          housekeeping_ms=settings.ha_housekeeping_interval)
        client.start()
        return client
    master = HAMaster(store, settings.listen_host, settings.effective_ha_listen_port,
                      batch_bytes=settings.ha_transfer_batch_size, heartbeat_ms=settings.ha_send_heartbeat_interval,
                      housekeeping_ms=settings.ha_housekeeping_interval,
                      fallbehind_max=settings.ha_slave_fallbehind_max, sync_timeout_ms=settings.sync_flush_timeout)
    try:
        master.start()
    except OSError as exc:
        # the derived port (listenPort + 1) may be taken by anything on a busy host; an ASYNC_MASTER
        # then runs as rocketlake ran before replication (no slaves), saying so and registering no HA
        # address. A configured port, or a SYNC_MASTER (whose sends need a slave), must not start.
        if settings.ha_listen_port or settings.broker_role == SYNC_MASTER:
            raise
        log.error("%s; this master runs without slaves (set haListenPort to a free port to replicate it)", exc)
    if settings.broker_role == SYNC_MASTER:
        store.replica_gate = master.replica_status
    return master


# =====================================================================================================
# network processes
# =====================================================================================================
class NetworkFrontend:
    """One network process: TCP ↔ frames ↔ store process, plus long polling."""

    def __init__(self, settings: BrokerSettings, socket_path: str, acl_path: str | None = None) -> None:
        self.settings = settings
        self.socket_path = socket_path
        # checked here, before a request is forwarded: a refused one never reaches the store process
        self.acl = AclGate(acl_path) if acl_path else None
        self.pid = os.getpid()
        self._conn_ids: dict[int, Connection] = {}
        self._next_conn = 0
        self._waiters: dict[tuple[str, int], list[tuple[int, asyncio.Future]]] = {}
        from broker.server.ipc import IpcClient

        self.link = IpcClient(socket_path, self._on_event)
        # plain sends are drafted here, their records encoded: the store process only places them
        self.drafter = SendDrafter(settings.broker_cluster_name, Host.parse(settings.broker_addr),
                                   settings.max_message_size)
        tls = settings.server_tls()  # each network process watches the certificate files itself
        self.server = RemotingServer(settings.listen_host, settings.listen_port, self.process,
                                     max_frame=settings.max_frame_length, name="broker", reuse_port=True,
                                     fast_handler=self.take_send, tls=ServerTls(tls) if tls.enabled else None)

    def _channel(self, conn: Connection) -> tuple[int, int]:
        ident = conn.attributes.get("rocketlake.channel")
        if ident is None:
            self._next_conn += 1
            ident = (self.pid, self._next_conn)
            conn.attributes["rocketlake.channel"] = ident
            self._conn_ids[ident[1]] = conn

            def closed(*_args) -> None:
                self._conn_ids.pop(ident[1], None)
                self.link.notify_closed(ident)

            conn.add_close_callback(closed)
        return ident

    def _on_event(self, event) -> None:
        if event[0] == "grew":
            for topic, qid, max_offset in event[1]:
                waiters = self._waiters.get((topic, qid))
                if not waiters:
                    continue
                keep = []
                for offset, fut in waiters:
                    if max_offset > offset and not fut.done():
                        fut.set_result(True)
                    elif not fut.done():
                        keep.append((offset, fut))
                if keep:
                    self._waiters[(topic, qid)] = keep
                else:
                    self._waiters.pop((topic, qid), None)
        elif event[0] == "notify":
            _, group, channels = event
            for pid, serial in channels:
                if pid != self.pid:
                    continue
                conn = self._conn_ids.get(serial)
                if conn is not None and not conn.closed:
                    cmd = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                  {"consumerGroup": group}, oneway=True)
                    asyncio.ensure_future(self._notify(conn, cmd))
        elif event[0] == "call":  # the store process asks one of our clients something
            _, call_id, serial, request = event
            asyncio.ensure_future(self._call_client(call_id, self._conn_ids.get(serial), request))

    async def _call_client(self, call_id: int, conn: Connection | None, request) -> None:
        from broker.server.client_calls import call_client

        self.link.send_call_reply(call_id, await call_client(conn, request))

    async def _notify(self, conn: Connection, cmd: RemotingCommand) -> None:
        try:
            await conn.send_oneway(cmd)
        except Exception as exc:
            log.debug("notify to %s failed: %s", conn.peer, exc)

    async def _park(self, topic: str, qid: int, offset: int, timeout_ms: int) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.setdefault((topic, qid), []).append((offset, fut))
        try:
            await asyncio.wait_for(fut, timeout_ms / 1000)
        except asyncio.TimeoutError:
            pass
        finally:
            waiters = self._waiters.get((topic, qid))
            if waiters:
                self._waiters[(topic, qid)] = [w for w in waiters if w[1] is not fut]
                if not self._waiters[(topic, qid)]:
                    del self._waiters[(topic, qid)]

    def _refused(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        """Apache's answer to a request the ACL refuses (None: it may pass)."""
        denied = self.acl.check(cmd.code, cmd.ext_fields, cmd.body, conn.peer, int(cmd.version or 0))
        return None if denied is None else cmd.response(DENIED_CODE, denied.remark)

    async def process(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        if self.acl is not None and (refusal := self._refused(cmd, conn)) is not None:
            return None if cmd.is_oneway else refusal
        req = Request(code=cmd.code, ext=dict(cmd.ext_fields), body=cmd.body, channel=self._channel(conn),
                      peer=conn.peer, language=str(cmd.language), version=int(cmd.version or 0))
        try:
            reply: Reply = await self.link.call(req)
            if reply.suspend is not None:
                topic, qid, offset, timeout = reply.suspend
                await self._park(topic, qid, offset, timeout)
                req.resumed = True
                reply = await self.link.call(req)
        except ConnectionError:
            return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, "broker is shutting down")
        if cmd.is_oneway:
            return None
        return cmd.response(reply.code, reply.remark, reply.ext, reply.body)

    def take_send(self, cmd: RemotingCommand, conn: Connection) -> bool:
        """Sends skip the task-per-request path: forwarded with a callback that answers on the
        connection (they never park, and they are most of a busy broker's requests)."""
        if cmd.code not in SEND_CODES:
            return False
        if self.acl is not None and (refusal := self._refused(cmd, conn)) is not None:
            conn.answer(cmd, refusal)  # the transport gives this path requests that want an answer only
            return True
        channel = self._channel(conn)
        req = self.drafter.draft(cmd.code, cmd.ext_fields, cmd.body, conn.peer, channel) or \
            Request(code=cmd.code, ext=dict(cmd.ext_fields), body=cmd.body, channel=channel, peer=conn.peer,
                    language=str(cmd.language), version=int(cmd.version or 0))

        def answer(reply) -> None:
            if isinstance(reply, Reply):
                conn.answer_with(cmd, reply.code, reply.remark, reply.ext, reply.body)
            elif isinstance(reply, ConnectionError):  # the store process is gone
                conn.answer_with(cmd, ResponseCode.SERVICE_NOT_AVAILABLE, "broker is shutting down")
            else:  # the store process's last resort: the batch failed as a whole
                conn.answer_with(cmd, ResponseCode.SYSTEM_ERROR, f"{type(reply).__name__}: {reply}")

        self.link.submit(req, answer)
        return True

    async def run(self, ready, stop: asyncio.Event) -> None:
        await self.link.connect()
        await self.server.start()
        ready.set()
        acl_watch = asyncio.create_task(self.acl.watch()) if self.acl is not None else None
        closed = asyncio.create_task(self.link.closed.wait())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({closed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if acl_watch is not None:
            acl_watch.cancel()
        await self.server.stop()
        await self.link.close()


def network_process_main(settings: BrokerSettings, socket_path: str, ready, log_level: int, index: int = 0,
                         acl_path: str | None = None) -> None:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    set_process_name(f"rl-net-{index}")
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s [net] %(name)s: %(message)s")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await NetworkFrontend(settings, socket_path, acl_path).run(ready, stop)

    asyncio.run(main())


# =====================================================================================================
# supervisor
# =====================================================================================================
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
        ready = self._ctx.Event()
        store = self._ctx.Process(target=store_process_main, name="rocketlake-store",
                                  args=(self.settings, self.store_dir, socket_path, ready, self.log_level,
                                        self.config_path))
        store.start()
        self.procs = BrokerProcesses(store, [], sock_dir)
        self._wait(ready, store, "store process")
        for i in range(self.settings.request_processes):
            net_ready = self._ctx.Event()
            proc = self._ctx.Process(target=network_process_main, name=f"rocketlake-net-{i}",
                                     args=(self.settings, socket_path, net_ready, self.log_level, i, self.acl_path))
            proc.start()
            self.procs.network.append(proc)
            self._wait(net_ready, proc, f"network process {i}")
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
               config_path: str | os.PathLike | None = None) -> int:
    """Foreground broker for the CLI: runs until SIGTERM/SIGINT, then stops cleanly."""
    broker = Broker(settings, store_dir, log_level, config_path)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
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
