"""Admin requests that change or remove metadata: DELETE_TOPIC_IN_BROKER, DELETE_SUBSCRIPTIONGROUP,
CLONE_GROUP_OFFSET (in-process ``BrokerCore`` over a temporary store), GET/UPDATE_NAMESRV_CONFIG and
DELETE_TOPIC_IN_NAMESRV (a real ``NameServer`` over TCP), and a topic deleted on a running broker
(its dispatcher process holding the queue files) through ``rocketlake admin``, then a restart."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path

import pytest

from broker.cli import main
from broker.namesrv.server import NameServer
from broker.remoting.bodies import RegisterBrokerBody, TopicRouteData
from broker.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import RegisterBrokerRequestHeader, UpdateConsumerOffsetRequestHeader
from broker.remoting.properties_body import parse_properties, properties_to_text
from broker.remoting.transport import RemotingClient
from broker.engine.message_store import MessageStore, PutStatus
from broker.server.metadata import BrokerMetadata
from broker.engine.store_settings import StoreSettings
from broker.server.processors import BrokerCore, Request
from broker.store.config_files import TopicConfig, TopicConfigTable, read_config_json
from broker.store.constants import DELETED_TOPICS_FILE
from broker.store.verify import verify_store
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from tests.store_harness import DispatchedStore

SETTINGS = StoreSettings(segment_bytes=64 * 1024, cq_file_bytes=20 * 8, index_slots=64, index_entries=256,
                         fsync_metadata=False, auto_create_topic_enable=False)
BORN = Host(bytes([10, 0, 0, 1]), 5000)


# =====================================================================================================
# in-process broker
# =====================================================================================================
class Broker:
    """A store and a BrokerCore over it; ``changed`` counts topic-table change notifications.

    The store runs with its dispatcher process, as in the broker (tests/store_harness.py), so topic
    deletion goes through that process; requests and puts return once it caught up, because the
    tests look at the queues (and their directories) right after."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.changed = 0
        self.store = DispatchedStore(root, SETTINGS)
        self.store.open()
        self.metadata = BrokerMetadata(self.store)
        self.core = BrokerCore(self.store, self.metadata, cluster_name="DefaultCluster", broker_name="broker-a",
                               broker_addr="127.0.0.1:10911", max_message_size=4 << 20, auto_create_topic=False,
                               on_topics_changed=self._changed)

    def _changed(self) -> None:
        self.changed += 1

    def ask(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"", channel=("t", 1)):
        reply = self.core.process(Request(code=code, ext=ext or {}, body=body, channel=channel))
        self.store.caught_up()
        return reply

    def put(self, topic: str, queue_id: int, n: int) -> None:
        for i in range(n):
            result = self.store.put_message(MessageRecord(topic=topic, body=b"m%d" % i, queue_id=queue_id,
                                                          born_timestamp=1, born_host=BORN))
            assert result.status is PutStatus.PUT_OK
        self.store.caught_up()

    def send(self, topic: str, body: bytes = b"hello"):
        ext = {"a": "PG", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0", "i": ""}
        return self.ask(RequestCode.SEND_MESSAGE_V2, ext, body)

    def config(self, name: str) -> dict:
        """A config file as the project's fastjson-tolerant reader sees it (queue ids are bare ints)."""
        return read_config_json(self.root / "config" / name).data


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "store")
    b.metadata.topics.put(TopicConfig("Payments", 1, 1, 6))
    b.metadata.topics.put(TopicConfig("Orders", 2, 2, 6))
    b.put("Payments", 0, 3)
    b.put("Orders", 0, 4)  # Orders last: a re-dispatch from the other queues' ends would reach it
    b.put("Orders", 1, 2)
    for group, topic, qid, offset in [("g1", "Orders", 0, 3), ("g1", "Orders", 1, 1), ("g1", "Payments", 0, 2),
                                      ("g2", "Orders", 0, 4)]:
        b.metadata.consumer_offsets.commit_offset(group, topic, qid, offset)
    yield b
    b.metadata.close()
    b.store.close()


