"""JSON bodies of remoting commands (remoting-protocol.md section 11), read and written.

RocketMQ bodies are fastjson output, and fastjson is not JSON:

* ``Map<Integer,…>`` keys come out bare (``{0:"127.0.0.1:10911"}``) — route data and cluster info
  from a Java name server to old clients, and the C++ client accepts both forms;
* ``Map<MessageQueue,…>`` keys come out as *objects* (``{{"brokerName":…}:{…}}``) — ConsumeStats,
  TopicStatsTable, the C++ client's ConsumerRunningInfo (section 11.4/11.6);
* enums are written by name by Java and by ordinal by the C++ client; ``subVersion`` is a number
  from Java and a string from C++ (section 11.2).

Reading therefore tries the fast strict parser first and falls back to the lenient fastjson reader
of :mod:`broker.store.config_files`, extended here (by subclassing, not editing) to accept object
keys as :class:`FrozenObject`. Writing uses plain JSON (quoted keys) wherever every client accepts
it, and :func:`dumps_fastjson_compact` where a Java reader *needs* fastjson's form (object keys).

Every model has ``to_json()``/``from_json()`` (Python values) and ``encode()``/``decode()`` (bytes);
decode errors are :class:`BodyError`, a :class:`ProtocolError`, so the transport answers them with
SYSTEM_ERROR instead of dropping the connection.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum
from typing import Any

from broker.remoting.command import ProtocolError
from broker.store.config_files import (
    ConfigFileError,
    DataVersion,
    FastjsonDecodeError,
    TopicConfig,
    TopicConfigTable,
    _INTEGER_TEXT,
    _Parser,
    coerce_int,
)

MAX_INFLATED_BODY = 64 * 1024 * 1024  # a compressed registration bigger than this is refused


class BodyError(ProtocolError):
    """A body that does not parse or does not have the expected shape."""


# =====================================================================================================
# Lenient reading
# =====================================================================================================
class FrozenObject(tuple):
    """A JSON object used as a map key (fastjson ``Map<Bean,…>``): sorted ``(key, value)`` pairs.

    Hashable so it can be a dict key; :meth:`to_dict` gives the object back.
    """

    __slots__ = ()

    @classmethod
    def from_dict(cls, obj: Mapping[Any, Any]) -> FrozenObject:
        return cls(sorted(((k, _freeze(v)) for k, v in obj.items()), key=lambda kv: str(kv[0])))

    def to_dict(self) -> dict[Any, Any]:
        return {k: _thaw(v) for k, v in self}


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return FrozenObject.from_dict(value)
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, FrozenObject):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


class _ObjectKeyParser(_Parser):
    """config_files' fastjson reader plus object-valued keys."""

    def _key(self) -> Any:
        self._skip_ws()
        if self._peek() == "{":
            return FrozenObject.from_dict(self._object())
        return super()._key()


def loads_lenient(data: bytes | str, what: str = "body") -> Any:
    """Parse strict JSON quickly, or fastjson output (bare int keys, object keys) when it is not.

    Unquoted integer keys come back as ``int``, object keys as :class:`FrozenObject`; a trailing
    newline (the C++ client ends its bodies with one) is fine.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BodyError(f"{what} is not valid UTF-8 at byte {exc.start}") from None
    else:
        text = data
    text = text.lstrip("\ufeff")
    try:
        return json.loads(text)
    except RecursionError:
        raise BodyError(f"{what} nests too deeply") from None
    except ValueError:
        pass
    try:
        return _ObjectKeyParser(text).parse_document()
    except FastjsonDecodeError as exc:
        raise BodyError(f"{what} does not parse: {exc}") from None
    except RecursionError:
        raise BodyError(f"{what} nests too deeply") from None


def _object(value: Any, what: str) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BodyError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _array(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BodyError(f"{what}: expected an array, got {type(value).__name__}")
    return value


def _int(value: Any, what: str, default: int | None = None) -> int:
    """fastjson coerces numeric strings into int/long fields, and so do we (C++ ``subVersion``)."""
    if value is None:
        if default is None:
            raise BodyError(f"{what}: missing")
        return default
    return coerce_int(value, what, BodyError)


def _str(value: Any, what: str, default: str | None = None) -> str:
    if value is None:
        if default is None:
            raise BodyError(f"{what}: missing")
        return default
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise BodyError(f"{what}: expected a string, got {type(value).__name__}")


def _bool(value: Any, what: str, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise BodyError(f"{what}: expected a boolean, got {value!r:.60}")


def _float(value: Any, what: str, default: float = 0.0) -> float:
    if value is None:
        return default
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise BodyError(f"{what}: expected a number, got {value!r:.60}")


def _root(body: bytes | str, what: str) -> dict[Any, Any]:
    data = loads_lenient(body, what)
    if not isinstance(data, dict):
        raise BodyError(f"{what}: top-level value is {type(data).__name__}, not an object")
    return data


# =====================================================================================================
# Writing
# =====================================================================================================
def dumps_json(value: Any) -> bytes:
    """Compact, key-sorted, UTF-8 JSON (quoted keys): what every client reads."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")


def dumps_fastjson_compact(value: Any, *, bare_int_keys: bool = True) -> str:
    """Serialise like fastjson's ``toJSONString`` (not pretty): the form Java admin tools parse.

    ``int`` keys are written bare (unless ``bare_int_keys=False``), keys that are
    :class:`FrozenObject`, mappings or objects with ``to_json()`` (e.g. :class:`MessageQueue`) are
    written as JSON objects, ``None`` values are left out of objects. Mapping order is kept, so
    callers decide it (beans: alphabetical, like fastjson).
    """
    out: list[str] = []
    _write(out, value, bare_int_keys)
    return "".join(out)


def _write(out: list[str], value: Any, bare: bool) -> None:
    if hasattr(value, "to_json") and not isinstance(value, (dict, list, tuple, str)):
        value = value.to_json()
    if isinstance(value, FrozenObject):
        value = value.to_dict()
    if value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(repr(value) if math.isfinite(value) else "null")
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for key, item in value.items():
            if item is None:
                continue
            if not first:
                out.append(",")
            first = False
            _write_key(out, key, bare)
            out.append(":")
            _write(out, item, bare)
        out.append("}")
    elif isinstance(value, (list, tuple, set, frozenset)):
        out.append("[")
        for position, item in enumerate(value):
            if position:
                out.append(",")
            _write(out, item, bare)
        out.append("]")
    else:
        raise TypeError(f"cannot write {type(value).__name__} as fastjson: {value!r:.60}")


