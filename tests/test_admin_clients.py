"""Admin requests about connected clients (203, 204, 307, 309, 222, 223) and the broker → client
requests behind them: handlers on a BrokerCore with a recording client caller, the cross-process
call plumbing, then a real broker (2 network processes) with our Python consumer (and the C++ one)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from concurrent.futures import Future

import pytest

from broker.client import Admin, Message, MQClientError, Producer, PushConsumer
from broker.remoting.bodies import (
    CMResult,
    ConsumeFromWhere,
    ConsumeMessageDirectlyResult,
    ConsumerConnection,
    GetConsumerStatusBody,
    MessageQueue,
    ProducerConnection,
    ResetOffsetBody,
    ResetOffsetBodyForC,
)
from broker.remoting.codes import DEFAULT_VERSION, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.transport import RemotingServer, SyncRemotingClient
from broker.server.client_calls import (
    ClientCallError,
    ClientCallTimeout,
    ClientRequest,
    ClientResponse,
    IpcClientCaller,
    call_client,
)
from broker.engine.message_store import MessageStore
from broker.server.metadata import BrokerMetadata
from broker.engine.store_settings import StoreSettings
from broker.server.processors import BrokerCore, Reply, Request
from broker.store.message_id import encode_offset_msg_id
from broker.store.hosts import Host
from tests.broker_harness import cluster, live_group_pids
from tests.store_harness import DispatchedStore
from tests.cpp_client import ClientProcesses, create_routed_topic, wait_for

T0 = 1_700_000_000_000
GROUP = "CG_ADMIN"
TOPIC = "AdminTopic"
CONSUMER_HB = {"clientID": "10.0.0.5@111#DEFAULT", "producerDataSet": [{"groupName": "PG_ADMIN"}],
               "consumerDataSet": [{"groupName": GROUP, "consumeType": "CONSUME_PASSIVELY",
                                    "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                                    "unitMode": False,
                                    "subscriptionDataSet": [{"topic": TOPIC, "subString": "TagA || TagB",
                                                             "tagsSet": ["TagA", "TagB"], "codeSet": [],
                                                             "subVersion": 7, "expressionType": "TAG",
                                                             "classFilterMode": False}]}]}


# =====================================================================================================
# handlers (in-process BrokerCore, recording caller)
# =====================================================================================================
class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class RecordingCaller:
    """Stands in for the network processes: records each call, answers from ``answers[code]``
    (a ClientResponse, or an exception to fail the call with)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ClientRequest]] = []
        self.answers: dict[int, object] = {}

    def call(self, channel, request: ClientRequest) -> Future:
        self.calls.append((channel, request))
        future: Future = Future()
        answer = self.answers.get(request.code, ClientResponse(ResponseCode.SUCCESS))
        if callable(answer) and not isinstance(answer, ClientResponse):
            answer = answer(channel, request)
        if isinstance(answer, Exception):
            future.set_exception(answer)
        else:
            future.set_result(None if request.oneway else answer)
        return future


@pytest.fixture()
def core(tmp_path):
    """A BrokerCore over a store with its dispatcher process (tests/store_harness.py)."""
    clock = Clock()
    store = DispatchedStore(tmp_path / "store", StoreSettings(segment_bytes=1 << 20, cq_file_bytes=20 * 100,
                                                              index_slots=64, index_entries=256,
                                                              fsync_metadata=False),
                            clock=clock)
    store.open()
    core = BrokerCore(store, BrokerMetadata(store), cluster_name="DefaultCluster", broker_name="broker-a",
                      broker_addr="127.0.0.1:10911", max_message_size=4 << 20)
    core.admin_clients.caller = RecordingCaller()
    core.clock = clock
    yield core
    core.metadata.close()
    store.close()


def heartbeat(core: BrokerCore, channel, body: dict = CONSUMER_HB, language: str = "JAVA", version: int = 409,
              peer: str = "10.0.0.5:50001") -> None:
    reply = core.process(Request(code=RequestCode.HEART_BEAT, ext={}, body=json.dumps(body).encode(),
                                 channel=channel, peer=peer, language=language, version=version))
    assert reply.code == ResponseCode.SUCCESS


def send(core: BrokerCore, body: bytes, queue_id: int = 0) -> Reply:
    ext = {"a": "PG_ADMIN", "b": TOPIC, "c": "TBW102", "d": "2", "e": str(queue_id), "f": "0", "g": "0", "h": "0",
           "i": "TAGS\x01TagA\x02", "j": "0", "k": "false", "m": "false"}
    reply = core.process(Request(code=RequestCode.SEND_MESSAGE_V2, ext=ext, body=body, peer="10.0.0.9:1"))
    assert reply.code == ResponseCode.SUCCESS, reply
    return reply


def finish(reply: Reply) -> Reply:
    """A deferred reply's final value (the IPC server would send it when the future completes)."""
    assert reply.deferred is not None, reply
    return reply.deferred.result(5)


