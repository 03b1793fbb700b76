"""``rocketlake admin``: Apache ``mqadmin``'s topic, consumer-progress and broker-config verbs.

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
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable

from broker.cli import EXIT_FINDINGS, EXIT_OK, _cell, _positive

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


def _perm_text(perm: int) -> str:
    """Java ``PermName.perm2String``: 6 -> ``RW-``."""
    return ("R" if perm & 4 else "-") + ("W" if perm & 2 else "-") + ("X" if perm & 1 else "-")


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
          f"writeQueueNums={args.write_queues}, perm={_perm_text(args.perm)}, topicFilterType=SINGLE_TAG, "
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
    from broker.remoting.transport import RemotingError

    admin = Admin(args.namesrv)
    try:
        return args.admin_func(admin, args)
    except (MQClientError, ProtocolError, RemotingError, OSError, TimeoutError) as exc:
        # ProtocolError: an answer that does not parse; the others: unreachable or refusing peers
        sys.stdout.flush()
        print(f"error: {exc or type(exc).__name__}", file=sys.stderr)
        return EXIT_FINDINGS
    finally:
        admin.close()


# ---- parser ----------------------------------------------------------------------------------------
def add_admin_parser(sub: argparse._SubParsersAction) -> None:
    """``rocketlake admin SUBCOMMAND``: registered by :func:`broker.cli.build_parser`."""
    env_ns = os.environ.get("NAMESRV_ADDR")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namesrvAddr", dest="namesrv", type=_namesrv_list, default=env_ns,
                        required=env_ns is None, metavar="NAMESRV",
                        help="name server address(es), host:port[;host:port] (default: $NAMESRV_ADDR)")

    admin = sub.add_parser("admin", help="mqadmin's topic, consumer-progress and broker-config commands",
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
