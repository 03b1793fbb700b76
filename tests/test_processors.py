"""In-process tests of ``BrokerCore``'s original request handlers, in the manner of Apache's
``*ProcessorTest``s: a ``BrokerCore`` over a temporary ``MessageStore``, ``Request`` objects in,
``Reply`` objects out — no sockets, no network processes. The store runs as in the broker's store
process: external dispatch, with its dispatcher process (tests/store_harness.py).

Each handler registered in ``BrokerCore.__init__`` gets its success path and every refusal it
implements, with the exact response code, remark and header/body fields Apache 4.9.x's
processors (``SendMessageProcessor``, ``AbstractSendMessageProcessor.msgCheck``,
``PullMessageProcessor``, ``ConsumerManageProcessor``, ``ClientManageProcessor``,
``QueryMessageProcessor``, ``AdminBrokerProcessor``) answer, and the store's state afterwards.
Apache's ``FAQUrl.suggestTodo`` suffixes ("\\nSee http://... for further details.") are left out of
our remarks on purpose: the tests pin the part before them.
"""

from __future__ import annotations

import json
import random

import pytest

from broker.client.consumer import decode_records
from broker.remoting.bodies import (
    ConsumerIdList,
    ConsumeStats,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    TopicStatsTable,
)
from broker.remoting.codes import PermName, PullSysFlag, RequestCode, ResponseCode
from broker.remoting.headers import SendMessageRequestHeader
from broker.server.metadata import BrokerMetadata
from broker.server.processors import MESSAGE_ILLEGAL_REMARK, V3_4_9, BrokerCore, Request
from broker.server.send_draft import SendDrafter
from broker.store.hosts import Host
from broker.engine.store_settings import StoreSettings
from broker.store.batch import BatchItem, encode_batch
from broker.store.config_files import SubscriptionGroupConfig, TopicConfig
from broker.store.constants import (
    MAX_PROPERTIES_LENGTH,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
)
from broker.store.message import decode_record
from broker.store.properties import encode_properties
from broker.store.topics import DEFAULT_TOPIC, SCHEDULE_TOPIC
from tests.core_harness import ADDR, BROKER, CLUSTER, MAX_BODY, PEER, Env, ok
from tests.store_harness import DispatchedStore


@pytest.fixture(params=["drafted", "full"])
def env(tmp_path, request):
    """Plain sends drafted as the broker's network processes do, or every send the full way (as
    a store-process caller such as the schedule service's deliveries would)."""
    e = Env(tmp_path / "store", drafting=request.param == "drafted")
    yield e
    e.close()


@pytest.fixture
def strict(tmp_path):
    """autoCreateTopicEnable=false, autoCreateSubscriptionGroup=false."""
    e = Env(tmp_path / "strict", auto_create_topic=False, auto_create_group=False)
    yield e
    e.close()


def stored(env: Env, topic: str, queue_id: int, offset: int = 0):
    got = env.store.get_messages(topic, queue_id, offset, 32)
    return decode_records(got.body)


# =====================================================================================================
# dispatch
# =====================================================================================================
def test_unknown_request_code_is_not_supported(env):
    reply = env.ask(9999)
    # NettyRemotingAbstract.processRequestCommand: the remark starts with a space
    assert (reply.code, reply.remark) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, " request type 9999 not supported")


def test_missing_required_header_field_is_a_system_error(env):
    reply = env.ask(RequestCode.GET_MAX_OFFSET, {"queueId": "0"})
    assert reply.code == ResponseCode.SYSTEM_ERROR and "topic" in reply.remark


# =====================================================================================================
# SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE
# =====================================================================================================
@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2])
def test_send_stores_the_record_at_the_next_queue_offset(env, code):
    first = ok(env.send("Orders", b"one", queue_id=1, code=code, props={PROPERTY_TAGS: "TagA", PROPERTY_KEYS: "k1"}))
    second = ok(env.send("Orders", b"two", queue_id=1, code=code))
    assert first.remark is None
    assert set(first.ext) == {"msgId", "queueId", "queueOffset", "transactionId"}
    assert (first.ext["queueId"], first.ext["queueOffset"]) == ("1", "0")
    assert (second.ext["queueId"], second.ext["queueOffset"]) == ("1", "1")
    assert env.store.max_offset("Orders", 1) == 2 and env.store.max_offset("Orders", 0) == 0
    recs = stored(env, "Orders", 1)
    assert [r.body for r in recs] == [b"one", b"two"]
    assert recs[0].queue_offset == 0 and recs[1].queue_offset == 1
    # the broker adds UNIQ_KEY (answered as transactionId) and CLUSTER; msgId is the offset message id
    assert recs[0].properties[PROPERTY_UNIQ_KEY] == first.ext["transactionId"]
    assert recs[0].properties[PROPERTY_CLUSTER] == CLUSTER
    assert recs[0].properties[PROPERTY_TAGS] == "TagA"
    assert first.ext["msgId"] == recs[0].offset_msg_id
    assert recs[0].born_host.address == bytes([10, 0, 0, 7]) and recs[0].born_host.port == 51000


def test_send_keeps_a_client_uniq_key(env):
    reply = ok(env.send("Orders", props={PROPERTY_UNIQ_KEY: "C0A8000100002A9F0000000000000001"}))
    assert reply.ext["transactionId"] == "C0A8000100002A9F0000000000000001"


def test_send_with_negative_queue_id_picks_a_write_queue(env):
    reply = ok(env.send("Orders", queue_id=-1))
    assert reply.ext["queueId"] in {"0", "1"}
    assert env.store.max_offset("Orders", int(reply.ext["queueId"])) == 1


def test_send_to_a_queue_beyond_the_topic_is_refused(env):
    reply = env.send("Orders", queue_id=2)
    assert reply.code == ResponseCode.SYSTEM_ERROR  # msgCheck: SYSTEM_ERROR, not INVALID_PARAMETER
    assert reply.remark == ("request queueId[2] is illegal, TopicConfig [topicName=Orders, readQueueNums=2, "
                            f"writeQueueNums=2, perm=RW-, topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false] "
                            f"Producer: {PEER}")
    assert env.store.max_offset("Orders", 0) == 0


