"""Producer: route lookup, queue selection that avoids failing brokers, retries on another broker.

Sends use the standard V2 headers (SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE), exactly what Java
clients send, so the replay job can target rocketlake's broker or an Apache cluster alike.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import zlib
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Sequence

from broker.client.instance import ClientLifecycle, MQClientError, TopicRoute, session_credentials
from broker.remoting.bodies import HeartbeatData, MessageQueue, ProducerData
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.tls import ClientTlsConfig
from broker.remoting.headers import SendMessageRequestHeader
from broker.store.batch import BatchItem, encode_batch
from broker.store.constants import (
    COMPRESSED_FLAG,
    DEFAULT_MAX_MESSAGE_SIZE,
    PROPERTY_TRAN_MSG,
    TRANSACTION_PREPARED_TYPE,
)
from broker.store.message_id import UniqKeyGenerator
from broker.store.properties import encode_properties
from broker.store.topics import DEFAULT_TOPIC, validate_topic

log = logging.getLogger(__name__)

COMPRESS_OVER = 4096  # compressMsgBodyOverHowmuch
COMPRESS_LEVEL = 5


@dataclass
class Message:
    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] | str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    delay_level: int = 0

    def properties_with(self, uniq_key: str, wait: bool = True) -> dict[str, str]:
        props = dict(self.properties)
        if self.keys:
            props["KEYS"] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.tags:
            props["TAGS"] = self.tags
        if self.delay_level > 0:
            props["DELAY"] = str(self.delay_level)
        props.setdefault("UNIQ_KEY", uniq_key)
        if wait:
            props["WAIT"] = "true"
        return props


class SendStatus(Enum):
    SEND_OK = 0
    FLUSH_DISK_TIMEOUT = 10
    FLUSH_SLAVE_TIMEOUT = 12
    SLAVE_NOT_AVAILABLE = 11


@dataclass(frozen=True)
class SendResult:
    status: SendStatus
    msg_id: str  # UNIQ_KEY (client id), "," joined for a batch
    offset_msg_id: str  # broker id(s)
    queue: MessageQueue
    queue_offset: int


class LatencyFaultTolerance:
    """Brokers that failed recently are avoided for a while (longer after slower failures)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._until: dict[str, float] = {}
        self._clock = clock
        self._lock = threading.Lock()

    def failed(self, broker: str, isolation_s: float = 30.0) -> None:
        with self._lock:
            self._until[broker] = self._clock() + isolation_s

    def succeeded(self, broker: str) -> None:
        with self._lock:
            self._until.pop(broker, None)

    def available(self, broker: str) -> bool:
        with self._lock:
            until = self._until.get(broker)
            return until is None or until <= self._clock()


HEARTBEAT_INTERVAL_S = 30.0  # MQClientInstance's heartbeatBrokerInterval


