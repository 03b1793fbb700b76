"""A slave's copy of its master's metadata (Apache's ``SlaveSynchronize``): topics, consumer offsets,
delay offsets and subscription groups, pulled from the master every :data:`SYNC_INTERVAL_S`.

The commitlog arrives over the HA link; these tables do not (they are ``config/*.json`` files, not
log records), so a slave asks its master's remoting port with the admin requests Apache's slave uses
(GET_ALL_TOPIC_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG) and replaces its own tables with the answers, as Apache does:
topics and groups replaced when they differ, consumer offsets merged (the master's entries win),
delay offsets taken whole. Each table is written at once. The master's remoting address comes from
the name server's registration result (``RegisterBrokerResult.masterAddr``).
"""

from __future__ import annotations

import logging
import threading

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.transport import SyncRemotingClient
from broker.server.metadata import BrokerMetadata
from broker.store.config_files import (
    ConfigFileError,
    ConsumerOffsetTable,
    DelayOffsetTable,
    SubscriptionGroupTable,
    TopicConfigTable,
    parse_config_text,
)

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 10.0  # BrokerController schedules syncAll every 10 s
REQUEST_TIMEOUT_S = 3.0


class SlaveSynchronize:
    """Runs :meth:`sync_all` every :data:`SYNC_INTERVAL_S` once the master's address is known."""

    def __init__(self, metadata: BrokerMetadata) -> None:
        self.metadata = metadata
        self._master: str | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slave-sync", daemon=True)

    def set_master_addr(self, addr: str | None) -> None:
        if addr and addr != self._master:
            log.info("slave metadata sync: master %s -> %s", self._master, addr)
            self._master = addr
            self._wake.set()  # a new master: sync now

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._master is not None:
                try:
                    self.sync_all(self._master)
                except (OSError, ConnectionError, TimeoutError, ConfigFileError, RuntimeError) as exc:
                    log.warning("slave metadata sync from %s failed: %s", self._master, exc)
            self._wake.wait(SYNC_INTERVAL_S)
            self._wake.clear()

    def _fetch(self, client: SyncRemotingClient, code: RequestCode, what: str) -> dict:
        resp = client.invoke(RemotingCommand.request(code, {}), timeout=REQUEST_TIMEOUT_S)
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"master answered {what} with code {resp.code}: {resp.remark}")
        return parse_config_text((resp.body or b"{}").decode("utf-8"), f"the master's {what}")

    def sync_all(self, master: str) -> None:
        """One round: the four tables, each replaced (or merged) and written."""
        md = self.metadata
        with SyncRemotingClient(master) as client:
            topics = TopicConfigTable.from_json(self._fetch(client, RequestCode.GET_ALL_TOPIC_CONFIG, "topics"))
            offsets = ConsumerOffsetTable.from_json(
                self._fetch(client, RequestCode.GET_ALL_CONSUMER_OFFSET, "consumer offsets"))
            delays = DelayOffsetTable.from_json(self._fetch(client, RequestCode.GET_ALL_DELAY_OFFSET, "delay offsets"))
            groups = SubscriptionGroupTable.from_json(
                self._fetch(client, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, "subscription groups"))
        with md.topics.lock:
            if md.topics.table.to_json() != topics.to_json():
                md.topics.table = topics
                md.topics._changed()
        with md.groups.lock:
            if md.groups.table.to_json() != groups.to_json():
                md.groups.table = groups
                md.groups._changed()
        with md.consumer_offsets.lock:
            table = md.consumer_offsets.table
            merged = {**table.offsets, **offsets.offsets}
            if merged != table.offsets:
                table.offsets = merged
                md.consumer_offsets._changed()
        with md.delay_offsets.lock:
            if md.delay_offsets.table.offsets != delays.offsets:
                md.delay_offsets.table = delays
                md.delay_offsets._changed()
        for manager in (md.topics, md.groups, md.consumer_offsets, md.delay_offsets):
            manager.persist()
