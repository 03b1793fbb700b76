"""Request processors: what the broker answers to each remoting request.

``BrokerCore`` holds every piece of broker state (the MessageStore, the topic/group/offset tables of
:class:`~broker.server.metadata.BrokerMetadata`, the client registry, queue locks) and turns a request
into a reply. It runs in the store process; the network processes forward decoded requests to it and
write its replies back (see :mod:`broker.server.broker`). Keeping the logic here, in one process,
means metadata has exactly one writer and no cross-process locking.

Long polling is a reply too: a PULL that finds nothing and may be held comes back as
``Reply.suspend``; the network process parks it and asks again when the queue grows.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Callable

from broker.remoting.bodies import (
    BodyError,
    CheckClientRequestBody,
    ConsumeStats,
    ConsumerIdList,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageModel,
    MessageQueue,
    OffsetWrapper,
    TopicOffset,
    TopicStatsTable,
    dumps_json,
    loads_lenient,
)
from broker.remoting.codes import PermName, PullSysFlag, RequestCode, ResponseCode, perm_to_string
from broker.remoting.command import HeaderError, ProtocolError
from broker.remoting.headers import (
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    GetConsumerListByGroupRequestHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    GetTopicStatsInfoRequestHeader,
    PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    SearchOffsetRequestHeader,
    SendMessageRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from broker.server.admin_stats import count_send_back, stats_handlers
from broker.server.admin_metadata import metadata_handlers
from broker.server.clients import ClientRegistry, Notify
from broker.server.filter.consumer_filter import Refusal, check_client_config, pull_filter
from broker.engine.message_store import EncodedPut, GetStatus, MessageStore, PutResult, PutStatus
from broker.server.metadata import BrokerMetadata
from broker.server.send_back import consumer_send_back
from broker.server.transaction_records import half_of, is_transaction_send
from broker.server.send_draft import (
    NOT_ALLOWED_SEND_TOPICS,
    SendDraft,
    TopicRefused,
    check_topic_name,
    peer_host,
    properties_too_long,
    send_properties,
    waits_for_store,
)
from broker.server.request_reply import Reply, Request
from broker.server.stats import BrokerStatsManager
from broker.server.settings import BrokerSettings
from broker.server.settings.declared import MAX_TOPIC_QUEUE_NUMS as MAX_QUEUE_NUMS
from broker.store.batch import BatchFormatError, decode_batch
from broker.store.config_files import ConfigFileError, SubscriptionGroupConfig, TopicConfig
from broker.store.constants import (
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_MASK,
    MAX_PROPERTIES_LENGTH,
    NAME_VALUE_SEPARATOR,
    PROPERTY_CLUSTER,
    PROPERTY_SEPARATOR,
    PROPERTY_UNIQ_KEY,
)
from broker.store.delay import delay_level_of
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from broker.store.message_id import UniqKeyGenerator
from broker.store.properties import decode_properties
from broker.store.topics import (
    DEFAULT_TOPIC,
    TRANS_HALF_TOPIC,
    InvalidTopicError,
    consumer_group_of,
    dlq_topic,
    is_retry_topic,
    retry_topic,
)

log = logging.getLogger(__name__)

# Apache reads it from the JVM system property rocketmq.broker.rebalance.lockMaxLiveTime, not broker.conf
LOCK_MAX_LIVE_S = 60.0
V3_4_9 = 121  # clients at or above honour maxReconsumeTimes from the send-back header


@dataclass
class PreparedSend:
    """A validated send, ready for the store: one record, or the records of a batch."""

    records: list[MessageRecord]
    batch: bool
    queue_id: int
    uniq_key: str | None
    encoded: bytes | None = None  # a drafted send's record, encoded by the network process (records: [])
    topic: str = ""
    delay: bool = True  # whether DELAY may move it to the schedule topic (never a half message)
    wait: bool = True  # WAIT: a SYNC_MASTER answers only once a slave has it

    def put(self) -> tuple[list[MessageRecord], bool, bool] | EncodedPut:
        """What ``MessageStore.put_many`` takes for this send."""
        if self.encoded is not None:
            return EncodedPut(self.encoded, self.topic, self.queue_id)
        return self.records, self.batch, not self.batch and self.delay

    @property
    def count(self) -> int:
        return 1 if self.encoded is not None else len(self.records)


# SendMessageProcessor's remark for a put refused as MESSAGE_ILLEGAL / PROPERTIES_SIZE_EXCEEDED (4.9.x wording)
MESSAGE_ILLEGAL_REMARK = ("the message is illegal, maybe msg body or properties length not matched. "
                          "msg body length limit 128k, msg properties length limit 32k.")


# sendOK statuses: the message is stored; the code says what was not confirmed (flush, slave)
_STORED_CODES = frozenset({ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT,
                           ResponseCode.SLAVE_NOT_AVAILABLE})


def service_not_available_remark(store_dir: str | os.PathLike) -> str:
    """SendMessageProcessor's remark for SERVICE_NOT_AVAILABLE (a slave, a store shutting down), with
    ``diskUtil()``'s used-space ratios of the commitlog, consume queue and index paths (-1 if absent)."""
    def used(sub: str) -> float:
        try:
            du = shutil.disk_usage(os.path.join(store_dir, sub))
        except OSError:
            return -1.0
        return (du.total - du.free) / du.total if du.total else -1.0

    disk = f"CL: {used('commitlog'):5.2f} CQ: {used('consumequeue'):5.2f} INDEX: {used('index'):5.2f}"
    return ("service not available now. It may be caused by one of the following reasons: "
            f"the broker's disk is full [{disk}], messages are put to the slave, message store has been shut down, etc.")


