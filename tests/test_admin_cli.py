"""``rocketlake admin …`` (mqadmin's verbs) in-process against one real name server and broker."""

from __future__ import annotations

import json
import re
import signal
import time
from collections import Counter
from datetime import datetime, timezone

import pytest

from broker.cli import main
from broker.client import Admin, Message, Producer, PullConsumer
from tests.broker_harness import free_port, start_broker, start_namesrv, stored_messages, wait_until

CLUSTER, BROKER = "DefaultCluster", "broker-a"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("admin_cli")
    ns, ns_addr = start_namesrv(tmp)
    broker = start_broker(tmp / "store", ns_addr, {})
    try:
        yield ns_addr, broker.addr
    finally:
        broker.stop()
        ns.send_signal(signal.SIGTERM)
        ns.wait(10)


@pytest.fixture(autouse=True)
def no_env_namesrv(monkeypatch):
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["admin", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["admin", *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err


def rows(out: str) -> list[list[str]]:
    """Table body split on the two-space column gaps (the header line dropped)."""
    return [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()[1:] if line.strip()]


def create(capsys, ns: str, *where: str, topic: str, queues: int) -> None:
    code, out, err = run(capsys, "updateTopic", "-n", ns, *where, "-t", topic, "-r", str(queues), "-w", str(queues))
    assert (code, err) == (0, "")


def test_update_topic_by_cluster_and_broker(env, capsys):
    ns, addr = env
    code, out, err = run(capsys, "updateTopic", "-n", ns, "-c", CLUSTER, "-t", "AdmByCluster", "-r", "4", "-w", "4")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"create topic to {addr} success.",
        "TopicConfig [topicName=AdmByCluster, readQueueNums=4, writeQueueNums=4, perm=RW-, "
        "topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false]"]
    # updateTopic waited for the route: a producer started right after finds the topic
    with Producer("PG_ADM", ns) as producer:
        assert producer.send(Message("AdmByCluster", b"first")).status.name == "SEND_OK"

    code, out, err = run(capsys, "updateTopic", "-n", ns, "-b", addr, "-t", "AdmByBroker", "-r", "2", "-w", "3",
                         "-p", "6", "-o", "true")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"create topic to {addr} success.",
        "TopicConfig [topicName=AdmByBroker, readQueueNums=2, writeQueueNums=3, perm=RW-, "
        "topicFilterType=SINGLE_TAG, topicSysFlag=0, order=true]"]

    code, out, _ = run(capsys, "topicList", "-n", ns)
    assert code == 0
    topics = out.splitlines()
    assert {"AdmByCluster", "AdmByBroker", "TBW102"} <= set(topics) and topics == sorted(topics)

    code, out, _ = run(capsys, "topicList", "-n", ns, "-c")
    assert code == 0
    assert out.splitlines()[0].split() == ["#Cluster", "Name", "#Topic"]
    assert [CLUSTER, "AdmByBroker"] in rows(out) and [CLUSTER, "AdmByCluster"] in rows(out)

    code, out, _ = run(capsys, "topicRoute", "-n", ns, "-t", "AdmByBroker")
    assert code == 0
    assert json.loads(out) == {
        "brokerDatas": [{"brokerAddrs": {"0": addr}, "brokerName": BROKER, "cluster": CLUSTER}],
        "filterServerTable": {},
        "queueDatas": [{"brokerName": BROKER, "perm": 6, "readQueueNums": 2, "topicSysFlag": 0,
                        "writeQueueNums": 3}]}

    # an update is waited for too: the route has the new counts as soon as the command returns
    create(capsys, ns, "-b", addr, topic="AdmByBroker", queues=5)
    code, out, _ = run(capsys, "topicRoute", "-n", ns, "-t", "AdmByBroker")
    assert [(q["readQueueNums"], q["writeQueueNums"]) for q in json.loads(out)["queueDatas"]] == [(5, 5)]


def test_namesrv_from_environment(env, capsys, monkeypatch):
    ns, _ = env
    monkeypatch.setenv("NAMESRV_ADDR", ns)
    code, out, _ = run(capsys, "topicList")
    assert code == 0 and "TBW102" in out.splitlines()