def _write_key(out: list[str], key: Any, bare: bool) -> None:
    if isinstance(key, str):
        out.append(json.dumps(key, ensure_ascii=False))
    elif isinstance(key, bool):
        out.append(json.dumps(str(key).lower()))
    elif isinstance(key, int):
        out.append(str(key) if bare else f'"{key}"')
    elif isinstance(key, FrozenObject) or isinstance(key, Mapping) or hasattr(key, "to_json"):
        _write(out, key, bare)
    else:
        raise TypeError(f"cannot write a {type(key).__name__} map key as fastjson: {key!r:.60}")


def _bean(fields_: Mapping[str, Any]) -> dict[str, Any]:
    """A Java bean as fastjson writes it: alphabetical, nulls left out."""
    return {name: fields_[name] for name in sorted(fields_) if fields_[name] is not None}


# =====================================================================================================
# MessageQueue
# =====================================================================================================
@dataclass(frozen=True, order=True)
class MessageQueue:
    """(topic, brokerName, queueId); ordering matches Java's ``MessageQueue.compareTo``."""

    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}

    @classmethod
    def from_json(cls, data: Any, what: str = "messageQueue") -> MessageQueue:
        if isinstance(data, FrozenObject):
            data = data.to_dict()
        data = _object(data, what)
        return cls(topic=_str(data.get("topic"), f"{what}.topic"),
                   broker_name=_str(data.get("brokerName"), f"{what}.brokerName"),
                   queue_id=_int(data.get("queueId"), f"{what}.queueId"))


def _mq_list(value: Any, what: str) -> list[MessageQueue]:
    return [MessageQueue.from_json(item, f"{what}[{i}]") for i, item in enumerate(_array(value, what))]


# =====================================================================================================
# TopicRouteData (GET_ROUTEINFO_BY_TOPIC)
# =====================================================================================================
@dataclass
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = 6
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, data: Any, what: str = "queueData") -> QueueData:
        data = _object(data, what)
        return cls(broker_name=_str(data.get("brokerName"), f"{what}.brokerName"),
                   read_queue_nums=_int(data.get("readQueueNums"), f"{what}.readQueueNums", 0),
                   write_queue_nums=_int(data.get("writeQueueNums"), f"{what}.writeQueueNums", 0),
                   perm=_int(data.get("perm"), f"{what}.perm", 0),
                   topic_sys_flag=_int(data.get("topicSysFlag"), f"{what}.topicSysFlag", 0))


