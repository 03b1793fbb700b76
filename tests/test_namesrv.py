"""Name server: route table logic (fake clock), then a real NameServer on 127.0.0.1 over TCP.

Also covers the transport behaviour the name server relies on (per-request tasks, opaque
matching, oneway, server→client requests, bad clients isolated) and, when the ``rocketmq`` wheel
is installed, the stock C++ producer fetching a route from us.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.cli import build_parser
from broker.namesrv.route_table import RouteTable
from broker.namesrv.server import NameServer
from broker.remoting.bodies import (
    BrokerData,
    ClusterInfo,
    KVTable,
    QueueData,
    RegisterBrokerBody,
    TopicList,
    TopicRouteData,
    decode_data_version,
    encode_data_version,
)
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import RegisterBrokerRequestHeader, UnRegisterBrokerRequestHeader
from broker.remoting.transport import (
    Connection,
    ConnectionClosed,
    RemotingClient,
    RemotingServer,
    RemotingTimeout,
    SyncRemotingClient,
    UnsupportedRequest,
)
from broker.store.config_files import DataVersion, TopicConfig, TopicConfigTable
from broker.store.crc import body_crc
from tests.conftest import REPO_ROOT

CLUSTER = "DefaultCluster"
A_MASTER, A_SLAVE, B_MASTER = "127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:20911"


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def topics(*configs: tuple[str, int]) -> dict[str, TopicConfig]:
    return {name: TopicConfig(name, queues, queues, 6) for name, queues in configs}


def run(coro_fn: Callable[[], Awaitable[Any]], timeout: float = 20) -> Any:
    async def main() -> Any:
        return await asyncio.wait_for(coro_fn(), timeout)
    return asyncio.run(main())


# =====================================================================================================
# RouteTable
# =====================================================================================================
def test_register_and_route() -> None:
    table = RouteTable(clock=FakeClock())
    result = table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "127.0.0.1:10912",
                                   topics(("TopicTest", 4), ("TBW102", 8)), DataVersion(1, 5))
    assert result.master_addr is None and result.ha_server_addr is None
    route = table.route("TopicTest")
    assert route == TopicRouteData(queue_datas=[QueueData("broker-a", 4, 4, 6, 0)],
                                   broker_datas=[BrokerData(CLUSTER, "broker-a", {0: A_MASTER})])
    assert route.encode() == (b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"broker-a",'
                              b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":'
                              b'"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}')
    assert table.route("Nope") is None
    assert table.topics() == ["TBW102", "TopicTest"]


def test_two_brokers_one_cluster_master_only_queue_data() -> None:
    table = RouteTable(clock=FakeClock())
    table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "127.0.0.1:10912", topics(("T", 4)), DataVersion(1, 1))
    table.register_broker(CLUSTER, "broker-b", B_MASTER, 0, "127.0.0.1:20912", topics(("T", 2), ("OnlyB", 1)),
                          DataVersion(1, 1))
    # a slave registering topics (even new ones) never creates queue data
    slave = table.register_broker(CLUSTER, "broker-a", A_SLAVE, 1, "127.0.0.1:10922",
                                  topics(("T", 16), ("SlaveOnly", 4)), DataVersion(9, 9))
    assert slave.master_addr == A_MASTER and slave.ha_server_addr == "127.0.0.1:10912"
    route = table.route("T")
    assert route.queue_datas == [QueueData("broker-a", 4, 4), QueueData("broker-b", 2, 2)]
    assert route.broker_datas == [BrokerData(CLUSTER, "broker-a", {0: A_MASTER, 1: A_SLAVE}),
                                  BrokerData(CLUSTER, "broker-b", {0: B_MASTER})]
    assert table.route("SlaveOnly") is None
    assert table.route("OnlyB").broker_datas == [BrokerData(CLUSTER, "broker-b", {0: B_MASTER})]
    assert table.cluster_info() == ClusterInfo(
        broker_addr_table={"broker-a": BrokerData(CLUSTER, "broker-a", {0: A_MASTER, 1: A_SLAVE}),
                           "broker-b": BrokerData(CLUSTER, "broker-b", {0: B_MASTER})},
        cluster_addr_table={CLUSTER: ["broker-a", "broker-b"]})
    assert table.topics_by_cluster(CLUSTER) == ["OnlyB", "T"]
    assert table.topics_by_cluster("Other") == []


def test_queue_data_updates_only_when_the_version_changes() -> None:
    table = RouteTable(clock=FakeClock())
    table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "", topics(("T", 4)), DataVersion(1, 1))
    table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "", topics(("T", 8)), DataVersion(1, 1))
    assert table.route("T").queue_datas[0].write_queue_nums == 4  # same version: Java skips the update
    table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "", topics(("T", 8)), DataVersion(2, 2))
    assert table.route("T").queue_datas[0].write_queue_nums == 8
    assert table.data_version_changed(CLUSTER, A_MASTER, DataVersion(2, 2)) is False
    assert table.data_version_changed(CLUSTER, A_MASTER, DataVersion(3, 2)) is True
    assert table.data_version_changed(CLUSTER, "1.2.3.4:5", DataVersion(2, 2)) is True


def test_expiry_after_120s_with_a_fake_clock() -> None:
    clock = FakeClock(1000.0)
    table = RouteTable(clock=clock)
    table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "", topics(("T", 4), ("OnlyA", 1)), DataVersion(1, 1))
    clock.now = 1030.0
    table.register_broker(CLUSTER, "broker-b", B_MASTER, 0, "", topics(("T", 2)), DataVersion(1, 1))
    clock.now = 1120.0
    assert table.scan_expired() == []  # exactly 120 s: still alive (Java compares strictly)
    clock.now = 1120.5
    gone = table.scan_expired()
    assert [g.broker_addr for g in gone] == [A_MASTER]
    assert table.route("OnlyA") is None
    assert table.route("T").queue_datas == [QueueData("broker-b", 2, 2)]
    assert table.cluster_info().cluster_addr_table == {CLUSTER: ["broker-b"]}
    assert "broker-a" not in table.broker_addr_table
    clock.now = 1150.5
    assert [g.broker_addr for g in table.scan_expired()] == [B_MASTER]
    assert table.topics() == [] and table.cluster_info() == ClusterInfo()


def test_touch_keeps_a_broker_alive_and_custom_timeouts() -> None:
    clock = FakeClock(0.0)
    table = RouteTable(broker_timeout_s=10, clock=clock)
    table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "", topics(("T", 4)), DataVersion(1, 1))
    table.register_broker(CLUSTER, "broker-b", B_MASTER, 0, "", topics(("U", 4)), DataVersion(1, 1), timeout_s=30)
    clock.now = 8.0
    table.touch(CLUSTER, A_MASTER)
    clock.now = 15.0
    assert table.scan_expired() == []
    clock.now = 18.5
    assert [g.broker_addr for g in table.scan_expired()] == [A_MASTER]
    clock.now = 30.5
    assert [g.broker_addr for g in table.scan_expired()] == [B_MASTER]


def test_master_gone_slave_keeps_queue_data() -> None:
    clock = FakeClock(0.0)
    table = RouteTable(clock=clock)
    table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "", topics(("T", 4)), DataVersion(1, 1))
    clock.now = 100.0
    table.register_broker(CLUSTER, "broker-a", A_SLAVE, 1, "", topics(("T", 4)), DataVersion(1, 1))
    clock.now = 121.0
    assert [g.broker_addr for g in table.scan_expired()] == [A_MASTER]
    route = table.route("T")
    assert route.broker_datas == [BrokerData(CLUSTER, "broker-a", {1: A_SLAVE})]
    assert route.queue_datas == [QueueData("broker-a", 4, 4)]


def test_slave_promoted_to_master_replaces_its_old_id() -> None:
    table = RouteTable(clock=FakeClock())
    table.register_broker(CLUSTER, "broker-a", A_SLAVE, 1, "", topics(("T", 4)), DataVersion(1, 1))
    assert table.route("T") is None
    table.register_broker(CLUSTER, "broker-a", A_SLAVE, 0, "", topics(("T", 4)), DataVersion(1, 1))
    assert table.broker_addr_table["broker-a"].broker_addrs == {0: A_SLAVE}
    assert table.route("T").queue_datas == [QueueData("broker-a", 4, 4)]


def test_unregister_and_channel_close() -> None:
    table = RouteTable(clock=FakeClock())
    channel_a, channel_b = object(), object()
    table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "", topics(("T", 4)), DataVersion(1, 1), channel=channel_a)
    table.register_broker(CLUSTER, "broker-b", B_MASTER, 0, "", topics(("T", 2)), DataVersion(1, 1), channel=channel_b)
    assert table.unregister_broker(CLUSTER, "broker-a", "9.9.9.9:1", 0) is False  # wrong address: ignored
    assert table.unregister_broker(CLUSTER, "broker-a", A_MASTER, 0) is True
    assert table.route("T").queue_datas == [QueueData("broker-b", 2, 2)]
    assert [g.broker_addr for g in table.channel_closed(channel_b)] == [B_MASTER]
    assert table.route("T") is None and table.cluster_info() == ClusterInfo()
    assert table.channel_closed(channel_a) == []


def test_delete_topic() -> None:
    table = RouteTable(clock=FakeClock())
    table.register_broker(CLUSTER, "broker-a", A_MASTER, 0, "", topics(("T", 4), ("U", 1)), DataVersion(1, 1))
    table.register_broker("Other", "broker-x", "127.0.0.1:30911", 0, "", topics(("T", 4)), DataVersion(1, 1))
    assert table.delete_topic("T", "Other")
    assert [q.broker_name for q in table.route("T").queue_datas] == ["broker-a"]
    assert table.delete_topic("U") and table.route("U") is None
    assert not table.delete_topic("missing")


# =====================================================================================================
# Real server over TCP
# =====================================================================================================
def register_request(broker_name: str, addr: str, broker_id: int = 0, *, table: TopicConfigTable | None = None,
                     compressed: bool = False, crc: bool = True, cluster: str = CLUSTER) -> RemotingCommand:
    body = RegisterBrokerBody(table or TopicConfigTable(topics=topics(("TopicTest", 4)), data_version=DataVersion(1, 7)))
    raw = body.encode(compressed=compressed)
    header = RegisterBrokerRequestHeader(broker_name=broker_name, broker_addr=addr, cluster_name=cluster,
                                         ha_server_addr=addr.replace("0911", "0912"), broker_id=broker_id,
                                         compressed=compressed, body_crc32=body_crc(raw) if crc else 0)
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, header.to_ext(), raw)


def route_request(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


async def raw_exchange(port: int, data: bytes, read_timeout: float = 5) -> bytes:
    """Send raw bytes, return everything read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    received = await asyncio.wait_for(reader.read(), read_timeout)
    writer.close()
    return received