def test_consumer_and_producer_connection_lists(core):
    heartbeat(core, ("net", 1))
    reply = core.process(Request(code=RequestCode.GET_CONSUMER_CONNECTION_LIST, ext={"consumerGroup": GROUP}))
    assert reply.code == ResponseCode.SUCCESS
    assert json.loads(reply.body) == {
        "connectionSet": [{"clientAddr": "10.0.0.5:50001", "clientId": "10.0.0.5@111#DEFAULT", "language": "JAVA",
                           "version": 409}],
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
        "messageModel": "CLUSTERING",
        "subscriptionTable": {TOPIC: {"classFilterMode": False, "codeSet": [], "expressionType": "TAG",
                                      "subString": "TagA || TagB", "subVersion": 7, "tagsSet": ["TagA", "TagB"],
                                      "topic": TOPIC}}}
    decoded = ConsumerConnection.decode(reply.body)
    assert decoded.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    assert decoded.subscription_table[TOPIC].tags_set == ["TagA", "TagB"]

    reply = core.process(Request(code=RequestCode.GET_PRODUCER_CONNECTION_LIST, ext={"producerGroup": "PG_ADMIN"}))
    assert (reply.code, json.loads(reply.body)) == (ResponseCode.SUCCESS, {"connectionSet": [
        {"clientAddr": "10.0.0.5:50001", "clientId": "10.0.0.5@111#DEFAULT", "language": "JAVA", "version": 409}]})
    assert ProducerConnection.decode(reply.body).connection_set[0].client_addr == "10.0.0.5:50001"

    reply = core.process(Request(code=RequestCode.GET_CONSUMER_CONNECTION_LIST, ext={"consumerGroup": "nobody"}))
    assert (reply.code, reply.remark) == (ResponseCode.CONSUMER_NOT_ONLINE, "the consumer group[nobody] not online")
    reply = core.process(Request(code=RequestCode.GET_PRODUCER_CONNECTION_LIST, ext={"producerGroup": "nobody"}))
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "the producer group[nobody] not exist")
    reply = core.process(Request(code=RequestCode.GET_CONSUMER_CONNECTION_LIST, ext={}))
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "missing field consumerGroup")
    core.channel_closed(("net", 1))
    reply = core.process(Request(code=RequestCode.GET_CONSUMER_CONNECTION_LIST, ext={"consumerGroup": GROUP}))
    assert reply.code == ResponseCode.CONSUMER_NOT_ONLINE


def test_running_info_is_forwarded_to_the_named_client_and_relayed(core):
    caller: RecordingCaller = core.admin_clients.caller
    heartbeat(core, ("net", 1))
    caller.answers[RequestCode.GET_CONSUMER_RUNNING_INFO] = ClientResponse(0, None, {"x": "1"}, b'{"properties":{}}')
    ext = {"consumerGroup": GROUP, "clientId": "10.0.0.5@111#DEFAULT", "jstackEnable": "false"}
    reply = core.process(Request(code=RequestCode.GET_CONSUMER_RUNNING_INFO, ext=ext))
    final = finish(reply)
    assert (final.code, final.remark, final.ext, final.body) == (0, None, {"x": "1"}, b'{"properties":{}}')
    channel, request = caller.calls[-1]
    assert (channel, request.code, request.ext, request.body, request.timeout_s, request.oneway) == \
        (("net", 1), RequestCode.GET_CONSUMER_RUNNING_INFO, ext, b"", 10.0, False)

    # the client's own error answer is relayed as it is
    caller.answers[RequestCode.GET_CONSUMER_RUNNING_INFO] = ClientResponse(1, "The Consumer Group <x> not exist")
    final = finish(core.process(Request(code=RequestCode.GET_CONSUMER_RUNNING_INFO, ext=ext)))
    assert (final.code, final.remark) == (1, "The Consumer Group <x> not exist")
    # timeouts and failed sends, with Apache's codes and remarks
    caller.answers[RequestCode.GET_CONSUMER_RUNNING_INFO] = ClientCallTimeout("no response within 10s")
    final = finish(core.process(Request(code=RequestCode.GET_CONSUMER_RUNNING_INFO, ext=ext)))
    assert (final.code, final.remark) == (
        ResponseCode.CONSUME_MSG_TIMEOUT, f"consumer <{GROUP}> <10.0.0.5@111#DEFAULT> Timeout: no response within 10s")
    caller.answers[RequestCode.GET_CONSUMER_RUNNING_INFO] = ClientCallError("the client's connection is closed")
    final = finish(core.process(Request(code=RequestCode.GET_CONSUMER_RUNNING_INFO, ext=ext)))
    assert (final.code, final.remark) == (
        ResponseCode.SYSTEM_ERROR,
        f"invoke consumer <{GROUP}> <10.0.0.5@111#DEFAULT> Exception: the client's connection is closed")

    calls = len(caller.calls)
    reply = core.process(Request(code=RequestCode.GET_CONSUMER_RUNNING_INFO,
                                 ext={"consumerGroup": GROUP, "clientId": "someone-else"}))
    assert (reply.code, reply.remark, reply.deferred) == (
        ResponseCode.SYSTEM_ERROR, f"The Consumer <{GROUP}> <someone-else> not online", None)
    heartbeat(core, ("net", 2), dict(CONSUMER_HB, clientID="old@1#DEFAULT"), version=50)
    reply = core.process(Request(code=RequestCode.GET_CONSUMER_RUNNING_INFO,
                                 ext={"consumerGroup": GROUP, "clientId": "old@1#DEFAULT"}))
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "The Consumer <old@1#DEFAULT> Version <50> too "
                                                                     "low to finish, please upgrade it to V3_1_8_SNAPSHOT")
    assert len(caller.calls) == calls  # nobody was asked