@dataclass
class BrokerData:
    """One broker name: its cluster and ``brokerId -> "ip:port"`` (0 = master)."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)
    zone_name: str | None = None  # 5.x
    enable_acting_master: bool | None = None  # 5.x

    def to_json(self) -> dict[str, Any]:
        return _bean({"brokerAddrs": dict(sorted(self.broker_addrs.items())), "brokerName": self.broker_name,
                      "cluster": self.cluster, "enableActingMaster": self.enable_acting_master,
                      "zoneName": self.zone_name})

    @classmethod
    def from_json(cls, data: Any, what: str = "brokerData") -> BrokerData:
        data = _object(data, what)
        addrs = {_int(k, f"{what}.brokerAddrs key"): _str(v, f"{what}.brokerAddrs[{k}]")
                 for k, v in _object(data.get("brokerAddrs"), f"{what}.brokerAddrs").items()}
        acting = data.get("enableActingMaster")
        zone = data.get("zoneName")
        return cls(cluster=_str(data.get("cluster"), f"{what}.cluster", ""),
                   broker_name=_str(data.get("brokerName"), f"{what}.brokerName"),
                   broker_addrs=addrs,
                   zone_name=None if zone is None else _str(zone, f"{what}.zoneName"),
                   enable_acting_master=None if acting is None else _bool(acting, f"{what}.enableActingMaster"))

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(0)


@dataclass
class TopicRouteData:
    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)
    order_topic_conf: str | None = None  # leave None: a value replaces queueDatas for C++ producers

    def to_json(self) -> dict[str, Any]:
        return _bean({
            "brokerDatas": [b.to_json() for b in self.broker_datas],
            "filterServerTable": {k: list(v) for k, v in self.filter_server_table.items()},
            "orderTopicConf": self.order_topic_conf,
            "queueDatas": [q.to_json() for q in self.queue_datas],
        })

    def encode(self, *, legacy: bool = False) -> bytes:
        """Standard JSON (quoted ``"0"`` keys) by default; ``legacy`` writes fastjson's bare keys
        (what a Java name server sends clients older than V4_9_4). Both work for the C++ client."""
        if legacy:
            return dumps_fastjson_compact(self.to_json()).encode("utf-8")
        return dumps_json(self.to_json())

    @classmethod
    def from_json(cls, data: Any) -> TopicRouteData:
        data = _object(data, "topicRouteData")
        conf = data.get("orderTopicConf")
        return cls(
            queue_datas=[QueueData.from_json(q, f"queueDatas[{i}]")
                         for i, q in enumerate(_array(data.get("queueDatas"), "queueDatas"))],
            broker_datas=[BrokerData.from_json(b, f"brokerDatas[{i}]")
                          for i, b in enumerate(_array(data.get("brokerDatas"), "brokerDatas"))],
            filter_server_table={str(k): [_str(a, "filterServerTable") for a in _array(v, f"filterServerTable[{k}]")]
                                 for k, v in _object(data.get("filterServerTable"), "filterServerTable").items()},
            order_topic_conf=None if conf is None else _str(conf, "orderTopicConf"),
        )

    @classmethod
    def decode(cls, body: bytes | str) -> TopicRouteData:
        return cls.from_json(_root(body, "route data"))


# =====================================================================================================
# HeartbeatData (HEART_BEAT)
# =====================================================================================================
class ConsumeType(IntEnum):
    CONSUME_ACTIVELY = 0  # pull
    CONSUME_PASSIVELY = 1  # push
    CONSUME_POP = 2  # 5.x


class MessageModel(IntEnum):
    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(IntEnum):
    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1
    CONSUME_FROM_MIN_OFFSET = 2
    CONSUME_FROM_MAX_OFFSET = 3
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5


def _enum(kind: type[IntEnum], value: Any, what: str, default: IntEnum) -> Any:
    """Java enums arrive by name (Java) or ordinal, number or numeric string (C++)."""
    if value is None:
        return default
    try:
        if isinstance(value, str) and not _INTEGER_TEXT.fullmatch(value.strip()):
            return kind[value.strip()]
        return kind(_int(value, what))
    except (KeyError, ValueError):
        raise BodyError(f"{what}: {value!r:.60} is not a {kind.__name__}") from None


@dataclass
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    sub_version: int = 0
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)  # C++ sends zeros: never filter by it
    expression_type: str = "TAG"
    class_filter_mode: bool = False
    filter_class_source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _bean({"classFilterMode": self.class_filter_mode, "codeSet": list(self.code_set),
                      "expressionType": self.expression_type, "filterClassSource": self.filter_class_source,
                      "subString": self.sub_string, "subVersion": self.sub_version,
                      "tagsSet": list(self.tags_set), "topic": self.topic})

    @classmethod
    def from_json(cls, data: Any, what: str = "subscriptionData") -> SubscriptionData:
        data = _object(data, what)
        source = data.get("filterClassSource")
        return cls(
            topic=_str(data.get("topic"), f"{what}.topic"),
            sub_string=_str(data.get("subString"), f"{what}.subString", "*"),
            sub_version=_int(data.get("subVersion"), f"{what}.subVersion", 0),
            tags_set=[_str(t, f"{what}.tagsSet") for t in _array(data.get("tagsSet"), f"{what}.tagsSet")],
            code_set=[_int(c, f"{what}.codeSet") for c in _array(data.get("codeSet"), f"{what}.codeSet")],
            expression_type=_str(data.get("expressionType"), f"{what}.expressionType", "TAG"),
            class_filter_mode=_bool(data.get("classFilterMode"), f"{what}.classFilterMode"),
            filter_class_source=None if source is None else _str(source, f"{what}.filterClassSource"),
        )


@dataclass
class ConsumerData:
    group_name: str
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscriptions: list[SubscriptionData] = field(default_factory=list)
    unit_mode: bool = False

    def to_json(self) -> dict[str, Any]:
        return _bean({"consumeFromWhere": self.consume_from_where.name, "consumeType": self.consume_type.name,
                      "groupName": self.group_name, "messageModel": self.message_model.name,
                      "subscriptionDataSet": [s.to_json() for s in self.subscriptions],
                      "unitMode": self.unit_mode})

    @classmethod
    def from_json(cls, data: Any, what: str = "consumerData") -> ConsumerData:
        data = _object(data, what)
        subs = _array(data.get("subscriptionDataSet"), f"{what}.subscriptionDataSet")
        return cls(
            group_name=_str(data.get("groupName"), f"{what}.groupName"),
            consume_type=_enum(ConsumeType, data.get("consumeType"), f"{what}.consumeType",
                               ConsumeType.CONSUME_PASSIVELY),
            message_model=_enum(MessageModel, data.get("messageModel"), f"{what}.messageModel",
                                MessageModel.CLUSTERING),
            consume_from_where=_enum(ConsumeFromWhere, data.get("consumeFromWhere"), f"{what}.consumeFromWhere",
                                     ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET),
            subscriptions=[SubscriptionData.from_json(s, f"{what}.subscriptionDataSet[{i}]")
                           for i, s in enumerate(subs)],
            unit_mode=_bool(data.get("unitMode"), f"{what}.unitMode"),
        )


@dataclass
class ProducerData:
    group_name: str

    def to_json(self) -> dict[str, Any]:
        return {"groupName": self.group_name}

    @classmethod
    def from_json(cls, data: Any, what: str = "producerData") -> ProducerData:
        return cls(group_name=_str(_object(data, what).get("groupName"), f"{what}.groupName"))


@dataclass
class HeartbeatData:
    """HEART_BEAT body; one model for the C++ shape (ordinals, string subVersion) and Java's."""

    client_id: str
    producers: list[ProducerData] = field(default_factory=list)
    consumers: list[ConsumerData] = field(default_factory=list)
    heartbeat_fingerprint: int | None = None  # 5.x
    without_sub: bool | None = None  # 5.x

    def to_json(self) -> dict[str, Any]:
        return _bean({"clientID": self.client_id, "consumerDataSet": [c.to_json() for c in self.consumers],
                      "heartbeatFingerprint": self.heartbeat_fingerprint,
                      "producerDataSet": [p.to_json() for p in self.producers], "withoutSub": self.without_sub})

    def encode(self) -> bytes:
        """Java's shape: enum names, numeric subVersion, every field present."""
        return dumps_json(self.to_json())

    @classmethod
    def from_json(cls, data: Any) -> HeartbeatData:
        data = _object(data, "heartbeatData")
        fingerprint = data.get("heartbeatFingerprint")
        without = data.get("withoutSub")
        return cls(
            client_id=_str(data.get("clientID"), "clientID"),
            producers=[ProducerData.from_json(p, f"producerDataSet[{i}]")
                       for i, p in enumerate(_array(data.get("producerDataSet"), "producerDataSet"))],
            consumers=[ConsumerData.from_json(c, f"consumerDataSet[{i}]")
                       for i, c in enumerate(_array(data.get("consumerDataSet"), "consumerDataSet"))],
            heartbeat_fingerprint=None if fingerprint is None else _int(fingerprint, "heartbeatFingerprint"),
            without_sub=None if without is None else _bool(without, "withoutSub"),
        )

    @classmethod
    def decode(cls, body: bytes | str) -> HeartbeatData:
        return cls.from_json(_root(body, "heartbeat"))


@dataclass
class CheckClientRequestBody:
    """CHECK_CLIENT_CONFIG request: can the broker serve this subscription (SQL92 filtering)?"""

    client_id: str | None = None
    group: str | None = None
    subscription_data: SubscriptionData | None = None

    def to_json(self) -> dict[str, Any]:
        return _bean({"clientId": self.client_id, "group": self.group,
                      "subscriptionData": None if self.subscription_data is None else self.subscription_data.to_json()})

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> CheckClientRequestBody:
        if not body:  # nothing to check
            return cls()
        data = _root(body, "check client request")
        client_id, group, sub = data.get("clientId"), data.get("group"), data.get("subscriptionData")
        return cls(client_id=None if client_id is None else _str(client_id, "clientId"),
                   group=None if group is None else _str(group, "group"),
                   subscription_data=None if sub is None else SubscriptionData.from_json(sub, "subscriptionData"))


# =====================================================================================================
# Small bodies (section 11.3)
# =====================================================================================================
@dataclass
class ConsumerIdList:
    """GET_CONSUMER_LIST_BY_GROUP response."""

    consumer_id_list: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"consumerIdList": list(self.consumer_id_list)}

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> ConsumerIdList:
        data = _root(body, "consumer id list")
        return cls([_str(c, "consumerIdList") for c in _array(data.get("consumerIdList"), "consumerIdList")])


@dataclass
class LockBatchRequestBody:
    """LOCK_BATCH_MQ and UNLOCK_BATCH_MQ request (same shape; Java adds ``onlyThisBroker``)."""

    consumer_group: str
    client_id: str
    mq_set: list[MessageQueue] = field(default_factory=list)
    only_this_broker: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return _bean({"clientId": self.client_id, "consumerGroup": self.consumer_group,
                      "mqSet": [mq.to_json() for mq in self.mq_set], "onlyThisBroker": self.only_this_broker})

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> LockBatchRequestBody:
        data = _root(body, "lock batch request")
        only = data.get("onlyThisBroker")
        return cls(consumer_group=_str(data.get("consumerGroup"), "consumerGroup"),
                   client_id=_str(data.get("clientId"), "clientId"),
                   mq_set=_mq_list(data.get("mqSet"), "mqSet"),
                   only_this_broker=None if only is None else _bool(only, "onlyThisBroker"))


