"""A network process parks a long-polling pull, and resumes it on the store's "grew" events.

The store process answers a pull on a pool thread and reports queue growth from another thread, so
the two frames can reach the network process in either order. These tests drive
:class:`~broker.server.network_process.NetworkFrontend` with a stand-in for its link to the store,
which delivers the frames in the order each case needs.
"""

from __future__ import annotations

import asyncio

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.server.network_process import NetworkFrontend
from broker.server.request_reply import Reply
from broker.server.settings import BrokerSettings

TOPIC, QUEUE, OFFSET = "ParkTopic", 2, 7
LONG_POLL_MS = 60_000  # far longer than any test waits: a pull that parks for it fails the test


class _Link:
    """The store's side of a pull: ``before_reply`` events are read before the suspend reply (the
    race), the resumed request finds the message."""

    def __init__(self, frontend: NetworkFrontend, before_reply: list) -> None:
        self.frontend = frontend
        self.before_reply = before_reply
        self.calls = 0

    async def call(self, req) -> Reply:
        self.calls += 1
        if not req.resumed:
            for event in self.before_reply:
                self.frontend._on_event(event)
            return Reply(suspend=(TOPIC, QUEUE, OFFSET, LONG_POLL_MS))
        return Reply(code=ResponseCode.SUCCESS, ext={"nextBeginOffset": str(OFFSET + 1)}, body=b"message")


def _pull() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {"topic": TOPIC, "queueId": str(QUEUE),
                                                              "queueOffset": str(OFFSET)})


class _Conn:
    peer = "127.0.0.1:40000"

    def __init__(self) -> None:
        self.attributes: dict = {}

    def add_close_callback(self, callback) -> None:
        pass


def _frontend(tmp_path) -> NetworkFrontend:
    return NetworkFrontend(BrokerSettings(), str(tmp_path / "link.sock"))


async def _pull_with(frontend: NetworkFrontend, link: _Link) -> RemotingCommand:
    frontend.link = link
    return await asyncio.wait_for(frontend.process(_pull(), _Conn()), 10)


def test_growth_read_before_the_suspend_reply_resumes_the_pull_at_once(tmp_path) -> None:
    async def run() -> None:
        frontend = _frontend(tmp_path)
        link = _Link(frontend, [("grew", [(TOPIC, QUEUE, OFFSET + 1)])])
        response = await _pull_with(frontend, link)
        assert (response.code, response.body, link.calls) == (ResponseCode.SUCCESS, b"message", 2)
        assert frontend._waiters == {}

    asyncio.run(run())


def test_growth_after_parking_resumes_the_pull(tmp_path) -> None:
    async def run() -> None:
        frontend = _frontend(tmp_path)
        link = _Link(frontend, [])
        pull = asyncio.ensure_future(_pull_with(frontend, link))
        while (TOPIC, QUEUE) not in frontend._waiters:
            await asyncio.sleep(0)
        frontend._on_event(("grew", [(TOPIC, QUEUE, OFFSET)]))  # not past the pull's offset: stays parked
        await asyncio.sleep(0)
        assert not pull.done() and len(frontend._waiters[(TOPIC, QUEUE)]) == 1
        frontend._on_event(("grew", [(TOPIC, QUEUE, OFFSET + 1)]))
        response = await pull
        assert (response.code, link.calls) == (ResponseCode.SUCCESS, 2)
        assert frontend._waiters == {}

    asyncio.run(run())


def test_growth_older_than_the_request_or_elsewhere_parks_the_pull(tmp_path) -> None:
    """An event read before the pull was forwarded says nothing about what the pull found (a
    re-created topic's old maximum), nor does one of another queue or not past the offset."""
    async def run() -> None:
        frontend = _frontend(tmp_path)
        frontend._on_event(("grew", [(TOPIC, QUEUE, OFFSET + 100)]))
        link = _Link(frontend, [("grew", [(TOPIC, QUEUE + 1, OFFSET + 5), ("Other", QUEUE, OFFSET + 5)]),
                                ("grew", [(TOPIC, QUEUE, OFFSET)])])
        pull = asyncio.ensure_future(_pull_with(frontend, link))
        while (TOPIC, QUEUE) not in frontend._waiters:
            await asyncio.sleep(0)
        assert link.calls == 1 and not pull.done()
        frontend._on_event(("grew", [(TOPIC, QUEUE, OFFSET + 2)]))
        assert (await pull).code == ResponseCode.SUCCESS and link.calls == 2

    asyncio.run(run())