def _status(capsys, ns: str, topic: str, expected: dict[int, int]) -> list[list[str]]:
    """topicStatus rows once the consume queues hold ``expected`` (they are built just after the append)."""
    deadline = time.monotonic() + 10
    while True:
        code, out, err = run(capsys, "topicStatus", "-n", ns, "-t", topic)
        assert (code, err) == (0, "")
        table = rows(out)
        if {int(r[1]): int(r[3]) for r in table} == expected or time.monotonic() > deadline:
            return table
        time.sleep(0.1)


def test_topic_status_and_consumer_progress(env, capsys):
    ns, _ = env
    create(capsys, ns, "-c", CLUSTER, topic="AdmStats", queues=2)
    with Producer("PG_ADM_STATS", ns) as producer:
        sent = Counter(producer.send(Message("AdmStats", f"m{i}".encode())).queue.queue_id for i in range(5))
    expected = {0: sent[0], 1: sent[1]}
    assert sum(expected.values()) == 5

    before = datetime.now(timezone.utc).replace(microsecond=0)
    table = _status(capsys, ns, "AdmStats", expected)
    assert [r[:4] for r in table] == [[BROKER, "0", "0", str(sent[0])], [BROKER, "1", "0", str(sent[1])]]
    for r in table:  # last updated: the store time of the queue's last message
        stamp = datetime.strptime(r[4], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=timezone.utc)
        assert abs((stamp - before).total_seconds()) < 60

    with PullConsumer("CG_ADM", ns) as consumer:
        q0, q1 = consumer.queues("AdmStats")
        consumer.commit(q0, 1)
        consumer.commit(q1, sent[1])
    header = ["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff", "#LastTime (UTC)"]
    for extra in ([], ["-t", "AdmStats"]):
        code, out, err = run(capsys, "consumerProgress", "-n", ns, "-g", "CG_ADM", *extra)
        assert (code, err) == (0, "")
        lines = out.splitlines()
        assert re.split(r"\s{2,}", lines[0].strip()) == header
        body = [re.split(r"\s{2,}", line.strip()) for line in lines[1:3]]
        assert [r[:6] for r in body] == [
            ["AdmStats", BROKER, "0", str(sent[0]), "1", str(sent[0] - 1)],
            ["AdmStats", BROKER, "1", str(sent[1]), str(sent[1]), "0"]]
        assert lines[3:] == ["", "Consume TPS: 0.00", f"Diff Total: {sent[0] - 1}"]


def test_failures_are_one_line_and_exit_1(env, capsys):
    ns, addr = env
    dead = f"127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "topicList", "-n", dead)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: no name server answered ({dead})") and err.count("\n") == 1

    for command in ("topicRoute", "topicStatus"):
        code, out, err = run(capsys, command, "-n", ns, "-t", "NoSuchTopic")
        assert (code, out, err) == (1, "", f"error: topic 'NoSuchTopic' is not known to the name server {ns}\n")
    code, _, err = run(capsys, "consumerProgress", "-n", ns, "-g", "CG_ADM", "-t", "NoSuchTopic")
    assert (code, err) == (1, f"error: topic 'NoSuchTopic' is not known to the name server {ns}\n")

    code, out, err = run(capsys, "updateTopic", "-n", ns, "-c", "NoSuchCluster", "-t", "X")
    assert (code, out, err) == (
        1, "", f"error: cluster 'NoSuchCluster' is not known to the name server {ns} (known: {CLUSTER})\n")

    # the broker refuses a topic named like its cluster
    code, out, err = run(capsys, "updateTopic", "-n", ns, "-b", addr, "-t", CLUSTER)
    assert (code, out) == (1, "")
    assert err == (f"error: create topic {CLUSTER} on {addr} failed: SYSTEM_ERROR(1) "
                   f"the topic[{CLUSTER}] is conflict with system reserved words.\n")

    code, out, err = run(capsys, "updateTopic", "-n", ns, "-b", dead, "-t", "X")
    assert (code, out) == (1, "")
    assert err.startswith(f"error: create topic X failed: broker {dead} did not answer (cannot connect")

    code, out, err = run(capsys, "consumerProgress", "-n", ns, "-g", "CG_NEVER_COMMITTED")
    assert (code, out, err) == (
        1, "", "error: no consume progress for group 'CG_NEVER_COMMITTED': it has no committed offset on any broker\n")