def cq_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "consumequeue").iterdir())


def test_delete_topic_removes_config_queues_and_offsets(broker):
    version = broker.config("topics.json")["dataVersion"]["counter"]
    assert cq_dirs(broker.root) == ["Orders", "Payments"]
    reply = broker.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Orders"})
    assert (reply.code, reply.remark) == (ResponseCode.SUCCESS, None)
    assert cq_dirs(broker.root) == ["Payments"]
    topics = broker.config("topics.json")
    assert "Orders" not in topics["topicConfigTable"] and "Payments" in topics["topicConfigTable"]
    assert topics["dataVersion"]["counter"] == version + 1
    assert (broker.root / "config" / "consumerOffset.json").read_text() == (
        '{\n\t"offsetTable":{\n\t\t"Payments@g1":{0:2\n\t\t}\n\t}\n}')
    assert broker.changed == 1
    assert broker.store.max_offset("Orders", 0) == 0 and broker.store.max_offset("Payments", 0) == 3
    assert [p.name for p in (broker.root / "commitlog").iterdir()] == ["00000000000000000000"]
    # the topic is gone for clients: sends refused (autoCreateTopic off), the store refuses stragglers
    reply = broker.send("Orders")
    assert (reply.code, reply.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic[Orders] not exist, apply first please!")
    straggler = broker.store.put_message(MessageRecord(topic="Orders", body=b"late", queue_id=0, born_host=BORN))
    assert straggler.status is PutStatus.TOPIC_NOT_EXIST
    assert cq_dirs(broker.root) == ["Payments"]
    # other topics unaffected
    assert broker.send("Payments").code == ResponseCode.SUCCESS
    assert broker.store.max_offset("Payments", 0) == 4


def test_recreated_topic_starts_empty_and_restarts_stay_clean(broker):
    assert broker.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Orders"}).code == ResponseCode.SUCCESS
    fence = broker.store.commitlog_max_offset
    assert broker.config(DELETED_TOPICS_FILE) == {"Orders": fence}
    # a restart (clean, then a crash) re-dispatches from the other queues' ends: Orders stays gone
    broker.metadata.close()
    broker.store.close()
    verified = verify_store(broker.root, segment_size=SETTINGS.segment_bytes)
    assert verified.ok, verified.summary()  # the old Orders records need no unit any more
    store = MessageStore(broker.root, SETTINGS)
    report = store.open()
    assert report.dispatch_from < fence  # the old Orders records were walked again ...
    assert (report.redispatched, cq_dirs(broker.root)) == (0, ["Payments"])  # ... and not queued
    BrokerMetadata(store).topics.put(TopicConfig("Orders", 1, 1, 6))  # recreated: a new, empty topic
    placed = store.put_message(MessageRecord(topic="Orders", body=b"new", queue_id=0, born_host=BORN))
    assert (placed.status, placed.queue_offset) == (PutStatus.PUT_OK, 0)
    store.abandon()
    # a crash before the new record was queued (as with a dispatcher process behind): recovery walks
    # the old Orders records again (skipped) and the new one (queued, at offset 0)
    for path in sorted((broker.root / "consumequeue" / "Orders").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (broker.root / "consumequeue" / "Orders").rmdir()
    store = MessageStore(broker.root, SETTINGS)
    report = store.open()
    try:
        assert report.abnormal and report.dispatch_from < fence
        assert store.max_offset("Orders", 0) == 1 and store.max_offset("Orders", 1) == 0
        got = store.get_messages("Orders", 0, 0)
        assert got.message_count == 1 and got.physical_offsets == placed.physical_offsets
        assert sorted(p.name for p in (broker.root / "consumequeue" / "Orders").iterdir()) == ["0"]
        assert store.max_offset("Payments", 0) == 3
        assert report.redispatched == 1  # the old Orders records changed nothing; the new one was queued
    finally:
        store.close()
    broker.store = MessageStore(broker.root, SETTINGS)  # the fixture closes it
    broker.store.open()
    broker.metadata = BrokerMetadata(broker.store)


@pytest.mark.parametrize(("topic", "remark"), [
    ("SCHEDULE_TOPIC_XXXX", "The topic[SCHEDULE_TOPIC_XXXX] is conflict with system topic."),
    ("TBW102", "The topic[TBW102] is conflict with system topic."),
    ("rmq_sys_wheel", "The topic[rmq_sys_wheel] is conflict with system topic."),
    (" ", "The specified topic is blank."),
    ("../Payments", "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
    ("T" * 128, "The specified topic is longer than topic max length."),
])
def test_delete_topic_refusals(broker, topic, remark):
    before = broker.config("topics.json")
    reply = broker.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, remark)
    assert broker.config("topics.json") == before and cq_dirs(broker.root) == ["Orders", "Payments"]
    assert broker.changed == 0


def test_delete_topic_missing_header_and_unknown_topic(broker):
    reply = broker.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {})
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "missing field topic")
    before = broker.config("topics.json")
    reply = broker.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "NoSuchTopic"})
    assert (reply.code, reply.remark) == (ResponseCode.SUCCESS, None)  # as Apache: nothing to delete is fine
    assert broker.config("topics.json") == before and broker.changed == 0


