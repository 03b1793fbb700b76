"""broker.server.MessageStore: puts, pulls, delays, send-back, offsets, index queries, flushing,
clean shutdown — every store written here must pass ``verify_store`` without findings.

The stores run as the broker's store process runs them: external dispatch, with the dispatcher
process (tests/store_harness.py), so a read that must see the puts before it waits for
``caught_up``. The tests of the in-process :class:`~broker.engine.dispatch.Dispatcher` itself (its
fsync bookkeeping, its idempotent catch-up) open an inline store: that dispatcher writes only there.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from broker.engine import ASYNC_FLUSH, GetStatus, MessageStore, PutStatus, SYNC_FLUSH, StoreSettings
from broker.server import BrokerMetadata, ScheduleService, consumer_send_back
from broker.store.checkpoint import read_checkpoint
from broker.store.config_files import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    SubscriptionGroupConfig,
    TopicConfigTable,
    config_path,
)
from broker.store.constants import CONSUMER_OFFSET_FILE, DELAY_OFFSET_FILE, INDEX_DIR, TOPICS_FILE
from broker.store.hosts import Host
from broker.store.message import MessageRecord, RecordError, decode_record
from broker.store.message_id import encode_offset_msg_id
from broker.store.properties import encode_properties
from broker.store.store_lock import abort_marker_exists
from broker.store.topics import SCHEDULE_TOPIC
from broker.store.verify import verify_store
from tests.store_harness import DispatchedStore

T0 = 1_790_000_000_000
LEVELS = "1s 2s"
STORE_HOST = Host(bytes([10, 9, 8, 7]), 10911)
BORN_HOST = Host(bytes([192, 168, 1, 20]), 40001)


class FakeClock:
    """Store clock (also names index files): stands still until a test moves it."""

    def __init__(self, start: int = T0) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> "FakeClock":
        self.now += ms
        return self


def settings(**kw) -> StoreSettings:
    base = dict(segment_bytes=16 * 1024, cq_file_bytes=20 * 16, index_slots=64, index_entries=256,
                message_delay_level=LEVELS, store_host=STORE_HOST, fsync_metadata=False)
    base.update(kw)
    return StoreSettings(**base)


def msg(topic: str = "TopicA", body: bytes = b"hello", queue_id: int = 0, sys_flag: int = 0, **props: str) -> MessageRecord:
    return MessageRecord(topic=topic, body=body, properties_raw=encode_properties(props), queue_id=queue_id,
                         flag=7, sys_flag=sys_flag, born_timestamp=T0 - 5, born_host=BORN_HOST)


def split_records(body: bytes) -> list[MessageRecord]:
    """Decode a pull body: records back to back."""
    out, pos = [], 0
    while pos < len(body):
        size = int.from_bytes(body[pos:pos + 4], "big")
        rec = decode_record(body[pos:pos + size], 0, int.from_bytes(body[pos + 28:pos + 36], "big"))
        out.append(rec)
        pos += size
    return out


def assert_clean(store_dir: Path, s: StoreSettings) -> None:
    report = verify_store(store_dir, segment_size=s.segment_bytes, message_delay_level=s.message_delay_level)
    assert report.findings == [], report.summary()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(request, tmp_path, clock):
    """An open store with its dispatcher process; ``parametrize("store", ["inline"], indirect=True)``
    opens an inline one instead."""
    s = settings()
    inline = getattr(request, "param", "external") == "inline"
    st = (MessageStore if inline else DispatchedStore)(tmp_path / "store", s, clock=clock)
    st.open()
    yield st
    if st.is_open:
        st.close()
        assert_clean(tmp_path / "store", s)


# ---- put / get ------------------------------------------------------------------------------------------
def test_put_get_round_trip(store, clock):
    results = []
    for i in range(6):
        results.append(store.put_message(msg(body=f"m{i}".encode(), queue_id=i % 2, TAGS="TagA", KEYS=f"k{i}")))
        clock.advance(10)
    assert [r.status for r in results] == [PutStatus.PUT_OK] * 6
    assert [r.queue_offset for r in results] == [0, 0, 1, 1, 2, 2]
    assert [r.store_timestamp for r in results] == [T0 + 10 * i for i in range(6)]
    assert results[0].physical_offsets == (0,)
    assert results[0].msg_id == encode_offset_msg_id(STORE_HOST, 0)
    sizes = [r.wrote_bytes for r in results]
    assert [r.physical_offsets[0] for r in results] == [sum(sizes[:i]) for i in range(6)]
    assert store.commitlog_max_offset == sum(sizes)

    store.caught_up()
    got = store.get_messages("TopicA", 1, 0)
    assert got.status is GetStatus.FOUND
    assert (got.next_begin_offset, got.min_offset, got.max_offset) == (3, 0, 3)
    assert got.queue_offsets == (0, 1, 2)
    recs = split_records(got.body)
    assert got.body == b"".join(store.read_record_bytes(r.physical_offsets[0]) for r in results[1::2])
    for rec, put in zip(recs, results[1::2]):
        assert rec.encode() == put.records[0].encode()
        assert (rec.topic, rec.queue_id, rec.queue_offset, rec.physical_offset) == \
            ("TopicA", 1, put.queue_offset, put.physical_offsets[0])
        assert rec.body == f"m{2 * put.queue_offset + 1}".encode()
        assert rec.store_host == STORE_HOST and rec.born_host == BORN_HOST
        assert (rec.flag, rec.born_timestamp, rec.store_timestamp) == (7, T0 - 5, put.store_timestamp)
        assert rec.properties == {"TAGS": "TagA", "KEYS": f"k{2 * put.queue_offset + 1}"}  # no CLUSTER from the store
        assert rec.body_crc_ok
        assert rec.encode() == store.read_record_bytes(rec.physical_offset)
    assert store.view_message(results[2].physical_offsets[0]).body == b"m2"


def test_batch_put(store):
    batch = [msg(body=f"b{i}".encode(), queue_id=3, UNIQ_KEY=f"U{i}", WAIT="true") for i in range(4)]
    store.put_message(msg(queue_id=3))
    res = store.put_messages(batch)
    assert res.status is PutStatus.PUT_OK
    assert (res.queue_id, res.queue_offset) == (3, 1)
    assert [r.queue_offset for r in res.records] == [1, 2, 3, 4]
    assert len({r.store_timestamp for r in res.records}) == 1
    assert res.msg_ids == [encode_offset_msg_id(STORE_HOST, p) for p in res.physical_offsets]
    ends = [r.physical_offset + r.total_size for r in res.records]
    assert list(res.physical_offsets[1:]) == ends[:-1]
    store.caught_up()
    got = store.get_messages("TopicA", 3, 1)
    assert [r.body for r in split_records(got.body)] == [b"b0", b"b1", b"b2", b"b3"]
    assert [r.properties["WAIT"] for r in split_records(got.body)] == ["true"] * 4
    # batch rules: one queue, no delay, no transactions
    assert store.put_messages([msg(queue_id=0), msg(queue_id=1)]).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_messages([msg(DELAY="1")]).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_messages([msg(sys_flag=0x8)]).status is PutStatus.MESSAGE_ILLEGAL


def test_batch_never_spans_files(store):
    body = b"x" * 1000
    while store.commitlog_max_offset < 16 * 1024 - 3000:
        store.put_message(msg(body=body))
    before = store.commitlog_max_offset
    res = store.put_messages([msg(body=body, queue_id=1) for _ in range(3)])
    assert res.ok
    assert res.physical_offsets[0] == 16 * 1024  # rolled to the next file with a BLANK
    assert before < 16 * 1024
    store.caught_up()
    assert store.get_messages("TopicA", 1, 0).message_count == 3


@pytest.mark.parametrize("store", ["inline"], indirect=True)  # the in-process dispatcher's bookkeeping
def test_batch_across_cq_files_marks_both_files_for_fsync(store):
    for _ in range(14):
        store.put_message(msg(queue_id=1))
    res = store.put_messages([msg(queue_id=1) for _ in range(4)])  # units 14..17: CQ files 0 and 320
    assert res.queue_offset == 14
    qdir = store.store_dir / "consumequeue" / "TopicA" / "1"
    assert {qdir / ("0" * 20), qdir / "00000000000000000320"} <= store.dispatcher._dirty_files
    store.dispatcher.sync()
    assert not store.dispatcher._dirty_files


def test_put_rejections(store):
    assert store.put_message(msg(topic="bad topic")).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_message(msg(topic="T" * 128)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_message(msg(topic="T" * 127)).status is PutStatus.PUT_OK
    assert store.settings.max_message_size == 4 * 1024 * 1024
    assert store.put_message(msg(body=b"x" * (4 * 1024 * 1024 + 1))).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_message(msg(p="v" * 32768)).status is PutStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.put_message(msg(DELAY="soon")).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_message(msg(queue_id=-1)).status is PutStatus.MESSAGE_ILLEGAL
    # a record that cannot fit one commitlog file
    assert store.put_message(msg(body=b"x" * 17000)).status is PutStatus.MESSAGE_ILLEGAL


def test_put_after_close_is_refused(tmp_path, clock):
    st = DispatchedStore(tmp_path / "s", settings(), clock=clock)
    st.open()
    st.close()
    assert st.put_message(msg()).status is PutStatus.SERVICE_NOT_AVAILABLE


# ---- pull statuses, filters, caps -----------------------------------------------------------------------
def test_pull_statuses(store):
    empty = store.get_messages("TopicA", 0, 0)
    assert (empty.status, empty.next_begin_offset, empty.max_offset) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0)
    assert store.get_messages("TopicA", 0, 5).status is GetStatus.NO_MESSAGE_IN_QUEUE
    for i in range(3):
        store.put_message(msg(body=bytes([i])))
    store.caught_up()
    one = store.get_messages("TopicA", 0, 3)
    assert (one.status, one.next_begin_offset, one.min_offset, one.max_offset) == \
        (GetStatus.OFFSET_OVERFLOW_ONE, 3, 0, 3)
    badly = store.get_messages("TopicA", 0, 9)
    assert (badly.status, badly.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)
    found = store.get_messages("TopicA", 0, 1)
    assert (found.status, found.next_begin_offset, found.queue_offsets) == (GetStatus.FOUND, 3, (1, 2))
    assert store.get_messages("bad topic!", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.get_messages("TopicA", -1, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert (store.max_offset("TopicA", 0), store.min_offset("TopicA", 0)) == (3, 0)
    assert (store.max_offset("Nope", 0), store.min_offset("Nope", 0)) == (0, 0)


def _reopened_without_queue_file(tmp_path, clock, messages: int, first_unit: int) -> DispatchedStore:
    """A store of ``messages`` puts to TopicA queue 0 in 4-unit consume-queue files, closed, the file
    starting at unit ``first_unit`` deleted, and opened again."""
    s = settings(cq_file_bytes=20 * 4)  # 4 units per CQ file
    st = DispatchedStore(tmp_path / "s", s, clock=clock)
    st.open()
    for i in range(messages):
        st.put_message(msg(body=bytes([i])))
    st.close()
    (tmp_path / "s" / "consumequeue" / "TopicA" / "0" / f"{first_unit * 20:020d}").unlink()
    st = DispatchedStore(tmp_path / "s", s, clock=clock)
    st.open()
    return st


def test_offset_too_small_after_queue_files_are_gone(tmp_path, clock):
    st = _reopened_without_queue_file(tmp_path, clock, 10, 0)  # expired, as Apache deletes them
    small = st.get_messages("TopicA", 0, 1)
    assert (small.status, small.next_begin_offset, small.min_offset, small.max_offset) == \
        (GetStatus.OFFSET_TOO_SMALL, 4, 4, 10)
    badly = st.get_messages("TopicA", 0, 12)
    assert (badly.status, badly.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 10)
    # one pull never crosses a CQ file: 4..7, then 8..9
    first = st.get_messages("TopicA", 0, 4)
    assert (first.queue_offsets, first.next_begin_offset) == ((4, 5, 6, 7), 8)
    assert st.get_messages("TopicA", 0, 8).queue_offsets == (8, 9)
    assert BrokerMetadata(st).query_consumer_offset("g", "TopicA", 0) is None  # queue no longer starts at 0
    st.close()


def test_a_pull_steps_over_a_missing_middle_queue_file_to_the_units_after_it(tmp_path, clock):
    """A consume-queue file gone from the middle of a queue: a pull inside it answers
    OFFSET_FOUND_NULL with the next file's first offset, and from there the later units are served
    (none of them is dropped)."""
    st = _reopened_without_queue_file(tmp_path, clock, 12, 4)  # units 4..7
    try:
        gap = st.get_messages("TopicA", 0, 5)
        assert (gap.status, gap.next_begin_offset, gap.min_offset, gap.max_offset) == \
            (GetStatus.OFFSET_FOUND_NULL, 8, 0, 12)
        after = st.get_messages("TopicA", 0, gap.next_begin_offset)
        assert (after.status, after.queue_offsets, after.next_begin_offset) == (GetStatus.FOUND, (8, 9, 10, 11), 12)
        assert [r.body for r in split_records(after.body)] == [bytes([i]) for i in range(8, 12)]
        assert st.get_messages("TopicA", 0, 0).queue_offsets == (0, 1, 2, 3)
    finally:
        st.close()


def test_tag_filter(store):
    tags = ["TagA", "TagB", "Aa", "BB", None, "TagA"]  # "Aa" and "BB" share a Java hash code
    for i, t in enumerate(tags):
        store.put_message(msg(body=bytes([i]), **({"TAGS": t} if t else {})))
    store.caught_up()
    a = store.get_messages("TopicA", 0, 0, tag_filter={"TagA"})
    assert (a.status, a.queue_offsets, a.next_begin_offset) == (GetStatus.FOUND, (0, 5), 6)
    aa = store.get_messages("TopicA", 0, 0, tag_filter={"Aa"})
    assert aa.queue_offsets == (2,)  # BB has the same tagsCode but not the same TAGS
    both = store.get_messages("TopicA", 0, 1, tag_filter={"TagB", "BB"})
    assert both.queue_offsets == (1, 3)
    assert store.get_messages("TopicA", 0, 0, tag_filter={"*"}).queue_offsets == (0, 1, 2, 3, 4, 5)
    none = store.get_messages("TopicA", 0, 2, tag_filter={"Nothing"})
    assert (none.status, none.next_begin_offset, none.body) == (GetStatus.NO_MATCHED_MESSAGE, 6, b"")


def test_max_msgs_and_max_bytes(store):
    results = [store.put_message(msg(body=b"x" * 100)) for _ in range(10)]
    size = results[0].wrote_bytes
    assert all(r.wrote_bytes == size for r in results)
    store.caught_up()
    three = store.get_messages("TopicA", 0, 2, max_msgs=3)
    assert (three.queue_offsets, three.next_begin_offset) == ((2, 3, 4), 5)
    two = store.get_messages("TopicA", 0, 0, max_bytes=2 * size)
    assert (two.queue_offsets, two.next_begin_offset, len(two.body)) == ((0, 1), 2, 2 * size)
    first_always = store.get_messages("TopicA", 0, 7, max_bytes=10)
    assert (first_always.queue_offsets, first_always.next_begin_offset) == ((7,), 8)
    all_ = store.get_messages("TopicA", 0, 0)
    assert (all_.message_count, all_.next_begin_offset) == (10, 10)


# ---- delays and the schedule service --------------------------------------------------------------------
def test_delay_goes_through_schedule_topic(tmp_path, clock):
    s = settings()
    st = DispatchedStore(tmp_path / "s", s, clock=clock)
    st.open()
    put = st.put_message(msg(body=b"later", queue_id=2, TAGS="TagD", DELAY="1", KEYS="dk"))
    assert (put.topic, put.queue_id, put.queue_offset, put.store_timestamp) == (SCHEDULE_TOPIC, 0, 0, T0)
    stored = put.records[0]
    assert stored.properties == {"TAGS": "TagD", "DELAY": "1", "KEYS": "dk", "REAL_TOPIC": "TopicA", "REAL_QID": "2"}
    clamped = st.put_message(msg(body=b"much later", DELAY="7"))  # also stored at T0
    assert (clamped.topic, clamped.queue_id) == (SCHEDULE_TOPIC, 1)  # level 7 clamped to the max (2)
    assert clamped.records[0].properties["DELAY"] == "2"
    st.caught_up()
    assert st.consume_queue(SCHEDULE_TOPIC, 0).unit(0)[2] == T0 + 1000  # tagsCode = deliver time
    assert st.get_messages("TopicA", 2, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE

    meta = BrokerMetadata(st)
    sched = ScheduleService(st, meta.delay_offsets)
    assert sched.run_once(T0 + 999) == 0
    assert sched.run_once(T0 + 1000) == 1
    st.caught_up()
    got = st.get_messages("TopicA", 2, 0)
    assert got.queue_offsets == (0,)
    (delivered,) = split_records(got.body)
    assert delivered.body == b"later"
    assert delivered.properties_raw == stored.properties_raw  # DELAY / REAL_TOPIC / REAL_QID stay on disk
    assert (delivered.born_timestamp, delivered.born_host, delivered.flag) == (T0 - 5, BORN_HOST, 7)
    assert DelayOffsetTable.load(config_path(tmp_path / "s", DELAY_OFFSET_FILE)).offsets == {1: 1}
    assert sched.run_once(T0 + 1500) == 0  # level 2 not due yet
    assert sched.run_once(T0 + 2010) == 1
    st.caught_up()
    assert st.get_messages("TopicA", 0, 0).message_count == 1
    assert st.query_by_key("TopicA", "dk").physical_offsets == (delivered.physical_offset,)
    assert st.query_by_key(SCHEDULE_TOPIC, "dk").physical_offsets == (stored.physical_offset,)
    meta.close()
    st.close()
    assert_clean(tmp_path / "s", s)

    st = DispatchedStore(tmp_path / "s", s, clock=clock)
    st.open()
    again = ScheduleService(st, BrokerMetadata(st).delay_offsets)
    assert again.run_once(T0 + 60_000) == 0  # offsets were persisted: nothing twice
    assert st.max_offset("TopicA", 2) == 1
    st.close()


def test_schedule_service_thread(tmp_path):
    st = DispatchedStore(tmp_path / "s", settings())  # real clock
    st.open()
    sched = ScheduleService(st, BrokerMetadata(st).delay_offsets)
    sched.start(interval_ms=20)
    try:
        st.put_message(msg(body=b"soon", DELAY="1"))
        for _ in range(300):
            if st.max_offset("TopicA", 0):
                break
            threading.Event().wait(0.01)
    finally:
        sched.stop()
    assert st.max_offset("TopicA", 0) == 1
    st.close()


def test_send_back_retry_then_dlq(tmp_path, clock):
    s = settings()
    st = DispatchedStore(tmp_path / "s", s, clock=clock)
    st.open()
    meta = BrokerMetadata(st)
    meta.groups.put(SubscriptionGroupConfig("g", retry_max_times=2))
    orig = st.put_message(msg(body=b"work", TAGS="TagA", KEYS="order-1", UNIQ_KEY="UK1"))
    sched = ScheduleService(st, meta.delay_offsets)
    origin_id = encode_offset_msg_id(STORE_HOST, orig.physical_offsets[0])

    phy = orig.physical_offsets[0]
    for attempt in (1, 2):
        back = consumer_send_back(st, meta, "g", phy, 0)
        assert back.ok
        assert (back.put.topic, back.put.queue_id) == (SCHEDULE_TOPIC, 1)  # 3 + reconsumeTimes, clamped to 2
        st.caught_up()
        assert sched.run_once(clock.advance(2000).now) == 1
        st.caught_up()
        got = st.get_messages("%RETRY%g", 0, attempt - 1)
        (retry,) = split_records(got.body)
        assert retry.reconsume_times == attempt
        assert retry.properties == {"TAGS": "TagA", "KEYS": "order-1", "UNIQ_KEY": "UK1", "RETRY_TOPIC": "TopicA",
                                    "DELAY": "2", "ORIGIN_MESSAGE_ID": origin_id, "REAL_TOPIC": "%RETRY%g",
                                    "REAL_QID": "0"}
        assert (retry.body, retry.flag, retry.born_timestamp, retry.born_host) == (b"work", 7, T0 - 5, BORN_HOST)
        phy = retry.physical_offset

    dlq = consumer_send_back(st, meta, "g", phy, 0)
    assert (dlq.status, dlq.put.topic, dlq.put.queue_id) == ("OK", "%DLQ%g", 0)
    st.caught_up()
    (dead,) = split_records(st.get_messages("%DLQ%g", 0, 0).body)
    assert dead.reconsume_times == 3
    assert dead.properties["DELAY"] == "0" and dead.properties["ORIGIN_MESSAGE_ID"] == origin_id
    assert dead.properties["RETRY_TOPIC"] == "TopicA"
    assert "REAL_TOPIC" in dead.properties  # carried over from the retry copy, as in Apache

    # delayLevel < 0 goes straight to the DLQ; a bad offset is reported
    assert consumer_send_back(st, meta, "g", orig.physical_offsets[0], -1).put.topic == "%DLQ%g"
    assert consumer_send_back(st, meta, "g", 12345, 0).status == "MESSAGE_NOT_FOUND"
    meta.groups.put(SubscriptionGroupConfig("noretry", retry_queue_nums=0))
    assert consumer_send_back(st, meta, "noretry", orig.physical_offsets[0]).put is None  # dropped, answered OK
    meta.close()
    st.close()
    topics = TopicConfigTable.load(config_path(tmp_path / "s", TOPICS_FILE))
    for name in ("%RETRY%g", "%DLQ%g"):
        cfg = topics.get(name)
        assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (1, 1, 6)
    assert topics.get(SCHEDULE_TOPIC).read_queue_nums == 2
    assert_clean(tmp_path / "s", s)


# ---- metadata --------------------------------------------------------------------------------------------
def test_consumer_offsets_persist_and_query(tmp_path, clock):
    s = settings()
    st = DispatchedStore(tmp_path / "s", s, clock=clock)
    st.open()
    meta = BrokerMetadata(st)
    for i in range(3):
        st.put_message(msg(queue_id=1))
    st.caught_up()
    assert meta.query_consumer_offset("g1", "TopicA", 1) == 0  # queue starts at 0, in memory
    assert meta.query_consumer_offset("g1", "TopicA", 5) == 0  # empty queue: 4.9.8 answers 0
    assert meta.query_consumer_offset("g1", "TopicA", 1, set_zero_if_not_found=False) is None
    meta.consumer_offsets.commit_offset("g1", "TopicA", 1, 2)
    meta.consumer_offsets.commit_offset("g2", "TopicA", 0, 0)
    meta.close()
    st.close()
    table = ConsumerOffsetTable.load(config_path(tmp_path / "s", CONSUMER_OFFSET_FILE))
    assert table.offsets == {"TopicA@g1": {1: 2}, "TopicA@g2": {0: 0}}
    st = DispatchedStore(tmp_path / "s", s, clock=clock)
    st.open()
    meta = BrokerMetadata(st)
    assert meta.query_consumer_offset("g1", "TopicA", 1) == 2
    assert meta.consumer_offsets.offsets_for("g2", "TopicA") == {0: 0}
    meta.close()
    st.close()


def test_topic_and_group_managers(store):
    meta = BrokerMetadata(store)
    assert meta.topics.get("TBW102").perm == 7
    created = meta.topics.create_topic_in_send_message("NewTopic", "TBW102", 16)
    assert (created.read_queue_nums, created.write_queue_nums, created.perm) == (8, 8, 6)
    assert meta.topics.create_topic_in_send_message("Other", "NoSuchTemplate", 4) is None
    assert meta.topics.create_topic_in_send_message("Other2", "NewTopic", 4) is None  # no inherit bit
    g = meta.groups.find("fresh-group")
    assert (g.retry_max_times, g.retry_queue_nums) == (16, 1)
    assert meta.groups.get("SELF_TEST_C_GROUP") is not None


# ---- lookups ---------------------------------------------------------------------------------------------
def test_query_by_key(store):
    offsets = {}
    for i in range(200):  # 3 index entries per message: the 256-entry index rolls to new files
        res = store.put_message(msg(queue_id=i % 4, KEYS=f"order-{i} shared", UNIQ_KEY=f"U{i:04d}"))
        offsets[i] = res.physical_offsets[0]
    store.caught_up()
    assert len(list((store.store_dir / INDEX_DIR).iterdir())) >= 2  # written by the dispatcher process
    assert store.query_by_key("TopicA", "order-7").physical_offsets == (offsets[7],)
    assert store.query_by_key("TopicA", "U0150").physical_offsets == (offsets[150],)
    shared = store.query_by_key("TopicA", "shared", max_num=5)
    assert shared.physical_offsets == tuple(offsets[i] for i in range(195, 200))  # newest 5, oldest first
    assert [r.properties["UNIQ_KEY"] for r in split_records(shared.body)] == [f"U{i:04d}" for i in range(195, 200)]
    assert store.query_by_key("TopicB", "order-7").physical_offsets == ()
    assert store.query_by_key("TopicA", "order-7", begin_ms=T0 + 100_000).physical_offsets == ()


def test_search_offset_by_time_and_earliest(tmp_path):
    clock = FakeClock()
    st = DispatchedStore(tmp_path / "s", settings(), clock=clock)
    st.open()
    assert st.earliest_store_time("TopicA", 0) == -1
    assert st.search_offset_by_time("TopicA", 0, T0) == 0
    for i in range(5):  # stored at T0, T0+1000, ... T0+4000
        st.put_message(msg(body=bytes([i])))
        clock.advance(1000)
    st.caught_up()
    assert st.earliest_store_time("TopicA", 0) == T0
    assert st.search_offset_by_time("TopicA", 0, T0 + 2000) == 2
    assert st.search_offset_by_time("TopicA", 0, T0 + 2500) == 3
    assert st.search_offset_by_time("TopicA", 0, T0 + 2500, "upper") == 2
    assert st.search_offset_by_time("TopicA", 0, T0 - 1, "upper") == 0
    assert st.search_offset_by_time("TopicA", 0, T0 + 9999) == 5
    with pytest.raises(ValueError):
        st.search_offset_by_time("TopicA", 0, T0, "middle")
    st.close()


@pytest.mark.parametrize("store", ["inline"], indirect=True)  # drives the in-process dispatcher
def test_dispatcher_catch_up_is_idempotent(store):
    for i in range(30):
        store.put_message(msg(queue_id=i % 3, KEYS=f"k{i}"))
    assert store.dispatcher.next_offset == store.commitlog_max_offset
    assert store.dispatcher.catch_up(0) == 0  # everything already in the queues and the index
    assert store.dispatcher.catch_up(0, store.commitlog_max_offset) == 0
    assert [store.max_offset("TopicA", q) for q in range(3)] == [10, 10, 10]
    assert len(store.query_by_key("TopicA", "k29").physical_offsets) == 1


def test_read_record_bytes_and_bad_offsets(store):
    res = store.put_message(msg(body=b"abc"))
    data = store.read_record_bytes(0)
    assert data == res.records[0].encode() and len(data) == res.wrote_bytes
    with pytest.raises(RecordError):
        store.read_record_bytes(1)  # not a record start
    with pytest.raises(RecordError):
        store.view_message(store.commitlog_max_offset)


# ---- flushing, concurrency, shutdown --------------------------------------------------------------------
@pytest.mark.parametrize("flush", [SYNC_FLUSH, ASYNC_FLUSH])
def test_flush_modes_and_concurrent_puts(tmp_path, flush):
    s = settings(flush_disk_type=flush, flush_interval_ms=20, checkpoint_interval_ms=20, segment_bytes=64 * 1024)
    st = DispatchedStore(tmp_path / "s", s)
    st.open()
    st.start_background()
    results: list = []
    lock = threading.Lock()

    def producer(n: int) -> None:
        for i in range(50):
            r = st.put_message(msg(body=f"{n}-{i}".encode(), queue_id=n % 2, KEYS=f"p{n}"))
            with lock:
                results.append(r)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status is PutStatus.PUT_OK for r in results)
    st.caught_up()
    for qid in (0, 1):
        offsets = sorted(r.queue_offset for r in results if r.queue_id == qid)
        assert offsets == list(range(100))
        bodies = []
        offset = 0
        while offset < st.max_offset("TopicA", qid):
            got = st.get_messages("TopicA", qid, offset)
            bodies += [r.body for r in split_records(got.body)]
            offset = got.next_begin_offset
        assert sorted(bodies) == sorted(f"{n}-{i}".encode() for n in range(qid, 4, 2) for i in range(50))
    if flush == SYNC_FLUSH:
        assert st._flushed_offset == st.commitlog_max_offset  # every put waited for its fsync
    last_ts = max(r.store_timestamp for r in results)
    st.close()
    cp = read_checkpoint(tmp_path / "s")
    assert cp.physic_msg_timestamp == cp.logics_msg_timestamp == cp.index_msg_timestamp == last_ts
    assert_clean(tmp_path / "s", s)


def test_clean_close_and_reopen_continue(tmp_path, clock):
    s = settings()
    root = tmp_path / "s"
    st = DispatchedStore(root, s, clock=clock)
    report = st.open()
    assert not report.abnormal and abort_marker_exists(root)
    puts = [st.put_message(msg(body=b"y" * 500, queue_id=i % 3)) for i in range(60)]  # ~2 commitlog files
    st.close()
    assert not abort_marker_exists(root)
    assert read_checkpoint(root).physic_msg_timestamp == puts[-1].store_timestamp
    assert_clean(root, s)

    st = DispatchedStore(root, s, clock=clock)
    report = st.open()
    assert (report.abnormal, report.redispatched, report.bytes_truncated, report.cq_units_truncated) == (False, 0, 0, 0)
    assert report.commitlog_end == st.commitlog_max_offset
    nxt = st.put_message(msg(queue_id=1))
    assert nxt.queue_offset == 20
    assert nxt.physical_offsets[0] == report.commitlog_end == puts[-1].physical_offsets[0] + puts[-1].wrote_bytes
    first = st.get_messages("TopicA", 0, 0)  # 16 units per CQ file: a pull stops at the file end
    assert (first.message_count, first.next_begin_offset) == (16, 16)
    assert st.get_messages("TopicA", 0, 16).queue_offsets == (16, 17, 18, 19)
    with pytest.raises(Exception):
        MessageStore(root, s).open()  # locked by us
    st.close()
    assert_clean(root, s)
