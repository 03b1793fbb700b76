"""Tests start real name servers and brokers through the library's launcher."""

import threading
import time
from typing import Callable

from broker.server.launcher import (  # noqa: F401
    REPO,
    ROCKETLAKE,
    BrokerHandle,
    cluster,
    free_port,
    live_group_pids,
    start_broker,
    start_namesrv,
    wait_port,
)


def drain(consumer, topic: str) -> list:
    """Every message of every queue of ``topic``, pulled from offset 0 with a ``PullConsumer``."""
    from broker.client import PullStatus

    out = []
    for mq in consumer.queues(topic):
        offset = 0
        while True:
            res = consumer.pull(mq, offset)
            if res.status is not PullStatus.FOUND:
                break
            out += res.messages
            offset = res.next_begin_offset
    return out


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 40.0, poll_s: float = 0.05) -> None:
    """Ask ``condition`` again and again until it holds; fail naming ``what`` after ``timeout_s``.
    For state only a request can observe (offsets, routes): the wait ends as soon as it holds, and a
    slow machine only makes it longer, never wrong."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(poll_s)


def stored_messages(admin, broker_addr: str, topic: str) -> int:
    """Messages in all queues of ``topic`` on one broker (the sum of the max offsets, as the broker's
    consume queues say); 0 while the broker does not have the topic yet."""
    from broker.client import MQClientError
    from broker.remoting.codes import ResponseCode

    try:
        return sum(o.max_offset for o in admin.topic_stats(broker_addr, topic).offset_table.values())
    except MQClientError as exc:
        if exc.code != ResponseCode.TOPIC_NOT_EXIST:
            raise
        return 0


class Recorder:
    """What a consumer's listener saw, with a wait that wakes on each new item (no polling)."""

    def __init__(self) -> None:
        self.items: list = []
        self._cond = threading.Condition()

    def add(self, item) -> None:
        with self._cond:
            self.items.append(item)
            self._cond.notify_all()

    def wait_for(self, count: int, deadline: float) -> list:
        """A copy of the items once there are at least ``count`` (or when ``deadline`` passed)."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.items) >= count, max(0.0, deadline - time.monotonic()))
            return list(self.items)