def test_send_to_a_topic_without_write_permission(env):
    env.metadata.topics.put(TopicConfig("ReadOnly", 1, 1, PermName.READ))
    reply = env.send("ReadOnly")
    assert (reply.code, reply.remark) == (ResponseCode.NO_PERMISSION,
                                          "the topic[ReadOnly] sending message is forbidden")
    assert env.store.max_offset("ReadOnly", 0) == 0


def test_unknown_topic_is_auto_created_from_tbw102(env):
    before = env.changed
    reply = ok(env.send("Fresh", queue_id=0))
    config = env.metadata.topics.get("Fresh")
    assert config is not None
    assert (config.read_queue_nums, config.write_queue_nums, config.perm) == (4, 4, 6)  # TBW102 perm 7 less inherit
    assert env.changed > before
    assert reply.ext["queueOffset"] == "0" and env.store.max_offset("Fresh", 0) == 1


def test_unknown_topic_without_auto_create(strict):
    reply = strict.send("Fresh")
    assert (reply.code, reply.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic[Fresh] not exist, apply first please!")
    assert strict.metadata.topics.get("Fresh") is None


def test_retry_topic_is_created_even_without_auto_create(strict):
    strict.metadata.groups.put(SubscriptionGroupConfig("CG"))
    ok(strict.send("%RETRY%CG", reconsume_times=1))
    assert strict.metadata.topics.get("%RETRY%CG").read_queue_nums == 1
    assert strict.store.max_offset("%RETRY%CG", 0) == 1


ILLEGAL_CHARS = "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
TOO_LONG = "The specified topic is longer than topic max length."


@pytest.mark.parametrize("topic, remark", [
    ("", "The specified topic is blank."), ("   ", "The specified topic is blank."),
    ("bad topic", ILLEGAL_CHARS), ("a/../b", ILLEGAL_CHARS), ("中文", ILLEGAL_CHARS), ("T\n", ILLEGAL_CHARS),
    ("x" * 128, TOO_LONG), ("%RETRY%" + "g" * 249, TOO_LONG),
])
def test_send_to_an_invalid_topic_name(env, topic, remark):
    reply = env.send(topic)
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, remark)  # TopicValidator.validateTopic
    assert env.metadata.topics.get(topic) is None


def test_retry_topic_over_127_characters_passes_the_name_check_but_not_the_store(env):
    """Retry/DLQ names may be 255 long (5.x group names); the 4.9 record layout holds 127, so the put
    is refused. Apache 4.9 refuses it one step earlier, with the too-long remark."""
    topic = "%RETRY%" + "g" * 248
    reply = env.send(topic, reconsume_times=1)
    assert (reply.code, reply.remark) == (ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK)
    assert env.store.max_offset(topic, 0) == 0


@pytest.mark.parametrize("topic", [SCHEDULE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                                   "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"])
def test_clients_may_not_send_to_system_topics(env, topic):
    reply = env.send(topic)
    assert (reply.code, reply.remark) == (ResponseCode.NO_PERMISSION,
                                          f"Sending message to topic[{topic}] is forbidden.")


def test_body_over_max_message_size(env):
    ok(env.send("Orders", b"x" * MAX_BODY))
    reply = env.send("Orders", b"x" * (MAX_BODY + 1))
    assert (reply.code, reply.remark) == (ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK)
    assert env.store.max_offset("Orders", 0) == 1


def test_properties_over_32k(env):
    reply = env.send("Orders", props={"big": "v" * MAX_PROPERTIES_LENGTH})
    assert (reply.code, reply.remark) == (ResponseCode.MESSAGE_ILLEGAL, MESSAGE_ILLEGAL_REMARK)
    assert env.store.max_offset("Orders", 0) == 0


def test_bad_header_numbers_are_refused(env):
    header = SendMessageRequestHeader(producer_group="PG", topic="Orders", default_topic=DEFAULT_TOPIC,
                                      default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=1, flag=0)
    ext = header.to_ext(v2=True)
    ext["e"] = "zero"
    reply = env.ask(RequestCode.SEND_MESSAGE_V2, ext, b"x")
    assert reply.code == ResponseCode.SYSTEM_ERROR and "'zero' is not an integer" in reply.remark
    assert env.store.max_offset("Orders", 0) == 0


def test_malformed_properties_are_read_as_apache_reads_them(env):
    """string2messageProperties: entries without a name or a value are dropped, the rest kept."""
    header = SendMessageRequestHeader(producer_group="PG", topic="Orders", default_topic=DEFAULT_TOPIC,
                                      default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=1, flag=0,
                                      properties="junk\x02\x01novalue\x02k\x01v\x02empty\x01\x02\x02")
    ok(env.ask(RequestCode.SEND_MESSAGE_V2, header.to_ext(v2=True), b"x"))
    props = stored(env, "Orders", 0)[0].properties
    assert set(props) == {"k", PROPERTY_UNIQ_KEY, PROPERTY_CLUSTER} and props["k"] == "v"


def test_wait_property_is_not_stored(env):
    ok(env.send("Orders", props={"WAIT": "true", "k": "v"}))
    props = stored(env, "Orders", 0)[0].properties
    assert "WAIT" not in props and props["k"] == "v"


def test_send_to_the_retry_topic_of_an_unknown_group(strict):
    reply = strict.send("%RETRY%Ghost", reconsume_times=1)
    assert (reply.code, reply.remark) == (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                          "subscription group not exist, Ghost")
    assert strict.store.max_offset("%RETRY%Ghost", 0) == 0 and strict.metadata.topics.get("%DLQ%Ghost") is None


