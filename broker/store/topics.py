"""Special topics and how a stored record maps back to the topic a user sent to.

One place for ``%RETRY%``/``%DLQ%`` naming, the delay topic's queue ids and ``REAL_TOPIC``/``REAL_QID``
resolution, so the broker, the inspector and the Spark jobs agree.
"""

from __future__ import annotations

from broker.store.constants import (
    MAX_TOPIC_LENGTH,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    TOPIC_NAME_PATTERN,
)

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TRANS_CHECK_MAX_TIME_QUEUE_NUMS = 1  # DefaultTransactionalMessageCheckListener.TCMT_QUEUE_NUMS
# MixAll.CID_SYS_RMQ_TRANS: the group whose consumer offsets on the half and op queues are the
# transaction check's progress (config/consumerOffset.json), so a restarted broker resumes there
TRANS_CHECK_CONSUMER_GROUP = "CID_RMQ_SYS_TRANS"
TRANS_OP_REMOVE_TAG = "d"  # TransactionalMessageUtil.REMOVETAG: the tag of every op record
DLQ_NUMS_PER_GROUP = 1
DEFAULT_TOPIC = "TBW102"  # TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC: the template of auto-created topics
DEFAULT_TOPIC_QUEUE_NUMS = 8  # defaultTopicQueueNums: the queues of DEFAULT_TOPIC when a broker first creates it

# Topics whose records stand in for another topic named by REAL_TOPIC/REAL_QID.
WRAPPER_TOPICS = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC})

# Names a fresh Apache broker creates or reserves (TopicValidator / TopicConfigManager).
SYSTEM_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        DEFAULT_TOPIC,
        "BenchmarkTest",
        "RMQ_SYS_TRACE_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
SYSTEM_TOPIC_PREFIX = "rmq_sys_"


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def consumer_group_of(topic: str) -> str | None:
    """The group of a ``%RETRY%``/``%DLQ%`` topic (5.x POP retry suffixes ``_topic``/``+topic`` kept)."""
    for prefix in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX):
        if topic.startswith(prefix):
            return topic[len(prefix) :]
    return None


def delay_level_to_queue_id(level: int) -> int:
    """SCHEDULE_TOPIC_XXXX queue id of a delay level (1-based)."""
    return level - 1


def queue_id_to_delay_level(queue_id: int) -> int:
    return queue_id + 1


def real_topic(topic: str, properties: dict[str, str]) -> str:
    """The topic a user sent to: REAL_TOPIC for delayed and half messages, else the stored topic."""
    if topic in WRAPPER_TOPICS:
        return properties.get(PROPERTY_REAL_TOPIC) or topic
    return topic


def real_queue_id(topic: str, queue_id: int, properties: dict[str, str]) -> int:
    if topic in WRAPPER_TOPICS:
        qid = properties.get(PROPERTY_REAL_QID)
        if qid is not None and qid.lstrip("-").isdigit():
            return int(qid)
    return queue_id


class InvalidTopicError(ValueError):
    pass


def validate_topic(topic: str) -> None:
    """Apache's TopicValidator rule; also guarantees a topic can never escape the store directory."""
    if not topic:
        raise InvalidTopicError("topic is empty")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(f"topic is {len(topic)} chars, the limit is {MAX_TOPIC_LENGTH}")
    if not TOPIC_NAME_PATTERN.fullmatch(topic):  # not match(): "$" also matches before a final "\n"
        raise InvalidTopicError(f"topic {topic!r} has characters outside [%|a-zA-Z0-9_-]")
