"""Broker statistics and the read-only admin requests of mqadmin / the Dashboard (broker/server/stats.py,
broker/server/admin_stats.py): in-process against a BrokerCore with fake clocks, then once over a socket."""

from __future__ import annotations

import json
import re
import signal

import pytest

from broker.remoting.bodies import (
    BrokerStatsData,
    ConsumeStatsList,
    GroupList,
    MessageQueue,
    QueryConsumeTimeSpanBody,
    format_java_date,
)
from broker.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from broker.remoting.headers import SendMessageRequestHeader
from broker.engine import StoreSettings
from broker.server import BrokerMetadata
from broker.server.processors import BrokerCore, Request
from broker.server.stats import (
    BROKER_PUT_NUMS,
    GROUP_GET_LATENCY,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    SNDBCK_PUT_NUMS,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    BrokerStatsManager,
    StatsSnapshot,
    next_morning_ms,
)
from broker.remoting.java_text import java_double
from broker.store.config_files import TopicConfig
from broker.store.message_id import decode_offset_msg_id
from tests.store_harness import DispatchedStore

T0 = 1_764_000_000_000  # ms
CLUSTER, BROKER, ADDR = "DefaultCluster", "broker-a", "127.0.0.1:10911"


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


# ---- the stats manager alone ---------------------------------------------------------------------------
def test_windows_sum_tps_avgpt_as_apache_samples_them():
    clock = Clock()
    stats = BrokerStatsManager(CLUSTER, clock)
    stats.on_puts([("T", 3, 300)])
    assert stats.item_stats(TOPIC_PUT_NUMS, "T") == (StatsSnapshot(), StatsSnapshot(), StatsSnapshot())
    stats.tick()  # every window's first sampling: a made-up zero one period earlier, then (1 call, 3 msgs)
    minute, hour, day = stats.item_stats(TOPIC_PUT_NUMS, "T")
    assert minute == StatsSnapshot(3, 3 * 1000 / 10_000, 3.0)
    assert hour == StatsSnapshot(3, 3 * 1000 / 600_000, 3.0)
    assert day == StatsSnapshot(3, 3 * 1000 / 3_600_000, 3.0)
    assert stats.item_stats(TOPIC_PUT_SIZE, "T")[0] == StatsSnapshot(300, 300 * 1000 / 10_000, 300.0)
    assert stats.item_stats(BROKER_PUT_NUMS, CLUSTER)[0] == StatsSnapshot(3, 0.3, 0.0)  # value only, no times
    assert stats.item_stats(TOPIC_PUT_NUMS, "other") is None

    clock.now += 9_999  # not due yet: nothing changes
    stats.on_puts([("T", 5, 500), ("T", 5, 500)])
    stats.tick()
    assert stats.item_stats(TOPIC_PUT_NUMS, "T")[0] == StatsSnapshot(3, 0.3, 3.0)
    clock.now = T0 + 10_000
    stats.tick()
    assert stats.item_stats(TOPIC_PUT_NUMS, "T")[0] == StatsSnapshot(13, 13 * 1000 / 20_000, 13 / 3)
    assert stats.item_stats(TOPIC_PUT_NUMS, "T")[1] == StatsSnapshot(3, 3 * 1000 / 600_000, 3.0)  # hour: not due

    # 7 snapshots make the minute window: after 60 s more the made-up one and the first are gone
    for step in range(2, 8):
        stats.on_puts([("T", 1, 100)])
        clock.now = T0 + step * 10_000
        stats.tick()
    # window: T0+10 s (value 13, 3 calls) .. T0+70 s (value 19, 9 calls)
    assert stats.item_stats(TOPIC_PUT_NUMS, "T")[0] == StatsSnapshot(6, 6 * 1000 / 60_000, 1.0)

    clock.now = T0 + 600_000  # the hour window's second sampling
    stats.tick()
    assert stats.item_stats(TOPIC_PUT_NUMS, "T")[1] == StatsSnapshot(19, 19 * 1000 / 1_200_000, 19 / 9)