def test_send_to_a_retry_topic_at_the_limit_goes_to_the_dlq(env):
    env.metadata.groups.put(SubscriptionGroupConfig("CG", retry_max_times=3))
    ok(env.send("%RETRY%CG", b"r2", reconsume_times=2))
    assert env.store.max_offset("%RETRY%CG", 0) == 1
    reply = ok(env.send("%RETRY%CG", b"r3", reconsume_times=3))  # reconsumeTimes >= retryMaxTimes: dead
    assert reply.ext["queueId"] == "0"
    assert env.store.max_offset("%RETRY%CG", 0) == 1
    assert env.store.max_offset("%DLQ%CG", 0) == 1
    assert [r.body for r in stored(env, "%DLQ%CG", 0)] == [b"r3"]


def test_send_to_a_retry_topic_honours_max_reconsume_times_from_v3_4_9(env):
    ok(env.send("%RETRY%CG", b"old", reconsume_times=2, max_reconsume_times=2, version=V3_4_9 - 1))
    assert env.store.max_offset("%DLQ%CG", 0) == 0  # older clients: the group's 16
    ok(env.send("%RETRY%CG", b"new", reconsume_times=2, max_reconsume_times=2, version=V3_4_9))
    assert [r.body for r in stored(env, "%DLQ%CG", 0)] == [b"new"]


def batch_body(*bodies: bytes) -> bytes:
    return encode_batch([BatchItem(body=b, properties_raw=encode_properties({PROPERTY_KEYS: f"k{i}"}))
                         for i, b in enumerate(bodies)])


def test_batch_stores_every_item_at_consecutive_offsets(env):
    ok(env.send("Orders", b"first", queue_id=1))
    reply = ok(env.send("Orders", batch_body(b"a", b"b", b"c"), queue_id=1, code=RequestCode.SEND_BATCH_MESSAGE,
                        batch=True))
    assert (reply.ext["queueId"], reply.ext["queueOffset"]) == ("1", "1")
    assert len(reply.ext["msgId"].split(",")) == 3
    recs = stored(env, "Orders", 1)
    assert [(r.body, r.queue_offset) for r in recs] == [(b"first", 0), (b"a", 1), (b"b", 2), (b"c", 3)]
    assert recs[2].properties[PROPERTY_KEYS] == "k1" and recs[2].properties[PROPERTY_CLUSTER] == CLUSTER


def test_batch_to_a_retry_topic_is_refused(env):
    reply = env.send("%RETRY%CG", batch_body(b"a"), code=RequestCode.SEND_BATCH_MESSAGE, batch=True)
    assert (reply.code, reply.remark) == (ResponseCode.MESSAGE_ILLEGAL, "batch request does not support retry group "
                                                                        "%RETRY%CG")


def test_malformed_and_empty_batches_are_refused(env):
    bad = env.send("Orders", b"\x00\x00\x00\x05junk", code=RequestCode.SEND_BATCH_MESSAGE, batch=True)
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL and bad.remark.startswith("batch body offset 0: ")
    empty = env.send("Orders", b"", code=RequestCode.SEND_BATCH_MESSAGE, batch=True)
    assert (empty.code, empty.remark) == (ResponseCode.MESSAGE_ILLEGAL, "empty batch")
    big = env.send("Orders", batch_body(b"a", b"x" * (MAX_BODY + 1)), code=RequestCode.SEND_BATCH_MESSAGE, batch=True)
    assert big.code == ResponseCode.MESSAGE_ILLEGAL
    assert env.store.max_offset("Orders", 0) == 0


# =====================================================================================================
# PULL_MESSAGE
# =====================================================================================================
def fill(env: Env, n: int, queue_id: int = 0, tag: str = "TagA") -> None:
    for i in range(n):
        ok(env.send("Orders", b"m%d" % i, queue_id=queue_id, props={PROPERTY_TAGS: tag}))


def test_pull_found(env):
    fill(env, 3)
    reply = env.pull("Orders", 0, 1)
    assert (reply.code, reply.remark) == (ResponseCode.SUCCESS, "FOUND")
    assert reply.ext == {"nextBeginOffset": "3", "minOffset": "0", "maxOffset": "3", "suggestWhichBrokerId": "0"}
    assert [(r.body, r.queue_offset) for r in decode_records(reply.body)] == [(b"m1", 1), (b"m2", 2)]
    # a SUBSCRIPTION pull records what the group reads (5.x subscriptionDataSet) in subscriptionGroup.json
    persisted = env.config("subscriptionGroup.json")["subscriptionGroupTable"]["CG"]
    assert persisted["subscriptionDataSet"] == [{"expression": "*", "expressionType": "TAG", "topic": "Orders",
                                                 "version": 0}]


def test_pull_max_msg_nums(env):
    fill(env, 3)
    reply = env.pull("Orders", 0, 0, max_nums=2)
    assert reply.ext["nextBeginOffset"] == "2" and len(decode_records(reply.body)) == 2


