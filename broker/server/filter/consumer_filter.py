"""What a subscription selects on a pull, and which subscriptions the broker refuses.

Apache RocketMQ 4.9's rules, kept apart from the request handlers so they stay small:

* TAG subscriptions (``*``, ``TagA || TagB``; the default expression type) filter on tags, always.
* SQL92 subscriptions need ``enablePropertyFilter``. Without it the broker refuses them with
  SYSTEM_ERROR "The broker does not support consumer to filter message by SQL92" — at
  CHECK_CLIENT_CONFIG (which the Java consumer sends when it starts) and on every pull.
* A SQL92 expression that does not compile is refused, never treated as "no match": CHECK_CLIENT_CONFIG
  answers SUBSCRIPTION_PARSE_FAILED with the parser's message; a pull that carries its subscription
  answers SUBSCRIPTION_PARSE_FAILED; a pull that relies on the heartbeat's subscription answers
  FILTER_DATA_NOT_EXIST (Apache's broker keeps no filter data for an expression it could not
  compile). Every remark names what is wrong and where.
* ``%RETRY%<group>`` queues hold the group's redelivered messages of every topic; each one is
  checked against the group's subscription to its original topic (the ``RETRY_TOPIC`` property), as
  Apache does with ``filterSupportRetry``: a SQL92 subscription filters its retries, a TAG
  subscription (or none) lets them through.

Expressions are compiled once per text and cached (:func:`broker.server.filter.sql92.compile_selector`),
so resolving a pull's filter costs a dict lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.remoting.bodies import SubscriptionData
from broker.remoting.codes import ExpressionType, ResponseCode
from broker.server.filter.expressions import Selector
from broker.server.filter.sql92 import compile_selector
from broker.store.constants import PROPERTY_RETRY_TOPIC
from broker.store.topics import consumer_group_of, is_retry_topic

log = logging.getLogger(__name__)

NOT_SUPPORTED_REMARK = "The broker does not support consumer to filter message by {}"
PARSE_FAILED_REMARK = "parse the consumer's subscription failed"
FILTER_DATA_NOT_EXIST_REMARK = "The broker's consumer filter data is not exist!Your expression may be wrong!"

PropertyFilter = Callable[[Mapping[str, str]], bool]
SubscriptionLookup = Callable[[str, str], "SubscriptionData | None"]  # (group, topic) → heartbeat's subscription


@dataclass(frozen=True)
class Refusal:
    """The reply a refused subscription gets."""

    code: int
    remark: str


@dataclass(frozen=True)
class PullFilter:
    """``tags``: tag strings to match (None = all); ``properties``: a predicate over a message's
    properties (None = all). The store applies both."""

    tags: set[str] | None = None
    properties: PropertyFilter | None = None


def is_tag_type(expression_type: str | None) -> bool:
    """Apache's ``ExpressionType.isTagType``: no type, an empty one, or TAG."""
    return expression_type is None or expression_type == "" or expression_type == ExpressionType.TAG


def parse_tag_filter(expression: str | None) -> set[str] | None:
    """``TagA || TagB`` → {"TagA", "TagB"}; ``*`` or empty → no filter."""
    if expression is None:
        return None
    tags = {t.strip() for t in expression.split("||") if t.strip()}
    if not tags or "*" in tags:
        return None
    return tags


def compile_expression(expression_type: str, expression: str | None) -> Selector:
    """The compiled selector of a non-TAG subscription; raises ValueError with the reason
    (:class:`~broker.server.filter.sql92.SelectorError` for a malformed SQL92 expression)."""
    if expression_type != ExpressionType.SQL92:
        raise ValueError(f"expression type {expression_type} is not supported: the broker filters by "
                         f"{ExpressionType.TAG} or {ExpressionType.SQL92}")
    return compile_selector(expression if expression is not None else "")


def check_client_config(subscription: SubscriptionData | None, enabled: bool) -> Refusal | None:
    """CHECK_CLIENT_CONFIG: None when the broker can serve ``subscription``, else the refusal."""
    if subscription is None or is_tag_type(subscription.expression_type):
        return None
    if not enabled:
        return Refusal(ResponseCode.SYSTEM_ERROR, NOT_SUPPORTED_REMARK.format(subscription.expression_type))
    try:
        compile_expression(subscription.expression_type, subscription.sub_string)
    except ValueError as exc:
        return Refusal(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
    return None


def pull_filter(topic: str, expression_type: str | None, expression: str | None, *, from_request: bool,
                enabled: bool, subscription_of: SubscriptionLookup) -> PullFilter | Refusal:
    """The filter of one pull, or why it is refused.

    ``from_request``: the pull carries its subscription (the SUBSCRIPTION sys flag) instead of
    relying on the one its group's heartbeat registered. ``subscription_of(group, topic)`` finds a
    heartbeat's subscription (for the original topics of retried messages)."""
    selector: Selector | None = None
    if not is_tag_type(expression_type):
        if from_request and not enabled:
            return Refusal(ResponseCode.SYSTEM_ERROR, NOT_SUPPORTED_REMARK.format(expression_type))
        try:
            selector = compile_expression(expression_type, expression)
        except ValueError as exc:
            if from_request:
                return Refusal(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"{PARSE_FAILED_REMARK}: {exc}")
            return Refusal(ResponseCode.FILTER_DATA_NOT_EXIST, f"{FILTER_DATA_NOT_EXIST_REMARK} {exc}")
        if not enabled:
            return Refusal(ResponseCode.SYSTEM_ERROR, NOT_SUPPORTED_REMARK.format(expression_type))
    tags = parse_tag_filter(expression) if is_tag_type(expression_type) else None
    if is_retry_topic(topic) and enabled:
        return PullFilter(tags, retry_filter(consumer_group_of(topic) or "", subscription_of))
    return PullFilter(tags, None if selector is None else selector.matches)


def retry_filter(group: str, subscription_of: SubscriptionLookup) -> PropertyFilter:
    """A retried message passes when the group's subscription to its original topic selects it.

    Made per pull; remembers what it found per original topic, so one batch asks the client
    registry once per topic."""
    found: dict[str | None, Selector | None] = {}

    def selector_for(real_topic: str | None) -> Selector | None:
        if real_topic in found:
            return found[real_topic]
        selector = None
        sub = subscription_of(group, real_topic) if real_topic is not None else None
        if sub is not None and not is_tag_type(sub.expression_type):
            try:
                selector = compile_expression(sub.expression_type, sub.sub_string)
            except ValueError as exc:  # Apache holds no filter data for it: retries are delivered
                log.debug("retry filter of %s for %s: %s", group, real_topic, exc)
        found[real_topic] = selector
        return selector

    def matches(props: Mapping[str, str]) -> bool:
        selector = selector_for(props.get(PROPERTY_RETRY_TOPIC))
        return selector is None or selector.matches(props)

    return matches
