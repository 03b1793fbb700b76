"""END_TRANSACTION (37): a producer (or a transaction check's answer) ends a half message.

As Apache 4.9's ``EndTransactionProcessor``:

* ``commitOrRollback`` must be 0 (unknown), 8 (commit) or 12 (rollback), else the header is refused
  (``EndTransactionRequestHeader.checkFields``);
* unknown writes nothing: the half stays open and the check service will ask the producer later;
* commit and rollback look the half up at ``commitLogOffset`` ("Find prepared transaction message
  failed" when there is none) and check it as ``checkPrepareMessage`` does: the producer group in
  ``PGROUP``, the half's queue offset (``tranStateTableOffset``) and commitlog offset must match,
  each mismatch with Apache's remark and nothing written;
* commit puts the message back in its real topic and queue (:func:`committed_of`) and, once that is
  stored, writes the op record; rollback writes the op record only. Either way the answer is plain
  SUCCESS (``sendFinalMessage`` answers no ids).

A producer sends END_TRANSACTION oneway; the network process answers nothing to a oneway request
whatever this handler replies. Deliberate differences: a record at ``commitLogOffset`` that is not in
``RMQ_SYS_TRANS_HALF_TOPIC`` is "not found" (Apache would copy any record it finds there into the
topic its properties name), and an unknown state asked with a two-way request is answered SUCCESS
(Apache answers nothing, leaving such a caller to its timeout).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.engine.message_store import PutResult, PutStatus
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import HeaderError
from broker.remoting.headers import EndTransactionRequestHeader
from broker.server.processors import MESSAGE_ILLEGAL_REMARK, Reply, Request
from broker.server.transaction_records import NotAHalfMessage, committed_of, op_record, producer_group_of
from broker.store.constants import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE
from broker.store.message import MessageRecord
from broker.store.message_id import UniqKeyGenerator
from broker.store.record_check import RecordError
from broker.store.topics import TRANS_HALF_TOPIC

if TYPE_CHECKING:
    from broker.server.processors import BrokerCore

log = logging.getLogger(__name__)

END_STATES = {TRANSACTION_NOT_TYPE: "unknown", TRANSACTION_COMMIT_TYPE: "commit", TRANSACTION_ROLLBACK_TYPE: "rollback"}

# EndTransactionProcessor / TransactionalMessageServiceImpl remarks (4.9.x wording)
HALF_NOT_FOUND = "Find prepared transaction message failed"
PRODUCER_GROUP_WRONG = "The producer group wrong"
STATE_TABLE_OFFSET_WRONG = "The transaction state table offset wrong"
COMMIT_LOG_OFFSET_WRONG = "The commit log offset wrong"

# sendFinalMessage: the answer to each put status of the committed message
_FINAL_ERRORS = {
    PutStatus.MESSAGE_ILLEGAL: (ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK),
    PutStatus.PROPERTIES_SIZE_EXCEEDED: (ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK),
    PutStatus.SERVICE_NOT_AVAILABLE: (ResponseCode.SERVICE_NOT_AVAILABLE, "Service not available now."),
    PutStatus.UNKNOWN_ERROR: (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"),
}


def _error(code: int, remark: str) -> Reply:
    return Reply(code=code, remark=remark)


def check_prepare_message(half: MessageRecord, h: EndTransactionRequestHeader) -> Reply | None:
    """``checkPrepareMessage``: None when the request names this half, else Apache's refusal."""
    if producer_group_of(half) != h.producer_group:
        return _error(ResponseCode.SYSTEM_ERROR, PRODUCER_GROUP_WRONG)
    if half.queue_offset != h.tran_state_table_offset:
        return _error(ResponseCode.SYSTEM_ERROR, STATE_TABLE_OFFSET_WRONG)
    if half.physical_offset != h.commit_log_offset:
        return _error(ResponseCode.SYSTEM_ERROR, COMMIT_LOG_OFFSET_WRONG)
    return None


def final_reply(result: PutResult) -> Reply:
    """``sendFinalMessage``'s answer: SUCCESS without ids when the committed message is stored."""
    if result.ok:
        return Reply()
    code, remark = _FINAL_ERRORS.get(result.status, (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR DEFAULT"))
    return _error(code, remark)


class EndTransactionHandler:
    """END_TRANSACTION for one :class:`~broker.server.processors.BrokerCore` (store process)."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        address = core.store_host.address
        self._uniq = UniqKeyGenerator(ip=address if len(address) == 4 else None)  # the op records' UNIQ_KEY
        core._handlers[RequestCode.END_TRANSACTION] = self.end_transaction

    def end_transaction(self, req: Request) -> Reply:
        h = EndTransactionRequestHeader.from_ext(req.ext)
        state = END_STATES.get(h.commit_or_rollback)
        if state is None:
            raise HeaderError("commitOrRollback field wrong")
        source = "a transaction check" if h.from_transaction_check else "the producer"
        if h.commit_or_rollback == TRANSACTION_NOT_TYPE:
            log.info("END_TRANSACTION from %s (%s) left %s open: state unknown", source, req.peer, h.msg_id)
            return Reply()
        half = self._half_at(h.commit_log_offset)
        if half is None:
            log.info("END_TRANSACTION %s from %s: no half message at %d", state, req.peer, h.commit_log_offset)
            return _error(ResponseCode.SYSTEM_ERROR, HALF_NOT_FOUND)
        refusal = check_prepare_message(half, h)
        if refusal is not None:
            log.info("END_TRANSACTION %s from %s refused: %s", state, req.peer, refusal.remark)
            return refusal
        store = self.core.store
        if h.commit_or_rollback == TRANSACTION_COMMIT_TYPE:
            try:
                final = committed_of(half)
            except NotAHalfMessage as exc:
                return _error(ResponseCode.SYSTEM_ERROR, str(exc))
            reply = final_reply(store.put_message(final))
            if reply.code != ResponseCode.SUCCESS:
                log.warning("committing %s to %s failed: %s", h.msg_id, final.topic, reply.remark)
                return reply
        op = op_record(half, self.core.store_host, store.clock(), self._uniq.next())
        if not store.put_message(op, apply_delay=False).ok:  # Apache logs it; the check may ask again
            log.error("op record of half %d (queue offset %d) was not stored", half.physical_offset,
                      half.queue_offset)
        log.debug("END_TRANSACTION %s of %s by %s", state, h.msg_id, source)
        return Reply()

    def _half_at(self, offset: int) -> MessageRecord | None:
        """``lookMessageByOffset``, restricted to half messages."""
        try:
            rec = self.core.store.view_message(offset)
        except (RecordError, ValueError, OSError):
            return None
        return rec if rec.topic == TRANS_HALF_TOPIC else None