def test_group_items_and_store_rates():
    clock = Clock()
    stats = BrokerStatsManager(CLUSTER, clock)
    stats.on_get("G", "T", 2, 4, 400, 3)
    stats.on_get("G", "T", 2, 0, 0, 0)  # a miss counts nowhere but the store's miss total
    stats.on_send_back("G", "T", 250)
    stats.tick()
    assert stats.item_stats(GROUP_GET_NUMS, "T@G")[0] == StatsSnapshot(4, 0.4, 4.0)
    assert stats.item_stats(GROUP_GET_SIZE, "T@G")[0] == StatsSnapshot(400, 40.0, 400.0)
    assert stats.item_stats(GROUP_GET_LATENCY, "2@T@G")[0] == StatsSnapshot(3, 0.3, 3.0)
    assert stats.item_stats(SNDBCK_PUT_NUMS, "T@G")[0] == StatsSnapshot(1, 0.1, 1.0)
    assert stats.minute_tps(GROUP_GET_NUMS, "T@G") == 0.4
    assert stats.minute_tps(GROUP_GET_NUMS, "T@nobody") == 0.0

    info = stats.store_runtime_info()
    assert [info[k] for k in ("putTps", "getFoundTps", "getMissTps", "getTotalTps", "getTransferedTps")] == \
        ["  ", "  ", "  ", "0.0 0.0 0.0", "  "]  # no 1-second sample yet
    # one sample a second; 5 puts, 2 found gets of 3 msgs, 1 miss between samples
    for second in range(1, 12):
        clock.now = T0 + second * 1000
        stats.tick()
        stats.on_puts([("T", 1, 10)] * 5)
        stats.on_get("G", "T", 0, 3, 30, 0)
        stats.on_get("G", "T", 0, 3, 30, 0)
        stats.on_get("G", "T", 0, 0, 0, 0)
    info = stats.store_runtime_info()
    assert info["putTps"] == "5.0  "  # 10-sample rate only: 60 and 600 samples do not exist yet
    assert info["getFoundTps"] == "2.0  "
    assert info["getMissTps"] == "1.0  "
    assert info["getTotalTps"] == "3.0 0.0 0.0"
    assert info["getTransferedTps"] == "6.0  "
    assert info["putMessageTimesTotal"] == "56" and info["msgPutTotalTodayNow"] == "56"  # 55 puts + 1 send-back
    assert info["putMessageSizeTotal"] == str(55 * 10 + 250)
    assert info["putMessageAverageSize"] == java_double(800 / 56)
    assert info["msgGetTotalTodayNow"] == str(4 + 11 * 6)
    assert info["getMessageEntireTimeMax"] == "3"
    assert info["runtime"] == "[ 0 days, 0 hours, 0 minutes, 11 seconds ]"
    assert info["bootTimestamp"] == str(T0)


def test_morning_totals_roll_at_local_midnight():
    clock = Clock()
    stats = BrokerStatsManager(CLUSTER, clock)
    stats.on_puts([("T", 7, 70)])
    stats.on_get("G", "T", 0, 2, 20, 0)
    first = next_morning_ms(T0)
    clock.now = first - 1
    stats.tick()
    assert stats.store_runtime_info()["msgPutTotalTodayMorning"] == "0"
    clock.now = first
    stats.tick()
    stats.on_puts([("T", 4, 40)])
    info = stats.store_runtime_info()
    assert [info[k] for k in ("msgPutTotalYesterdayMorning", "msgPutTotalTodayMorning", "msgPutTotalTodayNow",
                              "msgGetTotalYesterdayMorning", "msgGetTotalTodayMorning", "msgGetTotalTodayNow")] == \
        ["0", "7", "11", "0", "2", "2"]
    clock.now = next_morning_ms(first)
    stats.tick()
    info = stats.store_runtime_info()
    assert (info["msgPutTotalYesterdayMorning"], info["msgPutTotalTodayMorning"]) == ("7", "11")


