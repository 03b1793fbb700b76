"""Tests start real name servers and brokers through the library's launcher."""

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
