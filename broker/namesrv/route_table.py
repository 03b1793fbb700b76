"""The name server's routing state (Java ``RouteInfoManager``), as pure logic: no sockets, no timers.

Four tables, as in Java (remoting-protocol.md 11.1 and 11.5):

* ``topic -> {brokerName -> QueueData}`` — written only by *master* registrations (brokerId 0);
* ``brokerName -> BrokerData`` (cluster + ``brokerId -> addr``);
* ``cluster -> {brokerName}``;
* live brokers keyed by ``(cluster, brokerAddr)``: last registration time, data version, HA
  address and the connection ("channel") it registered on.

A broker address disappears when it unregisters, when its connection closes, or when it has not
registered for ``broker_timeout_s`` (120 s; a 5.x broker may ask for its own timeout). Removing the
last address of a broker name also removes that name's queue data from every topic, and a topic
left without queue data disappears — exactly what Java does, so clients see the same routes.

Time comes from an injectable ``clock`` (seconds, monotonic by default) so expiry is testable
without sleeping. The server layer (``server.py``) calls :meth:`RouteTable.scan_expired` every few
seconds and maps connection-close events onto :meth:`RouteTable.channel_closed`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.remoting.bodies import BrokerData, ClusterInfo, QueueData, TopicRouteData
from broker.remoting.codes import MASTER_ID
from broker.store.config_files import DataVersion, TopicConfig

log = logging.getLogger(__name__)

DEFAULT_BROKER_TIMEOUT_S = 120.0  # Java BROKER_CHANNEL_EXPIRED_TIME / heartbeatTimeoutMillis default


@dataclass
class BrokerLiveInfo:
    """One registered broker address and when it was last heard of."""

    cluster: str
    broker_name: str
    broker_addr: str
    broker_id: int
    ha_server_addr: str
    data_version: DataVersion
    last_update: float
    timeout_s: float
    channel: Any = None  # opaque token: the connection the registration came on

    def expired(self, now: float) -> bool:
        # Java: lastUpdateTimestamp + timeout < now (strict), so exactly at the limit it is alive
        return self.last_update + self.timeout_s < now


@dataclass(frozen=True)
class RegisterResult:
    """What REGISTER_BROKER answers: for a slave, its master's address and HA address."""

    ha_server_addr: str | None = None
    master_addr: str | None = None


def versions_equal(a: DataVersion | None, b: DataVersion | None) -> bool:
    """Java ``DataVersion.equals``: counter, timestamp and (5.x) stateVersion, null stateVersion = 0."""
    if a is None or b is None:
        return a is b
    return (a.counter, a.timestamp, a.state_version or 0) == (b.counter, b.timestamp, b.state_version or 0)


def _copy_version(version: DataVersion) -> DataVersion:
    return DataVersion(counter=version.counter, timestamp=version.timestamp,
                       state_version=version.state_version, extra=dict(version.extra))


