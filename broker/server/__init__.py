"""The broker's server side: storage engine, recovery, delayed delivery and metadata managers.

``broker.store`` holds the byte-exact file formats; this package turns them into a running store
(:class:`MessageStore`). The network layer (request processors, long polling) wraps it.
"""

from broker.server.message_store import (
    ASYNC_FLUSH,
    SYNC_FLUSH,
    ConsumeQueueView,
    Dispatcher,
    GetResult,
    GetStatus,
    MessageStore,
    PutResult,
    PutStatus,
    QueryResult,
    SendBackResult,
    StoreError,
    StoreSettings,
)
from broker.server.offsets import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.server.recovery import QueueTail, RecoveryError, RecoveryReport
from broker.server.schedule import ScheduleService

__all__ = [
    "ASYNC_FLUSH", "SYNC_FLUSH", "ConsumeQueueView", "ConsumerOffsetManager", "DelayOffsetManager", "Dispatcher",
    "GetResult", "GetStatus", "MessageStore", "PutResult", "PutStatus", "QueryResult", "QueueTail",
    "RecoveryError", "RecoveryReport", "ScheduleService", "SendBackResult", "StoreError", "StoreSettings",
    "SubscriptionGroupManager", "TopicConfigManager",
]