UnlockBatchRequestBody = LockBatchRequestBody


@dataclass
class LockBatchResponseBody:
    lock_ok_mq_set: list[MessageQueue] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"lockOKMQSet": [mq.to_json() for mq in self.lock_ok_mq_set]}

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> LockBatchResponseBody:
        return cls(_mq_list(_root(body, "lock batch response").get("lockOKMQSet"), "lockOKMQSet"))


@dataclass
class TopicList:
    """GET_ALL_TOPIC_LIST_FROM_NAMESERVER / GET_TOPICS_BY_CLUSTER response."""

    topic_list: list[str] = field(default_factory=list)
    broker_addr: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _bean({"brokerAddr": self.broker_addr, "topicList": list(self.topic_list)})

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> TopicList:
        data = _root(body, "topic list")
        addr = data.get("brokerAddr")
        return cls([_str(t, "topicList") for t in _array(data.get("topicList"), "topicList")],
                   None if addr is None else _str(addr, "brokerAddr"))


@dataclass
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO response."""

    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"brokerAddrTable": {name: self.broker_addr_table[name].to_json()
                                    for name in sorted(self.broker_addr_table)},
                "clusterAddrTable": {name: sorted(self.cluster_addr_table[name])
                                     for name in sorted(self.cluster_addr_table)}}

    def encode(self, *, legacy: bool = False) -> bytes:
        if legacy:
            return dumps_fastjson_compact(self.to_json()).encode("utf-8")
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> ClusterInfo:
        data = _root(body, "cluster info")
        brokers = {str(k): BrokerData.from_json(v, f"brokerAddrTable[{k}]")
                   for k, v in _object(data.get("brokerAddrTable"), "brokerAddrTable").items()}
        clusters = {str(k): [_str(n, f"clusterAddrTable[{k}]") for n in _array(v, f"clusterAddrTable[{k}]")]
                    for k, v in _object(data.get("clusterAddrTable"), "clusterAddrTable").items()}
        return cls(brokers, clusters)


@dataclass
class KVTable:
    """``{"table":{...}}``: GET_KVLIST_BY_NAMESPACE response, REGISTER_BROKER response body."""

    table: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return dumps_json({"table": dict(self.table)})

    @classmethod
    def decode(cls, body: bytes | str) -> KVTable:
        data = _root(body, "kv table")
        return cls({str(k): _str(v, f"table[{k}]") for k, v in _object(data.get("table"), "table").items()})


def encode_data_version(version: DataVersion) -> bytes:
    return dumps_json(version.to_json())


def decode_data_version(body: bytes | str) -> DataVersion:
    data = _root(body, "data version")
    try:
        return DataVersion.from_json(data)
    except ConfigFileError as exc:
        raise BodyError(f"data version: {exc}") from None


# =====================================================================================================
# RegisterBrokerBody (REGISTER_BROKER, section 11.5)
# =====================================================================================================
_INT = struct.Struct(">i")


@dataclass
class RegisterBrokerBody:
    """Topic configs + data version a broker registers, plus (legacy) filter servers."""

    topic_config_table: TopicConfigTable = field(default_factory=TopicConfigTable)
    filter_server_list: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # 5.x mapping tables etc., kept verbatim

    @property
    def data_version(self) -> DataVersion:
        return self.topic_config_table.data_version

    @property
    def topics(self) -> dict[str, TopicConfig]:
        return self.topic_config_table.topics

    def to_json(self) -> dict[str, Any]:
        return _bean({**self.extra, "filterServerList": list(self.filter_server_list),
                      "topicConfigSerializeWrapper": self.topic_config_table.to_json()})

    def encode(self, *, compressed: bool = False) -> bytes:
        if not compressed:
            return dumps_json(self.to_json())
        out = bytearray()
        version = encode_data_version(self.data_version)
        out += _INT.pack(len(version)) + version
        out += _INT.pack(len(self.topics))
        for config in self.topics.values():
            parts = [config.topic_name, str(config.read_queue_nums), str(config.write_queue_nums),
                     str(config.perm), config.topic_filter_type, ""]
            if config.attributes is not None:
                parts[-1] = json.dumps(config.attributes, separators=(",", ":"))
            text = " ".join(parts).encode("utf-8")
            out += _INT.pack(len(text)) + text
        servers = json.dumps(list(self.filter_server_list), separators=(",", ":")).encode("utf-8")
        out += _INT.pack(len(servers)) + servers
        out += _INT.pack(0)  # 5.x topic queue mapping count
        return zlib.compress(bytes(out), 9)

    @classmethod
    def decode(cls, body: bytes, *, compressed: bool = False) -> RegisterBrokerBody:
        if compressed:
            return cls._decode_compressed(body)
        data = _root(body, "register broker body")
        wrapper = _object(data.get("topicConfigSerializeWrapper"), "topicConfigSerializeWrapper")
        try:
            table = TopicConfigTable.from_json(wrapper)
        except ConfigFileError as exc:
            raise BodyError(f"topicConfigSerializeWrapper: {exc}") from None
        servers = [_str(s, "filterServerList") for s in _array(data.get("filterServerList"), "filterServerList")]
        extra = {k: v for k, v in data.items() if k not in ("topicConfigSerializeWrapper", "filterServerList")}
        return cls(table, servers, extra)

    @classmethod
    def _decode_compressed(cls, body: bytes) -> RegisterBrokerBody:
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(body, MAX_INFLATED_BODY)
        except zlib.error as exc:
            raise BodyError(f"compressed register body does not inflate: {exc}") from None
        if inflater.unconsumed_tail:
            raise BodyError(f"compressed register body inflates beyond {MAX_INFLATED_BODY} bytes")
        pos = 0

        def take(size: int, what: str) -> bytes:
            nonlocal pos
            if size < 0 or pos + size > len(raw):
                raise BodyError(f"compressed register body: {what} ({size} bytes at {pos}) runs past the end")
            chunk = raw[pos:pos + size]
            pos += size
            return chunk

        def take_int(what: str) -> int:
            return _INT.unpack(take(4, what))[0]

        version = decode_data_version(take(take_int("data version length"), "data version"))
        table = TopicConfigTable(data_version=version)
        for index in range(take_int("topic count")):
            text = _utf8(take(take_int(f"topic config {index} length"), f"topic config {index}"), "topic config")
            config = _decode_topic_config_line(text)
            table.topics[config.topic_name] = config
        servers_json = take(take_int("filter server list length"), "filter server list")
        servers = [_str(s, "filterServerList") for s in _array(loads_lenient(servers_json), "filterServerList")]
        extra: dict[str, Any] = {}
        if pos < len(raw):  # 5.x brokers append topic queue mapping infos
            mappings = {}
            for index in range(take_int("mapping count")):
                info = loads_lenient(take(take_int(f"mapping {index} length"), f"mapping {index}"))
                mappings[str(_object(info, "mapping").get("topic", index))] = info
            extra["topicQueueMappingInfoMap"] = mappings
        return cls(table, servers, extra)


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(f"{what} is not valid UTF-8 at byte {exc.start}") from None


def _decode_topic_config_line(text: str) -> TopicConfig:
    """``TopicConfig.encode()``: ``name read write perm filterType [attributesJson]``, space separated.

    Like Java's ``split`` trailing empty parts are dropped; topicSysFlag/order are not in this form.
    """
    parts = text.split(" ")
    while parts and parts[-1] == "":
        parts.pop()
    if len(parts) < 5:
        raise BodyError(f"topic config {text!r:.80} has {len(parts)} fields, expected at least 5")
    attributes = None
    if len(parts) >= 6:
        try:
            parsed = json.loads(" ".join(parts[5:]))
            attributes = parsed if isinstance(parsed, dict) else None
        except ValueError:
            attributes = None  # Java ignores unparsable attributes too
    return TopicConfig(topic_name=parts[0], read_queue_nums=_int(parts[1], "readQueueNums"),
                       write_queue_nums=_int(parts[2], "writeQueueNums"), perm=_int(parts[3], "perm"),
                       topic_filter_type=parts[4], attributes=attributes)


# =====================================================================================================
# Object-keyed admin bodies (section 11.4)
# =====================================================================================================
def _mq_keyed(value: Any, what: str) -> dict[MessageQueue, dict[Any, Any]]:
    result: dict[MessageQueue, dict[Any, Any]] = {}
    for key, item in _object(value, what).items():
        if isinstance(key, FrozenObject):
            mq = MessageQueue.from_json(key, f"{what} key")
        elif isinstance(key, str) and key.lstrip().startswith("{"):
            mq = MessageQueue.from_json(loads_lenient(key, f"{what} key"), f"{what} key")  # quoted-key writers
        else:
            raise BodyError(f"{what}: key {key!r:.60} is not a message queue object")
        result[mq] = _object(item, f"{what}[{mq}]")
    return result


@dataclass
class OffsetWrapper:
    broker_offset: int = 0
    consumer_offset: int = 0
    pull_offset: int = 0
    last_timestamp: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"brokerOffset": self.broker_offset, "consumerOffset": self.consumer_offset,
                "lastTimestamp": self.last_timestamp, "pullOffset": self.pull_offset}

    @classmethod
    def from_json(cls, data: Mapping[Any, Any], what: str = "offsetWrapper") -> OffsetWrapper:
        return cls(broker_offset=_int(data.get("brokerOffset"), f"{what}.brokerOffset", 0),
                   consumer_offset=_int(data.get("consumerOffset"), f"{what}.consumerOffset", 0),
                   pull_offset=_int(data.get("pullOffset"), f"{what}.pullOffset", 0),
                   last_timestamp=_int(data.get("lastTimestamp"), f"{what}.lastTimestamp", 0))

    @property
    def lag(self) -> int:
        return self.broker_offset - self.consumer_offset


@dataclass
class ConsumeStats:
    """GET_CONSUME_STATS response: fastjson with :class:`MessageQueue` object keys."""

    offset_table: dict[MessageQueue, OffsetWrapper] = field(default_factory=dict)
    consume_tps: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Python values with :class:`MessageQueue` keys: only :func:`dumps_fastjson_compact` writes them."""
        table = {mq: self.offset_table[mq].to_json() for mq in sorted(self.offset_table)}
        return {"consumeTps": float(self.consume_tps), "offsetTable": table}

    def encode(self) -> bytes:
        return dumps_fastjson_compact(self.to_json()).encode("utf-8")

    @classmethod
    def from_json(cls, data: Any, what: str = "consume stats") -> ConsumeStats:
        data = _object(data, what)
        table = {mq: OffsetWrapper.from_json(v, f"{what}.offsetTable[{mq}]")
                 for mq, v in _mq_keyed(data.get("offsetTable"), f"{what}.offsetTable").items()}
        return cls(table, _float(data.get("consumeTps"), f"{what}.consumeTps"))

    @classmethod
    def decode(cls, body: bytes | str) -> ConsumeStats:
        return cls.from_json(_root(body, "consume stats"))

    def total_diff(self) -> int:
        return sum(w.lag for w in self.offset_table.values())