def test_consume_message_directly_sends_the_stored_message(core):
    caller: RecordingCaller = core.admin_clients.caller
    heartbeat(core, ("net", 1))
    sent = send(core, b"direct body")
    offset_msg_id = sent.ext["msgId"]
    record = core.store.read_record_bytes(0)
    result = ConsumeMessageDirectlyResult(CMResult.CR_SUCCESS, spent_time_mills=3)
    caller.answers[RequestCode.CONSUME_MESSAGE_DIRECTLY] = ClientResponse(0, None, {}, result.encode())
    ext = {"consumerGroup": GROUP, "clientId": "10.0.0.5@111#DEFAULT", "msgId": offset_msg_id}
    final = finish(core.process(Request(code=RequestCode.CONSUME_MESSAGE_DIRECTLY, ext=ext)))
    assert (final.code, json.loads(final.body)) == (0, {"autoCommit": True, "consumeResult": "CR_SUCCESS",
                                                        "order": False, "spentTimeMills": 3})
    _, request = caller.calls[-1]
    assert request.code == RequestCode.CONSUME_MESSAGE_DIRECTLY
    assert request.ext == {**ext, "brokerName": "broker-a"}
    assert request.body == record and b"direct body" in record

    missing = encode_offset_msg_id(Host.parse("127.0.0.1:10911"), 1 << 30)
    reply = core.process(Request(code=RequestCode.CONSUME_MESSAGE_DIRECTLY, ext={**ext, "msgId": missing}))
    assert reply.code == ResponseCode.SYSTEM_ERROR and reply.remark.startswith(
        f"can not find message by the msgId {missing}: ")
    reply = core.process(Request(code=RequestCode.CONSUME_MESSAGE_DIRECTLY, ext={**ext, "msgId": "zz"}))
    assert reply.code == ResponseCode.SYSTEM_ERROR and "is not hex" in reply.remark
    reply = core.process(Request(code=RequestCode.CONSUME_MESSAGE_DIRECTLY, ext={"consumerGroup": GROUP}))
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "msgId (the offset message id) is required")


def _reset(core: BrokerCore, timestamp: int, force: bool = True, language: str = "JAVA") -> Reply:
    return core.process(Request(code=RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, language=language, ext={
        "group": GROUP, "topic": TOPIC, "timestamp": str(timestamp), "isForce": str(force).lower()}))


def test_reset_offset_by_time(core):
    caller: RecordingCaller = core.admin_clients.caller
    for i in range(6):  # queue 0: stored at T0+0, +10, … +50 ms
        core.clock.now = T0 + 10 * i
        send(core, f"m{i}".encode())
    core.store.caught_up()
    assert core.store.max_offset(TOPIC, 0) == 6
    assert core.metadata.topics.get(TOPIC).write_queue_nums == 2

    reply = _reset(core, T0 + 25)
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, f"THe consumer group <{GROUP}> not exist")
    core.metadata.consumer_offsets.commit_offset(GROUP, TOPIC, 0, 5)
    core.metadata.consumer_offsets.commit_offset(GROUP, TOPIC, 1, 0)
    reply = _reset(core, T0 + 25)  # nobody online: Apache answers 206 and changes nothing
    assert (reply.code, reply.remark) == (ResponseCode.CONSUMER_NOT_ONLINE, "Consumer not online, so can not reset "
                                          f"offset, Group: {GROUP} Topic: {TOPIC} Timestamp: {T0 + 25}")
    assert core.metadata.consumer_offsets.query_offset(GROUP, TOPIC, 0) == 5

    heartbeat(core, ("net", 1))
    heartbeat(core, ("net", 2), dict(CONSUMER_HB, clientID="10.0.0.6@222#DEFAULT"), language="CPP", version=63)
    q0, q1 = MessageQueue(TOPIC, "broker-a", 0), MessageQueue(TOPIC, "broker-a", 1)
    reply = _reset(core, T0 + 25)  # first message stored at or after T0+25 is m3
    assert reply.code == ResponseCode.SUCCESS
    assert reply.body == (b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"AdminTopic"}:3,'
                          b'{"brokerName":"broker-a","queueId":1,"topic":"AdminTopic"}:0}}')
    assert ResetOffsetBody.decode(reply.body).offset_table == {q0: 3, q1: 0}
    assert core.metadata.consumer_offsets.offsets_for(GROUP, TOPIC) == {0: 3, 1: 0}
    resets = caller.calls[-2:]
    assert sorted(ch for ch, _ in resets) == [("net", 1), ("net", 2)]
    for _, request in resets:
        assert (request.code, request.oneway, request.ext) == (
            RequestCode.RESET_CONSUMER_CLIENT_OFFSET, True,
            {"group": GROUP, "topic": TOPIC, "timestamp": str(T0 + 25), "isForce": "false"})
        assert ResetOffsetBody.decode(request.body).offset_table == {q0: 3, q1: 0}

    # not forced: a later time never moves a group forward (queue 0 stays at 3)
    reply = _reset(core, T0 + 45, force=False)
    assert ResetOffsetBody.decode(reply.body).offset_table == {q0: 3, q1: 0}
    # -1 = the end of every queue
    reply = _reset(core, -1)
    assert ResetOffsetBody.decode(reply.body).offset_table == {q0: 6, q1: 0}
    # an admin speaking C++ makes Apache send the C++ body to the clients
    _reset(core, T0, language="CPP")
    assert json.loads(caller.calls[-1][1].body) == {"offsetTable": [
        {"brokerName": "broker-a", "offset": 0, "queueId": 0, "topic": TOPIC},
        {"brokerName": "broker-a", "offset": 0, "queueId": 1, "topic": TOPIC}]}
    assert ResetOffsetBodyForC.decode(caller.calls[-1][1].body).offset_table == {q0: 0, q1: 0}

    reply = core.process(Request(code=RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext={
        "group": GROUP, "topic": "NoSuchTopic", "timestamp": "0", "isForce": "true"}))
    assert (reply.code, reply.remark) == (
        ResponseCode.SYSTEM_ERROR, "[reset-offset] reset offset failed, no topic in this broker. topic=NoSuchTopic")


