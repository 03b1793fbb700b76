"""Admin client: what ``mqadmin`` does for topics, groups and consumer progress.

Every failure, a refusing broker as much as one that cannot be reached, is an
:class:`MQClientError` whose text names the address and the operation, so a command line tool can
print it as one line instead of a transport traceback.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from broker.client.instance import ClientInstance, MQClientError
from broker.remoting.bodies import (
    ClusterInfo,
    ConsumeStats,
    TopicList,
    TopicRouteData,
    TopicStatsTable,
    decode_data_version,
    dumps_json,
)
from broker.remoting.codes import MASTER_ID, RequestCode, ResponseCode, response_code_name
from broker.remoting import java_properties
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import CreateTopicRequestHeader
from broker.remoting.transport import RemotingError
from broker.store.config_files import DataVersion, SubscriptionGroupConfig
from broker.store.topics import DEFAULT_TOPIC

log = logging.getLogger(__name__)


@dataclass
class BrokerConfig:
    """GET_BROKER_CONFIG's answer: every setting as text, and the configuration's version."""

    values: dict[str, str]
    version: DataVersion | None


class Admin:
    def __init__(self, namesrv_addr: str, timeout: float = 5.0) -> None:
        self.namesrv_addr = namesrv_addr
        self.client = ClientInstance(namesrv_addr, "ADMIN", timeout)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ok(self, resp: RemotingCommand, what: str) -> RemotingCommand:
        if resp.code != ResponseCode.SUCCESS:
            raise MQClientError(f"{what} failed: {response_code_name(resp.code)} {resp.remark or ''}".strip(),
                                resp.code)
        return resp

    def _invoke(self, addr: str, cmd: RemotingCommand, what: str) -> RemotingCommand:
        """One broker request; refused connections and timeouts become MQClientError naming ``addr``."""
        try:
            resp = self.client.invoke(addr, cmd)
        except (RemotingError, OSError, TimeoutError) as exc:
            raise MQClientError(f"{what} failed: broker {addr} did not answer ({exc or type(exc).__name__})") from None
        return self._ok(resp, f"{what} on {addr}")

    # ---- name server -------------------------------------------------------------------------------
    def cluster_info(self) -> ClusterInfo:
        resp = self.client.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        return ClusterInfo.decode(self._ok(resp, "cluster info").body)

    def broker_addrs(self) -> dict[str, str]:
        """Master address of every broker name in every cluster."""
        info = self.cluster_info()
        return {name: data.broker_addrs[0] for name, data in info.broker_addr_table.items() if 0 in data.broker_addrs}

    def cluster_masters(self, cluster: str) -> dict[str, str]:
        """Broker name -> master address of one cluster (mqadmin's ``fetchMasterAddrByClusterName``);
        an unknown cluster is an error rather than an empty answer, so a typo does not look like success."""
        info = self.cluster_info()
        if cluster not in info.cluster_addr_table:
            known = ", ".join(sorted(info.cluster_addr_table)) or "none"
            raise MQClientError(f"cluster {cluster!r} is not known to the name server {self.namesrv_addr} "
                                f"(known: {known})")
        masters = {}
        for name in sorted(info.cluster_addr_table[cluster]):
            data = info.broker_addr_table.get(name)
            if data is not None and MASTER_ID in data.broker_addrs:
                masters[name] = data.broker_addrs[MASTER_ID]
        return masters

    def topic_list(self) -> list[str]:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER: every topic any broker registered, sorted."""
        resp = self.client.invoke_namesrv(
            lambda: RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        return sorted(TopicList.decode(self._ok(resp, "topic list").body).topic_list)

    def topics_by_cluster(self, cluster: str) -> list[str]:
        """GET_TOPICS_BY_CLUSTER: one request per cluster instead of one route lookup per topic."""
        resp = self.client.invoke_namesrv(
            lambda: RemotingCommand.request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": cluster}))
        return sorted(TopicList.decode(self._ok(resp, f"topics of cluster {cluster}").body).topic_list)

    def route(self, topic: str) -> TopicRouteData:
        """The name server's route of ``topic``; MQClientError (code TOPIC_NOT_EXIST) when it has none."""
        resp = self.client.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                          {"topic": topic}))
        if resp.code == ResponseCode.TOPIC_NOT_EXIST or (resp.code == ResponseCode.SUCCESS and not resp.body):
            raise MQClientError(f"topic {topic!r} is not known to the name server {self.namesrv_addr}",
                                ResponseCode.TOPIC_NOT_EXIST)
        return TopicRouteData.decode(self._ok(resp, f"route of {topic}").body)

    def route_masters(self, topic: str) -> dict[str, str]:
        """Broker name -> master address of every broker serving ``topic``."""
        return {b.broker_name: b.broker_addrs[MASTER_ID] for b in self.route(topic).broker_datas
                if MASTER_ID in b.broker_addrs}

    def wait_routed(self, topic: str, broker_names: list[str], read_queues: int, write_queues: int, perm: int,
                    timeout: float = 30.0) -> bool:
        """Poll until the name server routes ``topic`` with these queue counts on every broker of
        ``broker_names`` (brokers re-register asynchronously after a topic change, so a client
        started right after ``create_topic`` could otherwise miss the topic or see old counts)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                data = self.route(topic)
            except MQClientError as exc:
                if exc.code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
            else:
                brokers = {b.broker_name for b in data.broker_datas}
                queues = {q.broker_name: (q.read_queue_nums, q.write_queue_nums, q.perm) for q in data.queue_datas}
                if all(n in brokers and queues.get(n) == (read_queues, write_queues, perm) for n in broker_names):
                    return True
            if time.monotonic() >= deadline:
                return False
            log.debug("waiting for the name server to route %s", topic)
            time.sleep(0.2)

    def wait_writable(self, topic: str, timeout: float = 30.0) -> bool:
        """Poll until the name server routes ``topic`` with a writable queue on a master (a producer
        started now finds it); False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            route = self.client.route(topic, refresh=True)
            if route is not None and route.write_queues:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    # ---- brokers -----------------------------------------------------------------------------------
    def create_topic(self, broker_addr: str, topic: str, queues: int = 4, perm: int = 6, order: bool = False, *,
                     read_queues: int | None = None, write_queues: int | None = None) -> None:
        """UPDATE_AND_CREATE_TOPIC on one broker; ``queues`` sets both counts unless given apart."""
        header = CreateTopicRequestHeader(topic=topic, default_topic=DEFAULT_TOPIC,
                                          read_queue_nums=queues if read_queues is None else read_queues,
                                          write_queue_nums=queues if write_queues is None else write_queues,
                                          perm=perm, topic_filter_type="SINGLE_TAG", topic_sys_flag=0, order=order)
        self._invoke(broker_addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext()),
                     f"create topic {topic}")

    def create_subscription_group(self, broker_addr: str, config: SubscriptionGroupConfig) -> None:
        body = dumps_json(config.to_json())
        self._invoke(broker_addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body),
                     f"create group {config.group_name}")

    def topic_stats(self, broker_addr: str, topic: str) -> TopicStatsTable:
        resp = self._invoke(broker_addr, RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}),
                            f"topic stats {topic}")
        return TopicStatsTable.decode(resp.body)

    def consumer_progress(self, broker_addr: str, group: str, topic: str = "") -> ConsumeStats:
        """Like ``mqadmin consumerProgress``: broker offset, consumer offset and lag per queue."""
        ext = {"consumerGroup": group}
        if topic:
            ext["topic"] = topic
        resp = self._invoke(broker_addr, RemotingCommand.request(RequestCode.GET_CONSUME_STATS, ext),
                            f"consume stats {group}")
        return ConsumeStats.decode(resp.body)

    def get_broker_config(self, broker_addr: str) -> BrokerConfig:
        """GET_BROKER_CONFIG (``mqadmin getBrokerConfig``): the body is properties text, the ``version``
        header field the configuration's DataVersion (absent from brokers that do not send it)."""
        resp = self._invoke(broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), "get broker config")
        values = java_properties.loads(resp.body.decode("utf-8"))
        raw_version = resp.ext_fields.get("version")
        version = decode_data_version(raw_version) if raw_version else None
        return BrokerConfig(values, version)

    def update_broker_config(self, broker_addr: str, values: dict[str, str]) -> None:
        """UPDATE_BROKER_CONFIG (``mqadmin updateBrokerConfig``): ``values`` as a properties body."""
        body = "".join(f"{java_properties.escape(k, key=True)}={java_properties.escape(v)}\n"
                       for k, v in values.items()).encode("utf-8")
        self._invoke(broker_addr, RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, body=body),
                     f"update broker config {', '.join(values)}")