def test_usage_errors_exit_2(env, capsys):
    ns, addr = env
    assert "the following arguments are required: -g/--groupName" in usage_error(capsys, "consumerProgress", "-n", ns)
    assert "one of the arguments -c/--clusterName -b/--brokerAddr is required" in usage_error(
        capsys, "updateTopic", "-n", ns, "-t", "X")
    assert "not allowed with argument" in usage_error(capsys, "updateTopic", "-n", ns, "-c", CLUSTER, "-b", addr,
                                                      "-t", "X")
    assert "invalid choice: 5" in usage_error(capsys, "updateTopic", "-n", ns, "-c", CLUSTER, "-t", "X", "-p", "5")
    assert "'maybe' is not true or false" in usage_error(capsys, "updateTopic", "-n", ns, "-c", CLUSTER, "-t", "X",
                                                         "-o", "maybe")
    assert "'nohost' has no port" in usage_error(capsys, "topicList", "-n", "nohost")
    assert "the following arguments are required: -n/--namesrvAddr" in usage_error(capsys, "topicList")
    assert "the following arguments are required: -g/--group" in usage_error(capsys, "queryConsumeTimeSpan", "-n", ns,
                                                                            "-t", "X")
    for sub in ("updateTopic", "topicList", "topicRoute", "topicStatus", "consumerProgress", "clusterList",
                "queryConsumeTimeSpan"):
        with pytest.raises(SystemExit) as exc:
            main(["admin", sub, "--help"])
        assert exc.value.code == 0 and f"rocketlake admin {sub}" in capsys.readouterr().out


def test_get_and_update_broker_config(env, capsys):
    ns, addr = env
    code, out, err = run(capsys, "getBrokerConfig", "-n", ns, "-b", addr)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"============{addr}============"
    values = dict(re.split(r"=  ", line, maxsplit=1) for line in lines[1:])
    values = {k.rstrip(): v for k, v in values.items()}
    assert values["brokerName"] == BROKER and values["listenPort"] == addr.rsplit(":", 1)[1]
    assert f"{'clientChannelMaxIdleTimeSeconds':<50}=  120" in lines
    # the same value back: nothing changes for the other tests of this broker
    code, out, err = run(capsys, "updateBrokerConfig", "-n", ns, "-c", CLUSTER, "-k", "clientChannelMaxIdleTimeSeconds",
                         "-v", "120")
    assert (code, out, err) == (0, f"update broker config success, {addr}\n", "")
    code, out, err = run(capsys, "updateBrokerConfig", "-n", ns, "-b", addr, "-k", "brokerName", "-v", "x")
    assert (code, out) == (1, "")
    assert err.startswith(f"error: update broker config brokerName on {addr} failed: NO_PERMISSION(16) brokerName "
                          "can not be changed while the broker runs")


