"""The broker's server side: storage engine, recovery, delayed delivery and metadata managers.

``broker.store`` holds the byte-exact file formats; this package turns them into a running store
(:class:`MessageStore`). The request layer (request processors, the metadata tables of
:class:`BrokerMetadata`, long polling) wraps it.
"""

from broker.server.dispatch import ConsumeQueueView, Dispatcher
from broker.server.message_store import (
    GetResult,
    GetStatus,
    MessageStore,
    PutResult,
    PutStatus,
    QueryResult,
    StoreError,
)
from broker.server.metadata import BrokerMetadata
from broker.server.offsets import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.server.recovery import QueueTail, RecoveryError, RecoveryReport
from broker.server.schedule import ScheduleService
from broker.server.send_back import SendBackResult, consumer_send_back
from broker.server.store_settings import StoreSettings
from broker.store.constants import ASYNC_FLUSH, SYNC_FLUSH

__all__ = [
    "ASYNC_FLUSH", "SYNC_FLUSH", "BrokerMetadata", "ConsumeQueueView", "ConsumerOffsetManager",
    "DelayOffsetManager", "Dispatcher",
    "GetResult", "GetStatus", "MessageStore", "PutResult", "PutStatus", "QueryResult", "QueueTail",
    "RecoveryError", "RecoveryReport", "ScheduleService", "SendBackResult", "StoreError", "StoreSettings", "consumer_send_back",
    "SubscriptionGroupManager", "TopicConfigManager",
]
