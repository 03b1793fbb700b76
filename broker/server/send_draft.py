"""The stateless half of a send: the rules that need no broker state, and the record built from them.

A SEND_MESSAGE(_V2) is checked in two halves. This half needs only the request and fixed settings
(cluster name, store host, size limit): the header, the topic name (``TopicValidator``), the topics
no client may write, the body and properties sizes, the properties the broker adds (``UNIQ_KEY``
when missing, ``CLUSTER``; ``WAIT`` dropped), the born host. The other half needs the broker's
state — the topic's config and permission, the queue, the retry group — and the store's counters.

Why a separate module: the network process that decoded a plain send runs this half itself and
hands the store process a :class:`SendDraft` whose record is already encoded, so the store process
(one thread for every send) only picks the queue and writes QUEUEID, the offsets and the store time
into the bytes (:meth:`~broker.store.commitlog.CommitLogWriter.append_encoded`). The request
processors use the same functions for every send, so each rule is written once.

A send is drafted only when nothing in the second half can change its record: not a batch, not a
retry topic (it may become the DLQ), no ``DELAY`` (the store moves it to the schedule topic), no
``TRAN_MSG`` (a half message is stored in the half topic), no 5.2+ property CRC (it covers the
store's fields). Anything else, and every refusal, goes the full
way as a :class:`~broker.server.processors.Request`, so refusals are answered in one place.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from broker.remoting.codes import RequestCode
from broker.remoting.headers import SendMessageRequestHeader
from broker.store.constants import (
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH,
    PROPERTY_CLUSTER,
    PROPERTY_CRC32,
    PROPERTY_DELAY,
    PROPERTY_TRAN_MSG,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT,
    TOPIC_NAME_PATTERN,
)
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from broker.store.message_id import UniqKeyGenerator
from broker.store.properties import decode_properties, encode_properties
from broker.store.topics import (
    DLQ_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    InvalidTopicError,
    is_retry_topic,
)

RETRY_TOPIC_MAX_LENGTH = 255
# TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET: only the broker itself writes these
NOT_ALLOWED_SEND_TOPICS = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC,
                                     "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})
DRAFTED_CODES = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2})


class TopicRefused(InvalidTopicError):
    """A topic name ``TopicValidator.validateTopic`` refuses; the message is Apache's remark."""


def check_topic_name(topic: str) -> None:
    """``TopicValidator.validateTopic`` with its remarks (blank, then characters, then length); the
    names also become queue directory names, so this keeps every read and write inside the store.
    Retry and DLQ topics carry a group name and may be 255 characters long."""
    remark = topic_name_refusal(topic)
    if remark is not None:
        raise TopicRefused(remark)


def topic_name_refusal(topic: str) -> str | None:
    """Apache's remark refusing ``topic`` as a name, or None. Cached: every send checks its topic,
    and a broker sees few topics (the pattern match cost microseconds per message); only names of a
    length that can pass are kept, so a client cannot fill the cache with huge strings."""
    if len(topic) > RETRY_TOPIC_MAX_LENGTH:
        return _topic_name_refusal(topic)
    return _cached_topic_name_refusal(topic)


def _topic_name_refusal(topic: str) -> str | None:
    limit = RETRY_TOPIC_MAX_LENGTH if is_retry_topic(topic) or topic.startswith(DLQ_GROUP_TOPIC_PREFIX) \
        else MAX_TOPIC_LENGTH
    if not topic.strip():
        return "The specified topic is blank."
    if not TOPIC_NAME_PATTERN.fullmatch(topic):
        return "The specified topic contains illegal characters, allowing only " + TOPIC_NAME_PATTERN.pattern
    if len(topic) > limit:
        return "The specified topic is longer than topic max length."
    return None


_cached_topic_name_refusal = functools.lru_cache(maxsize=4096)(_topic_name_refusal)


@functools.lru_cache(maxsize=4096)
def peer_host(peer: str) -> Host:
    """Born host from the TCP peer; anything unparsable becomes 0.0.0.0:0 (never an error).
    Cached: a producer sends many messages over one connection, and parsing costs microseconds."""
    try:
        return Host.parse(peer)
    except (ValueError, TypeError):
        return Host(bytes(4), 0)


def waits_for_store(props: dict[str, str]) -> bool:
    """``Message.isWaitStoreMsgOK``: true unless ``WAIT`` is ``false`` (read before the broker drops it)."""
    return props.get(PROPERTY_WAIT) != "false"


def send_properties(props: dict[str, str], uniq: UniqKeyGenerator, cluster_name: str) -> str:
    """The properties a single message is stored with: ``WAIT`` dropped, a ``UNIQ_KEY`` when the
    client sent none (5.x brokers do this: ids stay stable), the broker's ``CLUSTER``. Changes
    ``props`` in place and returns its stored text."""
    props.pop(PROPERTY_WAIT, None)
    if PROPERTY_UNIQ_KEY not in props:
        props[PROPERTY_UNIQ_KEY] = uniq.next()
    props[PROPERTY_CLUSTER] = cluster_name
    return encode_properties(props)


def properties_too_long(raw: str) -> bool:
    """Over the 32 KiB of properties a record may carry (a str of up to a quarter of that cannot be)."""
    return len(raw) > MAX_PROPERTIES_LENGTH // 4 and len(raw.encode("utf-8")) > MAX_PROPERTIES_LENGTH