def _error(code: int, remark: str) -> Reply:
    return Reply(code=code, remark=remark)


def _topic_config_text(config: TopicConfig) -> str:
    """Java ``TopicConfig.toString()`` (4.9.x), quoted in the send processor's illegal-queue remark."""
    return (f"TopicConfig [topicName={config.topic_name}, readQueueNums={config.read_queue_nums}, "
            f"writeQueueNums={config.write_queue_nums}, perm={perm_to_string(config.perm)}, "
            f"topicFilterType={config.topic_filter_type}, topicSysFlag={config.topic_sys_flag}, "
            f"order={'true' if config.order else 'false'}]")


_PULL_CODES = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}

_PERM_WRITE = int(PermName.WRITE)  # a plain int: a Flag's ``&`` costs a microsecond per send


_PUT_CODES = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutStatus.TOPIC_NOT_EXIST: ResponseCode.TOPIC_NOT_EXIST,
}


def _queue_for_send(config: TopicConfig, queue_id: int) -> int:
    """The queue a send asking for ``queue_id`` goes to (``msgCheck``'s rule, written once for the
    send fast path and the full path): a random writable queue for < 0, the asked one when the topic
    has it; -1 when it does not."""
    if queue_id < 0:
        return random.randrange(max(config.write_queue_nums, 1))
    if queue_id >= max(config.read_queue_nums, config.write_queue_nums):
        return -1
    return queue_id