@dataclass
class RouteTable:
    """Brokers, topics and clusters as the name server knows them."""

    broker_timeout_s: float = DEFAULT_BROKER_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    delete_topic_with_broker_registration: bool = False  # Java namesrvConfig default: off

    topic_queue_table: dict[str, dict[str, QueueData]] = field(default_factory=dict)
    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: dict[str, set[str]] = field(default_factory=dict)
    live_table: dict[tuple[str, str], BrokerLiveInfo] = field(default_factory=dict)

    # --- registration -----------------------------------------------------------------------------
    def register_broker(self, cluster: str, broker_name: str, broker_addr: str, broker_id: int,
                        ha_server_addr: str = "", topic_configs: Mapping[str, TopicConfig] | None = None,
                        data_version: DataVersion | None = None, *, channel: Any = None,
                        timeout_s: float | None = None, enable_acting_master: bool | None = None) -> RegisterResult:
        """REGISTER_BROKER. ``topic_configs=None`` means "no body" (addresses only)."""
        version = _copy_version(data_version) if data_version is not None else DataVersion(counter=0, timestamp=0)
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)

        broker = self.broker_addr_table.get(broker_name)
        register_first = broker is None
        if broker is None:
            broker = BrokerData(cluster=cluster, broker_name=broker_name, broker_addrs={})
            self.broker_addr_table[broker_name] = broker
        if enable_acting_master is not None:
            broker.enable_acting_master = enable_acting_master
        # A slave promoted to master re-registers the same address under id 0: drop the old id.
        for other_id, addr in list(broker.broker_addrs.items()):
            if addr == broker_addr and other_id != broker_id:
                del broker.broker_addrs[other_id]
        previous_addr = broker.broker_addrs.get(broker_id)
        broker.broker_addrs[broker_id] = broker_addr
        register_first = register_first or not previous_addr

        key = (cluster, broker_addr)
        previous = self.live_table.get(key)
        if broker_id == MASTER_ID and topic_configs is not None:
            if register_first or previous is None or not versions_equal(previous.data_version, version):
                for config in topic_configs.values():
                    self._update_queue_data(broker_name, config)
                if self.delete_topic_with_broker_registration:
                    self._drop_topics_not_in(broker_name, topic_configs.keys())

        self.live_table[key] = BrokerLiveInfo(
            cluster=cluster, broker_name=broker_name, broker_addr=broker_addr, broker_id=broker_id,
            ha_server_addr=ha_server_addr, data_version=version, last_update=self.clock(),
            timeout_s=self.broker_timeout_s if timeout_s is None or timeout_s <= 0 else timeout_s,
            channel=channel)
        if previous is None:
            log.info("registered broker %s id=%d addr=%s cluster=%s (%d topics)", broker_name, broker_id,
                     broker_addr, cluster, 0 if topic_configs is None else len(topic_configs))

        if broker_id != MASTER_ID:
            master_addr = broker.broker_addrs.get(MASTER_ID)
            if master_addr:
                master = self.live_table.get((cluster, master_addr))
                if master is not None:
                    return RegisterResult(ha_server_addr=master.ha_server_addr, master_addr=master_addr)
        return RegisterResult()

    def _update_queue_data(self, broker_name: str, config: TopicConfig) -> None:
        queues = self.topic_queue_table.setdefault(config.topic_name, {})
        fresh = QueueData(broker_name=broker_name, read_queue_nums=config.read_queue_nums,
                          write_queue_nums=config.write_queue_nums, perm=config.perm,
                          topic_sys_flag=config.topic_sys_flag)
        old = queues.get(broker_name)
        if old != fresh:
            queues[broker_name] = fresh
            log.info("%s queue data of topic %s on %s: %s", "new" if old is None else "changed",
                     config.topic_name, broker_name, fresh)

    def _drop_topics_not_in(self, broker_name: str, keep: Iterable[str]) -> None:
        keep_set = set(keep)
        for topic in [t for t, queues in self.topic_queue_table.items() if broker_name in queues and t not in keep_set]:
            self._remove_queue_data(topic, broker_name)

    def _remove_queue_data(self, topic: str, broker_name: str) -> None:
        queues = self.topic_queue_table.get(topic)
        if queues is None or queues.pop(broker_name, None) is None:
            return
        log.info("removed queue data of topic %s on %s", topic, broker_name)
        if not queues:
            del self.topic_queue_table[topic]
            log.info("topic %s has no queue data left; removed", topic)

    def unregister_broker(self, cluster: str, broker_name: str, broker_addr: str, broker_id: int) -> bool:
        """UNREGISTER_BROKER; True if something was removed.

        Unlike Java, the address must match the registered one for that id, so a late unregister of
        an old address cannot remove a broker that re-registered elsewhere under the same id.
        """
        removed_live = self.live_table.pop((cluster, broker_addr), None) is not None
        broker = self.broker_addr_table.get(broker_name)
        removed_addr = False
        if broker is not None and broker.broker_addrs.get(broker_id) == broker_addr:
            del broker.broker_addrs[broker_id]
            removed_addr = True
            log.info("unregistered broker %s id=%d addr=%s", broker_name, broker_id, broker_addr)
            if not broker.broker_addrs:
                self._remove_broker_name(broker_name)
        return removed_live or removed_addr

    def touch(self, cluster: str, broker_addr: str) -> None:
        """Refresh a broker's liveness without changing anything else (QUERY_DATA_VERSION unchanged)."""
        info = self.live_table.get((cluster, broker_addr))
        if info is not None:
            info.last_update = self.clock()

    # --- removal ----------------------------------------------------------------------------------
    def _remove_address(self, info: BrokerLiveInfo) -> None:
        """Java ``onChannelDestroy``: forget one address; a broker name with none left goes entirely."""
        self.live_table.pop((info.cluster, info.broker_addr), None)
        for name, broker in list(self.broker_addr_table.items()):
            if broker.cluster != info.cluster:
                continue
            for broker_id, addr in list(broker.broker_addrs.items()):
                if addr == info.broker_addr:
                    del broker.broker_addrs[broker_id]
                    log.info("removed address %s (id %d) of broker %s", addr, broker_id, name)
            if not broker.broker_addrs:
                self._remove_broker_name(name)

    def _remove_broker_name(self, broker_name: str) -> None:
        broker = self.broker_addr_table.pop(broker_name, None)
        clusters = [broker.cluster] if broker is not None else list(self.cluster_addr_table)
        for cluster in clusters:
            names = self.cluster_addr_table.get(cluster)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster]
                    log.info("cluster %s has no broker left; removed", cluster)
        for topic in list(self.topic_queue_table):
            self._remove_queue_data(topic, broker_name)
        log.info("broker %s has no address left; removed with its queue data", broker_name)

    def scan_expired(self, now: float | None = None) -> list[BrokerLiveInfo]:
        """Drop every address silent for longer than its timeout; returns what was dropped."""
        now = self.clock() if now is None else now
        expired = [info for info in self.live_table.values() if info.expired(now)]
        for info in expired:
            log.warning("broker %s addr=%s (cluster %s) silent for %.1fs > %.0fs; removing", info.broker_name,
                        info.broker_addr, info.cluster, now - info.last_update, info.timeout_s)
            self._remove_address(info)
        return expired

    def channel_closed(self, channel: Any) -> list[BrokerLiveInfo]:
        """The connection ``channel`` closed: drop every address registered on it (Java does too)."""
        gone = [info for info in self.live_table.values() if info.channel is channel]
        for info in gone:
            log.info("connection of broker %s addr=%s closed; removing", info.broker_name, info.broker_addr)
            self._remove_address(info)
        return gone

    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """DELETE_TOPIC_IN_NAMESRV: the whole topic, or only its queues on one cluster's brokers."""
        if topic not in self.topic_queue_table:
            return False
        if not cluster:
            del self.topic_queue_table[topic]
            return True
        for name in list(self.cluster_addr_table.get(cluster, ())):
            self._remove_queue_data(topic, name)
        return True

    # --- queries ----------------------------------------------------------------------------------
    def route(self, topic: str) -> TopicRouteData | None:
        """Route of ``topic``; None when it has no queue data or none of its brokers is known."""
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        brokers = [self.broker_addr_table[name] for name in sorted(queues) if name in self.broker_addr_table]
        if not brokers:
            return None
        return TopicRouteData(
            queue_datas=[QueueData(**vars(queues[name])) for name in sorted(queues)],
            broker_datas=[BrokerData(cluster=b.cluster, broker_name=b.broker_name,
                                     broker_addrs=dict(sorted(b.broker_addrs.items())),
                                     zone_name=b.zone_name, enable_acting_master=b.enable_acting_master)
                          for b in brokers],
        )

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            broker_addr_table={name: BrokerData(cluster=b.cluster, broker_name=b.broker_name,
                                                broker_addrs=dict(sorted(b.broker_addrs.items())),
                                                zone_name=b.zone_name, enable_acting_master=b.enable_acting_master)
                               for name, b in sorted(self.broker_addr_table.items())},
            cluster_addr_table={c: sorted(names) for c, names in sorted(self.cluster_addr_table.items())},
        )

    def topics(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def topics_by_cluster(self, cluster: str) -> list[str]:
        names = self.cluster_addr_table.get(cluster, set())
        return sorted(t for t, queues in self.topic_queue_table.items() if names.intersection(queues))

    def live_broker(self, cluster: str, broker_addr: str) -> BrokerLiveInfo | None:
        return self.live_table.get((cluster, broker_addr))

    def data_version(self, cluster: str, broker_addr: str) -> DataVersion | None:
        info = self.live_table.get((cluster, broker_addr))
        return None if info is None else info.data_version

    def data_version_changed(self, cluster: str, broker_addr: str, version: DataVersion) -> bool:
        """QUERY_DATA_VERSION: does the broker need to re-register its topics?"""
        return not versions_equal(self.data_version(cluster, broker_addr), version)
