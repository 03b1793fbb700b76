"""Transactional messages as Apache RocketMQ 4.9: half messages, END_TRANSACTION, the check service.

Two halves: in-process tests of the store process's handlers over a real store (a fake clock drives
the check service's timeouts), then live tests of a real broker with our ``TransactionProducer``.
Records are compared byte for byte with what Apache 4.9.8 wrote in the golden store.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from broker.client import Admin, Message, PullConsumer
from broker.client.transaction_producer import LocalTransactionState, TransactionCheck, TransactionProducer
from broker.remoting.command import RemotingCommand
from broker.remoting.transport import SyncRemotingClient

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.headers import EndTransactionRequestHeader, SendMessageRequestHeader
from broker.server.settings import BrokerSettings, SettingsError
from broker.server.settings.loading import read_config_file, settings_from_mapping
from broker.server.transaction_check import CheckRun, TransactionCheckService
from broker.server.transaction_records import committed_of, half_of, op_record
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
from tests.broker_harness import cluster, drain, start_broker, start_namesrv, stored_messages, wait_until
from tests.core_harness import ADDR, CLUSTER, PEER, Env, ok

START_MS = 1_800_000_000_000


# =====================================================================================================
# in-process: BrokerCore over a real store, a fake clock
# =====================================================================================================
class TxnEnv(Env):
    """The handler tests' environment with a fake clock, and the check service over its core."""

    def __init__(self, root: Path, settings: BrokerSettings) -> None:
        self.now = START_MS
        super().__init__(root, clock=lambda: self.now, settings=settings)
        self.checker = TransactionCheckService(self.core, self.core.admin_clients.caller)

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
    env.close()


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


def test_an_apache_broker_conf_sets_the_transaction_settings(tmp_path):
    """``rejectTransactionMessage=true`` was refused as a missing feature; now it is a setting."""
    conf = tmp_path / "broker.conf"
    conf.write_text("rejectTransactionMessage=true\ntransactionTimeOut=3000\ntransactionCheckMax=5\n"
                    "transactionCheckInterval=10000\n")
    source, data = read_config_file(conf)
    s = settings_from_mapping(data, source)
    assert (s.reject_transaction_message, s.transaction_time_out, s.transaction_check_max,
            s.transaction_check_interval) == (True, 3000, 5, 10_000)
    with pytest.raises(SettingsError, match="transactionCheckInterval must be >= 1"):
        settings_from_mapping({"transactionCheckInterval": 0})


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
    assert txn.checker.check_once() == CheckRun()  # no half yet: nothing to do, no half topic created
    assert txn.metadata.topics.get(TRANS_HALF_TOPIC) is None
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
    assert txn.metadata.topics.get(TRANS_HALF_TOPIC).read_queue_nums == 1
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
    assert txn.checker.check_once() == CheckRun()  # nothing open any more


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
        as_sent = MessageRecord(topic=half.properties["REAL_TOPIC"], body=half.body,
                                properties_raw=encode_properties(sent), queue_id=int(half.properties["REAL_QID"]),
                                sys_flag=commit.sys_flag & ~TRANSACTION_TYPE_MASK | TRANSACTION_PREPARED_TYPE,
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

# =====================================================================================================
# live: a real broker and our TransactionProducer
# =====================================================================================================
TOPIC = "TxTopic"
# a check every second, after 1.5 s without an answer: an answer (milliseconds) always lands before the
# next run could look at the same half again
LIVE_CONFIG = {"transactionTimeOut": 1500, "transactionCheckInterval": 1000}


def _store_records(store: Path) -> list[MessageRecord]:
    """Every record of a running broker's commitlog, decoded with the store codec."""
    return _golden_records(store)


class LocalBook:
    """The application's side: the outcome of each local transaction (by body), and the checks asked."""

    def __init__(self, outcomes: dict[bytes, LocalTransactionState]) -> None:
        self.outcomes = outcomes
        self.checks: list[TransactionCheck] = []
        self._cond = threading.Condition()

    def execute(self, first: dict[bytes, LocalTransactionState]):
        return lambda msg, result: first[msg.body]

    def check(self, check: TransactionCheck) -> LocalTransactionState:
        with self._cond:
            self.checks.append(check)
            self._cond.notify_all()
        return self.outcomes[check.message.body]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("txn"), LIVE_CONFIG) as b:
        yield b


