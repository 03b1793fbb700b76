"""Remoting codec: frames, RemotingCommand (JSON and binary headers), typed headers, JSON bodies.

Exact bytes come from remoting-protocol.md (the C++ client's real first frame, section 1; the
heartbeat, route and admin bodies of sections 7 and 11).
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.remoting import headers as h
from broker.remoting.bodies import (
    BodyError,
    BrokerData,
    ClusterInfo,
    ConsumeFromWhere,
    ConsumerData,
    ConsumerIdList,
    ConsumeStats,
    ConsumeType,
    FrozenObject,
    HeartbeatData,
    KVTable,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageModel,
    MessageQueue,
    OffsetWrapper,
    ProducerData,
    QueueData,
    RegisterBrokerBody,
    SubscriptionData,
    TopicList,
    TopicOffset,
    TopicRouteData,
    TopicStatsTable,
    dumps_fastjson_compact,
    loads_lenient,
)
from broker.remoting.codes import LanguageCode, PermName, PullSysFlag, RequestCode, ResponseCode, Version
from broker.remoting.command import (
    ONEWAY_FLAG,
    RESPONSE_FLAG,
    SERIALIZE_ROCKETMQ,
    HeaderError,
    ProtocolError,
    RemotingCommand,
    ext_bool,
    ext_int,
    ext_str,
    next_opaque,
)
from broker.remoting.frame import DEFAULT_MAX_FRAME, FrameDecoder, FrameError
from broker.store.config_files import DataVersion, TopicConfig, TopicConfigTable

# Section 1: the C++ producer's first frame, byte for byte (197 bytes on the wire).
CPP_FIRST_HEADER = (b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN",'
                    b'"Signature":"N/YT7X6tJe5UfutmW+uNwTTJ7Fc=","topic":"TopicTest"},"flag":0,'
                    b'"language":"CPP","opaque":0,"remark":"","version":63}\n')
CPP_FIRST_FRAME = bytes.fromhex("000000c1000000bd") + CPP_FIRST_HEADER


def _payload(frame: bytes) -> bytes:
    return frame[4:]


def _hdr(header: bytes) -> bytes:
    """A frame payload (after the length prefix) with a JSON header and no body."""
    return struct.pack(">i", len(header)) + header


def _json_header(frame: bytes) -> dict:
    header_length = struct.unpack(">i", frame[4:8])[0] & 0xFFFFFF
    return json.loads(frame[8:8 + header_length])


# =====================================================================================================
# Codes
# =====================================================================================================
def test_code_values_match_the_reference() -> None:
    assert (RequestCode.SEND_MESSAGE, RequestCode.PULL_MESSAGE, RequestCode.GET_ROUTEINFO_BY_TOPIC) == (10, 11, 105)
    assert (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.QUERY_DATA_VERSION) == (310, 320, 322)
    assert (RequestCode.POP_MESSAGE, RequestCode.BATCH_ACK_MESSAGE, RequestCode.BROKER_HEARTBEAT) == (200050, 200151, 904)
    assert (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.PULL_NOT_FOUND, ResponseCode.QUERY_NOT_FOUND) == (17, 19, 22)
    assert (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ResponseCode.RPC_TIME_OUT, ResponseCode.GO_AWAY) == (3, -1006, 1500)
    assert (LanguageCode.JAVA, LanguageCode.CPP, LanguageCode.PYTHON, LanguageCode.NODE_JS) == (0, 1, 3, 13)
    assert (PullSysFlag.COMMIT_OFFSET | PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION) == 7
    assert PermName.READ | PermName.WRITE == 6 and PermName.INHERIT == 1 and PermName.PRIORITY == 8
    assert (Version.V3_1_8, Version.V3_4_9, Version.V4_9_4, Version.V5_0_0, Version.V5_3_3) == (63, 121, 401, 413, 479)


# =====================================================================================================
# RemotingCommand
# =====================================================================================================
def test_cpp_first_frame_decodes_to_the_right_fields() -> None:
    assert len(CPP_FIRST_HEADER) == 189 and len(CPP_FIRST_FRAME) == 197
    frames = FrameDecoder().feed(CPP_FIRST_FRAME)
    assert len(frames) == 1
    cmd = RemotingCommand.decode(frames[0])
    assert cmd.code == 105 and cmd.opaque == 0 and cmd.flag == 0
    assert cmd.language == "CPP" and cmd.version == 63 and cmd.remark == ""
    assert cmd.ext_fields == {"AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "N/YT7X6tJe5UfutmW+uNwTTJ7Fc=",
                              "topic": "TopicTest"}
    assert cmd.body == b"" and not cmd.is_response and not cmd.is_oneway
    assert cmd.serialize_type == 0


def test_json_round_trip_and_exact_header_layout() -> None:
    cmd = RemotingCommand(code=10, opaque=7, flag=0, remark="héllo", ext_fields={"b": "2", "a": "1"},
                          body=b"\x00\x01body")
    frame = cmd.encode()
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    assert frame[4] == 0  # type byte: JSON
    header_length = struct.unpack(">i", frame[4:8])[0]
    header = frame[8:8 + header_length]
    assert header == ('{"code":10,"extFields":{"a":"1","b":"2"},"flag":0,"language":"PYTHON","opaque":7,'
                      '"remark":"héllo","serializeTypeCurrentRPC":"JSON","version":401}').encode()
    assert frame[8 + header_length:] == b"\x00\x01body"
    assert RemotingCommand.decode(_payload(frame)) == cmd


def test_binary_header_round_trip_and_layout() -> None:
    cmd = RemotingCommand(code=105, opaque=42, flag=0, remark=None, ext_fields={"topic": "T", "empty": ""},
                          body=b"xyz", language="JAVA", version=479, serialize_type=SERIALIZE_ROCKETMQ)
    frame = cmd.encode()
    assert frame[4] == 1
    expected_header = (struct.pack(">hbhii", 105, 0, 479, 42, 0) + struct.pack(">i", 0)
                       + struct.pack(">i", 2 + 5 + 4 + 1) + struct.pack(">h", 5) + b"topic" + struct.pack(">i", 1) + b"T")
    assert frame[8:8 + len(expected_header)] == expected_header
    back = RemotingCommand.decode(_payload(frame))
    assert back.ext_fields == {"topic": "T"}  # empty values are null in the binary form
    assert (back.code, back.opaque, back.remark, back.language, back.version, back.body) == (105, 42, None, "JAVA", 479, b"xyz")
    assert back.serialize_type == SERIALIZE_ROCKETMQ


def test_binary_header_built_by_hand_decodes() -> None:
    remark = "oops".encode()
    ext = struct.pack(">h", 1) + b"k" + struct.pack(">i", 2) + b"vv"
    header = struct.pack(">hbhii", 17, 1, 63, 9, 1) + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + ext
    payload = struct.pack(">i", (1 << 24) | len(header)) + header + b"B"
    cmd = RemotingCommand.decode(payload)
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark) == (17, "CPP", 63, 9, 1, "oops")
    assert cmd.ext_fields == {"k": "vv"} and cmd.body == b"B" and cmd.is_response


def test_request_and_response_builders() -> None:
    req = RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, {"queueId": 3, "topic": "T", "skip": None})
    assert req.ext_fields == {"queueId": "3", "topic": "T"} and req.flag == 0
    oneway = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, oneway=True)
    assert oneway.is_oneway and oneway.flag == ONEWAY_FLAG and oneway.opaque > req.opaque
    resp = req.response(ext_fields={"offset": 5, "ok": True, "gone": None})
    assert resp.opaque == req.opaque and resp.flag == RESPONSE_FLAG and resp.is_response and resp.code == 0
    assert _json_header(resp.encode())["extFields"] == {"offset": "5", "ok": "true"}


def test_responses_always_carry_ext_fields_as_strings() -> None:
    req = RemotingCommand.decode(_payload(CPP_FIRST_FRAME))
    header = _json_header(req.response().encode())
    assert header["extFields"] == {} and header["flag"] == 1 and header["opaque"] == 0
    header = _json_header(req.response(ResponseCode.SUCCESS, ext_fields={"queueOffset": 1, "queueId": 0,
                                                                          "msgId": "AB"}).encode())
    assert header["extFields"] == {"msgId": "AB", "queueId": "0", "queueOffset": "1"}
    assert all(isinstance(v, str) for v in header["extFields"].values())
    # even a command whose ext_fields were filled with raw numbers by hand is written as strings
    raw = RemotingCommand(code=0, flag=1, ext_fields={"offset": 12})  # type: ignore[dict-item]
    assert _json_header(raw.encode())["extFields"] == {"offset": "12"}


def test_mixed_number_and_string_ext_values_become_strings() -> None:
    header = (b'{"code":10,"extFields":{"batch":"0","bornTimestamp":"1700000000000","defaultTopicQueueNums":4,'
              b'"flag":0,"queueId":2,"ratio":1.5,"yes":true,"nothing":null},"flag":0,"language":"CPP","opaque":5,'
              b'"remark":"","version":63}\n')
    cmd = RemotingCommand.decode(struct.pack(">i", len(header)) + header)
    assert cmd.ext_fields == {"batch": "0", "bornTimestamp": "1700000000000", "defaultTopicQueueNums": "4",
                              "flag": "0", "queueId": "2", "ratio": "1.5", "yes": "true"}


def test_lenient_top_level_fields() -> None:
    header = b'{"code":"0","flag":1,"opaque":3,"language":1}'
    cmd = RemotingCommand.decode(struct.pack(">i", len(header)) + header)
    assert (cmd.code, cmd.flag, cmd.opaque, cmd.language, cmd.version, cmd.remark) == (0, 1, 3, "CPP", 0, None)
    assert cmd.ext_fields == {}


@pytest.mark.parametrize("value, expected", [
    ("true", True), ("TRUE", True), ("True", True), ("1", True), (True, True), (1, True),
    ("false", False), ("0", False), ("no", False), ("", None), (False, False), (0, False),
])
def test_ext_bool_accepts_cpp_and_java_forms(value, expected) -> None:
    assert ext_bool({"k": value}, "k") is expected


def test_ext_helpers() -> None:
    cmd = RemotingCommand(code=1, ext_fields={"n": "-12", "big": "99999999999", "bad": "1x", "s": "x", "e": ""})
    assert ext_int(cmd, "n") == -12 and ext_int(cmd, "missing") is None and ext_int(cmd, "missing", 4) == 4
    assert ext_int(cmd, "e", 7) == 7
    assert ext_int(cmd, "big") == 99999999999
    with pytest.raises(HeaderError, match=r"field big: 99999999999 is out of range for a 32-bit integer"):
        ext_int(cmd, "big", bits=32)
    with pytest.raises(HeaderError, match=r"field bad: '1x' is not an integer"):
        ext_int(cmd, "bad")
    assert ext_str(cmd, "s") == "x" and ext_str(cmd, "nope", "d") == "d"
    assert ext_bool(cmd, "missing", True) is True


@pytest.mark.parametrize("payload, reason", [
    (b"\x00\x00", "too short"),
    (struct.pack(">i", 50) + b"{}", "header length 50 exceeds the 2 bytes"),
    (_hdr(b"[]"), "JSON header is a list, not an object"),
    (_hdr(b"12"), "JSON header is a int, not an object"),
    (_hdr(b'{"flag":1} '), "JSON header has no 'code'"),
    (_hdr(b"\xff\xfe{}"), "not valid UTF-8 at byte 0"),
    (_hdr(b'{"co'), "does not parse"),
    (_hdr(b'{"code":true}'), "is a boolean"),
    (_hdr(b'{"code":"x1"}'), "'code' is not an integer"),
    (_hdr(b'{"code":1,"opaque":4294967296}'), "does not fit a 32-bit int"),
    (_hdr(b'{"code":1,"opaque":'), "does not parse"),
    (_hdr(b'{"code":NaN}'), "NaN is not a JSON value"),
    (_hdr(b'{"code":1,"extFields":{"k":Infinity}}'), "Infinity is not a JSON value"),
    (_hdr(b'{"code":1,"opaque":-Infinity}'), "-Infinity is not a JSON value"),
    (_hdr(b'{"code":1,"extFields":3}'), "'extFields' is a int"),
    (_hdr(b'{"code":1,"remark":[1]}'), "'remark' is not a string"),
    (_hdr(b"[" * 100000 + b"]" * 100000), "JSON header"),
    (struct.pack(">i", (2 << 24) | 2) + b"{}", "unknown serialize type 2"),
    (struct.pack(">i", (1 << 24) | 3) + b"\x00\x01\x02", "binary header: fixed fields needs 13 bytes"),
    (struct.pack(">i", (1 << 24) | 17) + struct.pack(">hbhiii", 1, 0, 0, 0, 0, -5), "negative length -5 for remark"),
])
def test_decode_errors_are_precise(payload: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        RemotingCommand.decode(payload)
    assert reason in info.value.detail


def test_next_opaque_increases_and_stays_positive() -> None:
    a, b = next_opaque(), next_opaque()
    assert b == a + 1 and 0 <= a < 2 ** 31


# =====================================================================================================
# FrameDecoder
# =====================================================================================================
def _frames(count: int) -> list[RemotingCommand]:
    return [RemotingCommand(code=i, opaque=i, ext_fields={"i": str(i)}, body=bytes([i]) * i) for i in range(count)]


def test_frame_decoder_byte_by_byte() -> None:
    commands = _frames(5)
    stream = b"".join(c.encode() for c in commands)
    decoder = FrameDecoder()
    payloads: list[bytes] = []
    for i in range(len(stream)):
        payloads.extend(decoder.feed(stream[i:i + 1]))
    assert [RemotingCommand.decode(p) for p in payloads] == commands
    assert decoder.buffered == 0


def test_frame_decoder_many_frames_in_one_feed_and_a_tail() -> None:
    commands = _frames(50)
    stream = b"".join(c.encode() for c in commands)
    decoder = FrameDecoder()
    first = decoder.feed(stream + CPP_FIRST_FRAME[:10])
    assert [RemotingCommand.decode(p) for p in first] == commands
    assert decoder.buffered == 10
    rest = decoder.feed(CPP_FIRST_FRAME[10:])
    assert len(rest) == 1 and RemotingCommand.decode(rest[0]).code == 105


@pytest.mark.parametrize("length, reason", [
    (-1, "negative frame length -1"),
    (-(2 ** 31), "negative frame length"),
    (0, "frame length 0 is below the 4-byte minimum"),
    (3, "frame length 3 is below"),
    (DEFAULT_MAX_FRAME + 1, f"frame length {DEFAULT_MAX_FRAME + 1} exceeds the {DEFAULT_MAX_FRAME}-byte limit"),
])
def test_frame_decoder_rejects_bad_lengths(length: int, reason: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match=reason):
        decoder.feed(struct.pack(">i", length) + b"\x00" * 8)
    with pytest.raises(FrameError):  # stays failed: the stream cannot be resynchronised
        decoder.feed(CPP_FIRST_FRAME)


def test_frame_decoder_configurable_limit() -> None:
    decoder = FrameDecoder(max_frame=100)
    assert decoder.feed(struct.pack(">i", 100) + b"\x00\x00\x00\x00" + b"x" * 96)
    with pytest.raises(FrameError, match="exceeds the 100-byte limit"):
        decoder.feed(struct.pack(">i", 101))


# =====================================================================================================
# Headers
# =====================================================================================================
SEND_EXT_CPP = {"AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "x", "batch": "1", "bornTimestamp": "1700000000123",
                "defaultTopic": "TBW102", "defaultTopicQueueNums": 4, "flag": 0, "producerGroup": "PG_TEST",
                "properties": "TAGS\x01TagA\x02WAIT\x01true\x02", "queueId": 2, "reconsumeTimes": "0",
                "sysFlag": 1, "topic": "TopicTest", "unitMode": "0"}


def test_send_header_long_names_from_cpp() -> None:
    header = h.SendMessageRequestHeader.from_ext(SEND_EXT_CPP)
    assert header == h.SendMessageRequestHeader(
        producer_group="PG_TEST", topic="TopicTest", default_topic="TBW102", default_topic_queue_nums=4, queue_id=2,
        sys_flag=1, born_timestamp=1700000000123, flag=0, properties="TAGS\x01TagA\x02WAIT\x01true\x02",
        reconsume_times=0, unit_mode=False, batch=True)
    assert header.is_batch


def test_send_header_v2_letters() -> None:
    header = h.SendMessageRequestHeader.from_ext(SEND_EXT_CPP)
    v2 = header.to_ext(v2=True)
    assert v2 == {"a": "PG_TEST", "b": "TopicTest", "c": "TBW102", "d": "4", "e": "2", "f": "1", "g": "1700000000123",
                  "h": "0", "i": "TAGS\x01TagA\x02WAIT\x01true\x02", "j": "0", "k": "false", "m": "true"}
    assert h.SendMessageRequestHeader.from_ext(v2) == header  # letters detected
    assert h.SendMessageRequestHeader.from_ext(v2, v2=True) == header
    cmd = RemotingCommand(code=RequestCode.SEND_BATCH_MESSAGE, ext_fields={**v2, "l": "3", "n": "broker-a"})
    parsed = h.SendMessageRequestHeader.from_command(cmd)
    assert parsed.max_reconsume_times == 3 and parsed.broker_name == "broker-a"
    assert parsed.to_ext(v2=False)["maxReconsumeTimes"] == "3"
    with pytest.raises(HeaderError, match="missing field g"):
        h.SendMessageRequestHeader.from_ext({k: v for k, v in v2.items() if k != "g"}, v2=True)


HEADER_SAMPLES = [
    h.SendMessageRequestHeader(producer_group="P", topic="T", default_topic="TBW102", default_topic_queue_nums=4,
                               queue_id=-1, sys_flag=0, born_timestamp=1, flag=7, properties="", reconsume_times=2,
                               unit_mode=True, max_reconsume_times=16, batch=False, broker_name="b"),
    h.SendMessageResponseHeader(msg_id="7F00000100002A9F0000000000000000", queue_id=1, queue_offset=9,
                                transaction_id="U"),
    h.PullMessageRequestHeader(consumer_group="G", topic="T", queue_id=0, queue_offset=5, max_msg_nums=32, sys_flag=7,
                               commit_offset=-1, suspend_timeout_millis=15000, subscription="TagA || TagB",
                               sub_version=1795240935588, expression_type="TAG", max_msg_bytes=1 << 20,
                               request_source=-1, proxy_forward_client_id="c"),
    h.PullMessageResponseHeader(suggest_which_broker_id=0, next_begin_offset=6, min_offset=0, max_offset=6,
                                offset_delta=1, topic_sys_flag=0, group_sys_flag=0, forbidden_type=0),
    h.QueryConsumerOffsetRequestHeader(consumer_group="G", topic="T", queue_id=3, set_zero_if_not_found=False),
    h.QueryConsumerOffsetResponseHeader(offset=-1),
    h.UpdateConsumerOffsetRequestHeader(consumer_group="G", topic="%RETRY%G", queue_id=0, commit_offset=12),
    h.GetConsumerListByGroupRequestHeader(consumer_group="G"),
    h.ConsumerSendMsgBackRequestHeader(offset=190, group="G", delay_level=0, origin_msg_id="X", origin_topic="T",
                                       unit_mode=False, max_reconsume_times=16),
    h.SearchOffsetRequestHeader(topic="T", queue_id=1, timestamp=1700000000000, boundary_type="upper"),
    h.SearchOffsetResponseHeader(offset=3),
    h.GetMaxOffsetRequestHeader(topic="T", queue_id=1, committed=True),
    h.GetMaxOffsetResponseHeader(offset=10),
    h.GetMinOffsetRequestHeader(topic="T", queue_id=1),
    h.GetMinOffsetResponseHeader(offset=0),
    h.GetEarliestMsgStoretimeRequestHeader(topic="T", queue_id=2),
    h.GetEarliestMsgStoretimeResponseHeader(timestamp=1700000000000),
    h.ViewMessageRequestHeader(topic="T", offset=1 << 40),
    h.QueryMessageRequestHeader(topic="T", key="K1", max_num=64, begin_timestamp=0, end_timestamp=2 ** 63 - 1,
                                unique_key_query=True),
    h.QueryMessageResponseHeader(index_last_update_timestamp=5, index_last_update_phyoffset=6),
    h.UnregisterClientRequestHeader(client_id="1556-127.0.0.1@DEFAULT", producer_group="PG", consumer_group=""),
    h.CreateTopicRequestHeader(topic="T", default_topic="TBW102", read_queue_nums=8, write_queue_nums=8, perm=6,
                               topic_filter_type="SINGLE_TAG", topic_sys_flag=0, order=True, attributes="+a=b",
                               force=False),
    h.GetConsumeStatsRequestHeader(consumer_group="G", topic="", topic_list="A;B"),
    h.GetTopicStatsInfoRequestHeader(topic="T"),
    h.EndTransactionRequestHeader(topic="T", producer_group="P", tran_state_table_offset=1, commit_log_offset=2,
                                  commit_or_rollback=8, from_transaction_check=True, msg_id="M", transaction_id="X"),
    h.NotifyConsumerIdsChangedRequestHeader(consumer_group="G"),
    h.GetConsumerRunningInfoRequestHeader(consumer_group="G", client_id="c", jstack_enable=False),
    h.ResetOffsetRequestHeader(group="G", topic="T", queue_id=-1, offset=5, timestamp=1, is_force=True),
    h.RegisterBrokerRequestHeader(broker_name="broker-a", broker_addr="127.0.0.1:10911", cluster_name="DefaultCluster",
                                  ha_server_addr="127.0.0.1:10912", broker_id=0, heartbeat_timeout_millis=30000,
                                  enable_acting_master=False, compressed=True, body_crc32=123456),
    h.RegisterBrokerResponseHeader(ha_server_addr="", master_addr="127.0.0.1:10911"),
    h.UnRegisterBrokerRequestHeader(broker_name="b", broker_addr="a:1", cluster_name="c", broker_id=1),
    h.QueryDataVersionRequestHeader(broker_name="b", broker_addr="a:1", cluster_name="c", broker_id=0),
    h.QueryDataVersionResponseHeader(changed=True),
    h.GetRouteInfoRequestHeader(topic="TopicTest", accept_standard_json_only=True),
    h.GetTopicsByClusterRequestHeader(cluster="DefaultCluster"),
    h.PutKVConfigRequestHeader(namespace="N", key="k", value="v"),
    h.GetKVConfigRequestHeader(namespace="N", key="k"),
    h.GetKVConfigResponseHeader(value="v"),
    h.DeleteKVConfigRequestHeader(namespace="N", key="k"),
    h.GetKVListByNamespaceRequestHeader(namespace="N"),
    h.DeleteTopicFromNamesrvRequestHeader(topic="T", cluster_name="c"),
    h.WipeWritePermOfBrokerRequestHeader(broker_name="b"),
]


@pytest.mark.parametrize("header", HEADER_SAMPLES, ids=lambda x: type(x).__name__)
def test_every_header_round_trips(header) -> None:
    ext = header.to_ext()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in ext.items())
    noisy = {**ext, "AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "s", "ns": "x", "bname": "b", "lo": "true"}
    assert type(header).from_ext(noisy) == header
    # and through a real frame
    cmd = RemotingCommand.decode(_payload(RemotingCommand.request(1, ext).encode()))
    assert type(header).from_command(cmd) == header


def test_header_exact_wire_names() -> None:
    pull = HEADER_SAMPLES[2].to_ext()
    assert pull == {"consumerGroup": "G", "topic": "T", "queueId": "0", "queueOffset": "5", "maxMsgNums": "32",
                    "sysFlag": "7", "commitOffset": "-1", "suspendTimeoutMillis": "15000",
                    "subscription": "TagA || TagB", "subVersion": "1795240935588", "expressionType": "TAG",
                    "maxMsgBytes": "1048576", "requestSource": "-1", "proxyFrowardClientId": "c"}
    assert h.UnregisterClientRequestHeader(client_id="c").to_ext() == {"clientID": "c"}
    assert h.QueryMessageRequestHeader.from_ext({"topic": "T", "key": "k", "maxNum": "1", "beginTimestamp": "0",
                                                 "endTimestamp": "1", "_UNIQUE_KEY_QUERY": "true"}).unique_key_query


def test_header_cpp_pull_values() -> None:
    ext = {"commitOffset": "-1", "consumerGroup": "CG", "maxMsgNums": 32, "queueId": 1, "queueOffset": "0",
           "subVersion": "1795240935588", "subscription": "*", "suspendTimeoutMillis": "15000", "sysFlag": 6,
           "topic": "TopicTest"}
    pull = h.PullMessageRequestHeader.from_ext(ext)
    assert (pull.queue_id, pull.max_msg_nums, pull.sys_flag, pull.commit_offset) == (1, 32, 6, -1)
    assert pull.has_suspend and pull.has_subscription and not pull.has_commit_offset


@pytest.mark.parametrize("cls, ext, message", [
    (h.PullMessageRequestHeader, {}, "missing field consumerGroup"),
    (h.GetMaxOffsetRequestHeader, {"topic": "T"}, "missing field queueId"),
    (h.GetMaxOffsetRequestHeader, {"topic": "T", "queueId": "abc"}, "field queueId: 'abc' is not an integer"),
    (h.GetMaxOffsetRequestHeader, {"topic": "T", "queueId": ""}, "field queueId: '' is not an integer"),
    (h.GetMaxOffsetRequestHeader, {"topic": "T", "queueId": " 1"}, "field queueId: ' 1' is not an integer"),
    (h.GetMaxOffsetRequestHeader, {"topic": "T", "queueId": "4294967296"}, "field queueId: 4294967296 is out of range for a 32-bit integer"),
    (h.ViewMessageRequestHeader, {"offset": "1.5"}, "field offset: '1.5' is not an integer"),
    (h.UpdateConsumerOffsetRequestHeader, {"consumerGroup": "G", "topic": "T", "queueId": "1"}, "missing field commitOffset"),
    (h.RegisterBrokerRequestHeader, {"brokerName": "b", "brokerAddr": "a", "clusterName": "c", "brokerId": "0"},
     "missing field haServerAddr"),
])
def test_header_errors(cls, ext, message) -> None:
    with pytest.raises(HeaderError) as info:
        cls.from_ext(ext)
    assert str(info.value) == message


def test_optional_empty_and_defaults() -> None:
    header = h.ConsumerSendMsgBackRequestHeader.from_ext({"offset": "190", "group": "G", "delayLevel": 0,
                                                          "maxReconsumeTimes": ""})
    assert header.unit_mode is False and header.max_reconsume_times is None
    assert h.CreateTopicRequestHeader.from_ext({"topic": "T", "defaultTopic": "TBW102", "readQueueNums": "4",
                                                "writeQueueNums": "4", "perm": "6",
                                                "topicFilterType": "SINGLE_TAG"}).order is False


# =====================================================================================================
# Bodies
# =====================================================================================================
ROUTE_LEGACY = (b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:20911"},"brokerName":"broker-a","cluster":"DefaultCluster"}],'
                b'"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,'
                b'"topicSysFlag":0,"writeQueueNums":4}]}')
ROUTE_STANDARD = ROUTE_LEGACY.replace(b'{0:"', b'{"0":"')


def test_route_data_both_key_forms() -> None:
    expected = TopicRouteData(queue_datas=[QueueData("broker-a", 4, 4, 6, 0)],
                              broker_datas=[BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:20911"})])
    assert TopicRouteData.decode(ROUTE_LEGACY) == expected
    assert TopicRouteData.decode(ROUTE_STANDARD) == expected
    assert expected.encode() == ROUTE_STANDARD
    assert expected.encode(legacy=True) == ROUTE_LEGACY
    assert json.loads(expected.encode())["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:20911"}
    assert expected.broker_datas[0].master_addr() == "127.0.0.1:20911"


def test_route_data_5x_fields_and_errors() -> None:
    body = (b'{"brokerDatas":[{"brokerAddrs":{"0":"a:1","1":"b:2"},"brokerName":"x","cluster":"C",'
            b'"enableActingMaster":false,"zoneName":"z"}],"queueDatas":[],"topicQueueMappingByBroker":{}}')
    route = TopicRouteData.decode(body)
    assert route.broker_datas[0].broker_addrs == {0: "a:1", 1: "b:2"}
    assert route.broker_datas[0].zone_name == "z" and route.broker_datas[0].enable_acting_master is False
    with pytest.raises(BodyError, match="brokerAddrs key: expected an integer"):
        TopicRouteData.decode(b'{"brokerDatas":[{"brokerAddrs":{"m":"a"},"brokerName":"x"}]}')
    with pytest.raises(BodyError, match="does not parse"):
        TopicRouteData.decode(b'{"brokerDatas":[')
    with pytest.raises(BodyError, match="not an object"):
        TopicRouteData.decode(b"[1]")


HEARTBEAT_CPP = (b'{"clientID":"2912-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,'
                 b'"groupName":"CG_TEST","messageModel":1,"subscriptionDataSet":[{"subString":"*",'
                 b'"subVersion":"1795240935588","topic":"%RETRY%CG_TEST"},{"codeSet":[0,0],"subString":"TagA || TagB",'
                 b'"subVersion":"1795240935588","tagsSet":["TagA","TagB"],"topic":"TopicTest"}]}]}\n')
HEARTBEAT_JAVA = (b'{"clientID":"10.0.0.5@12345#1","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
                  b'"consumeType":"CONSUME_PASSIVELY","groupName":"G","messageModel":"CLUSTERING",'
                  b'"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[2598919],"expressionType":"TAG",'
                  b'"subString":"TagA","subVersion":1700000000000,"tagsSet":["TagA"],"topic":"T"}],"unitMode":false}],'
                  b'"heartbeatFingerprint":0,"producerDataSet":[{"groupName":"P"}],"withoutSub":false}')
# The Java heartbeat above as the C++ client would write it: ordinals, string subVersion, no defaults.
HEARTBEAT_JAVA_AS_CPP = (b'{"clientID":"10.0.0.5@12345#1","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,'
                         b'"groupName":"G","messageModel":1,"subscriptionDataSet":[{"codeSet":[2598919],'
                         b'"subString":"TagA","subVersion":"1700000000000","tagsSet":["TagA"],"topic":"T"}]}],'
                         b'"heartbeatFingerprint":0,"producerDataSet":[{"groupName":"P"}],"withoutSub":false}\n')


def test_heartbeat_cpp_shape() -> None:
    hb = HeartbeatData.decode(HEARTBEAT_CPP)
    assert hb == HeartbeatData(client_id="2912-127.0.0.1@DEFAULT", consumers=[ConsumerData(
        group_name="CG_TEST", consume_type=ConsumeType.CONSUME_PASSIVELY, message_model=MessageModel.CLUSTERING,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, subscriptions=[
            SubscriptionData(topic="%RETRY%CG_TEST", sub_string="*", sub_version=1795240935588),
            SubscriptionData(topic="TopicTest", sub_string="TagA || TagB", sub_version=1795240935588,
                             tags_set=["TagA", "TagB"], code_set=[0, 0])])])
    producer_only = HeartbeatData.decode(b'{"clientID":"1556-127.0.0.1@DEFAULT","producerDataSet":[{"groupName":"PG_TEST"}]}\n')
    assert producer_only == HeartbeatData(client_id="1556-127.0.0.1@DEFAULT", producers=[ProducerData("PG_TEST")])


def test_heartbeat_java_and_cpp_shapes_give_the_same_model() -> None:
    java, cpp = HeartbeatData.decode(HEARTBEAT_JAVA), HeartbeatData.decode(HEARTBEAT_JAVA_AS_CPP)
    assert java == cpp
    assert java.consumers[0].subscriptions[0].sub_version == 1700000000000
    assert java.heartbeat_fingerprint == 0 and java.without_sub is False
    assert HeartbeatData.decode(java.encode()) == java
    assert java.encode() == (b'{"clientID":"10.0.0.5@12345#1","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
                             b'"consumeType":"CONSUME_PASSIVELY","groupName":"G","messageModel":"CLUSTERING",'
                             b'"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[2598919],"expressionType":"TAG",'
                             b'"subString":"TagA","subVersion":1700000000000,"tagsSet":["TagA"],"topic":"T"}],'
                             b'"unitMode":false}],"heartbeatFingerprint":0,"producerDataSet":[{"groupName":"P"}],'
                             b'"withoutSub":false}')
    with pytest.raises(BodyError, match="consumeType: 'CONSUME_SOMETIMES' is not a ConsumeType"):
        HeartbeatData.decode(b'{"clientID":"c","consumerDataSet":[{"groupName":"G","consumeType":"CONSUME_SOMETIMES"}]}')


def test_small_bodies() -> None:
    assert ConsumerIdList(["a", "b"]).encode() == b'{"consumerIdList":["a","b"]}'
    assert ConsumerIdList.decode(b'{"consumerIdList":["x"]}\n').consumer_id_list == ["x"]
    lock = (b'{"clientId":"4067-127.0.0.1@DEFAULT","consumerGroup":"CG_TEST","mqSet":[{"brokerName":"broker-a",'
            b'"queueId":0,"topic":"TopicTest"}]}')
    body = LockBatchRequestBody.decode(lock)
    assert body == LockBatchRequestBody("CG_TEST", "4067-127.0.0.1@DEFAULT", [MessageQueue("TopicTest", "broker-a", 0)])
    assert body.encode() == lock
    assert LockBatchRequestBody.decode(lock[:-1] + b',"onlyThisBroker":true}').only_this_broker is True
    granted = LockBatchResponseBody([MessageQueue("TopicTest", "broker-a", 0)])
    assert granted.encode() == b'{"lockOKMQSet":[{"brokerName":"broker-a","queueId":0,"topic":"TopicTest"}]}'
    assert LockBatchResponseBody.decode(granted.encode()) == granted
    assert TopicList(["A", "B"]).encode() == b'{"topicList":["A","B"]}'
    assert TopicList.decode(b'{"brokerAddr":"x:1","topicList":["A"]}') == TopicList(["A"], "x:1")
    assert KVTable.decode(KVTable({"T": "broker-a:8"}).encode()).table == {"T": "broker-a:8"}


def test_cluster_info_both_key_forms() -> None:
    legacy = (b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"ip:1"},"brokerName":"broker-a",'
              b'"cluster":"DefaultCluster"}},"clusterAddrTable":{"DefaultCluster":["broker-a"]}}')
    info = ClusterInfo.decode(legacy)
    assert info == ClusterInfo({"broker-a": BrokerData("DefaultCluster", "broker-a", {0: "ip:1"})},
                               {"DefaultCluster": ["broker-a"]})
    assert info.encode(legacy=True) == legacy
    assert ClusterInfo.decode(info.encode()) == info


CONSUME_STATS = (b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"brokerOffset":5,'
                 b'"consumerOffset":3,"lastTimestamp":1700000000000,"pullOffset":3}}}')
TOPIC_STATS = (b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"lastUpdateTimestamp":1700000000000,'
               b'"maxOffset":5,"minOffset":0}},"topicPutTps":0.0}')


def test_object_keyed_fastjson_maps_round_trip() -> None:
    stats = ConsumeStats.decode(CONSUME_STATS)
    mq = MessageQueue("T", "broker-a", 0)
    assert stats == ConsumeStats({mq: OffsetWrapper(5, 3, 3, 1700000000000)}, 0.0)
    assert stats.encode() == CONSUME_STATS and stats.total_diff() == 2
    table = TopicStatsTable.decode(TOPIC_STATS)
    assert table == TopicStatsTable({mq: TopicOffset(0, 5, 1700000000000)}, 0.0)
    assert table.encode() == TOPIC_STATS
    # several queues come out sorted like Java's MessageQueue.compareTo
    many = ConsumeStats({MessageQueue("T", "b", 1): OffsetWrapper(), MessageQueue("T", "a", 2): OffsetWrapper(),
                         MessageQueue("S", "z", 0): OffsetWrapper()})
    keys = list(ConsumeStats.decode(many.encode()).offset_table)
    assert keys == [MessageQueue("S", "z", 0), MessageQueue("T", "a", 2), MessageQueue("T", "b", 1)]
    assert b'"offsetTable":{{"brokerName":"z","queueId":0,"topic":"S"}:' in many.encode()


def test_lenient_reader_object_keys_and_writer() -> None:
    text = '{"mqTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"droped":false,"commitOffset":"18446744073709551615"}}}'
    data = loads_lenient(text)
    (key, value), = data["mqTable"].items()
    assert isinstance(key, FrozenObject) and key.to_dict() == {"brokerName": "b", "queueId": 0, "topic": "T"}
    assert value == {"droped": False, "commitOffset": "18446744073709551615"}
    assert dumps_fastjson_compact(data) == text
    assert dumps_fastjson_compact({1: "a", "k": None, "n": [1.5, None]}) == '{1:"a","n":[1.5,null]}'
    assert dumps_fastjson_compact({1: "a"}, bare_int_keys=False) == '{"1":"a"}'
    with pytest.raises(BodyError, match="not valid UTF-8"):
        loads_lenient(b"\xff")


def _topic_table() -> TopicConfigTable:
    return TopicConfigTable(topics={"TopicTest": TopicConfig("TopicTest", 4, 4, 6),
                                    "TBW102": TopicConfig("TBW102", 8, 8, 7, attributes={"+message.type": "NORMAL"})},
                            data_version=DataVersion(counter=3, timestamp=1700000000000))


def test_register_broker_body_uncompressed() -> None:
    body = RegisterBrokerBody(_topic_table())
    encoded = body.encode()
    assert encoded == (b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":3,'
                       b'"timestamp":1700000000000},"topicConfigTable":{"TBW102":{"attributes":{"+message.type":"NORMAL"},'
                       b'"order":false,"perm":7,"readQueueNums":8,"topicFilterType":"SINGLE_TAG","topicName":"TBW102",'
                       b'"topicSysFlag":0,"writeQueueNums":8},"TopicTest":{"order":false,"perm":6,"readQueueNums":4,'
                       b'"topicFilterType":"SINGLE_TAG","topicName":"TopicTest","topicSysFlag":0,"writeQueueNums":4}}}}')
    back = RegisterBrokerBody.decode(encoded)
    assert back.topics == body.topics and back.data_version.counter == 3
    # a Java 5.x body with extra fields and fastjson layout
    java = (b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":1,"stateVersion":0,'
            b'"timestamp":5},"mappingDataVersion":{"counter":0,"timestamp":0},"topicConfigTable":{"T":{"attributes":{},'
            b'"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"T",'
            b'"topicSysFlag":0,"writeQueueNums":4}},"topicQueueMappingInfoMap":{}}}')
    parsed = RegisterBrokerBody.decode(java)
    assert parsed.topics["T"].write_queue_nums == 4 and parsed.data_version.state_version == 0


def test_register_broker_body_compressed() -> None:
    body = RegisterBrokerBody(_topic_table())
    back = RegisterBrokerBody.decode(body.encode(compressed=True), compressed=True)
    assert back.data_version.counter == 3 and back.data_version.timestamp == 1700000000000
    assert set(back.topics) == {"TopicTest", "TBW102"}
    assert (back.topics["TBW102"].perm, back.topics["TBW102"].read_queue_nums) == (7, 8)
    assert back.topics["TBW102"].attributes == {"+message.type": "NORMAL"}
    # built by hand the way a 4.9 broker writes it: "name r w perm filter" plus trailing separator, no mapping count
    raw = bytearray()
    version = b'{"counter":2,"timestamp":9}'
    raw += struct.pack(">i", len(version)) + version + struct.pack(">i", 1)
    line = b"OrderTopic 2 2 6 SINGLE_TAG "
    raw += struct.pack(">i", len(line)) + line
    raw += struct.pack(">i", 2) + b"[]"
    hand = RegisterBrokerBody.decode(zlib.compress(bytes(raw)), compressed=True)
    assert hand.topics["OrderTopic"].read_queue_nums == 2 and hand.data_version.counter == 2
    with pytest.raises(BodyError, match="runs past the end"):
        RegisterBrokerBody.decode(zlib.compress(bytes(raw[:-3])), compressed=True)
    with pytest.raises(BodyError, match="does not inflate"):
        RegisterBrokerBody.decode(b"not zlib", compressed=True)


# =====================================================================================================
# Fuzz: decoding garbage only ever raises FrameError / ProtocolError
# =====================================================================================================
SEEDS = [CPP_FIRST_FRAME,
         RemotingCommand(code=10, opaque=1, ext_fields={"a": "1"}, body=b"body").encode(),
         RemotingCommand(code=11, opaque=2, remark="r", ext_fields={"k": "v"}, serialize_type=SERIALIZE_ROCKETMQ).encode()]


def _decode_everything(data: bytes, max_frame: int = 1 << 16) -> None:
    decoder = FrameDecoder(max_frame=max_frame)
    try:
        for payload in decoder.feed(data):
            try:
                RemotingCommand.decode(payload)
            except ProtocolError:
                pass
    except FrameError:
        pass


@st.composite
def mutated_frames(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.integers(0, 3))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == 0 and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == 1:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == 2 and data:
            del data[pos:pos + draw(st.integers(1, 8))]
        else:
            data = data[:pos]
    # keep the length prefix honest half of the time so the header decoder itself gets exercised
    if draw(st.booleans()) and len(data) >= 8:
        data[0:4] = struct.pack(">i", len(data) - 4)
    return bytes(data)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_frames())
def test_fuzz_mutated_frames(data: bytes) -> None:
    _decode_everything(data)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 3))
def test_fuzz_random_bytes(data: bytes, type_byte: int) -> None:
    _decode_everything(data)
    # random header bytes behind a valid frame prefix, in both serialize types (and unknown ones)
    framed = struct.pack(">ii", len(data) + 4, (type_byte << 24) | len(data)) + data
    _decode_everything(framed)
    try:
        RemotingCommand.decode(framed[4:])
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers(), st.booleans(),
                                                        st.floats(allow_nan=False, allow_infinity=False), st.none()),
                               max_size=6))
def test_fuzz_header_json_values(ext: dict) -> None:
    header = json.dumps({"code": 1, "opaque": 1, "extFields": ext}).encode()
    cmd = RemotingCommand.decode(struct.pack(">i", len(header)) + header)
    assert all(isinstance(v, str) for v in cmd.ext_fields.values())
    assert RemotingCommand.decode(cmd.encode()[4:]) == cmd
    for cls in (h.PullMessageRequestHeader, h.SendMessageRequestHeader, h.RegisterBrokerRequestHeader):
        try:
            cls.from_ext(cmd.ext_fields)
        except HeaderError:
            pass
