"""A ``BrokerCore`` over a fresh store, asked as the store process is asked: the in-process handler
tests' environment (``tests/test_processors.py``, ``tests/test_transactions.py``), in the manner of
Apache's ``*ProcessorTest`` fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from broker.engine.store_settings import StoreSettings
from broker.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from broker.remoting.headers import SendMessageRequestHeader
from broker.server.metadata import BrokerMetadata
from broker.server.processors import BrokerCore, Request
from broker.server.send_draft import SendDrafter
from broker.server.settings import BrokerSettings
from broker.store.config_files import TopicConfig, read_config_json
from broker.store.hosts import Host
from broker.store.properties import encode_properties
from broker.store.topics import DEFAULT_TOPIC
from tests.store_harness import DispatchedStore

CLUSTER, BROKER, ADDR = "DefaultCluster", "broker-a", "127.0.0.1:10911"
PEER = "10.0.0.7:51000"
MAX_BODY = 4096


class Env:
    """One store and the BrokerCore answering for it; ``changed`` counts topic-table notifications.

    Every request returns once the dispatcher process caught up with what it appended: the tests
    read the queues right after a send, and must see them as a reader of the broker does once its
    units are dispatched (a refused send then truly added nothing, instead of nothing *yet*)."""

    def __init__(self, root: Path, *, auto_create_topic: bool = True, auto_create_group: bool = True,
                 drafting: bool = True, clock: Callable[[], int] | None = None,
                 settings: BrokerSettings | None = None) -> None:
        self.root = root
        self.changed = 0
        # as a network process does: plain sends drafted (record encoded) before the core sees them
        self.drafter = SendDrafter(CLUSTER, Host.parse(ADDR), MAX_BODY) if drafting else None
        self.store = DispatchedStore(root, StoreSettings(fsync_metadata=False, auto_create_topic_enable=auto_create_topic,
                                                      auto_create_subscription_group=auto_create_group),
                                    clock=clock)
        self.store.open()
        self.metadata = BrokerMetadata(self.store)
        self.core = BrokerCore(self.store, self.metadata, cluster_name=CLUSTER, broker_name=BROKER, broker_addr=ADDR,
                               max_message_size=MAX_BODY, auto_create_topic=auto_create_topic,
                               on_topics_changed=self._changed, settings=settings)
        self.metadata.topics.put(TopicConfig("Orders", 2, 2, 6))

    def _changed(self) -> None:
        self.changed += 1

    def ask(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"", *, channel=("c", 1),
            version: int = 0):
        draft = self.drafter.draft(code, ext or {}, body, PEER, channel) if self.drafter is not None else None
        if draft is not None:
            (reply,) = self.core.send_messages([draft])
        else:
            reply = self.core.process(Request(code=code, ext=ext or {}, body=body, channel=channel, peer=PEER,
                                               version=version))
        self.store.caught_up()
        return reply

    def send(self, topic: str, body: bytes = b"hello", *, queue_id: int = 0, props: dict[str, str] | None = None,
             code: int = RequestCode.SEND_MESSAGE_V2, version: int = 0, **extra):
        header = SendMessageRequestHeader(producer_group="PG", topic=topic, default_topic=DEFAULT_TOPIC,
                                          default_topic_queue_nums=4, queue_id=queue_id, sys_flag=0,
                                          born_timestamp=1_700_000_000_000, flag=0,
                                          properties=encode_properties(props or {}), **extra)
        ext = header.to_ext(v2=code != RequestCode.SEND_MESSAGE)
        return self.ask(code, ext, body, version=version)

    def pull(self, topic: str, queue_id: int, offset: int, *, group: str = "CG", sub: str = "*",
             flags: int = PullSysFlag.SUBSCRIPTION, commit: int = 0, max_nums: int = 32):
        ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
               "maxMsgNums": str(max_nums), "sysFlag": str(int(flags)), "commitOffset": str(commit),
               "suspendTimeoutMillis": "1000", "subscription": sub, "subVersion": "0"}
        return self.ask(RequestCode.PULL_MESSAGE, ext)

    def config(self, name: str) -> dict:
        return read_config_json(self.root / "config" / name).data

    def close(self) -> None:
        self.metadata.close()
        self.store.close()


def ok(reply):
    """``reply`` after checking it is SUCCESS (its code and remark shown when not)."""
    assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
    return reply