@dataclass
class TopicOffset:
    min_offset: int = 0
    max_offset: int = 0
    last_update_timestamp: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"lastUpdateTimestamp": self.last_update_timestamp, "maxOffset": self.max_offset,
                "minOffset": self.min_offset}

    @classmethod
    def from_json(cls, data: Mapping[Any, Any], what: str = "topicOffset") -> TopicOffset:
        return cls(min_offset=_int(data.get("minOffset"), f"{what}.minOffset", 0),
                   max_offset=_int(data.get("maxOffset"), f"{what}.maxOffset", 0),
                   last_update_timestamp=_int(data.get("lastUpdateTimestamp"), f"{what}.lastUpdateTimestamp", 0))


@dataclass
class TopicStatsTable:
    """GET_TOPIC_STATS_INFO response: fastjson with :class:`MessageQueue` object keys."""

    offset_table: dict[MessageQueue, TopicOffset] = field(default_factory=dict)
    topic_put_tps: float | None = 0.0  # 5.x field; None leaves it out (4.x shape)

    def encode(self) -> bytes:
        table = {mq: self.offset_table[mq].to_json() for mq in sorted(self.offset_table)}
        return dumps_fastjson_compact({"offsetTable": table, "topicPutTps": None if self.topic_put_tps is None
                                       else float(self.topic_put_tps)}).encode("utf-8")

    @classmethod
    def decode(cls, body: bytes | str) -> TopicStatsTable:
        data = _root(body, "topic stats")
        table = {mq: TopicOffset.from_json(v, f"offsetTable[{mq}]")
                 for mq, v in _mq_keyed(data.get("offsetTable"), "offsetTable").items()}
        tps = data.get("topicPutTps")
        return cls(table, None if tps is None else _float(tps, "topicPutTps"))


def sorted_queues(queues: Iterable[MessageQueue]) -> list[MessageQueue]:
    """Queues in Java ``MessageQueue.compareTo`` order (topic, brokerName, queueId)."""
    return sorted(queues)


