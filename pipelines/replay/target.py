"""The replay target: any RocketMQ 4.x/5.x cluster, reached through its name server with the
standard protocol only (route lookup, GET_BROKER_CONFIG, QUERY_MESSAGE).

Checked before anything is recorded: the name server answers, every target topic exists (a replay
never auto-creates a topic) and is not a ``%RETRY%``/``%DLQ%``/system topic (a DLQ replay may send to
a retry topic on purpose), and the brokers' ``maxMessageSize`` is known so oversized messages are
SKIPPED in the plan instead of failing one by one.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass

from broker.client.consumer import decode_records
from broker.client.instance import ClientInstance, MQClientError, TopicRoute
from broker.remoting.bodies import KVTable, MessageQueue
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.properties_body import CHARSET, PropertiesError, parse_properties
from broker.store.constants import DEFAULT_MAX_MESSAGE_SIZE
from broker.store.topics import (
    SYSTEM_TOPIC_PREFIX,
    SYSTEM_TOPICS,
    InvalidTopicError,
    is_dlq_topic,
    is_retry_topic,
    validate_topic,
)

log = logging.getLogger(__name__)

QUERY_MAX_NUM = 32  # Apache's defaultQueryMaxNum
QUERY_WINDOW_MS = 3_600_000  # index time range searched around the send attempts (clock skew margin)
DISPATCH_WAIT_S = 30.0       # how long to wait for a target broker's index to catch up before giving up


class TargetError(ValueError):
    """The target cannot take this replay (unreachable, topic missing or not allowed)."""


def check_topic_allowed(topic: str, *, allow_retry: bool) -> None:
    try:
        validate_topic(topic)
    except InvalidTopicError as exc:
        raise TargetError(f"target topic {topic!r}: {exc}") from None
    if is_dlq_topic(topic):
        raise TargetError(f"target topic {topic!r} is a dead-letter topic; replays never write into a DLQ")
    if is_retry_topic(topic) and not allow_retry:
        raise TargetError(f"target topic {topic!r} is a retry topic; only a --dlq replay may send to one")
    if topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX):
        raise TargetError(f"target topic {topic!r} is a system topic")


@dataclass(frozen=True)
class FoundMessage:
    """A replayed message the target holds (answer of a QUERY_MESSAGE by replay key)."""

    broker: str
    queue_id: int
    queue_offset: int
    uniq_key: str | None
    offset_msg_id: str


class Target:
    """One connection to the target cluster for the driver's checks and look-ups."""

    def __init__(self, namesrv: str, timeout: float = 5.0) -> None:
        self.namesrv = namesrv
        self.client = ClientInstance(namesrv, "rocketlake-replay-driver", timeout)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Target":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def route(self, topic: str) -> TopicRoute:
        """The topic's route; TargetError when the name server is unreachable or the topic missing."""
        try:
            route = self.client.route(topic, refresh=True)
        except MQClientError as exc:
            raise TargetError(f"target name server {self.namesrv} is not reachable: {exc}") from None
        if route is None or not route.write_queues:
            raise TargetError(f"target topic {topic!r} does not exist on the cluster of name server {self.namesrv} "
                              f"(or has no writable queue); create it first, e.g. "
                              f"rocketlake admin updateTopic -n '{self.namesrv}' -c CLUSTER -t {topic}")
        return route

    def max_message_size(self, route: TopicRoute) -> int:
        """The smallest ``maxMessageSize`` of the route's brokers (GET_BROKER_CONFIG); the Java
        client's 4 MiB limit caps it; a broker that does not answer the request counts as the default."""
        limit = DEFAULT_MAX_MESSAGE_SIZE
        for name, addr in sorted(route.masters.items()):
            try:
                resp = self.client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG))
            except Exception as exc:  # unreachable broker: the send will say so per message
                log.warning("replay: broker %s (%s) did not answer GET_BROKER_CONFIG: %s", name, addr, exc)
                continue
            if resp.code != ResponseCode.SUCCESS:
                continue
            try:
                value = parse_properties((resp.body or b"").decode(CHARSET, "replace")).get("maxMessageSize", "")
            except PropertiesError:
                continue
            if value.strip().isdigit():
                limit = min(limit, int(value.strip()))
        return limit

    def dispatch_caught_up(self, broker: str, addr: str, timeout: float = DISPATCH_WAIT_S) -> str | None:
        """Wait until ``broker`` has indexed everything it stored (GET_BROKER_RUNTIME_INFO's
        ``dispatchBehindBytes`` is 0, as Apache and our broker report it); None when it has, else why not.

        Without this a message stored a moment ago but not yet in the IndexFile would be "not found"
        and sent a second time. A broker that does not report the figure is trusted after the settle
        wait the caller already made."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                resp = self.client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
            except Exception as exc:
                return f"{broker} ({addr}): runtime info: {type(exc).__name__}: {exc}"
            if resp.code != ResponseCode.SUCCESS:
                return f"{broker} ({addr}): runtime info answered code {resp.code} {resp.remark or ''}"
            behind = KVTable.decode(resp.body or b"{}").table.get("dispatchBehindBytes")
            if behind is None or not behind.strip().isdigit() or int(behind) == 0:
                return None
            if time.monotonic() > deadline:
                return f"{broker} ({addr}): still {behind} bytes behind in indexing after {timeout:.0f} s"
            time.sleep(0.1)

    def find(self, topic: str, keys: list[str], begin_ms: int, end_ms: int,
             in_flight: int = 64) -> tuple[dict[str, FoundMessage], list[str]]:
        """Ask every master of ``topic`` for each replay key (QUERY_MESSAGE, pipelined).

        Returns (found: key → where the target stored it, errors). A key no broker holds is simply
        absent from ``found``; ``errors`` lists brokers that could not be asked (or whose index is
        behind), so the caller can refuse to decide instead of resending blindly."""
        route = self.route(topic)
        found: dict[str, FoundMessage] = {}
        errors: list[str] = []
        begin, end = max(0, begin_ms - QUERY_WINDOW_MS), end_ms + QUERY_WINDOW_MS
        for broker, addr in sorted(route.masters.items()):
            pending: list[tuple[str, Future]] = []
            lagging = self.dispatch_caught_up(broker, addr)
            if lagging is not None:
                errors.append(lagging)
                continue

            def settle(batch: list[tuple[str, Future]]) -> None:
                wait([f for _, f in batch])
                for key, fut in batch:
                    try:
                        resp = fut.result()
                    except Exception as exc:
                        errors.append(f"{broker} ({addr}): {type(exc).__name__}: {exc}")
                        continue
                    if resp.code == ResponseCode.QUERY_NOT_FOUND:
                        continue
                    if resp.code != ResponseCode.SUCCESS:
                        errors.append(f"{broker} ({addr}): QUERY_MESSAGE answered code {resp.code} {resp.remark or ''}")
                        continue
                    for rec in decode_records(resp.body or b""):
                        if rec.topic == topic and key in rec.keys:
                            found[key] = FoundMessage(broker, rec.queue_id, rec.queue_offset, rec.uniq_key,
                                                      rec.offset_msg_id)
                            break

            for key in keys:
                if key in found:
                    continue
                cmd = RemotingCommand.request(RequestCode.QUERY_MESSAGE, {
                    "topic": topic, "key": key, "maxNum": str(QUERY_MAX_NUM),
                    "beginTimestamp": str(begin), "endTimestamp": str(end)})
                pending.append((key, self.client.invoke_future(addr, cmd)))
                if len(pending) >= in_flight:
                    settle(pending)
                    pending = []
            settle(pending)
        return found, sorted(set(errors))


def now_ms() -> int:
    return int(time.time() * 1000)


def queue_list(route: TopicRoute) -> list[MessageQueue]:
    """The target's writable queues in a stable order (broker name, queue id)."""
    return sorted(route.write_queues, key=lambda q: (q.broker_name, q.queue_id))
