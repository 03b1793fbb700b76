"""Broker settings: Apache key names from TOML, type checks, overrides."""

import time

import pytest

from broker.server.settings import BrokerSettings, SettingsError, load_settings


def test_apache_names_from_toml(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text('brokerClusterName = "C1"\nbrokerName = "broker-b"\nbrokerIP1 = "10.0.0.5"\n'
                   'listenPort = 20911\nflushDiskType = "SYNC_FLUSH"\nmessageDelayLevel = "1s 2s"\n'
                   'autoCreateTopicEnable = false\nmappedFileSizeCommitLog = 1048576\n'
                   'namesrvAddr = "127.0.0.1:9876;127.0.0.1:9877"\n')
    s = load_settings(cfg)
    assert (s.broker_cluster_name, s.broker_name, s.broker_addr) == ("C1", "broker-b", "10.0.0.5:20911")
    assert s.flush_disk_type == "SYNC_FLUSH" and s.message_delay_level == "1s 2s"
    assert s.auto_create_topic_enable is False and s.mapped_file_size_commit_log == 1048576
    assert s.namesrv_addrs == ["127.0.0.1:9876", "127.0.0.1:9877"]


def test_broker_table_and_overrides(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text('[broker]\nbrokerName = "x"\nlistenPort = 1234\n')
    s = load_settings(cfg, listen_port=4321, broker_name=None)
    assert (s.broker_name, s.listen_port) == ("x", 4321)


@pytest.mark.parametrize("text, message", [
    ('brokerNmae = "x"\n', "unknown broker setting 'brokerNmae'"),
    ('listenPort = "abc"\n', "listenPort must be int"),
    ('flushDiskType = "SOMETIMES"\n', "flushDiskType must be one of"),
    ('messageDelayLevel = "1x"\n', "messageDelayLevel"),
    ('listenPort = 70000\n', "is not a TCP port"),
    ('brokerName = \n', "broker.toml"),
])
def test_bad_settings_name_the_key(tmp_path, text, message):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(text)
    with pytest.raises(SettingsError, match=message):
        load_settings(cfg)


def test_missing_file():
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings("/nonexistent/broker.toml")


def test_defaults_listen_on_loopback():
    assert BrokerSettings().listen_host == "127.0.0.1"


# =====================================================================================================
# the declaration
# =====================================================================================================
import dataclasses  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402

from broker.remoting import java_properties  # noqa: E402
from broker.remoting.codes import PullSysFlag, RequestCode, ResponseCode  # noqa: E402
from broker.remoting.command import RemotingCommand  # noqa: E402
from broker.remoting.headers import PullMessageRequestHeader, SendMessageRequestHeader  # noqa: E402
from broker.server.broker import store_settings  # noqa: E402
from broker.engine.message_store import MessageStore  # noqa: E402
from broker.server.metadata import BrokerMetadata  # noqa: E402
from broker.server.processors import BrokerCore, Request  # noqa: E402
from broker.server.settings import RUNTIME_KEYS, SETTING_FIELDS, settings_dict, to_properties  # noqa: E402
from broker.server.settings.apache_keys import APACHE_ONLY_KEYS  # noqa: E402
from broker.store.constants import ASYNC_FLUSH, FLUSH_DISK_TYPES, FlushDiskType  # noqa: E402
from broker.store.topics import DEFAULT_TOPIC  # noqa: E402

SMALL = {"mappedFileSizeCommitLog": 1 << 20, "mappedFileSizeConsumeQueue": 20 * 1000, "maxHashSlotNum": 100,
         "maxIndexNum": 400}


def test_every_setting_is_declared_once_with_name_type_default_and_doc():
    assert len(SETTING_FIELDS) == len(dataclasses.fields(BrokerSettings))
    for key, f in SETTING_FIELDS.items():
        assert f.metadata["doc"], key
        assert f.type in ("int", "str", "bool"), key
    assert not set(SETTING_FIELDS) & set(APACHE_ONLY_KEYS)
    assert {k for k, f in SETTING_FIELDS.items() if f.metadata["ours"]} == {
        "listenHost", "requestProcesses", "maxFrameLength", "aclFilePath", "haSlaveCutBackToMaster"}
    assert RUNTIME_KEYS == {"maxTransferCountOnMessageInMemory", "maxTransferBytesOnMessageInMemory",
                            "longPollingEnable", "shortPollingTimeMills", "clientChannelMaxIdleTimeSeconds",
                            "rejectTransactionMessage", "transactionTimeOut", "transactionCheckMax",
                            "transactionCheckInterval"}
    d = settings_dict(BrokerSettings(request_processes=3))
    # BrokerConfig's transaction defaults; the check service and the send path read them per run/request
    assert {k: d[k] for k in ("rejectTransactionMessage", "transactionTimeOut", "transactionCheckMax",
                              "transactionCheckInterval")} == {
        "rejectTransactionMessage": "false", "transactionTimeOut": "6000", "transactionCheckMax": "15",
        "transactionCheckInterval": "60000"}
    assert list(d) == sorted(SETTING_FIELDS)
    assert {k: d[k] for k in ("checkCRCOnRecover", "brokerIP1", "maxTransferCountOnMessageInMemory",
                              "maxTransferBytesOnMessageInMemory", "longPollingEnable", "shortPollingTimeMills",
                              "clientChannelMaxIdleTimeSeconds", "defaultTopicQueueNums", "flushIntervalCommitLog",
                              "flushIntervalConsumeQueue", "flushConsumerOffsetInterval", "brokerRole",
                              "flushDiskType", "requestProcesses")} == {
        "checkCRCOnRecover": "true", "brokerIP1": "127.0.0.1", "maxTransferCountOnMessageInMemory": "32",
        "maxTransferBytesOnMessageInMemory": "262144", "longPollingEnable": "true", "shortPollingTimeMills": "1000",
        "clientChannelMaxIdleTimeSeconds": "120", "defaultTopicQueueNums": "8", "flushIntervalCommitLog": "500",
        "flushIntervalConsumeQueue": "1000", "flushConsumerOffsetInterval": "5000", "brokerRole": "ASYNC_MASTER",
        "flushDiskType": "ASYNC_FLUSH", "requestProcesses": "3"}
    assert to_properties(BrokerSettings(request_processes=3)) == "".join(f"{k}={v}\n" for k, v in d.items())


def test_flush_types_and_default_topic_live_in_one_place():
    assert FLUSH_DISK_TYPES == ("ASYNC_FLUSH", "SYNC_FLUSH") and ASYNC_FLUSH == "ASYNC_FLUSH"
    assert FlushDiskType("SYNC_FLUSH") is FlushDiskType.SYNC_FLUSH and DEFAULT_TOPIC == "TBW102"
    import broker.client.producer as producer
    import broker.server.offsets as offsets

    assert producer.DEFAULT_TOPIC is DEFAULT_TOPIC and offsets.DEFAULT_TOPIC is DEFAULT_TOPIC


def test_unknown_toml_key_suggests_the_near_miss(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text("longPolingEnable = false\n")
    with pytest.raises(SettingsError, match=r"unknown broker setting 'longPolingEnable' \(did you mean "
                                            r"'longPollingEnable'\?\)"):
        load_settings(cfg)
    cfg.write_text("enableDLegerCommitLog = true\n")
    with pytest.raises(SettingsError, match="enableDLegerCommitLog=true: not supported by rocketlake: DLedger"):
        load_settings(cfg)


def test_store_settings_come_from_the_declaration():
    s = settings_from_mapping({"flushIntervalCommitLog": 250, "flushIntervalConsumeQueue": 700,
                               "flushConsumerOffsetInterval": 900, "syncFlushTimeout": 1200,
                               "defaultTopicQueueNums": 3, "accessMessageInMemoryMaxRatio": 30,
                               "flushDiskType": "SYNC_FLUSH"})
    st = store_settings(s)
    assert (st.flush_interval_ms, st.checkpoint_interval_ms, st.persist_interval_ms, st.sync_flush_timeout_ms,
            st.default_topic_queue_nums, st.access_message_in_memory_max_ratio, st.flush_disk_type) == (
        250, 700, 900, 1200, 3, 30, "SYNC_FLUSH")


# =====================================================================================================
# honoured settings change behaviour (in process)
# =====================================================================================================
from broker.server.settings import settings_from_mapping  # noqa: E402


@pytest.fixture
def make_core(tmp_path):
    stores = []

    def make(config_path=None, **values) -> BrokerCore:
        settings = settings_from_mapping({**SMALL, "requestProcesses": 2, **values})
        ms = MessageStore(tmp_path / f"store{len(stores)}",
                          dataclasses.replace(store_settings(settings), external_dispatch=False, fsync_metadata=False))
        ms.open()
        metadata = BrokerMetadata(ms)
        stores.append((ms, metadata))
        return BrokerCore(ms, metadata, cluster_name="DefaultCluster", broker_name="broker-a",
                          broker_addr="127.0.0.1:10911", max_message_size=settings.max_message_size, settings=settings,
                          config_path=None if config_path is None else str(config_path))

    yield make
    for ms, metadata in stores:
        metadata.close()
        ms.close()


def send(core: BrokerCore, topic: str, n: int, body: bytes = b"x" * 100) -> None:
    ext = SendMessageRequestHeader(producer_group="PG", topic=topic, default_topic=DEFAULT_TOPIC,
                                   default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=1, flag=0,
                                   properties="", reconsume_times=0, unit_mode=False, batch=False).to_ext()
    for _ in range(n):
        reply = core.process(Request(code=RequestCode.SEND_MESSAGE, ext=ext, body=body, peer="127.0.0.1:5000"))
        assert reply.code == ResponseCode.SUCCESS, reply.remark


def pull_ext(topic: str, offset: int, *, suspend: bool = False, max_nums: int = 32) -> dict:
    flags = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend else 0)
    return PullMessageRequestHeader(consumer_group="CG", topic=topic, queue_id=0, queue_offset=offset,
                                    max_msg_nums=max_nums, sys_flag=int(flags), commit_offset=0,
                                    suspend_timeout_millis=15_000, subscription="*", sub_version=0).to_ext()


def pull(core: BrokerCore, topic: str, offset: int = 0, **kw):
    return core.process(Request(code=RequestCode.PULL_MESSAGE, ext=pull_ext(topic, offset, **kw), channel=("t", 1)))


def pulled(core: BrokerCore, topic: str, offset: int = 0, **kw) -> int:
    reply = pull(core, topic, offset, **kw)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return int(reply.ext["nextBeginOffset"]) - offset


def test_pull_returns_at_most_max_transfer_count_and_bytes(make_core):
    core = make_core(maxTransferCountOnMessageInMemory=3)
    send(core, "T", 10)
    assert pulled(core, "T") == 3
    assert pulled(core, "T", max_nums=2) == 2  # the client's smaller number still wins
    default = make_core()
    send(default, "T", 40)
    assert pulled(default, "T") == 32
    one_by_bytes = make_core(maxTransferBytesOnMessageInMemory=1)  # the first message always goes
    send(one_by_bytes, "T", 5)
    assert pulled(one_by_bytes, "T") == 1


def test_short_polling_holds_short_polling_time_instead_of_the_request_timeout(make_core):
    long_core = make_core()
    send(long_core, "T", 1)
    assert pull(long_core, "T", 1, suspend=True).suspend == ("T", 0, 1, 15_000)
    short = make_core(longPollingEnable=False, shortPollingTimeMills=250)
    send(short, "T", 1)
    assert pull(short, "T", 1, suspend=True).suspend == ("T", 0, 1, 250)
    resumed = Request(code=RequestCode.PULL_MESSAGE, ext=pull_ext("T", 1, suspend=True), channel=("t", 1),
                      resumed=True)
    assert short.process(resumed).code == ResponseCode.PULL_NOT_FOUND


def test_client_channel_max_idle_time_expires_clients(make_core):
    core = make_core(clientChannelMaxIdleTimeSeconds=7)
    now = [1000.0]
    core.clients._clock = lambda: now[0]
    heartbeat = json.dumps({"clientID": "c1", "producerDataSet": [], "consumerDataSet": [
        {"groupName": "CG", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False, "subscriptionDataSet": []}]}).encode()
    core.process(Request(code=RequestCode.HEART_BEAT, ext={}, body=heartbeat, channel=("t", 1)))
    assert core.clients.consumer_ids("CG") == ["c1"]
    now[0] += 6.5
    core.clients.scan_expired()
    assert core.clients.consumer_ids("CG") == ["c1"]
    now[0] += 1
    core.clients.scan_expired()
    assert core.clients.consumer_ids("CG") == []


def test_default_topic_queue_nums_sizes_tbw102_and_caps_auto_created_topics(make_core):
    core = make_core(defaultTopicQueueNums=3)
    tbw = core.metadata.topics.get(DEFAULT_TOPIC)
    assert (tbw.read_queue_nums, tbw.write_queue_nums) == (3, 3)
    send(core, "Auto", 1)  # the client asks for 4 queues
    auto = core.metadata.topics.get("Auto")
    assert (auto.read_queue_nums, auto.write_queue_nums) == (3, 3)


# =====================================================================================================
# GET/UPDATE_BROKER_CONFIG (in process)
# =====================================================================================================
def get_config(core: BrokerCore) -> tuple[dict[str, str], dict]:
    reply = core.process(Request(code=RequestCode.GET_BROKER_CONFIG, ext={}))
    assert reply.code == ResponseCode.SUCCESS and reply.remark is None
    return java_properties.loads(reply.body.decode()), json.loads(reply.ext["version"])


def update(core: BrokerCore, text: str):
    return core.process(Request(code=RequestCode.UPDATE_BROKER_CONFIG, ext={}, body=text.encode(), peer="t:1"))


def test_get_broker_config_answers_every_setting_and_the_version(make_core):
    core = make_core(brokerName="broker-z", maxTransferCountOnMessageInMemory=5)
    values, version = get_config(core)
    assert values == settings_dict(core.settings)
    assert values["brokerName"] == "broker-z" and values["maxTransferCountOnMessageInMemory"] == "5"
    assert set(version) == {"counter", "timestamp"} and version["counter"] == 0


TOML_FILE = """\
# operator's notes stay
[broker]
brokerName = "broker-a"   # the name
maxTransferCountOnMessageInMemory = 32
mappedFileSizeCommitLog = 1048576

[other]
x = 1
"""


def test_update_applies_runtime_keys_and_writes_them_into_the_toml(make_core, tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(TOML_FILE)
    core = make_core(config_path=cfg)
    send(core, "T", 10)
    assert pulled(core, "T") == 10
    reply = update(core, "maxTransferCountOnMessageInMemory=4\nlongPollingEnable = false\n"
                         "shortPollingTimeMills: 300\n")
    assert (reply.code, reply.remark) == (ResponseCode.SUCCESS, None)
    assert pulled(core, "T") == 4
    assert pull(core, "T", 10, suspend=True).suspend == ("T", 0, 10, 300)
    values, version = get_config(core)
    assert (values["maxTransferCountOnMessageInMemory"], values["longPollingEnable"], version["counter"]) == (
        "4", "false", 1)
    assert cfg.read_text() == TOML_FILE.replace("maxTransferCountOnMessageInMemory = 32",
                                                "maxTransferCountOnMessageInMemory = 4").replace(
        "mappedFileSizeCommitLog = 1048576\n", "mappedFileSizeCommitLog = 1048576\n"
        "longPollingEnable = false\nshortPollingTimeMills = 300\n")
    assert (tmp_path / "broker.toml.bak").read_text() == TOML_FILE
    reloaded = load_settings(cfg)
    assert (reloaded.max_transfer_count_on_message_in_memory, reloaded.long_polling_enable,
            reloaded.short_polling_time_mills) == (4, False, 300)


CONF_FILE = """\
# Apache's comments stay
brokerClusterName = DefaultCluster
deleteWhen = 04
maxTransferCountOnMessageInMemory = \\
    32
brokerRole = ASYNC_MASTER
"""


def test_update_writes_into_apache_broker_conf(make_core, tmp_path):
    cfg = tmp_path / "broker.conf"
    cfg.write_text(CONF_FILE)
    core = make_core(config_path=cfg)
    assert update(core, "maxTransferCountOnMessageInMemory=7\nclientChannelMaxIdleTimeSeconds=60").code == 0
    assert core.clients.channel_expired_s == 60
    assert cfg.read_text() == ("# Apache's comments stay\nbrokerClusterName = DefaultCluster\ndeleteWhen = 04\n"
                               "maxTransferCountOnMessageInMemory=7\nbrokerRole = ASYNC_MASTER\n"
                               "clientChannelMaxIdleTimeSeconds=60\n")
    assert load_settings(cfg).max_transfer_count_on_message_in_memory == 7


@pytest.mark.parametrize("text, code, remark", [
    ("listenPort=1234", ResponseCode.NO_PERMISSION, "listenPort can not be changed while the broker runs"),
    ("flushIntervalCommitLog=100", ResponseCode.NO_PERMISSION, "flushIntervalCommitLog can not be changed"),
    ("aclEnable=true", ResponseCode.NO_PERMISSION, "aclEnable can not be changed while the broker runs"),
    ("enableDLegerCommitLog=true", ResponseCode.NO_PERMISSION,
     "enableDLegerCommitLog: not supported by rocketlake: DLedger"),
    ("maxTransferCountOnMesageInMemory=3", ResponseCode.SYSTEM_ERROR,
     "UPDATE_BROKER_CONFIG: unknown broker setting 'maxTransferCountOnMesageInMemory' (did you mean "
     "'maxTransferCountOnMessageInMemory'?)"),
    ("maxTransferCountOnMessageInMemory=many", ResponseCode.SYSTEM_ERROR,
     "UPDATE_BROKER_CONFIG: maxTransferCountOnMessageInMemory must be int, got 'many'"),
    ("maxTransferCountOnMessageInMemory=0", ResponseCode.SYSTEM_ERROR,
     "UPDATE_BROKER_CONFIG: maxTransferCountOnMessageInMemory must be >= 1, got 0"),
    ("longPollingEnable=maybe", ResponseCode.SYSTEM_ERROR, "longPollingEnable must be bool, got 'maybe'"),
    ("shortPollingTimeMills=\\u12", ResponseCode.SYSTEM_ERROR, "string2Properties error: line 2: malformed"),
])
def test_update_refuses_with_the_key_named_and_applies_nothing(make_core, tmp_path, text, code, remark):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(TOML_FILE)
    core = make_core(config_path=cfg)
    before = core.settings
    reply = update(core, "longPollingEnable=false\n" + text)  # all or nothing: the good key is not applied
    assert reply.code == code and remark in reply.remark
    assert core.settings is before and cfg.read_text() == TOML_FILE and not (tmp_path / "broker.toml.bak").exists()
    assert get_config(core)[1]["counter"] == 0


def test_update_without_a_config_file_lasts_until_restart(make_core, tmp_path):
    core = make_core()
    assert update(core, "").code == ResponseCode.SUCCESS and get_config(core)[1]["counter"] == 0
    assert update(core, "maxTransferBytesOnMessageInMemory=1").code == ResponseCode.SUCCESS
    assert core.settings.max_transfer_bytes_on_message_in_memory == 1 and get_config(core)[1]["counter"] == 1
    assert list(tmp_path.glob("*.toml*")) == []


# =====================================================================================================
# over a socket: a real broker started from Apache's broker.conf
# =====================================================================================================
def test_real_broker_from_broker_conf_get_and_update_over_the_wire(tmp_path):
    from broker.client import Admin, MQClientError
    from broker.remoting.transport import SyncRemotingClient
    from tests.broker_harness import ROCKETLAKE, REPO, free_port, start_namesrv, wait_port

    ns, ns_addr = start_namesrv(tmp_path)
    port = free_port()
    cfg = tmp_path / "broker.conf"
    conf_text = ("# Apache's sample, plus where to listen and store\nbrokerClusterName = DefaultCluster\n"
                 "brokerName = broker-a\nbrokerId = 0\ndeleteWhen = 04\nfileReservedTime = 48\n"
                 "brokerRole = ASYNC_MASTER\nflushDiskType = ASYNC_FLUSH\n"
                 f"listenPort={port}\nnamesrvAddr={ns_addr}\nstorePathRootDir={tmp_path}/store\n"
                 "requestProcesses=1\n" + "".join(f"{k}={v}\n" for k, v in SMALL.items()))
    cfg.write_text(conf_text)
    log = open(tmp_path / "broker.log", "w")
    proc = subprocess.Popen([*ROCKETLAKE, "--log-level", "INFO", "broker", "start", "-c", str(cfg)], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    addr = f"127.0.0.1:{port}"
    client = None
    try:
        wait_port(port, proc=proc)
        with Admin(ns_addr) as admin:
            config = admin.get_broker_config(addr)
            assert config.values["listenPort"] == str(port) and config.values["storePathRootDir"] == f"{tmp_path}/store"
            assert config.values["maxTransferCountOnMessageInMemory"] == "32" and config.version.counter == 0
            admin.update_broker_config(addr, {"maxTransferCountOnMessageInMemory": "2", "longPollingEnable": "false",
                                              "shortPollingTimeMills": "200"})
            config = admin.get_broker_config(addr)
            assert config.values["maxTransferCountOnMessageInMemory"] == "2" and config.version.counter == 1
            with pytest.raises(MQClientError, match=r"NO_PERMISSION\(16\) listenPort can not be changed"):
                admin.update_broker_config(addr, {"listenPort": "1"})
            admin.create_topic(addr, "Wire", queues=1)
        assert cfg.read_text() == conf_text + "maxTransferCountOnMessageInMemory=2\nlongPollingEnable=false\n" \
                                              "shortPollingTimeMills=200\n"
        client = SyncRemotingClient(addr)
        ext = SendMessageRequestHeader(producer_group="PG", topic="Wire", default_topic=DEFAULT_TOPIC,
                                       default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=1, flag=0,
                                       properties="", reconsume_times=0, unit_mode=False, batch=False).to_ext()
        for _ in range(5):
            assert client.invoke(RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"m"), timeout=10).code == 0
        deadline = time.monotonic() + 30  # acknowledged sends reach the queue a moment later (the dispatcher)
        while client.invoke(RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "Wire", "queueId": 0}),
                            timeout=10).ext_fields["offset"] != "5":
            assert time.monotonic() < deadline, "the 5 sends were not dispatched"
            time.sleep(0.02)
        resp = client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, pull_ext("Wire", 0)), timeout=10)
        assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["nextBeginOffset"] == "2"
        # short polling: a pull at the end comes back PULL_NOT_FOUND instead of being held its 15 s
        resp = client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, pull_ext("Wire", 5, suspend=True)),
                             timeout=10)
        assert resp.code == ResponseCode.PULL_NOT_FOUND
    finally:
        if client is not None:
            client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        ns.send_signal(signal.SIGTERM)
        ns.wait(10)


