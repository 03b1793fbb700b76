"""A network process of the broker: TCP ↔ RemotingCommand frames ↔ the store process.

Each network process accepts on the broker's port (SO_REUSEPORT), decodes frames and headers,
refuses what the ACL refuses (:mod:`broker.acl`, with ``aclEnable``) before anything is forwarded,
drafts plain sends (:mod:`broker.server.send_draft`: their records are encoded here), forwards
requests to the store process (:mod:`broker.server.ipc`), encodes the replies, parks long-polling
pulls until their queue grows, and sends NOTIFY_CONSUMER_IDS_CHANGED to its own connections.

This module imports only the network side (remoting, ACL, the draft, the link): a network process
is spawned, and importing the storage engine (numba kernels and all) would cost every broker start
seconds of CPU per network process for code it never runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from broker.acl.gate import DENIED_CODE, AclGate
from broker.remoting import event_loop
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.tls import ServerTls
from broker.remoting.transport import Connection, RemotingServer
from broker.server.linux_process import GIL_SWITCH_INTERVAL_S, exit_without_teardown, set_process_name
from broker.server.request_reply import SEND_CODES, Reply, Request
from broker.server.send_draft import SendDrafter
from broker.server.settings import BrokerSettings
from broker.store.hosts import Host

log = logging.getLogger(__name__)

STORE_READY_POLL_S = 0.01  # how often a network process started beside the store looks whether it is up


class NetworkFrontend:
    """One network process: TCP ↔ frames ↔ store process, plus long polling."""

    def __init__(self, settings: BrokerSettings, socket_path: str, acl_path: str | None = None) -> None:
        self.settings = settings
        self.socket_path = socket_path
        # checked here, before a request is forwarded: a refused one never reaches the store process
        self.acl = AclGate(acl_path) if acl_path else None
        self.pid = os.getpid()
        self._conn_ids: dict[int, Connection] = {}
        self._next_conn = 0
        self._waiters: dict[tuple[str, int], list[tuple[int, asyncio.Future]]] = {}
        # the newest "grew" event per queue: (event number, max offset), and the events seen so far
        self._grown: dict[tuple[str, int], tuple[int, int]] = {}
        self._grow_events = 0
        from broker.server.ipc import IpcClient

        self.link = IpcClient(socket_path, self._on_event)
        # plain sends are drafted here, their records encoded: the store process only places them
        self.drafter = SendDrafter(settings.broker_cluster_name, Host.parse(settings.broker_addr),
                                   settings.max_message_size)
        tls = settings.server_tls()  # each network process watches the certificate files itself
        self.server = RemotingServer(settings.listen_host, settings.listen_port, self.process,
                                     max_frame=settings.max_frame_length, name="broker", reuse_port=True,
                                     fast_handler=self.take_send, tls=ServerTls(tls) if tls.enabled else None)

    def _channel(self, conn: Connection) -> tuple[int, int]:
        ident = conn.attributes.get("rocketlake.channel")
        if ident is None:
            self._next_conn += 1
            ident = (self.pid, self._next_conn)
            conn.attributes["rocketlake.channel"] = ident
            self._conn_ids[ident[1]] = conn

            def closed(*_args) -> None:
                self._conn_ids.pop(ident[1], None)
                self.link.notify_closed(ident)

            conn.add_close_callback(closed)
        return ident

    def _on_event(self, event) -> None:
        if event[0] == "grew":
            self._grow_events += 1
            for topic, qid, max_offset in event[1]:
                self._grown[(topic, qid)] = (self._grow_events, max_offset)
                waiters = self._waiters.get((topic, qid))
                if not waiters:
                    continue
                keep = []
                for offset, fut in waiters:
                    if max_offset > offset and not fut.done():
                        fut.set_result(True)
                    elif not fut.done():
                        keep.append((offset, fut))
                if keep:
                    self._waiters[(topic, qid)] = keep
                else:
                    self._waiters.pop((topic, qid), None)
        elif event[0] == "notify":
            _, group, channels = event
            for pid, serial in channels:
                if pid != self.pid:
                    continue
                conn = self._conn_ids.get(serial)
                if conn is not None and not conn.closed:
                    cmd = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                  {"consumerGroup": group}, oneway=True)
                    asyncio.ensure_future(self._notify(conn, cmd))
        elif event[0] == "call":  # the store process asks one of our clients something
            _, call_id, serial, request = event
            asyncio.ensure_future(self._call_client(call_id, self._conn_ids.get(serial), request))

    async def _call_client(self, call_id: int, conn: Connection | None, request) -> None:
        from broker.server.client_calls import call_client

        self.link.send_call_reply(call_id, await call_client(conn, request))

    async def _notify(self, conn: Connection, cmd: RemotingCommand) -> None:
        try:
            await conn.send_oneway(cmd)
        except Exception as exc:
            log.debug("notify to %s failed: %s", conn.peer, exc)

    def _grew_since(self, topic: str, qid: int, offset: int, events_before: int) -> bool:
        """Whether a "grew" event read after event number ``events_before`` put the queue past
        ``offset``. The store process answers a pull on one of its threads and reports growth on
        another, so the event of a message stored just after the pull found nothing can be read
        before the pull's suspend reply: parked then, the pull would wait for its whole timeout (a
        push consumer's 15 s) with the message there. Only events newer than the request count: an
        older one says nothing about what the pull saw (and a deleted and re-created topic's old
        maximum would resume its pulls at once, for ever)."""
        seen = self._grown.get((topic, qid))
        return seen is not None and seen[0] > events_before and seen[1] > offset

    async def _park(self, topic: str, qid: int, offset: int, timeout_ms: int) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.setdefault((topic, qid), []).append((offset, fut))
        try:
            await asyncio.wait_for(fut, timeout_ms / 1000)
        except asyncio.TimeoutError:
            pass
        finally:
            waiters = self._waiters.get((topic, qid))
            if waiters:
                self._waiters[(topic, qid)] = [w for w in waiters if w[1] is not fut]
                if not self._waiters[(topic, qid)]:
                    del self._waiters[(topic, qid)]

    def _refused(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        """Apache's answer to a request the ACL refuses (None: it may pass)."""
        denied = self.acl.check(cmd.code, cmd.ext_fields, cmd.body, conn.peer, int(cmd.version or 0))
        return None if denied is None else cmd.response(DENIED_CODE, denied.remark)

    async def process(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        if self.acl is not None and (refusal := self._refused(cmd, conn)) is not None:
            return None if cmd.is_oneway else refusal
        req = Request(code=cmd.code, ext=dict(cmd.ext_fields), body=cmd.body, channel=self._channel(conn),
                      peer=conn.peer, language=str(cmd.language), version=int(cmd.version or 0))
        try:
            events_before = self._grow_events
            reply: Reply = await self.link.call(req)
            if reply.suspend is not None:
                topic, qid, offset, timeout = reply.suspend
                if not self._grew_since(topic, qid, offset, events_before):
                    await self._park(topic, qid, offset, timeout)
                req.resumed = True
                reply = await self.link.call(req)
        except ConnectionError:
            return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, "broker is shutting down")
        if cmd.is_oneway:
            return None
        return cmd.response(reply.code, reply.remark, reply.ext, reply.body)

    def take_send(self, cmd: RemotingCommand, conn: Connection) -> bool:
        """Sends skip the task-per-request path: forwarded with a callback that answers on the
        connection (they never park, and they are most of a busy broker's requests)."""
        if cmd.code not in SEND_CODES:
            return False
        if self.acl is not None and (refusal := self._refused(cmd, conn)) is not None:
            conn.answer(cmd, refusal)  # the transport gives this path requests that want an answer only
            return True
        channel = self._channel(conn)
        req = self.drafter.draft(cmd.code, cmd.ext_fields, cmd.body, conn.peer, channel) or \
            Request(code=cmd.code, ext=dict(cmd.ext_fields), body=cmd.body, channel=channel, peer=conn.peer,
                    language=str(cmd.language), version=int(cmd.version or 0))

        def answer(reply) -> None:
            if isinstance(reply, Reply):
                conn.answer_with(cmd, reply.code, reply.remark, reply.ext, reply.body)
            elif isinstance(reply, ConnectionError):  # the store process is gone
                conn.answer_with(cmd, ResponseCode.SERVICE_NOT_AVAILABLE, "broker is shutting down")
            else:  # the store process's last resort: the batch failed as a whole
                conn.answer_with(cmd, ResponseCode.SYSTEM_ERROR, f"{type(reply).__name__}: {reply}")

        self.link.submit(req, answer)
        return True

    async def run(self, store_ready, ready, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set or the store process's link closes. Started together with the
        store process (their imports overlap), this process connects to the store's socket only once
        ``store_ready`` is set, and says ``ready`` once it listens."""
        while not store_ready.is_set():
            if stop.is_set():  # stopped before the store was up (its start-up failed)
                return
            await asyncio.sleep(STORE_READY_POLL_S)
        await self.link.connect()
        await self.server.start()
        ready.set()
        acl_watch = asyncio.create_task(self.acl.watch()) if self.acl is not None else None
        closed = asyncio.create_task(self.link.closed.wait())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({closed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if acl_watch is not None:
            acl_watch.cancel()
        await self.server.stop()
        await self.link.close()


def network_process_main(settings: BrokerSettings, socket_path: str, store_ready, ready, log_level: int,
                         index: int = 0, acl_path: str | None = None) -> None:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    set_process_name(f"rl-net-{index}")
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s [net] %(name)s: %(message)s")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await NetworkFrontend(settings, socket_path, acl_path).run(store_ready, ready, stop)

    event_loop.run(main())
    exit_without_teardown()
