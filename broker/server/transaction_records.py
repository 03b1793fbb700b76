"""The records of a transactional message, built as Apache RocketMQ 4.9 builds them.

One place for every record the transaction feature writes, so the send path, END_TRANSACTION and
the check service agree byte for byte (and tests can compare them with the 4.9.8 golden store):

* the **half** (``TransactionalMessageBridge.parseHalfMessageInner``): the sent message moved to
  ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, its topic and queue kept in ``REAL_TOPIC``/``REAL_QID``, its
  sysFlag's transaction bits reset to NOT (so the half *is* queued, in the half topic, and no consumer
  of the real topic can see it);
* the **committed** message (``EndTransactionProcessor.endMessageTransaction``): the half's body and
  born fields back in the real topic and queue, transaction type COMMIT, PREPAREDTRANSACTIONOFFSET =
  the half's commitlog offset. Apache builds the properties text *before* it clears ``REAL_TOPIC``,
  ``REAL_QID`` and ``TRAN_MSG`` from the map, so all three stay on disk;
* the **op** record (``addRemoveTagInTransactionOp``/``makeOpMessageInner``): ``RMQ_SYS_TRANS_OP_HALF_TOPIC``
  in the half's queue id, tag ``d``, body = the half's queue offset in decimal, born and store host the
  broker's, its own UNIQ_KEY (4.9.8 stores ``UNIQ_KEY`` then ``TAGS``);
* the **renewed** half a check puts back (``renewHalfMessageInner``) and the **discarded** copy in
  ``TRANS_CHECK_MAX_TIME_TOPIC`` (``DefaultTransactionalMessageCheckListener.toMessageExtBrokerInner``).

Every properties text Apache re-encodes from a map is in Java HashMap order
(:func:`~broker.store.properties.java_hashmap_order`).
"""

from __future__ import annotations

from dataclasses import replace

from broker.store.constants import (
    PROPERTY_PGROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRAN_MSG,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
)
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from broker.store.properties import encode_properties, java_hashmap_order
from broker.store.topics import (
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANS_OP_REMOVE_TAG,
)

HALF_QUEUE_ID = 0  # parseHalfMessageInner: every half goes to queue 0 of the half topic


def reset_transaction_type(sys_flag: int, transaction_type: int) -> int:
    """``MessageSysFlag.resetTransactionValue``: the other bits kept, the transaction type replaced."""
    return (sys_flag & ~TRANSACTION_TYPE_MASK) | transaction_type


def is_transaction_send(props: dict[str, str]) -> bool:
    """Whether a sent message asks to be a half message (``TRAN_MSG`` parsed as Java's
    ``Boolean.parseBoolean``: ``true`` in any case)."""
    value = props.get(PROPERTY_TRAN_MSG)
    return value is not None and value.lower() == "true"


def half_of(rec: MessageRecord) -> MessageRecord:
    """The half message stored for a transactional send of ``rec`` (its real topic and queue)."""
    props = rec.properties
    props[PROPERTY_REAL_TOPIC] = rec.topic
    props[PROPERTY_REAL_QID] = str(rec.queue_id)
    return replace(rec, topic=TRANS_HALF_TOPIC, queue_id=HALF_QUEUE_ID,
                   sys_flag=reset_transaction_type(rec.sys_flag, TRANSACTION_NOT_TYPE),
                   properties_raw=encode_properties(java_hashmap_order(props)))


class NotAHalfMessage(ValueError):
    """A record that cannot be ended as a half message (no usable REAL_TOPIC/REAL_QID)."""


def committed_of(half: MessageRecord) -> MessageRecord:
    """The message END_TRANSACTION(commit) puts in the real topic; raises :class:`NotAHalfMessage`."""
    props = half.properties
    topic = props.get(PROPERTY_REAL_TOPIC)
    qid = props.get(PROPERTY_REAL_QID, "")
    if not topic or not qid.lstrip("-").isdigit():
        raise NotAHalfMessage(f"the record at {half.physical_offset} has no usable REAL_TOPIC/REAL_QID")
    return MessageRecord(topic=topic, body=half.body, properties_raw=encode_properties(java_hashmap_order(props)),
                         queue_id=int(qid), flag=half.flag,
                         sys_flag=reset_transaction_type(half.sys_flag, TRANSACTION_COMMIT_TYPE),
                         born_timestamp=half.born_timestamp, born_host=half.born_host, store_host=half.store_host,
                         reconsume_times=half.reconsume_times, prepared_transaction_offset=half.physical_offset)


def op_record(half: MessageRecord, broker_host: Host, now_ms: int, uniq_key: str) -> MessageRecord:
    """The op record that marks ``half`` (by its queue offset) as committed or rolled back."""
    props = java_hashmap_order({PROPERTY_TAGS: TRANS_OP_REMOVE_TAG, PROPERTY_UNIQ_KEY: uniq_key})
    return MessageRecord(topic=TRANS_OP_HALF_TOPIC, body=str(half.queue_offset).encode("utf-8"),
                         properties_raw=encode_properties(props), queue_id=half.queue_id, sys_flag=0,
                         born_timestamp=now_ms, born_host=broker_host, store_host=broker_host)


def renewed_half(half: MessageRecord, props: dict[str, str]) -> MessageRecord:
    """``renewHalfMessageInner``: the half again, at the end of its queue, with ``props`` (the check's
    bookkeeping added); born fields, flag and sysFlag kept."""
    return MessageRecord(topic=half.topic, body=half.body, properties_raw=encode_properties(java_hashmap_order(props)),
                         queue_id=half.queue_id, flag=half.flag, sys_flag=half.sys_flag,
                         born_timestamp=half.born_timestamp, born_host=half.born_host, store_host=half.store_host)


def discarded_of(half: MessageRecord, queue_id: int) -> MessageRecord:
    """The copy of a half checked too often, kept in ``TRANS_CHECK_MAX_TIME_TOPIC``."""
    return MessageRecord(topic=TRANS_CHECK_MAX_TIME_TOPIC, body=half.body,
                         properties_raw=encode_properties(java_hashmap_order(half.properties)), queue_id=queue_id,
                         flag=half.flag, sys_flag=half.sys_flag, born_timestamp=half.born_timestamp,
                         born_host=half.born_host, store_host=half.store_host, reconsume_times=half.reconsume_times)


def check_body(half: MessageRecord, props: dict[str, str], queue_offset: int, physical_offset: int) -> bytes:
    """The body of CHECK_TRANSACTION_STATE (``MessageDecoder.encode`` of the re-put half as the
    listener sees it): a V1 record whose topic and queue are the real ones again, whose offsets are the
    re-put copy's (the ones the producer must name in its END_TRANSACTION), the rest the half's."""
    topic = props.get(PROPERTY_REAL_TOPIC) or half.topic
    qid = props.get(PROPERTY_REAL_QID, "")
    return MessageRecord(topic=topic, body=half.body, properties_raw=encode_properties(java_hashmap_order(props)),
                         queue_id=int(qid) if qid.lstrip("-").isdigit() else half.queue_id, flag=half.flag,
                         queue_offset=queue_offset, physical_offset=physical_offset, sys_flag=half.sys_flag,
                         born_timestamp=half.born_timestamp, born_host=half.born_host,
                         store_timestamp=half.store_timestamp, store_host=half.store_host,
                         reconsume_times=half.reconsume_times,
                         prepared_transaction_offset=half.prepared_transaction_offset).encode()


def producer_group_of(rec: MessageRecord) -> str | None:
    return rec.properties.get(PROPERTY_PGROUP)
