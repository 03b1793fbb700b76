"""Transactional producer: a half message, the local transaction, then commit or rollback.

As Apache 4.9's ``TransactionMQProducer`` / ``DefaultMQProducerImpl.sendMessageInTransaction``:

1. the message is sent with ``TRAN_MSG=true`` and ``PGROUP`` = the producer group (and the prepared
   transaction type in its sysFlag; a ``DELAY`` is dropped): the broker stores it as a half message
   no consumer sees;
2. once it is stored (SEND_OK) the local transaction runs (``execute``, given the message and the send
   result) and answers commit, rollback or unknown; a failed flush answers rollback, an exception
   unknown;
3. END_TRANSACTION goes oneway to the broker, naming the half by its commitlog offset (from the
   offset message id) and queue offset.

When the broker hears nothing conclusive (unknown, or the END_TRANSACTION was lost) its check service
sends CHECK_TRANSACTION_STATE to a producer of the group; ``check_listener`` answers it from the
local transaction's outcome and the producer sends END_TRANSACTION with ``fromTransactionCheck=true``
and the offsets of the check (the broker put the half back under new offsets). The producer must stay
started (and heartbeating) for checks to reach it. The broker's address for that answer is the
STOREHOST of the checked message (Apache uses the connection's remote address; the two are the same
unless a broker advertises another address than the one clients connect to).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable

from broker.client.producer import HEARTBEAT_INTERVAL_S, Message, Producer, SendResult, SendStatus
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from broker.store.constants import (
    PROPERTY_DELAY,
    PROPERTY_PGROUP,
    PROPERTY_TRAN_MSG,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from broker.store.message import MessageRecord, RecordError, decode_record
from broker.store.message_id import decode_offset_msg_id

log = logging.getLogger(__name__)


class LocalTransactionState(Enum):
    """What a local transaction (or a check of it) says; the value is END_TRANSACTION's commitOrRollback."""

    COMMIT_MESSAGE = TRANSACTION_COMMIT_TYPE
    ROLLBACK_MESSAGE = TRANSACTION_ROLLBACK_TYPE
    UNKNOW = TRANSACTION_NOT_TYPE  # sic, Apache's spelling


@dataclass(frozen=True)
class TransactionSendResult:
    send_result: SendResult
    local_state: LocalTransactionState


@dataclass(frozen=True)
class TransactionCheck:
    """A broker asking about one half message: ``message`` is it as the broker sent it (real topic and
    queue, body, properties with ``UNIQ_KEY`` and ``TRANSACTION_CHECK_TIMES``)."""

    message: MessageRecord
    transaction_id: str | None
    broker_addr: str


LocalTransaction = Callable[[Message, SendResult], LocalTransactionState | None]
CheckListener = Callable[[TransactionCheck], LocalTransactionState | None]


class TransactionProducer(Producer):
    """``TransactionProducer("group", ns, check_listener=...).start()`` then ``send_in_transaction``."""

    def __init__(self, group: str, namesrv_addr: str, *, check_listener: CheckListener,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL_S, **options) -> None:
        super().__init__(group, namesrv_addr, heartbeat_interval=heartbeat_interval, **options)
        self.check_listener = check_listener

    def start(self) -> "TransactionProducer":
        super().start()
        self.client.request_handlers[RequestCode.CHECK_TRANSACTION_STATE] = self._on_check
        return self

    # ---- sending ----------------------------------------------------------------------------------------
    def send_in_transaction(self, msg: Message, execute: LocalTransaction) -> TransactionSendResult:
        """Send ``msg`` as a half message, run ``execute`` and end the transaction with its answer.
        A refused send raises :class:`~broker.client.MQClientError` (no local transaction runs)."""
        props = {k: v for k, v in msg.properties.items() if k != PROPERTY_DELAY}
        props[PROPERTY_TRAN_MSG] = "true"
        props[PROPERTY_PGROUP] = self.group
        half = replace(msg, properties=props, delay_level=0)
        self._check(half)
        result = self._send(half, None)
        state, error = LocalTransactionState.UNKNOW, None
        if result.status is SendStatus.SEND_OK:
            try:
                state = execute(half, result) or LocalTransactionState.UNKNOW
            except Exception as exc:  # the broker will ask again (unknown)
                log.warning("local transaction of %s failed: %s", result.msg_id, exc)
                error = exc
        else:  # stored, but not flushed or replicated: Apache rolls it back
            state = LocalTransactionState.ROLLBACK_MESSAGE
        remark = f"executeLocalTransactionBranch exception: {error!r}" if error is not None else None
        header = EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=result.queue_offset,
            commit_log_offset=decode_offset_msg_id(result.offset_msg_id).physical_offset,
            commit_or_rollback=state.value, from_transaction_check=False, msg_id=result.msg_id,
            transaction_id=result.msg_id)
        try:
            self._end(self.client.broker_addr(result.queue.broker_name, msg.topic), header, remark)
        except Exception as exc:  # the check service will ask us later
            log.warning("END_TRANSACTION of %s was not sent: %s", result.msg_id, exc)
        return TransactionSendResult(result, state)

    def _end(self, addr: str, header: EndTransactionRequestHeader, remark: str | None) -> None:
        cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_ext(), oneway=True)
        cmd.remark = remark
        self.client.invoke_oneway(addr, cmd)

    # ---- checks from the broker ---------------------------------------------------------------------------
    def _on_check(self, cmd: RemotingCommand) -> None:
        """CHECK_TRANSACTION_STATE (oneway): ask the listener, answer END_TRANSACTION from a check."""
        try:
            h = CheckTransactionStateRequestHeader.from_ext(cmd.ext_fields)
            rec = decode_record(cmd.body, 0, h.commit_log_offset)
        except (RecordError, ValueError) as exc:
            log.warning("unreadable CHECK_TRANSACTION_STATE: %s", exc)
            return None
        if not isinstance(rec, MessageRecord) or rec.properties.get(PROPERTY_PGROUP) != self.group:
            log.info("CHECK_TRANSACTION_STATE for another producer group ignored")
            return None
        addr = str(rec.store_host)
        state, error = LocalTransactionState.UNKNOW, None
        try:
            state = self.check_listener(TransactionCheck(rec, h.transaction_id, addr)) or LocalTransactionState.UNKNOW
        except Exception as exc:
            log.warning("transaction check listener failed for %s: %s", h.transaction_id, exc)
            error = exc
        header = EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=h.tran_state_table_offset,
            commit_log_offset=h.commit_log_offset, commit_or_rollback=state.value, from_transaction_check=True,
            msg_id=rec.properties.get(PROPERTY_UNIQ_KEY) or h.offset_msg_id or "", transaction_id=h.transaction_id)
        remark = f"checkLocalTransactionState Exception: {error!r}" if error is not None else None
        try:
            self._end(addr, header, remark)
        except Exception as exc:  # the broker checks again later
            log.warning("END_TRANSACTION answering the check of %s was not sent: %s", h.transaction_id, exc)
        return None
