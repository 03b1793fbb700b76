"""Master/slave replication (Apache 4.x HA): the wire format, and real master + slave brokers on loopback.

The frame tests compare against bytes written out here by hand. The broker tests start a name server,
a master and a slave (each its own store) and check what ends up on the slave's disk: the same
commitlog bytes as the master's, the same consume queue units, every message readable from the slave,
SYNC_MASTER acknowledgements only for replicated messages, and a slave that refuses sends.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

from broker.client import Message, Producer, PullConsumer
from broker.client.producer import SendStatus
from broker.engine.ha_frames import (
    HAFrameError,
    OffsetReportReader,
    Transfer,
    TransferReader,
    encode_heartbeat,
    encode_offset_report,
    encode_transfer,
)
from broker.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.headers import RegisterBrokerRequestHeader, RegisterBrokerResponseHeader
from broker.remoting.transport import SyncRemotingClient
from broker.store.commitlog import CommitLog
from broker.store.constants import PROPERTY_UNIQ_KEY
from broker.store.message import decode_record
from broker.store.record_layout import POS_PHYSICAL_OFFSET
from broker.store.verify import verify_store
from tests.broker_harness import drain, free_port, start_broker, start_namesrv, wait_until
from tests.cpp_client import ClientProcesses, create_routed_topic, max_offset

SEGMENT = 64 * 1024  # small commitlog files: the tests roll over several
BASE = {"mappedFileSizeCommitLog": SEGMENT, "mappedFileSizeConsumeQueue": 600, "flushIntervalConsumeQueue": 200}


# ---- frames -----------------------------------------------------------------------------------------
def test_offset_report_bytes() -> None:
    assert encode_offset_report(0x0102030405060708) == bytes([1, 2, 3, 4, 5, 6, 7, 8])
    assert encode_offset_report(0) == b"\0" * 8
    with pytest.raises(HAFrameError):
        encode_offset_report(-1)


def test_transfer_and_heartbeat_bytes() -> None:
    assert encode_transfer(65536, b"abc") == b"\0\0\0\0\0\x01\0\0" + b"\0\0\0\x03" + b"abc"
    assert encode_heartbeat(7) == b"\0\0\0\0\0\0\0\x07" + b"\0\0\0\0"


def test_offset_reports_keep_the_last_complete_one() -> None:
    r = OffsetReportReader()
    assert r.feed(b"\0\0\0\0") is None  # half a report
    assert r.feed(b"\0\0\0\x05" + b"\0\0\0\0\0\0\0\x09" + b"\0\0") == 9  # two completed: the newest counts
    assert r.feed(b"\0\0\0\0\0\x01") == 1  # the rest of the third


def test_transfer_reader_cuts_the_stream() -> None:
    wire = (b"\0\0\0\0\0\0\0\x10" b"\0\0\0\x02" b"hi") + (b"\0\0\0\0\0\0\0\x12" b"\0\0\0\0")
    r = TransferReader(max_body=100)
    assert r.feed(wire[:5]) == []
    assert r.feed(wire[5:15]) == [Transfer(16, b"hi")]
    got = r.feed(wire[15:])
    assert got == [Transfer(18, b"")] and got[0].is_heartbeat and r.buffered == 0


def test_transfer_reader_refuses_a_corrupt_header() -> None:
    with pytest.raises(HAFrameError, match="size 101"):
        TransferReader(max_body=100).feed(b"\0" * 8 + b"\0\0\0\x65")
    with pytest.raises(HAFrameError, match="offset -1"):
        TransferReader(max_body=100).feed(b"\xff" * 8 + b"\0\0\0\0")


# ---- brokers ----------------------------------------------------------------------------------------
@pytest.fixture()
def namesrv(tmp_path: Path):
    proc, addr = start_namesrv(tmp_path)
    yield addr
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


def start_master(tmp: Path, ns: str, role: str = "ASYNC_MASTER", **extra):
    ha_port = free_port()
    broker = start_broker(tmp / "master", ns, {**BASE, "brokerRole": role, "haListenPort": ha_port, **extra},
                          processes=1)
    broker.ha_addr = f"127.0.0.1:{ha_port}"
    return broker


def start_slave(tmp: Path, ns: str, master_ha: str | None, **extra):
    cfg = {**BASE, "brokerRole": "SLAVE", "brokerId": 1, **extra}
    if master_ha:
        cfg["haMasterAddress"] = master_ha
    return start_broker(tmp / "slave", ns, cfg, processes=1)


def request(addr: str, code: int, ext: dict, body: bytes = b"") -> RemotingCommand:
    with SyncRemotingClient(addr) as client:
        return client.invoke(RemotingCommand.request(code, ext, body), timeout=10)


def files_of(store: Path, sub: str) -> dict[str, bytes]:
    root = store / sub
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def wait_replicated(master, slave) -> None:
    """Until the slave's commitlog and consume queue files equal the master's, byte for byte."""
    wait_until(lambda: files_of(slave.store, "commitlog") == files_of(master.store, "commitlog"),
               "the slave's commitlog to equal the master's")
    wait_until(lambda: files_of(slave.store, "consumequeue") == files_of(master.store, "consumequeue"),
               "the slave's consume queues to equal the master's")


def uniq_keys(store: Path) -> Counter:
    return Counter(r.properties.get(PROPERTY_UNIQ_KEY) for r in CommitLog.open(store).iter_records())


def send_to(addr: str, topic: str, body: bytes, wait: str = "true", props: str = "") -> RemotingCommand:
    props += f"WAIT\x01{wait}\x02UNIQ_KEY\x01{body.hex()}\x02"
    ext = {"producerGroup": "g", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
           "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0", "properties": props,
           "reconsumeTimes": "0", "unitMode": "false", "batch": "false"}
    return request(addr, RequestCode.SEND_MESSAGE, ext, body)


def split_bodies(body: bytes) -> list[bytes]:
    """Records back to back (a PULL_MESSAGE or QUERY_MESSAGE body), one bytes each."""
    out, pos = [], 0
    while pos < len(body):
        size = int.from_bytes(body[pos:pos + 4], "big")
        out.append(body[pos:pos + size])
        pos += size
    return out


def pull_all(addr: str, topic: str, queues: int) -> list[bytes]:
    """Every stored record of ``topic`` pulled from one broker (PULL_MESSAGE from offset 0, queue by
    queue), as the bytes the broker answered."""
    out: list[bytes] = []
    with SyncRemotingClient(addr) as client:
        for qid in range(queues):
            offset = 0
            while True:
                ext = {"consumerGroup": "ha-reader", "topic": topic, "queueId": qid, "queueOffset": offset,
                       "maxMsgNums": 32, "sysFlag": int(PullSysFlag.SUBSCRIPTION), "commitOffset": 0, "suspendTimeoutMillis": 0,
                       "subscription": "*", "subVersion": 0}
                resp = client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, ext), timeout=10)
                if resp.code != ResponseCode.SUCCESS:
                    break
                out += split_bodies(resp.body)
                offset = int(resp.ext_fields["nextBeginOffset"])
    return out


def test_slave_replicates_byte_for_byte_and_serves_reads(tmp_path: Path, namesrv: str) -> None:
    master = start_master(tmp_path, namesrv)
    topic = "HaTopic"
    create_routed_topic(master.addr, namesrv, topic, 4)  # before the slave starts: it copies the topic at once
    slave = start_slave(tmp_path, namesrv, master.ha_addr)
    clients = ClientProcesses(tmp_path)
    try:
        producer = Producer("ha-producer", namesrv).start()
        try:
            sent = [producer.send(Message(topic, f"py-{i}-".encode() * 40, tags="T", keys=f"k{i}"))
                    for i in range(400)]  # about 3 commitlog files of 64 KiB
        finally:
            producer.shutdown()
        assert {r.status for r in sent} == {SendStatus.SEND_OK}
        spec = tmp_path / "cpp.json"
        spec.write_text(json.dumps({"topic": topic, "messages": [
            {"seq": f"c{i}", "mode": "sync", "props": {"seq": f"c{i}"}, "body": f"cpp-{i}"} for i in range(50)]}))
        cpp = clients.client("cpp-producer", ["produce.py", namesrv, "ha-cpp-producer", str(spec)], timeout=90).result()
        assert not cpp["errors"] and len(cpp["results"]) == 50

        wait_replicated(master, slave)
        assert len(list((slave.store / "commitlog").iterdir())) >= 3
        keys = uniq_keys(slave.store)
        assert sum(keys.values()) == 450 and set(keys.values()) == {1}

        # the slave serves reads: its max offsets and every pulled byte are the master's
        for qid in range(4):
            ext = {"topic": topic, "queueId": qid}
            assert request(slave.addr, RequestCode.GET_MAX_OFFSET, ext).ext_fields["offset"] == \
                request(master.addr, RequestCode.GET_MAX_OFFSET, ext).ext_fields["offset"]
        from_slave = pull_all(slave.addr, topic, 4)
        assert len(from_slave) == 450 and from_slave == pull_all(master.addr, topic, 4)
        # ... and finds messages by key through the index its own dispatcher built
        query = {"topic": topic, "key": "k123", "maxNum": 32, "beginTimestamp": 0, "endTimestamp": 1 << 62}
        wait_until(lambda: request(slave.addr, RequestCode.QUERY_MESSAGE, query).code == ResponseCode.SUCCESS,
                   "the slave's index to find key k123")
        found = request(slave.addr, RequestCode.QUERY_MESSAGE, query)
        assert found.body == request(master.addr, RequestCode.QUERY_MESSAGE, query).body
        (record,) = [decode_record(r, 0, int.from_bytes(r[POS_PHYSICAL_OFFSET:POS_PHYSICAL_OFFSET + 8], "big"))
                     for r in split_bodies(found.body)]
        assert record.body == b"py-123-" * 40 and record.keys == ["k123"]

        # the slave refuses sends, with Apache's code and remark
        refused = send_to(slave.addr, topic, b"to-the-slave")
        assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert refused.remark.startswith("service not available now. It may be caused by one of the following "
                                         "reasons: the broker's disk is full [CL: ")
        assert refused.remark.endswith("messages are put to the slave, message store has been shut down, etc.")

        # with the master gone, Apache's C++ consumer finds the slave in the route and reads everything there
        assert master.stop() == 0
        pulled = clients.client("cpp-pull", ["pull_consume.py", namesrv, "ha-pull", topic, "*", "--unique", "50",
                                             "--props", "seq"], timeout=120).result()
        assert {d["props"].get("seq") for d in pulled["deliveries"]} >= {f"c{i}" for i in range(50)}
        consumer = PullConsumer("ha-py-pull", namesrv).start()  # and so does ours
        try:
            got = drain(consumer, topic)
        finally:
            consumer.shutdown()
        assert len(got) == 450 and len({m.properties[PROPERTY_UNIQ_KEY] for m in got}) == 450
        assert slave.stop() == 0
        report = verify_store(slave.store, segment_size=SEGMENT)  # CQ and index agree with the commitlog
        assert report.findings == [], report.summary()
    finally:
        clients.kill_all()
        slave.stop()
        master.stop()


def all_of(addr: str, code: int) -> dict:
    resp = request(addr, code, {})
    assert resp.code == ResponseCode.SUCCESS, resp
    return json.loads(resp.body)


def test_slave_found_through_the_name_server_replicates_and_copies_metadata(tmp_path: Path, namesrv: str) -> None:
    master = start_master(tmp_path, namesrv)
    topic = "HaRouted"
    create_routed_topic(master.addr, namesrv, topic, 2)
    # metadata a slave copies (SlaveSynchronize): a subscription group, a consumer offset, a delay offset
    group = {"groupName": "HaGroup", "consumeEnable": True, "retryMaxTimes": 5, "retryQueueNums": 1}
    assert request(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                   json.dumps(group).encode()).code == ResponseCode.SUCCESS
    assert request(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                   {"consumerGroup": "HaGroup", "topic": topic, "queueId": 1, "commitOffset": 7}).code == 0
    delayed = send_to(master.addr, topic, b"later", props="DELAY\x011\x02")
    assert delayed.code == ResponseCode.SUCCESS
    wait_until(lambda: all_of(master.addr, RequestCode.GET_ALL_DELAY_OFFSET)["offsetTable"].get("1") == 1,
               "the master's schedule service to deliver the delayed message")
    slave = start_slave(tmp_path, namesrv, None)  # learns both master addresses from its registration result
    try:
        wait_until(lambda: f"{topic}@HaGroup" in all_of(slave.addr, RequestCode.GET_ALL_CONSUMER_OFFSET)["offsetTable"],
                   "the slave to copy the master's consumer offsets")
        for code in (RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                     RequestCode.GET_ALL_CONSUMER_OFFSET, RequestCode.GET_ALL_DELAY_OFFSET):
            assert all_of(slave.addr, code) == all_of(master.addr, code)
        assert all_of(slave.addr, RequestCode.GET_ALL_CONSUMER_OFFSET)["offsetTable"][f"{topic}@HaGroup"] == {"1": 7}
        assert "HaGroup" in all_of(slave.addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)["subscriptionGroupTable"]

        def route_has_both():
            resp = request(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            brokers = json.loads(resp.body)["brokerDatas"] if resp.code == ResponseCode.SUCCESS else []
            return any(b["brokerAddrs"] == {"0": master.addr, "1": slave.addr} for b in brokers)

        wait_until(route_has_both, "the route to list master (id 0) and slave (id 1)")
        ext = RegisterBrokerRequestHeader(broker_name="broker-a", broker_addr="127.0.0.1:1", cluster_name="DefaultCluster",
                                          ha_server_addr="127.0.0.1:2", broker_id=2).to_ext()
        result = RegisterBrokerResponseHeader.from_ext(request(namesrv, RequestCode.REGISTER_BROKER, ext).ext_fields)
        assert (result.master_addr, result.ha_server_addr) == (master.addr, master.ha_addr)

        producer = Producer("ha-producer", namesrv).start()
        try:
            for i in range(20):
                producer.send(Message(topic, f"m{i}".encode()))
        finally:
            producer.shutdown()
        wait_replicated(master, slave)
    finally:
        slave.stop()
        master.stop()


def test_sync_master_acknowledges_only_replicated_messages(tmp_path: Path, namesrv: str) -> None:
    master = start_master(tmp_path, namesrv, "SYNC_MASTER", syncFlushTimeout=1500)
    slave = start_slave(tmp_path, namesrv, master.ha_addr)
    try:
        topic = "HaSync"
        create_routed_topic(master.addr, namesrv, topic, 1)
        wait_until(lambda: send_to(master.addr, topic, b"first").code == ResponseCode.SUCCESS,
                   "a SYNC_MASTER send acknowledged once the slave is connected")
        for i in range(30):
            resp = send_to(master.addr, topic, f"sync-{i}".encode())
            assert resp.code == ResponseCode.SUCCESS
            # acknowledged means the slave holds it: its commitlog already has the record's UNIQ_KEY
            assert uniq_keys(slave.store)[f"sync-{i}".encode().hex()] == 1
        not_waiting = send_to(master.addr, topic, b"no-wait", wait="false")
        assert not_waiting.code == ResponseCode.SUCCESS

        slave.kill()
        codes = set()
        wait_until(lambda: codes.add(send_to(master.addr, topic, b"alone").code) or
                   ResponseCode.SLAVE_NOT_AVAILABLE in codes, "SLAVE_NOT_AVAILABLE once the slave is gone")
        assert codes <= {ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.FLUSH_SLAVE_TIMEOUT}
        assert send_to(master.addr, topic, b"no-wait-alone", wait="false").code == ResponseCode.SUCCESS
    finally:
        slave.stop()
        master.stop()


def test_sync_master_killed_in_rounds_loses_no_acknowledged_message(tmp_path: Path, namesrv: str) -> None:
    """Apache's C++ producers send (sync) to a SYNC_MASTER that is ``kill -9``ed at a random moment of
    each of three rounds and restarted on its store, except in the last round, where its store directory
    is deleted too (a lost disk). Every message the C++ client was told SEND_OK for is in the slave's
    store, its acknowledged copy exactly once (the one with the UNIQ_KEY and queue offset of the
    answer), and Apache's C++ consumer, finding only the slave in the route, reads them all. A send
    whose answer the kill cut off is sent again by the client after its timeout, with a new UNIQ_KEY
    (at least once, as against Apache): that earlier, unacknowledged copy may be on the slave too,
    before the acknowledged one."""
    import random

    rng = random.Random(1604)
    master = start_master(tmp_path, namesrv, "SYNC_MASTER")
    ha_port = int(master.ha_addr.rpartition(":")[2])
    slave = start_slave(tmp_path, namesrv, master.ha_addr)
    topic, queues = "HaKillRounds", 4
    clients = ClientProcesses(tmp_path)
    acked: list[str] = []
    try:
        create_routed_topic(master.addr, namesrv, topic, queues)
        wait_until(lambda: send_to(master.addr, topic, b"warm").code == ResponseCode.SUCCESS, "a replicated send")
        for rnd in range(3):
            stop_file = tmp_path / f"stop-{rnd}"
            procs = []
            for p in range(2):
                spec = tmp_path / f"round-{rnd}-{p}.json"
                spec.write_text(json.dumps({"topic": topic, "messages": [
                    {"seq": f"r{rnd}-p{p}-{i}", "mode": "sync", "props": {"seq": f"r{rnd}-p{p}-{i}"},
                     "body": f"round {rnd} producer {p} message {i}"} for i in range(400)]}))
                procs.append(clients.client(f"producer-{rnd}-{p}", ["produce.py", namesrv, f"ha-kill-{p}", str(spec),
                                                                      "--stop-file", str(stop_file)], timeout=240))
            before = sum(max_offset(master.addr, topic, q) for q in range(queues))
            kill_after = rng.randint(60, 500)
            wait_until(lambda: sum(max_offset(master.addr, topic, q) for q in range(queues)) - before >= kill_after,
                       f"round {rnd}: {kill_after} messages stored before the kill")
            master.kill()
            down = rng.uniform(0.3, 1.5)
            if rnd == 2:  # the lost disk: the master never comes back
                shutil.rmtree(master.store)
                stop_file.touch()
            else:
                threading.Event().wait(down)
                master = start_broker(master.store, namesrv, {**BASE, "brokerRole": "SYNC_MASTER",
                                                             "haListenPort": ha_port}, port=master.port, processes=1)
                master.ha_addr = f"127.0.0.1:{ha_port}"
            for proc in procs:
                out = proc.result()
                acked += [(r["seqs"][0], r["msg_id"], r["offset"]) for r in out["results"] if r["status"] == 0]
        assert len(acked) >= 600  # each round acknowledged some before and (but the last) after its kill

        copies: dict[str, list] = {}
        for r in CommitLog.open(slave.store, SEGMENT).iter_records():
            if r.topic == topic:
                copies.setdefault(r.properties.get("seq"), []).append(r)
        for seq, uniq_key, queue_offset in acked:
            held = copies.get(seq, [])
            answered = [r for r in held if (r.properties.get(PROPERTY_UNIQ_KEY), r.queue_offset) == (uniq_key, queue_offset)]
            assert len(answered) == 1, (seq, [(r.physical_offset, r.queue_offset) for r in held])
            # any other copy is an earlier attempt whose answer the kill cut off (the C++ client resends
            # after its timeout, with a new UNIQ_KEY), never a second copy of the acknowledged one
            assert all(r.physical_offset < answered[0].physical_offset for r in held if r is not answered[0]), \
                (seq, [(r.physical_offset, r.store_timestamp) for r in held])
        pulled = clients.client("cpp-pull-slave", ["pull_consume.py", namesrv, "ha-kill-reader", topic, "*",
                                                   "--unique", str(len(copies)), "--props", "seq", "--timeout", "150"],
                                timeout=180).result()
        assert {d["props"].get("seq") for d in pulled["deliveries"]} >= {seq for seq, _, _ in acked}
        assert slave.stop() == 0
        assert verify_store(slave.store, segment_size=SEGMENT).findings == []
    finally:
        clients.kill_all()
        slave.stop()
        master.stop()


def test_slave_ahead_of_its_master_is_cut_back(tmp_path: Path, namesrv: str) -> None:
    """The master loses its tail (here: it comes back on a copy of its store taken earlier); the slave,
    which holds more, keeps it by default (it may be the only copy of acknowledged messages) and does
    not follow; with haSlaveCutBackToMaster it cuts its log back to the master's end when it starts,
    then follows again."""
    master = start_master(tmp_path, namesrv)
    ha_port = int(master.ha_addr.rpartition(":")[2])
    slave = start_slave(tmp_path, namesrv, master.ha_addr)
    topic = "HaAhead"
    try:
        create_routed_topic(master.addr, namesrv, topic, 2)
        for i in range(40):
            assert send_to(master.addr, topic, f"first-{i}".encode()).code == ResponseCode.SUCCESS
        wait_replicated(master, slave)
        assert master.stop() == 0
        shutil.copytree(master.store, tmp_path / "earlier")
        master = start_broker(master.store, namesrv, {**BASE, "haListenPort": ha_port}, port=master.port,
                              processes=1)
        for i in range(40):
            assert send_to(master.addr, topic, f"second-{i}".encode()).code == ResponseCode.SUCCESS
        wait_replicated(master, slave)
        assert master.stop() == 0

        earlier = start_broker(tmp_path / "earlier", namesrv, {**BASE, "haListenPort": ha_port}, port=master.port,
                              processes=1)
        earlier.ha_addr = f"127.0.0.1:{ha_port}"
        master = earlier
        # the running slave is told where the master's log ends and says it needs a restart
        wait_until(lambda: "restart the slave to cut its log back" in slave.log.read_text(),
                   "the running slave to find its master behind it")
        assert slave.stop() == 0
        held = uniq_keys(slave.store)
        slave = start_slave(tmp_path, namesrv, master.ha_addr)  # by default nothing is cut
        wait_until(lambda: "are held by this slave only; it keeps them and does not follow" in slave.log.read_text(),
                   "the restarted slave to refuse to cut")
        assert slave.stop() == 0
        assert uniq_keys(slave.store) == held and sum(held.values()) == 80
        slave = start_slave(tmp_path, namesrv, master.ha_addr, haSlaveCutBackToMaster=True)
        for i in range(10):
            assert send_to(master.addr, topic, f"third-{i}".encode()).code == ResponseCode.SUCCESS
        wait_replicated(master, slave)
        keys = uniq_keys(slave.store)
        assert sum(keys.values()) == 50 and not any(k.startswith(b"second".hex()) for k in keys)
    finally:
        slave.stop()
        master.stop()


# ---- the store's replica append (no network) ------------------------------------------------------------
def _store_pair(tmp_path: Path):
    from broker.engine import MessageStore, StoreSettings
    from tests.store_harness import DispatchedStore

    s = StoreSettings(segment_bytes=8 * 1024, cq_file_bytes=20 * 16, index_slots=64, index_entries=256,
                      fsync_metadata=False)
    master, slave = MessageStore(tmp_path / "m", s), DispatchedStore(tmp_path / "s", s)
    master.open()
    slave.open()
    slave.slave_mode = True
    return master, slave


def _put(store, n: int, start: int = 0) -> None:
    from broker.store.message import MessageRecord
    from broker.store.properties import encode_properties

    for i in range(start, start + n):
        rec = MessageRecord(topic="Rep", body=f"body-{i}".encode() * 20, queue_id=i % 2,
                            properties_raw=encode_properties({"UNIQ_KEY": f"u{i}", "KEYS": f"k{i}"}))
        assert store.put_message(rec).ok


def _copy(master, slave, batch: int) -> None:
    """What the HA link does: the master's committed bytes from the slave's end, ``batch`` at a time."""
    while True:
        data = master.read_committed(slave.replica_end, batch)
        if not data:
            return
        slave.append_replica(slave.replica_end, data)


def test_replica_append_is_byte_exact_and_publishes_only_whole_records(tmp_path: Path) -> None:
    from broker.engine import GetStatus, MessageStore, PutStatus
    from broker.engine.message_store import ReplicaError

    master, slave = _store_pair(tmp_path)
    try:
        _put(master, 60)  # about 3 files of 8 KiB
        first = master.read_committed(0, 100)  # ends inside the first record
        slave.append_replica(0, first)
        assert (slave.replica_end, slave.commitlog_max_offset) == (100, 0)  # received, not yet readable
        _copy(master, slave, 777)  # batches that cut records and reach file ends
        assert slave.replica_end == slave.commitlog_max_offset == master.commitlog_max_offset
        with pytest.raises(ReplicaError, match="ends at"):
            slave.append_replica(5, b"x")
        slave.caught_up()
        for qid in (0, 1):
            m, s = master.get_messages("Rep", qid, 0, 64), slave.get_messages("Rep", qid, 0, 64)
            assert m.status is s.status is GetStatus.FOUND and (m.body, m.queue_offsets) == (s.body, s.queue_offsets)
        assert slave.put_message(master.view_message(0)).status is PutStatus.SERVICE_NOT_AVAILABLE
    finally:
        master.close()
        slave.close()
    assert files_of(tmp_path / "s", "commitlog") == files_of(tmp_path / "m", "commitlog")
    assert files_of(tmp_path / "s", "consumequeue") == files_of(tmp_path / "m", "consumequeue")
    reopened = MessageStore(tmp_path / "s", master.settings)
    reopened.open()
    try:
        assert reopened.commitlog_max_offset == master.commitlog_max_offset
    finally:
        reopened.close()


def test_an_empty_slave_starts_at_the_file_the_master_streams_first(tmp_path: Path) -> None:
    master, slave = _store_pair(tmp_path)
    try:
        _put(master, 60)
        end = master.commitlog_max_offset
        start = end - end % master.settings.segment_bytes  # an empty slave gets the newest file only
        assert start > 0
        slave.append_replica(start, master.read_committed(start, 1 << 20))
        _put(master, 10, 60)
        _copy(master, slave, 1 << 20)
        assert slave.commitlog_min_offset == start
        assert slave.commitlog_max_offset == master.commitlog_max_offset
        slave.caught_up()
        queued = sum(slave.max_offset("Rep", q) - slave.min_offset("Rep", q) for q in (0, 1))
        keys = Counter(r.properties["UNIQ_KEY"] for r in CommitLog.open(tmp_path / "s").iter_records())
        assert queued == sum(keys.values()) and keys["u69"] == 1 and "u0" not in keys
    finally:
        master.close()
        slave.close()
    from tests.store_harness import DispatchedStore

    reopened = DispatchedStore(tmp_path / "s", master.settings)  # a log that starts past 0 opens as it was
    reopened.open()
    try:
        reopened.caught_up()
        assert (reopened.commitlog_min_offset, reopened.commitlog_max_offset) == (start, master.commitlog_max_offset)
        assert sum(reopened.max_offset("Rep", q) - reopened.min_offset("Rep", q) for q in (0, 1)) == queued
    finally:
        reopened.close()


# ---- each end of the link against bytes written here ----------------------------------------------------
def _recv_exactly(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"connection closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def test_master_streams_its_files_to_a_slave_speaking_raw_bytes(tmp_path: Path) -> None:
    import socket

    from broker.engine import PutStatus
    from broker.engine.ha_master import HAMaster

    master, slave_store = _store_pair(tmp_path)
    slave_store.close()
    seg = master.settings.segment_bytes
    ha = HAMaster(master, "127.0.0.1", free_port(), batch_bytes=1000, heartbeat_ms=100, housekeeping_ms=20_000,
                  fallbehind_max=1 << 30, sync_timeout_ms=300)
    try:
        _put(master, 60)
        end = master.commitlog_max_offset
        assert end > seg  # two files: the first full
        ha.start()
        files = files_of(tmp_path / "m", "commitlog")
        log_bytes = b"".join(files[name] for name in sorted(files))[:end]
        with socket.create_connection(("127.0.0.1", ha.port)) as sock:
            sock.sendall(b"\0\0\0\0\0\0\0\0")  # an empty slave reports offset 0
            pos = end - end % seg  # ... and is sent the newest file, from its first byte
            while pos < end:
                header = _recv_exactly(sock, 12)
                offset, size = int.from_bytes(header[:8], "big"), int.from_bytes(header[8:], "big")
                assert offset == pos and 0 < size <= 1000 and offset // seg == (offset + size - 1) // seg
                assert _recv_exactly(sock, size) == log_bytes[offset:offset + size]
                pos += size
            assert _recv_exactly(sock, 12) == end.to_bytes(8, "big") + b"\0\0\0\0"  # idle: a heartbeat
            assert ha.replica_status(end) is PutStatus.FLUSH_SLAVE_TIMEOUT  # connected, not acknowledged
            sock.sendall((end - 7).to_bytes(8, "big") + end.to_bytes(8, "big")[:3])  # one report and a part
            sock.sendall(end.to_bytes(8, "big")[3:])
            wait_until(lambda: ha.push2slave == end, "the master to take the last complete report")
            assert ha.replica_status(end) is PutStatus.PUT_OK
        wait_until(lambda: ha.connection_count == 0, "the master to drop the closed link")
        assert ha.replica_status(end) is PutStatus.SLAVE_NOT_AVAILABLE
        with socket.create_connection(("127.0.0.1", ha.port)) as sock:  # a slave that holds 300 bytes
            sock.sendall((300).to_bytes(8, "big"))
            assert _recv_exactly(sock, 12) == (300).to_bytes(8, "big") + (1000).to_bytes(4, "big")  # a batch
            assert _recv_exactly(sock, 1000) == log_bytes[300:1300]
    finally:
        ha.stop()
        master.close()


def test_master_stop_wakes_its_accept_at_once(tmp_path: Path, monkeypatch) -> None:
    """HAMaster.stop shuts the listening socket down, which wakes the blocked accept: with the accept's
    poll made longer than stop's join, the thread is still gone when stop returns (closing alone left
    it blocked, and every broker stop waited up to a second for it)."""
    from broker.engine import ha_master

    master, slave_store = _store_pair(tmp_path)
    slave_store.close()
    monkeypatch.setattr(ha_master, "POLL_S", 600.0)
    ha = ha_master.HAMaster(master, "127.0.0.1", free_port(), batch_bytes=1000, heartbeat_ms=100,
                            housekeeping_ms=20_000, fallbehind_max=1 << 30, sync_timeout_ms=300)
    try:
        ha.start()
        assert ha._thread.is_alive()
    finally:
        ha.stop()
        master.close()
    assert not ha._thread.is_alive()


def test_slave_client_against_a_master_speaking_raw_bytes(tmp_path: Path) -> None:
    import socket

    from broker.engine.ha_slave import HAClient

    master, slave = _store_pair(tmp_path)
    _put(master, 10)
    log_bytes = master.read_committed(0, 1 << 20)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(30)
    client = HAClient(slave, f"127.0.0.1:{server.getsockname()[1]}", heartbeat_ms=60_000, housekeeping_ms=60_000)
    client.start()
    try:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            assert _recv_exactly(conn, 8) == b"\0" * 8  # the slave's first report: its max offset
            cut = 150  # inside the first record
            conn.sendall((0).to_bytes(8, "big") + cut.to_bytes(4, "big") + log_bytes[:cut])
            assert _recv_exactly(conn, 8) == cut.to_bytes(8, "big")  # it acknowledges what it appended
            rest = log_bytes[cut:]
            conn.sendall(cut.to_bytes(8, "big") + len(rest).to_bytes(4, "big") + rest)
            assert _recv_exactly(conn, 8) == len(log_bytes).to_bytes(8, "big")
            assert slave.commitlog_max_offset == len(log_bytes)
            conn.sendall((5).to_bytes(8, "big") + (1).to_bytes(4, "big") + b"x")  # not the slave's end
            assert conn.recv(1) == b""  # the slave drops the link ...
        conn, _ = server.accept()  # ... and comes back, reporting where it is
        with conn:
            conn.settimeout(30)
            assert _recv_exactly(conn, 8) == len(log_bytes).to_bytes(8, "big")
        slave.caught_up()
        assert slave.get_messages("Rep", 0, 0, 64).body == master.get_messages("Rep", 0, 0, 64).body
    finally:
        client.stop()
        server.close()
        master.close()
        slave.close()


def test_a_taken_derived_ha_port_stops_only_what_needs_it(tmp_path: Path, namesrv: str) -> None:
    import socket

    for _ in range(20):  # a listen port whose successor we can hold
        port = free_port()
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            holder.close()
    holder.listen(1)
    try:
        with pytest.raises(RuntimeError, match="exited"):  # a SYNC_MASTER needs its slaves
            start_broker(tmp_path / "sync", namesrv, {**BASE, "brokerRole": "SYNC_MASTER"}, port=port, processes=1)
        broker = start_broker(tmp_path / "async", namesrv, BASE, port=port, processes=1)
        try:
            assert "runs without slaves" in broker.log.read_text()
            assert send_to(broker.addr, "HaAlone", b"still-a-broker").code == ResponseCode.SUCCESS
        finally:
            assert broker.stop() == 0
    finally:
        holder.close()
