"""The read-only admin requests of ``mqadmin`` and the RocketMQ Dashboard that report statistics.

* GET_BROKER_RUNTIME_INFO (28): the ``KVTable`` ``prepareRuntimeInfo`` builds (clusterList,
  brokerStatus, the Dashboard's broker page), from :mod:`broker.server.stats` and the store;
* VIEW_BROKER_STATS_DATA (315): one stats item's minute/hour/day (statsAll's TPS and 24 h counts);
* QUERY_TOPIC_CONSUME_BY_WHO (300): the groups of a topic, online or with committed offsets
  (statsAll, queryMsgById and friends after printing the message);
* GET_BROKER_CONSUME_STATS (317): every subscription group's consume stats (brokerConsumeStats);
* QUERY_CONSUME_TIME_SPAN (303): per queue, the store times of the first, last and last consumed
  message and how long the next one has waited (the Dashboard's consumer detail).

:func:`stats_handlers` returns them for ``BrokerCore``'s handler table; the counting itself is in
:class:`~broker.server.stats.BrokerStatsManager`, called by the send and pull paths.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from broker.remoting.bodies import (
    BrokerStatsData,
    BrokerStatsItem,
    ConsumeStats,
    ConsumeStatsList,
    GroupList,
    MessageQueue,
    OffsetWrapper,
    QueryConsumeTimeSpanBody,
    QueueTimeSpan,
    dumps_json,
)
from broker.remoting.codes import RequestCode, ResponseCode, Version
from broker.remoting.headers import (
    GetConsumeStatsInBrokerHeader,
    QueryConsumeTimeSpanRequestHeader,
    QueryTopicConsumeByWhoRequestHeader,
    ViewBrokerStatsDataRequestHeader,
)
from broker.remoting.java_text import java_double
from broker.server.stats import GROUP_GET_NUMS, StatsSnapshot
from broker.store.constants import PROPERTY_RETRY_TOPIC
from broker.store.properties import decode_properties
from broker.store.topics import SCHEDULE_TOPIC

if TYPE_CHECKING:
    from broker.server.send_back import SendBackResult
    from broker.server.processors import BrokerCore, Reply, Request

BROKER_VERSION = Version.V4_9_8  # the protocol and store format this broker answers as
TRANSIENT_POOL_DISABLED = 2**31 - 1  # remainTransientStoreBufferNumbs without a transient store pool
COMMITLOG_DIR, CONSUME_QUEUE_DIR = "commitlog", "consumequeue"


# ---- formatting ------------------------------------------------------------------------------------
def human_bytes(size: int) -> str:
    """``MixAll.humanReadableByteCount(size, false)``: ``512 B``, ``1.5 KiB``, ``12.3 GiB``."""
    if size < 1024:
        return f"{size} B"
    exponent = 0
    value = float(size)
    while value >= 1024 and exponent < 6:
        value /= 1024
        exponent += 1
    return f"{value:.1f} {'KMGTPE'[exponent - 1]}iB"


def _disk_usage(path: Path) -> tuple[int, int] | None:
    """(total, free) bytes of the file system holding ``path`` (Java's getTotalSpace/getFreeSpace)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize


def _used_ratio(path: Path) -> float:
    """``UtilAll.getDiskPartitionSpaceUsedPercent``: used/total, -1 for a missing path."""
    usage = _disk_usage(path)
    if usage is None or usage[0] <= 0:
        return -1.0
    total, free = usage
    return (total - free) / total


# ---- runtime info ------------------------------------------------------------------------------------
def runtime_info(core: BrokerCore) -> dict[str, str]:
    """``prepareRuntimeInfo``: what this broker measures of Apache's keys, formatted as Apache does."""
    store = core.store
    info = core.stats.store_runtime_info()
    root = store.store_dir
    commitlog_dir = root / COMMITLOG_DIR
    ratio = _used_ratio(commitlog_dir)
    info.update({
        "brokerVersionDesc": BROKER_VERSION.name,
        "brokerVersion": str(int(BROKER_VERSION)),
        "commitLogMinOffset": str(store.commitlog_min_offset),
        "commitLogMaxOffset": str(store.commitlog_max_offset),
        "dispatchBehindBytes": str(store.dispatch_behind_bytes),
        "earliestMessageTimeStamp": str(store.earliest_message_time()),
        "startAcceptSendRequestTimeStamp": "0",  # Apache's default: sends are accepted from boot
        "pageCacheLockTimeMills": "0",  # appends take no page-cache lock that a reader could wait on
        "remainTransientStoreBufferNumbs": str(TRANSIENT_POOL_DISABLED),
        "commitLogDiskRatio": java_double(ratio),
        f"commitLogDiskRatio_{commitlog_dir}": java_double(ratio),
        "consumeQueueDiskRatio": java_double(_used_ratio(root / CONSUME_QUEUE_DIR)),
    })
    if core.stats.queue_sizes is not None:  # sends wait for the lane; pulls and queries share one pool
        waiting = core.stats.queue_sizes()
        info["sendThreadPoolQueueSize"] = str(waiting["send"])
        info["pullThreadPoolQueueSize"] = info["queryThreadPoolQueueSize"] = str(waiting["other"])
    usage = _disk_usage(root)
    if usage is not None:
        info["commitLogDirCapacity"] = f"Total : {human_bytes(usage[0])}, Free : {human_bytes(usage[1])}."
    with core.metadata.delay_offsets.lock:
        delay_offsets = dict(core.metadata.delay_offsets.table.offsets)
    for level, offset in sorted(delay_offsets.items()):
        info[f"scheduleMessageOffset_{level}"] = f"{offset},{store.max_offset(SCHEDULE_TOPIC, level - 1)}"
    return info


# ---- counting helpers for the request path -----------------------------------------------------------------
def count_send_back(core: BrokerCore, group: str, origin_topic: str | None, result: SendBackResult) -> None:
    """SNDBCK_PUT_NUMS under the message's original topic (its RETRY_TOPIC when it was a retry)."""
    put = result.put
    if put is None or not put.ok or not put.records:
        return
    topic = decode_properties(put.records[0].properties_raw or "").get(PROPERTY_RETRY_TOPIC) or origin_topic or ""
    core.stats.on_send_back(group, topic, put.wrote_bytes)


# ---- handlers --------------------------------------------------------------------------------------------
def _item(snapshot: StatsSnapshot) -> BrokerStatsItem:
    return BrokerStatsItem(snapshot.sum, snapshot.tps, snapshot.avgpt)


def _store_time(core: BrokerCore, topic: str, queue_id: int, offset: int) -> int:
    return core.store.store_time_at(topic, queue_id, offset)


def _consume_stats(core: BrokerCore, group: str, topic: str, write_queues: int) -> ConsumeStats:
    """One topic of GET_BROKER_CONSUME_STATS: every write queue, lastTimestamp only when known."""
    committed = core.metadata.consumer_offsets.offsets_for(group, topic)
    table = {}
    for qid in range(write_queues):
        consumer = max(committed.get(qid, -1), 0)
        last = _store_time(core, topic, qid, consumer - 1) if consumer > 0 else 0
        table[MessageQueue(topic, core.broker_name, qid)] = OffsetWrapper(
            broker_offset=max(core.store.max_offset(topic, qid), 0), consumer_offset=consumer,
            pull_offset=consumer, last_timestamp=max(last, 0))
    return ConsumeStats(table, core.stats.minute_tps(GROUP_GET_NUMS, f"{topic}@{group}"))


def stats_handlers(core: BrokerCore) -> dict[int, Callable[[Request], Reply]]:
    """The request handlers of this module, bound to ``core``."""
    from broker.server.processors import Reply

    def get_broker_runtime_info(req: Request) -> Reply:
        return Reply(body=dumps_json({"table": runtime_info(core)}))

    def view_broker_stats_data(req: Request) -> Reply:
        h = ViewBrokerStatsDataRequestHeader.from_ext(req.ext)
        windows = core.stats.item_stats(h.stats_name, h.stats_key)
        if windows is None:
            return Reply(code=ResponseCode.SYSTEM_ERROR,
                         remark=f"The stats <{h.stats_name}> <{h.stats_key}> not exist")
        minute, hour, day = windows
        return Reply(body=BrokerStatsData(_item(minute), _item(hour), _item(day)).encode())

    def query_topic_consume_by_who(req: Request) -> Reply:
        h = QueryTopicConsumeByWhoRequestHeader.from_ext(req.ext)
        groups = set()
        for group in core.clients.groups():  # online: a consumer of the group subscribes to the topic
            info = core.clients.group_info(group)
            if info is not None and h.topic in info.subscriptions:
                groups.add(group)
        with core.metadata.consumer_offsets.lock:  # offline too: groups with offsets on the topic
            groups.update(group for topic, group, _, _ in core.metadata.consumer_offsets.table.entries()
                          if topic == h.topic)
        return Reply(body=GroupList(sorted(groups)).encode())

    def get_broker_consume_stats(req: Request) -> Reply:
        h = GetConsumeStatsInBrokerHeader.from_ext(req.ext)
        with core.metadata.groups.lock:
            groups = sorted(core.metadata.groups.table.groups)
        entries, total_diff = [], 0
        for group in groups:
            with core.metadata.consumer_offsets.lock:
                topics = core.metadata.consumer_offsets.table.topics_of(group)
            online = core.clients.group_info(group)
            per_topic = []
            for topic in topics:
                config = core.metadata.topics.get(topic)
                if config is None or (h.is_order and not config.order):
                    continue
                if online is not None and online.subscriptions and topic not in online.subscriptions:
                    continue  # the online consumers of the group no longer subscribe to it
                stats = _consume_stats(core, group, topic, config.write_queue_nums)
                total_diff += stats.total_diff()
                per_topic.append(stats)
            entries.append({group: per_topic})
        return Reply(body=ConsumeStatsList(core.broker_addr, total_diff, entries).encode())

    def query_consume_time_span(req: Request) -> Reply:
        h = QueryConsumeTimeSpanRequestHeader.from_ext(req.ext)
        config = core.metadata.topics.get(h.topic)
        if config is None:
            return Reply(code=ResponseCode.TOPIC_NOT_EXIST, remark=f"topic[{h.topic}] not exist")
        now = core.stats.clock()
        spans = []
        for qid in range(config.write_queue_nums):
            min_time = core.store.earliest_store_time(h.topic, qid)
            max_offset = core.store.max_offset(h.topic, qid)
            consumer = core.metadata.consumer_offsets.query_offset(h.group, h.topic, qid)
            consume_time = _store_time(core, h.topic, qid, consumer - 1) if consumer > 0 else min_time
            delay = now - _store_time(core, h.topic, qid, consumer) if consumer < max_offset else 0
            spans.append(QueueTimeSpan(MessageQueue(h.topic, core.broker_name, qid), min_time,
                                       _store_time(core, h.topic, qid, max_offset - 1), consume_time, delay))
        return Reply(body=QueryConsumeTimeSpanBody(spans).encode())

    return {
        RequestCode.GET_BROKER_RUNTIME_INFO: get_broker_runtime_info,
        RequestCode.VIEW_BROKER_STATS_DATA: view_broker_stats_data,
        RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: query_topic_consume_by_who,
        RequestCode.GET_BROKER_CONSUME_STATS: get_broker_consume_stats,
        RequestCode.QUERY_CONSUME_TIME_SPAN: query_consume_time_span,
    }