class Producer(ClientLifecycle):
    """``Producer("group", "127.0.0.1:9876").start()`` then ``send``/``send_async``/``send_oneway``/``send_batch``."""

    def __init__(self, group: str, namesrv_addr: str, *, send_timeout: float = 3.0, retry_times: int = 2,
                 max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE, instance_name: str = "DEFAULT",
                 access_key: str | None = None, secret_key: str | None = None,
                 security_token: str | None = None, tls: ClientTlsConfig | None = None,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL_S) -> None:
        self.group = group
        self.credentials = session_credentials(access_key, secret_key, security_token)
        self.heartbeat_interval = heartbeat_interval  # heartbeatBrokerInterval
        self.namesrv_addr = namesrv_addr
        self.send_timeout = self.timeout = send_timeout
        self.retry_times = retry_times
        self.max_message_size = max_message_size
        self.instance_name = instance_name
        self.tls = tls  # every connection over TLS (see ClientInstance)
        self.faults = LatencyFaultTolerance()
        self._counter = itertools.count()
        self._uniq = UniqKeyGenerator()
        self._client = None
        self._greeted: set[str] = set()  # brokers this producer has sent a heartbeat to
        self._stop = threading.Event()

    # ---- lifecycle: heartbeats ------------------------------------------------------------------------
    def start(self) -> "Producer":
        """Connect, and heartbeat every broker this producer talks to (on first contact, then every
        30 s as Apache's client instance does): a broker only lists producers it has heard from
        (mqadmin producerConnection), and a transaction check needs a live producer of the group."""
        super().start()
        self._stop.clear()
        self._greeted = set()
        threading.Thread(target=self._heartbeats, name="producer-heartbeat", daemon=True).start()
        return self

    def shutdown(self) -> None:
        """Unregister from the brokers (UNREGISTER_CLIENT, as Apache's producer does), then close."""
        self._stop.set()
        if self._client is not None:
            for addr in list(self._greeted):
                try:
                    self.client.invoke(addr, RemotingCommand.request(
                        RequestCode.UNREGISTER_CLIENT, {"clientID": self.client.client_id,
                                                        "producerGroup": self.group, "consumerGroup": ""}), 1.0)
                except Exception as exc:
                    log.debug("unregister from %s failed: %s", addr, exc)
        super().shutdown()

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            for addr in list(self._greeted):
                self._heartbeat(addr)

    def _heartbeat(self, addr: str) -> None:
        data = HeartbeatData(self.client.client_id, producers=[ProducerData(self.group)])
        try:
            self.client.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=data.encode()),
                               self.send_timeout)
        except Exception as exc:  # the send itself will report a broker that is really gone
            log.info("heartbeat to %s failed: %s", addr, exc)

    def _broker(self, route: TopicRoute, mq: MessageQueue) -> str:
        """The address of ``mq``'s broker, heartbeaten first if this is our first request to it."""
        return self._greet(route.masters[mq.broker_name])

    def _greet(self, addr: str) -> str:
        if addr not in self._greeted:
            self._greeted.add(addr)
            self._heartbeat(addr)
        return addr

    # ---- routing -------------------------------------------------------------------------------------
    def _route(self, topic: str) -> tuple[TopicRoute, bool]:
        """The topic's route, or TBW102's for auto-creation (second value True)."""
        route = self.client.route(topic)
        if route is not None and route.write_queues:
            return route, False
        default = self.client.route(DEFAULT_TOPIC)
        if default is None or not default.write_queues:
            raise MQClientError(f"No route info of this topic: {topic}", ResponseCode.TOPIC_NOT_EXIST)
        queues = [MessageQueue(topic, q.broker_name, q.queue_id) for q in default.write_queues if q.queue_id < 4]
        return TopicRoute(default.data, default.fetched, queues, [], default.masters), True

    def select_queue(self, route: TopicRoute, avoid: str | None = None) -> MessageQueue:
        """Round-robin over writable queues, skipping brokers that failed recently and ``avoid``."""
        queues = route.write_queues
        start = next(self._counter)
        for i in range(len(queues)):
            mq = queues[(start + i) % len(queues)]
            if mq.broker_name != avoid and self.faults.available(mq.broker_name):
                return mq
        for i in range(len(queues)):  # everything is failing: still try something other than avoid
            mq = queues[(start + i) % len(queues)]
            if mq.broker_name != avoid:
                return mq
        return queues[start % len(queues)]

    # ---- requests ------------------------------------------------------------------------------------
    def _request(self, msg: Message, mq: MessageQueue, auto_create: bool, batch_body: bytes | None = None,
                 props: dict[str, str] | None = None) -> RemotingCommand:
        body = batch_body if batch_body is not None else msg.body
        # sendKernelImpl: a message marked TRAN_MSG is sent as a prepared (half) message
        sys_flag = TRANSACTION_PREPARED_TYPE if (props or {}).get(PROPERTY_TRAN_MSG, "").lower() == "true" else 0
        if batch_body is None and len(body) >= COMPRESS_OVER:
            body = zlib.compress(body, COMPRESS_LEVEL)
            sys_flag |= COMPRESSED_FLAG
        header = SendMessageRequestHeader(
            producer_group=self.group, topic=msg.topic, default_topic=DEFAULT_TOPIC, default_topic_queue_nums=4,
            queue_id=mq.queue_id, sys_flag=sys_flag, born_timestamp=int(time.time() * 1000), flag=msg.flag,
            properties=encode_properties(props or {}), reconsume_times=0, unit_mode=False,
            batch=batch_body is not None)
        code = RequestCode.SEND_BATCH_MESSAGE if batch_body is not None else RequestCode.SEND_MESSAGE_V2
        return RemotingCommand.request(code, header.to_ext(v2=True), body)

    def _check(self, msg: Message) -> None:
        validate_topic(msg.topic)
        if len(msg.body) > self.max_message_size:
            raise MQClientError(f"message body size {len(msg.body)} exceeds {self.max_message_size}",
                                ResponseCode.MESSAGE_ILLEGAL)

    def _result(self, resp: RemotingCommand, mq: MessageQueue, uniq: str) -> SendResult:
        if resp.code not in (0, 10, 11, 12):
            raise MQClientError(f"send to {mq.broker_name} failed: code {resp.code} {resp.remark or ''}".strip(),
                                resp.code)
        ext = resp.ext_fields
        return SendResult(SendStatus(resp.code), uniq, ext.get("msgId", ""),
                          MessageQueue(mq.topic, mq.broker_name, int(ext.get("queueId", mq.queue_id))),
                          int(ext.get("queueOffset", -1)))

    def _send(self, msg: Message, selector: Callable[[list[MessageQueue]], MessageQueue] | None,
              batch_items: list[Message] | None = None) -> SendResult:
        last: Exception | None = None
        avoid = None
        for attempt in range(self.retry_times + 1):
            route, auto = self._route(msg.topic)
            mq = selector(route.write_queues) if selector else self.select_queue(route, avoid)
            if batch_items is not None:
                uniqs = [self._uniq.next() for _ in batch_items]
                body = encode_batch([BatchItem(m.body, encode_properties(m.properties_with(u)), m.flag)
                                     for m, u in zip(batch_items, uniqs)])
                cmd = self._request(msg, mq, auto, batch_body=body, props={"WAIT": "true"})
                uniq = ",".join(uniqs)
            else:
                uniq = self._uniq.next()
                cmd = self._request(msg, mq, auto, props=msg.properties_with(uniq))
            addr = self._broker(route, mq)
            try:
                resp = self.client.invoke(addr, cmd, self.send_timeout)
                result = self._result(resp, mq, uniq)
                self.faults.succeeded(mq.broker_name)
                return result
            except MQClientError as exc:
                last = exc
                if exc.code in (ResponseCode.MESSAGE_ILLEGAL, ResponseCode.NO_PERMISSION):
                    raise
            except Exception as exc:  # timeouts, closed connections
                last = exc
            self.faults.failed(mq.broker_name)
            avoid = mq.broker_name
            log.info("send attempt %d of %s to %s failed: %s", attempt + 1, msg.topic, mq.broker_name, last)
            if selector is not None:
                break  # an ordered send must not move to another queue
        raise MQClientError(f"send of {msg.topic} failed after {self.retry_times + 1} attempts: {last}",
                            getattr(last, "code", None))

    # ---- public API ----------------------------------------------------------------------------------
    def send(self, msg: Message) -> SendResult:
        """Sync send: retried on another broker when a broker fails."""
        self._check(msg)
        return self._send(msg, None)

    def send_once(self, msg: Message, mq: MessageQueue, timeout: float | None = None) -> Future:
        """ONE attempt to store ``msg`` in ``mq``, no retry: a Future[SendResult].

        For callers that must know whether a message may have landed (the replay ledger): the
        Future fails with :class:`MQClientError` carrying the broker's code when the broker refused
        it (certainly not stored), ``RemotingConnectError`` when no connection could be made
        (certainly not sent), and ``RemotingTimeout``/``ConnectionClosed`` when it was sent and no
        answer came (it may be stored). A UNIQ_KEY already in ``msg.properties`` is kept."""
        self._check(msg)
        uniq = msg.properties.get("UNIQ_KEY") or self._uniq.next()
        route = self.client.route(msg.topic)
        addr = route.masters.get(mq.broker_name) if route is not None else None
        if addr is None:
            addr = self.client.broker_addr(mq.broker_name, msg.topic)
        self._greet(addr)
        cmd = self._request(msg, mq, False, props=msg.properties_with(uniq))
        out: Future = Future()

        def done(resp_future: Future) -> None:
            try:
                out.set_result(self._result(resp_future.result(), mq, uniq))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                out.set_exception(exc)

        self.client.invoke_future(addr, cmd, timeout or self.send_timeout).add_done_callback(done)
        return out

    def send_orderly(self, msg: Message, sharding_key: int | str) -> SendResult:
        """Messages with the same key go to the same queue (in order); no retry on another queue."""
        self._check(msg)
        key = sharding_key if isinstance(sharding_key, int) else sum(sharding_key.encode())
        return self._send(msg, lambda queues: queues[key % len(queues)])

    def send_async(self, msg: Message) -> Future:
        """Returns a Future[SendResult]; runs the sync path (with retries) on a worker thread."""
        self._check(msg)
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(self._send(msg, None))
            except Exception as exc:
                fut.set_exception(exc)

        threading.Thread(target=run, name="send-async", daemon=True).start()
        return fut

    def send_oneway(self, msg: Message) -> None:
        """Fire and forget: no answer is awaited (the oneway flag is set on the wire)."""
        self._check(msg)
        route, auto = self._route(msg.topic)
        mq = self.select_queue(route)
        cmd = self._request(msg, mq, auto, props=msg.properties_with(self._uniq.next()))
        cmd.mark_oneway()
        self.client.invoke_oneway(self._broker(route, mq), cmd)

    def send_batch(self, messages: Sequence[Message]) -> SendResult:
        """One batch of messages of one topic, stored consecutively in one queue."""
        if not messages:
            raise ValueError("empty batch")
        topics = {m.topic for m in messages}
        if len(topics) != 1 or any(m.delay_level for m in messages):
            raise MQClientError("a batch must be one topic and may not be delayed", ResponseCode.MESSAGE_ILLEGAL)
        for m in messages:
            self._check(m)
        return self._send(messages[0], None, batch_items=list(messages))
