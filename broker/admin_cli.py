"""``rocketlake admin``: Apache ``mqadmin``'s cluster, topic, group, offset, name-server-config, broker-config,
broker statistics and connected-client verbs.

Same subcommand names and short flags as ``mqadmin`` (``updateTopic -n NS -c CLUSTER -t TOPIC``…),
so runbooks written for an Apache cluster work here, and only standard request codes are sent, so
this tool works against an Apache cluster too. Output follows mqadmin's layout, except that times
are UTC and say so (mqadmin prints the local time of whoever runs it).

Failures (name server or broker unreachable, unknown topic or cluster, a broker refusing) are one
``error: …`` line on stderr and exit code 1; bad arguments are argparse errors, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable

from broker.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, _cell, _positive
from broker.remoting.codes import perm_to_string

if TYPE_CHECKING:
    from broker.client.admin import Admin

ROUTE_WAIT_S = 30.0  # updateTopic: how long to wait for the name server to route the new topic
PERM_CHOICES = (2, 4, 6)  # mqadmin: 2 = W, 4 = R, 6 = RW


# ---- argument types --------------------------------------------------------------------------------
def _address(text: str) -> str:
    """One ``host:port``; a malformed one is a usage error here, not a connect failure later."""
    from broker.remoting.transport import parse_address

    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _namesrv_list(text: str) -> str:
    """``host:port[;host:port…]`` as mqadmin's ``-n`` takes it."""
    addrs = [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]
    if not addrs:
        raise argparse.ArgumentTypeError("a name server address is required (e.g. 127.0.0.1:9876)")
    return ";".join(_address(a) for a in addrs)


def _bool_text(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return value == "true"


def _utc(ms: int, with_millis: bool) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, timezone.utc)
    return stamp.strftime("%Y-%m-%d %H:%M:%S,%f")[:-3] if with_millis else stamp.strftime("%Y-%m-%d %H:%M:%S")