@dataclass(slots=True)
class SendDraft:
    """A plain send whose record the network process encoded (``data``: queue id, queue offset,
    physical offset and store time still 0). ``queue_id`` is the requested queue (< 0: any)."""

    code: int
    topic: str
    queue_id: int
    default_topic: str | None
    default_topic_queue_nums: int | None
    uniq_key: str
    body_size: int
    data: bytes
    peer: str
    channel: object = None
    wait: bool = True  # WAIT (isWaitStoreMsgOK): a SYNC_MASTER acknowledges it only once a slave has it

    def __reduce__(self):
        # crosses the process link once per message: a tuple pickles in half the time of a dataclass
        return SendDraft, (self.code, self.topic, self.queue_id, self.default_topic, self.default_topic_queue_nums,
                           self.uniq_key, self.body_size, self.data, self.peer, self.channel, self.wait)


# the wire names of SendMessageRequestHeader's fields, long (SEND_MESSAGE) and V2 letters, from its declaration
_WIRE = {v2: {name: wire for name, wire, _, _ in SendMessageRequestHeader._wire_fields("v2" if v2 else "wire")}
         for v2 in (False, True)}
_INT_FIELDS = ("default_topic_queue_nums", "queue_id", "sys_flag", "flag", "reconsume_times", "max_reconsume_times")


def _plain_send_header(ext: dict[str, str], v2: bool) -> SendMessageRequestHeader | None:
    """``SendMessageRequestHeader.from_ext(ext, v2=v2)`` for the header every producer sends —
    str values, unsigned decimal numbers short enough to fit their type, ``true``/``false`` flags —
    as straight-line code; None for anything else (the generic parser then decides, errors included)."""
    w = _WIRE[v2]
    group, topic, default_topic = ext.get(w["producer_group"]), ext.get(w["topic"]), ext.get(w["default_topic"])
    properties, broker_name = ext.get(w["properties"]), ext.get(w["broker_name"])
    if type(group) is not str or type(topic) is not str or type(default_topic) is not str \
            or (properties is not None and type(properties) is not str) \
            or (broker_name is not None and type(broker_name) is not str):
        return None
    ints: dict[str, int | None] = {}
    for name in _INT_FIELDS:
        raw = ext.get(w[name])
        if raw is None and name in ("reconsume_times", "max_reconsume_times"):
            ints[name] = None
        elif type(raw) is str and 0 < len(raw) <= 9 and raw.isdigit() and raw.isascii():  # fits an int
            ints[name] = int(raw)
        else:
            return None
    born = ext.get(w["born_timestamp"])
    if not (type(born) is str and 0 < len(born) <= 18 and born.isdigit() and born.isascii()):  # fits a long
        return None
    flags: dict[str, bool | None] = {}
    for name in ("unit_mode", "batch"):
        raw = ext.get(w[name])
        if raw is None or raw == "false":
            flags[name] = None if raw is None else False
        elif raw == "true":
            flags[name] = True
        else:
            return None
    return SendMessageRequestHeader(
        producer_group=group, topic=topic, default_topic=default_topic,
        default_topic_queue_nums=ints["default_topic_queue_nums"], queue_id=ints["queue_id"],
        sys_flag=ints["sys_flag"], born_timestamp=int(born), flag=ints["flag"], properties=properties,
        reconsume_times=ints["reconsume_times"], unit_mode=flags["unit_mode"],
        max_reconsume_times=ints["max_reconsume_times"], batch=flags["batch"], broker_name=broker_name)


class SendDrafter:
    """Drafts plain sends in the process that decoded them (see the module's docstring)."""

    def __init__(self, cluster_name: str, store_host: Host, max_message_size: int) -> None:
        self.cluster_name = cluster_name
        self.store_host = store_host
        self.max_message_size = max_message_size
        self._uniq = UniqKeyGenerator(ip=store_host.address if len(store_host.address) == 4 else None)

    def draft(self, code: int, ext: dict[str, str], body: bytes, peer: str, channel: object) -> SendDraft | None:
        """The draft of a plain send, or None: the request goes the full way (not plain, or refused)."""
        if code not in DRAFTED_CODES:
            return None
        v2 = code == RequestCode.SEND_MESSAGE_V2
        h = _plain_send_header(ext, v2)
        if h is None:
            try:
                h = SendMessageRequestHeader.from_ext(ext, v2=v2)
            except Exception:  # the full way answers it, with the usual remark
                return None
        if topic_name_refusal(h.topic) is not None:
            return None
        if h.batch or is_retry_topic(h.topic) or h.topic in NOT_ALLOWED_SEND_TOPICS \
                or len(body) > self.max_message_size:
            return None
        props = decode_properties(h.properties or "")
        if PROPERTY_DELAY in props or PROPERTY_CRC32 in props or PROPERTY_TRAN_MSG in props:
            return None
        wait = waits_for_store(props)
        raw = send_properties(props, self._uniq, self.cluster_name)
        if properties_too_long(raw):
            return None
        record = MessageRecord(topic=h.topic, body=body, properties_raw=raw, flag=h.flag, sys_flag=h.sys_flag,
                               born_timestamp=h.born_timestamp, born_host=peer_host(peer),
                               store_host=self.store_host, reconsume_times=h.reconsume_times or 0)
        try:
            data = record.encode()
        except ValueError:
            return None
        return SendDraft(code, h.topic, h.queue_id, h.default_topic, h.default_topic_queue_nums,
                         props[PROPERTY_UNIQ_KEY], len(body), data, peer, channel, wait)
