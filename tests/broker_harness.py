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
