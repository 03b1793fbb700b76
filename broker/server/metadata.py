"""The broker's metadata tables, owned by the request layer: topics, groups, consumer and delay offsets.

Apache's broker keeps these managers on the ``BrokerController`` (the request side), not in the
``DefaultMessageStore``: the store appends, flushes and reads; what a topic or a group is, and how
far a consumer got, is the processors' business. :class:`BrokerMetadata` is that owner here. It
loads the four ``config/*.json`` tables of an open store (the store's lock guards the directory),
writes the changed ones every ``StoreSettings.persist_interval_ms`` on its own thread (Apache's
``flushConsumerOffsetInterval``), and all of them on :meth:`BrokerMetadata.close`, which the owner
calls before it closes the store, so nothing committed before a clean stop is lost.

The store still needs one fact from the topic table (whether a topic it deleted has a config again);
it gets a narrow check (``MessageStore.set_topic_config_check``), never the manager. The schedule
service is handed :attr:`BrokerMetadata.delay_offsets` (it owns their progress, as Apache's
``ScheduleMessageService`` does); this object only persists them with the rest.
"""

from __future__ import annotations

import logging

from broker.engine.message_store import MessageStore
from broker.server.offsets import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfigManager,
    resolve_consumer_offset,
)
from broker.engine.periodic import Periodic

log = logging.getLogger(__name__)


class BrokerMetadata:
    """The topic, subscription group, consumer offset and delay offset tables of one open store.

    Load it after ``store.open()`` and close it before ``store.close()``; :meth:`start` begins the
    periodic persist (a broker does; a test that only wants the tables need not).
    """

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        s = store.settings
        store_dir = store.store_dir
        fsync = s.fsync_metadata
        self.topics = TopicConfigManager(store_dir, cluster_name=s.cluster_name, broker_name=s.broker_name,
                                         delay_levels=len(s.delay_levels),
                                         auto_create_topic_enable=s.auto_create_topic_enable,
                                         default_topic_queue_nums=s.default_topic_queue_nums, fsync=fsync)
        self.groups = SubscriptionGroupManager(store_dir, auto_create=s.auto_create_subscription_group, fsync=fsync)
        self.consumer_offsets = ConsumerOffsetManager(store_dir, fsync=fsync)
        self.delay_offsets = DelayOffsetManager(store_dir, fsync=fsync)
        self._persister: Periodic | None = None
        # the store refuses client puts to a topic it deleted until the topic has a config again
        store.set_topic_config_check(self.has_topic_config)

    def has_topic_config(self, topic: str) -> bool:
        return self.topics.get(topic) is not None

    # ---- consumer offsets --------------------------------------------------------------------------
    def query_consumer_offset(self, group: str, topic: str, queue_id: int,
                              set_zero_if_not_found: bool = True) -> int | None:
        """QUERY_CONSUMER_OFFSET (remoting-protocol.md 9.5): committed offset, else 0 for a queue
        that still starts at 0 in memory (or is empty), else None (answer 22). The queue facts are
        the store's reads; the decision is the request layer's (``ConsumerManageProcessor``)."""
        return resolve_consumer_offset(
            self.consumer_offsets.query_offset(group, topic, queue_id),
            lambda: self.store.min_offset(topic, queue_id),
            lambda: self.store.check_in_disk_by_consume_offset(topic, queue_id, 0),
            set_zero_if_not_found)

    # ---- persisting --------------------------------------------------------------------------------
    def persist(self, force: bool = False) -> None:
        """Write the ``config/*.json`` tables that changed (all of them with ``force``)."""
        for manager in (self.topics, self.groups, self.consumer_offsets, self.delay_offsets):
            manager.persist(force)

    def start(self) -> None:
        """Persist the changed tables every ``persist_interval_ms`` on a daemon thread."""
        if self._persister is None:
            self._persister = Periodic("metadata-persist", self.store.settings.persist_interval_ms, self.persist)
            self._persister.start()

    def close(self) -> None:
        """Stop the periodic persist and write every table (call before closing the store: its
        lock must still guard ``config/``)."""
        if self._persister is not None:
            self._persister.stop()
            self._persister = None
        self.persist(force=True)
        log.info("persisted the broker metadata of %s", self.store.store_dir)
