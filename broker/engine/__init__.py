"""The storage engine: a running store over the byte-exact files of :mod:`broker.store`.

Apache's store module in small: :class:`MessageStore` appends, flushes and reads (CommitLog,
checkpoint, ``abort``), recovers after a crash (:mod:`~broker.engine.recovery`), and hands the
building of ConsumeQueue and IndexFile to a :class:`Dispatcher` — in this process or in the
dispatcher process of :mod:`broker.server.dispatch_process` (one ``DispatchMode`` interface).
It knows nothing of requests, clients or metadata tables: those are :mod:`broker.server`'s, which
wraps this engine in the broker's processes.
"""

from broker.engine.dispatch import ConsumeQueueView, Dispatcher
from broker.engine.message_store import (
    EncodedPut,
    GetResult,
    GetStatus,
    MessageStore,
    PutResult,
    PutStatus,
    QueryResult,
    StoreError,
)
from broker.engine.recovery import QueueTail, RecoveryError, RecoveryReport
from broker.engine.store_settings import StoreSettings
from broker.store.constants import ASYNC_FLUSH, SYNC_FLUSH

__all__ = [
    "ASYNC_FLUSH", "SYNC_FLUSH", "ConsumeQueueView", "Dispatcher", "EncodedPut", "GetResult", "GetStatus",
    "MessageStore", "PutResult", "PutStatus", "QueryResult", "QueueTail", "RecoveryError", "RecoveryReport",
    "StoreError", "StoreSettings",
]
