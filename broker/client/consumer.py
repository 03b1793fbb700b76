"""Consumers: a PullConsumer (explicit offsets) and a simple clustering PushConsumer.

Pulled bodies are stored records back to back; they are decoded with the store codec, so a consumer
sees exactly what the CommitLog holds (:class:`~broker.store.message.MessageRecord`, decompressed
on ``payload``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

from broker.client.broker_requests import register_broker_requests
from broker.client.consume_stats import ConsumeStatsRecorder
from broker.client.instance import ClientLifecycle, MQClientError, session_credentials
from broker.remoting.bodies import (
    CheckClientRequestBody,
    PROP_CLIENT_VERSION,
    PROP_CONSUME_ORDERLY,
    PROP_CONSUME_TYPE,
    PROP_CONSUMER_START_TIMESTAMP,
    PROP_NAMESERVER_ADDR,
    PROP_THREADPOOL_CORE_SIZE,
    CMResult,
    ConsumeFromWhere,
    ConsumeMessageDirectlyResult,
    ConsumerData,
    ConsumerRunningInfo,
    ConsumeType,
    ConsumerIdList,
    HeartbeatData,
    MessageModel,
    MessageQueue,
    ProcessQueueInfo,
    SubscriptionData,
)
from broker.remoting.codes import DEFAULT_VERSION, ExpressionType, PullSysFlag, RequestCode, ResponseCode, version_desc
from broker.remoting.command import RemotingCommand
from broker.remoting.tls import ClientTlsConfig
from broker.store.message import MessageRecord, RecordError, decode_record
from broker.store.record_layout import POS_PHYSICAL_OFFSET, SIZE_MAGIC
from broker.store.topics import retry_topic

log = logging.getLogger(__name__)


class PullStatus(Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_PULL_STATUS = {ResponseCode.SUCCESS: PullStatus.FOUND, ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
                ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
                ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}


@dataclass
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageRecord] = field(default_factory=list)


_PHYS_END = POS_PHYSICAL_OFFSET + 8  # a record's head up to its PHYSICALOFFSET


def decode_records(body: bytes) -> list[MessageRecord]:
    """A PULL body: stored records back to back (each one's PHYSICALOFFSET is read from the record)."""
    out = []
    pos = 0
    while pos + _PHYS_END <= len(body):
        size = SIZE_MAGIC.unpack_from(body, pos)[0]
        phys = int.from_bytes(body[pos + POS_PHYSICAL_OFFSET:pos + _PHYS_END], "big", signed=True)
        if size <= 0:
            raise RecordError("bad_size", pos, f"record size {size} in a pull body")
        out.append(decode_record(body, pos, phys, limit=pos + size))
        pos += size
    return out


def _tags_filter(expression: str) -> set[str] | None:
    tags = {t.strip() for t in expression.split("||") if t.strip()}
    return None if not tags or "*" in tags else tags


class PullConsumer(ClientLifecycle):
    """Pull with explicit offsets; offsets can be stored on the broker (``commit``/``committed``)."""

    def __init__(self, group: str, namesrv_addr: str, *, timeout: float = 3.0, instance_name: str = "DEFAULT",
                 access_key: str | None = None, secret_key: str | None = None,
                 security_token: str | None = None, tls: ClientTlsConfig | None = None) -> None:
        self.group = group
        self.credentials = session_credentials(access_key, secret_key, security_token)
        self.namesrv_addr = namesrv_addr
        self.timeout = timeout
        self.instance_name = instance_name
        self.tls = tls  # every connection over TLS (see ClientInstance)
        self._client = None

    def queues(self, topic: str) -> list[MessageQueue]:
        route = self.client.route(topic, refresh=True)
        if route is None:
            raise MQClientError(f"No route info of this topic: {topic}", ResponseCode.TOPIC_NOT_EXIST)
        return route.read_queues

    def _addr(self, mq: MessageQueue) -> str:
        return self.client.read_addr(mq.broker_name, mq.topic)

    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, expression: str = "*",
             suspend_ms: int = 0, expression_type: str = ExpressionType.TAG) -> PullResult:
        """One PULL_MESSAGE. ``suspend_ms`` > 0 lets the broker hold it (long polling).

        ``expression`` is a tag list (``*``, ``TagA || TagB``) or, with ``expression_type``
        SQL92, a property selector such as ``a > 5 AND b = 'x'`` (the broker must run with
        enablePropertyFilter); either way only matching messages come back and
        ``next_begin_offset`` moves past the rest."""
        flags = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_ms > 0 else 0)
        ext = {"consumerGroup": self.group, "topic": mq.topic, "queueId": mq.queue_id, "queueOffset": offset,
               "maxMsgNums": max_nums, "sysFlag": int(flags), "commitOffset": 0,
               "suspendTimeoutMillis": suspend_ms or 20_000, "subscription": expression, "subVersion": 0,
               "expressionType": expression_type}
        timeout = self.timeout + suspend_ms / 1000
        resp = self.client.invoke(self._addr(mq), RemotingCommand.request(RequestCode.PULL_MESSAGE, ext), timeout)
        status = _PULL_STATUS.get(resp.code)
        if status is None:
            raise MQClientError(f"pull {mq} failed: code {resp.code} {resp.remark or ''}".strip(), resp.code)
        e = resp.ext_fields
        result = PullResult(status, int(e.get("nextBeginOffset", offset)), int(e.get("minOffset", 0)),
                            int(e.get("maxOffset", 0)))
        if status is PullStatus.FOUND:
            wanted = _tags_filter(expression) if expression_type == ExpressionType.TAG else None
            result.messages = [m for m in decode_records(resp.body)
                               if wanted is None or m.tags in wanted]
        return result

    def check_client_config(self, topic: str, expression: str, expression_type: str) -> None:
        """CHECK_CLIENT_CONFIG to every master of ``topic``, as the Java consumer does when it starts:
        raises :class:`MQClientError` (the broker's code and remark) when a broker cannot serve the
        subscription (SQL92 without enablePropertyFilter, or an expression that does not compile)."""
        if expression_type == ExpressionType.TAG:
            return
        route = self.client.route(topic, refresh=True)
        if route is None:  # no broker serves the topic yet: nothing to ask (as the Java consumer)
            return
        body = CheckClientRequestBody(self.client.client_id, self.group,
                                      SubscriptionData(topic, expression, expression_type=expression_type))
        for addr in route.masters.values():
            resp = self.client.invoke(addr, RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG,
                                                                    body=body.encode()))
            if resp.code != ResponseCode.SUCCESS:
                raise MQClientError(f"CODE: {resp.code}  DESC: {resp.remark}", resp.code)

    def _offset_request(self, code: int, mq: MessageQueue, **extra) -> RemotingCommand:
        ext = {"consumerGroup": self.group, "topic": mq.topic, "queueId": mq.queue_id, **extra}
        return self.client.invoke(self._addr(mq), RemotingCommand.request(code, ext))

    def committed(self, mq: MessageQueue) -> int | None:
        resp = self._offset_request(RequestCode.QUERY_CONSUMER_OFFSET, mq)
        return int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else None

    def commit(self, mq: MessageQueue, offset: int) -> None:
        resp = self._offset_request(RequestCode.UPDATE_CONSUMER_OFFSET, mq, commitOffset=offset)
        if resp.code != ResponseCode.SUCCESS:
            raise MQClientError(f"commit of {mq} failed: code {resp.code}", resp.code)

    def max_offset(self, mq: MessageQueue) -> int:
        resp = self.client.invoke(self._addr(mq), RemotingCommand.request(
            RequestCode.GET_MAX_OFFSET, {"topic": mq.topic, "queueId": mq.queue_id}))
        return int(resp.ext_fields.get("offset", 0))

    def send_back(self, msg: MessageRecord, delay_level: int = 0) -> None:
        """CONSUMER_SEND_MSG_BACK to the broker that stored the message (its store host)."""
        ext = {"offset": msg.physical_offset, "group": self.group, "delayLevel": delay_level,
               "originMsgId": msg.offset_msg_id, "originTopic": msg.topic}
        resp = self.client.invoke(str(msg.store_host), RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, ext))
        if resp.code != ResponseCode.SUCCESS:
            raise MQClientError(f"send back failed: code {resp.code} {resp.remark or ''}".strip(), resp.code)