def test_server_register_route_cluster_info_and_errors() -> None:
    async def scenario() -> None:
        async with NameServer("127.0.0.1", 0) as ns, RemotingClient(f"127.0.0.1:{ns.port}") as client:
            resp = await client.invoke(register_request("broker-a", A_MASTER))
            assert resp.code == ResponseCode.SUCCESS and resp.is_response
            assert resp.ext_fields == {"haServerAddr": "", "masterAddr": ""} and resp.body == b""
            slave = await client.invoke(register_request("broker-a", A_SLAVE, 1))
            assert slave.ext_fields == {"haServerAddr": "127.0.0.1:10912", "masterAddr": A_MASTER}

            resp = await client.invoke(route_request("TopicTest"))
            assert resp.code == 0
            assert TopicRouteData.decode(resp.body) == TopicRouteData(
                queue_datas=[QueueData("broker-a", 4, 4)],
                broker_datas=[BrokerData(CLUSTER, "broker-a", {0: A_MASTER, 1: A_SLAVE})])
            assert json.loads(resp.body)["brokerDatas"][0]["brokerAddrs"] == {"0": A_MASTER, "1": A_SLAVE}

            resp = await client.invoke(route_request("NoSuchTopic"))
            assert resp.code == ResponseCode.TOPIC_NOT_EXIST == 17
            assert resp.remark == "No topic route info in name server for the topic: NoSuchTopic"
            assert resp.body == b""

            resp = await client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
            assert ClusterInfo.decode(resp.body) == ClusterInfo(
                {"broker-a": BrokerData(CLUSTER, "broker-a", {0: A_MASTER, 1: A_SLAVE})}, {CLUSTER: ["broker-a"]})
            resp = await client.invoke(RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
            assert TopicList.decode(resp.body).topic_list == ["TopicTest"]
            resp = await client.invoke(RemotingCommand.request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": CLUSTER}))
            assert resp.body == b'{"topicList":["TopicTest"]}'

            resp = await client.invoke(RemotingCommand.request(9999))
            assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED == 3
            assert resp.remark == "request type 9999 not supported"
            resp = await client.invoke(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC))
            assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "missing field topic")
            bad = register_request("broker-a", A_MASTER)
            bad.body = b"{broken"
            bad.ext_fields["bodyCrc32"] = "0"
            resp = await client.invoke(bad)
            assert resp.code == ResponseCode.SYSTEM_ERROR and "register broker body does not parse" in resp.remark

            unreg = UnRegisterBrokerRequestHeader(broker_name="broker-a", broker_addr=A_MASTER, cluster_name=CLUSTER,
                                                  broker_id=0)
            resp = await client.invoke(RemotingCommand.request(RequestCode.UNREGISTER_BROKER, unreg.to_ext()))
            assert resp.code == 0
            route = TopicRouteData.decode((await client.invoke(route_request("TopicTest"))).body)
            assert route.broker_datas == [BrokerData(CLUSTER, "broker-a", {1: A_SLAVE})]
    run(scenario)


