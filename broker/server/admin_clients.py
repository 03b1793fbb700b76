"""Admin requests about connected clients, including the ones the broker forwards to a client.

As Apache 4.9's ``AdminBrokerProcessor`` and ``Broker2Client``:

* GET_CONSUMER_CONNECTION_LIST (203) / GET_PRODUCER_CONNECTION_LIST (204): from the client registry;
* GET_CONSUMER_RUNNING_INFO (307) / CONSUME_MESSAGE_DIRECTLY (309): forwarded to the named client's
  connection and its response relayed (309 first puts the stored message, found by its offset
  message id, in the body and adds ``brokerName``);
* INVOKE_BROKER_TO_RESET_OFFSET (222): per-queue offsets for a timestamp, sent to every online client
  of the group with RESET_CONSUMER_CLIENT_OFFSET (220);
* INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223): GET_CONSUMER_STATUS_FROM_CLIENT (221) to each client,
  the answers gathered by client id.

Requests to clients go through a :class:`~broker.server.client_calls.ClientCaller` and come back as
futures; a handler that waits for a client answers ``Reply(deferred=future)``, so no request thread
of the store process waits for a client. Deliberate difference from Apache: 222 also commits the
offsets it computed on the broker (Apache leaves that to the clients' next commit), so the group's
committed offsets move at once even when a client is slow to commit.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Callable

from broker.remoting.bodies import (
    Connection,
    ConsumeFromWhere,
    ConsumerConnection,
    ConsumeType,
    GetConsumerStatusBody,
    MessageModel,
    MessageQueue,
    ProducerConnection,
    ResetOffsetBody,
    ResetOffsetBodyForC,
)
from broker.remoting.codes import RequestCode, ResponseCode, Version, version_desc
from broker.remoting.headers import (
    ConsumeMessageDirectlyResultRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumerStatusRequestHeader,
    GetProducerConnectionListRequestHeader,
    ResetOffsetRequestHeader,
)
from broker.server.client_calls import (
    ClientCaller,
    ClientCallTimeout,
    ClientRequest,
    ClientResponse,
    NoClientTransport,
)
from broker.server.clients import ClientChannel
from broker.server.processors import Reply, Request
from broker.store.message_id import decode_offset_msg_id

if TYPE_CHECKING:
    from broker.server.processors import BrokerCore

log = logging.getLogger(__name__)

CALL_CLIENT_TIMEOUT_S = 10.0  # Broker2Client.callClient
CONSUMER_STATUS_TIMEOUT_S = 5.0  # Broker2Client.getConsumeStatus
RESET_OFFSET_TIMEOUT_S = 5.0  # Broker2Client.resetOffset (one-way)
CPP_LANGUAGE = "CPP"


def _error(code: int, remark: str) -> Reply:
    return Reply(code=code, remark=remark)


def _then(future: Future, build: Callable[[Future], Reply], what: str) -> Future:
    """A Future of the Reply ``build`` makes from ``future`` once it is done; it never fails (a
    failing ``build`` becomes a SYSTEM_ERROR reply), because the IPC server sends its result as is."""
    out: Future = Future()

    def done(inner: Future) -> None:
        try:
            out.set_result(build(inner))
        except Exception as exc:  # the admin gets a reply, never a stuck request
            log.exception("%s failed", what)
            out.set_result(_error(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"))

    future.add_done_callback(done)
    return out


def _gather(futures: list[Future]) -> Future:
    """One Future done when every one of ``futures`` is (its result is that list)."""
    out: Future = Future()
    if not futures:
        out.set_result(futures)
        return out

    def one_done(_: Future) -> None:
        # callbacks run on whichever thread completed each future: each one re-checks the whole
        # list, and only the first to see them all done settles ``out``
        if all(f.done() for f in futures):
            try:
                out.set_result(futures)
            except InvalidStateError:
                pass

    for f in futures:
        f.add_done_callback(one_done)
    return out


class AdminClientHandlers:
    """The handlers; ``caller`` reaches clients (the store process sets the IPC one)."""

    def __init__(self, core: BrokerCore, caller: ClientCaller | None = None) -> None:
        self.core = core
        self.caller: ClientCaller = caller or NoClientTransport()
        self.call_timeout_s = CALL_CLIENT_TIMEOUT_S
        self.status_timeout_s = CONSUMER_STATUS_TIMEOUT_S
        core._handlers.update({
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.get_consumer_connection_list,
            RequestCode.GET_PRODUCER_CONNECTION_LIST: self.get_producer_connection_list,
            RequestCode.GET_CONSUMER_RUNNING_INFO: self.get_consumer_running_info,
            RequestCode.CONSUME_MESSAGE_DIRECTLY: self.consume_message_directly,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: self.get_consumer_status,
        })

    # ---- connections -------------------------------------------------------------------------------
    def get_consumer_connection_list(self, req: Request) -> Reply:
        h = GetConsumerConnectionListRequestHeader.from_ext(req.ext)
        info = self.core.clients.group_snapshot(h.consumer_group)
        if info is None:
            return _error(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{h.consumer_group}] not online")
        body = ConsumerConnection(
            connection_set=[_connection(c) for c in info.channels.values()],
            subscription_table=dict(info.subscriptions),
            consume_type=ConsumeType(info.consume_type), message_model=MessageModel(info.message_model),
            consume_from_where=ConsumeFromWhere(info.consume_from_where))
        return Reply(body=body.encode())

    def get_producer_connection_list(self, req: Request) -> Reply:
        h = GetProducerConnectionListRequestHeader.from_ext(req.ext)
        channels = self.core.clients.producer_channels(h.producer_group)
        if not channels:
            return _error(ResponseCode.SYSTEM_ERROR, f"the producer group[{h.producer_group}] not exist")
        return Reply(body=ProducerConnection([_connection(c) for c in channels]).encode())

    # ---- forwarded to one client ---------------------------------------------------------------------
    def get_consumer_running_info(self, req: Request) -> Reply:
        h = GetConsumerRunningInfoRequestHeader.from_ext(req.ext)
        return self._call_consumer(RequestCode.GET_CONSUMER_RUNNING_INFO, req.ext, req.body, h.consumer_group,
                                   h.client_id)

    def consume_message_directly(self, req: Request) -> Reply:
        h = ConsumeMessageDirectlyResultRequestHeader.from_ext(req.ext)
        if not h.msg_id:
            return _error(ResponseCode.SYSTEM_ERROR, "msgId (the offset message id) is required")
        try:
            offset = decode_offset_msg_id(h.msg_id).physical_offset
            record = self.core.store.read_record_bytes(offset)
        except ValueError as exc:  # not an offset message id, or no message there (RecordError)
            return _error(ResponseCode.SYSTEM_ERROR, f"can not find message by the msgId {h.msg_id}: {exc}")
        ext = dict(req.ext)
        ext["brokerName"] = self.core.broker_name
        return self._call_consumer(RequestCode.CONSUME_MESSAGE_DIRECTLY, ext, record, h.consumer_group,
                                   h.client_id or "")

    def _call_consumer(self, code: int, ext: dict[str, str], body: bytes, group: str, client_id: str) -> Reply:
        client = self.core.clients.find_consumer(group, client_id)
        if client is None:
            return _error(ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online")
        if client.version < Version.V3_1_8_SNAPSHOT:
            return _error(ResponseCode.SYSTEM_ERROR,
                          f"The Consumer <{client_id}> Version <{version_desc(client.version)}> too low to finish, "
                          f"please upgrade it to V3_1_8_SNAPSHOT")
        call = self.caller.call(client.channel, ClientRequest(code, dict(ext), body, self.call_timeout_s))

        def relay(done: Future) -> Reply:
            exc = done.exception()
            if isinstance(exc, ClientCallTimeout):
                return _error(ResponseCode.CONSUME_MSG_TIMEOUT, f"consumer <{group}> <{client_id}> Timeout: {exc}")
            if exc is not None:
                return _error(ResponseCode.SYSTEM_ERROR, f"invoke consumer <{group}> <{client_id}> Exception: {exc}")
            resp: ClientResponse = done.result()
            return Reply(code=resp.code, remark=resp.remark, ext=dict(resp.ext), body=resp.body)

        return Reply(deferred=_then(call, relay, f"request {code} to {client_id}"))

    # ---- the whole group -----------------------------------------------------------------------------
    def reset_offset(self, req: Request) -> Reply:
        h = ResetOffsetRequestHeader.from_ext(req.ext)
        store, metadata = self.core.store, self.core.metadata
        config = metadata.topics.get(h.topic)
        if config is None:
            return _error(ResponseCode.SYSTEM_ERROR,
                          f"[reset-offset] reset offset failed, no topic in this broker. topic={h.topic}")
        table: dict[MessageQueue, int] = {}
        for qid in range(config.write_queue_nums):
            committed = metadata.consumer_offsets.query_offset(h.group, h.topic, qid)
            if committed == -1:
                return _error(ResponseCode.SYSTEM_ERROR, f"THe consumer group <{h.group}> not exist")
            if h.timestamp == -1:
                target = store.max_offset(h.topic, qid)
            else:
                target = store.search_offset_by_time(h.topic, qid, h.timestamp)
            target = max(target, 0)
            table[MessageQueue(h.topic, self.core.broker_name, qid)] = \
                target if h.is_force or target < committed else committed
        clients = self.core.clients.consumer_channels(h.group)
        if not clients:
            return _error(ResponseCode.CONSUMER_NOT_ONLINE,
                          f"Consumer not online, so can not reset offset, Group: {h.group} Topic: {h.topic} "
                          f"Timestamp: {h.timestamp}")
        for client in clients:
            if client.version < Version.V3_0_7_SNAPSHOT:
                return _error(ResponseCode.SYSTEM_ERROR,
                              f"the client does not support this feature. version={version_desc(client.version)}")
        for mq, offset in table.items():
            metadata.consumer_offsets.commit_offset(h.group, h.topic, mq.queue_id, offset)
        body = (ResetOffsetBodyForC(table) if req.language == CPP_LANGUAGE else ResetOffsetBody(table)).encode()
        ext = ResetOffsetRequestHeader(group=h.group, topic=h.topic, timestamp=h.timestamp, is_force=False).to_ext()
        for client in clients:
            sent = self.caller.call(client.channel, ClientRequest(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, ext,
                                                                  body, RESET_OFFSET_TIMEOUT_S, oneway=True))
            sent.add_done_callback(lambda f, cid=client.client_id: _log_reset(f, h.topic, h.group, cid))
        return Reply(body=ResetOffsetBody(table).encode())

    def get_consumer_status(self, req: Request) -> Reply:
        h = GetConsumerStatusRequestHeader.from_ext(req.ext)
        clients = self.core.clients.consumer_channels(h.group)
        if not clients:
            return _error(ResponseCode.SYSTEM_ERROR, f"No Any Consumer online in the consumer group: [{h.group}]")
        wanted = (h.client_addr or "").strip()
        ext = GetConsumerStatusRequestHeader(topic=h.topic, group=h.group).to_ext()
        asked: list[tuple[str, Future]] = []
        for client in sorted(clients, key=lambda c: c.client_id):
            if client.version < Version.V3_0_7_SNAPSHOT:
                return _error(ResponseCode.SYSTEM_ERROR,
                              f"the client does not support this feature. version={version_desc(client.version)}")
            if not wanted or wanted == client.client_id:
                asked.append((client.client_id, self.caller.call(client.channel, ClientRequest(
                    RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, ext, b"", self.status_timeout_s))))
                if wanted:
                    break

        def gather(_: Future) -> Reply:
            table = {}
            for client_id, future in asked:
                exc = future.exception()
                if exc is not None:
                    log.info("[get-consumer-status] %s of %s did not answer: %s", client_id, h.group, exc)
                    continue
                resp: ClientResponse = future.result()
                if resp.code == ResponseCode.SUCCESS and resp.body:
                    table[client_id] = GetConsumerStatusBody.decode(resp.body).message_queue_table
            return Reply(body=GetConsumerStatusBody(consumer_table=table).encode())

        return Reply(deferred=_then(_gather([f for _, f in asked]), gather, "get consumer status"))


def _connection(client: ClientChannel) -> Connection:
    return Connection(client_id=client.client_id, client_addr=client.addr, language=client.language or "OTHER",
                      version=client.version)


def _log_reset(sent: Future, topic: str, group: str, client_id: str) -> None:
    exc = sent.exception()
    if exc is None:
        log.info("[reset-offset] reset offset sent. topic=%s, group=%s, clientId=%s", topic, group, client_id)
    else:
        log.warning("[reset-offset] reset offset to %s failed. topic=%s, group=%s: %s", client_id, topic, group, exc)