def test_consumer_status_gathers_each_clients_offsets(core):
    caller: RecordingCaller = core.admin_clients.caller
    q0 = MessageQueue(TOPIC, "broker-a", 0)
    reply = core.process(Request(code=RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                                 ext={"topic": TOPIC, "group": GROUP}))
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR,
                                          f"No Any Consumer online in the consumer group: [{GROUP}]")
    heartbeat(core, ("net", 1))
    heartbeat(core, ("net", 2), dict(CONSUMER_HB, clientID="b@2#DEFAULT"))
    heartbeat(core, ("net", 3), dict(CONSUMER_HB, clientID="c@3#DEFAULT"))

    def answer(channel, request):
        if channel == ("net", 3):
            return ClientCallTimeout("no answer")  # left out of the table, as Apache does
        offset = {("net", 1): 4, ("net", 2): 9}[channel]
        return ClientResponse(0, None, {}, GetConsumerStatusBody(message_queue_table={q0: offset}).encode())

    caller.answers[RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT] = answer
    final = finish(core.process(Request(code=RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                                        ext={"topic": TOPIC, "group": GROUP})))
    assert final.code == ResponseCode.SUCCESS
    assert final.body == (b'{"consumerTable":{"10.0.0.5@111#DEFAULT":{{"brokerName":"broker-a","queueId":0,'
                          b'"topic":"AdminTopic"}:4},"b@2#DEFAULT":{{"brokerName":"broker-a","queueId":0,'
                          b'"topic":"AdminTopic"}:9}},"messageQueueTable":{}}')
    assert [(ch, r.code, r.ext, r.timeout_s) for ch, r in caller.calls] == [
        (ch, RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, {"topic": TOPIC, "group": GROUP}, 5.0)
        for ch in [("net", 1), ("net", 2), ("net", 3)]]
    caller.calls.clear()
    final = finish(core.process(Request(code=RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                                        ext={"topic": TOPIC, "group": GROUP, "clientAddr": "b@2#DEFAULT"})))
    assert GetConsumerStatusBody.decode(final.body).consumer_table == {"b@2#DEFAULT": {q0: 9}}
    assert [ch for ch, _ in caller.calls] == [("net", 2)]


def test_without_a_network_layer_calls_fail_cleanly(tmp_path):
    store = MessageStore(tmp_path / "s", StoreSettings(segment_bytes=1 << 20, cq_file_bytes=2000, index_slots=64,
                                                       index_entries=256, fsync_metadata=False))
    store.open()
    try:
        core = BrokerCore(store, BrokerMetadata(store), cluster_name="c", broker_name="b",
                          broker_addr="127.0.0.1:10911", max_message_size=1 << 20)
        heartbeat(core, ("net", 1))
        final = finish(core.process(Request(code=RequestCode.GET_CONSUMER_RUNNING_INFO,
                                            ext={"consumerGroup": GROUP, "clientId": "10.0.0.5@111#DEFAULT"})))
        assert (final.code, final.remark) == (ResponseCode.SYSTEM_ERROR, f"invoke consumer <{GROUP}> "
                                              "<10.0.0.5@111#DEFAULT> Exception: no connection to clients in this broker")
    finally:
        store.close()


