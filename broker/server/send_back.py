"""CONSUMER_SEND_MSG_BACK's policy: where a message a consumer gave up on goes next.

Apache keeps this in the request layer (``SendMessageProcessor.consumerSendMsgBack``), not in the
store: the store only reads the original and appends the copy. Retry (``%RETRY%<group>``, delayed
through ``SCHEDULE_TOPIC_XXXX``) below the group's limit, dead letter (``%DLQ%<group>``) at it.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from broker.engine.message_store import MessageStore, PutResult
from broker.server.metadata import BrokerMetadata
from broker.store.constants import PROPERTY_DELAY, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC
from broker.store.message import MessageRecord, RecordError
from broker.store.properties import encode_properties
from broker.store.topics import DLQ_NUMS_PER_GROUP, dlq_topic, retry_topic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SendBackResult:
    """CONSUMER_SEND_MSG_BACK: ``status`` is ``"OK"`` (also when dropped because the group has no
    retry queues), ``"SUBSCRIPTION_GROUP_NOT_EXIST"``, ``"MESSAGE_NOT_FOUND"`` or a put status name."""

    status: str
    put: PutResult | None = None

    @property
    def ok(self) -> bool:
        return self.status == "OK"


def consumer_send_back(store: MessageStore, metadata: BrokerMetadata, group: str, phy_offset: int, delay_level: int = 0,
                       max_reconsume_times: int | None = None) -> SendBackResult:
    """CONSUMER_SEND_MSG_BACK (remoting-protocol.md 9.4, store-format.md 3.9).

    The original (looked up by commitlog offset) is re-stored with the same body, flag, sysFlag
    and born fields, ``reconsumeTimes + 1``, ``RETRY_TOPIC`` (original topic, if absent) and
    ``ORIGIN_MESSAGE_ID`` (the original's offsetMsgId, if absent). Below the limit
    (``max_reconsume_times``, else the group's ``retryMaxTimes``) it goes to ``%RETRY%<group>``
    with ``DELAY`` = ``delay_level`` or ``3 + reconsumeTimes`` when 0, so it waits in
    ``SCHEDULE_TOPIC_XXXX`` first; at the limit or with ``delay_level < 0`` it goes to
    ``%DLQ%<group>`` queue 0 with ``DELAY=0`` left in its properties. Missing retry/DLQ topic
    configs are created (1 queue, perm 6) in ``metadata``'s topic table."""
    sub = metadata.groups.find(group)
    if sub is None:
        return SendBackResult("SUBSCRIPTION_GROUP_NOT_EXIST")
    if sub.retry_queue_nums <= 0:
        return SendBackResult("OK")
    try:
        orig = store.view_message(phy_offset)
    except RecordError as exc:
        log.warning("send-back of %s: look message by offset %d failed: %s", group, phy_offset, exc)
        return SendBackResult("MESSAGE_NOT_FOUND")
    props = orig.properties
    props.setdefault(PROPERTY_RETRY_TOPIC, orig.topic)
    limit = sub.retry_max_times if max_reconsume_times is None else max_reconsume_times
    if orig.reconsume_times >= limit or delay_level < 0:
        topic = dlq_topic(group)
        queue_id = random.randrange(99_999_999) % DLQ_NUMS_PER_GROUP
        metadata.topics.create_topic_in_send_back(topic, DLQ_NUMS_PER_GROUP)
        props[PROPERTY_DELAY] = "0"
    else:
        topic = retry_topic(group)
        queue_id = random.randrange(99_999_999) % sub.retry_queue_nums
        metadata.topics.create_topic_in_send_back(topic, sub.retry_queue_nums)
        props[PROPERTY_DELAY] = str(delay_level if delay_level > 0 else 3 + orig.reconsume_times)
    if not props.get(PROPERTY_ORIGIN_MESSAGE_ID, "").strip():
        props[PROPERTY_ORIGIN_MESSAGE_ID] = orig.offset_msg_id
    retry = MessageRecord(topic=topic, body=orig.body, properties_raw=encode_properties(props),
                          queue_id=queue_id, flag=orig.flag, sys_flag=orig.sys_flag,
                          born_timestamp=orig.born_timestamp, born_host=orig.born_host,
                          reconsume_times=orig.reconsume_times + 1)
    put = store.put_message(retry)
    return SendBackResult("OK" if put.ok else put.status.value, put)