def test_delete_retry_topic_leaves_group_and_dlq(broker):
    long_retry = "%RETRY%" + "g" * 200  # a retry topic's config may pass 127 characters (group names do)
    for topic in ("%RETRY%g1", "%DLQ%g1", long_retry):
        broker.metadata.topics.create_topic_in_send_back(topic, 1)
    assert broker.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": long_retry}).code == ResponseCode.SUCCESS
    assert long_retry not in broker.config("topics.json")["topicConfigTable"]
    broker.put("%RETRY%g1", 0, 1)
    broker.metadata.consumer_offsets.commit_offset("g1", "%RETRY%g1", 0, 1)
    assert cq_dirs(broker.root) == ["%RETRY%g1", "Orders", "Payments"]
    assert broker.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "%RETRY%g1"}).code == ResponseCode.SUCCESS
    table = broker.config("topics.json")["topicConfigTable"]
    assert "%RETRY%g1" not in table and "%DLQ%g1" in table
    assert sorted(broker.config("consumerOffset.json")["offsetTable"]) == ["Orders@g1", "Orders@g2", "Payments@g1"]
    assert cq_dirs(broker.root) == ["Orders", "Payments"]


def test_delete_subscription_group(broker):
    broker.metadata.groups.find("g1")
    broker.metadata.groups.find("g2")
    broker.metadata.topics.create_topic_in_send_back("%RETRY%g1", 1)
    reply = broker.ask(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "g1"})
    assert (reply.code, reply.remark) == (ResponseCode.SUCCESS, None)
    groups = broker.config("subscriptionGroup.json")["subscriptionGroupTable"]
    assert "g1" not in groups and "g2" in groups
    broker.metadata.persist(force=True)
    offsets = broker.config("consumerOffset.json")["offsetTable"]
    assert sorted(offsets) == ["Orders@g1", "Orders@g2", "Payments@g1"]  # offsets kept without cleanOffset
    reply = broker.ask(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "g2", "cleanOffset": "true"})
    assert reply.code == ResponseCode.SUCCESS
    assert "g2" not in broker.config("subscriptionGroup.json")["subscriptionGroupTable"]
    assert sorted(broker.config("consumerOffset.json")["offsetTable"]) == ["Orders@g1", "Payments@g1"]
    # the group's retry topic is not touched; an unknown group is a success too
    assert "%RETRY%g1" in broker.config("topics.json")["topicConfigTable"]
    assert broker.ask(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "nobody", "cleanOffset": "true"}).code == 0
    reply = broker.ask(RequestCode.DELETE_SUBSCRIPTIONGROUP, {})
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "missing field groupName")


