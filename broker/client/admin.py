"""Admin client: what ``mqadmin`` does for topics, groups and consumer progress."""

from __future__ import annotations

from broker.client.instance import ClientInstance, MQClientError
from broker.remoting.bodies import ClusterInfo, ConsumeStats, TopicStatsTable, dumps_json
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import CreateTopicRequestHeader
from broker.store.config_files import SubscriptionGroupConfig


class Admin:
    def __init__(self, namesrv_addr: str, timeout: float = 5.0) -> None:
        self.client = ClientInstance(namesrv_addr, "ADMIN", timeout)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ok(self, resp: RemotingCommand, what: str) -> RemotingCommand:
        if resp.code != ResponseCode.SUCCESS:
            raise MQClientError(f"{what} failed: code {resp.code} {resp.remark or ''}".strip(), resp.code)
        return resp

    def cluster_info(self) -> ClusterInfo:
        resp = self.client.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        return ClusterInfo.decode(self._ok(resp, "cluster info").body)

    def broker_addrs(self) -> dict[str, str]:
        """Master address of every broker name in every cluster."""
        info = self.cluster_info()
        return {name: data.broker_addrs[0] for name, data in info.broker_addr_table.items() if 0 in data.broker_addrs}

    def create_topic(self, broker_addr: str, topic: str, queues: int = 4, perm: int = 6, order: bool = False) -> None:
        header = CreateTopicRequestHeader(topic=topic, default_topic="TBW102", read_queue_nums=queues,
                                          write_queue_nums=queues, perm=perm, topic_filter_type="SINGLE_TAG",
                                          topic_sys_flag=0, order=order)
        self._ok(self.client.invoke(broker_addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                                                         header.to_ext())), f"create topic {topic}")

    def create_subscription_group(self, broker_addr: str, config: SubscriptionGroupConfig) -> None:
        body = dumps_json(config.to_json())
        self._ok(self.client.invoke(broker_addr, RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)), f"create group {config.group_name}")

    def topic_stats(self, broker_addr: str, topic: str) -> TopicStatsTable:
        resp = self.client.invoke(broker_addr, RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO,
                                                                       {"topic": topic}))
        return TopicStatsTable.decode(self._ok(resp, f"topic stats {topic}").body)

    def consumer_progress(self, broker_addr: str, group: str, topic: str = "") -> ConsumeStats:
        """Like ``mqadmin consumerProgress``: broker offset, consumer offset and lag per queue."""
        ext = {"consumerGroup": group}
        if topic:
            ext["topic"] = topic
        resp = self.client.invoke(broker_addr, RemotingCommand.request(RequestCode.GET_CONSUME_STATS, ext))
        return ConsumeStats.decode(self._ok(resp, f"consume stats {group}").body)
