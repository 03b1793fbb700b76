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
    MESSAGE_MAGIC_CODE_V1,
    MESSAGE_MAGIC_CODE_V2,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
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
from broker.store.message import encode_record
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


# SendMessageRequestHeader's fields in declaration order, and their wire names: long (SEND_MESSAGE)
# and V2 letters, from its declaration
_FIELDS = tuple(name for name, _, _, _ in SendMessageRequestHeader._wire_fields("wire"))
_WIRE = {v2: tuple(wire for _, wire, _, _ in SendMessageRequestHeader._wire_fields("v2" if v2 else "wire"))
         for v2 in (False, True)}
assert _FIELDS == ("producer_group", "topic", "default_topic", "default_topic_queue_nums", "queue_id", "sys_flag",
                   "born_timestamp", "flag", "properties", "reconsume_times", "unit_mode", "max_reconsume_times",
                   "batch", "broker_name"), "the straight-line parse below follows this order"

_FLAGS = {None: None, "false": False, "true": True}  # what the straight-line parse takes of a bool field


def _uint(raw: object) -> int:
    """A decimal number short enough for an int field (at most 9 digits), else -1."""
    if type(raw) is str and raw.isdigit() and raw.isascii() and len(raw) <= 9:
        return int(raw)
    return -1


def _plain_send_fields(ext: dict[str, str], v2: bool) -> tuple | None:
    """The values of ``SendMessageRequestHeader.from_ext(ext, v2=v2)``, in its field order, for the
    header every producer sends — str values, unsigned decimal numbers short enough to fit their
    type, ``true``/``false`` flags — as straight-line code; None for anything else (the generic
    parser then decides, errors included). A tuple, not a header object: it runs once per send."""
    (k_group, k_topic, k_default, k_nums, k_queue, k_sys, k_born, k_flag, k_props, k_reconsume, k_unit, k_max,
     k_batch, k_broker) = _WIRE[v2]
    get = ext.get
    group, topic, default_topic = get(k_group), get(k_topic), get(k_default)
    properties, broker_name = get(k_props), get(k_broker)
    if type(group) is not str or type(topic) is not str or type(default_topic) is not str \
            or (properties is not None and type(properties) is not str) \
            or (broker_name is not None and type(broker_name) is not str):
        return None
    nums, queue_id, sys_flag, flag = _uint(get(k_nums)), _uint(get(k_queue)), _uint(get(k_sys)), _uint(get(k_flag))
    if nums < 0 or queue_id < 0 or sys_flag < 0 or flag < 0:
        return None
    raw = get(k_reconsume)
    reconsume = None if raw is None else _uint(raw)
    raw = get(k_max)
    max_reconsume = None if raw is None else _uint(raw)
    if reconsume == -1 or max_reconsume == -1:
        return None
    born = get(k_born)
    if not (type(born) is str and born.isdigit() and born.isascii() and len(born) <= 18):  # fits a long
        return None
    try:
        unit, batch = _FLAGS[get(k_unit)], _FLAGS[get(k_batch)]
    except (KeyError, TypeError):  # any other text (or value) of a flag
        return None
    return (group, topic, default_topic, nums, queue_id, sys_flag, int(born), flag, properties, reconsume, unit,
            max_reconsume, batch, broker_name)


def _plain_send_header(ext: dict[str, str], v2: bool) -> SendMessageRequestHeader | None:
    """``SendMessageRequestHeader.from_ext(ext, v2=v2)`` for the header every producer sends, None
    for anything else (:func:`_plain_send_fields` as a header object)."""
    values = _plain_send_fields(ext, v2)
    return None if values is None else SendMessageRequestHeader(**dict(zip(_FIELDS, values)))


@functools.lru_cache(maxsize=4096)
def _draftable_topic(topic: str) -> tuple[bytes, int] | None:
    """``(UTF-8 name, magic code)`` of a topic a plain send may be drafted for; None when the
    name is refused, a retry topic or one no client may write (the full way answers those).
    Cached with :func:`topic_name_refusal`'s bound: every send asks, and a broker sees few topics."""
    if topic_name_refusal(topic) is not None or is_retry_topic(topic) or topic in NOT_ALLOWED_SEND_TOPICS:
        return None
    name = topic.encode("utf-8")
    return name, MESSAGE_MAGIC_CODE_V2 if len(name) > 127 else MESSAGE_MAGIC_CODE_V1


def _join_properties(props: dict[str, str]) -> str:
    """``encode_properties(props)`` for a map whose values are all str (decoded, or set here)."""
    return PROPERTY_SEPARATOR.join(map(NAME_VALUE_SEPARATOR.join, props.items()))


class SendDrafter:
    """Drafts plain sends in the process that decoded them (see the module's docstring)."""

    def __init__(self, cluster_name: str, store_host: Host, max_message_size: int) -> None:
        self.cluster_name = cluster_name
        self.store_host = store_host
        self.max_message_size = max_message_size
        self._uniq = UniqKeyGenerator(ip=store_host.address if len(store_host.address) == 4 else None)

    def draft(self, code: int, ext: dict[str, str], body: bytes, peer: str, channel: object) -> SendDraft | None:
        """The draft of a plain send, or None: the request goes the full way (not plain, or refused)."""
        if code == RequestCode.SEND_MESSAGE_V2:
            v2 = True
        elif code == RequestCode.SEND_MESSAGE:
            v2 = False
        else:
            return None
        h = _plain_send_fields(ext, v2)
        if h is None:
            try:
                parsed = SendMessageRequestHeader.from_ext(ext, v2=v2)
            except Exception:  # the full way answers it, with the usual remark
                return None
            h = tuple(getattr(parsed, name) for name in _FIELDS)
        (_, topic, default_topic, nums, queue_id, sys_flag, born_timestamp, flag, properties, reconsume_times, _, _,
         batch, _) = h
        if len(topic) > RETRY_TOPIC_MAX_LENGTH:  # refused: not cached (see topic_name_refusal)
            return None
        drafted_topic = _draftable_topic(topic)
        if drafted_topic is None or batch or len(body) > self.max_message_size:
            return None
        props = decode_properties(properties or "")
        if PROPERTY_DELAY in props or PROPERTY_CRC32 in props or PROPERTY_TRAN_MSG in props:
            return None
        wait = waits_for_store(props)
        # send_properties, with the map joined directly (every value is a str here)
        props.pop(PROPERTY_WAIT, None)
        uniq_key = props.get(PROPERTY_UNIQ_KEY)
        if uniq_key is None:
            uniq_key = props[PROPERTY_UNIQ_KEY] = self._uniq.next()
        props[PROPERTY_CLUSTER] = self.cluster_name
        try:
            raw = _join_properties(props).encode("utf-8")
            data = encode_record(drafted_topic[0], body, raw, 0, flag, 0, 0, sys_flag, born_timestamp,
                                 peer_host(peer), 0, self.store_host, reconsume_times or 0, 0, None,
                                 drafted_topic[1])
        except ValueError:  # properties over the limit, text that is not UTF-8: the full way refuses it
            return None
        return SendDraft(code, topic, queue_id, default_topic, nums, uniq_key, len(body), data, peer, channel, wait)
