"""The broker's store process: the process that owns the store directory.

The supervisor (:mod:`broker.server.supervisor`) spawns it; it starts the dispatcher process
(:mod:`broker.server.dispatch_process`), and the network processes
(:mod:`broker.server.network_process`) reach it over a Unix socket. See the README's architecture
section for the whole layout and the reasons.

* **store process** (:func:`store_process_main`): owns the store directory — CommitLog append and
  flush (group commit for SYNC_FLUSH), the schedule service, the transaction check service
  (:mod:`broker.server.transaction_check`), the request layer's metadata (topics, groups, consumer and
  delay offsets: :class:`~broker.server.metadata.BrokerMetadata`), the client registry, and
  name-server registration (every 30 s and right after a topic is created), and replication: a
  master's HA service, a slave's HA client and metadata sync (README "Replication"). It serves the network
  processes over a Unix socket (:mod:`broker.server.ipc`) with
  :class:`~broker.server.processors.BrokerCore`: sends on the link's I/O thread, in groups, the
  other requests on a thread pool.
* **dispatcher process** (started by the store process): builds ConsumeQueue and IndexFile from the
  CommitLog like Apache's ReputMessageService, and reports which queues grew.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Callable

from broker.remoting.bodies import RegisterBrokerBody
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnRegisterBrokerRequestHeader,
)
from broker.remoting.tls import client_context
from broker.remoting.transport import SyncRemotingClient
from broker.engine.ha_master import HAMaster
from broker.engine.ha_slave import HAClient
from broker.server.linux_process import GIL_SWITCH_INTERVAL_S, set_process_name
from broker.engine.message_store import MessageStore
from broker.server.metadata import BrokerMetadata
from broker.server.offsets import TopicConfigManager
from broker.engine.store_settings import StoreSettings
from broker.server.processors import BrokerCore
from broker.server.request_reply import SEND_CODES, Reply, Request
from broker.server.schedule import ScheduleService
from broker.server.settings import BrokerSettings
from broker.server.settings.declared import SLAVE, SYNC_MASTER
from broker.server.slave_sync import SlaveSynchronize
from broker.store.hosts import Host

log = logging.getLogger(__name__)

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
    try:
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
    except BaseException:
        # the dispatcher process would keep this one from exiting (multiprocessing joins it)
        log.error("the store process failed to start; stopping its dispatcher process")
        dispatcher.stop()
        raise

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