def allocate_averagely(queues: list[MessageQueue], ids: list[str], me: str) -> list[MessageQueue]:
    """Java's AllocateMessageQueueAveragely over sorted queues and sorted client ids."""
    queues, ids = sorted(queues), sorted(ids)
    if me not in ids or not queues:
        return []
    index, n, m = ids.index(me), len(queues), len(ids)
    mod = n % m
    size = (n // m + 1 if index < mod else n // m) if n > m else 1
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % n] for i in range(min(size, n - start))] if start < n else []


class PushConsumer(PullConsumer):
    """A simple clustering push consumer: heartbeat, rebalance, long-polling pull loops, offset
    commits every few seconds, and send-back (→ %RETRY%) when the listener raises.

    ``expression`` selects by tags, or with ``expression_type="SQL92"`` by properties
    (``seq IS NOT NULL``); :meth:`start` asks the brokers first and raises if one refuses."""

    def __init__(self, group: str, namesrv_addr: str, listener: Callable[[MessageRecord], None], *,
                 topic: str, expression: str = "*", expression_type: str = ExpressionType.TAG,
                 consume_from: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 timeout: float = 3.0, instance_name: str = "DEFAULT", access_key: str | None = None,
                 secret_key: str | None = None, security_token: str | None = None,
                 tls: ClientTlsConfig | None = None) -> None:
        super().__init__(group, namesrv_addr, timeout=timeout, instance_name=instance_name, access_key=access_key,
                         secret_key=secret_key, security_token=security_token, tls=tls)
        self.listener = listener
        self.topic = topic
        self.expression = expression
        self.expression_type = expression_type
        self.consume_from = consume_from
        self._stop = threading.Event()
        self._offsets: dict[MessageQueue, int] = {}
        self._lock = threading.Lock()
        self._threads: dict[MessageQueue, threading.Thread] = {}
        self._assigned: set[MessageQueue] = set()
        self._resets: dict[MessageQueue, int] = {}  # RESET_CONSUMER_CLIENT_OFFSET not yet taken by a pull loop
        self._queue_times: dict[MessageQueue, list[int]] = {}  # [last pull ms, last consume ms]
        self.stats = ConsumeStatsRecorder()
        self.start_timestamp = 0
        self.subscriptions = [SubscriptionData(retry_topic(self.group), "*"),
                              SubscriptionData(self.topic, self.expression, int(time.time() * 1000),
                                               sorted(_tags_filter(self.expression) or [])
                                               if self.expression_type == ExpressionType.TAG else [],
                                               expression_type=self.expression_type)]

    def _heartbeat(self) -> None:
        data = HeartbeatData(self.client.client_id, consumers=[ConsumerData(
            self.group, ConsumeType.CONSUME_PASSIVELY, MessageModel.CLUSTERING, self.consume_from,
            self.subscriptions)])
        for addr in self.client.known_brokers().values():
            try:
                self.client.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=data.encode()))
            except Exception as exc:
                log.info("heartbeat to %s failed: %s", addr, exc)

    def _rebalance(self) -> None:
        mine: set[MessageQueue] = set()
        for topic in (retry_topic(self.group), self.topic):
            route = self.client.route(topic, refresh=True)
            if route is None:
                continue
            addr = next(iter(route.masters.values()), None)
            if addr is None:
                continue
            resp = self.client.invoke(addr, RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                                    {"consumerGroup": self.group}))
            if resp.code != ResponseCode.SUCCESS:
                continue
            ids = ConsumerIdList.decode(resp.body).consumer_id_list
            mine |= set(allocate_averagely(route.read_queues, ids, self.client.client_id))
        with self._lock:
            for mq in mine - self._assigned:
                thread = threading.Thread(target=self._pull_loop, args=(mq,), name=f"pull-{mq.queue_id}", daemon=True)
                self._threads[mq] = thread
                thread.start()
            self._assigned = mine

    def _start_offset(self, mq: MessageQueue) -> int:
        committed = self.committed(mq)
        if committed is not None and committed >= 0:
            return committed
        if mq.topic.startswith("%RETRY%") or self.consume_from == ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0
        return self.max_offset(mq)

    def _take_reset(self, mq: MessageQueue) -> int | None:
        with self._lock:
            return self._resets.pop(mq, None)

    def _pull_loop(self, mq: MessageQueue) -> None:
        offset = None
        while not self._stop.is_set():
            with self._lock:
                if mq not in self._assigned:
                    return
            reset = self._take_reset(mq)
            if reset is not None:
                offset = reset
            try:
                if offset is None:
                    offset = self._start_offset(mq)
                began = time.monotonic()
                if mq.topic.startswith("%RETRY%"):  # the broker applies the topic's SQL92 selector to retries
                    result = self.pull(mq, offset, 32, "*", suspend_ms=2_000)
                else:
                    result = self.pull(mq, offset, 32, self.expression, 2_000, self.expression_type)
            except Exception as exc:
                log.info("pull %s failed: %s", mq, exc)
                self._stop.wait(1.0)
                continue
            self.stats.pulled(mq.topic, len(result.messages), (time.monotonic() - began) * 1000)
            self._queue_times.setdefault(mq, [0, 0])[0] = int(time.time() * 1000)
            reset = None
            for msg in result.messages:
                reset = self._take_reset(mq)
                if reset is not None:  # the offset was reset meanwhile: what is left of this batch is stale
                    break
                self._consume(mq, msg)
            offset = reset if reset is not None else result.next_begin_offset
            with self._lock:
                if mq in self._resets:  # a reset that arrived after the last message wins over the pull
                    offset = self._resets.pop(mq)
                self._offsets[mq] = offset

    def _consume(self, mq: MessageQueue, msg: MessageRecord) -> None:
        began = time.monotonic()
        try:
            self.listener(msg)
            ok = True
        except Exception as exc:  # RECONSUME_LATER: the broker redelivers through %RETRY%
            ok = False
            log.info("listener failed for %s: %s; sending back", msg.offset_msg_id, exc)
            try:
                self.send_back(msg)
            except Exception as back_exc:
                log.warning("send back failed: %s", back_exc)
        self.stats.consumed(mq.topic, ok, (time.monotonic() - began) * 1000)
        self._queue_times.setdefault(mq, [0, 0])[1] = int(time.time() * 1000)

    def reset_offsets(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: assigned queues of ``topic`` go on from the given offsets
        (a batch being consumed is abandoned after its current message), and those offsets are
        the ones the next commit sends."""
        with self._lock:
            for mq, offset in offsets.items():
                if mq.topic == topic and mq in self._assigned:
                    self._resets[mq] = offset
                    self._offsets[mq] = offset

    def consumer_offsets(self, topic: str) -> dict[MessageQueue, int]:
        """The in-memory offsets of ``topic``'s queues (GET_CONSUMER_STATUS_FROM_CLIENT)."""
        with self._lock:
            return {mq: offset for mq, offset in self._offsets.items() if mq.topic == topic}

    def running_info(self) -> ConsumerRunningInfo:
        """What GET_CONSUMER_RUNNING_INFO reports (Java's ``consumerRunningInfo``)."""
        with self._lock:
            assigned = sorted(self._assigned)
            offsets = dict(self._offsets)
        mq_table = {}
        for mq in assigned:
            last_pull, last_consume = self._queue_times.get(mq, [0, 0])
            mq_table[mq] = ProcessQueueInfo(commit_offset=offsets.get(mq, -1), last_pull_timestamp=last_pull,
                                            last_consume_timestamp=last_consume)
        properties = {
            "consumerGroup": self.group, "messageModel": MessageModel.CLUSTERING.name,
            "consumeFromWhere": ConsumeFromWhere(self.consume_from).name, "namesrvAddr": self.namesrv_addr,
            "instanceName": self.instance_name, "clientIP": self.client.client_id.split("@", 1)[0],
            "pullBatchSize": "32", "consumeMessageBatchMaxSize": "1", "unitMode": "false",
            PROP_CONSUME_ORDERLY: "false", PROP_THREADPOOL_CORE_SIZE: "1",
            PROP_CONSUMER_START_TIMESTAMP: str(self.start_timestamp),
            PROP_NAMESERVER_ADDR: ";".join(self.client.namesrv_addrs),
            PROP_CONSUME_TYPE: ConsumeType.CONSUME_PASSIVELY.name,
            PROP_CLIENT_VERSION: version_desc(DEFAULT_VERSION)}
        return ConsumerRunningInfo(properties=properties, subscription_set=list(self.subscriptions), mq_table=mq_table,
                                   status_table={s.topic: self.stats.status(s.topic) for s in self.subscriptions})

    def consume_directly(self, msg: MessageRecord) -> ConsumeMessageDirectlyResult:
        """CONSUME_MESSAGE_DIRECTLY: run the listener on one message, outside the pull loops."""
        began = time.monotonic()
        try:
            self.listener(msg)
            result = ConsumeMessageDirectlyResult(CMResult.CR_SUCCESS)
        except Exception as exc:
            result = ConsumeMessageDirectlyResult(CMResult.CR_THROW_EXCEPTION, remark=f"{type(exc).__name__}: {exc}")
        result.spent_time_mills = int((time.monotonic() - began) * 1000)
        return result

    def _commit_all(self) -> None:
        with self._lock:
            offsets = dict(self._offsets)
        for mq, offset in offsets.items():
            try:
                self.commit(mq, offset)
            except Exception as exc:
                log.info("commit %s failed: %s", mq, exc)

    def _background(self) -> None:
        ticks = 0
        while not self._stop.wait(1.0):
            ticks += 1
            if ticks % 5 == 0:
                self._commit_all()
            if ticks % 10 == 0:
                self._heartbeat()
                self._rebalance()

    def start(self) -> "PushConsumer":
        super().start()
        self.start_timestamp = int(time.time() * 1000)
        self.client.request_handlers[RequestCode.NOTIFY_CONSUMER_IDS_CHANGED] = \
            lambda cmd: threading.Thread(target=self._rebalance, daemon=True).start()
        register_broker_requests(self)
        self.client.route(self.topic, refresh=True)
        self.client.route(retry_topic(self.group), refresh=True)
        try:
            self.check_client_config(self.topic, self.expression, self.expression_type)
        except Exception:
            super().shutdown()
            raise
        self._heartbeat()
        self._rebalance()
        threading.Thread(target=self._background, name="consumer-background", daemon=True).start()
        return self

    def shutdown(self) -> None:
        self._stop.set()
        for thread in list(self._threads.values()):
            thread.join(5)
        if self._client is not None:
            self._commit_all()
            for addr in self.client.known_brokers().values():
                try:
                    self.client.invoke(addr, RemotingCommand.request(
                        RequestCode.UNREGISTER_CLIENT, {"clientID": self.client.client_id, "producerGroup": "",
                                                        "consumerGroup": self.group}))
                except Exception:
                    pass
        super().shutdown()
