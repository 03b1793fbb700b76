"""Typed request/response headers ("custom headers") carried in ``extFields``.

Java decodes ``extFields`` into a header class by field name: ``parseInt``/``parseLong`` for
numbers, ``parseBoolean`` for booleans, a missing ``@CFNotNull`` field is an error, unknown keys
are ignored (section 4 and 8). These dataclasses do the same with two deliberate differences:

* booleans accept the C++ client's ``"1"`` (and any-case ``true``) as true (section 4);
* values may arrive as Python ints/bools (the C++ client mixes JSON numbers and strings, and the
  command decoder already turns them into text — a hand-built dict may not have).

Each header declares its wire names once (``_f``); :meth:`RequestHeader.from_ext` and
:meth:`RequestHeader.to_ext` are derived from that, so a field cannot be parsed under one name and
written under another. Errors are :class:`HeaderError` with ``missing field X`` or
``field X: 'abc' is not an integer``, which the transport returns as a SYSTEM_ERROR remark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from broker.remoting.codes import PullSysFlag, RequestCode
from broker.remoting.command import HeaderError, RemotingCommand, ext_value_to_str, parse_bool, parse_int

__all__ = [
    "HeaderError", "RequestHeader",
    "SendMessageRequestHeader", "SendMessageResponseHeader",
    "PullMessageRequestHeader", "PullMessageResponseHeader",
    "QueryConsumerOffsetRequestHeader", "QueryConsumerOffsetResponseHeader", "UpdateConsumerOffsetRequestHeader",
    "GetConsumerListByGroupRequestHeader", "ConsumerSendMsgBackRequestHeader",
    "SearchOffsetRequestHeader", "SearchOffsetResponseHeader",
    "GetMaxOffsetRequestHeader", "GetMaxOffsetResponseHeader", "GetMinOffsetRequestHeader",
    "GetMinOffsetResponseHeader", "GetEarliestMsgStoretimeRequestHeader", "GetEarliestMsgStoretimeResponseHeader",
    "ViewMessageRequestHeader", "QueryMessageRequestHeader", "QueryMessageResponseHeader",
    "UnregisterClientRequestHeader", "CreateTopicRequestHeader", "GetConsumeStatsRequestHeader",
    "GetTopicStatsInfoRequestHeader", "EndTransactionRequestHeader", "CheckTransactionStateRequestHeader",
    "NotifyConsumerIdsChangedRequestHeader",
    "GetConsumerRunningInfoRequestHeader", "ResetOffsetRequestHeader",
    "GetConsumerConnectionListRequestHeader", "GetProducerConnectionListRequestHeader",
    "ConsumeMessageDirectlyResultRequestHeader", "GetConsumerStatusRequestHeader",
    "RegisterBrokerRequestHeader", "RegisterBrokerResponseHeader", "UnRegisterBrokerRequestHeader",
    "QueryDataVersionRequestHeader", "QueryDataVersionResponseHeader", "GetRouteInfoRequestHeader",
    "GetTopicsByClusterRequestHeader", "PutKVConfigRequestHeader", "GetKVConfigRequestHeader",
    "GetKVConfigResponseHeader", "DeleteKVConfigRequestHeader", "GetKVListByNamespaceRequestHeader",
    "DeleteTopicFromNamesrvRequestHeader", "WipeWritePermOfBrokerRequestHeader",
    "ViewBrokerStatsDataRequestHeader", "GetConsumeStatsInBrokerHeader", "QueryTopicConsumeByWhoRequestHeader",
    "QueryConsumeTimeSpanRequestHeader",
    "DeleteTopicRequestHeader", "DeleteSubscriptionGroupRequestHeader", "CloneGroupOffsetRequestHeader",
]

H = TypeVar("H", bound="RequestHeader")

_KINDS = ("str", "int", "long", "bool")
_BITS = {"int": 32, "long": 64}


def _f(wire: str, kind: str = "str", *, required: bool = False, default: Any = None, v2: str | None = None) -> Any:
    """Declare one header field: its extFields name, Java type, ``@CFNotNull``-ness, V2 letter."""
    assert kind in _KINDS, kind
    metadata = {"wire": wire, "kind": kind, "required": required, "v2": v2}
    if required:
        return field(metadata=metadata)  # kw_only dataclasses allow this after defaulted fields
    return field(default=default, metadata=metadata)


def _convert(wire: str, kind: str, raw: Any, required: bool) -> Any:
    if kind == "str":
        return raw if isinstance(raw, str) else ext_value_to_str(wire, raw)
    if raw == "":
        if required:
            raise HeaderError(f"field {wire}: '' is not {'a boolean' if kind == 'bool' else 'an integer'}")
        return None  # Java would fail on parseInt(""); an empty optional is harmless to ignore
    if kind == "bool":
        return parse_bool(raw)
    return parse_int(wire, raw, bits=_BITS[kind])


def _to_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class RequestHeader:
    """Base of every header dataclass: ``from_ext``/``to_ext`` derived from the field metadata."""

    CODES: ClassVar[tuple[int, ...]] = ()  # request codes that carry this header (documentation/dispatch)

    @classmethod
    def _wire_fields(cls, name_key: str) -> tuple[tuple[str, str, str, bool], ...]:
        """``(attribute, wire name, kind, required)`` of each wire field, derived once per class
        (the send path parses a header per message)."""
        cache = cls.__dict__.get("_wire_cache")
        if cache is None:
            cache = {}
            setattr(cls, "_wire_cache", cache)
        specs = cache.get(name_key)
        if specs is None:
            specs = cache[name_key] = tuple(
                (spec.name, spec.metadata[name_key] or spec.metadata["wire"], spec.metadata["kind"],
                 spec.metadata["required"])
                for spec in fields(cls) if spec.metadata)  # type: ignore[arg-type]
        return specs

    @classmethod
    def _parse(cls: type[H], ext: Mapping[str, Any], name_key: str) -> H:
        values: dict[str, Any] = {}
        for name, wire, kind, required in cls._wire_fields(name_key):
            raw = ext.get(wire)
            if raw is None:
                if required:
                    raise HeaderError(f"missing field {wire}")
                continue  # dataclass default
            value = _convert(wire, kind, raw, required)
            if value is None:
                continue
            values[name] = value
        return cls(**values)

    @classmethod
    def from_ext(cls: type[H], ext: Mapping[str, Any]) -> H:
        """Parse Java-named extFields; unknown keys (credentials, ``ns``, ``bname`` …) are ignored."""
        return cls._parse(ext, "wire")

    @classmethod
    def from_command(cls: type[H], cmd: RemotingCommand) -> H:
        return cls.from_ext(cmd.ext_fields)

    def _emit(self, name_key: str) -> dict[str, str]:
        result: dict[str, str] = {}
        for name, wire, _, _ in self._wire_fields(name_key):  # derived once: a producer emits one per send
            value = getattr(self, name)
            if value is None:
                continue  # Java leaves null fields out of extFields
            result[wire] = _to_text(value)
        return result

    def to_ext(self) -> dict[str, str]:
        """extFields for the wire: every value a string, ``None`` fields left out."""
        return self._emit("wire")


def _header(cls: type) -> type:
    return dataclass(kw_only=True)(cls)


# =====================================================================================================
# Send
# =====================================================================================================
@_header
class SendMessageRequestHeader(RequestHeader):
    """SEND_MESSAGE (10, long names) and SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (310/320, letters)."""

    CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
             RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2)
    V2_CODES: ClassVar[frozenset[int]] = frozenset({RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
                                                    RequestCode.SEND_REPLY_MESSAGE_V2})

    producer_group: str = _f("producerGroup", required=True, v2="a")
    topic: str = _f("topic", required=True, v2="b")
    default_topic: str = _f("defaultTopic", required=True, v2="c")
    default_topic_queue_nums: int = _f("defaultTopicQueueNums", "int", required=True, v2="d")
    queue_id: int = _f("queueId", "int", required=True, v2="e")
    sys_flag: int = _f("sysFlag", "int", required=True, v2="f")
    born_timestamp: int = _f("bornTimestamp", "long", required=True, v2="g")
    flag: int = _f("flag", "int", required=True, v2="h")
    properties: str | None = _f("properties", v2="i")
    reconsume_times: int | None = _f("reconsumeTimes", "int", v2="j")
    unit_mode: bool | None = _f("unitMode", "bool", v2="k")
    max_reconsume_times: int | None = _f("maxReconsumeTimes", "int", v2="l")
    batch: bool | None = _f("batch", "bool", v2="m")
    broker_name: str | None = _f("brokerName", v2="n")

    @classmethod
    def from_ext(cls, ext: Mapping[str, Any], *, v2: bool | None = None) -> SendMessageRequestHeader:
        """``v2=None`` guesses from the keys (letters without long names ⇒ V2)."""
        if v2 is None:
            v2 = "b" in ext and "topic" not in ext
        return cls._parse(ext, "v2" if v2 else "wire")

    @classmethod
    def from_command(cls, cmd: RemotingCommand) -> SendMessageRequestHeader:
        return cls.from_ext(cmd.ext_fields, v2=cmd.code in cls.V2_CODES)

    def to_ext(self, *, v2: bool = False) -> dict[str, str]:
        return self._emit("v2" if v2 else "wire")

    @property
    def is_batch(self) -> bool:
        return bool(self.batch)


@_header
class SendMessageResponseHeader(RequestHeader):
    msg_id: str = _f("msgId", required=True)
    queue_id: int = _f("queueId", "int", required=True)
    queue_offset: int = _f("queueOffset", "long", required=True)
    transaction_id: str | None = _f("transactionId")
    batch_uniq_id: str | None = _f("batchUniqId")


# =====================================================================================================
# Pull and offsets
# =====================================================================================================
@_header
class PullMessageRequestHeader(RequestHeader):
    CODES = (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE)

    consumer_group: str = _f("consumerGroup", required=True)
    topic: str = _f("topic", required=True)
    queue_id: int = _f("queueId", "int", required=True)
    queue_offset: int = _f("queueOffset", "long", required=True)
    max_msg_nums: int = _f("maxMsgNums", "int", required=True)
    sys_flag: int = _f("sysFlag", "int", required=True)
    commit_offset: int = _f("commitOffset", "long", required=True)
    suspend_timeout_millis: int = _f("suspendTimeoutMillis", "long", required=True)
    subscription: str | None = _f("subscription")
    sub_version: int = _f("subVersion", "long", required=True)
    expression_type: str | None = _f("expressionType")
    max_msg_bytes: int | None = _f("maxMsgBytes", "int")
    request_source: int | None = _f("requestSource", "int")
    proxy_forward_client_id: str | None = _f("proxyFrowardClientId")  # sic: Java's spelling

    @property
    def has_commit_offset(self) -> bool:
        return bool(self.sys_flag & PullSysFlag.COMMIT_OFFSET)

    @property
    def has_suspend(self) -> bool:
        return bool(self.sys_flag & PullSysFlag.SUSPEND)

    @property
    def has_subscription(self) -> bool:
        return bool(self.sys_flag & PullSysFlag.SUBSCRIPTION)


@_header
class PullMessageResponseHeader(RequestHeader):
    suggest_which_broker_id: int = _f("suggestWhichBrokerId", "long", required=True)
    next_begin_offset: int = _f("nextBeginOffset", "long", required=True)
    min_offset: int = _f("minOffset", "long", required=True)
    max_offset: int = _f("maxOffset", "long", required=True)
    offset_delta: int | None = _f("offsetDelta", "long")
    topic_sys_flag: int | None = _f("topicSysFlag", "int")
    group_sys_flag: int | None = _f("groupSysFlag", "int")
    forbidden_type: int | None = _f("forbiddenType", "int")


@_header
class QueryConsumerOffsetRequestHeader(RequestHeader):
    CODES = (RequestCode.QUERY_CONSUMER_OFFSET,)

    consumer_group: str = _f("consumerGroup", required=True)
    topic: str = _f("topic", required=True)
    queue_id: int = _f("queueId", "int", required=True)
    set_zero_if_not_found: bool | None = _f("setZeroIfNotFound", "bool")  # None ⇒ true (Java default)


@_header
class QueryConsumerOffsetResponseHeader(RequestHeader):
    offset: int | None = _f("offset", "long")


@_header
class UpdateConsumerOffsetRequestHeader(RequestHeader):
    CODES = (RequestCode.UPDATE_CONSUMER_OFFSET,)

    consumer_group: str = _f("consumerGroup", required=True)
    topic: str = _f("topic", required=True)
    queue_id: int = _f("queueId", "int", required=True)
    commit_offset: int = _f("commitOffset", "long", required=True)


@_header
class GetConsumerListByGroupRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_CONSUMER_LIST_BY_GROUP,)

    consumer_group: str = _f("consumerGroup", required=True)


@_header
class ConsumerSendMsgBackRequestHeader(RequestHeader):
    CODES = (RequestCode.CONSUMER_SEND_MSG_BACK,)

    offset: int = _f("offset", "long", required=True)  # commit-log physical offset
    group: str = _f("group", required=True)
    delay_level: int = _f("delayLevel", "int", required=True)
    origin_msg_id: str | None = _f("originMsgId")
    origin_topic: str | None = _f("originTopic")
    unit_mode: bool = _f("unitMode", "bool", default=False)
    max_reconsume_times: int | None = _f("maxReconsumeTimes", "int")


@_header
class SearchOffsetRequestHeader(RequestHeader):
    CODES = (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,)

    topic: str = _f("topic", required=True)
    queue_id: int = _f("queueId", "int", required=True)
    timestamp: int = _f("timestamp", "long", required=True)
    boundary_type: str | None = _f("boundaryType")  # 5.x: "lower" (default) / "upper"


@_header
class SearchOffsetResponseHeader(RequestHeader):
    offset: int = _f("offset", "long", required=True)


@_header
class GetMaxOffsetRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_MAX_OFFSET,)

    topic: str = _f("topic", required=True)
    queue_id: int = _f("queueId", "int", required=True)
    committed: bool | None = _f("committed", "bool")  # 5.x, None ⇒ true


@_header
class GetMaxOffsetResponseHeader(RequestHeader):
    offset: int = _f("offset", "long", required=True)


@_header
class GetMinOffsetRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_MIN_OFFSET,)

    topic: str = _f("topic", required=True)
    queue_id: int = _f("queueId", "int", required=True)


@_header
class GetMinOffsetResponseHeader(RequestHeader):
    offset: int = _f("offset", "long", required=True)


@_header
class GetEarliestMsgStoretimeRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_EARLIEST_MSG_STORETIME,)

    topic: str = _f("topic", required=True)
    queue_id: int = _f("queueId", "int", required=True)


@_header
class GetEarliestMsgStoretimeResponseHeader(RequestHeader):
    timestamp: int = _f("timestamp", "long", required=True)


@_header
class ViewMessageRequestHeader(RequestHeader):
    CODES = (RequestCode.VIEW_MESSAGE_BY_ID,)

    topic: str | None = _f("topic")
    offset: int = _f("offset", "long", required=True)  # commit-log physical offset


@_header
class QueryMessageRequestHeader(RequestHeader):
    CODES = (RequestCode.QUERY_MESSAGE,)

    topic: str = _f("topic", required=True)
    key: str = _f("key", required=True)
    max_num: int = _f("maxNum", "int", required=True)
    begin_timestamp: int = _f("beginTimestamp", "long", required=True)
    end_timestamp: int = _f("endTimestamp", "long", required=True)
    unique_key_query: bool | None = _f("_UNIQUE_KEY_QUERY", "bool")  # true ⇒ key is a UNIQ_KEY


@_header
class QueryMessageResponseHeader(RequestHeader):
    index_last_update_timestamp: int = _f("indexLastUpdateTimestamp", "long", required=True)
    index_last_update_phyoffset: int = _f("indexLastUpdatePhyoffset", "long", required=True)


# =====================================================================================================
# Clients, admin
# =====================================================================================================
@_header
class UnregisterClientRequestHeader(RequestHeader):
    CODES = (RequestCode.UNREGISTER_CLIENT,)

    client_id: str = _f("clientID", required=True)
    producer_group: str | None = _f("producerGroup")
    consumer_group: str | None = _f("consumerGroup")


@_header
class CreateTopicRequestHeader(RequestHeader):
    """UPDATE_AND_CREATE_TOPIC (17). ``order`` is ``@CFNotNull`` in Java but has a ``false`` default
    there; we accept it missing rather than reject an otherwise complete request."""

    CODES = (RequestCode.UPDATE_AND_CREATE_TOPIC,)

    topic: str = _f("topic", required=True)
    default_topic: str = _f("defaultTopic", required=True)
    read_queue_nums: int = _f("readQueueNums", "int", required=True)
    write_queue_nums: int = _f("writeQueueNums", "int", required=True)
    perm: int = _f("perm", "int", required=True)
    topic_filter_type: str = _f("topicFilterType", required=True)
    topic_sys_flag: int | None = _f("topicSysFlag", "int")
    order: bool = _f("order", "bool", default=False)
    attributes: str | None = _f("attributes")  # 5.x "+key=value,…"
    force: bool | None = _f("force", "bool")


@_header
class DeleteTopicRequestHeader(RequestHeader):
    CODES = (RequestCode.DELETE_TOPIC_IN_BROKER,)

    topic: str = _f("topic", required=True)


@_header
class DeleteSubscriptionGroupRequestHeader(RequestHeader):
    """DELETE_SUBSCRIPTIONGROUP (207). ``cleanOffset`` (4.9.x, a primitive ``boolean`` defaulting to
    false) also removes the group's committed offsets."""

    CODES = (RequestCode.DELETE_SUBSCRIPTIONGROUP,)

    group_name: str = _f("groupName", required=True)
    clean_offset: bool = _f("cleanOffset", "bool", default=False)


