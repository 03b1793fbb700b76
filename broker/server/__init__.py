"""The broker's server side: the request layer and the processes around the storage engine.

:mod:`broker.engine` is the running store; this package answers requests with it — the request
processors (:class:`~broker.server.processors.BrokerCore`), the metadata tables
(:class:`BrokerMetadata`: topics, groups, consumer and delay offsets), delayed delivery, retries
and dead letters, statistics, clients — and runs it all as the broker's processes (store process,
dispatcher process, network processes; :mod:`broker.server.supervisor`).
"""

from broker.lazy_exports import lazy_exports

# name -> module: resolved on first use (PEP 562), so importing one light module of this package
# (a network process's) does not import the storage engine behind the metadata tables
_EXPORTS = {
    "BrokerMetadata": "broker.server.metadata",
    "ConsumerOffsetManager": "broker.server.offsets",
    "DelayOffsetManager": "broker.server.offsets",
    "SubscriptionGroupManager": "broker.server.offsets",
    "TopicConfigManager": "broker.server.offsets",
    "ScheduleService": "broker.server.schedule",
    "SendBackResult": "broker.server.send_back",
    "consumer_send_back": "broker.server.send_back",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