HEARTBEAT_G1_PAYMENTS = json.dumps({
    "clientID": "10.0.0.1@1", "consumerDataSet": [{
        "groupName": "g1", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": "Payments", "subString": "*", "tagsSet": [], "codeSet": [],
                                 "subVersion": 1, "classFilterMode": False, "expressionType": "TAG"}]}],
    "producerDataSet": []}).encode()


def test_clone_group_offset(broker):
    broker.metadata.consumer_offsets.commit_offset("g3", "Orders", 0, 1)
    broker.metadata.consumer_offsets.commit_offset("g3", "Orders", 5, 9)
    reply = broker.ask(RequestCode.CLONE_GROUP_OFFSET, {"srcGroup": "g1", "destGroup": "g3", "topic": "Orders"})
    assert (reply.code, reply.remark) == (ResponseCode.SUCCESS, None)
    offsets = broker.config("consumerOffset.json")["offsetTable"]
    assert offsets["Orders@g3"] == {0: 3, 1: 1}  # replaced as a whole, as cloneOffset does
    # blank topic: every topic of the source group
    assert broker.ask(RequestCode.CLONE_GROUP_OFFSET, {"srcGroup": "g1", "destGroup": "g4"}).code == 0
    offsets = broker.config("consumerOffset.json")["offsetTable"]
    assert (offsets["Orders@g4"], offsets["Payments@g4"]) == ({0: 3, 1: 1}, {0: 2})
    # a topic without config, or a source without offsets there: nothing
    assert broker.ask(RequestCode.CLONE_GROUP_OFFSET, {"srcGroup": "g2", "destGroup": "g5", "topic": "Payments"}).code == 0
    assert not any(k.endswith("@g5") for k in broker.config("consumerOffset.json")["offsetTable"])


def test_clone_group_offset_online_source(broker):
    assert broker.ask(RequestCode.HEART_BEAT, body=HEARTBEAT_G1_PAYMENTS).code == 0
    # g1 is online and subscribes to Payments only: Orders is skipped unless offline
    ext = {"srcGroup": "g1", "destGroup": "g6", "topic": "Orders"}
    assert broker.ask(RequestCode.CLONE_GROUP_OFFSET, ext).code == 0
    broker.metadata.persist(force=True)
    assert "Orders@g6" not in broker.config("consumerOffset.json")["offsetTable"]
    assert broker.ask(RequestCode.CLONE_GROUP_OFFSET, {**ext, "offline": "true"}).code == 0
    assert broker.config("consumerOffset.json")["offsetTable"]["Orders@g6"] == {0: 3, 1: 1}
    reply = broker.ask(RequestCode.CLONE_GROUP_OFFSET, {"srcGroup": "g1"})
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "missing field destGroup")