def _utc_text(ms: int) -> str:
    """Apache's timeMillisToHumanString2 layout, in UTC."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_cluster_list(env, capsys):
    ns, addr = env
    create(capsys, ns, "-b", addr, topic="AdmClusterList", queues=1)
    with Producer("PG_ADM_CLUSTER", ns) as producer:  # a stored message: the Hour column has a start
        assert producer.send(Message("AdmClusterList", b"x")).status.name == "SEND_OK"
    header = ["#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS(LOAD)", "#OutTPS(LOAD)",
              "#PCWait(ms)", "#Hour", "#SPACE"]

    def load(info: dict[str, str], rates: str, queue: str) -> str:
        first = info[rates].split(" ")[0]
        return f"{float(first):.2f}({info[queue]})" if first else f"N/A({info[queue]})"

    for extra in ([], ["-c", CLUSTER]):
        with Admin(ns) as admin:
            before_info, before = admin.broker_runtime_info(addr), _now_ms()
            code, out, err = run(capsys, "clusterList", "-n", ns, *extra)
            after, after_info = _now_ms(), admin.broker_runtime_info(addr)
        assert (code, err) == (0, "")
        assert re.split(r"\s{2,}", out.splitlines()[0].strip()) == header
        (row,) = rows(out)
        earliest = int(before_info["earliestMessageTimeStamp"])
        assert earliest > 0 and after_info["earliestMessageTimeStamp"] == str(earliest)
        assert row[:5] == [CLUSTER, BROKER, "0", addr, "V4_9_8"]
        infos = (before_info, after_info)
        assert row[5] in {load(i, "putTps", "sendThreadPoolQueueSize") for i in infos}
        assert row[6] in {load(i, "getTransferedTps", "pullThreadPoolQueueSize") for i in infos}
        assert row[7] == "0"  # pageCacheLockTimeMills: no page-cache lock here
        assert row[8] in {f"{(t - earliest) / 3_600_000:.2f}" for t in (before, after)}
        assert row[9] in {f"{float(i['commitLogDiskRatio']):.4f}" for i in infos}

    code, out, err = run(capsys, "clusterList", "-n", ns, "-c", "NoSuchCluster")
    assert (code, out, err) == (
        1, "", f"error: cluster 'NoSuchCluster' is not known to the name server {ns} (known: {CLUSTER})\n")


def test_query_consume_time_span(env, capsys):
    ns, addr = env
    create(capsys, ns, "-c", CLUSTER, topic="AdmSpan", queues=3)
    with Producer("PG_ADM_SPAN", ns) as producer:  # 3 messages in queue 0, 2 in queue 1, queue 2 empty
        for qid in (0, 1, 0, 1, 0):
            assert producer.send_orderly(Message("AdmSpan", b"m"), qid).queue.queue_id == qid
    with Admin(ns) as admin:
        wait_until(lambda: stored_messages(admin, addr, "AdmSpan") == 5, "the 5 sends to be dispatched")
    with PullConsumer("CG_ADM_SPAN", ns) as consumer:
        q0, q1, q2 = consumer.queues("AdmSpan")
        stored = {mq.queue_id: [m.store_timestamp for m in consumer.pull(mq, 0).messages] for mq in (q0, q1)}
        assert [len(stored[0]), len(stored[1])] == [3, 2]
        consumer.commit(q0, 1)  # one consumed: the second has waited since it was stored
        consumer.commit(q1, 2)  # caught up
    t0, t1 = stored[0], stored[1]

    before = _now_ms()
    code, out, err = run(capsys, "queryConsumeTimeSpan", "-n", ns, "-t", "AdmSpan", "-g", "CG_ADM_SPAN")
    after = _now_ms()
    assert (code, err) == (0, "")
    assert re.split(r"\s{2,}", out.splitlines()[0].strip()) == [
        "#Broker Name", "#QID", "#MinTime (UTC)", "#MaxTime (UTC)", "#ConsumeTime (UTC)", "#DelayTime(ms)"]
    table = rows(out)
    assert [r[:5] for r in table] == [
        [BROKER, "0", _utc_text(t0[0]), _utc_text(t0[2]), _utc_text(t0[0])],
        [BROKER, "1", _utc_text(t1[0]), _utc_text(t1[1]), _utc_text(t1[1])],
        [BROKER, "2", "N/A", "N/A", "N/A"]]
    assert before - t0[1] <= int(table[0][5]) <= after - t0[1]
    assert [r[5] for r in table[1:]] == ["0", "N/A"]


def test_query_consume_time_span_user_errors(env, capsys):
    ns, _ = env
    code, out, err = run(capsys, "queryConsumeTimeSpan", "-n", ns, "-t", "NoSuchTopic", "-g", "CG_ADM")
    assert (code, out, err) == (1, "", f"error: topic 'NoSuchTopic' is not known to the name server {ns}\n")
    create(capsys, ns, "-c", CLUSTER, topic="AdmSpanNobody", queues=1)
    code, out, err = run(capsys, "queryConsumeTimeSpan", "-n", ns, "-t", "AdmSpanNobody", "-g", "CG_NOBODY")
    assert (code, out) == (1, "")
    assert err == ("error: consumer group 'CG_NOBODY' does not consume topic 'AdmSpanNobody': no online consumer "
                   "of it subscribes to the topic and it has no committed offset on it\n")