@_header
class CloneGroupOffsetRequestHeader(RequestHeader):
    """CLONE_GROUP_OFFSET (314). ``topic`` blank means every topic ``srcGroup`` has offsets for;
    ``offline`` (primitive ``boolean``) skips the check against the source group's online subscriptions."""

    CODES = (RequestCode.CLONE_GROUP_OFFSET,)

    src_group: str = _f("srcGroup", required=True)
    dest_group: str = _f("destGroup", required=True)
    topic: str | None = _f("topic")
    offline: bool = _f("offline", "bool", default=False)


@_header
class GetConsumeStatsRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_CONSUME_STATS,)

    consumer_group: str = _f("consumerGroup", required=True)
    topic: str | None = _f("topic")  # blank ⇒ every topic of the group
    topic_list: str | None = _f("topicList")  # 5.x


@_header
class GetBrokerConfigResponseHeader(RequestHeader):
    CODES = (RequestCode.GET_BROKER_CONFIG,)

    version: str = _f("version", required=True)  # the configuration's DataVersion as JSON


@_header
class GetTopicStatsInfoRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_TOPIC_STATS_INFO,)

    topic: str = _f("topic", required=True)


@_header
class ViewBrokerStatsDataRequestHeader(RequestHeader):
    """VIEW_BROKER_STATS_DATA (315): one item of BrokerStatsManager, e.g. TOPIC_PUT_NUMS / ``Orders``."""

    CODES = (RequestCode.VIEW_BROKER_STATS_DATA,)

    stats_name: str = _f("statsName", required=True)
    stats_key: str = _f("statsKey", required=True)


