"""Broker metadata kept in the store directory: topic configs, subscription groups, consumer and delay offsets.

Each manager owns one ``config/*.json`` table (parsed and written by :mod:`broker.store.config_files`,
which does Apache's ``.tmp``/``.bak`` dance and fastjson layout), guards it with its own lock, and
remembers whether it changed since the last write, so the periodic persist
(:class:`~broker.server.metadata.BrokerMetadata`, which owns the managers) only touches files that
need it. Behaviour follows the 4.9.8 broker managers (``TopicConfigManager``,
``SubscriptionGroupManager``, ``ConsumerOffsetManager``, the schedule service's offset table), as
summarised in remoting-protocol.md 9.3–9.5 and store-format.md 10.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Callable, Iterable

from broker.store.config_files import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    TopicConfig,
    TopicConfigTable,
    config_path,
    split_topic_group,
    topic_group_key,
)
from broker.store.constants import (
    CONSUMER_OFFSET_FILE,
    DELAY_OFFSET_FILE,
    SUBSCRIPTION_GROUP_FILE,
    TOPIC_NAME_PATTERN,
    TOPICS_FILE,
)
from broker.store.topics import DEFAULT_TOPIC, DEFAULT_TOPIC_QUEUE_NUMS, SCHEDULE_TOPIC, InvalidTopicError

log = logging.getLogger(__name__)

# PermName bits (remoting-protocol.md 9.1)
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1

# Groups a fresh 4.9.8 broker creates (SubscriptionGroupManager.init).
SYSTEM_GROUPS = ("TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                 "CID_ONSAPI_PULL", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER")
# Apache 5.x SubscriptionGroupConfig field: Set<SimpleSubscriptionData{topic, expressionType, expression, version}>
SUBSCRIPTION_DATA_SET = "subscriptionDataSet"


class _Persistent:
    """Dirty tracking shared by the managers: ``_changed()`` under the lock, ``persist()`` writes."""

    def __init__(self, path: Path, fsync: bool) -> None:
        self.path = path
        self._fsync = fsync
        self._lock = threading.RLock()
        self._version = 0
        self._persisted = 0

    def _changed(self) -> None:
        self._version += 1

    @property
    def lock(self) -> threading.RLock:
        """Held while the table changes: hold it to read the whole table from another thread
        (iterating it while a request thread adds an entry raises RuntimeError)."""
        return self._lock

    def _table(self):  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def dirty(self) -> bool:
        return self._version != self._persisted

    def persist(self, force: bool = False) -> bool:
        """Write the file if it changed since the last write (or ``force``); True if written."""
        with self._lock:
            if not force and not self.dirty:
                return False
            version = self._version
            self._table().save(self.path, fsync=self._fsync)
            self._persisted = version
            return True


class TopicConfigManager(_Persistent):
    """``topics.json``. The system topics a fresh broker has are always present (Apache puts them in
    the table before loading the file over it), and creations persist at once, as Apache does."""

    def __init__(self, store_dir: str | os.PathLike, *, cluster_name: str = "DefaultCluster",
                 broker_name: str = "broker-a", delay_levels: int = 18, auto_create_topic_enable: bool = True,
                 default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS, fsync: bool = True) -> None:
        super().__init__(config_path(store_dir, TOPICS_FILE), fsync)
        self.auto_create_topic_enable = auto_create_topic_enable
        self.table: TopicConfigTable = TopicConfigTable.load(self.path)
        seeded = False
        for config in self._system_topics(cluster_name, broker_name, delay_levels, default_topic_queue_nums):
            if config.topic_name not in self.table:
                self.table.topics[config.topic_name] = config
                seeded = True
        if seeded:
            self._changed()

    def _system_topics(self, cluster: str, broker: str, delay_levels: int, default_queues: int) -> list[TopicConfig]:
        rw = PERM_READ | PERM_WRITE
        topics = [
            TopicConfig("SELF_TEST_TOPIC", 1, 1, rw),
            TopicConfig("BenchmarkTest", 1024, 1024, rw),
            TopicConfig(cluster, 16, 16, rw | PERM_INHERIT),
            TopicConfig(broker, 1, 1, rw | PERM_INHERIT),
            TopicConfig("OFFSET_MOVED_EVENT", 1, 1, rw),
            TopicConfig(SCHEDULE_TOPIC, delay_levels, delay_levels, rw),
            TopicConfig(f"{cluster}_REPLY_TOPIC", 1, 1, rw),
        ]
        if self.auto_create_topic_enable:
            topics.append(TopicConfig(DEFAULT_TOPIC, default_queues, default_queues, rw | PERM_INHERIT))
        return topics

    def _table(self) -> TopicConfigTable:
        return self.table

    def get(self, topic: str) -> TopicConfig | None:
        with self._lock:
            return self.table.get(topic)

    def put(self, config: TopicConfig) -> None:
        """Create or update a topic (UPDATE_AND_CREATE_TOPIC) and persist."""
        with self._lock:
            self.table.put(config)
            self._changed()
            self.persist()

    def delete(self, topic: str) -> bool:
        """``deleteTopicConfig``: remove the topic, bump the data version and persist at once;
        False (nothing written) when there was no such topic."""
        with self._lock:
            if self.table.topics.pop(topic, None) is None:
                log.warning("delete topic config failed, topic: %s not exists", topic)
                return False
            self.table.data_version.bump()
            self._changed()
            self.persist()
            log.info("deleted topic config %s", topic)
            return True

    def create_topic_in_send_message(self, topic: str, default_topic: str = DEFAULT_TOPIC,
                                     client_default_queue_nums: int = 4, topic_sys_flag: int = 0) -> TopicConfig | None:
        """Auto-create on send (remoting-protocol.md 9.3): the template must have PERM_INHERIT; the
        new topic gets ``min(client queues, template write queues)`` queues and the template's perm
        without the inherit bit. None when the template is missing or not inheritable."""
        with self._lock:
            existing = self.table.get(topic)
            if existing is not None:
                return existing
            template = self.table.get(default_topic)
            if template is None:
                log.warning("cannot auto-create %s: template topic %s does not exist", topic, default_topic)
                return None
            perm = template.perm
            if default_topic == DEFAULT_TOPIC and not self.auto_create_topic_enable:
                perm = PERM_READ | PERM_WRITE
            if not perm & PERM_INHERIT:
                log.warning("cannot auto-create %s: template %s has no inherit permission", topic, default_topic)
                return None
            queues = max(0, min(client_default_queue_nums, template.write_queue_nums))
            config = TopicConfig(topic, queues, queues, perm & ~PERM_INHERIT,
                                 topic_filter_type=template.topic_filter_type, topic_sys_flag=topic_sys_flag)
            self.put(config)
            log.info("auto-created topic %s from %s with %d queues", topic, default_topic, queues)
            return config

    def create_topic_in_send_back(self, topic: str, queue_nums: int, perm: int = PERM_READ | PERM_WRITE,
                                  topic_sys_flag: int = 0) -> TopicConfig:
        """``%RETRY%``/``%DLQ%`` topics: created on first use with the given queues and perm.

        The name comes from a client's group name, so it is checked like a topic (≤ 255 chars of
        ``[%|a-zA-Z0-9_-]``): InvalidTopicError instead of a config entry no queue could ever have."""
        if len(topic) > 255 or not TOPIC_NAME_PATTERN.fullmatch(topic):
            raise InvalidTopicError(f"{topic[:300]!r} is not a valid retry/DLQ topic name")
        with self._lock:
            existing = self.table.get(topic)
            if existing is not None:
                return existing
            config = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
            self.put(config)
            log.info("created topic %s with %d queues", topic, queue_nums)
            return config


class SubscriptionGroupManager(_Persistent):
    """``subscriptionGroup.json``; groups are auto-created on first lookup when enabled (the
    default), with ``SubscriptionGroupConfig`` defaults (16 retries, 1 retry queue)."""

    def __init__(self, store_dir: str | os.PathLike, *, auto_create: bool = True, fsync: bool = True) -> None:
        super().__init__(config_path(store_dir, SUBSCRIPTION_GROUP_FILE), fsync)
        self.auto_create = auto_create
        self.table: SubscriptionGroupTable = SubscriptionGroupTable.load(self.path)
        # group -> (config, its stored subscriptionDataSet list, keys): see add_subscription
        self._pulled: dict[str, tuple[SubscriptionGroupConfig, object, set[tuple[str, str, str]]]] = {}
        seeded = False
        for name in SYSTEM_GROUPS:
            if name not in self.table:
                self.table.groups[name] = SubscriptionGroupConfig(name)
                seeded = True
        if seeded:
            self._changed()

    def _table(self) -> SubscriptionGroupTable:
        return self.table

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        with self._lock:
            return self.table.get(group)

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """``findSubscriptionGroupConfig``: the group, auto-created (and persisted) if enabled."""
        with self._lock:
            config = self.table.get(group)
            if config is None and self.auto_create:
                config = SubscriptionGroupConfig(group)
                self.put(config)
                log.info("auto-created subscription group %s", group)
            return config

    def put(self, config: SubscriptionGroupConfig) -> None:
        with self._lock:
            self.table.put(config)
            self._changed()
            self.persist()

    def delete(self, group: str) -> bool:
        """``deleteSubscriptionGroupConfig``: remove the group, bump the data version and persist at
        once; False (nothing written) when there was no such group."""
        with self._lock:
            if self.table.groups.pop(group, None) is None:
                log.warning("delete subscription group failed, subscription groupName: %s not exist", group)
                return False
            self.table.data_version.bump()
            self._changed()
            self.persist()
            self._pulled.pop(group, None)
            log.info("deleted subscription group %s", group)
            return True

    def update_subscriptions(self, group: str, subscriptions: Iterable[tuple[str, str, str, int]]) -> bool:
        """Record a group's subscriptions from a heartbeat as Apache 5.x's ``subscriptionDataSet``.

        ``subscriptions`` are ``(topic, expressionType, expression, version)``. The field is what
        5.x's ``SubscriptionGroupConfig`` persists (a ``Set<SimpleSubscriptionData>``), so offline
        readers (the consumer-lag report) learn the topics of a group that never committed an
        offset. Persisted only when the set of ``(topic, expressionType, expression)`` changes: a
        client restart bumps ``version`` on every heartbeat and must not rewrite the file each time.
        Returns True when the file was updated. Unknown groups are left alone (``find`` decides
        about auto-creation before this is called). A heartbeat's set is the group's whole set: it
        replaces what :meth:`add_subscription` added from pulls.
        """
        entries = sorted({(str(t), str(k or "TAG"), str(e if e is not None else "*")): int(v or 0)
                          for t, k, e, v in subscriptions}.items())
        with self._lock:
            config = self.table.get(group)
            if config is None:
                return False
            current = config.extra.get(SUBSCRIPTION_DATA_SET)
            if _subscription_keys(current) == [key for key, _ in entries] or (current is None and not entries):
                return False
            config.extra[SUBSCRIPTION_DATA_SET] = [
                {"expression": expr, "expressionType": kind, "topic": topic, "version": version}
                for (topic, kind, expr), version in entries]
            self.table.put(config)
            self._changed()
            self.persist()
            self._pulled.pop(group, None)
            log.info("group %s subscribes to %s", group, ", ".join(sorted({t for (t, _, _), _ in entries})) or "nothing")
            return True

    def add_subscription(self, group: str, topic: str, expression_type: str | None, expression: str | None,
                         version: int = 0) -> bool:
        """Add one subscription a PULL request states itself (pull consumers: their heartbeats carry
        no subscriptions, each pull names topic and expression) to ``subscriptionDataSet``.

        Added, never replacing: a pull consumer may read several topics or expressions in turn,
        and replacing would rewrite the file on every alternation. Persisted only when the
        ``(topic, expressionType, expression)`` is new. This runs on every pull, so a repeat is
        answered from a per-group cache without the lock; the cache entry is only trusted while the
        group's config object and stored list are the very objects it was made from (a heartbeat
        or an admin update that replaces either sends the next pull through the slow path).
        """
        key = (str(topic), str(expression_type or "TAG"), str(expression if expression is not None else "*"))
        config = self.table.groups.get(group)
        cached = self._pulled.get(group)
        if config is not None and cached is not None and cached[0] is config \
                and cached[1] is config.extra.get(SUBSCRIPTION_DATA_SET) and key in cached[2]:
            return False
        with self._lock:
            config = self.table.get(group)
            if config is None:
                return False
            current = config.extra.get(SUBSCRIPTION_DATA_SET)
            keys = _subscription_keys(current)
            changed = keys is None or key not in keys
            if changed:
                items = [dict(item) for item in current] if keys is not None else []
                items.append({"expression": key[2], "expressionType": key[1], "topic": key[0], "version": int(version or 0)})
                items.sort(key=lambda item: (str(item.get("topic")), str(item.get("expressionType", "TAG")),
                                             str(item.get("expression", "*"))))
                config.extra[SUBSCRIPTION_DATA_SET] = current = items
                self.table.put(config)
                self._changed()
                self.persist()
                log.info("group %s pulls %s (%s %s)", group, key[0], key[1], key[2])
            self._pulled[group] = (config, current, set(_subscription_keys(current) or ()))
            return changed


def _subscription_keys(value: object) -> list[tuple[str, str, str]] | None:
    """The ``(topic, expressionType, expression)`` keys of a stored ``subscriptionDataSet``, sorted;
    None when the stored value is missing or not a list of objects (then it is rewritten)."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        return None
    return sorted((str(item.get("topic")), str(item.get("expressionType", "TAG")), str(item.get("expression", "*")))
                  for item in value)