@pytest.fixture(scope="module")
def flows(broker):
    """Commit, rollback and unknown-then-checked transactions, once for the module's tests."""
    C, R, U = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
               LocalTransactionState.UNKNOW)
    first = {b"commit-1": C, b"commit-2": C, b"commit-3": C, b"rollback-1": R, b"rollback-2": R,
             b"unknown-then-commit": U, b"unknown-then-rollback": U}
    book = LocalBook({**first, b"unknown-then-commit": C, b"unknown-then-rollback": R})
    with TransactionProducer("PG_TX", broker.namesrv, check_listener=book.check) as producer:
        results = {body: producer.send_in_transaction(Message(TOPIC, body, tags="T", properties={"n": body.decode()}),
                                                      book.execute(first)) for body in first}
        with Admin(broker.namesrv) as admin:
            wait_until(lambda: stored_messages(admin, broker.addr, TOPIC) >= 4, "4 committed messages in TxTopic")
        wait_until(lambda: len(book.checks) >= 2, "the two unknown transactions checked")
    return results, book


def test_transaction_outcomes_reach_the_producer(flows):
    results, _ = flows
    assert {body.decode(): r.local_state.name for body, r in results.items()} == {
        "commit-1": "COMMIT_MESSAGE", "commit-2": "COMMIT_MESSAGE", "commit-3": "COMMIT_MESSAGE",
        "rollback-1": "ROLLBACK_MESSAGE", "rollback-2": "ROLLBACK_MESSAGE", "unknown-then-commit": "UNKNOW",
        "unknown-then-rollback": "UNKNOW"}
    assert all(r.send_result.status.name == "SEND_OK" for r in results.values())


def test_consumers_see_exactly_the_committed_messages(broker, flows):
    _, book = flows
    assert sorted(c.message.body for c in book.checks) == [b"unknown-then-commit", b"unknown-then-rollback"]
    with Admin(broker.namesrv) as admin:
        assert stored_messages(admin, broker.addr, TOPIC) == 4
    with PullConsumer("CG_TX", broker.namesrv) as consumer:
        msgs = drain(consumer, TOPIC)
    assert sorted(m.payload for m in msgs) == [b"commit-1", b"commit-2", b"commit-3", b"unknown-then-commit"]
    assert {m.properties["n"] for m in msgs} == {"commit-1", "commit-2", "commit-3", "unknown-then-commit"}


def test_the_store_holds_apaches_half_op_and_commit_records(broker, flows):
    results, book = flows
    records = _store_records(broker.store)
    by_offset = {r.physical_offset: r for r in records}
    halves = [r for r in records if r.topic == TRANS_HALF_TOPIC]
    ops = {int(r.body): r for r in records if r.topic == TRANS_OP_HALF_TOPIC}
    committed = {r.body: r for r in records if r.topic == TOPIC}
    assert sorted(committed) == [b"commit-1", b"commit-2", b"commit-3", b"unknown-then-commit"]
    for body, result in results.items():
        half = by_offset[decode_offset_msg_id(result.send_result.offset_msg_id).physical_offset]
        props = half.properties
        assert (half.topic, half.queue_id, half.queue_offset) == (TRANS_HALF_TOPIC, 0, result.send_result.queue_offset)
        assert half.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_NOT_TYPE
        assert (props["REAL_TOPIC"], props["REAL_QID"], props["TRAN_MSG"], props["PGROUP"]) == (
            TOPIC, str(result.send_result.queue.queue_id), "true", "PG_TX")
        assert half.properties_raw == encode_properties(java_hashmap_order(props))
        if body.startswith(b"unknown"):  # checked: a copy with TRANSACTION_CHECK_TIMES=1 was put back and ended
            assert half.queue_offset not in ops
            (copy,) = [h for h in halves if h.body == body and h.physical_offset != half.physical_offset]
            assert copy.properties_raw == encode_properties(java_hashmap_order(dict(props,
                                                                                    TRANSACTION_CHECK_TIMES="1")))
            half = copy
        op = ops[half.queue_offset]
        assert (op.queue_id, op.tags, op.sys_flag, op.born_host) == (0, "d", 0, Host.parse(broker.addr))
        if body in committed:
            rec = committed[body]
            assert rec.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_COMMIT_TYPE
            assert (rec.prepared_transaction_offset, rec.properties_raw, rec.queue_id) == (
                half.physical_offset, half.properties_raw, result.send_result.queue.queue_id)
    checked = {c.message.body: c for c in book.checks}
    check = checked[b"unknown-then-commit"]
    assert (check.message.topic, check.message.properties["TRANSACTION_CHECK_TIMES"]) == (TOPIC, "1")
    assert check.transaction_id == results[b"unknown-then-commit"].send_result.msg_id