def test_server_compressed_registration_and_crc() -> None:
    async def scenario() -> None:
        async with NameServer("127.0.0.1", 0) as ns, RemotingClient(f"127.0.0.1:{ns.port}") as client:
            table = TopicConfigTable(topics=topics(("Zipped", 2)), data_version=DataVersion(4, 4))
            resp = await client.invoke(register_request("broker-z", "127.0.0.1:40911", table=table, compressed=True))
            assert resp.code == 0
            assert TopicRouteData.decode((await client.invoke(route_request("Zipped"))).body).queue_datas == [
                QueueData("broker-z", 2, 2)]
            bad = register_request("broker-y", "127.0.0.1:50911")
            bad.ext_fields["bodyCrc32"] = "12345"
            resp = await client.invoke(bad)
            assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
    run(scenario)


def test_server_query_data_version_and_kv_config() -> None:
    async def scenario() -> None:
        async with NameServer("127.0.0.1", 0) as ns, RemotingClient(f"127.0.0.1:{ns.port}") as client:
            await client.invoke(register_request("broker-a", A_MASTER))
            ext = {"brokerName": "broker-a", "brokerAddr": A_MASTER, "clusterName": CLUSTER, "brokerId": "0"}
            same = await client.invoke(RemotingCommand.request(RequestCode.QUERY_DATA_VERSION, ext,
                                                               encode_data_version(DataVersion(1, 7))))
            assert same.code == 0 and same.ext_fields == {"changed": "false"}
            assert decode_data_version(same.body).counter == 1
            newer = await client.invoke(RemotingCommand.request(RequestCode.QUERY_DATA_VERSION, ext,
                                                                encode_data_version(DataVersion(2, 8))))
            assert newer.ext_fields == {"changed": "true"}

            kv = {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicTest", "value": "broker-a:4"}
            assert (await client.invoke(RemotingCommand.request(RequestCode.PUT_KV_CONFIG, kv))).code == 0
            got = await client.invoke(RemotingCommand.request(RequestCode.GET_KV_CONFIG,
                                                              {"namespace": kv["namespace"], "key": "TopicTest"}))
            assert got.code == 0 and got.ext_fields == {"value": "broker-a:4"}
            listed = await client.invoke(RemotingCommand.request(RequestCode.GET_KVLIST_BY_NAMESPACE,
                                                                 {"namespace": kv["namespace"]}))
            assert KVTable.decode(listed.body).table == {"TopicTest": "broker-a:4"}
            registered = await client.invoke(register_request("broker-a", A_MASTER))
            assert KVTable.decode(registered.body).table == {"TopicTest": "broker-a:4"}  # order conf to brokers
            await client.invoke(RemotingCommand.request(RequestCode.DELETE_KV_CONFIG,
                                                        {"namespace": kv["namespace"], "key": "TopicTest"}))
            missing = await client.invoke(RemotingCommand.request(RequestCode.GET_KV_CONFIG,
                                                                  {"namespace": kv["namespace"], "key": "TopicTest"}))
            assert missing.code == ResponseCode.QUERY_NOT_FOUND
            assert missing.remark == "No config item, Namespace: ORDER_TOPIC_CONFIG Key: TopicTest"
    run(scenario)


def test_garbage_client_is_disconnected_while_another_keeps_working() -> None:
    async def scenario() -> None:
        async with NameServer("127.0.0.1", 0) as ns, RemotingClient(f"127.0.0.1:{ns.port}") as good:
            await good.invoke(register_request("broker-a", A_MASTER))
            assert (await good.invoke(route_request("TopicTest"))).code == 0
            # negative length, oversize length, undecodable header behind a valid length
            assert await raw_exchange(ns.port, b"\xff\xff\xff\xff garbage") == b""
            assert await raw_exchange(ns.port, struct.pack(">i", 64 * 1024 * 1024) + b"x" * 100) == b""
            assert await raw_exchange(ns.port, struct.pack(">ii", 8, 4) + b"{{{{") == b""
            # a good frame followed by garbage on the same socket: the connection is dropped (the good
            # frame is answered only if it arrived in an earlier read than the garbage)
            reply = await raw_exchange(ns.port, route_request("TopicTest").encode() + b"\x00\x00\x00\x01")
            assert reply == b"" or RemotingCommand.decode(reply[4:]).code == 0
            assert len(ns.server.connections) == 1  # only the good client is left
            assert (await good.invoke(route_request("TopicTest"))).code == 0
    run(scenario)


def test_broker_connection_close_drops_its_routes() -> None:
    async def scenario() -> None:
        async with NameServer("127.0.0.1", 0) as ns, RemotingClient(f"127.0.0.1:{ns.port}") as client:
            broker = RemotingClient(f"127.0.0.1:{ns.port}")
            await broker.invoke(register_request("broker-a", A_MASTER))
            assert (await client.invoke(route_request("TopicTest"))).code == 0
            await broker.close()
            for _ in range(200):
                if (await client.invoke(route_request("TopicTest"))).code == ResponseCode.TOPIC_NOT_EXIST:
                    break
                await asyncio.sleep(0.01)
            assert (await client.invoke(route_request("TopicTest"))).code == ResponseCode.TOPIC_NOT_EXIST
    run(scenario)


def test_server_expiry_scan_with_a_fake_clock_closes_the_broker_connection() -> None:
    clock = FakeClock(0.0)

    async def scenario() -> None:
        async with NameServer("127.0.0.1", 0, clock=clock) as ns, RemotingClient(f"127.0.0.1:{ns.port}") as client:
            await client.invoke(register_request("broker-a", A_MASTER))
            (conn,) = ns.server.connections
            clock.now = 119.0
            assert ns.scan_once() == 0
            clock.now = 121.0
            assert ns.scan_once() == 1
            assert conn.closed
            await asyncio.wait_for((await client.connect()).wait_closed(), 5)  # the client sees EOF
            assert (await client.invoke(route_request("TopicTest"))).code == ResponseCode.TOPIC_NOT_EXIST  # reconnects
    run(scenario)


# =====================================================================================================
# Transport behaviour
# =====================================================================================================
def test_transport_concurrency_oneway_and_server_initiated_requests() -> None:
    seen: list[int] = []

    async def scenario() -> None:
        held = asyncio.Event()
        server_side: list[Connection] = []

        async def processor(cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
            seen.append(cmd.code)
            server_side.append(conn)
            if cmd.code == 11:  # a "long poll": held until released
                await held.wait()
                return cmd.response(ResponseCode.PULL_NOT_FOUND, ext_fields={"nextBeginOffset": 0})
            if cmd.code == 15:
                return cmd.response()
            if cmd.code == 500:
                raise RuntimeError("boom")
            if cmd.code == 501:
                return None
            raise UnsupportedRequest(cmd.code)

        async def client_side(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            return cmd.response(ext_fields={"from": "client", "code": cmd.code})

        async with RemotingServer("127.0.0.1", 0, processor, name="test") as server, \
                RemotingClient(f"127.0.0.1:{server.port}", on_request=client_side) as client:
            pull = asyncio.ensure_future(client.invoke(RemotingCommand.request(11), timeout=5))
            await asyncio.sleep(0.05)
            commit = await client.invoke(RemotingCommand.request(15), timeout=2)  # not blocked by the held pull
            assert commit.code == 0 and not pull.done()
            held.set()
            answered = await pull
            assert answered.code == 19 and answered.ext_fields == {"nextBeginOffset": "0"}

            oneway = RemotingCommand.request(15, oneway=True)
            await client.invoke_oneway(oneway)
            failed = await client.invoke(RemotingCommand.request(500))
            assert failed.code == ResponseCode.SYSTEM_ERROR and failed.remark == "RuntimeError: boom"
            with pytest.raises(RemotingTimeout, match="no response to 501"):
                await client.invoke(RemotingCommand.request(501), timeout=0.2)

            # server → client request on the same connection, and a oneway notification
            conn = server_side[0]
            reply = await conn.send_request(RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO), timeout=2)
            assert reply.ext_fields == {"from": "client", "code": "307"}
            await conn.send_oneway(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                           {"consumerGroup": "G"}))
            closed: list[str] = []
            conn.add_close_callback(lambda c: closed.append(c.peer))
            assert conn.peer.startswith("127.0.0.1:")
            conn.close()
            await asyncio.sleep(0.05)
            assert closed == [conn.peer]
            with pytest.raises(ConnectionClosed):
                await conn.send_request(RemotingCommand.request(1))
            # the client reconnects on demand
            assert (await client.invoke(RemotingCommand.request(15))).code == 0
        assert seen.count(15) == 3  # commit, oneway, after reconnect
    run(scenario)


def test_oneway_requests_are_never_answered() -> None:
    async def scenario() -> None:
        async with NameServer("127.0.0.1", 0) as ns:
            oneway = route_request("A")
            oneway.mark_oneway()
            normal = route_request("B")
            reader, writer = await asyncio.open_connection("127.0.0.1", ns.port)
            writer.write(oneway.encode() + normal.encode())
            await writer.drain()
            (length,) = struct.unpack(">i", await reader.readexactly(4))
            reply = RemotingCommand.decode(await reader.readexactly(length))
            assert reply.opaque == normal.opaque and reply.code == ResponseCode.TOPIC_NOT_EXIST
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(reader.readexactly(1), 0.2)
            writer.close()
    run(scenario)


def test_reuse_port_lets_two_servers_share_a_port() -> None:
    async def answer(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return cmd.response()

    async def scenario() -> None:
        async with RemotingServer("127.0.0.1", 0, answer, reuse_port=True) as first:
            async with RemotingServer("127.0.0.1", first.port, answer, reuse_port=True) as second:
                assert second.port == first.port
                async with RemotingClient(first.address) as client:
                    assert (await client.invoke(RemotingCommand.request(1))).code == 0
    run(scenario)


def test_sync_client_and_unreachable_address() -> None:
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def serve() -> None:
        async def main() -> None:
            async with NameServer("127.0.0.1", 0) as ns:
                holder["port"] = ns.port
                holder["stop"] = asyncio.Event()
                holder["loop"] = asyncio.get_running_loop()
                ready.set()
                await holder["stop"].wait()
        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        with SyncRemotingClient(f"127.0.0.1:{holder['port']}") as client:
            assert client.invoke(route_request("Nope")).code == ResponseCode.TOPIC_NOT_EXIST
            assert client.invoke(register_request("broker-a", A_MASTER)).code == 0
            assert client.invoke(route_request("TopicTest")).code == 0
        with SyncRemotingClient("127.0.0.1:1", connect_timeout=2) as client, pytest.raises(ConnectionError):
            client.invoke(route_request("x"))
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(10)


# =====================================================================================================
# CLI
# =====================================================================================================
def test_cli_parses_namesrv_start() -> None:
    args = build_parser().parse_args(["namesrv", "start", "--listen", "0.0.0.0:19876", "--broker-timeout", "30"])
    assert (args.listen, args.broker_timeout) == ("0.0.0.0:19876", 30.0)
    assert build_parser().parse_args(["namesrv", "start"]).listen == "127.0.0.1:9876"
    for bad in (["--listen", "localhost"], ["--listen", "h:70000"], ["--broker-timeout", "0"]):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(["namesrv", "start", *bad])
        assert info.value.code == 2


def test_cli_namesrv_start_serves_until_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "broker.cli", "namesrv", "start", "--listen", "127.0.0.1:0"],
                            cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith("name server listening on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])

        async def ask() -> RemotingCommand:
            async with RemotingClient(f"127.0.0.1:{port}") as client:
                return await client.invoke(route_request("TopicTest"))
        assert run(ask).code == ResponseCode.TOPIC_NOT_EXIST
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


# =====================================================================================================
# Interop: the C++ client from the rocketmq==0.4.4 wheel
# =====================================================================================================
CPP_PRODUCER = textwrap.dedent("""
    import json, sys
    from rocketmq.client import Message, Producer
    producer = Producer("PG_INTEROP")
    producer.set_namesrv_addr(sys.argv[1])
    producer.start()
    message = Message("TopicTest")
    message.set_body("hello")
    try:
        result = producer.send_sync(message)
        outcome = {"sent": True, "status": str(result.status)}
    except Exception as exc:
        outcome = {"sent": False, "error": type(exc).__name__}
    producer.shutdown()
    print(json.dumps(outcome))
""")


def test_cpp_producer_gets_its_route_from_our_name_server(tmp_path: Path) -> None:
    """The C++ producer asks us for the route, parses it and goes to the broker it names.

    The "broker" is a bare RemotingServer that refuses SEND_MESSAGE (code 3), so the send fails —
    what matters is that the client reached it with the right topic and a queue id from our route.
    Runs in a subprocess: a C++ crash must not take pytest down, and its logs go to a temp HOME.
    """
    pytest.importorskip("rocketmq.client", reason="rocketmq==0.4.4 wheel not installed")
    namesrv_requests: list[RemotingCommand] = []
    broker_requests: list[RemotingCommand] = []

    async def scenario() -> dict:
        async def fake_broker(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            broker_requests.append(cmd)
            if cmd.code in (RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT):
                return cmd.response()
            raise UnsupportedRequest(cmd.code)

        async with RemotingServer("127.0.0.1", 0, fake_broker, name="fake-broker") as broker, \
                NameServer("127.0.0.1", 0) as ns:
            original = ns.server.processor

            async def spy(cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
                namesrv_requests.append(cmd)
                return await original(cmd, conn)
            ns.server.processor = spy
            ns.routes.register_broker(CLUSTER, "broker-a", f"127.0.0.1:{broker.port}", 0, "",
                                      topics(("TopicTest", 4)), DataVersion(1, 1))
            env = {**os.environ, "HOME": str(tmp_path)}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CPP_PRODUCER, f"127.0.0.1:{ns.port}", env=env, cwd=tmp_path,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
            return json.loads(out.decode().strip().splitlines()[-1])

    outcome = run(scenario, timeout=90)
    route_asks = [c for c in namesrv_requests if c.code == RequestCode.GET_ROUTEINFO_BY_TOPIC]
    assert route_asks and route_asks[0].ext_fields["topic"] == "TopicTest"
    assert route_asks[0].language == "CPP" and route_asks[0].version == 63
    sends = [c for c in broker_requests if c.code == RequestCode.SEND_MESSAGE]
    assert sends, [c.code for c in broker_requests]
    assert sends[0].ext_fields["topic"] == "TopicTest" and sends[0].ext_fields["producerGroup"] == "PG_INTEROP"
    assert 0 <= int(sends[0].ext_fields["queueId"]) < 4
    assert outcome == {"sent": False, "error": "ProducerSendSyncFailed"}