@_header
class GetConsumeStatsInBrokerHeader(RequestHeader):
    """GET_BROKER_CONSUME_STATS (317): ``isOrder`` keeps only ordered topics."""

    CODES = (RequestCode.GET_BROKER_CONSUME_STATS,)

    is_order: bool = _f("isOrder", "bool", required=True)


@_header
class QueryTopicConsumeByWhoRequestHeader(RequestHeader):
    CODES = (RequestCode.QUERY_TOPIC_CONSUME_BY_WHO,)

    topic: str = _f("topic", required=True)


@_header
class QueryConsumeTimeSpanRequestHeader(RequestHeader):
    CODES = (RequestCode.QUERY_CONSUME_TIME_SPAN,)

    topic: str = _f("topic", required=True)
    group: str = _f("group", required=True)


@_header
class EndTransactionRequestHeader(RequestHeader):
    CODES = (RequestCode.END_TRANSACTION,)

    topic: str | None = _f("topic")
    producer_group: str = _f("producerGroup", required=True)
    tran_state_table_offset: int = _f("tranStateTableOffset", "long", required=True)
    commit_log_offset: int = _f("commitLogOffset", "long", required=True)
    commit_or_rollback: int = _f("commitOrRollback", "int", required=True)  # 8 commit, 12 rollback, 0 unknown
    from_transaction_check: bool | None = _f("fromTransactionCheck", "bool")
    msg_id: str = _f("msgId", required=True)
    transaction_id: str | None = _f("transactionId")


