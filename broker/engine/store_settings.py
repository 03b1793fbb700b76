"""The storage engine's settings: Apache's ``MessageStoreConfig`` (and the few ``BrokerConfig`` values
the store needs), as one frozen value handed to the store, the dispatcher and recovery.

Broker-level settings (under ``broker.conf`` names) live in :mod:`broker.server.settings`, which
builds this from them; this module holds only what the engine itself reads, so the engine does not
depend on the request layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.store.constants import (
    ASYNC_FLUSH,
    CQ_STORE_UNIT_SIZE,
    DEFAULT_MAPPED_FILE_SIZE_COMMITLOG,
    DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE,
    DEFAULT_MAX_HASH_SLOT_NUM,
    DEFAULT_MAX_INDEX_NUM,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MESSAGE_DELAY_LEVEL,
    SYNC_FLUSH,
    FlushDiskType,
)
from broker.store.delay import parse_delay_levels
from broker.store.hosts import Host
from broker.store.topics import DEFAULT_TOPIC_QUEUE_NUMS


@dataclass(frozen=True)
class StoreSettings:
    """``MessageStoreConfig`` (and the few ``BrokerConfig`` values the store needs).

    Defaults are Apache's. Test stores shrink ``segment_bytes``, ``cq_file_bytes`` and the index
    geometry so that files stay small; a store must be reopened with the sizes it was written with.
    """

    segment_bytes: int = DEFAULT_MAPPED_FILE_SIZE_COMMITLOG
    cq_file_bytes: int = DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE
    index_slots: int = DEFAULT_MAX_HASH_SLOT_NUM
    index_entries: int = DEFAULT_MAX_INDEX_NUM
    flush_disk_type: FlushDiskType = ASYNC_FLUSH  # a plain "ASYNC_FLUSH"/"SYNC_FLUSH" is taken as the enum
    flush_interval_ms: int = 500  # flushIntervalCommitLog (ASYNC_FLUSH background fsync)
    sync_flush_timeout_ms: int = 5000  # syncFlushTimeout: slower fsync answers FLUSH_DISK_TIMEOUT
    checkpoint_interval_ms: int = 1000  # flushIntervalConsumeQueue: CQ/index fsync + checkpoint
    persist_interval_ms: int = 5000  # flushConsumerOffsetInterval: config/*.json
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    store_host: Host = Host(bytes([127, 0, 0, 1]), 10911)
    cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    check_crc_on_recover: bool = True
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS  # defaultTopicQueueNums: TBW102's queues
    access_message_in_memory_max_ratio: int = 40  # % of RAM; older messages count as "in disk"
    fsync_metadata: bool = True
    # True in the multiprocess broker: a separate dispatcher process builds the consume queues and
    # the index from the commitlog (Apache's ReputMessageService); puts only append and flush, and
    # the dispatcher's progress comes back through ``external_advance``. Which of the two
    # :mod:`broker.engine.dispatch` modes the store runs in.
    external_dispatch: bool = False

    def __post_init__(self) -> None:
        if self.flush_disk_type not in (ASYNC_FLUSH, SYNC_FLUSH):
            raise ValueError(f"flush_disk_type must be {ASYNC_FLUSH} or {SYNC_FLUSH}, got {self.flush_disk_type!r}")
        object.__setattr__(self, "flush_disk_type", FlushDiskType(self.flush_disk_type))
        if self.segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        if self.cq_file_bytes <= 0 or self.cq_file_bytes % CQ_STORE_UNIT_SIZE:
            raise ValueError("cq_file_bytes must be a positive multiple of 20")
        if self.index_slots < 1 or self.index_entries < 2:
            raise ValueError("index needs at least 1 slot and 2 entries")
        parse_delay_levels(self.message_delay_level)  # fail early on a bad spec

    @property
    def delay_levels(self) -> list[int]:
        """Delay per level in ms (index 0 = level 1)."""
        return parse_delay_levels(self.message_delay_level)
