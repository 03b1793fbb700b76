"""The storage engine: a running store over the byte-exact files of :mod:`broker.store`.

Apache's store module in small: :class:`MessageStore` appends, flushes and reads (CommitLog,
checkpoint, ``abort``), recovers after a crash (:mod:`~broker.engine.recovery`), and hands the
building of ConsumeQueue and IndexFile to a :class:`Dispatcher` — in this process or in the
dispatcher process of :mod:`broker.server.dispatch_process` (one ``DispatchMode`` interface).
It knows nothing of requests, clients or metadata tables: those are :mod:`broker.server`'s, which
wraps this engine in the broker's processes.
"""

from broker.lazy_exports import lazy_exports

# name -> module: resolved on first use (PEP 562), so that importing one light module of this
# package (``ha_frames``, ``store_settings``: the broker's settings need them) does not compile-load
# the whole engine in processes that never run it (the broker's network processes, its supervisor)
_EXPORTS = {
    "ConsumeQueueView": "broker.engine.dispatch",
    "Dispatcher": "broker.engine.dispatch",
    **{name: "broker.engine.message_store" for name in (
        "EncodedPut", "GetResult", "GetStatus", "MessageStore", "PutResult", "PutStatus", "QueryResult",
        "StoreError")},
    "QueueTail": "broker.engine.recovery",
    "RecoveryError": "broker.engine.recovery",
    "RecoveryReport": "broker.engine.recovery",
    "StoreSettings": "broker.engine.store_settings",
    "ASYNC_FLUSH": "broker.store.constants",
    "SYNC_FLUSH": "broker.store.constants",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