# =====================================================================================================
# Broker statistics (VIEW_BROKER_STATS_DATA, GET_BROKER_CONSUME_STATS, QUERY_TOPIC_CONSUME_BY_WHO,
# QUERY_CONSUME_TIME_SPAN)
# =====================================================================================================
@dataclass
class BrokerStatsItem:
    """One window of a stats item: ``sum`` over the window, ``tps`` per second, ``avgpt`` per call."""

    sum: int = 0
    tps: float = 0.0
    avgpt: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"avgpt": float(self.avgpt), "sum": self.sum, "tps": float(self.tps)}

    @classmethod
    def from_json(cls, data: Any, what: str = "brokerStatsItem") -> BrokerStatsItem:
        data = _object(data, what)
        return cls(sum=_int(data.get("sum"), f"{what}.sum", 0), tps=_float(data.get("tps"), f"{what}.tps"),
                   avgpt=_float(data.get("avgpt"), f"{what}.avgpt"))


@dataclass
class BrokerStatsData:
    """VIEW_BROKER_STATS_DATA response: the last minute, hour and day of one item."""

    stats_minute: BrokerStatsItem = field(default_factory=BrokerStatsItem)
    stats_hour: BrokerStatsItem = field(default_factory=BrokerStatsItem)
    stats_day: BrokerStatsItem = field(default_factory=BrokerStatsItem)

    def to_json(self) -> dict[str, Any]:
        return {"statsDay": self.stats_day.to_json(), "statsHour": self.stats_hour.to_json(),
                "statsMinute": self.stats_minute.to_json()}

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> BrokerStatsData:
        data = _root(body, "broker stats data")
        return cls(*(BrokerStatsItem.from_json(data.get(name), name)
                     for name in ("statsMinute", "statsHour", "statsDay")))


@dataclass
class GroupList:
    """QUERY_TOPIC_CONSUME_BY_WHO response (a Java ``HashSet``: order means nothing; we sort)."""

    group_list: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"groupList": sorted(set(self.group_list))}

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> GroupList:
        data = _root(body, "group list")
        return cls([_str(g, "groupList") for g in _array(data.get("groupList"), "groupList")])


@dataclass
class ConsumeStatsList:
    """GET_BROKER_CONSUME_STATS response: per subscription group (one single-key map each, as
    Apache's ``List<Map<group, List<ConsumeStats>>>``) the stats of every topic it committed on."""

    broker_addr: str = ""
    total_diff: int = 0
    consume_stats_list: list[dict[str, list[ConsumeStats]]] = field(default_factory=list)

    def encode(self) -> bytes:
        groups = [{group: [stats.to_json() for stats in per_topic] for group, per_topic in entry.items()}
                  for entry in self.consume_stats_list]
        return dumps_fastjson_compact({"brokerAddr": self.broker_addr, "consumeStatsList": groups,
                                       "totalDiff": self.total_diff}).encode("utf-8")

    @classmethod
    def decode(cls, body: bytes | str) -> ConsumeStatsList:
        data = _root(body, "consume stats list")
        entries = []
        for i, entry in enumerate(_array(data.get("consumeStatsList"), "consumeStatsList")):
            entries.append({str(group): [ConsumeStats.from_json(s, f"consumeStatsList[{i}][{group}][{j}]")
                                         for j, s in enumerate(_array(stats, f"consumeStatsList[{i}][{group}]"))]
                            for group, stats in _object(entry, f"consumeStatsList[{i}]").items()})
        return cls(_str(data.get("brokerAddr"), "brokerAddr", ""), _int(data.get("totalDiff"), "totalDiff", 0),
                   entries)

    def by_group(self) -> dict[str, list[ConsumeStats]]:
        return {group: stats for entry in self.consume_stats_list for group, stats in entry.items()}


@dataclass
class QueueTimeSpan:
    """One queue of QUERY_CONSUME_TIME_SPAN: first/last message store times, the store time of the
    last consumed message and how long the next one has waited (0 when caught up). The ``…Str``
    fields are Java getters fastjson writes too: broker-local time, ``yyyy-MM-dd#HH:mm:ss:SSS``."""

    message_queue: MessageQueue
    min_time_stamp: int = 0
    max_time_stamp: int = 0
    consume_time_stamp: int = 0
    delay_time: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"consumeTimeStamp": self.consume_time_stamp,
                "consumeTimeStampStr": format_java_date(self.consume_time_stamp),
                "delayTime": self.delay_time, "maxTimeStamp": self.max_time_stamp,
                "maxTimeStampStr": format_java_date(self.max_time_stamp),
                "messageQueue": self.message_queue.to_json(), "minTimeStamp": self.min_time_stamp,
                "minTimeStampStr": format_java_date(self.min_time_stamp)}

    @classmethod
    def from_json(cls, data: Any, what: str = "queueTimeSpan") -> QueueTimeSpan:
        data = _object(data, what)
        return cls(MessageQueue.from_json(data.get("messageQueue"), f"{what}.messageQueue"),
                   _int(data.get("minTimeStamp"), f"{what}.minTimeStamp", 0),
                   _int(data.get("maxTimeStamp"), f"{what}.maxTimeStamp", 0),
                   _int(data.get("consumeTimeStamp"), f"{what}.consumeTimeStamp", 0),
                   _int(data.get("delayTime"), f"{what}.delayTime", 0))


def format_java_date(ms: int) -> str:
    """``UtilAll.formatDate(new Date(ms), "yyyy-MM-dd#HH:mm:ss:SSS")`` in local time."""
    seconds, millis = divmod(ms, 1000)  # floor: -1 ms is 999 ms into the second before the epoch
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d#%H:%M:%S:") + f"{millis:03d}"


@dataclass
class QueryConsumeTimeSpanBody:
    consume_time_span_set: list[QueueTimeSpan] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"consumeTimeSpanSet": [span.to_json() for span in self.consume_time_span_set]}

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> QueryConsumeTimeSpanBody:
        data = _root(body, "consume time span")
        spans = _array(data.get("consumeTimeSpanSet"), "consumeTimeSpanSet")
        return cls([QueueTimeSpan.from_json(s, f"consumeTimeSpanSet[{i}]") for i, s in enumerate(spans)])


# =====================================================================================================
# Connected clients (GET_CONSUMER_CONNECTION_LIST, GET_PRODUCER_CONNECTION_LIST)
# =====================================================================================================
@dataclass(frozen=True)
class Connection:
    """One client connection as the broker knows it; ``language`` is a LanguageCode name."""

    client_id: str
    client_addr: str
    language: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"clientAddr": self.client_addr, "clientId": self.client_id, "language": self.language,
                "version": self.version}

    @classmethod
    def from_json(cls, data: Any, what: str = "connection") -> Connection:
        data = _object(data, what)
        language = data.get("language")
        return cls(client_id=_str(data.get("clientId"), f"{what}.clientId", ""),
                   client_addr=_str(data.get("clientAddr"), f"{what}.clientAddr", ""),
                   language=str(language) if language is not None else "",
                   version=_int(data.get("version"), f"{what}.version", 0))