def test_java_double_text():
    assert [java_double(v) for v in (0.0, 0.5, 12.0, 1e7, 12345678.9, 1.5e-4, float("nan"))] == \
        ["0.0", "0.5", "12.0", "1.0E7", "1.23456789E7", "1.5E-4", "NaN"]


# ---- handlers on a BrokerCore ------------------------------------------------------------------------------
@pytest.fixture()
def env(tmp_path):
    """A BrokerCore over a fresh store with its dispatcher process (tests/store_harness.py); store and
    stats clocks are fake (``env.clock``)."""
    clock = Clock()
    store = DispatchedStore(tmp_path / "store", StoreSettings(fsync_metadata=False), clock=clock)
    store.open()
    core = BrokerCore(store, BrokerMetadata(store), cluster_name=CLUSTER, broker_name=BROKER, broker_addr=ADDR,
                      max_message_size=4 << 20)
    core.stats = BrokerStatsManager(CLUSTER, clock)
    core.clock = clock
    core.metadata.topics.put(TopicConfig("Orders", 2, 2))
    yield core
    core.metadata.close()
    store.close()


def send(core: BrokerCore, topic: str, queue_id: int, body: bytes = b"x" * 100) -> dict[str, str]:
    core.clock.now += 1000
    header = SendMessageRequestHeader(producer_group="PG", topic=topic, default_topic="TBW102",
                                      default_topic_queue_nums=4, queue_id=queue_id, sys_flag=0,
                                      born_timestamp=core.clock.now, flag=0, properties="")
    reply = core.process(Request(code=RequestCode.SEND_MESSAGE_V2, ext=header.to_ext(v2=True), body=body,
                                 peer="10.0.0.1:5000"))
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    core.store.caught_up()  # the tests pull and read queue stats right after
    return reply.ext


def pull(core: BrokerCore, group: str, topic: str, queue_id: int, offset: int):
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
           "maxMsgNums": "32", "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)), "commitOffset": "0",
           "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}
    return core.process(Request(code=RequestCode.PULL_MESSAGE, ext=ext, channel=("t", 1)))


def request(core: BrokerCore, code: int, ext: dict[str, str] | None = None):
    return core.process(Request(code=code, ext=ext or {}))


def heartbeat(core: BrokerCore, group: str, topics: list[str], channel=("t", 9)) -> None:
    subs = [{"subString": "*", "subVersion": 1, "topic": t} for t in topics]
    body = json.dumps({"clientID": f"{group}@1", "consumerDataSet": [
        {"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_PASSIVELY", "groupName": group,
         "messageModel": "CLUSTERING", "subscriptionDataSet": subs}], "producerDataSet": []}).encode()
    assert core.process(Request(code=RequestCode.HEART_BEAT, ext={}, body=body, channel=channel)).code == 0


RUNTIME_KEYS = {
    "brokerVersionDesc", "brokerVersion", "bootTimestamp", "runtime", "msgPutTotalYesterdayMorning",
    "msgPutTotalTodayMorning", "msgPutTotalTodayNow", "msgGetTotalYesterdayMorning", "msgGetTotalTodayMorning",
    "msgGetTotalTodayNow", "putMessageTimesTotal", "putMessageSizeTotal", "putMessageAverageSize",
    "getMessageEntireTimeMax", "putTps", "getFoundTps", "getMissTps", "getTotalTps", "getTransferedTps",
    "dispatchBehindBytes", "commitLogMinOffset", "commitLogMaxOffset", "earliestMessageTimeStamp",
    "startAcceptSendRequestTimeStamp", "pageCacheLockTimeMills", "remainTransientStoreBufferNumbs",
    "commitLogDiskRatio", "consumeQueueDiskRatio", "commitLogDirCapacity",
}