@_header
class CheckTransactionStateRequestHeader(RequestHeader):
    """CHECK_TRANSACTION_STATE (39), broker to producer: the re-put half's queue offset and commitlog
    offset (what the producer's END_TRANSACTION must name), its UNIQ_KEY and offset message id."""

    CODES = (RequestCode.CHECK_TRANSACTION_STATE,)

    tran_state_table_offset: int = _f("tranStateTableOffset", "long", required=True)
    commit_log_offset: int = _f("commitLogOffset", "long", required=True)
    msg_id: str | None = _f("msgId")
    transaction_id: str | None = _f("transactionId")
    offset_msg_id: str | None = _f("offsetMsgId")


@_header
class NotifyConsumerIdsChangedRequestHeader(RequestHeader):
    CODES = (RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,)

    consumer_group: str = _f("consumerGroup", required=True)


@_header
class GetConsumerRunningInfoRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_CONSUMER_RUNNING_INFO,)

    consumer_group: str = _f("consumerGroup", required=True)
    client_id: str = _f("clientId", required=True)
    jstack_enable: bool | None = _f("jstackEnable", "bool")


@_header
class ResetOffsetRequestHeader(RequestHeader):
    CODES = (RequestCode.RESET_CONSUMER_CLIENT_OFFSET, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET)

    group: str = _f("group", required=True)
    topic: str = _f("topic", required=True)
    queue_id: int | None = _f("queueId", "int")  # -1 = all
    offset: int | None = _f("offset", "long")
    timestamp: int = _f("timestamp", "long", required=True)
    is_force: bool = _f("isForce", "bool", required=True)