# =====================================================================================================
# the cross-process plumbing
# =====================================================================================================
def test_ipc_caller_routes_by_pid_and_fails_cleanly():
    sent = []
    caller = IpcClientCaller(lambda pid, event: (sent.append((pid, event)), pid == 7)[1])
    request = ClientRequest(RequestCode.GET_CONSUMER_RUNNING_INFO, {"a": "b"}, b"", timeout_s=30)
    ok = caller.call((7, 12), request)
    (pid, (kind, call_id, serial, req)), = sent
    assert (pid, kind, serial, req) == (7, "call", 12, request)
    caller.on_reply(call_id, ("ok", ClientResponse(0, None, {}, b"x")))
    assert ok.result(1) == ClientResponse(0, None, {}, b"x")
    caller.on_reply(call_id, ("ok", None))  # a late duplicate changes nothing

    gone = caller.call((8, 1), request)  # no network process 8
    with pytest.raises(ClientCallError, match="network process 8 holding the connection is gone"):
        gone.result(1)
    pending = caller.call((7, 13), request)
    caller.process_gone(7)
    with pytest.raises(ClientCallError, match="network process 7"):
        pending.result(1)
    silent = caller.call((7, 14), ClientRequest(1, timeout_s=0.0))  # guard fires GUARD_MARGIN_S later
    with pytest.raises(ClientCallTimeout, match="no answer through network process 7"):
        silent.result(10)
    with pytest.raises(ClientCallError, match="has no network process"):
        caller.call("opaque", request).result(1)


def test_call_client_matches_by_opaque_and_times_out():
    async def main():
        async def handler(cmd, conn):  # a "client" that answers 307 and never answers 221
            if cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
                return cmd.response(ResponseCode.SUCCESS, "fine", {"k": "v"}, b"body-" + cmd.body)
            await asyncio.sleep(30)

        accepted: asyncio.Queue = asyncio.Queue()
        server = RemotingServer("127.0.0.1", 0, lambda cmd, conn: asyncio.sleep(0), on_connection=accepted.put_nowait)
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        from broker.remoting.transport import Connection
        client = Connection(reader, writer, handler, name="fake-client")
        runner = asyncio.ensure_future(client.run())
        broker_side = await asyncio.wait_for(accepted.get(), 5)
        answers = await asyncio.gather(*[call_client(broker_side, ClientRequest(
            RequestCode.GET_CONSUMER_RUNNING_INFO, {}, str(i).encode(), 5)) for i in range(5)])
        assert answers == [("ok", ClientResponse(0, "fine", {"k": "v"}, f"body-{i}".encode())) for i in range(5)]
        kind, text = await call_client(broker_side, ClientRequest(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT,
                                                                  {}, b"", 0.2))
        assert kind == "timeout" and "GET_CONSUMER_STATUS_FROM_CLIENT" in text
        assert await call_client(None, ClientRequest(1)) == ("error", "the client's connection is closed")
        client.close()
        await broker_side.wait_closed()
        assert (await call_client(broker_side, ClientRequest(1)))[0] == "error"
        runner.cancel()
        await server.stop()

    asyncio.run(main())


# =====================================================================================================
# a real broker (2 network processes) and our Python push consumer
# =====================================================================================================
LIVE_GROUP = "CG_LIVE"
LIVE_TOPIC = "LiveAdminTopic"


def _socket_inode(local_port: int, remote_port: int) -> int | None:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if (int(parts[1].rsplit(":", 1)[1], 16), int(parts[2].rsplit(":", 1)[1], 16)) == (local_port,
                                                                                                 remote_port):
                    return int(parts[9])
    return None