# ---- subcommands -------------------------------------------------------------------------------------
def cmd_update_topic(admin: Admin, args: argparse.Namespace) -> int:
    """Create/update on every master of the cluster (or the one broker), then wait for the route."""
    from broker.client import MQClientError

    if args.cluster:
        targets = admin.cluster_masters(args.cluster)
        if not targets:
            raise MQClientError(f"cluster {args.cluster!r} has no master broker")
    else:  # the broker name is needed to recognise its queues in the route
        names = {addr: name for name, addr in admin.broker_addrs().items()}
        targets = {names.get(args.broker, ""): args.broker}
    for addr in targets.values():
        admin.create_topic(addr, args.topic, read_queues=args.read_queues, write_queues=args.write_queues,
                           perm=args.perm, order=args.order)
        print(f"create topic to {addr} success.")
    print(f"TopicConfig [topicName={args.topic}, readQueueNums={args.read_queues}, "
          f"writeQueueNums={args.write_queues}, perm={perm_to_string(args.perm)}, topicFilterType=SINGLE_TAG, "
          f"topicSysFlag=0, order={str(args.order).lower()}]")
    sys.stdout.flush()
    if "" in targets:
        print(f"error: topic {args.topic!r} was created on {args.broker}, but that broker is not registered "
              f"with the name server {args.namesrv}, so its clients will not find the topic", file=sys.stderr)
        return EXIT_FINDINGS
    if not admin.wait_routed(args.topic, list(targets), args.read_queues, args.write_queues, args.perm,
                             timeout=ROUTE_WAIT_S):
        print(f"error: topic {args.topic!r} was created, but the name server {args.namesrv} does not route it "
              f"after {ROUTE_WAIT_S:g} s", file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK


def cmd_topic_list(admin: Admin, args: argparse.Namespace) -> int:
    if not args.cluster_mode:
        for topic in admin.topic_list():
            print(_cell(topic))
        return EXIT_OK
    # mqadmin's -c table leaves out the per-group retry and dead-letter topics
    print(f"{'#Cluster Name':<20}  #Topic")
    for cluster in sorted(admin.cluster_info().cluster_addr_table):
        for topic in admin.topics_by_cluster(cluster):
            if not topic.startswith(("%RETRY%", "%DLQ%")):
                print(f"{_cell(cluster):<20}  {_cell(topic)}")
    return EXIT_OK


def _first_rate(rates: str | None) -> str:
    """The 10-second rate of a runtime-info triple (``"r10 r60 r600"``) with two decimals; N/A while
    the broker has too few samples for it (it sends an empty part then) or does not send the key."""
    try:
        return f"{float((rates or '').split(' ')[0]):.2f}"
    except ValueError:
        return "N/A"


def _load(rates: str | None, queue_size: str | None, head_wait_ms: str | None) -> str:
    """clusterList's ``TPS(queue size,head wait ms)`` cell, with only the load figures the broker
    reports (ours has no queue-head wait time, and the queue sizes only when it runs lanes)."""
    load = [v for v in (queue_size, None if head_wait_ms is None else f"{head_wait_ms}ms") if v is not None]
    return _first_rate(rates) + (f"({','.join(load)})" if load else "")


def cmd_cluster_list(admin: Admin, args: argparse.Namespace) -> int:
    """mqadmin's clusterList: one row per registered broker (slaves too) with GET_BROKER_RUNTIME_INFO's
    version, in/out TPS and load, page-cache lock wait, hours of messages kept and commit log disk use.
    A broker that does not answer still gets its row (N/A), so one dead slave does not hide the cluster."""
    from broker.client import MQClientError
    from broker.remoting.command import ProtocolError

    brokers = admin.cluster_brokers(args.cluster)  # an unknown -c fails before the header is printed
    print(f"{'#Cluster Name':<16}  {'#Broker Name':<22}  {'#BID':<4}  {'#Addr':<22}  {'#Version':<16}  "
          f"{'#InTPS(LOAD)':>19}  {'#OutTPS(LOAD)':>19}  {'#PCWait(ms)':>11}  {'#Hour':>6}  {'#SPACE':>6}")
    failed = []
    for cluster, name, bid, addr in brokers:
        try:
            info = admin.broker_runtime_info(addr)
        except (MQClientError, ProtocolError) as exc:
            failed.append(str(exc))
            info = {}
        earliest_text = info.get("earliestMessageTimeStamp", "")
        earliest = int(earliest_text) if earliest_text.isdigit() else -1  # -1: no message stored
        hours = f"{(time.time() * 1000 - earliest) / 3_600_000:.2f}" if earliest > 0 else "N/A"
        try:
            space = f"{float(info['commitLogDiskRatio']):.4f}"
        except (KeyError, ValueError):
            space = "N/A"
        in_load = _load(info.get("putTps"), info.get("sendThreadPoolQueueSize"),
                        info.get("sendThreadPoolQueueHeadWaitTimeMills"))
        out_load = _load(info.get("getTransferedTps"), info.get("pullThreadPoolQueueSize"),
                         info.get("pullThreadPoolQueueHeadWaitTimeMills"))
        print(f"{_cell(cluster):<16}  {_cell(name):<22}  {bid:<4}  {_cell(addr):<22}  "
              f"{_cell(info.get('brokerVersionDesc', 'N/A')):<16}  {_cell(in_load):>19}  {_cell(out_load):>19}  "
              f"{_cell(info.get('pageCacheLockTimeMills', 'N/A')):>11}  {hours:>6}  {space:>6}")
    if failed:
        sys.stdout.flush()
        for text in failed:
            print(f"error: {text}", file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK


def cmd_topic_route(admin: Admin, args: argparse.Namespace) -> int:
    print(json.dumps(admin.route(args.topic).to_json(), indent=4, ensure_ascii=False))
    return EXIT_OK


def cmd_topic_status(admin: Admin, args: argparse.Namespace) -> int:
    """GET_TOPIC_STATS_INFO on every master of the topic's route, one row per queue."""
    from broker.client import MQClientError

    masters = admin.route_masters(args.topic)
    if not masters:
        raise MQClientError(f"topic {args.topic!r} has no master broker in its route")
    table = {}
    for addr in masters.values():
        table.update(admin.topic_stats(addr, args.topic).offset_table)
    print(f"{'#Broker Name':<32}  {'#QID':<4}  {'#Min Offset':<20}  {'#Max Offset':<20}    #Last Updated (UTC)")
    for mq in sorted(table):
        o = table[mq]
        updated = _utc(o.last_update_timestamp, True) if o.last_update_timestamp > 0 else ""
        print(f"{_cell(mq.broker_name):<32}  {mq.queue_id:<4}  {o.min_offset:<20}  {o.max_offset:<20}    {updated}")
    return EXIT_OK


def cmd_consumer_progress(admin: Admin, args: argparse.Namespace) -> int:
    """GET_CONSUME_STATS on every master (of the topic's route with -t), merged like mqadmin."""
    from broker.client import MQClientError

    masters = admin.route_masters(args.topic) if args.topic else admin.broker_addrs()
    table, tps = {}, 0.0
    for addr in masters.values():
        stats = admin.consumer_progress(addr, args.group, args.topic or "")
        table.update(stats.offset_table)
        tps += stats.consume_tps
    if not table:
        where = f" on topic {args.topic!r}" if args.topic else ""
        raise MQClientError(f"no consume progress for group {args.group!r}{where}: "
                            "it has no committed offset on any broker")
    print(f"{'#Topic':<32}  {'#Broker Name':<32}  {'#QID':<4}  {'#Broker Offset':<20}  {'#Consumer Offset':<20}  "
          f"{'#Diff':<20}  #LastTime (UTC)")
    for mq in sorted(table):
        w = table[mq]
        last = _utc(w.last_timestamp, False) if w.last_timestamp > 0 else "N/A"
        print(f"{_cell(mq.topic):<32}  {_cell(mq.broker_name):<32}  {mq.queue_id:<4}  {w.broker_offset:<20}  "
              f"{w.consumer_offset:<20}  {w.lag:<20}  {last}")
    print()
    print(f"Consume TPS: {tps:.2f}")
    print(f"Diff Total: {sum(w.lag for w in table.values())}")
    return EXIT_OK


def cmd_query_consume_time_span(admin: Admin, args: argparse.Namespace) -> int:
    """QUERY_CONSUME_TIME_SPAN on every master of the topic's route: per queue the store times of its
    first and last message and of the group's last consumed one, and how long the next has waited.
    The group is checked first (QUERY_TOPIC_CONSUME_BY_WHO): the broker answers for any group name,
    so a typo would otherwise print a plausible table of a group that never consumed anything."""
    from broker.client import MQClientError

    masters = admin.route_masters(args.topic)
    if not masters:
        raise MQClientError(f"topic {args.topic!r} has no master broker in its route")
    if not any(args.group in admin.query_topic_consume_by_who(addr, args.topic) for addr in masters.values()):
        raise MQClientError(f"consumer group {args.group!r} does not consume topic {args.topic!r}: no online "
                            "consumer of it subscribes to the topic and it has no committed offset on it")
    spans = [span for addr in masters.values() for span in admin.query_consume_time_span(addr, args.topic, args.group)]

    def when(ms: int) -> str:
        return _utc(ms, True) if ms > 0 else "N/A"  # the broker sends -1 for a queue without messages

    print(f"{'#Broker Name':<32}  {'#QID':<4}  {'#MinTime (UTC)':<23}  {'#MaxTime (UTC)':<23}  "
          f"{'#ConsumeTime (UTC)':<23}  #DelayTime(ms)")
    for span in sorted(spans, key=lambda s: s.message_queue):
        mq = span.message_queue
        # an empty queue has nothing waiting, whatever delay the broker computed from its -1 times
        delay = span.delay_time if span.max_time_stamp > 0 else "N/A"
        print(f"{_cell(mq.broker_name):<32}  {mq.queue_id:<4}  {when(span.min_time_stamp):<23}  "
              f"{when(span.max_time_stamp):<23}  {when(span.consume_time_stamp):<23}  {delay}")
    return EXIT_OK


def cmd_broker_status(admin: Admin, args: argparse.Namespace) -> int:
    """GET_BROKER_RUNTIME_INFO of one broker (-b) or of every master of a cluster (-c), keys sorted."""
    from broker.client import MQClientError

    if args.broker:
        for key, value in sorted(admin.broker_runtime_info(args.broker).items()):
            print(f"{_cell(key):<32}: {_cell(value)}")
        return EXIT_OK
    masters = admin.cluster_masters(args.cluster)
    if not masters:
        raise MQClientError(f"cluster {args.cluster!r} has no master broker")
    for addr in masters.values():
        for key, value in sorted(admin.broker_runtime_info(addr).items()):
            print(f"{addr:<24} {_cell(key):<32}: {_cell(value)}")
    return EXIT_OK


def cmd_broker_consume_stats(admin: Admin, args: argparse.Namespace) -> int:
    """GET_BROKER_CONSUME_STATS: every group's queues on one broker whose diff is at least -l."""
    stats = admin.broker_consume_stats(args.broker, args.order, args.timeout_ms / 1000)
    print(f"{'#Topic':<64}  {'#Group':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#Broker Offset':<20}  "
          f"{'#Consumer Offset':<20}  {'#Diff':<20}  #LastTime (UTC)")
    for group, per_topic in sorted(stats.by_group().items()):
        for consume_stats in per_topic:
            for mq in sorted(consume_stats.offset_table):
                w = consume_stats.offset_table[mq]
                if w.lag < args.level:
                    continue
                last = _utc(w.last_timestamp, False) if w.last_timestamp > 0 else "N/A"
                print(f"{_cell(mq.topic):<64}  {_cell(group):<64}  {_cell(mq.broker_name):<32}  {mq.queue_id:<4}  "
                      f"{w.broker_offset:<20}  {w.consumer_offset:<20}  {w.lag:<20}  {last}")
    print()
    print(f"Diff Total: {stats.total_diff}")
    return EXIT_OK


def _day_sum(data) -> int:
    """statsAll's ``compute24HourSum``: the day window's sum, else the hour's, else the minute's."""
    for item in (data.stats_day, data.stats_hour, data.stats_minute):
        if item.sum:
            return item.sum
    return 0


def cmd_stats_all(admin: Admin, args: argparse.Namespace) -> int:
    """Per topic and consumer group: accumulation, in/out TPS (last minute) and messages in 24 h."""
    from broker.client import MQClientError
    from broker.remoting.codes import ResponseCode
    from broker.server.stats import GROUP_GET_NUMS, TOPIC_PUT_NUMS, stats_key

    print(f"{'#Topic':<32}  {'#Consumer Group':<32} {'#Accumulation':>12} {'#InTPS':>11} {'#OutTPS':>11} "
          f"{'#InMsg24Hour':>14} {'#OutMsg24Hour':>14}")
    topics = [args.topic] if args.topic else admin.topic_list()
    for topic in topics:
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        try:
            masters = list(admin.route_masters(topic).values())
        except MQClientError as exc:
            if exc.code == ResponseCode.TOPIC_NOT_EXIST and not args.topic:
                continue  # gone since the topic list was read
            raise

        def totals(name: str, key: str) -> tuple[float, int]:
            tps, day = 0.0, 0
            for addr in masters:
                try:
                    data = admin.view_broker_stats_data(addr, name, key)
                except MQClientError:  # nothing counted for it on that broker yet
                    continue
                tps += data.stats_minute.tps
                day += _day_sum(data)
            return tps, day

        in_tps, in_day = totals(TOPIC_PUT_NUMS, topic)
        groups = sorted({g for addr in masters for g in admin.query_topic_consume_by_who(addr, topic)})
        if not groups:
            if not args.active or in_day > 0:
                print(f"{_cell(topic):<64}  {'':<32} {0:>12} {in_tps:>11.2f} {'':>11} {in_day:>14} {'NO_CONSUMER':>14}")
            continue
        for group in groups:
            out_tps, out_day = totals(GROUP_GET_NUMS, stats_key(topic, group))
            diff = 0
            for addr in masters:
                try:
                    diff += admin.consumer_progress(addr, group, topic).total_diff()
                except MQClientError:
                    pass
            if not args.active or in_day > 0 or out_day > 0:
                print(f"{_cell(topic):<64}  {_cell(group):<64} {max(diff, 0):>12} {in_tps:>11.2f} {out_tps:>11.2f} "
                      f"{in_day:>14} {out_day:>14}")
    return EXIT_OK


def _masters(admin: Admin, args: argparse.Namespace) -> dict[str, str]:
    """Broker name -> address of the -c cluster's masters, or the -b broker alone."""
    from broker.client import MQClientError

    if getattr(args, "cluster", None):
        masters = admin.cluster_masters(args.cluster)
        if not masters:
            raise MQClientError(f"cluster {args.cluster!r} has no master broker")
        return masters
    return {args.broker: args.broker}


def _delete_topic(admin: Admin, cluster: str, topic: str) -> None:
    admin.delete_topic(topic, cluster)
    print(f"delete topic [{topic}] from cluster [{cluster}] success.")
    print(f"delete topic [{topic}] from NameServer success.")


def cmd_delete_topic(admin: Admin, args: argparse.Namespace) -> int:
    _delete_topic(admin, args.cluster, args.topic)
    return EXIT_OK


def cmd_delete_sub_group(admin: Admin, args: argparse.Namespace) -> int:
    """DELETE_SUBSCRIPTIONGROUP on one broker or every master of a cluster; the group's retry and
    DLQ topics only with --deleteRetryAndDlq (and -c), which mqadmin's cluster mode always does."""
    from broker.client import MQClientError

    if args.retry_dlq and not args.cluster:
        raise MQClientError("--deleteRetryAndDlq needs -c: topics are deleted cluster-wide")
    for addr in _masters(admin, args).values():
        admin.delete_subscription_group(addr, args.group, args.remove_offset)
        where = f" in cluster [{args.cluster}]" if args.cluster else ""
        print(f"delete subscription group [{args.group}] from broker [{addr}]{where} success.")
    if args.retry_dlq:
        for topic in (f"%RETRY%{args.group}", f"%DLQ%{args.group}"):
            _delete_topic(admin, args.cluster, topic)
    return EXIT_OK


def cmd_clone_group_offset(admin: Admin, args: argparse.Namespace) -> int:
    """CLONE_GROUP_OFFSET on every master serving the topic."""
    from broker.client import MQClientError

    masters = admin.route_masters(args.topic)
    if not masters:
        raise MQClientError(f"topic {args.topic!r} has no master broker in its route")
    for addr in masters.values():
        admin.clone_group_offset(addr, args.src, args.dest, args.topic, args.offline)
    print(f"clone group offset success. srcGroup[{args.src}], destGroup=[{args.dest}], topic[{args.topic}]")
    return EXIT_OK


def cmd_get_namesrv_config(admin: Admin, args: argparse.Namespace) -> int:
    for addr, values in admin.namesrv_config().items():
        print(f"============{addr}============")
        for key in sorted(values):
            print(f"{key:<50}=  {values[key]}")
    return EXIT_OK


def cmd_update_namesrv_config(admin: Admin, args: argparse.Namespace) -> int:
    admin.update_namesrv_config({args.key: args.value})
    print(f"update name server config success![{args.namesrv}]")
    print(f"{args.key} : {args.value}")
    return EXIT_OK


def cmd_consumer_connection(admin: Admin, args: argparse.Namespace) -> int:
    """GET_CONSUMER_CONNECTION_LIST: the group's connections, then its subscriptions (mqadmin's layout)."""
    from broker.remoting.codes import version_desc

    conn = admin.consumer_connection(args.group, args.broker)
    print(f"{'#':<3}  {'#ClientId':<40} {'#ClientAddr':<22} {'#Language':<9} #Version")
    for i, c in enumerate(sorted(conn.connection_set, key=lambda c: c.client_id), 1):
        print(f"{i:03d}  {_cell(c.client_id):<40} {_cell(c.client_addr):<22} {_cell(c.language):<9} "
              f"{version_desc(c.version)}")
    print()
    print("Below is subscription:")
    for i, topic in enumerate(sorted(conn.subscription_table), 1):
        print(f"{i:03d}  Topic: {_cell(topic):<40} SubExpression: {_cell(conn.subscription_table[topic].sub_string)}")
    print()
    print(f"ConsumeType: {conn.consume_type.name}")
    print(f"MessageModel: {conn.message_model.name}")
    print(f"ConsumeFromWhere: {conn.consume_from_where.name}")
    return EXIT_OK


def cmd_producer_connection(admin: Admin, args: argparse.Namespace) -> int:
    from broker.remoting.codes import version_desc

    conn = admin.producer_connection(args.group, args.topic)
    for i, c in enumerate(sorted(conn.connection_set, key=lambda c: c.client_id), 1):
        print(f"{i:04d}  {_cell(c.client_id):<40} {_cell(c.client_addr):<22} {_cell(c.language):<9} "
              f"{version_desc(c.version)}")
    return EXIT_OK


def cmd_consumer_status(admin: Admin, args: argparse.Namespace) -> int:
    """mqadmin's consumerStatus: GET_CONSUMER_RUNNING_INFO of one client (-i) or of every client."""
    client_ids = [args.client_id] if args.client_id else sorted(
        c.client_id for c in admin.consumer_connection(args.group).connection_set)
    for client_id in client_ids:
        info = admin.consumer_running_info(args.group, client_id, jstack=args.jstack)
        print(f"#ClientId: {_cell(client_id)}")
        print("#Consumer Properties#")
        for key in sorted(info.properties):
            print(f"{_cell(key):<40}: {_cell(info.properties[key])}")
        print()
        print("#Consumer Subscription#")
        for i, sub in enumerate(sorted(info.subscription_set, key=lambda s: s.topic), 1):
            print(f"{i:03d} Topic: {_cell(sub.topic):<40} ClassFilter: {str(sub.class_filter_mode).lower():<8} "
                  f"SubExpression: {_cell(sub.sub_string)}")
        print()
        print("#Consumer Offset#")
        print(f"{'#Topic':<32}  {'#Broker Name':<32}  {'#QID':<4}  #Consumer Offset")
        for mq in sorted(info.mq_table):
            print(f"{_cell(mq.topic):<32}  {_cell(mq.broker_name):<32}  {mq.queue_id:<4}  "
                  f"{info.mq_table[mq].commit_offset}")
        print()
        print("#Consumer RT&TPS#")
        print(f"{'#Topic':<32}  {'#Pull RT':<14}  {'#Pull TPS':<14}  {'#Consume RT':<14}  {'#ConsumeOK TPS':<14}  "
              f"{'#ConsumeFailed TPS':<18}  #ConsumeFailedMsgsInHour")
        for topic in sorted(info.status_table):
            st = info.status_table[topic]
            print(f"{_cell(topic):<32}  {st.pull_rt:<14.2f}  {st.pull_tps:<14.2f}  {st.consume_rt:<14.2f}  "
                  f"{st.consume_ok_tps:<14.2f}  {st.consume_failed_tps:<18.2f}  {st.consume_failed_msgs}")
        if info.jstack:
            print()
            print("#Consumer jstack#")
            print(info.jstack)
        print()
    return EXIT_OK


def cmd_get_consumer_status(admin: Admin, args: argparse.Namespace) -> int:
    """mqadmin's getConsumerStatus: the offsets each client of the group holds for a topic."""
    table = admin.consumer_status(args.group, args.topic, args.client_id or "")
    print(f"get consumer status from client. group={_cell(args.group)}, topic={_cell(args.topic)}, "
          f"originClientId={_cell(args.client_id or '')}")
    print(f"{'#clientId':<50}  {'#brokerName':<15}  {'#queueId':<15}  #offset")
    for client_id in sorted(table):
        for mq in sorted(table[client_id]):
            print(f"{_cell(client_id):<50}  {_cell(mq.broker_name):<15}  {mq.queue_id:<15}  "
                  f"{table[client_id][mq]}")
    return EXIT_OK


def _timestamp(text: str) -> int:
    """``now``, epoch milliseconds, or mqadmin's ``yyyy-MM-dd#HH:mm:ss:SSS`` (read as UTC here)."""
    value = text.strip()
    if value == "now":
        return int(datetime.now(timezone.utc).timestamp() * 1000)
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        stamp = datetime.strptime(value, "%Y-%m-%d#%H:%M:%S:%f").replace(tzinfo=timezone.utc)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not now, epoch milliseconds or "
                                         "yyyy-MM-dd#HH:mm:ss:SSS") from None
    return int(stamp.timestamp() * 1000)


def cmd_reset_offset_by_time(admin: Admin, args: argparse.Namespace) -> int:
    """INVOKE_BROKER_TO_RESET_OFFSET on every master; an offline group gets mqadmin's fallback
    (the offsets are committed directly with UPDATE_CONSUMER_OFFSET)."""
    from broker.client import MQClientError
    from broker.remoting.codes import ResponseCode

    print(f"rollback consumer offset by specified group[{_cell(args.group)}], topic[{_cell(args.topic)}], "
          f"force[{str(args.force).lower()}], timestamp(long)[{args.timestamp}]")
    try:
        table = admin.reset_offset_by_time(args.group, args.topic, args.timestamp, args.force)
    except MQClientError as exc:
        if exc.code != ResponseCode.CONSUMER_NOT_ONLINE:
            raise
        print("the consumer group is not online: committing the offsets on the brokers instead")
        table = admin.reset_offset_by_time_offline(args.group, args.topic, args.timestamp, args.force)
    print(f"{'#brokerName':<40}  {'#queueId':<40}  #offset")
    for mq in sorted(table):
        print(f"{_cell(mq.broker_name):<40}  {mq.queue_id:<40}  {table[mq]}")
    return EXIT_OK


def cmd_consume_message_directly(admin: Admin, args: argparse.Namespace) -> int:
    """mqadmin's ``queryMsgById -g GROUP -d CLIENT``: the client's listener consumes that message."""
    result = admin.consume_message_directly(args.group, args.client_id, args.msg_id)
    print(f"ConsumeMessageDirectlyResult [order={str(result.order).lower()}, "
          f"autoCommit={str(result.auto_commit).lower()}, consumeResult={result.consume_result.name}, "
          f"remark={_cell(result.remark or '')}, spentTimeMills={result.spent_time_mills}]")
    return EXIT_OK


def _config_targets(admin: Admin, args: argparse.Namespace) -> list[str]:
    """The broker (-b) or every master of the cluster (-c) a config command goes to."""
    from broker.client import MQClientError

    if args.broker:
        return [args.broker]
    masters = admin.cluster_masters(args.cluster)
    if not masters:
        raise MQClientError(f"cluster {args.cluster!r} has no master broker")
    return list(masters.values())


def cmd_get_broker_config(admin: Admin, args: argparse.Namespace) -> int:
    """mqadmin's layout: a ``====addr====`` line, then ``key<padding>=  value`` per setting, sorted."""
    for addr in _config_targets(admin, args):
        config = admin.get_broker_config(addr)
        print(f"============{addr}============")
        for key in sorted(config.values):
            print(f"{key:<50}=  {config.values[key]}")
    return EXIT_OK


def cmd_update_broker_config(admin: Admin, args: argparse.Namespace) -> int:
    for addr in _config_targets(admin, args):
        admin.update_broker_config(addr, {args.key: args.value})
        print(f"update broker config success, {addr}")
    return EXIT_OK


def cmd_admin(args: argparse.Namespace) -> int:
    """Run one subcommand with a connected :class:`Admin`; every failure becomes one stderr line."""
    from broker.client import Admin, MQClientError
    from broker.remoting.command import ProtocolError
    from broker.remoting.tls import TlsConfigError
    from broker.remoting.transport import RemotingError

    if (args.access_key is None) != (args.secret_key is None):
        print("error: --access-key and --secret-key go together", file=sys.stderr)
        return EXIT_USAGE
    try:
        admin = Admin(args.namesrv, access_key=args.access_key, secret_key=args.secret_key, tls=_tls_option(args))
    except TlsConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.admin_func(admin, args)
    except (MQClientError, ProtocolError, RemotingError, OSError, TimeoutError) as exc:
        # ProtocolError: an answer that does not parse; the others: unreachable or refusing peers
        sys.stdout.flush()
        print(f"error: {exc or type(exc).__name__}", file=sys.stderr)
        return EXIT_FINDINGS
    finally:
        admin.close()


def _tls_option(args: argparse.Namespace):
    """The client TLS the flags ask for (Apache's mqadmin takes -Dtls.enable=true), or None."""
    from broker.remoting.tls import ClientTlsConfig

    if not (args.tls or args.tls_ca or args.tls_insecure or args.tls_cert):
        return None
    return ClientTlsConfig(ca_file=args.tls_ca or "", insecure=args.tls_insecure, cert_file=args.tls_cert or "",
                           key_file=args.tls_key or "", check_hostname=not args.tls_no_hostname_check,
                           names=("--tls-ca", "--tls-cert", "--tls-key"))


# ---- parser ----------------------------------------------------------------------------------------
def add_admin_parser(sub: argparse._SubParsersAction) -> None:
    """``rocketlake admin SUBCOMMAND``: registered by :func:`broker.cli.build_parser`."""
    env_ns = os.environ.get("NAMESRV_ADDR")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namesrvAddr", dest="namesrv", type=_namesrv_list, default=env_ns,
                        required=env_ns is None, metavar="NAMESRV",
                        help="name server address(es), host:port[;host:port] (default: $NAMESRV_ADDR)")
    # mqadmin signs with conf/tools.yml's keys; here they are flags
    common.add_argument("--access-key", default=None, metavar="AK",
                        help="sign every request (ACL) as this account; with --secret-key")
    common.add_argument("--secret-key", default=None, metavar="SK", help="the account's secret key")
    tls = common.add_argument_group("TLS (every connection, name servers' and brokers'; any of these turns it on)")
    tls.add_argument("--tls", action="store_true", help="TLS, verifying servers against the system's CAs")
    tls.add_argument("--tls-ca", metavar="PEM", help="verify servers against these CA certificates")
    tls.add_argument("--tls-insecure", action="store_true", help="do not verify servers (self-signed test setups)")
    tls.add_argument("--tls-cert", metavar="PEM", help="client certificate, for servers that require one")
    tls.add_argument("--tls-key", metavar="PEM", help="its private key")
    tls.add_argument("--tls-no-hostname-check", action="store_true",
                     help="accept a verified certificate that does not name the host dialled")

    admin = sub.add_parser("admin", help="mqadmin's topic, group, offset, name server config, broker statistics "
                                          "and connected-client commands",
                           description="A subset of Apache RocketMQ's mqadmin, same names and flags. "
                                       "Exit 1 on failures, 2 on bad arguments.")
    asub = admin.add_subparsers(dest="admin_command", required=True, metavar="SUBCOMMAND")

    def add(name: str, func: Callable[[Admin, argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = asub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(func=cmd_admin, admin_func=func)
        return p

    p = add("updateTopic", cmd_update_topic,
            "create or update a topic on every master of a cluster (-c) or on one broker (-b), then wait "
            f"(up to {ROUTE_WAIT_S:g} s) until the name server routes it")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-c", "--clusterName", dest="cluster", help="create on every master broker of this cluster")
    where.add_argument("-b", "--brokerAddr", dest="broker", type=_address, help="create on this broker (host:port)")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-r", "--readQueueNums", dest="read_queues", type=_positive, default=8, help="default 8")
    p.add_argument("-w", "--writeQueueNums", dest="write_queues", type=_positive, default=8, help="default 8")
    p.add_argument("-p", "--perm", type=int, choices=PERM_CHOICES, default=6, help="2 = W, 4 = R, 6 = RW (default)")
    p.add_argument("-o", "--order", type=_bool_text, default=False, metavar="true|false",
                   help="ordered topic (default false)")

    for name, func, text in (
            ("getBrokerConfig", cmd_get_broker_config, "every setting of one broker (-b) or of each master of a "
                                                       "cluster (-c), under Apache's broker.conf names"),
            ("updateBrokerConfig", cmd_update_broker_config, "change a setting of one broker (-b) or of each master "
                                                             "of a cluster (-c) while it runs; written to its config "
                                                             "file")):
        p = add(name, func, text)
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("-c", "--clusterName", dest="cluster", help="every master broker of this cluster")
        where.add_argument("-b", "--brokerAddr", dest="broker", type=_address, help="this broker (host:port)")
        if name == "updateBrokerConfig":
            p.add_argument("-k", "--key", required=True,
                           help="broker.conf name, e.g. maxTransferCountOnMessageInMemory")
            p.add_argument("-v", "--value", required=True)

    p = add("clusterList", cmd_cluster_list,
            "every registered broker with its version, in/out TPS (queue sizes), page-cache lock wait, hours of "
            "messages kept and commit log disk use")
    p.add_argument("-c", "--clusterName", dest="cluster", default=None, help="only this cluster's brokers")

    p = add("topicList", cmd_topic_list, "every topic the name server knows, one per line")
    p.add_argument("-c", "--clusterModel", dest="cluster_mode", action="store_true",
                   help="a cluster/topic table instead (without retry and DLQ topics)")

    p = add("topicRoute", cmd_topic_route, "the name server's route of a topic as JSON (brokerDatas, queueDatas)")
    p.add_argument("-t", "--topic", required=True)

    p = add("topicStatus", cmd_topic_status, "min/max offset and last update of every queue of a topic")
    p.add_argument("-t", "--topic", required=True)

    p = add("consumerProgress", cmd_consumer_progress,
            "broker offset, consumer offset and diff of every queue a consumer group has offsets for")
    p.add_argument("-g", "--groupName", dest="group", required=True, help="consumer group (listing groups is not "
                                                                           "supported: -g is required)")
    p.add_argument("-t", "--topicName", dest="topic", default=None, help="only this topic")

    p = add("queryConsumeTimeSpan", cmd_query_consume_time_span,
            "per queue of a topic: store times of the first, last and last consumed message of a consumer group, "
            "and how long the next message has waited")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-g", "--group", dest="group", required=True, help="consumer group")

    p = add("brokerStatus", cmd_broker_status, "a broker's runtime statistics (GET_BROKER_RUNTIME_INFO), key: value")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-b", "--brokerAddr", dest="broker", type=_address, help="this broker (host:port)")
    where.add_argument("-c", "--clusterName", dest="cluster", help="every master broker of this cluster")

    p = add("brokerConsumeStats", cmd_broker_consume_stats,
            "every consumer group's progress on one broker, queue by queue, and the total diff")
    p.add_argument("-b", "--brokerAddr", dest="broker", type=_address, required=True, help="broker (host:port)")
    p.add_argument("-t", "--timeoutMillis", dest="timeout_ms", type=_positive, default=50_000,
                   help="request timeout in ms (default 50000)")
    p.add_argument("-l", "--level", type=int, default=0, help="only queues with at least this diff (default 0)")
    p.add_argument("-o", "--order", type=_bool_text, default=False, metavar="true|false",
                   help="only ordered topics (default false)")

    p = add("statsAll", cmd_stats_all,
            "per topic and consumer group: accumulation, in/out TPS of the last minute, messages of the last 24 h")
    p.add_argument("-a", "--activeTopic", dest="active", action="store_true",
                   help="only topics with messages in or out in the last 24 h")
    p.add_argument("-t", "--topic", default=None, help="only this topic")

    p = add("deleteTopic", cmd_delete_topic,
            "delete a topic from every master of a cluster (config, consume queues, consumer offsets) "
            "and from the name servers")
    p.add_argument("-c", "--clusterName", dest="cluster", required=True)
    p.add_argument("-t", "--topic", required=True)

    p = add("deleteSubGroup", cmd_delete_sub_group,
            "delete a consumer group's subscription config from one broker (-b) or every master of a cluster (-c)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-c", "--clusterName", dest="cluster", help="every master broker of this cluster")
    where.add_argument("-b", "--brokerAddr", dest="broker", type=_address, help="this broker (host:port)")
    p.add_argument("-g", "--groupName", dest="group", required=True)
    p.add_argument("-r", "--removeOffset", dest="remove_offset", type=_bool_text, default=False,
                   metavar="true|false", help="also remove the group's consumer offsets (default false)")
    p.add_argument("--deleteRetryAndDlq", dest="retry_dlq", action="store_true",
                   help="with -c: also delete the group's %%RETRY%% and %%DLQ%% topics (not done otherwise)")

    p = add("cloneGroupOffset", cmd_clone_group_offset,
            "copy a group's consumer offsets on a topic to another group, on every master serving the topic")
    p.add_argument("-s", "--srcGroup", dest="src", required=True)
    p.add_argument("-d", "--destGroup", dest="dest", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-o", "--offline", type=_bool_text, default=False, metavar="true|false",
                   help="clone even when the online source group does not subscribe to the topic (default false)")

    add("getNamesrvConfig", cmd_get_namesrv_config, "every name server's settings")

    p = add("updateNamesrvConfig", cmd_update_namesrv_config,
            "change one setting on every name server (refused when unknown or not changeable at runtime)")
    p.add_argument("-k", "--key", required=True)
    p.add_argument("-v", "--value", required=True)

    p = add("consumerConnection", cmd_consumer_connection,
            "the connected clients of a consumer group and what the group subscribes to")
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p.add_argument("-b", "--brokerAddr", dest="broker", type=_address, default=None,
                   help="ask this broker (default: a master serving the group's retry topic)")

    p = add("producerConnection", cmd_producer_connection, "the connected clients of a producer group")
    p.add_argument("-g", "--producerGroup", dest="group", required=True)
    p.add_argument("-t", "--topic", required=True, help="a topic the group sends to (finds the broker)")

    p = add("consumerStatus", cmd_consumer_status,
            "each client's running info (properties, subscriptions, offsets, rates), asked through the broker")
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p.add_argument("-i", "--clientId", dest="client_id", default=None, help="only this client")
    p.add_argument("-s", "--jstack", action="store_true", help="with each client's thread dump")

    p = add("getConsumerStatus", cmd_get_consumer_status,
            "the offsets each client of a consumer group holds in memory for a topic")
    p.add_argument("-g", "--group", dest="group", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-i", "--originClientId", dest="client_id", default=None, help="only this client")

    p = add("resetOffsetByTime", cmd_reset_offset_by_time,
            "move a consumer group's offsets of a topic to a time: online clients are told at once, an offline "
            "group's offsets are committed directly")
    p.add_argument("-g", "--group", dest="group", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-s", "--timestamp", type=_timestamp, required=True,
                   help="now, epoch milliseconds, or yyyy-MM-dd#HH:mm:ss:SSS (UTC); -1 = the end of each queue")
    p.add_argument("-f", "--force", type=_bool_text, default=True, metavar="true|false",
                   help="also move offsets forward (default true)")

    p = add("consumeMessageDirectly", cmd_consume_message_directly,
            "have one client's listener consume one stored message (mqadmin's queryMsgById -g -d)")
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p.add_argument("-d", "--clientId", dest="client_id", required=True)
    p.add_argument("-i", "--msgId", dest="msg_id", required=True, help="the offset message id")