def _end_two_way(addr: str, header: EndTransactionRequestHeader):
    with SyncRemotingClient(addr) as client:
        return client.invoke(RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_ext()), timeout=5.0)


def test_bad_end_transaction_is_refused_by_the_broker(broker, flows):
    results, _ = flows
    sent = results[b"rollback-1"].send_result
    phy = decode_offset_msg_id(sent.offset_msg_id).physical_offset
    with Admin(broker.namesrv) as admin:
        before = admin.broker_runtime_info(broker.addr)["commitLogMaxOffset"]
        for group, offset, remark in (("OtherGroup", phy, "The producer group wrong"),
                                      ("PG_TX", phy + 1, "Find prepared transaction message failed")):
            resp = _end_two_way(broker.addr, EndTransactionRequestHeader(
                producer_group=group, tran_state_table_offset=sent.queue_offset, commit_log_offset=offset,
                commit_or_rollback=TRANSACTION_COMMIT_TYPE, from_transaction_check=False, msg_id=sent.msg_id))
            assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, remark)
        assert admin.broker_runtime_info(broker.addr)["commitLogMaxOffset"] == before


def test_a_half_open_when_the_broker_is_killed_is_resolved_by_the_check_after_restart(tmp_path):
    ns, ns_addr = start_namesrv(tmp_path)
    config = {"transactionTimeOut": 1000, "transactionCheckInterval": 500}
    broker = start_broker(tmp_path / "store", ns_addr, config)
    book = LocalBook({b"survivor": LocalTransactionState.COMMIT_MESSAGE})

    def kill_then_commit(msg, result):  # the broker dies between the half and END_TRANSACTION
        broker.kill()
        return LocalTransactionState.COMMIT_MESSAGE

    restarted = None
    try:
        with TransactionProducer("PG_KILL", ns_addr, check_listener=book.check, heartbeat_interval=0.2) as producer:
            result = producer.send_in_transaction(Message(TOPIC, b"survivor"), kill_then_commit)
            assert result.local_state is LocalTransactionState.COMMIT_MESSAGE
            restarted = start_broker(tmp_path / "store", ns_addr, config, port=broker.port)
            with Admin(ns_addr) as admin:
                wait_until(lambda: stored_messages(admin, restarted.addr, TOPIC) >= 1, "the checked commit")
            with PullConsumer("CG_KILL", ns_addr) as consumer:
                assert [m.payload for m in drain(consumer, TOPIC)] == [b"survivor"]
        assert [c.message.body for c in book.checks] == [b"survivor"]
    finally:
        if restarted is not None:
            restarted.stop()
        broker.kill()
        ns.kill()
        ns.wait(10)