def serving_pid(broker, client_port: int) -> int:
    """Which broker process holds the broker's end of the connection from ``client_port``."""
    inode = _socket_inode(broker.port, client_port)
    assert inode is not None, f"no connection from port {client_port}"
    for pid in live_group_pids(broker.proc.pid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no broker process holds socket {inode}")


def _local_port(admin: Admin, addr: str) -> int:
    return int(admin.client._remoting._connections[addr].local.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Broker + a push consumer of LIVE_GROUP that has consumed m0..m9 (m5 stored strictly later
    than m4) + an admin whose connection is served by the other network process."""
    tmp = tmp_path_factory.mktemp("admin_clients")
    with cluster(tmp) as broker:
        admins: list[Admin] = []
        received: list[bytes] = []
        fail_direct = {"on": False}

        def listener(msg):
            if fail_direct["on"]:
                raise RuntimeError(f"refusing {msg.payload.decode()}")
            received.append(msg.payload)

        setup = Admin(broker.namesrv)
        admins.append(setup)
        setup.create_topic(broker.addr, LIVE_TOPIC, queues=1)
        assert setup.wait_routed(LIVE_TOPIC, ["broker-a"], 1, 1, 6)
        consumer = PushConsumer(LIVE_GROUP, broker.namesrv, listener, topic=LIVE_TOPIC,
                                consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, instance_name="live")
        consumer.start()
        records = {}
        with Producer("PG_LIVE", broker.namesrv) as producer:
            for i in range(5):
                records[i] = producer.send(Message(LIVE_TOPIC, f"m{i}".encode()))
            wait_for("m0..m4 consumed", lambda: len(received) >= 5, 30)
            wait_for("a later millisecond", lambda: time.time() * 1000 > T_LAST(consumer, broker) + 1, 5, 0.001)
            for i in range(5, 10):
                records[i] = producer.send(Message(LIVE_TOPIC, f"m{i}".encode()))
            wait_for("m0..m9 consumed", lambda: len(received) >= 10, 30)
        assert received == [f"m{i}".encode() for i in range(10)]
        consumer_port = int(setup.consumer_connection(LIVE_GROUP).connection_set[0].client_addr.rsplit(":", 1)[1])
        consumer_pid = serving_pid(broker, consumer_port)
        far = None
        for _ in range(40):  # SO_REUSEPORT spreads new connections over the network processes
            candidate = Admin(broker.namesrv)
            admins.append(candidate)
            candidate.consumer_connection(LIVE_GROUP, broker.addr)
            if serving_pid(broker, _local_port(candidate, broker.addr)) != consumer_pid:
                far = candidate
                break
        assert far is not None, "every admin connection landed on the consumer's network process"
        try:
            yield broker, consumer, far, received, records, fail_direct
        finally:
            consumer.shutdown()
            for a in admins:
                a.close()


def T_LAST(consumer, broker) -> int:
    """The newest store timestamp the consumer's queue holds (its last message)."""
    from broker.client import PullConsumer

    with PullConsumer("CG_PEEK", broker.namesrv) as peek:
        mq = peek.queues(LIVE_TOPIC)[0]
        return max(m.store_timestamp for m in peek.pull(mq, 0, 32).messages)


def test_live_consumer_connection(live):
    broker, consumer, admin, *_ = live
    conn = admin.consumer_connection(LIVE_GROUP, broker.addr)
    (c,) = conn.connection_set
    assert (c.client_id, c.language, c.version) == (consumer.client.client_id, "PYTHON", DEFAULT_VERSION)
    assert c.client_addr.startswith("127.0.0.1:")
    assert sorted(conn.subscription_table) == ["%RETRY%CG_LIVE", LIVE_TOPIC]
    assert (conn.consume_from_where, conn.message_model.name, conn.consume_type.name) == (
        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, "CLUSTERING", "CONSUME_PASSIVELY")
    with pytest.raises(MQClientError) as err:
        admin.consumer_connection("CG_NOBODY", broker.addr)
    assert err.value.code == ResponseCode.CONSUMER_NOT_ONLINE and "the consumer group[CG_NOBODY] not online" in str(
        err.value)


def test_live_producer_connection(live):
    broker, _, admin, *_ = live
    hb = {"clientID": "127.0.0.1@4242#P", "producerDataSet": [{"groupName": "PG_RAW"}], "consumerDataSet": []}
    with SyncRemotingClient(broker.addr) as raw:
        assert raw.invoke(RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(hb).encode())).code == 0
        (c,) = admin.producer_connection("PG_RAW", LIVE_TOPIC).connection_set
        assert (c.client_id, c.language) == ("127.0.0.1@4242#P", "PYTHON")
    with pytest.raises(MQClientError, match=r"the producer group\[PG_NONE\] not exist"):
        admin.producer_connection("PG_NONE", LIVE_TOPIC)


def test_python_producer_is_listed_while_it_runs(live):
    """Our Producer heartbeats a broker on first contact (and every 30 s) and unregisters on
    shutdown, as Apache's client does: mqadmin producerConnection lists it only meanwhile."""
    broker, _, admin, *_ = live
    topic = "LiveProducerTopic"  # not the module's topic: the other live tests count its messages
    admin.create_topic(broker.addr, topic, queues=1)
    assert admin.wait_routed(topic, ["broker-a"], 1, 1, 6)
    producer = Producer("PG_PY_LIVE", broker.namesrv).start()
    try:
        producer.send(Message(topic, b"hello"))
        (c,) = admin.producer_connection("PG_PY_LIVE", topic).connection_set
        assert (c.client_id, c.language) == (producer.client.client_id, "PYTHON")
    finally:
        producer.shutdown()
    with pytest.raises(MQClientError, match=r"the producer group\[PG_PY_LIVE\] not exist"):
        admin.producer_connection("PG_PY_LIVE", topic)


def test_live_running_info_relayed_from_the_client(live):
    broker, consumer, admin, *_ = live
    info = admin.consumer_running_info(LIVE_GROUP, consumer.client.client_id)
    q = MessageQueue(LIVE_TOPIC, "broker-a", 0)
    retry = MessageQueue("%RETRY%CG_LIVE", "broker-a", 0)
    assert sorted(info.mq_table) == [retry, q]
    wait_for("the in-memory offset", lambda: consumer.consumer_offsets(LIVE_TOPIC).get(q) == 10, 10)
    info = admin.consumer_running_info(LIVE_GROUP, consumer.client.client_id)
    assert info.mq_table[q].commit_offset == 10 and info.mq_table[q].last_consume_timestamp > 0
    props = info.properties
    assert (props["consumerGroup"], props["PROP_CONSUME_TYPE"], props["PROP_CONSUMEORDERLY"],
            props["PROP_NAMESERVER_ADDR"], props["consumeFromWhere"]) == (
        LIVE_GROUP, "CONSUME_PASSIVELY", "false", broker.namesrv, "CONSUME_FROM_FIRST_OFFSET")
    assert sorted(s.topic for s in info.subscription_set) == ["%RETRY%CG_LIVE", LIVE_TOPIC]
    assert info.status_table[LIVE_TOPIC].consume_failed_msgs == 0 and info.status_table[LIVE_TOPIC].pull_tps > 0
    assert info.jstack is None
    dumped = admin.consumer_running_info(LIVE_GROUP, consumer.client.client_id, jstack=True)
    assert '"consumer-background"' in dumped.jstack
    with pytest.raises(MQClientError) as err:
        admin.consumer_running_info(LIVE_GROUP, "127.0.0.1@1#nobody")
    assert err.value.code == ResponseCode.SYSTEM_ERROR
    assert f"The Consumer <{LIVE_GROUP}> <127.0.0.1@1#nobody> not online" in str(err.value)


def test_live_consumer_status(live):
    broker, consumer, admin, *_ = live
    q = MessageQueue(LIVE_TOPIC, "broker-a", 0)
    wait_for("the in-memory offset", lambda: consumer.consumer_offsets(LIVE_TOPIC).get(q) == 10, 10)
    assert admin.consumer_status(LIVE_GROUP, LIVE_TOPIC) == {consumer.client.client_id: {q: 10}}
    assert admin.consumer_status(LIVE_GROUP, LIVE_TOPIC, "someone-else") == {}


def test_live_consume_message_directly(live):
    broker, consumer, admin, received, records, fail_direct = live
    before = len(received)
    result = admin.consume_message_directly(LIVE_GROUP, consumer.client.client_id, records[3].offset_msg_id)
    assert (result.consume_result, result.order, result.auto_commit, result.remark) == (
        CMResult.CR_SUCCESS, False, True, None)
    assert received[before:] == [b"m3"]
    fail_direct["on"] = True
    try:
        result = admin.consume_message_directly(LIVE_GROUP, consumer.client.client_id, records[7].offset_msg_id)
    finally:
        fail_direct["on"] = False
    assert (result.consume_result, result.remark) == (CMResult.CR_THROW_EXCEPTION, "RuntimeError: refusing m7")
    assert received[before:] == [b"m3"]


def test_live_reset_offset_by_time_reconsumes(live):
    broker, consumer, admin, received, records, _ = live
    q = MessageQueue(LIVE_TOPIC, "broker-a", 0)
    wait_for("m0..m9 committed", lambda: admin.consumer_progress(broker.addr, LIVE_GROUP, LIVE_TOPIC)
             .offset_table[q].consumer_offset == 10, 15)
    from broker.client import PullConsumer

    with PullConsumer("CG_PEEK2", broker.namesrv) as peek:
        m5 = peek.pull(q, 5, 1).messages[0]
    assert m5.payload == b"m5"
    before = len(received)
    assert admin.reset_offset_by_time(LIVE_GROUP, LIVE_TOPIC, m5.store_timestamp) == {q: 5}
    assert admin.consumer_progress(broker.addr, LIVE_GROUP, LIVE_TOPIC).offset_table[q].consumer_offset == 5
    wait_for("m5..m9 again", lambda: len(received) >= before + 5, 20)
    wait_for("the consumer at 10 again", lambda: consumer.consumer_offsets(LIVE_TOPIC).get(q) == 10, 10)
    assert received[before:] == [b"m5", b"m6", b"m7", b"m8", b"m9"]


def test_live_admin_cli(live, capsys, monkeypatch):
    from broker.cli import main

    broker, consumer, _, received, records, _ = live
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    cid = consumer.client.client_id
    q = MessageQueue(LIVE_TOPIC, "broker-a", 0)
    wait_for("the in-memory offset", lambda: consumer.consumer_offsets(LIVE_TOPIC).get(q) == 10, 10)

    def run(*argv: str) -> str:
        code = main(["admin", *argv, "-n", broker.namesrv])
        out, err = capsys.readouterr()
        assert (code, err) == (0, ""), err
        return out

    out = run("consumerConnection", "-g", LIVE_GROUP)
    assert f"001  {cid:<40} 127.0.0.1:" in out and "PYTHON    V4_9_4" in out
    assert f"002  Topic: {LIVE_TOPIC:<40} SubExpression: *" in out and "ConsumeType: CONSUME_PASSIVELY" in out
    out = run("consumerStatus", "-g", LIVE_GROUP)
    assert f"#ClientId: {cid}" in out and f"{'consumerGroup':<40}: {LIVE_GROUP}" in out
    assert f"{LIVE_TOPIC:<32}  {'broker-a':<32}  {0:<4}  10" in out
    out = run("getConsumerStatus", "-g", LIVE_GROUP, "-t", LIVE_TOPIC)
    assert out.splitlines()[2] == f"{cid:<50}  {'broker-a':<15}  {0:<15}  10"
    before = len(received)
    out = run("consumeMessageDirectly", "-g", LIVE_GROUP, "-d", cid, "-i", records[1].offset_msg_id)
    assert "consumeResult=CR_SUCCESS" in out and received[before:] == [b"m1"]
    out = run("resetOffsetByTime", "-g", LIVE_GROUP, "-t", LIVE_TOPIC, "-s", "-1")
    assert out.splitlines()[-1] == f"{'broker-a':<40}  {0:<40}  10"
    code = main(["admin", "consumerStatus", "-g", LIVE_GROUP, "-i", "nobody@1", "-n", broker.namesrv])
    out, err = capsys.readouterr()
    assert code == 1 and f"The Consumer <{LIVE_GROUP}> <nobody@1> not online" in err and "Traceback" not in err


def test_cpp_consumer_running_info_relayed(live, tmp_path):
    """The C++ client (rocketmq 0.4.4) answers GET_CONSUMER_RUNNING_INFO itself; the broker relays it."""
    broker, _, admin, *_ = live
    topic, group = "CppAdminTopic", "CG_CPP_ADMIN"
    create_routed_topic(broker.addr, broker.namesrv, topic, 2)
    procs = ClientProcesses(tmp_path)
    try:
        cpp = procs.client("cpp-push", ["push_consume.py", broker.namesrv, group, topic, "*", "--unique", "1",
                                        "--timeout", "60", "--settle", "0"], timeout=90)
        cpp.wait_line("started")

        def connected():
            try:
                conn = admin.consumer_connection(group, broker.addr)
            except MQClientError:
                return None
            return conn if conn.connection_set and conn.connection_set[0].language == "CPP" else None

        (c,) = wait_for("the C++ consumer's heartbeat", connected, 30).connection_set
        assert c.version == 63

        def running_info():  # it answers once it has rebalanced (queues in mqTable)
            info = admin.consumer_running_info(group, c.client_id, broker_addr=broker.addr)
            return info if len([mq for mq in info.mq_table if mq.topic == topic]) == 2 else None

        info = wait_for("the C++ consumer's queues", running_info, 30)
        assert {mq for mq in info.mq_table if mq.topic == topic} == {MessageQueue(topic, "broker-a", 0),
                                                                     MessageQueue(topic, "broker-a", 1)}
        assert info.properties["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
        assert info.properties["PROP_CLIENT_VERSION"] == "V3_1_8"
        assert sorted(s.topic for s in info.subscription_set) == [f"%RETRY%{group}", topic]
    finally:
        procs.kill_all()


def test_live_client_hanging_up_mid_request(live):
    """A client that closes its connection instead of answering: the admin gets Apache's error at once."""
    broker, _, admin, *_ = live
    asked = []

    async def hang_up(cmd, conn):
        asked.append(cmd.code)
        if cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            conn.close()

    hb = {"clientID": "127.0.0.1@77#RAW", "producerDataSet": [], "consumerDataSet": [
        {"groupName": "CG_RAW", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [], "unitMode": False}]}
    with SyncRemotingClient(broker.addr, on_request=hang_up) as raw:
        assert raw.invoke(RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(hb).encode())).code == 0
        with pytest.raises(MQClientError) as err:
            admin.consumer_running_info("CG_RAW", "127.0.0.1@77#RAW", broker_addr=broker.addr)
    assert err.value.code == ResponseCode.SYSTEM_ERROR
    assert "invoke consumer <CG_RAW> <127.0.0.1@77#RAW> Exception: ConnectionClosed" in str(err.value)
    assert asked[-1] == RequestCode.GET_CONSUMER_RUNNING_INFO  # after NOTIFY_CONSUMER_IDS_CHANGED


def test_live_client_gone(live):
    broker, consumer, admin, *_ = live
    client_id = consumer.client.client_id
    q = MessageQueue(LIVE_TOPIC, "broker-a", 0)
    consumer.shutdown()
    wait_for("the group offline", lambda: _offline(admin, broker), 10)
    with pytest.raises(MQClientError) as err:
        admin.consumer_running_info(LIVE_GROUP, client_id, broker_addr=broker.addr)
    assert err.value.code == ResponseCode.SYSTEM_ERROR and "not online" in str(err.value)
    with pytest.raises(MQClientError) as err:
        admin.reset_offset_by_time(LIVE_GROUP, LIVE_TOPIC, 0)
    assert err.value.code == ResponseCode.CONSUMER_NOT_ONLINE
    assert admin.consumer_progress(broker.addr, LIVE_GROUP, LIVE_TOPIC).offset_table[q].consumer_offset == 10
    # mqadmin's fallback for an offline group commits the offsets itself
    assert admin.reset_offset_by_time_offline(LIVE_GROUP, LIVE_TOPIC, 0) == {q: 0}
    assert admin.consumer_progress(broker.addr, LIVE_GROUP, LIVE_TOPIC).offset_table[q].consumer_offset == 0


def _offline(admin: Admin, broker) -> bool:
    try:
        admin.consumer_connection(LIVE_GROUP, broker.addr)
    except MQClientError as exc:
        return exc.code == ResponseCode.CONSUMER_NOT_ONLINE
    return False
