"""broker.server.metadata.BrokerMetadata: the request layer's tables over an open store — loading,
the periodic persist on its own thread, the persist on close, and the one fact the store asks of
them (whether a topic it deleted has a config again)."""

from __future__ import annotations

import threading

import pytest

from broker.engine import MessageStore, PutStatus, StoreSettings
from broker.server import BrokerMetadata
from broker.store.config_files import ConsumerOffsetTable, DelayOffsetTable, TopicConfig, config_path
from broker.store.constants import CONSUMER_OFFSET_FILE, DELAY_OFFSET_FILE, SUBSCRIPTION_GROUP_FILE, TOPICS_FILE
from broker.store.message import MessageRecord

SETTINGS = StoreSettings(segment_bytes=16 * 1024, cq_file_bytes=20 * 16, index_slots=64, index_entries=256,
                         fsync_metadata=False, persist_interval_ms=20)


@pytest.fixture
def store(tmp_path):
    st = MessageStore(tmp_path / "s", SETTINGS)
    st.open()
    yield st
    if st.is_open:
        st.close()


def _put(store: MessageStore, topic: str) -> PutStatus:
    return store.put_message(MessageRecord(topic=topic, body=b"x", queue_id=0)).status


def test_periodic_persist_writes_changed_offsets_on_its_own_thread(store):
    meta = BrokerMetadata(store)
    ticked = threading.Event()
    persist = meta.persist

    def persist_and_tell(force: bool = False) -> None:
        persist(force)
        if threading.current_thread().name == "metadata-persist":
            ticked.set()

    meta.persist = persist_and_tell  # the tick calls what start() found
    meta.consumer_offsets.commit_offset("g", "T", 0, 7)
    meta.start()
    try:
        assert ticked.wait(30)
        table = ConsumerOffsetTable.load(config_path(store.store_dir, CONSUMER_OFFSET_FILE))
        assert table.offsets == {"T@g": {0: 7}}
    finally:
        meta.close()
    assert not any(t.name == "metadata-persist" for t in threading.enumerate())


def test_close_writes_every_table_and_a_reload_sees_them(store):
    meta = BrokerMetadata(store)
    meta.consumer_offsets.commit_offset("g", "T", 1, 3)
    meta.delay_offsets.set(2, 5)
    for name in (TOPICS_FILE, SUBSCRIPTION_GROUP_FILE, CONSUMER_OFFSET_FILE, DELAY_OFFSET_FILE):
        assert not config_path(store.store_dir, name).exists()  # loading writes nothing
    meta.close()
    for name in (TOPICS_FILE, SUBSCRIPTION_GROUP_FILE, CONSUMER_OFFSET_FILE, DELAY_OFFSET_FILE):
        assert config_path(store.store_dir, name).exists()
    assert DelayOffsetTable.load(config_path(store.store_dir, DELAY_OFFSET_FILE)).offsets == {2: 5}
    again = BrokerMetadata(store)
    assert again.consumer_offsets.query_offset("g", "T", 1) == 3
    assert again.query_consumer_offset("g", "T", 1) == 3
    assert again.query_consumer_offset("g", "T", 0) == 0  # empty queue: 4.9.8 answers 0
    assert again.delay_offsets.get(2) == 5


def test_store_asks_the_metadata_whether_a_deleted_topic_exists_again(store):
    meta = BrokerMetadata(store)
    meta.topics.put(TopicConfig("T", 1, 1, 6))
    assert _put(store, "T") is PutStatus.PUT_OK
    meta.topics.delete("T")
    store.delete_topic_queues("T")
    assert _put(store, "T") is PutStatus.TOPIC_NOT_EXIST
    meta.topics.put(TopicConfig("T", 1, 1, 6))  # created anew: client puts go through again
    assert _put(store, "T") is PutStatus.PUT_OK
    assert store.max_offset("T", 0) == 1


def test_without_metadata_a_deleted_topic_takes_no_client_put(store):
    assert _put(store, "T") is PutStatus.PUT_OK
    store.delete_topic_queues("T")
    assert _put(store, "T") is PutStatus.TOPIC_NOT_EXIST