@_header
class GetConsumerConnectionListRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_CONSUMER_CONNECTION_LIST,)

    consumer_group: str = _f("consumerGroup", required=True)


@_header
class GetProducerConnectionListRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_PRODUCER_CONNECTION_LIST,)

    producer_group: str = _f("producerGroup", required=True)


@_header
class ConsumeMessageDirectlyResultRequestHeader(RequestHeader):
    """CONSUME_MESSAGE_DIRECTLY from an admin (``msgId`` = offset message id) and as forwarded to the
    client (the broker adds ``brokerName``)."""

    CODES = (RequestCode.CONSUME_MESSAGE_DIRECTLY,)

    consumer_group: str = _f("consumerGroup", required=True)
    client_id: str | None = _f("clientId")
    msg_id: str | None = _f("msgId")
    broker_name: str | None = _f("brokerName")


@_header
class GetConsumerStatusRequestHeader(RequestHeader):
    """INVOKE_BROKER_TO_GET_CONSUMER_STATUS (``clientAddr`` holds a client id: blank = every client)
    and GET_CONSUMER_STATUS_FROM_CLIENT."""

    CODES = (RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT)

    topic: str = _f("topic", required=True)
    group: str = _f("group", required=True)
    client_addr: str | None = _f("clientAddr")


# =====================================================================================================
# Name server
# =====================================================================================================
@_header
class RegisterBrokerRequestHeader(RequestHeader):
    CODES = (RequestCode.REGISTER_BROKER,)

    broker_name: str = _f("brokerName", required=True)
    broker_addr: str = _f("brokerAddr", required=True)
    cluster_name: str = _f("clusterName", required=True)
    ha_server_addr: str = _f("haServerAddr", required=True)
    broker_id: int = _f("brokerId", "long", required=True)
    heartbeat_timeout_millis: int | None = _f("heartbeatTimeoutMillis", "long")  # 5.x
    enable_acting_master: bool | None = _f("enableActingMaster", "bool")  # 5.x
    compressed: bool = _f("compressed", "bool", default=False)
    body_crc32: int = _f("bodyCrc32", "int", default=0)


