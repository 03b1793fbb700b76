"""Our Python client against our broker: producer styles, pull and push consumers, admin, failover."""

from __future__ import annotations

import time

import pytest

from broker.client import Admin, Message, MQClientError, Producer, PullConsumer, PullStatus, PushConsumer
from broker.client.consumer import allocate_averagely
from broker.client.producer import LatencyFaultTolerance
from broker.remoting.bodies import ConsumeFromWhere, MessageQueue
from broker.store.config_files import SubscriptionGroupConfig
from tests.broker_harness import Recorder, cluster, drain, stored_messages, wait_until


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("client"), {"messageDelayLevel": "1s 1s 1s 1s 1s 1s"}) as b:
        yield b


def test_producer_styles_and_pull_consumer(broker):
    with Producer("PG_PY", broker.namesrv) as producer:
        sync = [producer.send(Message("PyTopic", f"sync-{i}".encode(), tags="TagA", keys=[f"k{i}", "common"],
                                      properties={"idx": str(i), "note": "héllo ✓"})) for i in range(50)]
        assert all(r.status.name == "SEND_OK" for r in sync)
        assert len({r.offset_msg_id for r in sync}) == 50 and all(len(r.msg_id) == 32 for r in sync)
        futures = [producer.send_async(Message("PyTopic", f"async-{i}".encode(), tags="TagB",
                                                properties={"idx": str(100 + i)})) for i in range(20)]
        assert [f.result(10).status.name for f in futures] == ["SEND_OK"] * 20
        for i in range(10):
            producer.send_oneway(Message("PyTopic", f"oneway-{i}".encode(), properties={"idx": str(200 + i)}))
        batch = producer.send_batch([Message("PyTopic", f"batch-{i}".encode(), properties={"idx": str(300 + i)})
                                     for i in range(5)])
        assert len(batch.msg_id.split(",")) == 5 and len(batch.offset_msg_id.split(",")) == 5
        assert producer.send(Message("PyTopic", b"x" * 10_000, properties={"idx": "400"})).queue_offset >= 0
        ordered = [producer.send_orderly(Message("PyTopic", f"ord-{i}".encode(), properties={"idx": str(500 + i)}), 7)
                   for i in range(5)]
        assert len({r.queue for r in ordered}) == 1
        assert [r.queue_offset for r in ordered] == list(range(ordered[0].queue_offset, ordered[0].queue_offset + 5))
    with Admin(broker.namesrv) as admin:  # oneway sends have no answer: wait until the queues hold all of them
        wait_until(lambda: stored_messages(admin, broker.addr, "PyTopic") >= 91, "91 messages in PyTopic's queues")
        assert stored_messages(admin, broker.addr, "PyTopic") == 50 + 20 + 10 + 5 + 1 + 5
    with PullConsumer("CG_PULL", broker.namesrv) as consumer:
        msgs = drain(consumer, "PyTopic")
        by_idx = {m.properties["idx"]: m for m in msgs}
        assert sorted(by_idx, key=int) == [str(i) for i in list(range(50)) + list(range(100, 120)) +
                                           list(range(200, 210)) + list(range(300, 305)) + [400] + list(range(500, 505))]
        assert len(msgs) == len(by_idx)
        m = by_idx["7"]
        assert (m.payload, m.tags, m.keys, m.properties["note"]) == (b"sync-7", "TagA", ["k7", "common"], "héllo ✓")
        assert by_idx["400"].payload == b"x" * 10_000 and by_idx["400"].compression == "ZLIB"
        assert by_idx["301"].properties["CLUSTER"] == "DefaultCluster"
        tagged = []
        for mq in consumer.queues("PyTopic"):
            res = consumer.pull(mq, 0, 32, "TagB")
            while res.status is PullStatus.FOUND:
                tagged += res.messages
                res = consumer.pull(mq, res.next_begin_offset, 32, "TagB")
        assert sorted(int(t.properties["idx"]) for t in tagged) == list(range(100, 120))
        mq = consumer.queues("PyTopic")[0]
        consumer.commit(mq, 3)
        assert consumer.committed(mq) == 3
        assert consumer.pull(mq, 10_000).status is PullStatus.OFFSET_ILLEGAL