def test_delete_topic_during_sends_and_pulls(broker):
    """Sends and pulls racing a topic's deletion: a send is stored before it (and deleted with the
    topic) or refused; a pull finds messages, nothing, or the topic gone; never an error, and no
    unit of the old topic survives nor is its queue directory recreated."""
    stop = threading.Event()
    sent: list[int] = []
    pulled: list[tuple[int, str | None]] = []
    pull = {"consumerGroup": "racer", "topic": "Orders", "queueId": "0", "queueOffset": "0", "maxMsgNums": "4",
            "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)), "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}

    def sender() -> None:
        while not stop.is_set():
            sent.append(broker.send("Orders").code)

    def puller() -> None:
        while not stop.is_set():
            reply = broker.ask(RequestCode.PULL_MESSAGE, pull, channel=("t", 2))
            pulled.append((reply.code, reply.remark))

    threads = [threading.Thread(target=sender), threading.Thread(target=puller)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while (ResponseCode.SUCCESS not in sent or not pulled) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert broker.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Orders"}).code == ResponseCode.SUCCESS
    n, m = len(sent), len(pulled)
    while (len(sent) < n + 20 or len(pulled) < m + 20) and time.monotonic() < deadline:
        time.sleep(0.001)
    stop.set()
    for thread in threads:
        thread.join()
    assert set(sent) <= {ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST}
    assert sent[-1] == ResponseCode.TOPIC_NOT_EXIST
    assert {code for code, _ in pulled} <= {ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
                                            ResponseCode.PULL_OFFSET_MOVED, ResponseCode.PULL_RETRY_IMMEDIATELY,
                                            ResponseCode.TOPIC_NOT_EXIST}, set(pulled)
    assert pulled[0][0] == ResponseCode.SUCCESS
    assert pulled[-1] == (ResponseCode.TOPIC_NOT_EXIST, "topic[Orders] not exist, apply first please!")
    assert cq_dirs(broker.root) == ["Payments"]
    assert broker.store.max_offset("Orders", 0) == 0 and broker.store.max_offset("Orders", 1) == 0


# =====================================================================================================
# name server
# =====================================================================================================
def run(coro_fn, timeout: float = 20):
    async def main_():
        return await asyncio.wait_for(coro_fn(), timeout)
    return asyncio.run(main_())


def test_properties_body_round_trip():
    text = properties_to_text({"b": True, "a": 5, "c": "x=y", "none": None})
    assert text == "a=5\nb=true\nc=x=y\n"
    assert parse_properties(text) == {"a": "5", "b": "true", "c": "x=y"}
    assert parse_properties("# comment\n! also\n  k1 = v1 \nk2:v2\nk3 v3\nk4=a\\\n   b\nk\\=5=\\u0041\\t\n") == {
        "k1": "v1 ", "k2": "v2", "k3": "v3", "k4": "ab", "k=5": "A\t"}


def test_namesrv_config_get_and_update():
    async def scenario() -> None:
        async with NameServer("127.0.0.1", 0, scan_interval_s=5.0) as ns, \
                RemotingClient(f"127.0.0.1:{ns.port}") as client:
            async def ask(code: int, body: bytes = b"") -> RemotingCommand:
                return await client.invoke(RemotingCommand.request(code, body=body), timeout=5)

            resp = await ask(RequestCode.GET_NAMESRV_CONFIG)
            assert resp.code == ResponseCode.SUCCESS
            assert resp.body.decode("utf-8") == (f"listenPort={ns.port}\norderMessageEnable=false\n"
                                                 "scanNotActiveBrokerInterval=5000\n")
            resp = await ask(RequestCode.UPDATE_NAMESRV_CONFIG, b"scanNotActiveBrokerInterval=2500\n"
                                                                b"orderMessageEnable = true\n")
            assert (resp.code, resp.remark) == (ResponseCode.SUCCESS, None)
            assert (ns.scan_interval_s, ns.order_message_enable) == (2.5, True)
            assert parse_properties((await ask(RequestCode.GET_NAMESRV_CONFIG)).body.decode()) == {
                "listenPort": str(ns.port), "orderMessageEnable": "true", "scanNotActiveBrokerInterval": "2500"}
            # refusals change nothing, not even the valid keys sent along
            for body, code, remark in [
                (b"kvConfigPath=/tmp/x\n", ResponseCode.NO_PERMISSION, "Can not update config in black list."),
                (b"orderMessageEnable=false\nfoo=1\nbar=2\n", ResponseCode.INVALID_PARAMETER,
                 "unknown name server config key(s): bar, foo (this name server has: listenPort, "
                 "orderMessageEnable, scanNotActiveBrokerInterval)"),
                (b"listenPort=1\n", ResponseCode.INVALID_PARAMETER,
                 "listenPort cannot be changed while the name server runs"),
                (b"scanNotActiveBrokerInterval=0\norderMessageEnable=yes\n", ResponseCode.INVALID_PARAMETER,
                 "orderMessageEnable: 'yes' is not true or false; "
                 "scanNotActiveBrokerInterval: '0' is not a positive number of milliseconds"),
                (b"k=\\u12\n", ResponseCode.SYSTEM_ERROR, "string2Properties error: line 1: malformed \\uxxxx encoding '\\\\u12'"),
            ]:
                resp = await ask(RequestCode.UPDATE_NAMESRV_CONFIG, body)
                assert (resp.code, resp.remark) == (code, remark)
            assert (ns.scan_interval_s, ns.order_message_enable) == (2.5, True)
            assert (await ask(RequestCode.UPDATE_NAMESRV_CONFIG)).code == ResponseCode.SUCCESS  # empty body
    run(scenario)


def _register(topics: dict[str, int], broker: str, addr: str, cluster: str) -> RemotingCommand:
    table = TopicConfigTable({name: TopicConfig(name, q, q, 6) for name, q in topics.items()})
    header = RegisterBrokerRequestHeader(broker_name=broker, broker_addr=addr, cluster_name=cluster,
                                         ha_server_addr="", broker_id=0)
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, header.to_ext(), RegisterBrokerBody(table).encode())


