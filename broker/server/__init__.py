"""The broker's server side: the request layer and the processes around the storage engine.

:mod:`broker.engine` is the running store; this package answers requests with it — the request
processors (:class:`~broker.server.processors.BrokerCore`), the metadata tables
(:class:`BrokerMetadata`: topics, groups, consumer and delay offsets), delayed delivery, retries
and dead letters, statistics, clients — and runs it all as the broker's processes (store process,
dispatcher process, network processes; :mod:`broker.server.broker`).
"""

from broker.server.metadata import BrokerMetadata
from broker.server.offsets import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.server.schedule import ScheduleService
from broker.server.send_back import SendBackResult, consumer_send_back

__all__ = [
    "BrokerMetadata", "ConsumerOffsetManager", "DelayOffsetManager", "ScheduleService", "SendBackResult",
    "SubscriptionGroupManager", "TopicConfigManager", "consumer_send_back",
]
