"""Who is connected: consumer groups and producer groups registered by HEART_BEAT.

Pure bookkeeping with an injectable clock. A channel is an opaque, hashable id chosen by the
network layer (in the multiprocess broker: ``(handler process, connection number)``), so this
registry can live in one process while connections live in others. Every change that should make
consumers rebalance is returned to the caller, who sends NOTIFY_CONSUMER_IDS_CHANGED (remoting
reference 9.6).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable

from broker.remoting.bodies import ConsumerData, HeartbeatData, MessageModel, SubscriptionData

Channel = Hashable
DEFAULT_CHANNEL_EXPIRED_S = 120


@dataclass
class ClientChannel:
    channel: Channel
    client_id: str
    language: str = ""
    version: int = 0
    last_update: float = 0.0
    addr: str = ""  # the client's "ip:port" as the broker sees it (Connection.clientAddr)


@dataclass
class ConsumerGroupInfo:
    group: str
    consume_type: int = 1
    message_model: int = int(MessageModel.CLUSTERING)
    consume_from_where: int = 0
    channels: dict[Channel, ClientChannel] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted({c.client_id for c in self.channels.values()})


@dataclass(frozen=True)
class Notify:
    """Send NOTIFY_CONSUMER_IDS_CHANGED for ``group`` to each of ``channels``."""

    group: str
    channels: tuple[Channel, ...]


class ClientRegistry:
    """Thread-safe consumer/producer registry keyed by group."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 channel_expired_s: float = DEFAULT_CHANNEL_EXPIRED_S) -> None:
        self._clock = clock
        self._expired_s = channel_expired_s
        self._lock = threading.Lock()
        self.consumers: dict[str, ConsumerGroupInfo] = {}
        self.producers: dict[str, dict[Channel, ClientChannel]] = {}

    @property
    def channel_expired_s(self) -> float:
        """Seconds without a heartbeat after which a channel's clients are dropped (clientChannelMaxIdleTimeSeconds)."""
        return self._expired_s

    @channel_expired_s.setter
    def channel_expired_s(self, seconds: float) -> None:
        self._expired_s = seconds

    # ---- registration ------------------------------------------------------------------------------
    def heartbeat(self, channel: Channel, data: HeartbeatData, language: str = "", version: int = 0,
                  addr: str = "") -> list[Notify]:
        """Register every producer and consumer of a heartbeat; returns rebalance notifications."""
        now = self._clock()
        notes: list[Notify] = []
        with self._lock:
            for p in data.producers:
                self.producers.setdefault(p.group_name, {})[channel] = ClientChannel(
                    channel, data.client_id, language, version, now, addr)
            for c in data.consumers:
                if self._register_consumer(channel, data.client_id, c, language, version, now, addr):
                    info = self.consumers[c.group_name]
                    if info.message_model != int(MessageModel.BROADCASTING):
                        notes.append(Notify(c.group_name, tuple(info.channels)))
        return notes

    def _register_consumer(self, channel: Channel, client_id: str, c: ConsumerData, language: str,
                           version: int, now: float, addr: str = "") -> bool:
        info = self.consumers.get(c.group_name)
        if info is None:
            info = self.consumers[c.group_name] = ConsumerGroupInfo(c.group_name)
        info.consume_type = int(c.consume_type)
        info.message_model = int(c.message_model)
        info.consume_from_where = int(c.consume_from_where)
        changed = channel not in info.channels
        existing = info.channels.get(channel)
        info.channels[channel] = ClientChannel(channel, client_id, language, version, now, addr)
        if existing is not None and existing.client_id != client_id:
            changed = True
        new_subs = {s.topic: s for s in c.subscriptions}
        if {t: (s.sub_string, tuple(s.tags_set)) for t, s in new_subs.items()} != \
                {t: (s.sub_string, tuple(s.tags_set)) for t, s in info.subscriptions.items()}:
            changed = True
        info.subscriptions = new_subs
        return changed

    def unregister(self, channel: Channel, producer_group: str = "", consumer_group: str = "") -> list[Notify]:
        with self._lock:
            if producer_group:
                self.producers.get(producer_group, {}).pop(channel, None)
            if consumer_group:
                return self._drop_from_group(consumer_group, channel)
        return []

    def channel_closed(self, channel: Channel) -> list[Notify]:
        """A connection went away: forget it everywhere."""
        notes: list[Notify] = []
        with self._lock:
            for channels in self.producers.values():
                channels.pop(channel, None)
            for group in list(self.consumers):
                notes += self._drop_from_group(group, channel)
        return notes

    def _drop_from_group(self, group: str, channel: Channel) -> list[Notify]:
        info = self.consumers.get(group)
        if info is None or info.channels.pop(channel, None) is None:
            return []
        if not info.channels:
            del self.consumers[group]
            return []
        return [Notify(group, tuple(info.channels))]

    def scan_expired(self) -> list[Notify]:
        """Drop channels silent for longer than the expiry (Apache scans every 10 s, 120 s timeout)."""
        limit = self._clock() - self._expired_s
        notes: list[Notify] = []
        with self._lock:
            for channels in self.producers.values():
                for ch in [ch for ch, c in channels.items() if c.last_update < limit]:
                    del channels[ch]
            for group in list(self.consumers):
                info = self.consumers[group]
                for ch in [ch for ch, c in info.channels.items() if c.last_update < limit]:
                    notes += self._drop_from_group(group, ch)
        return notes

    # ---- queries -------------------------------------------------------------------------------------
    def consumer_ids(self, group: str) -> list[str]:
        with self._lock:
            info = self.consumers.get(group)
            return info.client_ids() if info else []

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        with self._lock:
            info = self.consumers.get(group)
            return info.subscriptions.get(topic) if info else None

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(self.consumers)

    def group_info(self, group: str) -> ConsumerGroupInfo | None:
        with self._lock:
            return self.consumers.get(group)

    def group_snapshot(self, group: str) -> ConsumerGroupInfo | None:
        """A copy of the group's state that other threads' heartbeats cannot change under the reader."""
        with self._lock:
            info = self.consumers.get(group)
            if info is None:
                return None
            return ConsumerGroupInfo(info.group, info.consume_type, info.message_model, info.consume_from_where,
                                     dict(info.channels), dict(info.subscriptions))

    def consumer_channels(self, group: str) -> list[ClientChannel]:
        """A snapshot of the group's connections (empty when the group is offline)."""
        with self._lock:
            info = self.consumers.get(group)
            return list(info.channels.values()) if info else []

    def find_consumer(self, group: str, client_id: str) -> ClientChannel | None:
        """The connection of ``client_id`` in ``group`` (Apache's ``ConsumerManager.findChannel``)."""
        with self._lock:
            info = self.consumers.get(group)
            if info is None:
                return None
            return next((c for c in info.channels.values() if c.client_id == client_id), None)

    def producer_channels(self, group: str) -> list[ClientChannel] | None:
        """The producer group's connections; None when the broker never saw the group."""
        with self._lock:
            channels = self.producers.get(group)
            return None if channels is None else list(channels.values())
