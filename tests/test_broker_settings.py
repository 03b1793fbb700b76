"""Broker settings: Apache key names from TOML, type checks, overrides."""

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
