"""Apache's own broker.conf: the Java-properties grammar rule by rule, and the distribution's sample file."""

import logging

import pytest

from broker.remoting.java_properties import PropertiesError, dumps, escape, loads, parse_entries
from broker.server.settings import BrokerSettings, SettingsError, load_settings
from broker.server.settings.apache_keys import APACHE_ONLY_KEYS
from broker.server.settings.loading import PROPERTIES, TOML, detect_format

# conf/broker.conf as Apache's 4.9 distribution ships it (its licence header is comment lines)
APACHE_SAMPLE = """\
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.

brokerClusterName = DefaultCluster
brokerName = broker-a
brokerId = 0
deleteWhen = 04
fileReservedTime = 48
brokerRole = ASYNC_MASTER
flushDiskType = ASYNC_FLUSH
"""


# ---- the grammar ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("a=1", {"a": "1"}),
    ("a: 1", {"a": "1"}),
    ("a 1", {"a": "1"}),
    ("a\t=\t1", {"a": "1"}),
    ("   a = 1", {"a": "1"}),  # leading blanks of the line
    ("a = 1  \t", {"a": "1  \t"}),  # trailing blanks belong to the value
    ("a =", {"a": ""}),
    ("a", {"a": ""}),
    ("a==1", {"a": "=1"}),  # one separator only; the second '=' is value
    ("a = = 1", {"a": "= 1"}),
    ("a:b=c", {"a": "b=c"}),
    ("a\\=b=c", {"a=b": "c"}),  # escaped separators belong to the key
    ("a\\:b:c", {"a:b": "c"}),
    ("a\\ b c", {"a b": "c"}),
    ("# comment\n! also\n  # indented\na=1", {"a": "1"}),
    ("a=1 # not a comment", {"a": "1 # not a comment"}),
    ("a=x\\\n   y\\\n\tz", {"a": "xyz"}),  # continuations drop the next line's leading blanks
    ("a=x\\\\\nb=y", {"a": "x\\", "b": "y"}),  # an even number of backslashes does not continue
    ("a=x\\\\\\\n y", {"a": "x\\y"}),  # odd: the last one continues
    ("# comment \\\na=1", {"a": "1"}),  # comments never continue
    ("a=x\\\n# not a comment", {"a": "x# not a comment"}),
    ("a=\\t\\n\\r\\f", {"a": "\t\n\r\f"}),
    ("a=\\u0041\\u00e9\\u20AC", {"a": "Aé€"}),
    ("a=\\ud83d\\ude00", {"a": "\U0001F600"}),  # a surrogate pair is one character
    ("a=\\q\\\\\\#", {"a": "q\\#"}),  # any other escaped character is itself
    ("a=1\r\nb=2\rc=3\n", {"a": "1", "b": "2", "c": "3"}),  # every line end
    ("a=1\na=2", {"a": "2"}),  # the last of a repeated key wins
    ("a=x\\", {"a": "x"}),  # a continuation at the end of the text continues into nothing
    ("\n\n  \t\n", {}),
])
def test_java_properties_grammar(text, expected):
    assert loads(text) == expected


@pytest.mark.parametrize("text", ["a=\\u12", "a=\\u12G4", "a=\\u"])
def test_malformed_unicode_escape_names_the_line(text):
    with pytest.raises(PropertiesError, match=r"line 2: malformed \\uxxxx"):
        loads("ok=1\n" + text)


def test_entries_know_their_lines():
    entries = parse_entries("# c\na=1\nb=x\\\n  y\n\nc=3\n")
    assert [(e.key, e.value, e.first_line, e.last_line) for e in entries] == [
        ("a", "1", 2, 2), ("b", "xy", 3, 4), ("c", "3", 6, 6)]


@pytest.mark.parametrize("text", ["plain", " lead", "a=b:c#d!e", "tab\there", "back\\slash", "é€\U0001F600", "",
                                  "x "])
def test_escape_round_trips_keys_and_values(text):
    assert loads(f"k={escape(text)}")["k"] == text
    if text:
        assert loads(f"{escape(text, key=True)}=v") == {text: "v"}


def test_dumps_is_properties2string():
    assert dumps({"a": "1", "b": "x y"}) == "a=1\nb=x y\n"


# ---- format detection and Apache's sample ---------------------------------------------------------------
@pytest.mark.parametrize("name, text, fmt", [
    ("broker.conf", 'brokerName = "x"\n', PROPERTIES),  # by extension, even if it would parse as TOML
    ("broker.properties", "a=1\n", PROPERTIES),
    ("broker.toml", "brokerName = x\n", TOML),
    ("broker.cfg", "brokerName = broker-b\n", PROPERTIES),  # not TOML: bare value
    ("broker.cfg", 'brokerName = "broker-b"\n', TOML),
])
def test_detect_format(tmp_path, name, text, fmt):
    assert detect_format(tmp_path / name, text) == fmt