class BrokerCore:
    """All request handling against one open MessageStore and its metadata (``self.metadata``:
    topics, groups, consumer and delay offsets; the caller opens and closes both)."""

    def __init__(self, store: MessageStore, metadata: BrokerMetadata, *, cluster_name: str, broker_name: str,
                 broker_addr: str, max_message_size: int, auto_create_topic: bool = True,
                 on_topics_changed: Callable[[], None] | None = None,
                 clients: ClientRegistry | None = None, settings: BrokerSettings | None = None,
                 config_path: str | None = None) -> None:
        self.store = store
        self.metadata = metadata
        self.cluster_name = cluster_name
        self.broker_name = broker_name
        self.broker_addr = broker_addr
        self.store_host = Host.parse(broker_addr)
        self.max_message_size = max_message_size
        self.auto_create_topic = auto_create_topic
        self.settings = settings or BrokerSettings()  # replaced whole by UPDATE_BROKER_CONFIG
        self.clients = clients or ClientRegistry(channel_expired_s=self.settings.client_channel_max_idle_time_seconds)
        self.on_topics_changed = on_topics_changed or (lambda: None)
        self._uniq = UniqKeyGenerator(ip=self.store_host.address if len(self.store_host.address) == 4 else None)
        self._locks: dict[tuple[str, MessageQueue], tuple[str, float]] = {}
        self._locks_mutex = threading.Lock()
        self._handlers: dict[int, Callable[[Request], Reply]] = {
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.SEND_BATCH_MESSAGE: self.send_message,
            RequestCode.PULL_MESSAGE: self.pull_message,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.consumer_send_msg_back,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch_mq,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch_mq,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_and_create_subscription_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.get_all_subscription_group_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.get_all_consumer_offset,
            RequestCode.GET_ALL_DELAY_OFFSET: self.get_all_delay_offset,
            RequestCode.GET_TOPIC_STATS_INFO: self.get_topic_stats_info,
            RequestCode.GET_CONSUME_STATS: self.get_consume_stats,
        }
        self.stats = BrokerStatsManager(cluster_name)  # tests swap in one with a fake clock
        self._handlers.update(stats_handlers(self))
        self._handlers.update(metadata_handlers(self))

        from broker.server.admin_clients import AdminClientHandlers  # it imports this module
        from broker.server.admin_config import install_config_handlers  # it builds on this module's Reply
        from broker.server.end_transaction import EndTransactionHandler  # it builds on this module's Reply

        self.admin_clients = AdminClientHandlers(self)  # adds the admin requests about connected clients
        install_config_handlers(self, config_path)
        EndTransactionHandler(self)

    # ---- entry -------------------------------------------------------------------------------------------
    def process(self, req: Request) -> Reply:
        handler = self._handlers.get(req.code)
        if handler is None:
            # NettyRemotingAbstract's remark, leading space included
            return _error(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {req.code} not supported")
        return self._guarded(handler, req)

    def send_messages(self, reqs: list[Request]) -> list[Reply]:
        """Sends that arrived together: validated one by one, stored with one ``put_many``."""
        replies: list[Reply | None] = [None] * len(reqs)
        ready: list[tuple[int, PreparedSend]] = []
        configs: dict[str, TopicConfig] = {}  # a topic's config, looked up once per call
        for i, req in enumerate(reqs):
            if type(req) is SendDraft:
                prepared = self._place_draft_fast(req, configs)
                if prepared is None:  # anything unusual: the one full path answers it
                    prepared = self._guarded(self._place_draft, req)
            else:
                prepared = self._guarded(self._prepare_send, req)
            if type(prepared) is Reply:
                replies[i] = prepared
            else:
                ready.append((i, prepared))
        if ready:
            try:
                results = self.store.put_many([p.put() for _, p in ready], waits=[p.wait for _, p in ready])
            except Exception as exc:
                log.exception("storing %d sends failed", len(ready))
                results = None
                for i, _ in ready:
                    replies[i] = _error(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
            if results is not None:
                for (i, p), result in zip(ready, results):
                    replies[i] = self._send_reply(result, p.queue_id, p.uniq_key)
                self.stats.on_puts([(p.topic, p.count, r.wrote_bytes) for (_, p), r in zip(ready, results) if r.ok])
        return replies  # type: ignore[return-value]

    def _place_draft_fast(self, d: SendDraft, configs: dict[str, TopicConfig]) -> PreparedSend | None:
        """:meth:`_place_draft` for the send that is simply accepted (its topic exists and is
        writable, the size and queue are right), with the topic's config looked up once per batch
        in ``configs``; None for anything else, which :meth:`_place_draft` then decides — every
        refusal and every topic creation is answered there, in one place."""
        if d.body_size > self.max_message_size:
            return None
        config = configs.get(d.topic)
        if config is None:
            config = self.metadata.topics.get(d.topic)
            if config is None:
                return None
            configs[d.topic] = config
        if not config.perm & _PERM_WRITE:
            return None
        queue_id = _queue_for_send(config, d.queue_id)
        if queue_id < 0:
            return None
        return PreparedSend([], False, queue_id, d.uniq_key, encoded=d.data, topic=d.topic, wait=d.wait)

    def _guarded(self, handler: Callable[[Request], object], req: Request):
        try:
            return handler(req)
        except (HeaderError, ProtocolError) as exc:
            log.info("bad request %d from %s: %s", req.code, req.peer, exc)
            return _error(ResponseCode.SYSTEM_ERROR, str(exc))
        except TopicRefused as exc:  # Apache's own remark
            return _error(ResponseCode.SYSTEM_ERROR, str(exc))
        except InvalidTopicError as exc:
            return _error(ResponseCode.SYSTEM_ERROR, f"invalid topic: {exc}")
        except Exception as exc:  # never let one request take the broker down
            log.exception("request %d from %s failed", req.code, req.peer)
            return _error(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    # ---- topics --------------------------------------------------------------------------------------
    def _topic_for_send(self, topic: str, default_topic: str | None,
                        default_queue_nums: int | None) -> TopicConfig | None:
        topics = self.metadata.topics
        config = topics.get(topic)
        if config is not None:
            return config
        if is_retry_topic(topic):
            config = topics.create_topic_in_send_back(topic, 1)
        elif self.auto_create_topic:
            config = topics.create_topic_in_send_message(topic, default_topic or DEFAULT_TOPIC, default_queue_nums or 4)
        if config is not None:
            self.on_topics_changed()
        return config

    def _send_target(self, topic: str, default_topic: str | None, default_queue_nums: int | None,
                     queue_id: int, peer: str) -> Reply | tuple[TopicConfig, int]:
        """The stateful checks of a send (``msgCheck``): the topic's config (auto-created when
        allowed), its write permission, and the queue (a random writable one for < 0)."""
        config = self._topic_for_send(topic, default_topic, default_queue_nums)
        if config is None:
            return _error(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not config.perm & _PERM_WRITE:
            return _error(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        chosen = _queue_for_send(config, queue_id)
        if chosen < 0:
            return _error(ResponseCode.SYSTEM_ERROR, f"request queueId[{queue_id}] is illegal, "
                                                     f"{_topic_config_text(config)} Producer: {peer}")
        return config, chosen

    # ---- send ------------------------------------------------------------------------------------------
    def send_message(self, req: Request) -> Reply:
        return self.send_messages([req])[0]

    def _too_big(self, topic: str, size: int, peer: str) -> Reply | None:
        if size <= self.max_message_size:
            return None
        log.info("send to %s from %s: body of %d bytes exceeds maxMessageSize %d", topic, peer, size,
                 self.max_message_size)
        return _error(ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK)

    def _place_draft(self, d: SendDraft) -> Reply | PreparedSend:
        """A send drafted by a network process (:mod:`broker.server.send_draft`): only the stateful
        half is left. The size is checked again: UPDATE_BROKER_CONFIG may have lowered the limit."""
        refusal = self._too_big(d.topic, d.body_size, d.peer)
        if refusal is not None:
            return refusal
        target = self._send_target(d.topic, d.default_topic, d.default_topic_queue_nums, d.queue_id, d.peer)
        if isinstance(target, Reply):
            return target
        return PreparedSend([], False, target[1], d.uniq_key, encoded=d.data, topic=d.topic, wait=d.wait)

    def _prepare_send(self, req: Request) -> Reply | PreparedSend:
        h = SendMessageRequestHeader.from_ext(req.ext, v2=req.code in (RequestCode.SEND_MESSAGE_V2,
                                                                        RequestCode.SEND_BATCH_MESSAGE))
        check_topic_name(h.topic)
        if h.topic in NOT_ALLOWED_SEND_TOPICS:  # e.g. a forged SCHEDULE_TOPIC_XXXX record would jam its delay level
            return _error(ResponseCode.NO_PERMISSION, f"Sending message to topic[{h.topic}] is forbidden.")
        if not h.batch:
            refusal = self._too_big(h.topic, len(req.body), req.peer)
            if refusal is not None:
                return refusal
        target = self._send_target(h.topic, h.default_topic, h.default_topic_queue_nums, h.queue_id, req.peer)
        if isinstance(target, Reply):
            return target
        queue_id = target[1]
        topic, reconsume = h.topic, h.reconsume_times or 0
        if is_retry_topic(topic):
            group = consumer_group_of(topic) or ""
            sub = self.metadata.groups.find(group)
            if sub is None:  # handleRetryAndDLQ
                return _error(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
            max_times = sub.retry_max_times
            if h.max_reconsume_times is not None and req.version >= V3_4_9:
                max_times = h.max_reconsume_times
            if reconsume >= max_times:  # handleRetryAndDLQ: at the limit it is dead
                topic, queue_id = dlq_topic(group), 0
                if self.metadata.topics.get(topic) is None:
                    self.metadata.topics.create_topic_in_send_back(topic, 1)
                    self.on_topics_changed()
        born = peer_host(req.peer)
        if h.batch:
            return self._send_batch(h, req.body, topic, queue_id, born)
        props = decode_properties(h.properties or "")
        wait = waits_for_store(props)
        raw = send_properties(props, self._uniq, self.cluster_name)
        if properties_too_long(raw):
            log.info("send to %s from %s: properties of %d chars exceed %d bytes", h.topic, req.peer, len(raw),
                     MAX_PROPERTIES_LENGTH)
            return _error(ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK)
        rec = MessageRecord(topic=topic, body=req.body, properties_raw=raw, queue_id=queue_id, flag=h.flag,
                            sys_flag=h.sys_flag, born_timestamp=h.born_timestamp, born_host=born,
                            store_host=self.store_host, reconsume_times=reconsume)
        if is_transaction_send(props) and not (reconsume > 0 and (delay_level_of(props) or 0) > 0):
            # SendMessageProcessor: a half message (a sent-back retry of one, as 4.6.1- clients send, is not)
            if self.settings.reject_transaction_message:
                return _error(ResponseCode.NO_PERMISSION,
                              f"the broker[{self.settings.broker_ip1}] sending transaction message is forbidden")
            # stored in the half topic; the reply names the half's ids with the real queue id, as Apache's.
            # Never delayed: a delayed half would come back from the schedule topic as a half again
            return PreparedSend([half_of(rec)], False, queue_id, props.get(PROPERTY_UNIQ_KEY), topic=TRANS_HALF_TOPIC,
                                delay=False, wait=wait)
        return PreparedSend([rec], False, queue_id, props.get(PROPERTY_UNIQ_KEY), topic=topic, wait=wait)

    def _send_batch(self, h: SendMessageRequestHeader, body: bytes, topic: str, queue_id: int,
                    born: Host) -> Reply | PreparedSend:
        if is_retry_topic(topic):
            return _error(ResponseCode.MESSAGE_ILLEGAL, f"batch request does not support retry group {topic}")
        if h.sys_flag & COMPRESSED_FLAG:  # the C++ client zlib-compresses whole batches >= 4 KiB
            try:
                body = zlib.decompress(body)
            except zlib.error as exc:
                return _error(ResponseCode.MESSAGE_ILLEGAL, f"compressed batch body does not inflate: {exc}")
        try:
            items = decode_batch(body)
        except BatchFormatError as exc:
            return _error(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        if not items:
            return _error(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        records = []
        for item in items:
            if len(item.body) > self.max_message_size:
                return _error(ResponseCode.MESSAGE_ILLEGAL,
                              f"batch item body size {len(item.body)} exceeds maxMessageSize")
            raw = item.properties_raw
            if raw and not raw.endswith(PROPERTY_SEPARATOR):
                raw += PROPERTY_SEPARATOR
            raw += f"{PROPERTY_CLUSTER}{NAME_VALUE_SEPARATOR}{self.cluster_name}"
            records.append(MessageRecord(topic=topic, body=item.body, properties_raw=raw, queue_id=queue_id,
                                         flag=item.flag, sys_flag=h.sys_flag & ~(COMPRESSED_FLAG | COMPRESSION_TYPE_MASK),
                                         born_timestamp=h.born_timestamp, born_host=born,
                                         store_host=self.store_host, reconsume_times=h.reconsume_times or 0))
        return PreparedSend(records, True, queue_id, None, topic=topic,
                            wait=waits_for_store(decode_properties(h.properties or "")))

    def _send_reply(self, result: PutResult, queue_id: int, uniq_key: str | None) -> Reply:
        if result.status is PutStatus.PUT_OK:  # the usual case, straight to the reply
            ext = {"msgId": result.msg_id, "queueId": str(queue_id), "queueOffset": str(result.queue_offset)}
            if uniq_key:
                ext["transactionId"] = uniq_key
            return Reply(ResponseCode.SUCCESS, None, ext)
        code = _PUT_CODES.get(result.status, ResponseCode.SYSTEM_ERROR)
        if code == ResponseCode.MESSAGE_ILLEGAL:
            return _error(code, MESSAGE_ILLEGAL_REMARK)
        if code == ResponseCode.SERVICE_NOT_AVAILABLE:
            return _error(code, service_not_available_remark(self.store.store_dir))
        if code not in _STORED_CODES:
            return _error(code, result.status.value)
        ext = {"msgId": result.msg_id, "queueId": str(queue_id), "queueOffset": str(result.queue_offset)}
        if uniq_key:
            ext["transactionId"] = uniq_key
        return Reply(code=code, remark=None if code == ResponseCode.SUCCESS else result.status.value, ext=ext)

    # ---- pull ------------------------------------------------------------------------------------------
    def pull_message(self, req: Request) -> Reply:
        h = PullMessageRequestHeader.from_ext(req.ext)
        group = self.metadata.groups.find(h.consumer_group)
        if group is None:
            return _error(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                          f"subscription group [{h.consumer_group}] does not exist")
        if not group.consume_enable:
            return _error(ResponseCode.NO_PERMISSION, f"subscription group no permission, {h.consumer_group}")
        config = self.metadata.topics.get(h.topic)
        if config is None:
            return _error(ResponseCode.TOPIC_NOT_EXIST, f"topic[{h.topic}] not exist, apply first please!")
        if not config.perm & PermName.READ:
            return _error(ResponseCode.NO_PERMISSION, f"the topic[{h.topic}] pulling message is forbidden")
        if not 0 <= h.queue_id < config.read_queue_nums:
            return _error(ResponseCode.SYSTEM_ERROR,
                          f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] "
                          f"topicConfig.readQueueNums:[{config.read_queue_nums}] consumer:[{req.peer}]")
        flags = h.sys_flag
        if flags & PullSysFlag.SUBSCRIPTION:
            expression_type, expression = h.expression_type, h.subscription
            # a pull consumer states its subscription here, not in heartbeats: record it (cheap on repeats)
            self.metadata.groups.add_subscription(h.consumer_group, h.topic, h.expression_type, h.subscription,
                                                  h.sub_version)
        else:  # the subscription the group's heartbeats declared
            info = self.clients.group_info(h.consumer_group)
            if info is None:
                return _error(ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's group info not exist")
            if not group.consume_broadcast_enable and info.message_model == int(MessageModel.BROADCASTING):
                return _error(ResponseCode.NO_PERMISSION,
                              f"the consumer group[{h.consumer_group}] can not consume by broadcast way")
            sub = self.clients.subscription(h.consumer_group, h.topic)
            if sub is None:
                return _error(ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist")
            expression_type, expression = sub.expression_type, sub.sub_string
        s = self.settings
        selects = pull_filter(h.topic, expression_type, expression, from_request=bool(flags & PullSysFlag.SUBSCRIPTION),
                              enabled=s.enable_property_filter, subscription_of=self.clients.subscription)
        if isinstance(selects, Refusal):
            return _error(selects.code, selects.remark)
        begin = time.monotonic_ns()
        got = self.store.get_messages(h.topic, h.queue_id, h.queue_offset,
                                      max(1, min(h.max_msg_nums, s.max_transfer_count_on_message_in_memory)),
                                      s.max_transfer_bytes_on_message_in_memory, selects.tags, selects.properties)
        found = got.message_count if got.status == GetStatus.FOUND else 0
        self.stats.on_get(h.consumer_group, h.topic, h.queue_id, found, len(got.body),
                          (time.monotonic_ns() - begin) // 1_000_000)
        if got.status in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE):
            code = ResponseCode.PULL_OFFSET_MOVED if h.queue_offset != 0 else ResponseCode.PULL_NOT_FOUND
        else:
            code = _PULL_CODES.get(got.status, ResponseCode.SYSTEM_ERROR)
        can_suspend = bool(flags & PullSysFlag.SUSPEND) and not req.resumed
        if flags & PullSysFlag.COMMIT_OFFSET and h.commit_offset is not None and h.commit_offset >= 0 \
                and not req.resumed:
            self.metadata.consumer_offsets.commit_offset(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        if code == ResponseCode.PULL_NOT_FOUND and can_suspend:
            timeout = h.suspend_timeout_millis if h.suspend_timeout_millis and h.suspend_timeout_millis > 0 else 15_000
            # short polling: held shortPollingTimeMills, then PULL_NOT_FOUND (a message arriving meanwhile still
            # answers it at once; Apache looks again only when that time is up)
            if not s.long_polling_enable:
                timeout = s.short_polling_time_mills
            return Reply(suspend=(h.topic, h.queue_id, h.queue_offset, timeout))
        ext = {"nextBeginOffset": str(got.next_begin_offset), "minOffset": str(got.min_offset),
               "maxOffset": str(got.max_offset), "suggestWhichBrokerId": "0"}
        if code == ResponseCode.SUCCESS:
            return Reply(code=code, remark=got.status.value, ext=ext, body=got.body)
        return Reply(code=code, remark=got.status.value, ext=ext)

    # ---- offsets ---------------------------------------------------------------------------------------
    def query_consumer_offset(self, req: Request) -> Reply:
        h = QueryConsumerOffsetRequestHeader.from_ext(req.ext)
        check_topic_name(h.topic)  # the min offset is read from the queue directory named after it
        offset = self.metadata.query_consumer_offset(h.consumer_group, h.topic, h.queue_id,
                                                     h.set_zero_if_not_found is not False)
        if offset is None:
            return _error(ResponseCode.QUERY_NOT_FOUND,
                          "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return Reply(ext={"offset": str(offset)})

    def update_consumer_offset(self, req: Request) -> Reply:
        h = UpdateConsumerOffsetRequestHeader.from_ext(req.ext)
        self.metadata.consumer_offsets.commit_offset(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        return Reply()

    def get_max_offset(self, req: Request) -> Reply:
        h = GetMaxOffsetRequestHeader.from_ext(req.ext)
        check_topic_name(h.topic)  # the queue directory is named after it: no "../" reads
        return Reply(ext={"offset": str(self.store.max_offset(h.topic, h.queue_id))})

    def get_min_offset(self, req: Request) -> Reply:
        h = GetMinOffsetRequestHeader.from_ext(req.ext)
        check_topic_name(h.topic)
        return Reply(ext={"offset": str(self.store.min_offset(h.topic, h.queue_id))})

    def get_earliest_msg_storetime(self, req: Request) -> Reply:
        h = GetEarliestMsgStoretimeRequestHeader.from_ext(req.ext)
        check_topic_name(h.topic)
        return Reply(ext={"timestamp": str(self.store.earliest_store_time(h.topic, h.queue_id))})

    def search_offset_by_timestamp(self, req: Request) -> Reply:
        h = SearchOffsetRequestHeader.from_ext(req.ext)
        check_topic_name(h.topic)
        boundary = (h.boundary_type or "lower").lower()
        return Reply(ext={"offset": str(self.store.search_offset_by_time(h.topic, h.queue_id, h.timestamp,
                                                                          boundary))})

    # ---- lookups ---------------------------------------------------------------------------------------
    def view_message_by_id(self, req: Request) -> Reply:
        h = ViewMessageRequestHeader.from_ext(req.ext)
        try:
            data = self.store.read_record_bytes(h.offset)
        except Exception as exc:  # out of range, no record there
            log.info("VIEW_MESSAGE_BY_ID %d from %s: %s", h.offset, req.peer, exc)
            data = b""
        if not data:
            return _error(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {h.offset}")
        return Reply(body=data)

    def query_message(self, req: Request) -> Reply:
        h = QueryMessageRequestHeader.from_ext(req.ext)
        result = self.store.query_by_key(h.topic, h.key, h.max_num or 64, h.begin_timestamp or 0,
                                         h.end_timestamp if h.end_timestamp is not None else (1 << 63) - 1)
        ext = {"indexLastUpdateTimestamp": str(result.index_end_timestamp),
               "indexLastUpdatePhyoffset": str(result.index_end_offset)}
        if not result.physical_offsets:
            return Reply(code=ResponseCode.QUERY_NOT_FOUND, remark="can not find message, maybe time range not correct",
                         ext=ext)
        return Reply(ext=ext, body=result.body)

    # ---- clients ---------------------------------------------------------------------------------------
    def heart_beat(self, req: Request) -> Reply:
        data = HeartbeatData.decode(req.body)
        for consumer in data.consumers:
            group = self.metadata.groups.find(consumer.group_name)
            if group is not None:
                retry = retry_topic(consumer.group_name)
                if self.metadata.topics.get(retry) is None:  # ClientManageProcessor: the group's retry queues
                    self.metadata.topics.create_topic_in_send_back(retry, group.retry_queue_nums)
                    self.on_topics_changed()
                # 5.x's subscriptionDataSet: offline readers see topics a group never committed on.
                # No subscriptions (pull consumers; 5.x withoutSub heartbeats) says nothing: keep what is known.
                if consumer.subscriptions and not data.without_sub:
                    self.metadata.groups.update_subscriptions(
                        consumer.group_name,
                        [(s.topic, s.expression_type, s.sub_string, s.sub_version) for s in consumer.subscriptions])
        notes = self.clients.heartbeat(req.channel, data, req.language, req.version, req.peer)
        return Reply(notify=notes)

    def check_client_config(self, req: Request) -> Reply:
        """CHECK_CLIENT_CONFIG: can this broker serve the subscription (a SQL92 one needs
        enablePropertyFilter and an expression that compiles)? The Java consumer asks when it starts."""
        body = CheckClientRequestBody.decode(req.body)
        refusal = check_client_config(body.subscription_data, self.settings.enable_property_filter)
        if refusal is not None:
            log.info("client %s of %s: %s", body.client_id, body.group, refusal.remark)
            return _error(refusal.code, refusal.remark)
        return Reply()

    def unregister_client(self, req: Request) -> Reply:
        h = UnregisterClientRequestHeader.from_ext(req.ext)
        notes = self.clients.unregister(req.channel, h.producer_group or "", h.consumer_group or "")
        return Reply(notify=notes)

    def get_consumer_list_by_group(self, req: Request) -> Reply:
        h = GetConsumerListByGroupRequestHeader.from_ext(req.ext)
        ids = self.clients.consumer_ids(h.consumer_group)
        if not ids:
            return _error(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {h.consumer_group}")
        return Reply(body=ConsumerIdList(ids).encode())

    def channel_closed(self, channel: object) -> list[Notify]:
        with self._locks_mutex:
            client_ids = {c.client_id for info in self.clients.consumers.values()
                          for ch, c in info.channels.items() if ch == channel}
            for key in [k for k, (cid, _) in self._locks.items() if cid in client_ids]:
                del self._locks[key]
        return self.clients.channel_closed(channel)

    def consumer_send_msg_back(self, req: Request) -> Reply:
        h = ConsumerSendMsgBackRequestHeader.from_ext(req.ext)
        max_times = h.max_reconsume_times if req.version >= V3_4_9 else None
        result = consumer_send_back(self.store, self.metadata, h.group, h.offset, h.delay_level or 0, max_times)
        count_send_back(self, h.group, h.origin_topic, result)
        if result.ok:
            self.on_topics_changed()
            return Reply()
        if result.status == "SUBSCRIPTION_GROUP_NOT_EXIST":
            return _error(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {h.group}")
        if result.status == "MESSAGE_NOT_FOUND":
            return _error(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {h.offset}")
        return _error(ResponseCode.SYSTEM_ERROR, result.status)  # a put status name, as Apache

    def lock_batch_mq(self, req: Request) -> Reply:
        body = LockBatchRequestBody.decode(req.body)
        now = time.monotonic()
        granted = []
        with self._locks_mutex:
            for mq in body.mq_set:
                key = (body.consumer_group, mq)
                holder = self._locks.get(key)
                if holder is None or holder[0] == body.client_id or now - holder[1] > LOCK_MAX_LIVE_S:
                    self._locks[key] = (body.client_id, now)
                    granted.append(mq)
        return Reply(body=LockBatchResponseBody(granted).encode())

    def unlock_batch_mq(self, req: Request) -> Reply:
        body = LockBatchRequestBody.decode(req.body)
        with self._locks_mutex:
            for mq in body.mq_set:
                key = (body.consumer_group, mq)
                if self._locks.get(key, ("",))[0] == body.client_id:
                    del self._locks[key]
        return Reply()

    # ---- admin -----------------------------------------------------------------------------------------
    def update_and_create_topic(self, req: Request) -> Reply:
        h = CreateTopicRequestHeader.from_ext(req.ext)
        check_topic_name(h.topic)
        for name, value in (("readQueueNums", h.read_queue_nums), ("writeQueueNums", h.write_queue_nums)):
            if not 0 <= value <= MAX_QUEUE_NUMS:
                return _error(ResponseCode.INVALID_PARAMETER, f"{name} {value} is outside 0..{MAX_QUEUE_NUMS}")
        if h.topic == DEFAULT_TOPIC or h.topic == self.cluster_name:
            return _error(ResponseCode.SYSTEM_ERROR, f"the topic[{h.topic}] is conflict with system reserved words.")
        self.metadata.topics.put(TopicConfig(h.topic, read_queue_nums=h.read_queue_nums,
                                             write_queue_nums=h.write_queue_nums, perm=h.perm,
                                             topic_filter_type=h.topic_filter_type or "SINGLE_TAG",
                                             topic_sys_flag=h.topic_sys_flag or 0, order=bool(h.order)))
        self.metadata.persist(force=True)
        self.on_topics_changed()
        return Reply()

    def get_all_topic_config(self, req: Request) -> Reply:
        with self.metadata.topics.lock:  # other request threads change the table meanwhile
            body = dumps_json(self.metadata.topics.table.to_json())
        return Reply(body=body)

    def update_and_create_subscription_group(self, req: Request) -> Reply:
        # a malformed body is the client's error (SYSTEM_ERROR with the reason), not a broker traceback
        data = loads_lenient(req.body, "subscription group config")
        if not isinstance(data, dict) or not isinstance(data.get("groupName"), str) or not data["groupName"]:
            raise BodyError("subscription group config needs an object with a non-empty string groupName")
        try:
            config = SubscriptionGroupConfig.from_json(data)
        except ConfigFileError as exc:
            raise BodyError(f"subscription group config: {exc}") from None
        self.metadata.groups.put(config)
        self.metadata.persist(force=True)
        return Reply()

    def get_all_subscription_group_config(self, req: Request) -> Reply:
        with self.metadata.groups.lock:  # other request threads change the table meanwhile
            body = dumps_json(self.metadata.groups.table.to_json())
        return Reply(body=body)

    def get_all_consumer_offset(self, req: Request) -> Reply:
        with self.metadata.consumer_offsets.lock:  # other request threads change the table meanwhile
            body = dumps_json(self.metadata.consumer_offsets.table.to_json())
        return Reply(body=body)

    def get_all_delay_offset(self, req: Request) -> Reply:
        with self.metadata.delay_offsets.lock:  # other request threads change the table meanwhile
            body = dumps_json(self.metadata.delay_offsets.table.to_json())
        return Reply(body=body)

    def _last_store_time(self, topic: str, qid: int, offset: int) -> int:
        """Store time of the message before queue ``offset`` (Apache's getMessageStoreTimeStamp of
        ``offset - 1``), 0 when there is none."""
        return max(self.store.store_time_at(topic, qid, offset - 1), 0) if offset > 0 else 0

    def get_topic_stats_info(self, req: Request) -> Reply:
        h = GetTopicStatsInfoRequestHeader.from_ext(req.ext)
        config = self.metadata.topics.get(h.topic)
        if config is None:
            return _error(ResponseCode.TOPIC_NOT_EXIST, f"topic[{h.topic}] not exist")
        table = {}
        for qid in range(max(config.read_queue_nums, config.write_queue_nums)):
            hi = self.store.max_offset(h.topic, qid)
            table[MessageQueue(h.topic, self.broker_name, qid)] = TopicOffset(
                self.store.min_offset(h.topic, qid), hi, self._last_store_time(h.topic, qid, hi))
        return Reply(body=TopicStatsTable(table).encode())

    def get_consume_stats(self, req: Request) -> Reply:
        """Consumer progress per queue (mqadmin consumerProgress): broker, consumer and pull offsets."""
        h = GetConsumeStatsRequestHeader.from_ext(req.ext)
        group = h.consumer_group
        with self.metadata.consumer_offsets.lock:
            topics = [h.topic] if h.topic else sorted(self.metadata.consumer_offsets.table.topics_of(group))
        table = {}
        for topic in topics:
            config = self.metadata.topics.get(topic)
            if config is None:
                continue
            committed = self.metadata.consumer_offsets.offsets_for(group, topic)
            for qid in range(config.read_queue_nums):
                consumer = max(committed.get(qid, 0), 0)
                table[MessageQueue(topic, self.broker_name, qid)] = OffsetWrapper(
                    broker_offset=self.store.max_offset(topic, qid), consumer_offset=consumer,
                    pull_offset=consumer, last_timestamp=self._last_store_time(topic, qid, consumer))
        return Reply(body=ConsumeStats(table).encode())



