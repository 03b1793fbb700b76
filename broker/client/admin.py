"""Admin client: what ``mqadmin`` does for topics, groups and consumer progress.

Every failure, a refusing broker as much as one that cannot be reached, is an
:class:`MQClientError` whose text names the address and the operation, so a command line tool can
print it as one line instead of a transport traceback.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from broker.client.instance import ClientInstance, MQClientError, session_credentials
from broker.remoting.bodies import (
    BrokerStatsData,
    ClusterInfo,
    ConsumeMessageDirectlyResult,
    ConsumerConnection,
    ConsumerRunningInfo,
    ConsumeStats,
    ConsumeStatsList,
    GetConsumerStatusBody,
    GroupList,
    KVTable,
    MessageQueue,
    ProducerConnection,
    QueryConsumeTimeSpanBody,
    QueueTimeSpan,
    ResetOffsetBody,
    TopicList,
    TopicRouteData,
    TopicStatsTable,
    decode_data_version,
    dumps_json,
)
from broker.remoting.codes import MASTER_ID, RequestCode, ResponseCode, response_code_name
from broker.remoting import java_properties
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import (
    CloneGroupOffsetRequestHeader,
    ConsumeMessageDirectlyResultRequestHeader,
    CreateTopicRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    DeleteTopicFromNamesrvRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumerStatusRequestHeader,
    GetConsumeStatsInBrokerHeader,
    GetProducerConnectionListRequestHeader,
    QueryConsumeTimeSpanRequestHeader,
    QueryTopicConsumeByWhoRequestHeader,
    ResetOffsetRequestHeader,
    ViewBrokerStatsDataRequestHeader,
)
from broker.remoting.properties_body import CHARSET, parse_properties, properties_to_text
from broker.remoting.tls import ClientTlsConfig
from broker.remoting.transport import RemotingError
from broker.store.config_files import DataVersion, SubscriptionGroupConfig
from broker.store.message_id import decode_offset_msg_id
from broker.store.topics import DEFAULT_TOPIC, retry_topic

log = logging.getLogger(__name__)

RELAYED_TIMEOUT_S = 15.0  # the broker gives a client 10 s (callClient) before it answers us


@dataclass
class BrokerConfig:
    """GET_BROKER_CONFIG's answer: every setting as text, and the configuration's version."""

    values: dict[str, str]
    version: DataVersion | None


class Admin:
    def __init__(self, namesrv_addr: str, timeout: float = 5.0, *, access_key: str | None = None,
                 secret_key: str | None = None, security_token: str | None = None,
                 tls: ClientTlsConfig | None = None) -> None:
        self.namesrv_addr = namesrv_addr
        self.client = ClientInstance(namesrv_addr, "ADMIN", timeout,
                                     session_credentials(access_key, secret_key, security_token), tls)

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

    def _invoke(self, addr: str, cmd: RemotingCommand, what: str, timeout: float | None = None) -> RemotingCommand:
        """One broker request; refused connections and timeouts become MQClientError naming ``addr``."""
        try:
            resp = self.client.invoke(addr, cmd, timeout)
        except (RemotingError, OSError, TimeoutError) as exc:
            raise MQClientError(f"{what} failed: broker {addr} did not answer ({exc or type(exc).__name__})") from None
        return self._ok(resp, f"{what} on {addr}")

    def _invoke_each_namesrv(self, cmd_factory, what: str) -> dict[str, RemotingCommand]:
        """The same request to every name server (mqadmin's admin verbs address each one); the
        first that cannot be reached or refuses is an MQClientError naming it."""
        answers = {}
        for addr in self.client.namesrv_addrs:
            try:
                resp = self.client.invoke(addr, cmd_factory())
            except (RemotingError, OSError, TimeoutError) as exc:
                raise MQClientError(f"{what} failed: name server {addr} did not answer "
                                    f"({exc or type(exc).__name__})") from None
            answers[addr] = self._ok(resp, f"{what} on name server {addr}")
        return answers

    # ---- name server -------------------------------------------------------------------------------
    def delete_topic_in_namesrv(self, topic: str, cluster: str | None = None) -> None:
        """DELETE_TOPIC_IN_NAMESRV on every name server: the whole topic, or (``cluster``) only
        its queues on that cluster's brokers."""
        ext = DeleteTopicFromNamesrvRequestHeader(topic=topic, cluster_name=cluster or None).to_ext()
        self._invoke_each_namesrv(lambda: RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, ext),
                                  f"delete topic {topic}")

    def namesrv_config(self) -> dict[str, dict[str, str]]:
        """GET_NAMESRV_CONFIG: every name server's settings (address -> key -> value)."""
        answers = self._invoke_each_namesrv(lambda: RemotingCommand.request(RequestCode.GET_NAMESRV_CONFIG),
                                            "get name server config")
        return {addr: parse_properties(resp.body.decode(CHARSET)) for addr, resp in answers.items()}

    def update_namesrv_config(self, values: dict[str, str]) -> None:
        """UPDATE_NAMESRV_CONFIG with ``values`` on every name server (each applies all or none)."""
        body = properties_to_text(values).encode(CHARSET)
        self._invoke_each_namesrv(lambda: RemotingCommand.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=body),
                                  "update name server config")

    def cluster_info(self) -> ClusterInfo:
        resp = self.client.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        return ClusterInfo.decode(self._ok(resp, "cluster info").body)

    def broker_addrs(self) -> dict[str, str]:
        """Master address of every broker name in every cluster."""
        info = self.cluster_info()
        return {name: data.broker_addrs[0] for name, data in info.broker_addr_table.items() if 0 in data.broker_addrs}

    def _known_cluster(self, info: ClusterInfo, cluster: str) -> None:
        """An unknown cluster is an error rather than an empty answer, so a typo does not look like success."""
        if cluster not in info.cluster_addr_table:
            known = ", ".join(sorted(info.cluster_addr_table)) or "none"
            raise MQClientError(f"cluster {cluster!r} is not known to the name server {self.namesrv_addr} "
                                f"(known: {known})")

    def cluster_masters(self, cluster: str) -> dict[str, str]:
        """Broker name -> master address of one cluster (mqadmin's ``fetchMasterAddrByClusterName``)."""
        info = self.cluster_info()
        self._known_cluster(info, cluster)
        masters = {}
        for name in sorted(info.cluster_addr_table[cluster]):
            data = info.broker_addr_table.get(name)
            if data is not None and MASTER_ID in data.broker_addrs:
                masters[name] = data.broker_addrs[MASTER_ID]
        return masters

    def cluster_brokers(self, cluster: str | None = None) -> list[tuple[str, str, int, str]]:
        """(cluster, broker name, broker id, address) of every registered broker, masters and slaves,
        sorted (mqadmin clusterList's rows); only ``cluster``'s when given, which must be known."""
        info = self.cluster_info()
        if cluster is not None:
            self._known_cluster(info, cluster)
        rows = []
        for cluster_name in sorted(info.cluster_addr_table):
            if cluster is not None and cluster_name != cluster:
                continue
            for name in sorted(set(info.cluster_addr_table[cluster_name])):
                data = info.broker_addr_table.get(name)
                if data is not None:  # a name without addresses: the broker unregistered meanwhile
                    rows.extend((cluster_name, name, bid, addr) for bid, addr in sorted(data.broker_addrs.items()))
        return rows

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

    def delete_topic_in_broker(self, broker_addr: str, topic: str) -> None:
        """DELETE_TOPIC_IN_BROKER: config, consume queues and every group's offsets of ``topic``."""
        ext = DeleteTopicRequestHeader(topic=topic).to_ext()
        self._invoke(broker_addr, RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, ext),
                     f"delete topic {topic}")

    def delete_topic(self, topic: str, cluster: str) -> list[str]:
        """``mqadmin deleteTopic``: DELETE_TOPIC_IN_BROKER on every master of ``cluster``, then
        DELETE_TOPIC_IN_NAMESRV (scoped to the cluster) on every name server; the brokers' addresses."""
        masters = self.cluster_masters(cluster)
        if not masters:
            raise MQClientError(f"cluster {cluster!r} has no master broker")
        for addr in masters.values():
            self.delete_topic_in_broker(addr, topic)
        self.delete_topic_in_namesrv(topic, cluster)
        return list(masters.values())

    def delete_subscription_group(self, broker_addr: str, group: str, clean_offset: bool = False) -> None:
        """DELETE_SUBSCRIPTIONGROUP; ``clean_offset`` also removes the group's offsets."""
        ext = DeleteSubscriptionGroupRequestHeader(group_name=group, clean_offset=clean_offset).to_ext()
        self._invoke(broker_addr, RemotingCommand.request(RequestCode.DELETE_SUBSCRIPTIONGROUP, ext),
                     f"delete group {group}")

    def clone_group_offset(self, broker_addr: str, src_group: str, dest_group: str, topic: str,
                           offline: bool = False) -> None:
        """CLONE_GROUP_OFFSET: ``dest_group``'s offsets on ``topic`` become ``src_group``'s."""
        ext = CloneGroupOffsetRequestHeader(src_group=src_group, dest_group=dest_group, topic=topic,
                                            offline=offline).to_ext()
        self._invoke(broker_addr, RemotingCommand.request(RequestCode.CLONE_GROUP_OFFSET, ext),
                     f"clone offsets of {src_group} to {dest_group}")

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

    # ---- broker statistics -------------------------------------------------------------------------
    def broker_runtime_info(self, broker_addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO: Apache's ``KVTable`` (putTps, msgPutTotalTodayNow, …), as mqadmin brokerStatus."""
        resp = self._invoke(broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO),
                            "broker runtime info")
        return KVTable.decode(resp.body).table

    def view_broker_stats_data(self, broker_addr: str, stats_name: str, stats_key: str) -> BrokerStatsData:
        """VIEW_BROKER_STATS_DATA: minute/hour/day of one item, e.g. (``TOPIC_PUT_NUMS``, topic) or
        (``GROUP_GET_NUMS``, ``topic@group``)."""
        header = ViewBrokerStatsDataRequestHeader(stats_name=stats_name, stats_key=stats_key)
        resp = self._invoke(broker_addr, RemotingCommand.request(RequestCode.VIEW_BROKER_STATS_DATA, header.to_ext()),
                            f"stats {stats_name} {stats_key}")
        return BrokerStatsData.decode(resp.body)

    def query_topic_consume_by_who(self, broker_addr: str, topic: str) -> list[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO: groups consuming ``topic`` on that broker (online or with offsets)."""
        header = QueryTopicConsumeByWhoRequestHeader(topic=topic)
        resp = self._invoke(broker_addr,
                            RemotingCommand.request(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, header.to_ext()),
                            f"consumers of {topic}")
        return sorted(GroupList.decode(resp.body).group_list)

    def broker_consume_stats(self, broker_addr: str, is_order: bool = False,
                             timeout: float | None = None) -> ConsumeStatsList:
        """GET_BROKER_CONSUME_STATS: consume stats of every subscription group (mqadmin brokerConsumeStats)."""
        header = GetConsumeStatsInBrokerHeader(is_order=is_order)
        resp = self._invoke(broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_CONSUME_STATS, header.to_ext()),
                            "broker consume stats", timeout)
        return ConsumeStatsList.decode(resp.body)

    def query_consume_time_span(self, broker_addr: str, topic: str, group: str) -> list[QueueTimeSpan]:
        """QUERY_CONSUME_TIME_SPAN: per queue the first/last/last-consumed store times and the delay."""
        header = QueryConsumeTimeSpanRequestHeader(topic=topic, group=group)
        resp = self._invoke(broker_addr, RemotingCommand.request(RequestCode.QUERY_CONSUME_TIME_SPAN, header.to_ext()),
                            f"consume time span {group} {topic}")
        return QueryConsumeTimeSpanBody.decode(resp.body).consume_time_span_set

    # ---- connected clients -------------------------------------------------------------------------
    def _group_broker(self, group: str) -> str:
        """A master serving the group's retry topic: every broker a consumer of the group talks to has
        it (mqadmin's ``examineConsumerConnectionInfo`` asks one broker of that route the same way)."""
        masters = self.route_masters(retry_topic(group))
        if not masters:
            raise MQClientError(f"no master broker serves consumer group {group!r}")
        return masters[sorted(masters)[0]]

    def consumer_connection(self, group: str, broker_addr: str | None = None) -> ConsumerConnection:
        """GET_CONSUMER_CONNECTION_LIST: the group's connected clients and subscriptions."""
        addr = broker_addr or self._group_broker(group)
        resp = self._invoke(addr, RemotingCommand.request(
            RequestCode.GET_CONSUMER_CONNECTION_LIST,
            GetConsumerConnectionListRequestHeader(consumer_group=group).to_ext()), f"consumer connection {group}")
        return ConsumerConnection.decode(resp.body)

    def producer_connection(self, group: str, topic: str) -> ProducerConnection:
        """GET_PRODUCER_CONNECTION_LIST on the first master of ``topic``'s route (as mqadmin)."""
        masters = self.route_masters(topic)
        if not masters:
            raise MQClientError(f"no master broker serves topic {topic!r}")
        addr = masters[sorted(masters)[0]]
        resp = self._invoke(addr, RemotingCommand.request(
            RequestCode.GET_PRODUCER_CONNECTION_LIST,
            GetProducerConnectionListRequestHeader(producer_group=group).to_ext()), f"producer connection {group}")
        return ProducerConnection.decode(resp.body)

    def consumer_running_info(self, group: str, client_id: str, jstack: bool = False,
                              broker_addr: str | None = None) -> ConsumerRunningInfo:
        """GET_CONSUMER_RUNNING_INFO: the broker asks the client and relays its answer."""
        addr = broker_addr or self._group_broker(group)
        ext = GetConsumerRunningInfoRequestHeader(consumer_group=group, client_id=client_id,
                                                  jstack_enable=jstack).to_ext()
        resp = self._invoke_long(addr, RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, ext),
                                 f"consumer running info {group} {client_id}")
        return ConsumerRunningInfo.decode(resp.body)

    def consume_message_directly(self, group: str, client_id: str, offset_msg_id: str) -> ConsumeMessageDirectlyResult:
        """CONSUME_MESSAGE_DIRECTLY to the broker that stored the message (its address is in the
        offset message id): that broker reads the message and has the client's listener consume it."""
        try:
            store_host = decode_offset_msg_id(offset_msg_id).store_host
        except ValueError as exc:
            raise MQClientError(f"{offset_msg_id!r} is not an offset message id: {exc}") from None
        ext = ConsumeMessageDirectlyResultRequestHeader(consumer_group=group, client_id=client_id,
                                                        msg_id=offset_msg_id).to_ext()
        resp = self._invoke_long(str(store_host), RemotingCommand.request(RequestCode.CONSUME_MESSAGE_DIRECTLY, ext),
                                 f"consume message directly {offset_msg_id}")
        return ConsumeMessageDirectlyResult.decode(resp.body)

    def reset_offset_by_time(self, group: str, topic: str, timestamp: int, force: bool = True) -> dict[MessageQueue, int]:
        """INVOKE_BROKER_TO_RESET_OFFSET on every master of ``topic``: the brokers tell the online
        clients of ``group`` where to go on from. MQClientError with code CONSUMER_NOT_ONLINE when
        the group is offline (then :meth:`reset_offset_by_time_offline` is the way, as in mqadmin)."""
        ext = ResetOffsetRequestHeader(group=group, topic=topic, timestamp=timestamp, is_force=force).to_ext()
        table: dict[MessageQueue, int] = {}
        for addr in self.route_masters(topic).values():
            resp = self._invoke(addr, RemotingCommand.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext),
                                f"reset offset of {group} on {topic}")
            table.update(ResetOffsetBody.decode(resp.body).offset_table)
        return table

    def reset_offset_by_time_offline(self, group: str, topic: str, timestamp: int,
                                     force: bool = True) -> dict[MessageQueue, int]:
        """mqadmin's fallback for an offline group: per queue, the offset for the time (the max
        offset for -1) is committed with UPDATE_CONSUMER_OFFSET when ``force`` or when it is not
        beyond the group's committed offset; returns the offsets committed."""
        done: dict[MessageQueue, int] = {}
        for addr in self.route_masters(topic).values():
            stats = self.consumer_progress(addr, group, topic)
            for mq, wrapper in sorted(stats.offset_table.items()):
                if timestamp == -1:
                    code, ext = RequestCode.GET_MAX_OFFSET, {"topic": mq.topic, "queueId": mq.queue_id}
                else:
                    code, ext = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": mq.topic, "queueId": mq.queue_id,
                                                                         "timestamp": timestamp}
                offset = int(self._invoke(addr, RemotingCommand.request(code, ext),
                                          f"offset of {mq}").ext_fields.get("offset", 0))
                if force or offset <= wrapper.consumer_offset:
                    self._invoke(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
                        "consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id, "commitOffset": offset}),
                        f"commit offset of {mq}")
                    done[mq] = offset
        return done

    def consumer_status(self, group: str, topic: str, client_id: str = "") -> dict[str, dict[MessageQueue, int]]:
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS on every master of ``topic``: client id -> the
        offsets it holds in memory (blank ``client_id`` = every client of the group)."""
        ext = GetConsumerStatusRequestHeader(topic=topic, group=group, client_addr=client_id or None).to_ext()
        table: dict[str, dict[MessageQueue, int]] = {}
        for addr in self.route_masters(topic).values():
            resp = self._invoke_long(addr, RemotingCommand.request(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                                                                   ext), f"consumer status of {group}")
            for cid, offsets in GetConsumerStatusBody.decode(resp.body).consumer_table.items():
                table.setdefault(cid, {}).update(offsets)
        return table

    def _invoke_long(self, addr: str, cmd: RemotingCommand, what: str) -> RemotingCommand:
        """A request the broker relays to a client: wait for the broker's own client timeout too."""
        try:
            resp = self.client.invoke(addr, cmd, RELAYED_TIMEOUT_S)
        except (RemotingError, OSError, TimeoutError) as exc:
            raise MQClientError(f"{what} failed: broker {addr} did not answer ({exc or type(exc).__name__})") from None
        return self._ok(resp, f"{what} on {addr}")

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