def test_apache_sample_broker_conf_loads(tmp_path, caplog):
    from broker.server.settings import loading

    loading._warned.clear()  # warnings are once per process: earlier tests may have had them
    cfg = tmp_path / "broker.conf"
    cfg.write_text(APACHE_SAMPLE)
    with caplog.at_level(logging.WARNING, logger="broker.server.settings.loading"):
        s = load_settings(cfg)
    assert s == BrokerSettings(broker_cluster_name="DefaultCluster", broker_name="broker-a", broker_id=0,
                               broker_role="ASYNC_MASTER", flush_disk_type="ASYNC_FLUSH",
                               request_processes=s.request_processes)
    warned = {r.getMessage().split(": ")[1].split()[0] for r in caplog.records}
    assert {"deleteWhen", "fileReservedTime"} <= warned  # ignored, but said so
    assert all("rocketlake never deletes" in r.getMessage() for r in caplog.records
               if "deleteWhen" in r.getMessage())


def test_apache_conf_values_are_typed_and_trimmed(tmp_path):
    cfg = tmp_path / "broker.conf"
    cfg.write_text("listenPort : 20911   \nautoCreateTopicEnable=FALSE\nnamesrvAddr 127.0.0.1:9876;127.0.0.1:9877\n"
                   "messageDelayLevel=1s 5s \\\n   10s\nbrokerIP1=\\u0031\\u0030.0.0.5\n"
                   "maxTransferCountOnMessageInMemory=\\\n  64\ncheckCRCOnRecover=false\n")
    s = load_settings(cfg)
    assert (s.listen_port, s.auto_create_topic_enable, s.namesrv_addrs, s.message_delay_level, s.broker_ip1,
            s.max_transfer_count_on_message_in_memory, s.check_crc_on_recover) == (
        20911, False, ["127.0.0.1:9876", "127.0.0.1:9877"], "1s 5s 10s", "10.0.0.5", 64, False)


def test_store_path_root_dir_maps_to_store(tmp_path):
    cfg = tmp_path / "broker.conf"
    cfg.write_text(f"storePathRootDir={tmp_path}/store\nstorePathCommitLog={tmp_path}/store/commitlog\n")
    assert load_settings(cfg).store_path_root_dir == f"{tmp_path}/store"
    cfg.write_text(f"storePathRootDir={tmp_path}/store\nstorePathCommitLog=/data/commitlog\n")
    with pytest.raises(SettingsError, match="storePathCommitLog=/data/commitlog: not supported by rocketlake"):
        load_settings(cfg)


@pytest.mark.parametrize("key, name", [("storePathCommitLog", "commitlog"), ("storeCheckpoint", "checkpoint"),
                                       ("abortFile", "abort")])
def test_store_paths_are_accepted_only_where_the_broker_puts_them(tmp_path, key, name, caplog):
    """Apache lets these point anywhere; rocketlake keeps them under storePathRootDir, so only that
    path is accepted (no warning: it is honoured), and any other is refused naming both paths."""
    cfg = tmp_path / "broker.conf"
    root = tmp_path / "store"
    cfg.write_text(f"storePathRootDir={root}\n{key}={root}/{name}\n")
    with caplog.at_level(logging.WARNING, logger="broker.server.settings.loading"):
        assert load_settings(cfg).store_path_root_dir == str(root)
    assert caplog.records == []
    cfg.write_text(f"storePathRootDir={root}\n{key}=/data/{name}\n")
    with pytest.raises(SettingsError) as err:
        load_settings(cfg)
    assert str(err.value) == (f"{cfg}: {key}=/data/{name}: not supported by rocketlake: "
                              f"{APACHE_ONLY_KEYS[key].reason}; only {root}/{name} is accepted")
    cfg.write_text(f"{key}={root}/{name}\n")
    with pytest.raises(SettingsError, match=f"only <storePathRootDir>/{name} is accepted "
                                            r"\(storePathRootDir is not set\)"):
        load_settings(cfg)


def test_broker_ip2_is_accepted_only_as_broker_ip1(tmp_path):
    cfg = tmp_path / "broker.conf"
    cfg.write_text("brokerIP1=10.0.0.5\nbrokerIP2=10.0.0.5\n")
    assert load_settings(cfg).broker_ip1 == "10.0.0.5"
    cfg.write_text("brokerIP1=10.0.0.5\nbrokerIP2=10.0.0.9\n")
    with pytest.raises(SettingsError, match=r"brokerIP2=10.0.0.9: not supported by rocketlake: rocketlake's HA "
                                            r"address is brokerIP1's \(haListenPort on brokerIP1\); only "
                                            r"10.0.0.5 is accepted"):
        load_settings(cfg)