def test_a_half_checked_transaction_check_max_times_is_discarded(broker, flows):
    """transactionCheckMax changed while the broker runs (UPDATE_BROKER_CONFIG): checked once, then discarded."""
    book = LocalBook({b"undecided": LocalTransactionState.UNKNOW})
    with Admin(broker.namesrv) as admin:
        admin.update_broker_config(broker.addr, {"transactionCheckMax": "1"})
        try:
            with TransactionProducer("PG_MAX", broker.namesrv, check_listener=book.check) as producer:
                producer.send_in_transaction(Message("TxUndecided", b"undecided"),
                                             lambda msg, result: LocalTransactionState.UNKNOW)
                wait_until(lambda: stored_messages(admin, broker.addr, TRANS_CHECK_MAX_TIME_TOPIC) >= 1,
                           "the half discarded to TRANS_CHECK_MAX_TIME_TOPIC")
        finally:
            admin.update_broker_config(broker.addr, {"transactionCheckMax": "15"})
        assert stored_messages(admin, broker.addr, "TxUndecided") == 0
        assert stored_messages(admin, broker.addr, TRANS_CHECK_MAX_TIME_TOPIC) == 1
    assert [c.message.properties["TRANSACTION_CHECK_TIMES"] for c in book.checks] == ["1"]
    (discarded,) = [r for r in _store_records(broker.store) if r.topic == TRANS_CHECK_MAX_TIME_TOPIC]
    assert (discarded.body, discarded.queue_id, discarded.properties["TRANSACTION_CHECK_TIMES"],
            discarded.properties["REAL_TOPIC"]) == (b"undecided", 0, "1", "TxUndecided")


def test_the_lake_shows_the_transaction_records_and_the_audit_finds_them_resolved(spark, broker, flows, tmp_path):
    """One Spark test: ingest (inside the audit job) of the live broker's store, then the ``messages``
    rows of the flows' half, op and committed records, and no transaction finding about them."""
    from pipelines.job_args import StoreSpec
    from pipelines.lake import open_table
    from pipelines.reports.audit import run_audit
    from schemas.reports import COMMIT_WITHOUT_HALF, TRANSACTION_UNRESOLVED

    results, _ = flows
    result = run_audit(spark, [StoreSpec("txn", str(broker.store))], str(tmp_path / "lake"))
    rows = open_table(tmp_path / "lake", "messages").to_pyarrow_table().to_pylist()
    by_offset = {r["commitlog_offset"]: r for r in rows}
    ops = {int(r["body"]): r for r in rows if r["topic"] == TRANS_OP_HALF_TOPIC}
    for body, sent in results.items():
        half = by_offset[decode_offset_msg_id(sent.send_result.offset_msg_id).physical_offset]
        assert (half["topic"], half["real_topic"], half["transaction_type"], half["uniq_key"]) == (
            TRANS_HALF_TOPIC, TOPIC, "NOT", sent.send_result.msg_id)
        copies = sorted((r for r in rows if r["topic"] == TRANS_HALF_TOPIC and r["uniq_key"] == half["uniq_key"]),
                        key=lambda r: r["commitlog_offset"])
        assert len(copies) == (2 if body.startswith(b"unknown") else 1)
        last = copies[-1]
        op = ops[last["queue_offset"]]
        assert (op["transaction_type"], op["tags"], op["queue_id"]) == ("NOT", "d", 0)
        commits = [r for r in rows if r["transaction_type"] == "COMMIT" and r["uniq_key"] == half["uniq_key"]]
        if body in (b"commit-1", b"commit-2", b"commit-3", b"unknown-then-commit"):
            (commit,) = commits
            assert (commit["topic"], commit["prepared_transaction_offset"], commit["body"]) == (
                TOPIC, last["commitlog_offset"], body)
        else:
            assert commits == []
    mine = {sent.send_result.msg_id for sent in results.values()}
    findings = result.findings.to_pylist()
    assert [f for f in findings if f["kind"] == COMMIT_WITHOUT_HALF] == []
    assert [f for f in findings if f["kind"] == TRANSACTION_UNRESOLVED and any(k in f["detail"] for k in mine)] == []
