"""What a push consumer answers when a broker asks it something (Java's ``ClientRemotingProcessor``).

* GET_CONSUMER_RUNNING_INFO (307): ConsumerRunningInfo (a thread dump in ``jstack`` when asked);
* CONSUME_MESSAGE_DIRECTLY (309): the stored message in the body goes to the listener, the answer
  is a ConsumeMessageDirectlyResult;
* RESET_CONSUMER_CLIENT_OFFSET (220, one-way): the consumer goes on from the offsets of the body;
* GET_CONSUMER_STATUS_FROM_CLIENT (221): the consumer's in-memory offsets of a topic.

A request for a group this consumer is not answers SYSTEM_ERROR with Java's remark.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from typing import TYPE_CHECKING

from broker.remoting.bodies import GetConsumerStatusBody, ResetOffsetBody, ResetOffsetBodyForC
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import (
    ConsumeMessageDirectlyResultRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumerStatusRequestHeader,
    ResetOffsetRequestHeader,
)

if TYPE_CHECKING:
    from broker.client.consumer import PushConsumer

log = logging.getLogger(__name__)


def _not_here(cmd: RemotingCommand, group: str) -> RemotingCommand:
    return cmd.response(ResponseCode.SYSTEM_ERROR, f"The Consumer Group <{group}> not exist in this consumer")


def thread_dump() -> str:
    """Every thread's stack, the Python counterpart of Java's ``UtilAll.jstack()``."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f'"{names.get(ident, ident)}"\n' + "".join(traceback.format_stack(frame)))
    return "\n".join(parts)


def register_broker_requests(consumer: PushConsumer) -> None:
    """Install the handlers on the consumer's client instance."""

    def running_info(cmd: RemotingCommand) -> RemotingCommand:
        h = GetConsumerRunningInfoRequestHeader.from_command(cmd)
        if h.consumer_group != consumer.group:
            return _not_here(cmd, h.consumer_group)
        info = consumer.running_info()
        if h.jstack_enable:
            info.jstack = thread_dump()
        return cmd.response(ResponseCode.SUCCESS, body=info.encode())

    def consume_directly(cmd: RemotingCommand) -> RemotingCommand:
        from broker.client.consumer import decode_records

        h = ConsumeMessageDirectlyResultRequestHeader.from_command(cmd)
        if h.consumer_group != consumer.group:
            return _not_here(cmd, h.consumer_group)
        records = decode_records(cmd.body)
        if not records:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "no message in the request body")
        result = consumer.consume_directly(records[0])
        return cmd.response(ResponseCode.SUCCESS, body=result.encode())

    def reset_offset(cmd: RemotingCommand) -> None:
        h = ResetOffsetRequestHeader.from_command(cmd)
        if h.group != consumer.group or not cmd.body:
            return None
        text = cmd.body.lstrip()
        if text.startswith(b'{"offsetTable":['):  # the C++ form (a list of queues with offsets)
            table = ResetOffsetBodyForC.decode(cmd.body).offset_table
        else:
            table = ResetOffsetBody.decode(cmd.body).offset_table
        log.info("reset offsets of %s/%s to %s", h.group, h.topic, {mq.queue_id: o for mq, o in table.items()})
        consumer.reset_offsets(h.topic, table)
        return None

    def consumer_status(cmd: RemotingCommand) -> RemotingCommand:
        h = GetConsumerStatusRequestHeader.from_command(cmd)
        offsets = consumer.consumer_offsets(h.topic) if h.group == consumer.group else {}
        return cmd.response(ResponseCode.SUCCESS, body=GetConsumerStatusBody(message_queue_table=offsets).encode())

    handlers = consumer.client.request_handlers
    handlers[RequestCode.GET_CONSUMER_RUNNING_INFO] = running_info
    handlers[RequestCode.CONSUME_MESSAGE_DIRECTLY] = consume_directly
    handlers[RequestCode.RESET_CONSUMER_CLIENT_OFFSET] = reset_offset
    handlers[RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT] = consumer_status