def test_namesrv_delete_topic_and_order_conf():
    async def scenario() -> None:
        async with NameServer("127.0.0.1", 0) as ns, RemotingClient(f"127.0.0.1:{ns.port}") as client:
            async def ask(cmd: RemotingCommand) -> RemotingCommand:
                return await client.invoke(cmd, timeout=5)

            await ask(_register({"T": 4, "U": 1}, "broker-a", "127.0.0.1:10911", "C1"))
            await ask(_register({"T": 2}, "broker-b", "127.0.0.1:20911", "C2"))
            resp = await ask(RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV,
                                                     {"topic": "T", "clusterName": "C1"}))
            assert (resp.code, resp.remark) == (ResponseCode.SUCCESS, None)
            route = TopicRouteData.decode((await ask(RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}))).body)
            assert [q.broker_name for q in route.queue_datas] == ["broker-b"]
            resp = await ask(RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"}))
            assert resp.code == ResponseCode.SUCCESS
            resp = await ask(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}))
            assert (resp.code, resp.remark) == (ResponseCode.TOPIC_NOT_EXIST,
                                                "No topic route info in name server for the topic: T")
            # orderMessageEnable: the route carries the ORDER_TOPIC_CONFIG kv of the topic
            await ask(RemotingCommand.request(RequestCode.PUT_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG",
                                                                          "key": "U", "value": "broker-a:1"}))
            get_u = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "U"})
            assert TopicRouteData.decode((await ask(get_u)).body).order_topic_conf is None
            ns.order_message_enable = True
            get_u = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "U"})
            assert TopicRouteData.decode((await ask(get_u)).body).order_topic_conf == "broker-a:1"
    run(scenario)


