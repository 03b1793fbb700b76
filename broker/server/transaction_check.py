"""The transaction check service: asks producers about half messages nobody ended.

Apache 4.9's ``TransactionalMessageCheckService`` + ``TransactionalMessageServiceImpl.check`` +
``AbstractTransactionalMessageCheckListener``, running as a thread of the store process (the one
that owns the store, the consumer offsets and the client registry). Every
``transactionCheckInterval`` ms, for each queue of ``RMQ_SYS_TRANS_HALF_TOPIC``:

1. the progress is the consumer offsets of group ``CID_RMQ_SYS_TRANS`` on the half queue and on the
   op queue of the same id (``config/consumerOffset.json``; the queue's min offset when none), so a
   restarted broker resumes where the last run stopped;
2. op records from the op offset on say which half offsets are ended (their body is the half's queue
   offset): ended halves are skipped, and the op offset advances over the ops it has used up;
3. a half stored after the run started ends the queue's run; an open half is discarded to
   ``TRANS_CHECK_MAX_TIME_TOPIC`` once it has been checked ``transactionCheckMax`` times (its
   ``TRANSACTION_CHECK_TIMES``) or is older than the store's 72 h file reserve time; one born less than
   ``transactionTimeOut`` ms ago (or its ``CHECK_IMMUNITY_TIME_IN_SECONDS``) ends the run too (later
   ones are younger);
4. otherwise it is checked: put again at the end of the half queue with ``TRANSACTION_CHECK_TIMES``
   counted up (the copy the producer's answer must name), and CHECK_TRANSACTION_STATE (oneway) goes
   to one connection of the producer group in ``PGROUP``, with the message in the body.

A half whose immunity time has not passed is put back at the end of the queue with
``TRAN_PREPARED_QUEUE_OFFSET`` (its first queue offset), so it does not hold up the halves behind it,
and an op record naming that first offset ends it too.

Requests to the producer go through a :class:`~broker.server.client_calls.ClientCaller` (the network
process holding the connection sends them). Deliberate differences: a half stored during the run (a
copy the run itself put back) ends the queue's run before the discard rule is asked, so the producer
always has until the next run to answer its last check (Apache asks the discard rule first, and
discards the copy of the last allowed check at once when the dispatcher has already queued it); when
putting a half back fails the queue's run ends (Apache retries the same offset until its 60 s
per-queue limit).
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.engine.message_store import GetStatus
from broker.remoting.codes import RequestCode
from broker.remoting.headers import CheckTransactionStateRequestHeader
from broker.server.client_calls import ClientCaller, ClientRequest
from broker.server.transaction_records import check_body, discarded_of, producer_group_of, renewed_half
from broker.store.constants import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_KEY,
)
from broker.store.message import MessageRecord, decode_record
from broker.store.topics import (
    TRANS_CHECK_CONSUMER_GROUP,
    TRANS_CHECK_MAX_TIME_QUEUE_NUMS,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANS_OP_REMOVE_TAG,
)

if TYPE_CHECKING:
    from broker.server.processors import BrokerCore

log = logging.getLogger(__name__)

MAX_PROCESS_TIME_MS = 60_000  # TransactionalMessageServiceImpl.MAX_PROCESS_TIME_LIMIT, per half queue
OP_PULL_NUMS = 32  # op records read at a time (fillOpRemoveMap)
MAX_RETRY_COUNT_WHEN_HALF_NULL = 1
# MessageStoreConfig.fileReservedTime (72 h): Apache discards a half older than the commitlog it lives
# in is kept. rocketlake never deletes commitlog files, but keeps the rule so such halves end the same way.
FILE_RESERVED_TIME_MS = 72 * 3600 * 1000
CHECK_CALL_TIMEOUT_S = 3.0

# the bridge's PullStatus for each store status (TransactionalMessageBridge.getMessage)
FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL = "FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL"
_PULL_STATUS = {
    GetStatus.FOUND: FOUND,
    GetStatus.NO_MATCHED_MESSAGE: NO_MATCHED_MSG,
    GetStatus.NO_MESSAGE_IN_QUEUE: NO_NEW_MSG,
    GetStatus.OFFSET_OVERFLOW_ONE: NO_NEW_MSG,
}


@dataclass
class _Pull:
    status: str
    next_begin_offset: int
    records: list[MessageRecord] | None  # None unless FOUND


@dataclass
class CheckRun:
    """What one run did (for logs and tests)."""

    checked: list[str] = field(default_factory=list)  # UNIQ_KEYs a check was sent (or attempted) for
    discarded: list[str] = field(default_factory=list)
    immune: list[str] = field(default_factory=list)  # put back to wait for their immunity time


def _number(text: str | None) -> int:
    """``getLong``/``getInt``: -1 when absent or not a number."""
    if text is None or not text.strip().lstrip("-").isdigit():
        return -1
    return int(text.strip())


class TransactionCheckService:
    """The periodic check of one broker's open half messages (see the module docstring)."""

    def __init__(self, core: BrokerCore, caller: ClientCaller) -> None:
        self.core = core
        self.caller = caller
        self._lock = threading.Lock()  # one run at a time (the thread and explicit calls)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- thread ----------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="transaction-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # read each time: transactionCheckInterval may change at runtime (UPDATE_BROKER_CONFIG)
        while not self._stop.wait(self.core.settings.transaction_check_interval / 1000):
            try:
                run = self.check_once()
                if run.checked or run.discarded:
                    log.info("transaction check: %d checked, %d discarded", len(run.checked), len(run.discarded))
            except Exception:
                log.exception("transaction check run failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ---- one run ---------------------------------------------------------------------------------------
    def check_once(self) -> CheckRun:
        s = self.core.settings
        run = CheckRun()
        with self._lock:
            config = self.core.metadata.topics.get(TRANS_HALF_TOPIC)
            if config is None:
                if self.core.store.max_offset(TRANS_HALF_TOPIC, 0) == 0:
                    return run  # no half message was ever stored: no config to create (Apache creates it anyway)
                # TransactionalMessageBridge.selectTopicConfig: created on first use, 1 queue, read/write
                config = self.core.metadata.topics.create_topic_in_send_back(TRANS_HALF_TOPIC, 1)
                self.core.on_topics_changed()
            for queue_id in range(config.read_queue_nums):
                self._check_queue(queue_id, s.transaction_time_out, s.transaction_check_max, run)
        return run

    def _now(self) -> int:
        return self.core.store.clock()

    def _check_queue(self, queue_id: int, timeout_ms: int, check_max: int, run: CheckRun) -> None:
        start = self._now()
        half_offset = self._fetch_offset(TRANS_HALF_TOPIC, queue_id)
        op_offset = self._fetch_offset(TRANS_OP_HALF_TOPIC, queue_id)
        remove: dict[int, int] = {}  # half queue offset -> op queue offset, ended halves at/after half_offset
        done_ops: list[int] = []  # op queue offsets used up
        ops = self._fill_remove_map(remove, queue_id, op_offset, half_offset, done_ops)
        null_count = 1
        new_offset = i = half_offset
        while self._now() - start <= MAX_PROCESS_TIME_MS:
            if i in remove:
                done_ops.append(remove.pop(i))
                new_offset = i = i + 1
                continue
            got = self._pull(TRANS_HALF_TOPIC, queue_id, i, 1)
            half = got.records[0] if got.records else None
            if half is None:
                null_count += 1
                if null_count > MAX_RETRY_COUNT_WHEN_HALF_NULL + 1 or got.status == NO_NEW_MSG:
                    break
                new_offset = i = got.next_begin_offset  # an illegal offset: go on from where the store says
                continue
            if half.store_timestamp >= start:
                break  # stored during this run (a copy this run put back among them)
            props = half.properties
            if self._need_discard(props, check_max) or start - half.born_timestamp > FILE_RESERVED_TIME_MS:
                self._discard(half)
                run.discarded.append(props.get(PROPERTY_UNIQ_KEY, ""))
                new_offset = i = i + 1
                continue
            age = self._now() - half.born_timestamp
            immunity_text = props.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
            immunity = timeout_ms
            if immunity_text is not None:
                seconds = _number(immunity_text)
                immunity = timeout_ms if seconds == -1 else seconds * 1000
                if age < immunity:
                    if self._wait_out_immunity(remove, done_ops, half, props):
                        run.immune.append(props.get(PROPERTY_UNIQ_KEY, ""))
                        new_offset = i = i + 1
                        continue
            elif 0 <= age < immunity:
                break  # too young to check, and every later half is younger
            need_check = (ops.records is None and age > immunity) or age <= -1 or \
                (ops.records is not None and ops.records[-1].born_timestamp - start > timeout_ms)
            if not need_check:
                if ops.records is None:
                    break  # no op left to read, and not old enough yet
                ops = self._fill_remove_map(remove, queue_id, ops.next_begin_offset, half_offset, done_ops)
                continue  # more ops may end this half: look at it again
            if not self._check(half, props):
                break
            run.checked.append(props.get(PROPERTY_UNIQ_KEY, ""))
            new_offset = i = i + 1
        if new_offset != half_offset:
            self._commit_offset(TRANS_HALF_TOPIC, queue_id, new_offset)
        new_op_offset = op_offset
        for done in sorted(done_ops):  # calculateOpOffset: only a contiguous run of used-up ops
            if done != new_op_offset:
                break
            new_op_offset += 1
        if new_op_offset != op_offset:
            self._commit_offset(TRANS_OP_HALF_TOPIC, queue_id, new_op_offset)

    # ---- the pieces ------------------------------------------------------------------------------------
    def _fetch_offset(self, topic: str, queue_id: int) -> int:
        offset = self.core.metadata.consumer_offsets.query_offset(TRANS_CHECK_CONSUMER_GROUP, topic, queue_id)
        return self.core.store.min_offset(topic, queue_id) if offset == -1 else offset

    def _commit_offset(self, topic: str, queue_id: int, offset: int) -> None:
        self.core.metadata.consumer_offsets.commit_offset(TRANS_CHECK_CONSUMER_GROUP, topic, queue_id, offset)

    def _pull(self, topic: str, queue_id: int, offset: int, nums: int) -> _Pull:
        got = self.core.store.get_messages(topic, queue_id, offset, nums)
        status = _PULL_STATUS.get(got.status, OFFSET_ILLEGAL)
        if status != FOUND:
            return _Pull(status, got.next_begin_offset, None)
        records, pos = [], 0
        for phy in got.physical_offsets:
            rec = decode_record(got.body, pos, phy)
            if isinstance(rec, MessageRecord):
                records.append(rec)
            pos += rec.total_size
        return _Pull(status, got.next_begin_offset, records)

    def _fill_remove_map(self, remove: dict[int, int], queue_id: int, op_offset: int, half_offset: int,
                         done_ops: list[int]) -> _Pull:
        """``fillOpRemoveMap``: read up to 32 op records from ``op_offset``; an op for a half below
        ``half_offset`` is used up at once, the others wait in ``remove`` for their half."""
        got = self._pull(TRANS_OP_HALF_TOPIC, queue_id, op_offset, OP_PULL_NUMS)
        if got.status in (OFFSET_ILLEGAL, NO_MATCHED_MSG):
            log.warning("op offset %d of queue %d is illegal; moving to %d", op_offset, queue_id, got.next_begin_offset)
            self._commit_offset(TRANS_OP_HALF_TOPIC, queue_id, got.next_begin_offset)
            return got
        for op in got.records or ():
            if op.tags != TRANS_OP_REMOVE_TAG:
                log.error("op record at %d has tag %r, not %r; ignored", op.physical_offset, op.tags,
                          TRANS_OP_REMOVE_TAG)
                continue
            ended = _number(op.body.decode("utf-8", "replace"))
            if ended < half_offset:
                done_ops.append(op.queue_offset)
            else:
                remove[ended] = op.queue_offset
        return got

    @staticmethod
    def _need_discard(props: dict[str, str], check_max: int) -> bool:
        """``needDiscard``: checked ``check_max`` times already; else count this check in ``props``."""
        times_text = props.get(PROPERTY_TRANSACTION_CHECK_TIMES)
        times = 1
        if times_text is not None:
            times = _number(times_text)
            if times >= check_max:
                return True
            times += 1
        props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(times)
        return False

    def _wait_out_immunity(self, remove: dict[int, int], done_ops: list[int], half: MessageRecord,
                           props: dict[str, str]) -> bool:
        """``checkPrepareQueueOffset``: True when the half is dealt with (ended by an op naming its first
        offset, or put back to wait); False to go on and check it."""
        first_text = props.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
        if first_text is not None:
            first = _number(first_text)
            if first == -1:
                return False
            if first in remove:
                done_ops.append(remove.pop(first))
                return True
        props.setdefault(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, str(half.queue_offset))
        return self.core.store.put_message(renewed_half(half, props), apply_delay=False).ok

    def _discard(self, half: MessageRecord) -> None:
        """``resolveDiscardMsg``: a copy in TRANS_CHECK_MAX_TIME_TOPIC; the half is never checked again."""
        topics = self.core.metadata.topics
        if topics.get(TRANS_CHECK_MAX_TIME_TOPIC) is None:  # createTopicOfTranCheckMaxTime
            topics.create_topic_in_send_back(TRANS_CHECK_MAX_TIME_TOPIC, TRANS_CHECK_MAX_TIME_QUEUE_NUMS)
            self.core.on_topics_changed()
        queue_id = random.randrange(99_999_999) % TRANS_CHECK_MAX_TIME_QUEUE_NUMS
        result = self.core.store.put_message(discarded_of(half, queue_id), apply_delay=False)
        log.warning("half message %s (offset %d) checked too many times: %s to %s",
                    half.properties.get(PROPERTY_UNIQ_KEY), half.physical_offset,
                    "discarded" if result.ok else f"NOT moved ({result.status.value})", TRANS_CHECK_MAX_TIME_TOPIC)

    def _check(self, half: MessageRecord, props: dict[str, str]) -> bool:
        """``putBackHalfMsgQueue`` then ``sendCheckMessage``; False when the half could not be put back."""
        result = self.core.store.put_message(renewed_half(half, props), apply_delay=False)
        if not result.ok:
            log.error("putting half %d back failed: %s", half.physical_offset, result.status.value)
            return False
        queue_offset, physical = result.queue_offset, result.physical_offsets[0]
        group = producer_group_of(half) or ""
        channels = self.core.clients.producer_channels(group) or []
        if not channels:
            log.warning("transaction check of %s: no producer of group %r is connected", props.get(PROPERTY_UNIQ_KEY),
                        group)
            return True
        channel = max(channels, key=lambda c: c.last_update)  # getAvailableChannel: a live connection
        uniq = props.get(PROPERTY_UNIQ_KEY)
        header = CheckTransactionStateRequestHeader(tran_state_table_offset=queue_offset, commit_log_offset=physical,
                                                    msg_id=uniq, transaction_id=uniq, offset_msg_id=result.msg_id)
        request = ClientRequest(RequestCode.CHECK_TRANSACTION_STATE, header.to_ext(),
                                check_body(half, props, queue_offset, physical), CHECK_CALL_TIMEOUT_S, oneway=True)

        def sent(done) -> None:
            if done.exception() is not None:  # the check is asked again on a later run
                log.warning("CHECK_TRANSACTION_STATE to %s failed: %s", channel.client_id, done.exception())

        self.caller.call(channel.channel, request).add_done_callback(sent)
        return True