def test_push_consumer_and_retry_to_dlq(broker):
    with Admin(broker.namesrv) as admin:
        admin.create_subscription_group(broker.addr, SubscriptionGroupConfig("CG_FAIL", retry_max_times=1))
        admin.create_topic(broker.addr, "PushTopic", queues=2)
        assert admin.wait_writable("PushTopic")  # routed: the consumers' first rebalance assigns its queues
    seen = Recorder()
    bad_calls = Recorder()

    def fail(m):
        bad_calls.add((m.properties.get("idx"), m.reconsume_times))
        raise RuntimeError("cannot handle")

    # from the first offset: a send that lands before a consumer's queues are assigned is still consumed
    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    ok = PushConsumer("CG_OK", broker.namesrv, lambda m: seen.add(m.payload), topic="PushTopic", consume_from=first)
    bad = PushConsumer("CG_FAIL", broker.namesrv, fail, topic="PushTopic", consume_from=first)
    ok.start()
    bad.start()
    try:
        with Producer("PG_PUSH", broker.namesrv) as producer:
            for i in range(10):
                producer.send(Message("PushTopic", f"push-{i}".encode(), properties={"idx": str(i)}))
        deadline = time.monotonic() + 40
        seen.wait_for(10, deadline)
        bad_calls.wait_for(20, deadline)
        with Admin(broker.namesrv) as admin:  # the last failure's send-back puts the DLQ record
            wait_until(lambda: stored_messages(admin, broker.addr, "%DLQ%CG_FAIL") >= 10, "10 DLQ records",
                       max(1.0, deadline - time.monotonic()))
    finally:
        ok.shutdown()
        bad.shutdown()
    assert sorted(seen.items) == sorted(f"push-{i}".encode() for i in range(10))
    # retryMaxTimes 1: each message is tried once, redelivered once from %RETRY%, then goes to the DLQ
    assert sorted(bad_calls.items) == sorted([(str(i), 0) for i in range(10)] + [(str(i), 1) for i in range(10)])
    with Admin(broker.namesrv) as admin:
        assert admin.wait_writable("%DLQ%CG_FAIL")  # the reader finds the DLQ topic by its route
    with PullConsumer("CG_DLQ_READER", broker.namesrv) as reader:
        dlq = drain(reader, "%DLQ%CG_FAIL")
        assert sorted(int(m.properties["idx"]) for m in dlq) == list(range(10))
        assert all(m.properties["RETRY_TOPIC"] == "PushTopic" and m.reconsume_times == 2 for m in dlq)
    with Admin(broker.namesrv) as admin:
        progress = admin.consumer_progress(broker.addr, "CG_OK", "PushTopic")
        assert sum(w.lag for w in progress.offset_table.values()) == 0
        assert sum(w.broker_offset for w in progress.offset_table.values()) == 10


def test_unknown_topic_without_route_and_bad_input(broker):
    with Producer("PG_BAD", broker.namesrv) as producer:
        with pytest.raises(ValueError):
            producer.send(Message("bad/topic", b"x"))
        with pytest.raises(MQClientError, match="exceeds"):
            producer.send(Message("PyTopic", b"x" * (4 * 1024 * 1024 + 1)))


def test_queue_selection_avoids_failed_brokers():
    faults = LatencyFaultTolerance(clock=lambda: 100.0)
    faults.failed("broker-a", 30)
    assert not faults.available("broker-a") and faults.available("broker-b")
    queues = [MessageQueue("T", f"broker-{c}", i) for c in "abc" for i in range(2)]
    ids = ["c1", "c2", "c3", "c4"]
    got = [allocate_averagely(queues, ids, c) for c in ids]
    assert [len(g) for g in got] == [2, 2, 1, 1] and sorted(q for g in got for q in g) == sorted(queues)