# =====================================================================================================
# a running broker, through rocketlake admin
# =====================================================================================================
def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _admin(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["admin", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def _group_and_config_verbs(admin, addr: str, ns_addr: str, capsys) -> None:
    """cloneGroupOffset, deleteSubGroup, getNamesrvConfig and updateNamesrvConfig through the CLI."""
    for qid, offset in ((0, 2), (1, 3)):
        ext = UpdateConsumerOffsetRequestHeader(consumer_group="CG_SRC", topic="Keep", queue_id=qid,
                                                commit_offset=offset).to_ext()
        assert admin.client.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, ext)).code == 0
    assert _admin(capsys, "cloneGroupOffset", "-n", ns_addr, "-s", "CG_SRC", "-d", "CG_DST", "-t", "Keep") == (
        0, "clone group offset success. srcGroup[CG_SRC], destGroup=[CG_DST], topic[Keep]\n", "")
    stats = admin.consumer_progress(addr, "CG_DST", "Keep")
    assert sorted((mq.queue_id, w.consumer_offset) for mq, w in stats.offset_table.items()) == [(0, 2), (1, 3)]
    assert _admin(capsys, "deleteSubGroup", "-n", ns_addr, "-b", addr, "-g", "CG_DST", "-r", "true") == (
        0, f"delete subscription group [CG_DST] from broker [{addr}] success.\n", "")
    stats = admin.consumer_progress(addr, "CG_DST", "Keep")  # no committed offset left: 0 everywhere
    assert sorted((mq.queue_id, w.consumer_offset) for mq, w in stats.offset_table.items()) == [(0, 0), (1, 0)]
    assert len(admin.consumer_progress(addr, "CG_SRC", "Keep").offset_table) == 2
    # the group's retry and DLQ topics go only when asked (mqadmin's -c mode always deletes them)
    for topic in ("%RETRY%CG_X", "%DLQ%CG_X"):
        admin.create_topic(addr, topic, queues=1)
        assert admin.wait_writable(topic)
    code, out, err = _admin(capsys, "deleteSubGroup", "-n", ns_addr, "-b", addr, "-g", "CG_X", "--deleteRetryAndDlq")
    assert (code, out, err) == (1, "", "error: --deleteRetryAndDlq needs -c: topics are deleted cluster-wide\n")
    assert _admin(capsys, "deleteSubGroup", "-n", ns_addr, "-c", "DefaultCluster", "-g", "CG_X") == (
        0, f"delete subscription group [CG_X] from broker [{addr}] in cluster [DefaultCluster] success.\n", "")
    assert {"%RETRY%CG_X", "%DLQ%CG_X"} <= set(admin.topic_list())
    code, out, err = _admin(capsys, "deleteSubGroup", "-n", ns_addr, "-c", "DefaultCluster", "-g", "CG_X",
                            "--deleteRetryAndDlq")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"delete subscription group [CG_X] from broker [{addr}] in cluster [DefaultCluster] success.",
        "delete topic [%RETRY%CG_X] from cluster [DefaultCluster] success.",
        "delete topic [%RETRY%CG_X] from NameServer success.",
        "delete topic [%DLQ%CG_X] from cluster [DefaultCluster] success.",
        "delete topic [%DLQ%CG_X] from NameServer success."]
    assert not {"%RETRY%CG_X", "%DLQ%CG_X"} & set(admin.topic_list())
    code, out, err = _admin(capsys, "getNamesrvConfig", "-n", ns_addr)
    port = ns_addr.rsplit(":", 1)[1]
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"============{ns_addr}============", f"{'listenPort':<50}=  {port}",
                                f"{'orderMessageEnable':<50}=  false", f"{'scanNotActiveBrokerInterval':<50}=  5000"]
    assert _admin(capsys, "updateNamesrvConfig", "-n", ns_addr, "-k", "orderMessageEnable", "-v", "true") == (
        0, f"update name server config success![{ns_addr}]\norderMessageEnable : true\n", "")
    assert admin.namesrv_config() == {ns_addr: {"listenPort": port, "orderMessageEnable": "true",
                                                "scanNotActiveBrokerInterval": "5000"}}
    code, out, err = _admin(capsys, "updateNamesrvConfig", "-n", ns_addr, "-k", "rocketmqHome", "-v", "/opt")
    assert (code, out) == (1, "")
    assert err == (f"error: update name server config on name server {ns_addr} failed: INVALID_PARAMETER(29) unknown "
                   "name server config key(s): rocketmqHome (this name server has: listenPort, orderMessageEnable, "
                   "scanNotActiveBrokerInterval)\n")