@_header
class RegisterBrokerResponseHeader(RequestHeader):
    ha_server_addr: str | None = _f("haServerAddr")
    master_addr: str | None = _f("masterAddr")


@_header
class UnRegisterBrokerRequestHeader(RequestHeader):
    CODES = (RequestCode.UNREGISTER_BROKER,)

    broker_name: str = _f("brokerName", required=True)
    broker_addr: str = _f("brokerAddr", required=True)
    cluster_name: str = _f("clusterName", required=True)
    broker_id: int = _f("brokerId", "long", required=True)


@_header
class QueryDataVersionRequestHeader(RequestHeader):
    CODES = (RequestCode.QUERY_DATA_VERSION,)

    broker_name: str = _f("brokerName", required=True)
    broker_addr: str = _f("brokerAddr", required=True)
    cluster_name: str = _f("clusterName", required=True)
    broker_id: int = _f("brokerId", "long", required=True)


@_header
class QueryDataVersionResponseHeader(RequestHeader):
    changed: bool | None = _f("changed", "bool")


@_header
class GetRouteInfoRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_ROUTEINFO_BY_TOPIC,)

    topic: str = _f("topic", required=True)
    accept_standard_json_only: bool | None = _f("acceptStandardJsonOnly", "bool")  # 4.9.4+


