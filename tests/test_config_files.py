"""config/*.json: the golden files Apache 4.9.8 wrote, fastjson's quirks, 5.x extras, .bak/.tmp."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.config_files import (
    ConfigFileError,
    ConsumerOffsetTable,
    DataVersion,
    DelayOffsetTable,
    FastjsonDecodeError,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    TopicConfig,
    TopicConfigTable,
    backup_path,
    dumps_fastjson,
    load_store_config,
    loads_fastjson,
    persist_config_text,
    read_config_json,
    split_topic_group,
    temp_path,
    write_config_json,
)
from tests.conftest import load_expected

GOLDEN_FILES = {
    "consumerOffset.json": ConsumerOffsetTable,
    "delayOffset.json": DelayOffsetTable,
    "topics.json": TopicConfigTable,
    "subscriptionGroup.json": SubscriptionGroupTable,
}


def _golden_text(store: Path, name: str) -> str:
    return (store / "config" / name).read_text(encoding="utf-8")


# --- golden content ------------------------------------------------------------------------------------
def test_golden_consumer_offsets_equal_apache_table(golden_store: Path, golden_expected: Path) -> None:
    expected = load_expected(golden_expected, "expected_offsets.json")["offsetTable"]
    expected_int = {key: {int(q): off for q, off in queues.items()} for key, queues in expected.items()}

    raw = loads_fastjson(_golden_text(golden_store, "consumerOffset.json"))
    assert raw == {"offsetTable": expected_int}
    assert all(type(q) is int and type(o) is int
               for queues in raw["offsetTable"].values() for q, o in queues.items())

    table = ConsumerOffsetTable.load(golden_store / "config" / "consumerOffset.json")
    assert table.offsets == expected_int
    assert table.data_version is None and table.extra == {}
    assert table.offsets_for("groupA", "TopicOrders") == {0: 67, 1: 82, 2: 91, 3: 79}
    assert table.offsets_for("groupZ", "TopicOrders") == {0: 135, 1: 163, 2: 179, 3: 153}
    assert table.offsets_for("groupA", "%RETRY%groupA") == {0: 47}
    assert table.offsets_for("CID_Analytics-1", "TopicPayments") == {0: 0}
    assert table.offsets_for("groupA", "NoSuchTopic") == {}
    assert table.groups() == ["CID_Analytics-1", "groupA", "groupZ"]
    assert table.topics_of("groupA") == ["%RETRY%groupA", "TopicOrders", "TopicPayments", "Topic_Events-v1"]
    assert sum(1 for _ in table.entries()) == 15


def test_golden_topics(golden_store: Path) -> None:
    table = TopicConfigTable.load(golden_store / "config" / "topics.json")
    assert table.data_version == DataVersion(counter=7, timestamp=1795240281183)
    assert len(table) == 15
    schedule = table.get("SCHEDULE_TOPIC_XXXX")
    assert schedule == TopicConfig("SCHEDULE_TOPIC_XXXX", read_queue_nums=18, write_queue_nums=18, perm=6)
    assert (table.get("TopicOrders").read_queue_nums, table.get("TopicPayments").write_queue_nums) == (4, 3)
    assert table.get("Topic_Events-v1").read_queue_nums == 2
    assert table.get("BenchmarkTest").read_queue_nums == 1024
    assert table.get("TBW102").perm == 7 and table.get("TBW102").read_queue_nums == 8
    assert table.get("DefaultCluster").perm == 7 and table.get("broker-a").perm == 7
    for name in ("SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "DefaultCluster_REPLY_TOPIC", "%RETRY%groupA",
                 "%DLQ%groupA", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"):
        assert name in table and table.get(name).read_queue_nums == 1
    assert all(t.topic_filter_type == "SINGLE_TAG" and not t.order and t.topic_sys_flag == 0
               for t in table.topics.values())
    assert all(name == cfg.topic_name for name, cfg in table.topics.items())


def test_golden_subscription_groups(golden_store: Path) -> None:
    table = SubscriptionGroupTable.load(golden_store / "config" / "subscriptionGroup.json")
    assert table.data_version == DataVersion(counter=3, timestamp=1795240281206)
    assert sorted(table.groups) == sorted([
        "SELF_TEST_C_GROUP", "CID_Analytics-1", "CID_ONSAPI_OWNER", "CID_ONSAPI_PERMISSION", "TOOLS_CONSUMER",
        "CID_ONS-HTTP-PROXY", "FILTERSRV_CONSUMER", "CID_ONSAPI_PULL", "groupZ", "groupA",
    ])
    for group in table.groups.values():
        assert group == SubscriptionGroupConfig(group.group_name)  # all defaults in this store
        assert group.retry_max_times == 16 and group.retry_queue_nums == 1 and group.broker_id == 0
        assert group.consume_enable and group.consume_broadcast_enable and group.consume_from_min_enable


def test_golden_delay_offsets_empty(golden_store: Path) -> None:
    assert _golden_text(golden_store, "delayOffset.json") == '{\n\t"offsetTable":{}\n}'
    table = DelayOffsetTable.load(golden_store / "config" / "delayOffset.json")
    assert table.offsets == {} and table.data_version is None


def test_load_store_config_golden(golden_store: Path) -> None:
    config = load_store_config(golden_store)
    assert len(config.topics) == 15 and len(config.subscription_groups) == 10
    assert len(config.consumer_offsets) == 6 and len(config.delay_offsets) == 0


def test_load_store_config_missing_files_are_empty(tmp_path: Path) -> None:
    config = load_store_config(tmp_path)
    assert len(config.topics) == len(config.subscription_groups) == 0
    assert len(config.consumer_offsets) == len(config.delay_offsets) == 0


# --- writer reproduces Apache's bytes --------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_writer_reproduces_golden_bytes(golden_store: Path, name: str) -> None:
    original = _golden_text(golden_store, name)
    assert dumps_fastjson(loads_fastjson(original)) == original  # generic layer
    typed = GOLDEN_FILES[name].from_json(loads_fastjson(original))
    assert dumps_fastjson(typed.to_json()) == original  # typed models, fields re-sorted like fastjson


def test_store_config_save_reproduces_golden_files(golden_store: Path, tmp_path: Path) -> None:
    load_store_config(golden_store).save(tmp_path, fsync=False)
    for name in GOLDEN_FILES:
        assert (tmp_path / "config" / name).read_bytes() == (golden_store / "config" / name).read_bytes()


# --- 5.x files keep everything -------------------------------------------------------------------------
OFFSETS_5X = """{
\t"dataVersion":{
\t\t"counter":12,
\t\t"stateVersion":3,
\t\t"timestamp":1700000000000
\t},
\t"groupTopicMap":{
\t\t"groupA":["TopicA","%RETRY%groupA"]
\t},
\t"offsetTable":{
\t\t"TopicA@groupA":{0:5,1:7
\t\t},
\t\t"%RETRY%groupA@groupA":{0:0
\t\t}
\t}
}"""

TOPICS_5X = """{
\t"dataVersion":{
\t\t"counter":2,
\t\t"stateVersion":0,
\t\t"timestamp":1700000000001
\t},
\t"mappingDataVersion":{
\t\t"counter":0,
\t\t"stateVersion":0,
\t\t"timestamp":1700000000002
\t},
\t"topicConfigTable":{
\t\t"TopicA":{
\t\t\t"attributes":{
\t\t\t\t"message.type":"NORMAL"
\t\t\t},
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":8,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"TopicA",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":8
\t\t}
\t},
\t"topicQueueMappingDetailMap":{},
\t"topicQueueMappingInfoMap":{}
}"""

GROUPS_5X = """{
\t"dataVersion":{
\t\t"counter":1,
\t\t"stateVersion":0,
\t\t"timestamp":1700000000003
\t},
\t"forbiddenTable":{
\t\t"groupA":{
\t\t\t"TopicB":4
\t\t}
\t},
\t"subscriptionGroupTable":{
\t\t"groupA":{
\t\t\t"attributes":{},
\t\t\t"brokerId":0,
\t\t\t"consumeBroadcastEnable":true,
\t\t\t"consumeEnable":false,
\t\t\t"consumeFromMinEnable":true,
\t\t\t"consumeMessageOrderly":false,
\t\t\t"consumeTimeoutMinute":15,
\t\t\t"groupName":"groupA",
\t\t\t"groupRetryPolicy":{
\t\t\t\t"type":"CUSTOMIZED"
\t\t\t},
\t\t\t"groupSysFlag":0,
\t\t\t"notifyConsumerIdsChangedEnable":true,
\t\t\t"retryMaxTimes":3,
\t\t\t"retryQueueNums":1,
\t\t\t"subscriptionDataSet":[{
\t\t\t\t"expression":"*",
\t\t\t\t"topic":"TopicA"
\t\t\t}],
\t\t\t"whichBrokerWhenConsumeSlowly":1
\t\t}
\t}
}"""

DELAY_5X = """{
\t"dataVersion":{
\t\t"counter":4,
\t\t"stateVersion":0,
\t\t"timestamp":1700000000004
\t},
\t"offsetTable":{1:5,2:0,18:3
\t}
}"""

FILES_5X = {"consumerOffset.json": OFFSETS_5X, "topics.json": TOPICS_5X,
            "subscriptionGroup.json": GROUPS_5X, "delayOffset.json": DELAY_5X}


@pytest.mark.parametrize("name", sorted(FILES_5X))
def test_5x_file_round_trips_byte_for_byte(name: str) -> None:
    text = FILES_5X[name]
    assert dumps_fastjson(GOLDEN_FILES[name].from_json(loads_fastjson(text)).to_json()) == text


def test_5x_fields_are_typed_or_kept(tmp_path: Path) -> None:
    for name, text in FILES_5X.items():
        (tmp_path / "config").mkdir(exist_ok=True)
        (tmp_path / "config" / name).write_text(text, encoding="utf-8")
    config = load_store_config(tmp_path)
    assert config.topics.data_version.state_version == 0
    assert config.topics.get("TopicA").attributes == {"message.type": "NORMAL"}
    assert set(config.topics.extra) == {
        "mappingDataVersion", "topicQueueMappingDetailMap", "topicQueueMappingInfoMap"}
    group = config.subscription_groups.get("groupA")
    assert group.retry_max_times == 3 and group.consume_enable is False
    assert group.extra["consumeTimeoutMinute"] == 15 and group.extra["groupRetryPolicy"] == {"type": "CUSTOMIZED"}
    assert config.subscription_groups.extra == {"forbiddenTable": {"groupA": {"TopicB": 4}}}
    assert config.consumer_offsets.data_version == DataVersion(12, 1700000000000, 3)
    assert config.delay_offsets.offsets == {1: 5, 2: 0, 18: 3}

    out = tmp_path / "out"
    config.save(out, fsync=False)
    for name, text in FILES_5X.items():
        assert (out / "config" / name).read_text(encoding="utf-8") == text


def test_5x_group_topic_map_follows_offset_changes() -> None:
    table = ConsumerOffsetTable.from_json(loads_fastjson(OFFSETS_5X))
    table.set_offset("groupB", "TopicA", 0, 9)
    table.update("groupA", "TopicC", {2: 4})
    derived = table.to_json()["groupTopicMap"]
    assert {g: set(t) for g, t in derived.items()} == {
        "groupA": {"TopicA", "%RETRY%groupA", "TopicC"}, "groupB": {"TopicA"}}
    reparsed = ConsumerOffsetTable.from_json(loads_fastjson(dumps_fastjson(table.to_json())))
    assert reparsed.offsets_for("groupB", "TopicA") == {0: 9}
    assert reparsed.offsets_for("groupA", "TopicC") == {2: 4}


# --- table editing ------------------------------------------------------------------------------------
def test_offset_updates_and_fastjson_output() -> None:
    table = ConsumerOffsetTable()
    table.set_offset("g1", "T", 0, 10)
    table.update("g1", "T", {1: 20, 0: 11})
    table.set_offset("g2", "T", 3, 1)
    assert table.offsets_for("g1", "T") == {0: 11, 1: 20}
    assert table.groups() == ["g1", "g2"]
    assert dumps_fastjson(table.to_json()) == (
        '{\n\t"offsetTable":{\n\t\t"T@g1":{0:11,1:20\n\t\t},\n\t\t"T@g2":{3:1\n\t\t}\n\t}\n}')
    assert table.remove("g2", "T") and not table.remove("g2", "T")


def test_quoted_queue_ids_are_coerced_to_int() -> None:
    table = ConsumerOffsetTable.from_json({"offsetTable": {"T@g": {"0": 5, "1": "6"}}})
    assert table.offsets == {"T@g": {0: 5, 1: 6}}
    assert dumps_fastjson(table.to_json()).count("{0:5,1:6") == 1


def test_split_topic_group() -> None:
    assert split_topic_group("%RETRY%groupA@groupA") == ("%RETRY%groupA", "groupA")
    assert split_topic_group("no-separator") is None and split_topic_group("a@b@c") is None


def test_new_tables_and_version_bump() -> None:
    topics = TopicConfigTable(data_version=DataVersion(counter=0, timestamp=1))
    topics.put(TopicConfig("TopicX", read_queue_nums=4, write_queue_nums=4))
    assert topics.data_version.counter == 1 and topics.data_version.timestamp > 1
    text = dumps_fastjson(topics.to_json())
    assert '"TopicX":{\n\t\t\t"order":false,\n\t\t\t"perm":6,\n\t\t\t"readQueueNums":4,' in text
    assert "stateVersion" not in text and "attributes" not in text  # 4.x shape unless set
    groups = SubscriptionGroupTable()
    groups.put(SubscriptionGroupConfig("g"))
    assert SubscriptionGroupTable.from_json(loads_fastjson(dumps_fastjson(groups.to_json()))).get("g") == \
        SubscriptionGroupConfig("g")
    delay = DelayOffsetTable()
    delay.set_offset(3, 17)
    assert dumps_fastjson(delay.to_json()) == '{\n\t"offsetTable":{3:17\n\t}\n}'
    assert delay.offset_for(3) == 17 and delay.offset_for(4) is None


# --- lenient parser ------------------------------------------------------------------------------------
def test_parser_unquoted_and_negative_int_keys() -> None:
    assert loads_fastjson("{0:1,-1:2, -37 : -4,12345678901:5}") == {0: 1, -1: 2, -37: -4, 12345678901: 5}
    assert loads_fastjson('{"0":1}') == {"0": 1}  # quoted stays a string at this level


def test_parser_does_not_touch_string_contents() -> None:
    text = '{"a":"{0:1}","b:c":"x:1,2:3","d":"}{[\\"q\\"]","e":"-1:2","f":"tab\\there"}'
    assert loads_fastjson(text) == {"a": "{0:1}", "b:c": "x:1,2:3", "d": '}{["q"]', "e": "-1:2", "f": "tab\there"}


def test_parser_unicode_tabs_and_whitespace() -> None:
    text = '\ufeff{\r\n\t"τοπικό-主题":"键🔑",\t"esc":"\\u00e9\\ud83d\\ude00\\/"  \n\t}\n\n  \t'
    assert loads_fastjson(text) == {"τοπικό-主题": "键🔑", "esc": "é😀/"}


def test_parser_fastjson_leniencies() -> None:
    assert loads_fastjson("{'single':'it\\'s', bare_key:true, k:[1,2,],}") == {
        "single": "it's", "bare_key": True, "k": [1, 2]}
    assert loads_fastjson('{"n":null,"f":1.5,"e":-2E3,"z":[],"o":{}}') == {
        "n": None, "f": 1.5, "e": -2000.0, "z": [], "o": {}}


@pytest.mark.parametrize(("text", "message", "line", "column"), [
    ('{\n\t"a":1,\n\t"b" 2\n}', "expected ':'", 3, 6),
    ('{"a":"unterminated}', "unterminated string", 1, 6),
    ('{"a":1}}', "unexpected text after", 1, 8),
    ('{"a":1 "b":2}', "expected ',' or '}'", 1, 8),
    ("", "empty document", 1, 1),
    ('{"a":tru}', "expected a value", 1, 6),
    ('{"a":"\\q"}', "invalid escape", 1, 7),
])
def test_parser_errors_have_positions(text: str, message: str, line: int, column: int) -> None:
    with pytest.raises(FastjsonDecodeError, match=message) as info:
        loads_fastjson(text)
    assert (info.value.lineno, info.value.colno) == (line, column)


# --- writer --------------------------------------------------------------------------------------------
def test_writer_layout_rules() -> None:
    value = {"m": {0: 1, -2: 3}, "s": {"k": "v"}, "e": {}, "l": ["a", 1, None], "skip": None, "b": False}
    assert dumps_fastjson(value) == (
        '{\n\t"m":{0:1,-2:3\n\t},\n\t"s":{\n\t\t"k":"v"\n\t},\n\t"e":{},\n\t"l":["a",1,null],\n\t"b":false\n}')
    assert dumps_fastjson({"q": 'say "hi"\\\n\x01', "u": "é🔑"}) == (
        '{\n\t"q":"say \\"hi\\"\\\\\\n\\u0001",\n\t"u":"é🔑"\n}')
    with pytest.raises(TypeError):
        dumps_fastjson({1.5: 1})


_keys = st.one_of(st.text(max_size=8), st.integers(-(2**31), 2**31 - 1))
_scalars = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=12),
                     st.floats(allow_nan=False, allow_infinity=False))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=5))
def test_writer_parser_round_trip(value: dict) -> None:
    text = dumps_fastjson(value)
    assert loads_fastjson(text) == value
    assert dumps_fastjson(loads_fastjson(text)) == text


# --- persistence -----------------------------------------------------------------------------------------
def test_persist_dance(tmp_path: Path) -> None:
    path = tmp_path / "config" / "consumerOffset.json"
    persist_config_text(path, "first")
    assert path.read_text() == "first"
    assert not backup_path(path).exists()  # nothing to back up yet (as the golden consumerOffset.json)
    write_config_json(path, {"offsetTable": {"T@g": {0: 1}}})
    assert backup_path(path).read_text() == "first"
    assert loads_fastjson(path.read_text()) == {"offsetTable": {"T@g": {0: 1}}}
    assert not temp_path(path).exists()
    assert sorted(p.name for p in path.parent.iterdir()) == ["consumerOffset.json", "consumerOffset.json.bak"]


def test_golden_bak_files_are_what_apache_left(golden_store: Path) -> None:
    for name in ("topics.json", "subscriptionGroup.json"):
        main = golden_store / "config" / name
        assert loads_fastjson(backup_path(main).read_text()) == loads_fastjson(main.read_text())


@pytest.mark.parametrize("damage", ["missing", "empty", "corrupt"])
def test_falls_back_to_bak(tmp_path: Path, golden_store: Path, damage: str, caplog) -> None:
    path = tmp_path / "topics.json"
    shutil.copyfile(golden_store / "config" / "topics.json.bak", backup_path(path))
    if damage == "empty":
        path.write_text("")
    elif damage == "corrupt":
        path.write_text('{"topicConfigTable":{"x":')
    with caplog.at_level(logging.INFO, logger="broker.store.config_files"):
        loaded = read_config_json(path)
    assert loaded.from_backup and loaded.source == backup_path(path)
    assert str(backup_path(path)) in caplog.text
    assert len(TopicConfigTable.load(path)) == 15


def test_both_files_broken_names_both(tmp_path: Path) -> None:
    path = tmp_path / "subscriptionGroup.json"
    path.write_text('{\n\t"subscriptionGroupTable":{\n\t\t"g":{,\n}')
    backup_path(path).write_text("[1, 2")
    with pytest.raises(ConfigFileError) as info:
        read_config_json(path)
    message = str(info.value)
    assert f"cannot parse {path}:" in message and "line 3 column 8" in message
    assert f"cannot parse {backup_path(path)}:" in message


def test_corrupt_file_without_backup_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text('{"offsetTable":{"T@g":{0:1,1:}}}')
    expected = rf"cannot parse {re.escape(str(path))}: expected a value: line 1 column 30 \(char 29\); and no backup"
    with pytest.raises(ConfigFileError, match=expected):
        ConsumerOffsetTable.load(path)


def test_non_object_and_non_utf8_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "delayOffset.json"
    path.write_text("[1]")
    with pytest.raises(ConfigFileError, match="top-level value is list"):
        read_config_json(path)
    path.write_bytes(b'{"a":"\xff"}')
    with pytest.raises(ConfigFileError, match="not UTF-8 at byte 6"):
        read_config_json(path)


def test_bad_field_type_names_file(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.write_text('{"topicConfigTable":{"T":{"topicName":"T","readQueueNums":"many"}}}')
    expected = rf"{re.escape(str(path))}: topic T\.readQueueNums: expected an integer"
    with pytest.raises(ConfigFileError, match=expected):
        TopicConfigTable.load(path)


def test_nothing_there_is_empty(tmp_path: Path) -> None:
    assert read_config_json(tmp_path / "topics.json") is None
    (tmp_path / "topics.json").write_text("  \n")
    assert read_config_json(tmp_path / "topics.json") is None
    assert len(SubscriptionGroupTable.load(tmp_path / "subscriptionGroup.json")) == 0