@pytest.mark.parametrize("offset, code, status, next_begin", [
    (3, ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE", "3"),
    (9, ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY", "0"),
])
def test_pull_past_the_end(env, offset, code, status, next_begin):
    fill(env, 3)
    reply = env.pull("Orders", 0, offset)
    assert (reply.code, reply.remark) == (code, status)
    assert reply.ext == {"nextBeginOffset": next_begin, "minOffset": "0", "maxOffset": "3",
                         "suggestWhichBrokerId": "0"}
    assert reply.body == b"" and reply.suspend is None


@pytest.mark.parametrize("offset, code", [(0, ResponseCode.PULL_NOT_FOUND), (5, ResponseCode.PULL_OFFSET_MOVED)])
def test_pull_an_empty_queue(env, offset, code):
    reply = env.pull("Orders", 1, offset)
    assert (reply.code, reply.remark) == (code, "NO_MESSAGE_IN_QUEUE")
    assert reply.ext["nextBeginOffset"] == "0" and reply.ext["maxOffset"] == "0"


def test_pull_with_nothing_matching_the_tag_retries_immediately(env):
    fill(env, 3, tag="TagA")
    reply = env.pull("Orders", 0, 0, sub="TagB")
    assert (reply.code, reply.remark) == (ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE")
    assert reply.ext["nextBeginOffset"] == "3"  # the filtered units are passed over


def test_pull_with_a_tag_filter(env):
    fill(env, 2, tag="TagA")
    fill(env, 1, tag="TagB")
    reply = env.pull("Orders", 0, 0, sub="TagB || TagC")
    assert reply.code == ResponseCode.SUCCESS
    assert [r.properties[PROPERTY_TAGS] for r in decode_records(reply.body)] == ["TagB"]


def test_pull_with_suspend_is_parked_when_nothing_is_there(env):
    reply = env.pull("Orders", 0, 0, flags=PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND)
    assert reply.suspend == ("Orders", 0, 0, 1000)
    resumed = env.core.process(Request(code=RequestCode.PULL_MESSAGE, ext={
        "consumerGroup": "CG", "topic": "Orders", "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
        "sysFlag": str(int(PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND)), "commitOffset": "0",
        "suspendTimeoutMillis": "1000", "subscription": "*", "subVersion": "0"}, peer=PEER, resumed=True))
    assert resumed.suspend is None and resumed.code == ResponseCode.PULL_NOT_FOUND


def test_pull_commits_the_offset_it_carries(env):
    fill(env, 3)
    ok(env.pull("Orders", 0, 2, flags=PullSysFlag.SUBSCRIPTION | PullSysFlag.COMMIT_OFFSET, commit=2))
    assert env.metadata.consumer_offsets.query_offset("CG", "Orders", 0) == 2
    ok(env.pull("Orders", 0, 2, commit=3))  # no COMMIT_OFFSET flag: nothing committed
    assert env.metadata.consumer_offsets.query_offset("CG", "Orders", 0) == 2


def test_pull_from_a_topic_without_read_permission(env):
    env.metadata.topics.put(TopicConfig("WriteOnly", 1, 1, PermName.WRITE))
    reply = env.pull("WriteOnly", 0, 0)
    assert (reply.code, reply.remark) == (ResponseCode.NO_PERMISSION,
                                          "the topic[WriteOnly] pulling message is forbidden")


def test_pull_from_an_unknown_topic(env):
    reply = env.pull("Nowhere", 0, 0)
    assert (reply.code, reply.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic[Nowhere] not exist, apply first please!")


def test_pull_from_a_queue_beyond_the_read_queues(env):
    reply = env.pull("Orders", 2, 0)
    assert reply.code == ResponseCode.SYSTEM_ERROR
    assert reply.remark == f"queueId[2] is illegal, topic:[Orders] topicConfig.readQueueNums:[2] consumer:[{PEER}]"


def test_pull_for_a_missing_subscription_group(strict):
    reply = strict.pull("Orders", 0, 0, group="Nobody")
    assert (reply.code, reply.remark) == (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                          "subscription group [Nobody] does not exist")
    assert strict.metadata.groups.table.get("Nobody") is None


def test_pull_for_a_group_with_consume_disabled(env):
    fill(env, 1)
    env.metadata.groups.put(SubscriptionGroupConfig("Paused", consume_enable=False))
    reply = env.pull("Orders", 0, 0, group="Paused")
    assert (reply.code, reply.remark) == (ResponseCode.NO_PERMISSION, "subscription group no permission, Paused")
    assert reply.body == b""


def test_pull_without_subscription_flag_needs_a_heartbeat(env):
    fill(env, 1)
    reply = env.pull("Orders", 0, 0, flags=0)
    assert (reply.code, reply.remark) == (ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's group info not exist")
    heartbeat(env, "CG", ["Payments"])
    reply = env.pull("Orders", 0, 0, flags=0)
    assert (reply.code, reply.remark) == (ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist")
    heartbeat(env, "CG", ["Orders"])
    assert ok(env.pull("Orders", 0, 0, flags=0)).remark == "FOUND"


def test_pull_by_a_broadcasting_group_that_may_not(env):
    fill(env, 1)
    env.metadata.groups.put(SubscriptionGroupConfig("Bcast", consume_broadcast_enable=False))
    heartbeat(env, "Bcast", ["Orders"], model="BROADCASTING")
    reply = env.pull("Orders", 0, 0, group="Bcast", flags=0)
    assert (reply.code, reply.remark) == (ResponseCode.NO_PERMISSION,
                                          "the consumer group[Bcast] can not consume by broadcast way")
    heartbeat(env, "Bcast", ["Orders"], model="CLUSTERING")
    ok(env.pull("Orders", 0, 0, group="Bcast", flags=0))


# =====================================================================================================
# consumer offsets: QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET, GET_ALL_CONSUMER_OFFSET
# =====================================================================================================
def offset_ext(group="CG", topic="Orders", queue_id=0, **more) -> dict[str, str]:
    return {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), **{k: str(v) for k, v in more.items()}}


def test_update_then_query_consumer_offset(env):
    fill(env, 3)
    ok(env.ask(RequestCode.UPDATE_CONSUMER_OFFSET, offset_ext(commitOffset=2)))
    assert env.metadata.consumer_offsets.query_offset("CG", "Orders", 0) == 2
    reply = ok(env.ask(RequestCode.QUERY_CONSUMER_OFFSET, offset_ext()))
    assert reply.ext == {"offset": "2"}
    table = json.loads(ok(env.ask(RequestCode.GET_ALL_CONSUMER_OFFSET)).body)
    assert table["offsetTable"]["Orders@CG"] == {"0": 2}


def test_query_consumer_offset_of_a_queue_starting_at_zero_is_zero(env):
    fill(env, 1)
    assert ok(env.ask(RequestCode.QUERY_CONSUMER_OFFSET, offset_ext(group="NewGroup"))).ext == {"offset": "0"}


def test_query_consumer_offset_not_found(env):
    reply = env.ask(RequestCode.QUERY_CONSUMER_OFFSET, offset_ext(group="NewGroup", setZeroIfNotFound="false"))
    assert (reply.code, reply.remark) == (ResponseCode.QUERY_NOT_FOUND,
                                          "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
    assert reply.ext == {}


def test_query_consumer_offset_of_an_invalid_topic(env):
    reply = env.ask(RequestCode.QUERY_CONSUMER_OFFSET, offset_ext(topic="../etc"))
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, ILLEGAL_CHARS)


# =====================================================================================================
# queue lookups: GET_MAX_OFFSET, GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME, SEARCH_OFFSET_BY_TIMESTAMP
# =====================================================================================================
def test_queue_offsets_and_times(env):
    fill(env, 3, queue_id=1)
    recs = stored(env, "Orders", 1)
    q = {"topic": "Orders", "queueId": "1"}
    assert ok(env.ask(RequestCode.GET_MAX_OFFSET, q)).ext == {"offset": "3"}
    assert ok(env.ask(RequestCode.GET_MIN_OFFSET, q)).ext == {"offset": "0"}
    assert ok(env.ask(RequestCode.GET_EARLIEST_MSG_STORETIME, q)).ext == {"timestamp": str(recs[0].store_timestamp)}
    assert ok(env.ask(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": "0"})).ext == {"offset": "0"}
    late = recs[-1].store_timestamp + 60_000
    assert ok(env.ask(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": str(late)})).ext == {"offset": "3"}
    empty = {"topic": "Orders", "queueId": "0"}
    assert ok(env.ask(RequestCode.GET_MAX_OFFSET, empty)).ext == {"offset": "0"}
    assert ok(env.ask(RequestCode.GET_EARLIEST_MSG_STORETIME, empty)).ext == {"timestamp": "-1"}


@pytest.mark.parametrize("code", [RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET,
                                  RequestCode.GET_EARLIEST_MSG_STORETIME])
def test_queue_lookups_refuse_a_path_like_topic(env, code):
    reply = env.ask(code, {"topic": "../../etc", "queueId": "0"})
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, ILLEGAL_CHARS)


# =====================================================================================================
# VIEW_MESSAGE_BY_ID, QUERY_MESSAGE
# =====================================================================================================
def test_view_message_by_commitlog_offset(env):
    ok(env.send("Orders", b"first"))
    ok(env.send("Orders", b"second"))
    second = stored(env, "Orders", 0)[1]
    reply = ok(env.ask(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(second.physical_offset)}))
    rec = decode_record(reply.body, 0, second.physical_offset)
    assert (rec.topic, rec.body, rec.queue_offset) == ("Orders", b"second", 1)


@pytest.mark.parametrize("offset", [10 ** 12, 3])
def test_view_message_by_a_bad_offset(env, offset):
    ok(env.send("Orders", b"first"))
    reply = env.ask(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(offset)})
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")


def test_query_message_by_key(env):
    ok(env.send("Orders", b"a", props={PROPERTY_KEYS: "order-1"}))
    ok(env.send("Orders", b"b", props={PROPERTY_KEYS: "order-2 order-1"}))
    ok(env.send("Orders", b"c", props={PROPERTY_KEYS: "order-3"}))
    ext = {"topic": "Orders", "key": "order-1", "maxNum": "32", "beginTimestamp": "0",
           "endTimestamp": str((1 << 63) - 1)}
    reply = ok(env.ask(RequestCode.QUERY_MESSAGE, ext))
    assert sorted(r.body for r in decode_records(reply.body)) == [b"a", b"b"]
    assert set(reply.ext) == {"indexLastUpdateTimestamp", "indexLastUpdatePhyoffset"}
    assert int(reply.ext["indexLastUpdatePhyoffset"]) > 0


def test_query_message_by_key_not_found(env):
    ok(env.send("Orders", b"a", props={PROPERTY_KEYS: "order-1"}))
    ext = {"topic": "Orders", "key": "order-9", "maxNum": "32", "beginTimestamp": "0",
           "endTimestamp": str((1 << 63) - 1)}
    reply = env.ask(RequestCode.QUERY_MESSAGE, ext)
    assert (reply.code, reply.remark) == (ResponseCode.QUERY_NOT_FOUND,
                                          "can not find message, maybe time range not correct")
    assert set(reply.ext) == {"indexLastUpdateTimestamp", "indexLastUpdatePhyoffset"} and reply.body == b""


# =====================================================================================================
# clients: HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP
# =====================================================================================================
def heartbeat(env: Env, group: str, topics: list[str], client_id: str = "10.0.0.7@1", channel=("c", 1),
              model: str = "CLUSTERING"):
    subs = [{"classFilterMode": False, "codeSet": [], "expressionType": "TAG", "subString": "*", "subVersion": 1,
             "tagsSet": [], "topic": t} for t in topics]
    body = json.dumps({"clientID": client_id, "consumerDataSet": [
        {"consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeType": "CONSUME_PASSIVELY", "groupName": group,
         "messageModel": model, "subscriptionDataSet": subs, "unitMode": False}],
        "producerDataSet": [{"groupName": "PG"}]}).encode()
    return ok(env.ask(RequestCode.HEART_BEAT, body=body, channel=channel))


def test_heartbeat_registers_the_consumer_and_creates_its_retry_topic(env):
    heartbeat(env, "CG", ["Orders"])
    retry = env.metadata.topics.get("%RETRY%CG")
    assert retry is not None and (retry.read_queue_nums, retry.perm) == (1, 6)
    reply = ok(env.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"}))
    assert ConsumerIdList.decode(reply.body).consumer_id_list == ["10.0.0.7@1"]
    heartbeat(env, "CG", ["Orders"], client_id="10.0.0.8@2", channel=("c", 2))
    ids = ConsumerIdList.decode(ok(env.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"})).body)
    assert sorted(ids.consumer_id_list) == ["10.0.0.7@1", "10.0.0.8@2"]


def test_heartbeat_creates_the_retry_topic_with_the_groups_retry_queues(env):
    env.metadata.groups.put(SubscriptionGroupConfig("Wide", retry_queue_nums=3))
    heartbeat(env, "Wide", ["Orders"])
    retry = env.metadata.topics.get("%RETRY%Wide")
    assert (retry.read_queue_nums, retry.write_queue_nums, retry.perm) == (3, 3, 6)


def test_heartbeat_of_an_unknown_group_creates_no_retry_topic(strict):
    heartbeat(strict, "Ghost", ["Orders"])
    assert strict.metadata.topics.get("%RETRY%Ghost") is None
    ids = ConsumerIdList.decode(ok(strict.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "Ghost"})).body)
    assert ids.consumer_id_list == ["10.0.0.7@1"]  # registered all the same, as Apache


def test_heartbeat_with_a_bad_body(env):
    reply = env.ask(RequestCode.HEART_BEAT, body=b"{not json")
    assert reply.code == ResponseCode.SYSTEM_ERROR and reply.remark


def test_consumer_list_of_an_unknown_group(env):
    reply = env.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "Ghost"})
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "no consumer for this group, Ghost")


def test_unregister_client_removes_the_consumer(env):
    heartbeat(env, "CG", ["Orders"])
    ok(env.ask(RequestCode.UNREGISTER_CLIENT, {"clientID": "10.0.0.7@1", "consumerGroup": "CG"}))
    reply = env.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"})
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "no consumer for this group, CG")


# =====================================================================================================
# CONSUMER_SEND_MSG_BACK
# =====================================================================================================
def send_back(env: Env, offset: int, group: str = "CG", delay: int = 0, **more):
    ext = {"offset": str(offset), "group": group, "delayLevel": str(delay), "originTopic": "Orders",
           **{k: str(v) for k, v in more.items()}}
    return env.ask(RequestCode.CONSUMER_SEND_MSG_BACK, ext)


def test_send_back_goes_to_retry_through_the_schedule_topic_then_to_the_dlq(env):
    env.metadata.groups.put(SubscriptionGroupConfig("CG", retry_max_times=2))
    ok(env.send("Orders", b"payload"))
    orig = stored(env, "Orders", 0)[0]
    ok(send_back(env, orig.physical_offset))
    delayed = stored(env, SCHEDULE_TOPIC, 3 - 1)  # DELAY = 3 + reconsumeTimes(0): level 3 is queue 2
    assert len(delayed) == 1
    first = delayed[0]
    assert first.properties[PROPERTY_REAL_TOPIC] == "%RETRY%CG"
    assert first.properties[PROPERTY_RETRY_TOPIC] == "Orders"
    assert first.properties[PROPERTY_DELAY] == "3"
    assert first.properties[PROPERTY_ORIGIN_MESSAGE_ID] == orig.offset_msg_id
    assert first.reconsume_times == 1 and first.body == b"payload"
    assert env.metadata.topics.get("%RETRY%CG") is not None
    # reconsumeTimes 1, explicit delay level 5
    ok(send_back(env, first.physical_offset, delay=5))
    second = stored(env, SCHEDULE_TOPIC, 5 - 1)[0]
    assert second.reconsume_times == 2 and second.properties[PROPERTY_DELAY] == "5"
    assert second.properties[PROPERTY_ORIGIN_MESSAGE_ID] == orig.offset_msg_id  # kept, not replaced
    # reconsumeTimes 2 = retryMaxTimes: dead letter
    ok(send_back(env, second.physical_offset))
    dead = stored(env, "%DLQ%CG", 0)
    assert len(dead) == 1 and dead[0].reconsume_times == 3 and dead[0].body == b"payload"
    assert dead[0].properties[PROPERTY_RETRY_TOPIC] == "Orders"


def test_send_back_with_negative_delay_goes_straight_to_the_dlq(env):
    ok(env.send("Orders", b"poison"))
    orig = stored(env, "Orders", 0)[0]
    ok(send_back(env, orig.physical_offset, delay=-1))
    assert [r.body for r in stored(env, "%DLQ%CG", 0)] == [b"poison"]


def test_send_back_of_an_unknown_group(strict):
    ok(strict.send("Orders", b"x"))
    reply = send_back(strict, stored(strict, "Orders", 0)[0].physical_offset, group="Ghost")
    assert (reply.code, reply.remark) == (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                          "subscription group not exist, Ghost")


def test_send_back_of_a_bad_offset(env):
    reply = send_back(env, 10 ** 12)
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {10 ** 12}")
    assert env.store.max_offset("%DLQ%CG", 0) == 0


def test_send_back_for_a_group_without_retry_queues_is_dropped(env):
    env.metadata.groups.put(SubscriptionGroupConfig("NoRetry", retry_queue_nums=0))
    ok(env.send("Orders", b"x"))
    ok(send_back(env, stored(env, "Orders", 0)[0].physical_offset, group="NoRetry"))
    assert env.metadata.topics.get("%RETRY%NoRetry") is None and env.metadata.topics.get("%DLQ%NoRetry") is None


# =====================================================================================================
# LOCK_BATCH_MQ, UNLOCK_BATCH_MQ
# =====================================================================================================
MQ0, MQ1 = MessageQueue("Orders", BROKER, 0), MessageQueue("Orders", BROKER, 1)


def lock(env: Env, client: str, mqs, code=RequestCode.LOCK_BATCH_MQ):
    body = LockBatchRequestBody(consumer_group="CG", client_id=client, mq_set=list(mqs)).encode()
    return ok(env.ask(code, body=body))


def test_lock_contention_between_two_clients(env):
    assert LockBatchResponseBody.decode(lock(env, "A", [MQ0]).body).lock_ok_mq_set == [MQ0]
    # B gets only the queue A does not hold; A re-locking its own queue succeeds
    assert LockBatchResponseBody.decode(lock(env, "B", [MQ0, MQ1]).body).lock_ok_mq_set == [MQ1]
    assert LockBatchResponseBody.decode(lock(env, "A", [MQ0, MQ1]).body).lock_ok_mq_set == [MQ0]
    # B may not unlock A's queue
    lock(env, "B", [MQ0], RequestCode.UNLOCK_BATCH_MQ)
    assert LockBatchResponseBody.decode(lock(env, "B", [MQ0]).body).lock_ok_mq_set == []
    lock(env, "A", [MQ0], RequestCode.UNLOCK_BATCH_MQ)
    assert LockBatchResponseBody.decode(lock(env, "B", [MQ0]).body).lock_ok_mq_set == [MQ0]


def test_lock_expires_after_the_max_live_time(env, monkeypatch):
    import broker.server.processors as processors

    lock(env, "A", [MQ0])
    monkeypatch.setattr(processors, "LOCK_MAX_LIVE_S", -1.0)
    assert LockBatchResponseBody.decode(lock(env, "B", [MQ0]).body).lock_ok_mq_set == [MQ0]


def test_locks_are_freed_when_the_channel_closes(env):
    heartbeat(env, "CG", ["Orders"], client_id="A", channel=("c", 7))
    lock(env, "A", [MQ0])
    env.core.channel_closed(("c", 7))
    assert LockBatchResponseBody.decode(lock(env, "B", [MQ0]).body).lock_ok_mq_set == [MQ0]


# =====================================================================================================
# admin: topics and groups
# =====================================================================================================
def create_topic_ext(topic: str, read: int = 4, write: int = 4, perm: int = 6, **more) -> dict[str, str]:
    return {"topic": topic, "defaultTopic": DEFAULT_TOPIC, "readQueueNums": str(read), "writeQueueNums": str(write),
            "perm": str(perm), "topicFilterType": "SINGLE_TAG", **{k: str(v) for k, v in more.items()}}


def test_update_and_create_topic_persists_and_is_listed(env):
    before = env.changed
    ok(env.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_ext("Audit", 3, 5, 4, topicSysFlag=0, order="true")))
    assert env.changed == before + 1
    assert env.config("topics.json")["topicConfigTable"]["Audit"] == {
        "order": True, "perm": 4, "readQueueNums": 3, "topicFilterType": "SINGLE_TAG", "topicName": "Audit",
        "topicSysFlag": 0, "writeQueueNums": 5}
    table = json.loads(ok(env.ask(RequestCode.GET_ALL_TOPIC_CONFIG)).body)
    assert table["topicConfigTable"]["Audit"]["writeQueueNums"] == 5
    assert table["topicConfigTable"]["Orders"]["readQueueNums"] == 2
    assert "dataVersion" in table
    # a second call updates in place
    ok(env.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_ext("Audit", 8, 8, 6)))
    assert env.metadata.topics.get("Audit").read_queue_nums == 8


@pytest.mark.parametrize("topic", [DEFAULT_TOPIC, CLUSTER])
def test_create_topic_with_a_reserved_name(env, topic):
    reply = env.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_ext(topic))
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR,
                                          f"the topic[{topic}] is conflict with system reserved words.")