def test_delete_topic_on_running_broker(tmp_path, capsys, monkeypatch):
    from broker.client import Admin, Message, MQClientError, Producer, PullConsumer
    from tests.broker_harness import drain, start_broker, start_namesrv

    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    ns, ns_addr = start_namesrv(tmp_path)
    config = {"autoCreateTopicEnable": False}
    direct_send = {"a": "PG", "b": "Gone", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0", "i": ""}
    broker = start_broker(tmp_path / "store", ns_addr, config, processes=1)
    store = broker.store
    try:
        with Admin(ns_addr) as admin:
            for topic in ("Keep", "Gone"):
                admin.create_topic(broker.addr, topic, queues=2)
                assert admin.wait_writable(topic)
            with Producer("PG_DEL", ns_addr) as producer:
                for i in range(6):
                    for topic in ("Keep", "Gone"):
                        assert producer.send(Message(topic, b"%s-%d" % (topic.encode(), i))).status.name == "SEND_OK"
            with PullConsumer("CG_DEL", ns_addr) as consumer:
                _wait(lambda: len(drain(consumer, "Gone")) == 6, "the dispatcher to queue Gone")
            assert (store / "consumequeue" / "Gone").is_dir()

            _group_and_config_verbs(admin, broker.addr, ns_addr, capsys)

            # sends racing the deletion (the dispatcher process queues them meanwhile): each is stored
            # before it, and deleted with the topic, or refused with TOPIC_NOT_EXIST
            codes: list[int] = []
            stop = threading.Event()

            def sender() -> None:
                while not stop.is_set():
                    codes.append(admin.client.invoke(broker.addr, RemotingCommand.request(
                        RequestCode.SEND_MESSAGE_V2, direct_send, b"racing")).code)

            thread = threading.Thread(target=sender)
            thread.start()
            try:
                _wait(lambda: len(codes) >= 5, "the racing sends to start")
                code = main(["admin", "deleteTopic", "-n", ns_addr, "-c", "DefaultCluster", "-t", "Gone"])
                n = len(codes)
                _wait(lambda: len(codes) >= n + 5, "sends after the deletion")
            finally:
                stop.set()
                thread.join()
            assert set(codes) <= {ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST}
            assert codes[0] == ResponseCode.SUCCESS and codes[-1] == ResponseCode.TOPIC_NOT_EXIST
            out, err = capsys.readouterr()
            assert (code, err) == (0, "")
            assert out.splitlines() == ["delete topic [Gone] from cluster [DefaultCluster] success.",
                                        "delete topic [Gone] from NameServer success."]
            assert not (store / "consumequeue" / "Gone").exists()
            with pytest.raises(MQClientError) as exc:
                admin.route("Gone")
            assert exc.value.code == ResponseCode.TOPIC_NOT_EXIST
            # the broker re-registered without it: the route stays gone after the next registration too
            assert "Gone" not in admin.topic_list() and "Keep" in admin.topic_list()
            with Producer("PG_DEL2", ns_addr) as producer:
                with pytest.raises(MQClientError):
                    producer.send(Message("Gone", b"late"))
            resp = admin.client.invoke(broker.addr, RemotingCommand.request(RequestCode.SEND_MESSAGE_V2,
                                                                            direct_send, b"direct"))
            assert (resp.code, resp.remark) == (ResponseCode.TOPIC_NOT_EXIST,
                                                "topic[Gone] not exist, apply first please!")
            with Producer("PG_DEL3", ns_addr) as producer:
                assert producer.send(Message("Keep", b"after")).status.name == "SEND_OK"
            with PullConsumer("CG_DEL", ns_addr) as consumer:
                _wait(lambda: len(drain(consumer, "Keep")) == 7, "Keep to take the new message")
            assert not (store / "consumequeue" / "Gone").exists()
        assert broker.stop() == 0
        assert not (store / "consumequeue" / "Gone").exists()
        verified = verify_store(store)
        assert verified.ok, verified.summary()
        broker = start_broker(store, ns_addr, config, port=broker.port, processes=1)
        with Admin(ns_addr) as admin:
            assert admin.wait_writable("Keep")
            with PullConsumer("CG_DEL", ns_addr) as consumer:
                assert len(drain(consumer, "Keep")) == 7
            with pytest.raises(MQClientError):
                admin.route("Gone")
        assert not (store / "consumequeue" / "Gone").exists()
        assert "Gone" not in read_config_json(store / "config" / "topics.json").data["topicConfigTable"]
        log = broker.log.read_text()
        assert "Traceback" not in log
    finally:
        broker.stop()
        ns.send_signal(signal.SIGTERM)
        ns.wait(10)
