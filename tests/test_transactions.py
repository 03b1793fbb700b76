"""Transactional messages as Apache RocketMQ 4.9: half messages, END_TRANSACTION, the check service.

Two halves: in-process tests of the store process's handlers over a real store (a fake clock drives
the check service's timeouts), then live tests of a real broker with our ``TransactionProducer``.
Records are compared byte for byte with what Apache 4.9.8 wrote in the golden store.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.headers import EndTransactionRequestHeader, SendMessageRequestHeader
from broker.server.metadata import BrokerMetadata
from broker.server.processors import BrokerCore, Request
from broker.server.send_draft import SendDrafter
from broker.server.settings import BrokerSettings
from broker.server.transaction_check import TransactionCheckService
from broker.server.transaction_records import committed_of, half_of, op_record
from broker.engine.store_settings import StoreSettings
from broker.store.config_files import TopicConfig
from broker.store.constants import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from broker.store.hosts import Host
from broker.store.message import MessageRecord, RecordError, decode_record
from broker.store.message_id import decode_offset_msg_id
from broker.store.properties import encode_properties, java_hashmap_order
from broker.store.topics import (
    DEFAULT_TOPIC,
    TRANS_CHECK_CONSUMER_GROUP,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from tests.store_harness import DispatchedStore

CLUSTER, BROKER, ADDR = "DefaultCluster", "broker-a", "127.0.0.1:10911"
PEER = "10.0.0.7:51000"
START_MS = 1_800_000_000_000


# =====================================================================================================
# in-process: BrokerCore over a real store, a fake clock
# =====================================================================================================
class TxnEnv:
    def __init__(self, root: Path, settings: BrokerSettings) -> None:
        self.now = START_MS
        self.store = DispatchedStore(root, StoreSettings(fsync_metadata=False), clock=lambda: self.now)
        self.store.open()
        self.metadata = BrokerMetadata(self.store)
        self.core = BrokerCore(self.store, self.metadata, cluster_name=CLUSTER, broker_name=BROKER,
                               broker_addr=ADDR, max_message_size=4096, settings=settings)
        self.metadata.topics.put(TopicConfig("Orders", 2, 2, 6))
        self.drafter = SendDrafter(CLUSTER, Host.parse(ADDR), 4096)
        self.checker = TransactionCheckService(self.core, self.core.admin_clients.caller)

    def ask(self, code: int, ext: dict[str, str], body: bytes = b""):
        draft = self.drafter.draft(code, ext, body, PEER, ("c", 1))
        if draft is not None:
            (reply,) = self.core.send_messages([draft])
        else:
            reply = self.core.process(Request(code=code, ext=ext, body=body, channel=("c", 1), peer=PEER))
        self.store.caught_up()
        return reply

    def send_half(self, body: bytes = b"order-1", *, queue_id: int = 1, group: str = "PG", extra=None):
        props = {"KEYS": "k1", "TAGS": "TagA", "UNIQ_KEY": f"UNIQ-{body.decode()}", "TRAN_MSG": "true",
                 "PGROUP": group, **(extra or {})}
        header = SendMessageRequestHeader(producer_group=group, topic="Orders", default_topic=DEFAULT_TOPIC,
                                          default_topic_queue_nums=4, queue_id=queue_id,
                                          sys_flag=TRANSACTION_PREPARED_TYPE, born_timestamp=self.now, flag=0,
                                          properties=encode_properties(props))
        self.last_ext = header.to_ext(v2=True)
        return self.ask(RequestCode.SEND_MESSAGE_V2, self.last_ext, body)

    def end(self, reply, state: int, *, group: str = "PG", check: bool = False, offset: int | None = None,
            queue_offset: int | None = None):
        phy = decode_offset_msg_id(reply.ext["msgId"]).physical_offset
        header = EndTransactionRequestHeader(
            producer_group=group, tran_state_table_offset=int(reply.ext["queueOffset"]) if queue_offset is None
            else queue_offset, commit_log_offset=phy if offset is None else offset, commit_or_rollback=state,
            from_transaction_check=check, msg_id=reply.ext.get("transactionId", ""))
        return self.ask(RequestCode.END_TRANSACTION, header.to_ext())

    def records(self, topic: str, queue_id: int) -> list[MessageRecord]:
        got = self.store.get_messages(topic, queue_id, self.store.min_offset(topic, queue_id), 32)
        out, pos = [], 0
        for phy in got.physical_offsets:
            rec = decode_record(got.body, pos, phy)
            out.append(rec)
            pos += rec.total_size
        return out


@pytest.fixture
def txn(tmp_path):
    env = TxnEnv(tmp_path / "store", BrokerSettings(transaction_time_out=6_000, transaction_check_max=2))
    yield env
    env.metadata.close()
    env.store.close()


def ok(reply):
    assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
    return reply


def test_a_transactional_send_is_stored_as_a_half_message(txn):
    reply = ok(txn.send_half())
    # never drafted: the full path turns it into a half message
    assert txn.drafter.draft(RequestCode.SEND_MESSAGE_V2, txn.last_ext, b"order-1", PEER, None) is None
    (half,) = txn.records(TRANS_HALF_TOPIC, 0)
    # the reply names the half (its offset message id and queue offset) and the real queue id
    assert reply.ext["msgId"] == half.offset_msg_id
    assert (reply.ext["queueId"], reply.ext["queueOffset"], reply.ext["transactionId"]) == ("1", "0", "UNIQ-order-1")
    assert (half.topic, half.queue_id, half.sys_flag & TRANSACTION_TYPE_MASK) == (TRANS_HALF_TOPIC, 0,
                                                                                  TRANSACTION_NOT_TYPE)
    expected = java_hashmap_order({"KEYS": "k1", "TAGS": "TagA", "UNIQ_KEY": "UNIQ-order-1", "TRAN_MSG": "true",
                                   "PGROUP": "PG", "CLUSTER": CLUSTER, "REAL_TOPIC": "Orders", "REAL_QID": "1"})
    assert half.properties_raw == encode_properties(expected)
    assert list(expected) == ["REAL_TOPIC", "KEYS", "TRAN_MSG", "UNIQ_KEY", "CLUSTER", "PGROUP", "TAGS", "REAL_QID"]
    assert txn.store.max_offset("Orders", 1) == 0  # nothing a consumer of the real topic could pull


def test_reject_transaction_message_refuses_half_messages(txn):
    txn.core.settings = txn.core.settings.with_overrides(reject_transaction_message=True)
    before = txn.store.commitlog_max_offset
    reply = txn.send_half()
    assert (reply.code, reply.remark) == (ResponseCode.NO_PERMISSION,
                                          "the broker[127.0.0.1] sending transaction message is forbidden")
    assert txn.store.commitlog_max_offset == before


def test_commit_restores_the_message_and_writes_the_op_record(txn):
    sent = ok(txn.send_half())
    (half,) = txn.records(TRANS_HALF_TOPIC, 0)
    txn.now += 5
    reply = ok(txn.end(sent, TRANSACTION_COMMIT_TYPE))
    assert (reply.remark, reply.ext) == (None, {})
    (committed,) = txn.records("Orders", 1)
    assert (committed.body, committed.queue_id, committed.flag) == (b"order-1", 1, half.flag)
    assert committed.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_COMMIT_TYPE
    assert committed.prepared_transaction_offset == half.physical_offset
    assert committed.properties_raw == half.properties_raw  # REAL_TOPIC, REAL_QID, TRAN_MSG stay on disk
    assert (committed.born_timestamp, committed.born_host) == (half.born_timestamp, half.born_host)
    (op,) = txn.records(TRANS_OP_HALF_TOPIC, 0)
    assert (op.body, op.tags, op.queue_id, op.sys_flag) == (b"0", "d", 0, 0)
    assert list(op.properties) == ["UNIQ_KEY", "TAGS"]
    assert (op.born_host, op.store_host, op.born_timestamp) == (Host.parse(ADDR), Host.parse(ADDR), txn.now)


def test_rollback_writes_only_the_op_record(txn):
    sent = ok(txn.send_half())
    ok(txn.end(sent, TRANSACTION_ROLLBACK_TYPE))
    assert txn.store.max_offset("Orders", 1) == 0
    (op,) = txn.records(TRANS_OP_HALF_TOPIC, 0)
    assert (op.body, op.tags) == (b"0", "d")


def test_unknown_state_writes_nothing(txn):
    sent = ok(txn.send_half())
    before = txn.store.commitlog_max_offset
    ok(txn.end(sent, TRANSACTION_NOT_TYPE))
    assert txn.store.commitlog_max_offset == before


@pytest.mark.parametrize("change, remark", [
    ({"offset": 3}, "Find prepared transaction message failed"),  # no record starts there
    ({"offset": 10**12}, "Find prepared transaction message failed"),  # beyond the commitlog
    ({"group": "OtherGroup"}, "The producer group wrong"),
    ({"queue_offset": 7}, "The transaction state table offset wrong"),
])
def test_bad_end_transaction_is_refused_and_writes_nothing(txn, change, remark):
    sent = ok(txn.send_half())
    before = txn.store.commitlog_max_offset
    for state in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
        reply = txn.end(sent, state, **change)
        assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, remark)
    assert txn.store.commitlog_max_offset == before


def test_end_transaction_of_a_record_that_is_not_a_half_is_refused(txn):
    plain = ok(txn.ask(RequestCode.SEND_MESSAGE_V2, SendMessageRequestHeader(
        producer_group="PG", topic="Orders", default_topic=DEFAULT_TOPIC, default_topic_queue_nums=4, queue_id=0,
        sys_flag=0, born_timestamp=txn.now, flag=0, properties=encode_properties({"PGROUP": "PG"})).to_ext(v2=True),
        b"plain"))
    reply = txn.end(plain, TRANSACTION_COMMIT_TYPE)
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
    assert txn.store.max_offset("Orders", 0) == 1


def test_a_bad_commit_or_rollback_value_is_refused(txn):
    sent = ok(txn.send_half())
    reply = txn.end(sent, 5)
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "commitOrRollback field wrong")


def test_check_service_reputs_an_open_half_then_discards_it_after_check_max(txn):
    ok(txn.send_half(b"open"))
    ended = ok(txn.send_half(b"ended"))
    ok(txn.end(ended, TRANSACTION_COMMIT_TYPE))
    txn.now += 5_000
    run = txn.checker.check_once()  # younger than transactionTimeOut: nothing yet
    assert (run.checked, run.discarded) == ([], [])
    txn.now += 1_001
    run = txn.checker.check_once()
    txn.store.caught_up()
    assert (run.checked, run.discarded) == (["UNIQ-open"], [])  # no producer connected: put back, not asked
    halves = txn.records(TRANS_HALF_TOPIC, 0)
    assert len(halves) == 3
    assert halves[2].properties["TRANSACTION_CHECK_TIMES"] == "1"
    assert halves[2].properties_raw == encode_properties(java_hashmap_order(dict(halves[0].properties,
                                                                                 TRANSACTION_CHECK_TIMES="1")))
    offsets = txn.metadata.consumer_offsets
    assert offsets.query_offset(TRANS_CHECK_CONSUMER_GROUP, TRANS_HALF_TOPIC, 0) == 2
    assert offsets.query_offset(TRANS_CHECK_CONSUMER_GROUP, TRANS_OP_HALF_TOPIC, 0) == 1  # the op is used up
    txn.now += 6_001
    run = txn.checker.check_once()
    txn.store.caught_up()
    assert (run.checked, run.discarded) == (["UNIQ-open"], [])
    assert txn.records(TRANS_HALF_TOPIC, 0)[3].properties["TRANSACTION_CHECK_TIMES"] == "2"
    txn.now += 6_001
    run = txn.checker.check_once()  # transactionCheckMax=2 reached
    txn.store.caught_up()
    assert (run.checked, run.discarded) == ([], ["UNIQ-open"])
    (discarded,) = txn.records(TRANS_CHECK_MAX_TIME_TOPIC, 0)
    last = txn.records(TRANS_HALF_TOPIC, 0)[3]
    assert (discarded.body, discarded.properties_raw, discarded.sys_flag) == (b"open", last.properties_raw,
                                                                              last.sys_flag)
    assert offsets.query_offset(TRANS_CHECK_CONSUMER_GROUP, TRANS_HALF_TOPIC, 0) == 4
    assert txn.metadata.topics.get(TRANS_CHECK_MAX_TIME_TOPIC).read_queue_nums == 1
    txn.now += 60_000
    assert txn.checker.check_once() == type(run)()  # nothing open any more


def test_check_immunity_time_puts_the_half_back_until_it_passes(txn):
    ok(txn.send_half(b"immune", extra={"CHECK_IMMUNITY_TIME_IN_SECONDS": "30"}))
    txn.now += 6_001
    run = txn.checker.check_once()
    txn.store.caught_up()
    assert (run.checked, run.immune) == ([], ["UNIQ-immune"])
    copy = txn.records(TRANS_HALF_TOPIC, 0)[1]
    assert copy.properties["TRAN_PREPARED_QUEUE_OFFSET"] == "0"
    txn.now += 30_000
    run = txn.checker.check_once()
    assert run.checked == ["UNIQ-immune"]


# ---- Apache's own records: the 4.9.8 golden store -----------------------------------------------------
def _golden_records(store: Path) -> list[MessageRecord]:
    out = []
    for path in sorted((store / "commitlog").iterdir()):
        data, pos, base = path.read_bytes(), 0, int(path.name)
        while pos + 8 <= len(data):
            try:
                rec = decode_record(data, pos, base + pos)
            except RecordError:  # the zeroed end of the last file
                break
            if not isinstance(rec, MessageRecord):
                break
            out.append(rec)
            pos += rec.total_size
    return out


def test_records_match_apaches_half_commit_and_op_records(golden_store):
    records = _golden_records(golden_store)
    by_offset = {r.physical_offset: r for r in records}
    commits = [r for r in records if r.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_COMMIT_TYPE
               and by_offset.get(r.prepared_transaction_offset, r).topic == TRANS_HALF_TOPIC]
    ops = {int(r.body): r for r in records if r.topic == TRANS_OP_HALF_TOPIC}
    assert len(commits) >= 3
    for commit in commits:
        half = by_offset[commit.prepared_transaction_offset]
        sent = {k: v for k, v in half.properties.items() if k not in ("REAL_TOPIC", "REAL_QID")}
        as_sent = MessageRecord(topic=half.properties["REAL_TOPIC"], body=half.body, properties_raw=encode_properties(sent),
                                queue_id=int(half.properties["REAL_QID"]), sys_flag=commit.sys_flag & ~0xC | 0x4,
                                born_host=half.born_host)
        ours = half_of(as_sent)
        assert (ours.topic, ours.queue_id, ours.sys_flag, ours.properties_raw) == (
            half.topic, half.queue_id, half.sys_flag, half.properties_raw)
        ours = committed_of(half)
        assert (ours.topic, ours.queue_id, ours.sys_flag, ours.prepared_transaction_offset, ours.properties_raw) == (
            commit.topic, commit.queue_id, commit.sys_flag, commit.prepared_transaction_offset, commit.properties_raw)
        op = ops[half.queue_offset]
        ours = op_record(half, op.store_host, op.born_timestamp, op.properties["UNIQ_KEY"])
        assert (ours.topic, ours.queue_id, ours.body, ours.sys_flag, ours.flag, ours.properties_raw, ours.born_host) \
            == (op.topic, op.queue_id, op.body, op.sys_flag, op.flag, op.properties_raw, op.born_host)