def test_runtime_info_after_sends_and_pulls(env):
    core = env
    first_store_time = core.clock.now + 1000
    for qid in (0, 1, 0):
        send(core, "Orders", qid)
    assert pull(core, "CG", "Orders", 0, 0).code == ResponseCode.SUCCESS
    assert pull(core, "CG", "Orders", 0, 2).code == ResponseCode.PULL_NOT_FOUND  # a miss
    for second in range(1, 12):  # eleven 1-second samples
        core.clock.now += 1000
        core.stats.tick()
    reply = request(core, RequestCode.GET_BROKER_RUNTIME_INFO)
    table = json.loads(reply.body)["table"]
    assert RUNTIME_KEYS <= set(table)
    assert "sendThreadPoolQueueSize" not in table  # no request queue to look at in-process
    core.stats.queue_sizes = lambda: {"send": 2, "other": 5}
    waiting = json.loads(request(core, RequestCode.GET_BROKER_RUNTIME_INFO).body)["table"]
    assert [waiting[k] for k in ("sendThreadPoolQueueSize", "pullThreadPoolQueueSize", "queryThreadPoolQueueSize")] \
        == ["2", "5", "5"]
    stored = core.store.commitlog_max_offset
    assert stored > 0
    assert {k: table[k] for k in ("brokerVersionDesc", "brokerVersion", "msgPutTotalTodayNow", "putMessageTimesTotal",
                                  "putMessageSizeTotal", "msgGetTotalTodayNow", "commitLogMinOffset",
                                  "commitLogMaxOffset", "dispatchBehindBytes", "earliestMessageTimeStamp",
                                  "putMessageAverageSize", "putTps", "getTotalTps", "msgPutTotalTodayMorning",
                                  "startAcceptSendRequestTimeStamp", "remainTransientStoreBufferNumbs",
                                  "bootTimestamp")} == {
        "brokerVersionDesc": "V4_9_8", "brokerVersion": "409", "msgPutTotalTodayNow": "3",
        "putMessageTimesTotal": "3", "putMessageSizeTotal": str(stored), "msgGetTotalTodayNow": "2",
        "commitLogMinOffset": "0", "commitLogMaxOffset": str(stored), "dispatchBehindBytes": "0",
        "earliestMessageTimeStamp": str(first_store_time), "putMessageAverageSize": java_double(stored / 3),
        "putTps": "0.0  ", "getTotalTps": "0.0 0.0 0.0", "msgPutTotalTodayMorning": "0",
        "startAcceptSendRequestTimeStamp": "0", "remainTransientStoreBufferNumbs": "2147483647",
        "bootTimestamp": str(T0)}
    assert 0.0 <= float(table["commitLogDiskRatio"]) <= 1.0
    assert table["commitLogDirCapacity"].startswith("Total : ") and table["commitLogDirCapacity"].endswith(".")
    # clusterList's parsing: the first of the three rates is a double
    assert float(table["putTps"].split(" ")[0]) == 0.0


def test_view_broker_stats_data_for_a_topic_and_a_group(env):
    core = env
    for qid in (0, 1, 0):
        send(core, "Orders", qid)
    assert pull(core, "CG", "Orders", 0, 0).code == ResponseCode.SUCCESS
    core.stats.tick()
    reply = request(core, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "Orders"})
    assert reply.code == ResponseCode.SUCCESS
    assert json.loads(reply.body) == {
        "statsMinute": {"sum": 3, "tps": 0.3, "avgpt": 1.0},
        "statsHour": {"sum": 3, "tps": 3 * 1000 / 600_000, "avgpt": 1.0},
        "statsDay": {"sum": 3, "tps": 3 * 1000 / 3_600_000, "avgpt": 1.0}}
    data = BrokerStatsData.decode(request(core, RequestCode.VIEW_BROKER_STATS_DATA,
                                          {"statsName": "GROUP_GET_NUMS", "statsKey": "Orders@CG"}).body)
    assert (data.stats_minute.sum, data.stats_minute.tps, data.stats_minute.avgpt) == (2, 0.2, 2.0)
    size = BrokerStatsData.decode(request(core, RequestCode.VIEW_BROKER_STATS_DATA,
                                          {"statsName": "TOPIC_PUT_SIZE", "statsKey": "Orders"}).body)
    assert size.stats_minute.sum == core.store.commitlog_max_offset

    missing = request(core, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "GROUP_GET_NUMS", "statsKey": "x@y"})
    assert (missing.code, missing.remark) == (ResponseCode.SYSTEM_ERROR, "The stats <GROUP_GET_NUMS> <x@y> not exist")
    unknown = request(core, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "NOPE", "statsKey": "Orders"})
    assert (unknown.code, unknown.remark) == (ResponseCode.SYSTEM_ERROR, "The stats <NOPE> <Orders> not exist")
    bad = request(core, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS"})
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, "missing field statsKey")