def test_create_topic_with_a_bad_name_or_queue_count(env):
    bad = env.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_ext("no spaces"))
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, ILLEGAL_CHARS)
    many = env.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_ext("Many", read=100_000))
    assert many.code == ResponseCode.INVALID_PARAMETER and many.remark.startswith("readQueueNums 100000 is outside 0..")
    assert env.metadata.topics.get("no spaces") is None and env.metadata.topics.get("Many") is None


def test_update_and_create_subscription_group_persists_and_is_listed(env):
    body = json.dumps({"groupName": "Billing", "consumeEnable": False, "retryMaxTimes": 3,
                       "retryQueueNums": 2}).encode()
    ok(env.ask(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body))
    group = env.metadata.groups.table.get("Billing")
    assert (group.consume_enable, group.retry_max_times, group.retry_queue_nums) == (False, 3, 2)
    persisted = env.config("subscriptionGroup.json")["subscriptionGroupTable"]["Billing"]
    assert (persisted["consumeEnable"], persisted["retryMaxTimes"], persisted["retryQueueNums"]) == (False, 3, 2)
    listed = json.loads(ok(env.ask(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)
    assert listed["subscriptionGroupTable"]["Billing"]["retryMaxTimes"] == 3 and "dataVersion" in listed


@pytest.mark.parametrize("body", [b"{oops", b"[]", b'{"groupName": ""}', b'{"consumeEnable": true}'])
def test_update_subscription_group_with_a_bad_body(env, body):
    reply = env.ask(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
    assert reply.code == ResponseCode.SYSTEM_ERROR and reply.remark


def test_get_all_delay_offset(env):
    assert json.loads(ok(env.ask(RequestCode.GET_ALL_DELAY_OFFSET)).body)["offsetTable"] == {}
    env.metadata.delay_offsets.set(3, 7)
    assert json.loads(ok(env.ask(RequestCode.GET_ALL_DELAY_OFFSET)).body)["offsetTable"] == {"3": 7}


# =====================================================================================================
# admin: GET_TOPIC_STATS_INFO, GET_CONSUME_STATS
# =====================================================================================================
def test_topic_stats_info(env):
    fill(env, 2, queue_id=1)
    reply = ok(env.ask(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Orders"}))
    table = TopicStatsTable.decode(reply.body).offset_table
    assert set(table) == {MQ0, MQ1}
    assert (table[MQ0].min_offset, table[MQ0].max_offset, table[MQ0].last_update_timestamp) == (0, 0, 0)
    last = stored(env, "Orders", 1)[-1]
    assert (table[MQ1].min_offset, table[MQ1].max_offset, table[MQ1].last_update_timestamp) == \
        (0, 2, last.store_timestamp)


def test_topic_stats_info_of_an_unknown_topic(env):
    reply = env.ask(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Nowhere"})
    assert (reply.code, reply.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic[Nowhere] not exist")


def test_consume_stats(env):
    fill(env, 3, queue_id=0)
    ok(env.ask(RequestCode.UPDATE_CONSUMER_OFFSET, offset_ext(commitOffset=1)))
    stats = ConsumeStats.decode(ok(env.ask(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "CG"})).body)
    assert set(stats.offset_table) == {MQ0, MQ1}
    q0 = stats.offset_table[MQ0]
    assert (q0.broker_offset, q0.consumer_offset) == (3, 1)
    assert q0.last_timestamp == stored(env, "Orders", 0)[0].store_timestamp
    assert (stats.offset_table[MQ1].broker_offset, stats.offset_table[MQ1].consumer_offset) == (0, 0)
    none = ConsumeStats.decode(ok(env.ask(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "Idle"})).body)
    assert none.offset_table == {}


# =====================================================================================================
# every original handler is covered here
# =====================================================================================================
COVERED = {
    RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.PULL_MESSAGE,
    RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.GET_MAX_OFFSET,
    RequestCode.GET_MIN_OFFSET, RequestCode.GET_EARLIEST_MSG_STORETIME, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
    RequestCode.VIEW_MESSAGE_BY_ID, RequestCode.QUERY_MESSAGE, RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT,
    RequestCode.CHECK_CLIENT_CONFIG,  # tests/test_sql92_filter.py
    RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.LOCK_BATCH_MQ,
    RequestCode.UNLOCK_BATCH_MQ, RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.GET_ALL_TOPIC_CONFIG,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    RequestCode.GET_ALL_CONSUMER_OFFSET, RequestCode.GET_ALL_DELAY_OFFSET, RequestCode.GET_TOPIC_STATS_INFO,
    RequestCode.GET_CONSUME_STATS,
}


def test_every_original_handler_is_covered(env):
    core = env.core
    original = {code for code, handler in core._handlers.items()
                if getattr(handler, "__self__", None) is core and handler.__func__.__module__ == BrokerCore.__module__}
    assert original == COVERED


# =====================================================================================================
# drafted sends: the record a network process encodes is the one the full path writes
# =====================================================================================================
@pytest.mark.parametrize("peer", ["10.0.0.7:51000", "[fd00::7]:51000"])
def test_drafted_send_writes_the_same_bytes_as_the_full_path(tmp_path, peer):
    """The same sends, one store fed drafts (records encoded before the store saw them, only queue
    id, offsets and store time written in) and one fed whole requests: the commitlogs are equal byte
    for byte (IPv4 and IPv6 born hosts put the store time at different positions)."""
    ends = []
    for path in ("drafted", "full"):
        store = DispatchedStore(tmp_path / path, StoreSettings(fsync_metadata=False), clock=lambda: 1_700_000_123_456)
        store.open()
        metadata = BrokerMetadata(store)
        core = BrokerCore(store, metadata, cluster_name=CLUSTER, broker_name=BROKER, broker_addr=ADDR,
                          max_message_size=MAX_BODY)
        drafter = SendDrafter(CLUSTER, Host.parse(ADDR), MAX_BODY)
        random.seed(7)  # queue -1: the store picks one at random, the same in both runs
        for i, (queue_id, props) in enumerate([(0, {"UNIQ_KEY": "U0", "TAGS": "a", "KEYS": "k0 k1"}),
                                               (1, {"UNIQ_KEY": "U1", "WAIT": "true"}),
                                               (-1, {"UNIQ_KEY": "U2", "ünï": "çødé"}),
                                               (0, {"UNIQ_KEY": "U3", "PGROUP": "PG"})]):
            ext = SendMessageRequestHeader(producer_group="PG", topic="Orders", default_topic=DEFAULT_TOPIC,
                                           default_topic_queue_nums=4, queue_id=queue_id, sys_flag=4 * (i == 3),
                                           born_timestamp=1_700_000_000_000 + i, flag=i,
                                           properties=encode_properties(props)).to_ext(v2=True)
            body = bytes([65 + i]) * (100 + i)
            if path == "drafted":
                draft = drafter.draft(RequestCode.SEND_MESSAGE_V2, ext, body, peer, ("c", 1))
                assert draft is not None
                (reply,) = core.send_messages([draft])
            else:
                reply = core.process(Request(RequestCode.SEND_MESSAGE_V2, ext, body, ("c", 1), peer))
            ok(reply)
        store.caught_up()
        end = store.commitlog_max_offset
        ends.append((tmp_path / path / "commitlog" / "00000000000000000000").read_bytes()[:end])
        metadata.close()
        store.close()
    assert ends[0] == ends[1]
    assert len(ends[0]) > 400


def test_sends_that_are_not_plain_are_not_drafted():
    """Batches, retry topics, DELAY, TRAN_MSG, a 5.2 property CRC, refused names and forbidden topics go the
    full way (the store process decides them; refusals are answered in one place)."""
    drafter = SendDrafter(CLUSTER, Host.parse(ADDR), MAX_BODY)

    def draft(topic="Orders", props=None, body=b"x", code=RequestCode.SEND_MESSAGE_V2, **extra):
        ext = SendMessageRequestHeader(producer_group="PG", topic=topic, default_topic=DEFAULT_TOPIC,
                                       default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=1, flag=0,
                                       properties=encode_properties(props or {}),
                                       **extra).to_ext(v2=code != RequestCode.SEND_MESSAGE)
        return drafter.draft(code, ext, body, PEER, None)

    assert draft() is not None
    assert draft(code=RequestCode.SEND_MESSAGE) is not None
    assert draft(code=RequestCode.SEND_BATCH_MESSAGE) is None
    assert draft(batch=True) is None
    assert draft(topic="%RETRY%CG") is None
    assert draft(props={"DELAY": "3"}) is None
    assert draft(props={"__CRC32#": "0000000000"}) is None
    assert draft(props={"TRAN_MSG": "true"}) is None  # a half message: the store process moves it
    assert draft(topic="bad/topic") is None
    assert draft(topic="SCHEDULE_TOPIC_XXXX") is None
    assert draft(body=b"x" * (MAX_BODY + 1)) is None
    assert draft(props={"k": "v" * 40_000}) is None
    assert drafter.draft(RequestCode.SEND_MESSAGE_V2, {"b": "Orders"}, b"x", PEER, None) is None  # no header fields