class ConsumerOffsetManager(_Persistent):
    """``consumerOffset.json``: committed offsets, written periodically and on close (not per commit)."""

    def __init__(self, store_dir: str | os.PathLike, *, fsync: bool = True) -> None:
        super().__init__(config_path(store_dir, CONSUMER_OFFSET_FILE), fsync)
        self.table: ConsumerOffsetTable = ConsumerOffsetTable.load(self.path)

    def _table(self) -> ConsumerOffsetTable:
        return self.table

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            if self.table.offsets.get(f"{topic}@{group}", {}).get(queue_id) != offset:
                self.table.set_offset(group, topic, queue_id, offset)
                self._changed()

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, -1 when none (Apache's ``queryOffset``)."""
        with self._lock:
            return self.table.offsets.get(f"{topic}@{group}", {}).get(queue_id, -1)

    def offsets_for(self, group: str, topic: str) -> dict[int, int]:
        with self._lock:
            return self.table.offsets_for(group, topic)

    def _remove_keys(self, keep: Callable[[str, str], bool]) -> int:
        with self._lock:
            gone = [key for key in self.table.offsets
                    if (pair := split_topic_group(key)) is not None and not keep(*pair)]
            for key in gone:
                del self.table.offsets[key]
            if gone:
                self._changed()
            return len(gone)

    def clean_offset_by_topic(self, topic: str) -> int:
        """``cleanOffsetByTopic``: drop the topic's offsets of every group; how many groups had some."""
        return self._remove_keys(lambda t, _g: t != topic)

    def remove_offset(self, group: str) -> int:
        """``removeOffset(group)``: drop the group's offsets on every topic; how many topics had some."""
        return self._remove_keys(lambda _t, g: g != group)

    def topics_of(self, group: str) -> list[str]:
        """``whichTopicByConsumer``: the topics ``group`` has committed offsets on, sorted."""
        with self._lock:
            return self.table.topics_of(group)

    def clone_offset(self, src_group: str, dest_group: str, topic: str) -> bool:
        """``cloneOffset``: ``dest_group``'s offsets on ``topic`` become a copy of ``src_group``'s
        (all queues replaced); False, and nothing changed, when the source has none there."""
        with self._lock:
            source = self.table.offsets.get(topic_group_key(topic, src_group))
            if source is None:
                return False
            self.table.offsets[topic_group_key(topic, dest_group)] = dict(source)
            self._changed()
            return True


class DelayOffsetManager(_Persistent):
    """``delayOffset.json``: per delay level, the next ``SCHEDULE_TOPIC_XXXX`` offset to deliver."""

    def __init__(self, store_dir: str | os.PathLike, *, fsync: bool = True) -> None:
        super().__init__(config_path(store_dir, DELAY_OFFSET_FILE), fsync)
        self.table: DelayOffsetTable = DelayOffsetTable.load(self.path)

    def _table(self) -> DelayOffsetTable:
        return self.table

    def get(self, level: int) -> int:
        with self._lock:
            return self.table.offset_for(level) or 0

    def set(self, level: int, offset: int) -> None:
        with self._lock:
            if self.table.offset_for(level) != offset:
                self.table.set_offset(level, offset)
                self._changed()


def resolve_consumer_offset(committed: int, min_offset: Callable[[], int], offset_zero_in_disk: Callable[[], bool],
                            set_zero_if_not_found: bool = True) -> int | None:
    """QUERY_CONSUMER_OFFSET (remoting-protocol.md 9.5): the committed offset if any; else 0 when
    allowed and the queue still starts at 0 with offset 0 not swapped out to disk (4.9.8's check,
    which also answers 0 for an empty queue); else None (response 22, "maybe this group consumer
    boot first")."""
    if committed >= 0:
        return committed
    if not set_zero_if_not_found:
        return None
    if min_offset() <= 0 and not offset_zero_in_disk():
        return 0
    return None
