"""Admin requests that change or remove broker metadata, as Apache 4.9.x's ``AdminBrokerProcessor``:

* DELETE_TOPIC_IN_BROKER (215): the topic's config (``topics.json`` written at once), every group's
  offsets on it (``cleanOffsetByTopic``) and its consume queues (``MessageStore.delete_topic_queues``,
  which coordinates with the dispatcher process). The commitlog and the index are left as they are;
  so are the retry and DLQ topics of any group. System topics are refused. The name servers learn it
  from the next registration, which is triggered at once (``on_topics_changed``).
* DELETE_SUBSCRIPTIONGROUP (207): the group's config (``subscriptionGroup.json``), and with
  ``cleanOffset`` its offsets on every topic (``removeOffset``).
* CLONE_GROUP_OFFSET (314): ``cloneOffset`` from ``srcGroup`` to ``destGroup`` per topic.

Deleting something that does not exist is a success, as in Apache. The handlers run in the store
process under ``BrokerCore``'s guard, so a bad header becomes a SYSTEM_ERROR reply, never a crash.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.headers import (
    CloneGroupOffsetRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    DeleteTopicRequestHeader,
)
from broker.server.send_draft import TopicRefused, check_topic_name
from broker.store.topics import SYSTEM_TOPIC_PREFIX, SYSTEM_TOPICS

if TYPE_CHECKING:
    from broker.server.processors import BrokerCore, Reply, Request

log = logging.getLogger(__name__)



def _reply(code: int = ResponseCode.SUCCESS, remark: str | None = None) -> Reply:
    from broker.server.processors import Reply  # processors imports this module

    return Reply(code=code, remark=remark)


def topic_refusal(topic: str) -> str | None:
    """Why DELETE_TOPIC_IN_BROKER refuses ``topic`` (``TopicValidator.validateTopic`` and
    ``isSystemTopic`` remarks), None when it may be deleted."""
    try:
        check_topic_name(topic)
    except TopicRefused as exc:
        return str(exc)
    if topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX):
        return f"The topic[{topic}] is conflict with system topic."
    return None


def delete_topic(core: BrokerCore, req: Request) -> Reply:
    h = DeleteTopicRequestHeader.from_ext(req.ext)
    refusal = topic_refusal(h.topic)
    if refusal is not None:
        return _reply(ResponseCode.SYSTEM_ERROR, refusal)
    log.info("deleteTopic %s called by %s", h.topic, req.peer)
    metadata = core.metadata
    existed = metadata.topics.delete(h.topic)
    groups = metadata.consumer_offsets.clean_offset_by_topic(h.topic)
    metadata.consumer_offsets.persist()
    try:
        core.store.delete_topic_queues(h.topic)
    finally:
        if existed:
            core.on_topics_changed()  # register now: the name servers drop the topic from this broker's routes
    log.info("deleted topic %s (config %s, offsets of %d group(s))", h.topic, "removed" if existed else "absent",
             groups)
    return _reply()


def delete_subscription_group(core: BrokerCore, req: Request) -> Reply:
    h = DeleteSubscriptionGroupRequestHeader.from_ext(req.ext)
    log.info("deleteSubscriptionGroup %s (cleanOffset=%s) called by %s", h.group_name, h.clean_offset, req.peer)
    core.metadata.groups.delete(h.group_name)
    if h.clean_offset:
        topics = core.metadata.consumer_offsets.remove_offset(h.group_name)
        core.metadata.consumer_offsets.persist()
        log.info("removed the offsets of group %s on %d topic(s)", h.group_name, topics)
    return _reply()


def clone_group_offset(core: BrokerCore, req: Request) -> Reply:
    """Per topic (the header's, or every topic the source group has offsets on when it is blank):
    skipped when the topic has no config, or, unless ``offline``, when the source group is online
    with subscriptions that do not include the topic; otherwise ``cloneOffset``.

    Apache 4.9's loop passes the header's topic to ``cloneOffset`` even when it is blank (so a blank
    topic clones nothing); here each of the source group's topics is cloned, which is what the loop
    is for. ``mqadmin cloneGroupOffset`` always sends a topic, where both agree."""
    h = CloneGroupOffsetRequestHeader.from_ext(req.ext)
    metadata = core.metadata
    topics = [h.topic] if h.topic and h.topic.strip() else metadata.consumer_offsets.topics_of(h.src_group)
    online = core.clients.group_info(h.src_group)
    cloned = []
    for topic in topics:
        if metadata.topics.get(topic) is None:
            log.warning("[cloneGroupOffset], topic config not exist, %s", topic)
            continue
        if not h.offline and online is not None and online.subscriptions and topic not in online.subscriptions:
            log.warning("[cloneGroupOffset], the consumer group[%s], topic[%s] not exist", h.src_group, topic)
            continue
        if metadata.consumer_offsets.clone_offset(h.src_group, h.dest_group, topic):
            cloned.append(topic)
    if cloned:
        metadata.consumer_offsets.persist()
    log.info("cloned offsets of %s to %s on %s", h.src_group, h.dest_group, ", ".join(cloned) or "no topic")
    return _reply()


def metadata_handlers(core: BrokerCore) -> dict[int, Callable[[Request], Reply]]:
    """The handlers of this module bound to ``core``, keyed by request code (for ``BrokerCore``)."""
    table: dict[int, Callable[[BrokerCore, Request], Reply]] = {
        RequestCode.DELETE_TOPIC_IN_BROKER: delete_topic,
        RequestCode.DELETE_SUBSCRIPTIONGROUP: delete_subscription_group,
        RequestCode.CLONE_GROUP_OFFSET: clone_group_offset,
    }
    return {code: (lambda req, fn=fn: fn(core, req)) for code, fn in table.items()}