@pytest.mark.parametrize("name, before, after", [
    ("flat.toml", '# flat\nbrokerName = "b"\nlong_polling_enable = true\n',
     '# flat\nbrokerName = "b"\nlong_polling_enable = false\nshortPollingTimeMills = 250\n'),
    ("t.toml", '[extra]\nlongPollingEnable = 1\n\n[broker]\nbrokerName = "b"\n\n[more]\nx = 1\n',
     '[extra]\nlongPollingEnable = 1\n\n[broker]\nbrokerName = "b"\nlongPollingEnable = false\n'
     'shortPollingTimeMills = 250\n\n[more]\nx = 1\n'),
    ("broker.conf", "brokerName=b\nlongPollingEnable=true", "brokerName=b\nlongPollingEnable=false\n"
                                                            "shortPollingTimeMills=250\n"),
    ("broker.properties", "longPollingEnable true\nlongPollingEnable : true\n",
     "longPollingEnable=false\nlongPollingEnable=false\nshortPollingTimeMills=250\n"),
])
def test_persist_changes_only_the_lines_of_the_keys(tmp_path, name, before, after):
    from broker.server.settings import persist_updates

    cfg = tmp_path / name
    cfg.write_text(before)
    persist_updates(cfg, {"longPollingEnable": "false", "shortPollingTimeMills": "250"})
    assert cfg.read_text() == after
    assert (tmp_path / f"{name}.bak").read_text() == before
    s = load_settings(cfg)
    assert (s.long_polling_enable, s.short_polling_time_mills) == (False, 250)