def test_send_back_counts_under_the_original_topic(env):
    core = env
    ext = send(core, "Orders", 0)
    pulled = pull(core, "CG", "Orders", 0, 0)
    assert pulled.code == 0
    offset = decode_offset_msg_id(ext["msgId"]).physical_offset
    back = core.process(Request(code=RequestCode.CONSUMER_SEND_MSG_BACK, version=401, ext={
        "offset": str(offset), "group": "CG", "delayLevel": "0", "originTopic": "Orders"}))
    assert back.code == ResponseCode.SUCCESS, back.remark
    core.stats.tick()
    assert core.stats.item_stats(SNDBCK_PUT_NUMS, "Orders@CG")[0].sum == 1
    assert core.stats.store_runtime_info()["putMessageTimesTotal"] == "2"


def test_query_topic_consume_by_who(env):
    core = env
    heartbeat(core, "online", ["Orders", "%RETRY%online"])
    heartbeat(core, "elsewhere", ["Payments"], channel=("t", 10))
    core.metadata.consumer_offsets.commit_offset("offline", "Orders", 1, 5)
    core.metadata.consumer_offsets.commit_offset("payer", "Payments", 0, 1)
    reply = request(core, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "Orders"})
    assert reply.code == ResponseCode.SUCCESS
    assert reply.body == b'{"groupList":["offline","online"]}'
    nobody = request(core, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "None"})
    assert GroupList.decode(nobody.body) == GroupList([])
    bad = request(core, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO)
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, "missing field topic")


def test_get_broker_consume_stats(env):
    core = env
    for qid in (0, 0, 0, 1):
        send(core, "Orders", qid)
    core.metadata.topics.put(TopicConfig("Sorted", 1, 1, order=True))
    send(core, "Sorted", 0)
    core.metadata.groups.find("CG")
    core.metadata.groups.find("idle")
    core.metadata.consumer_offsets.commit_offset("CG", "Orders", 0, 2)
    core.metadata.consumer_offsets.commit_offset("CG", "Sorted", 0, 1)
    core.metadata.consumer_offsets.commit_offset("CG", "Gone", 0, 1)  # no topic config: left out
    assert pull(core, "CG", "Orders", 0, 0).code == 0
    core.stats.tick()
    reply = request(core, RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "false"})
    assert reply.code == ResponseCode.SUCCESS
    assert reply.body.startswith(b'{"brokerAddr":"127.0.0.1:10911","consumeStatsList":[')
    assert b'{"CG":[{"consumeTps":0.3,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"Orders"}:' \
           b'{"brokerOffset":3,"consumerOffset":2,' in reply.body  # fastjson's object keys
    body = ConsumeStatsList.decode(reply.body)
    assert body.broker_addr == ADDR
    groups = body.by_group()
    assert groups["idle"] == []
    orders, ordered = groups["CG"]
    q = MessageQueue("Orders", BROKER, 0)
    assert orders.consume_tps == 0.3  # 3 messages pulled, the first minute sample
    assert {mq.queue_id: (w.broker_offset, w.consumer_offset) for mq, w in orders.offset_table.items()} == \
        {0: (3, 2), 1: (1, 0)}
    assert orders.offset_table[q].last_timestamp == core.store.store_time_at("Orders", 0, 1)
    assert orders.offset_table[MessageQueue("Orders", BROKER, 1)].last_timestamp == 0
    assert [mq.topic for mq in ordered.offset_table] == ["Sorted"]
    assert body.total_diff == 1 + 1 + 0
    only_ordered = ConsumeStatsList.decode(request(core, RequestCode.GET_BROKER_CONSUME_STATS,
                                                   {"isOrder": "true"}).body).by_group()
    assert [list(s.offset_table) for s in only_ordered["CG"]] == [[MessageQueue("Sorted", BROKER, 0)]]
    bad = request(core, RequestCode.GET_BROKER_CONSUME_STATS)
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, "missing field isOrder")


