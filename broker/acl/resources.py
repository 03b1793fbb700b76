"""What a request needs (Apache's ``PlainAccessResource.parse``): resource → permission bits.

Topics are named as they are; a consumer group is named by its retry topic (``%RETRY%group``) so
one table holds both and the checker tells them apart by the prefix. Request codes not listed need
no resource: a signed request from a known account passes (admin codes aside, see
:mod:`~broker.acl.permission`).
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.acl.errors import FRAME_PARSE, AclDenied
from broker.acl.permission import PUB, SUB
from broker.remoting.bodies import HeartbeatData
from broker.remoting.codes import RequestCode
from broker.store.topics import is_retry_topic, retry_topic


def _required(ext: Mapping[str, str], key: str) -> str:
    value = ext.get(key)
    if value is None:
        # Apache decodes the header first: a missing @CFNotNull field fails the request there
        raise AclDenied(f"the custom field <{key}> is null", FRAME_PARSE)
    return value


def _group(into: dict[str, int], group: str | None) -> None:
    if group is not None:
        into[retry_topic(group)] = SUB


def _send(into: dict[str, int], topic: str | None, producer_group: str | None) -> None:
    """A send needs PUB on its topic; a send to a retry topic needs SUB on the producer's group (Apache
    reads a ``group`` field the SEND_MESSAGE header does not have; we read the header's producer group)."""
    if topic is None:
        return
    if is_retry_topic(topic):
        _group(into, producer_group)
    else:
        into[topic] = PUB


def requested(code: int, ext: Mapping[str, str], body: bytes) -> dict[str, int]:
    """Resources ``code`` needs, from its header (and a heartbeat's body); :class:`AclDenied` when the
    request is too broken to tell (Apache fails the request the same way)."""
    need: dict[str, int] = {}
    if code == RequestCode.SEND_MESSAGE:
        _send(need, ext.get("topic"), ext.get("producerGroup"))
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        _send(need, ext.get("b"), ext.get("a"))
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        _group(need, ext.get("group"))
    elif code == RequestCode.PULL_MESSAGE:
        if ext.get("topic") is not None:
            need[ext["topic"]] = SUB
        _group(need, ext.get("consumerGroup"))
    elif code == RequestCode.QUERY_MESSAGE:
        if ext.get("topic") is not None:
            need[ext["topic"]] = SUB
    elif code == RequestCode.HEART_BEAT:
        try:
            heartbeat = HeartbeatData.decode(body)
        except Exception as exc:  # any malformed body: refused like Apache's decode failure
            raise AclDenied(f"heartbeat body: {exc}", FRAME_PARSE) from None
        for consumer in heartbeat.consumers:
            _group(need, consumer.group_name)
            for sub in consumer.subscriptions:
                need[sub.topic] = SUB
    elif code == RequestCode.UNREGISTER_CLIENT:
        _group(need, ext.get("consumerGroup"))
    elif code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
        _group(need, _required(ext, "consumerGroup"))
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        _group(need, _required(ext, "consumerGroup"))
        need[_required(ext, "topic")] = SUB
    return need