def _connections(value: Any, what: str) -> list[Connection]:
    return [Connection.from_json(c, f"{what}[{i}]") for i, c in enumerate(_array(value, what))]


@dataclass
class ConsumerConnection:
    """GET_CONSUMER_CONNECTION_LIST response: who is connected and what the group subscribes to."""

    connection_set: list[Connection] = field(default_factory=list)
    subscription_table: dict[str, SubscriptionData] = field(default_factory=dict)
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET

    def to_json(self) -> dict[str, Any]:
        return {"connectionSet": [c.to_json() for c in self.connection_set],
                "consumeFromWhere": ConsumeFromWhere(self.consume_from_where).name,
                "consumeType": ConsumeType(self.consume_type).name,
                "messageModel": MessageModel(self.message_model).name,
                "subscriptionTable": {t: self.subscription_table[t].to_json() for t in sorted(self.subscription_table)}}

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> ConsumerConnection:
        data = _root(body, "consumer connection")
        subs = _object(data.get("subscriptionTable"), "subscriptionTable")
        return cls(
            connection_set=_connections(data.get("connectionSet"), "connectionSet"),
            subscription_table={str(t): SubscriptionData.from_json(s, f"subscriptionTable[{t}]")
                                for t, s in subs.items()},
            consume_type=_enum(ConsumeType, data.get("consumeType"), "consumeType", ConsumeType.CONSUME_PASSIVELY),
            message_model=_enum(MessageModel, data.get("messageModel"), "messageModel", MessageModel.CLUSTERING),
            consume_from_where=_enum(ConsumeFromWhere, data.get("consumeFromWhere"), "consumeFromWhere",
                                     ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET))


@dataclass
class ProducerConnection:
    """GET_PRODUCER_CONNECTION_LIST response."""

    connection_set: list[Connection] = field(default_factory=list)

    def encode(self) -> bytes:
        return dumps_json({"connectionSet": [c.to_json() for c in self.connection_set]})

    @classmethod
    def decode(cls, body: bytes | str) -> ProducerConnection:
        return cls(_connections(_root(body, "producer connection").get("connectionSet"), "connectionSet"))


# =====================================================================================================
# Offsets the broker hands to clients (INVOKE_BROKER_TO_RESET_OFFSET, GET_CONSUMER_STATUS)
# =====================================================================================================
def _mq_offsets(value: Any, what: str) -> dict[MessageQueue, int]:
    """A fastjson ``Map<MessageQueue, Long>`` (object keys) → {queue: offset}."""
    result: dict[MessageQueue, int] = {}
    for key, item in _object(value, what).items():
        if isinstance(key, FrozenObject):
            mq = MessageQueue.from_json(key, f"{what} key")
        elif isinstance(key, str) and key.lstrip().startswith("{"):
            mq = MessageQueue.from_json(loads_lenient(key, f"{what} key"), f"{what} key")
        else:
            raise BodyError(f"{what}: key {key!r:.60} is not a message queue object")
        result[mq] = _int(item, f"{what}[{mq}]")
    return result


def _mq_offsets_json(table: Mapping[MessageQueue, int]) -> dict[MessageQueue, int]:
    return {mq: int(table[mq]) for mq in sorted(table)}