@pytest.mark.parametrize("line, message", [
    ("aclEnable=maybe", "broker.conf: aclEnable must be bool, got 'maybe'"),
    ("enableDLegerCommitLog=true", "enableDLegerCommitLog=true: not supported by rocketlake: DLedger"),
    ("brokerRole=SLAVE", "brokerId 0: a SLAVE's brokerId must be > 0"),
    ("brokerRole=DLEDGER", "brokerRole must be one of \\('ASYNC_MASTER', 'SYNC_MASTER', 'SLAVE'\\)"),
    ("haMasterAddress=nowhere", "haMasterAddress must be host:port, got 'nowhere'"),
    ("haTransferBatchSize=4194305", "haTransferBatchSize 4194305 is more than a slave can read in one transfer"),
    ("haListenPort=70000", "haListenPort 70000 is not a TCP port"),
    ("enableCalcFilterBitMap=true", "enableCalcFilterBitMap=true: not supported by rocketlake: SQL92 filter bit maps"),
    ("brokerPermission=4", "brokerPermission=4: not supported by rocketlake"),
    ("brokerNmae=x", "unknown broker setting 'brokerNmae' \\(did you mean 'brokerName'\\?\\)"),
    ("maxtransfercountonmessageinmemory=1", "did you mean 'maxTransferCountOnMessageInMemory'"),
    ("mapedFileSizeCommitLog=1024", "did you mean 'mappedFileSizeCommitLog'"),
    ("totallyUnknownKey=1", "unknown broker setting 'totallyUnknownKey'$"),
    ("listenPort=ten", "listenPort must be int, got 'ten'"),
    ("longPollingEnable=yes", "longPollingEnable must be bool, got 'yes'"),
    ("flushDiskType=SOMETIMES", "flushDiskType must be one of"),
    ("maxTransferCountOnMessageInMemory=0", "maxTransferCountOnMessageInMemory must be >= 1"),
    ("defaultTopicQueueNums=0", "defaultTopicQueueNums 0 is outside 1..1024"),
    ("a=\\uZZZZ", "line 1: malformed"),
])
def test_unsupported_and_unknown_keys_are_refused_by_name(tmp_path, line, message):
    cfg = tmp_path / "broker.conf"
    cfg.write_text(line + "\n")
    with pytest.raises(SettingsError, match=message):
        load_settings(cfg)


@pytest.mark.parametrize("line", ["filterServerNums=0", "enableDLegerCommitLog=false", "brokerIP2=127.0.0.1",
                                  "sendMessageThreadPoolNums=128", "brokerPermission=6", "traceTopicEnable=false",
                                  "slaveReadEnable=false", "autoDeleteUnusedStats=false"])
def test_harmless_apache_keys_are_ignored(tmp_path, line):
    cfg = tmp_path / "broker.conf"
    cfg.write_text(line + "\n")
    assert load_settings(cfg) == BrokerSettings(request_processes=load_settings(cfg).request_processes)


def test_ignored_key_warns_once_per_process(tmp_path, caplog):
    from broker.server.settings import loading

    loading._warned.discard("sendMessageThreadPoolNums")
    cfg = tmp_path / "broker.conf"
    cfg.write_text("sendMessageThreadPoolNums=64\n")
    with caplog.at_level(logging.WARNING, logger="broker.server.settings.loading"):
        load_settings(cfg)
        load_settings(cfg)
    assert [r.getMessage() for r in caplog.records] == [
        f"{cfg}: sendMessageThreadPoolNums ignored: a Java thread pool or queue size; rocketlake sizes its own "
        "processes (requestProcesses)"]


def test_broker_id_must_be_the_master(tmp_path):
    cfg = tmp_path / "broker.conf"
    cfg.write_text("brokerId=1\n")
    with pytest.raises(SettingsError, match="brokerId 1: the brokerId of a ASYNC_MASTER must be 0"):
        load_settings(cfg)


def test_cli_needs_a_store_from_flag_or_file(tmp_path, capsys):
    from broker.cli import main

    cfg = tmp_path / "broker.conf"
    cfg.write_text(APACHE_SAMPLE)
    assert main(["broker", "start", "-c", str(cfg)]) == 2
    assert capsys.readouterr().err == "error: no store directory: give --store or storePathRootDir in the config file\n"
    cfg.write_text("aclEnable=true\n")  # no conf/plain_acl.yml beside it: refused before anything is created
    assert main(["broker", "start", "-c", str(cfg), "--store", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == f"error: ACL file {tmp_path / 'conf' / 'plain_acl.yml'} does not exist\n"
    assert not (tmp_path / "s").exists()