def test_lookups_and_admin_requests(broker):
    from broker.client.consumer import decode_records
    from broker.client.instance import ClientInstance
    from broker.remoting.bodies import TopicStatsTable
    from broker.remoting.codes import RequestCode, ResponseCode
    from broker.remoting.command import RemotingCommand

    with Producer("PG_LOOKUP", broker.namesrv) as producer:
        sent = [producer.send(Message("LookupTopic", f"m{i}".encode(), keys=[f"lk-{i}", "shared-key"]))
                for i in range(6)]
    client = ClientInstance(broker.namesrv)
    try:
        def call(code, ext=None, body=b""):
            return client.invoke(broker.addr, RemotingCommand.request(code, ext or {}, body))

        def dispatched() -> int:  # acknowledged sends reach the queues and the index a moment later
            table = TopicStatsTable.decode(call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "LookupTopic"}).body)
            return sum(o.max_offset for o in table.offset_table.values())

        wait_until(lambda: dispatched() == 6, "the 6 sends to be dispatched")
        found = call(RequestCode.QUERY_MESSAGE, {"topic": "LookupTopic", "key": "shared-key", "maxNum": 64,
                                                 "beginTimestamp": 0, "endTimestamp": 2**62})
        assert found.code == ResponseCode.SUCCESS
        assert sorted(m.payload for m in decode_records(found.body)) == [f"m{i}".encode() for i in range(6)]
        one = call(RequestCode.QUERY_MESSAGE, {"topic": "LookupTopic", "key": "lk-3", "maxNum": 64,
                                               "beginTimestamp": 0, "endTimestamp": 2**62})
        assert [m.payload for m in decode_records(one.body)] == [b"m3"]
        missing = call(RequestCode.QUERY_MESSAGE, {"topic": "LookupTopic", "key": "nope", "maxNum": 64,
                                                   "beginTimestamp": 0, "endTimestamp": 2**62})
        assert missing.code == ResponseCode.QUERY_NOT_FOUND
        from broker.store.message_id import decode_offset_msg_id

        phy = decode_offset_msg_id(sent[2].offset_msg_id).physical_offset
        view = call(RequestCode.VIEW_MESSAGE_BY_ID, {"topic": "LookupTopic", "offset": phy})
        assert [m.payload for m in decode_records(view.body)] == [b"m2"]
        assert call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 10**12}).code == ResponseCode.SYSTEM_ERROR
        mq = sent[0].queue
        assert call(RequestCode.GET_MIN_OFFSET, {"topic": "LookupTopic", "queueId": mq.queue_id}).ext_fields["offset"] == "0"
        hi = int(call(RequestCode.GET_MAX_OFFSET, {"topic": "LookupTopic", "queueId": mq.queue_id}).ext_fields["offset"])
        assert hi == sum(1 for r in sent if r.queue == mq)
        search = call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "LookupTopic", "queueId": mq.queue_id,
                                                               "timestamp": 0})
        assert search.ext_fields["offset"] == "0"
        stats = TopicStatsTable.decode(call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "LookupTopic"}).body)
        assert sum(o.max_offset for o in stats.offset_table.values()) == 6
        configs = call(RequestCode.GET_ALL_TOPIC_CONFIG)
        assert b'"LookupTopic"' in configs.body
        unknown = call(9999)
        assert (unknown.code, unknown.remark) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, " request type 9999 not supported")
        bad = call(RequestCode.PULL_MESSAGE, {"topic": "LookupTopic"})
        assert bad.code == ResponseCode.SYSTEM_ERROR and "consumerGroup" in bad.remark
    finally:
        client.close()


def test_a_closed_client_instance_keeps_no_descriptor():
    """Each client object runs its own event loop (uvloop: an epoll, an eventfd and an io_uring
    descriptor among others), which the garbage collector never closes: close() must. A test
    process that leaked five per producer passed 1,024 descriptors, where select() fails."""
    import os

    from broker.client.instance import ClientInstance

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    ClientInstance("127.0.0.1:9876").close()  # first use: imports and lazily opened files
    before = open_fds()
    for _ in range(20):
        ClientInstance("127.0.0.1:9876").close()
    assert open_fds() == before