def test_online_group_without_the_topic_is_left_out(env):
    core = env
    send(core, "Orders", 0)
    heartbeat(core, "CG", ["Payments"])  # its consumers now subscribe to another topic only
    core.metadata.consumer_offsets.commit_offset("CG", "Orders", 0, 1)
    groups = ConsumeStatsList.decode(request(core, RequestCode.GET_BROKER_CONSUME_STATS,
                                             {"isOrder": "false"}).body).by_group()
    assert groups["CG"] == []


def test_query_consume_time_span(env):
    core = env
    times = []
    for _ in range(3):
        send(core, "Orders", 0)
        times.append(core.clock.now)  # the fake store clock stamps STORETIMESTAMP
    core.metadata.consumer_offsets.commit_offset("CG", "Orders", 0, 1)
    core.clock.now += 60_000
    reply = request(core, RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "Orders", "group": "CG"})
    assert reply.code == ResponseCode.SUCCESS
    spans = QueryConsumeTimeSpanBody.decode(reply.body).consume_time_span_set
    q0, q1 = spans
    assert (q0.message_queue, q0.min_time_stamp, q0.max_time_stamp, q0.consume_time_stamp, q0.delay_time) == \
        (MessageQueue("Orders", BROKER, 0), times[0], times[2], times[0], core.clock.now - times[1])
    # an empty queue, no offset: Apache's -1 store times, and the delay "now - (-1)" it computes
    assert (q1.min_time_stamp, q1.max_time_stamp, q1.consume_time_stamp, q1.delay_time) == \
        (-1, -1, -1, core.clock.now + 1)
    first = json.loads(reply.body)["consumeTimeSpanSet"][0]
    assert list(first) == ["consumeTimeStamp", "consumeTimeStampStr", "delayTime", "maxTimeStamp", "maxTimeStampStr",
                           "messageQueue", "minTimeStamp", "minTimeStampStr"]
    assert first["minTimeStampStr"] == format_java_date(times[0])
    assert first["minTimeStampStr"][10] == "#"

    core.metadata.consumer_offsets.commit_offset("CG", "Orders", 0, 3)  # caught up: no delay
    caught_up = QueryConsumeTimeSpanBody.decode(request(core, RequestCode.QUERY_CONSUME_TIME_SPAN,
                                                        {"topic": "Orders", "group": "CG"}).body)
    assert (caught_up.consume_time_span_set[0].consume_time_stamp, caught_up.consume_time_span_set[0].delay_time) == \
        (times[2], 0)
    missing = request(core, RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "Nope", "group": "CG"})
    assert (missing.code, missing.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic[Nope] not exist")


# ---- over a socket, through the admin client -----------------------------------------------------------
def test_admin_client_against_a_real_broker(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    from broker.client import Admin, Message, Producer, PullConsumer
    from tests.broker_harness import start_broker, start_namesrv, stored_messages, wait_until

    ns, ns_addr = start_namesrv(tmp_path)
    broker = start_broker(tmp_path / "store", ns_addr, {})
    try:
        with Admin(ns_addr) as admin:
            admin.create_topic(broker.addr, "StatsT", queues=1)
            assert admin.wait_routed("StatsT", [BROKER], 1, 1, 6)
            with Producer("PG_STATS", ns_addr) as producer:
                for i in range(4):
                    assert producer.send(Message("StatsT", f"m{i}".encode())).status.name == "SEND_OK"
            wait_until(lambda: stored_messages(admin, broker.addr, "StatsT") == 4, "the 4 sends to be dispatched")
            with PullConsumer("CG_STATS", ns_addr) as consumer:
                (mq,) = consumer.queues("StatsT")
                assert len(consumer.pull(mq, 0).messages) == 4
                consumer.commit(mq, 3)
            info = admin.broker_runtime_info(broker.addr)
            assert RUNTIME_KEYS <= set(info)
            assert (info["msgPutTotalTodayNow"], info["msgGetTotalTodayNow"]) == ("4", "4")
            assert (info["sendThreadPoolQueueSize"], info["pullThreadPoolQueueSize"]) == ("0", "0")  # idle
            assert len(info["putTps"].split(" ")) == 3
            assert admin.query_topic_consume_by_who(broker.addr, "StatsT") == ["CG_STATS"]
            stats = admin.broker_consume_stats(broker.addr, timeout=10).by_group()
            (per_topic,) = stats["CG_STATS"]
            wrapper = per_topic.offset_table[MessageQueue("StatsT", BROKER, 0)]
            assert (wrapper.broker_offset, wrapper.consumer_offset) == (4, 3)
            (span,) = admin.query_consume_time_span(broker.addr, "StatsT", "CG_STATS")
            assert span.min_time_stamp > 0 and span.max_time_stamp >= span.consume_time_stamp >= span.min_time_stamp
            data = admin.view_broker_stats_data(broker.addr, "TOPIC_PUT_NUMS", "StatsT")
            assert data.stats_minute.sum in (0, 4)  # 4 once the 10-second sampling has run
            from broker.client import MQClientError

            with pytest.raises(MQClientError, match="The stats <TOPIC_PUT_NUMS> <NoSuchTopic> not exist"):
                admin.view_broker_stats_data(broker.addr, "TOPIC_PUT_NUMS", "NoSuchTopic")
        check_cli(capsys, ns_addr, broker.addr)
    finally:
        broker.stop()
        ns.send_signal(signal.SIGTERM)
        ns.wait(10)


def check_cli(capsys, ns: str, addr: str) -> None:
    """``rocketlake admin brokerStatus / brokerConsumeStats / statsAll`` on the broker of the test above."""
    from broker.cli import main

    def run(*argv: str) -> str:
        code = main(["admin", *argv])
        out, err = capsys.readouterr()
        assert (code, err) == (0, "")
        return out

    status = dict(line.split(": ", 1) for line in run("brokerStatus", "-n", ns, "-b", addr).splitlines())
    assert {key.rstrip() for key in status} >= RUNTIME_KEYS
    assert status["msgPutTotalTodayNow".ljust(32)] == "4"
    assert run("brokerStatus", "-n", ns, "-c", CLUSTER).count(f"{addr:<24} msgPutTotalTodayNow") == 1

    lines = run("brokerConsumeStats", "-n", ns, "-b", addr).splitlines()
    assert re.split(r"\s{2,}", lines[0].strip()) == ["#Topic", "#Group", "#Broker Name", "#QID", "#Broker Offset",
                                                    "#Consumer Offset", "#Diff", "#LastTime (UTC)"]
    rows = [line.split() for line in lines[1:-2]]
    assert [r[:7] for r in rows] == [["StatsT", "CG_STATS", BROKER, "0", "4", "3", "1"]]
    assert lines[-2:] == ["", "Diff Total: 1"]
    assert run("brokerConsumeStats", "-n", ns, "-b", addr, "-l", "2").splitlines()[1:] == ["", "Diff Total: 1"]

    out = run("statsAll", "-n", ns, "-t", "StatsT").splitlines()
    assert out[0].split() == ["#Topic", "#Consumer", "Group", "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour",
                              "#OutMsg24Hour"]
    (row,) = [line.split() for line in out[1:]]
    assert row[:3] == ["StatsT", "CG_STATS", "1"]
    # each 24-hour figure is 0 until the 10-second sampling has run, then 4: the put and the get
    # figures are sampled separately, so a loaded machine can show one before the other
    assert row[5] in ("0", "4") and row[6] in ("0", "4") and len(row) == 7