@dataclass
class ResetOffsetBody:
    """RESET_CONSUMER_CLIENT_OFFSET request and INVOKE_BROKER_TO_RESET_OFFSET response body."""

    offset_table: dict[MessageQueue, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return dumps_fastjson_compact({"offsetTable": _mq_offsets_json(self.offset_table)}).encode("utf-8")

    @classmethod
    def decode(cls, body: bytes | str) -> ResetOffsetBody:
        return cls(_mq_offsets(_root(body, "reset offset body").get("offsetTable"), "offsetTable"))


@dataclass
class GetConsumerStatusBody:
    """GET_CONSUMER_STATUS_FROM_CLIENT response (``messageQueueTable``, one client's offsets) and
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS response (``consumerTable``: client id → offsets)."""

    message_queue_table: dict[MessageQueue, int] = field(default_factory=dict)
    consumer_table: dict[str, dict[MessageQueue, int]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return dumps_fastjson_compact({
            "consumerTable": {cid: _mq_offsets_json(self.consumer_table[cid]) for cid in sorted(self.consumer_table)},
            "messageQueueTable": _mq_offsets_json(self.message_queue_table)}).encode("utf-8")

    @classmethod
    def decode(cls, body: bytes | str) -> GetConsumerStatusBody:
        data = _root(body, "consumer status body")
        return cls(_mq_offsets(data.get("messageQueueTable"), "messageQueueTable"),
                   {str(cid): _mq_offsets(t, f"consumerTable[{cid}]")
                    for cid, t in _object(data.get("consumerTable"), "consumerTable").items()})


# =====================================================================================================
# What a consumer answers about itself (GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY)
# =====================================================================================================
# ConsumerRunningInfo property names (Java's ConsumerRunningInfo.PROP_* constants)
PROP_NAMESERVER_ADDR = "PROP_NAMESERVER_ADDR"
PROP_THREADPOOL_CORE_SIZE = "PROP_THREADPOOL_CORE_SIZE"
PROP_CONSUME_ORDERLY = "PROP_CONSUMEORDERLY"
PROP_CONSUME_TYPE = "PROP_CONSUME_TYPE"
PROP_CLIENT_VERSION = "PROP_CLIENT_VERSION"
PROP_CONSUMER_START_TIMESTAMP = "PROP_CONSUMER_START_TIMESTAMP"


@dataclass
class ProcessQueueInfo:
    """One assigned queue of a consumer; ``droped`` is Java's spelling."""

    commit_offset: int = -1
    cached_msg_min_offset: int = 0
    cached_msg_max_offset: int = 0
    cached_msg_count: int = 0
    cached_msg_size_in_mib: int = 0
    transaction_msg_min_offset: int = 0
    transaction_msg_max_offset: int = 0
    transaction_msg_count: int = 0
    locked: bool = False
    try_unlock_times: int = 0
    last_lock_timestamp: int = 0
    droped: bool = False
    last_pull_timestamp: int = 0
    last_consume_timestamp: int = 0

    _WIRE = (("cachedMsgCount", "cached_msg_count"), ("cachedMsgMaxOffset", "cached_msg_max_offset"),
             ("cachedMsgMinOffset", "cached_msg_min_offset"), ("cachedMsgSizeInMiB", "cached_msg_size_in_mib"),
             ("commitOffset", "commit_offset"), ("droped", "droped"), ("lastConsumeTimestamp", "last_consume_timestamp"),
             ("lastLockTimestamp", "last_lock_timestamp"), ("lastPullTimestamp", "last_pull_timestamp"),
             ("locked", "locked"), ("transactionMsgCount", "transaction_msg_count"),
             ("transactionMsgMaxOffset", "transaction_msg_max_offset"),
             ("transactionMsgMinOffset", "transaction_msg_min_offset"), ("tryUnlockTimes", "try_unlock_times"))

    def to_json(self) -> dict[str, Any]:
        return {wire: getattr(self, name) for wire, name in self._WIRE}

    @classmethod
    def from_json(cls, data: Mapping[Any, Any], what: str = "processQueueInfo") -> ProcessQueueInfo:
        values: dict[str, Any] = {}
        for wire, name in cls._WIRE:
            raw = data.get(wire)
            if raw is None:
                continue
            if name in ("locked", "droped"):
                values[name] = _bool(raw, f"{what}.{wire}")
            else:
                number = _int(raw, f"{what}.{wire}")
                values[name] = number - (1 << 64) if number >= 1 << 63 else number  # C++ prints -1 unsigned
        return cls(**values)


@dataclass
class ConsumeStatus:
    """Per-topic consumption rates of one client (the last minute; failures in the last hour)."""

    pull_rt: float = 0.0
    pull_tps: float = 0.0
    consume_rt: float = 0.0
    consume_ok_tps: float = 0.0
    consume_failed_tps: float = 0.0
    consume_failed_msgs: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"consumeFailedMsgs": self.consume_failed_msgs, "consumeFailedTPS": float(self.consume_failed_tps),
                "consumeOKTPS": float(self.consume_ok_tps), "consumeRT": float(self.consume_rt),
                "pullRT": float(self.pull_rt), "pullTPS": float(self.pull_tps)}

    @classmethod
    def from_json(cls, data: Any, what: str = "consumeStatus") -> ConsumeStatus:
        data = _object(data, what)
        return cls(pull_rt=_float(data.get("pullRT"), f"{what}.pullRT"),
                   pull_tps=_float(data.get("pullTPS"), f"{what}.pullTPS"),
                   consume_rt=_float(data.get("consumeRT"), f"{what}.consumeRT"),
                   consume_ok_tps=_float(data.get("consumeOKTPS"), f"{what}.consumeOKTPS"),
                   consume_failed_tps=_float(data.get("consumeFailedTPS"), f"{what}.consumeFailedTPS"),
                   consume_failed_msgs=_int(data.get("consumeFailedMsgs"), f"{what}.consumeFailedMsgs", 0))


@dataclass
class ConsumerRunningInfo:
    """GET_CONSUMER_RUNNING_INFO response, written by the client (fastjson: queue objects as keys)."""

    properties: dict[str, str] = field(default_factory=dict)
    subscription_set: list[SubscriptionData] = field(default_factory=list)
    mq_table: dict[MessageQueue, ProcessQueueInfo] = field(default_factory=dict)
    status_table: dict[str, ConsumeStatus] = field(default_factory=dict)
    jstack: str | None = None  # only when the request asked for it (jstackEnable)

    def encode(self) -> bytes:
        return dumps_fastjson_compact({
            "jstack": self.jstack,
            "mqTable": {mq: self.mq_table[mq].to_json() for mq in sorted(self.mq_table)},
            "properties": {k: str(self.properties[k]) for k in sorted(self.properties)},
            "statusTable": {t: self.status_table[t].to_json() for t in sorted(self.status_table)},
            "subscriptionSet": [s.to_json() for s in sorted(self.subscription_set,
                                                            key=lambda s: (s.topic, s.sub_string))],
        }).encode("utf-8")

    @classmethod
    def decode(cls, body: bytes | str) -> ConsumerRunningInfo:
        data = _root(body, "consumer running info")
        jstack = data.get("jstack")
        return cls(
            properties={str(k): str(v) for k, v in _object(data.get("properties"), "properties").items()},
            subscription_set=[SubscriptionData.from_json(s, f"subscriptionSet[{i}]")
                              for i, s in enumerate(_array(data.get("subscriptionSet"), "subscriptionSet"))],
            mq_table={mq: ProcessQueueInfo.from_json(v, f"mqTable[{mq}]")
                      for mq, v in _mq_keyed(data.get("mqTable"), "mqTable").items()},
            status_table={str(t): ConsumeStatus.from_json(v, f"statusTable[{t}]")
                          for t, v in _object(data.get("statusTable"), "statusTable").items()},
            jstack=None if jstack is None else str(jstack))


class CMResult(IntEnum):
    """Outcome of CONSUME_MESSAGE_DIRECTLY (Java's ``CMResult``, written by name)."""

    CR_SUCCESS = 0
    CR_LATER = 1
    CR_ROLLBACK = 2
    CR_COMMIT = 3
    CR_THROW_EXCEPTION = 4
    CR_RETURN_NULL = 5


@dataclass
class ConsumeMessageDirectlyResult:
    """CONSUME_MESSAGE_DIRECTLY response: how the client's listener handled the message."""

    consume_result: CMResult = CMResult.CR_SUCCESS
    order: bool = False
    auto_commit: bool = True
    remark: str | None = None
    spent_time_mills: int = 0

    def to_json(self) -> dict[str, Any]:
        return _bean({"autoCommit": self.auto_commit, "consumeResult": CMResult(self.consume_result).name,
                      "order": self.order, "remark": self.remark, "spentTimeMills": self.spent_time_mills})

    def encode(self) -> bytes:
        return dumps_json(self.to_json())

    @classmethod
    def decode(cls, body: bytes | str) -> ConsumeMessageDirectlyResult:
        data = _root(body, "consume message directly result")
        remark = data.get("remark")
        return cls(consume_result=_enum(CMResult, data.get("consumeResult"), "consumeResult", CMResult.CR_SUCCESS),
                   order=_bool(data.get("order"), "order"),
                   auto_commit=_bool(data.get("autoCommit"), "autoCommit", True),
                   remark=None if remark is None else str(remark),
                   spent_time_mills=_int(data.get("spentTimeMills"), "spentTimeMills", 0))


@dataclass
class ResetOffsetBodyForC:
    """RESET_CONSUMER_CLIENT_OFFSET body for the C++ client: a list of ``MessageQueueForC``
    (queue fields plus ``offset``), which Apache sends when the admin request came from C++."""

    offset_table: dict[MessageQueue, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return dumps_json({"offsetTable": [{**mq.to_json(), "offset": int(self.offset_table[mq])}
                                           for mq in sorted(self.offset_table)]})

    @classmethod
    def decode(cls, body: bytes | str) -> ResetOffsetBodyForC:
        table: dict[MessageQueue, int] = {}
        for i, item in enumerate(_array(_root(body, "reset offset body").get("offsetTable"), "offsetTable")):
            table[MessageQueue.from_json(item, f"offsetTable[{i}]")] = _int(_object(item, f"offsetTable[{i}]")
                                                                            .get("offset"), f"offsetTable[{i}].offset")
        return cls(table)