@_header
class GetTopicsByClusterRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_TOPICS_BY_CLUSTER,)

    cluster: str = _f("cluster", required=True)


@_header
class PutKVConfigRequestHeader(RequestHeader):
    CODES = (RequestCode.PUT_KV_CONFIG,)

    namespace: str = _f("namespace", required=True)
    key: str = _f("key", required=True)
    value: str = _f("value", required=True)


@_header
class GetKVConfigRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_KV_CONFIG,)

    namespace: str = _f("namespace", required=True)
    key: str = _f("key", required=True)


@_header
class GetKVConfigResponseHeader(RequestHeader):
    value: str | None = _f("value")


@_header
class DeleteKVConfigRequestHeader(RequestHeader):
    CODES = (RequestCode.DELETE_KV_CONFIG,)

    namespace: str = _f("namespace", required=True)
    key: str = _f("key", required=True)


@_header
class GetKVListByNamespaceRequestHeader(RequestHeader):
    CODES = (RequestCode.GET_KVLIST_BY_NAMESPACE,)

    namespace: str = _f("namespace", required=True)


@_header
class DeleteTopicFromNamesrvRequestHeader(RequestHeader):
    CODES = (RequestCode.DELETE_TOPIC_IN_NAMESRV,)

    topic: str = _f("topic", required=True)
    cluster_name: str | None = _f("clusterName")


@_header
class WipeWritePermOfBrokerRequestHeader(RequestHeader):
    CODES = (RequestCode.WIPE_WRITE_PERM_OF_BROKER, RequestCode.ADD_WRITE_PERM_OF_BROKER)

    broker_name: str = _f("brokerName", required=True)
