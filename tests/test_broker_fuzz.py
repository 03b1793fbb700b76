"""Fuzz a running broker with hostile and broken frames over many loopback connections.

Thousands of frames: random bytes, valid requests (JSON and ROCKETMQ binary headers) with bytes
flipped, replaced, inserted, deleted, truncated or appended, random length prefixes (negative,
tiny, past the 16 MiB limit), header lengths past the frame, broken JSON headers, unknown codes,
bad topic names, over-size bodies and properties. Every connection carries its fuzz bytes (completed
to a frame boundary) followed by a well-formed probe request, and the outcome is predicted by
splitting and reading the same bytes by the protocol's rules, written out in this file
(remoting-protocol.md §1–3; the broker's own decoder is never asked):

* a frame that cannot be split or decoded ⇒ the broker closes that connection (and only that one);
* otherwise every request that wants an answer gets a well-formed response with its opaque, and
  the probe is answered (the connection survived).

Every case is sent and checked: the run is a fixed count of cases from a fixed seed, never cut
short by a clock. A well-formed client is served every few hundred cases and at the end; every
record the run added to the commitlog comes from a frame the rules accept. Afterwards the broker's
processes are the same ones as before, a well-formed client still sends and pulls, nothing was
written outside the store, no topic with an invalid name exists anywhere (consume-queue
directories, topics.json), and the store verifies clean after a clean stop.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from broker.remoting.command import (
    ONEWAY_FLAG,
    RESPONSE_FLAG,
    SERIALIZE_ROCKETMQ,
    ProtocolError,
    RemotingCommand,
)
from broker.remoting.frame import DEFAULT_MAX_FRAME
from broker.remoting.headers import PullMessageRequestHeader, SendMessageRequestHeader
from broker.remoting.transport import SyncRemotingClient
from broker.store import findings as fk
from broker.store.batch import BatchItem, encode_batch
from broker.store.commitlog import CommitLog
from broker.store.constants import ABORT_FILE, COMPRESSED_FLAG
from broker.store.message import MessageRecord, decode_record
from broker.store.verify import verify_store
from tests.broker_harness import BrokerHandle, live_group_pids, start_broker, start_namesrv

SEED = 0xF022
SEGMENT = 8 * 1024 * 1024
CONFIG = {"mappedFileSizeCommitLog": SEGMENT, "mappedFileSizeConsumeQueue": 6000,
          "maxHashSlotNum": 1000, "maxIndexNum": 4000}
MUTATED_CASES = 5000
STRUCTURED_CASES = 5000
RANDOM_CASES = 1000
MULTI_FRAME_CASES = 1000
GOOD_CLIENT_EVERY = 500  # cases between two sends of a well-formed client
WORKERS = 8
READ_TIMEOUT_S = 15.0
PROBE_CODE = 9999  # not a request code: the broker answers REQUEST_CODE_NOT_SUPPORTED
TOPIC = "FuzzTopic"
BAD_TOPICS = ["../../etc", "a/b", "x" * 300, "..", ".", "/abs", "a b", "a\nb", "abc\n", "t\x00t", "%RETRY%a/b",
              "%DLQ%../x", "tópico", "a\\b", "*", ""]
_LEN = struct.Struct(">i")
_VALID_TOPIC = re.compile(r"[%|a-zA-Z0-9_-]+")


# =====================================================================================================
# raw connections
# =====================================================================================================
class Closed(Exception):
    """The broker closed the connection."""


class Raw:
    """A plain socket speaking frames; reads are bounded by a deadline."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = bytearray()

    def send(self, data: bytes) -> bool:
        """False if the broker already closed the connection (reset / broken pipe)."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def _fill(self, need: int, deadline: float) -> None:
        while len(self.buf) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no data within the deadline (have {len(self.buf)} of {need} bytes)")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Closed()
            self.buf += chunk

    def read(self, timeout: float = READ_TIMEOUT_S) -> RemotingCommand:
        """The next response from the broker (must decode); Closed at EOF.

        NOTIFY_CONSUMER_IDS_CHANGED (oneway, after a fuzzed heartbeat registered a consumer) is
        the one request the broker may send us; it is skipped.
        """
        deadline = time.monotonic() + timeout
        while True:
            self._fill(4, deadline)
            (length,) = _LEN.unpack_from(self.buf, 0)
            assert 4 <= length <= DEFAULT_MAX_FRAME, f"broker sent a frame length of {length}"
            self._fill(4 + length, deadline)
            payload = bytes(self.buf[4:4 + length])
            del self.buf[:4 + length]
            cmd = RemotingCommand.decode(payload)  # a broker frame that does not decode fails the test
            assert cmd.serialize_type == 0, "the broker must always write JSON headers"
            if cmd.is_response:
                return cmd
            assert cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and cmd.is_oneway, \
                f"unexpected request from the broker: {cmd.describe()}"

    def call(self, cmd: RemotingCommand, timeout: float = READ_TIMEOUT_S) -> RemotingCommand:
        assert self.send(cmd.encode()), "connection closed while sending"
        deadline = time.monotonic() + timeout
        while True:
            resp = self.read(max(0.0, deadline - time.monotonic()))
            if resp.opaque == cmd.opaque:
                return resp

    def expect_closed(self, timeout: float = READ_TIMEOUT_S) -> list[RemotingCommand]:
        """Read until EOF; responses that came first are returned."""
        got = []
        try:
            while True:
                got.append(self.read(timeout))
        except Closed:
            return got

    def close(self) -> None:
        self.sock.close()


# =====================================================================================================
# requests
# =====================================================================================================
def request(code: int, ext: dict | None = None, body: bytes = b"", *, opaque: int, binary: bool = False,
            flag: int = 0) -> RemotingCommand:
    cmd = RemotingCommand.request(code, ext, body)
    cmd.opaque, cmd.flag = opaque, flag
    if binary:
        cmd.serialize_type = SERIALIZE_ROCKETMQ
    return cmd


def send_ext(topic: str = TOPIC, props: str = "KEYS\x01k1\x02UNIQ_KEY\x01FUZZ0001\x02TAGS\x01TagA",
             queue_id: int = -1, v2: bool = False, batch: bool = False) -> dict:
    return SendMessageRequestHeader(producer_group="FuzzPG", topic=topic, default_topic="TBW102",
                                    default_topic_queue_nums=4, queue_id=queue_id, sys_flag=0,
                                    born_timestamp=1700000000000, flag=0, properties=props, reconsume_times=0,
                                    unit_mode=False, batch=batch).to_ext(v2=v2)


def pull_ext(topic: str = TOPIC, group: str = "FuzzCG", queue_id: int = 0, offset: int = 0,
             sys_flag: int = PullSysFlag.SUBSCRIPTION) -> dict:
    return PullMessageRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=offset,
                                    max_msg_nums=32, sys_flag=int(sys_flag), commit_offset=0,
                                    suspend_timeout_millis=1000, subscription="*", sub_version=0).to_ext()


HEARTBEAT = {"clientID": "127.0.0.1@fuzz", "producerDataSet": [{"groupName": "FuzzPG"}],
             "consumerDataSet": [{"groupName": "FuzzCG", "consumeType": "CONSUME_PASSIVELY",
                                  "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                                  "unitMode": False,
                                  "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "tagsSet": [],
                                                           "codeSet": [], "subVersion": 1,
                                                           "classFilterMode": False}]}]}
LOCK = {"consumerGroup": "FuzzCG", "clientId": "127.0.0.1@fuzz",
        "mqSet": [{"topic": TOPIC, "brokerName": "broker-a", "queueId": 0}]}
HEARTBEAT_BODY = json.dumps(HEARTBEAT).encode()
_SEND_EXT, _SEND_EXT_Q1, _SEND_EXT_V2 = send_ext(), send_ext(queue_id=1), send_ext(v2=True)
_BATCH_EXT, _PULL_EXT = send_ext(v2=True, batch=True, props=""), pull_ext()
LOCK_BODY = json.dumps(LOCK).encode()


def base_specs(tag: str = "") -> list[tuple[int, dict, bytes]]:
    """``(code, extFields, body)`` of one well-formed request of (nearly) every code the broker
    serves, to be mutated. ``tag`` makes every message body (and batch item body) unique to one case
    and frame, so what reaches the commitlog can be traced to the frame that sent it. The header
    dicts are shared between calls: copy one before changing it."""
    q = {"consumerGroup": "FuzzCG", "topic": TOPIC, "queueId": "0"}
    batch = encode_batch([BatchItem(f"b1 {tag}".encode(), "KEYS\x01bk1\x02UNIQ_KEY\x01FUZZB1"),
                          BatchItem(f"b2 {tag}".encode(), "KEYS\x01bk2\x02UNIQ_KEY\x01FUZZB2")])
    reqs = [
        (RequestCode.SEND_MESSAGE, _SEND_EXT, f"fuzz body {tag}".encode()),
        (RequestCode.SEND_MESSAGE, _SEND_EXT_Q1, f"{tag} ".encode() + b"x" * 200),
        (RequestCode.SEND_MESSAGE_V2, _SEND_EXT_V2, f"fuzz body v2 {tag}".encode()),
        (RequestCode.SEND_BATCH_MESSAGE, _BATCH_EXT, batch),
        (RequestCode.PULL_MESSAGE, _PULL_EXT, b""),
        (RequestCode.QUERY_CONSUMER_OFFSET, q, b""),
        (RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": "1"}, b""),
        (RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"}, b""),
        (RequestCode.GET_MIN_OFFSET, {"topic": TOPIC, "queueId": "0"}, b""),
        (RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": TOPIC, "queueId": "0"}, b""),
        (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": TOPIC, "queueId": "0", "timestamp": "1700000000000"},
         b""),
        (RequestCode.VIEW_MESSAGE_BY_ID, {"offset": "0"}, b""),
        (RequestCode.QUERY_MESSAGE, {"topic": TOPIC, "key": "k1", "maxNum": "8", "beginTimestamp": "0",
                                     "endTimestamp": "9999999999999"}, b""),
        (RequestCode.HEART_BEAT, {}, HEARTBEAT_BODY),
        (RequestCode.UNREGISTER_CLIENT, {"clientID": "127.0.0.1@fuzz", "producerGroup": "FuzzPG"}, b""),
        (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "FuzzCG"}, b""),
        (RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": "0", "group": "FuzzCG", "delayLevel": "1",
                                              "originMsgId": "X", "originTopic": TOPIC}, b""),
        (RequestCode.LOCK_BATCH_MQ, {}, LOCK_BODY),
        (RequestCode.UNLOCK_BATCH_MQ, {}, LOCK_BODY),
        (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "FuzzCreated", "defaultTopic": "TBW102",
                                               "readQueueNums": "2", "writeQueueNums": "2", "perm": "6",
                                               "topicFilterType": "SINGLE_TAG"}, b""),
        (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps({"groupName": "FuzzSG"}).encode()),
        (RequestCode.GET_ALL_TOPIC_CONFIG, {}, b""),
        (RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC}, b""),
        (RequestCode.GET_CONSUME_STATS, {"consumerGroup": "FuzzCG", "topic": TOPIC}, b""),
        (RequestCode.GET_BROKER_RUNTIME_INFO, {}, b""),
        (RequestCode.GET_ALL_CONSUMER_OFFSET, {}, b""),
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}, b""),
    ]
    return reqs


BASE_SPEC_COUNT = len(base_specs())


def base_frame(index: int, opaque: int, tag: str) -> bytes:
    """Base request ``index // 2`` of :func:`base_specs`, JSON header (even) or binary (odd)."""
    code, ext, body = base_specs(tag)[index // 2]
    return request(code, ext, body, opaque=opaque + index, binary=bool(index % 2)).encode()


# Header values the structured fuzzer plants (no lone surrogates: they cannot be sent as UTF-8).
VALUES = ["", "0", "1", "-1", "3", "7", "2147483647", "-2147483648", "2147483648", "9223372036854775807",
          "-9223372036854775809", "99999999999999999999999999", "1e3", "0x10", " 1", "+1", "1_0", "true", "FALSE",
          "null", "abc", "\x00", "\x01\x02", "\u00e9\u4e2d", "../../etc", "a/b", "x" * 300, TOPIC, "%RETRY%FuzzCG",
          "%DLQ%FuzzCG", "SCHEDULE_TOPIC_XXXX", "TBW102", "*", "TagA || TagB", "k1", "FuzzCG", "1700000000000",
          "DELAY\x013\x02UNIQ_KEY\x01U1", "DELAY\x01abc", "DELAY\x01-1\x02TAGS\x01T", "\x02\x01\x02"]
FIELD_NAMES = ["x", "topic", "queueId", "batch", "sysFlag", "bname", "ns", "\x00", "properties", "maxNum",
               "queueOffset", "commitOffset", "delayLevel", "offset", "consumerGroup", "b", "e", "m", "i"]
CODES = [code for code in RequestCode if code < 1000] + [9999, -1, 0]


def structured(rng: random.Random, opaque: int) -> bytes:
    """A well-formed frame with a hostile request inside: odd header values, missing or extra
    fields, one request's header under another code, junk bodies, odd flags/language/version."""
    code, ext, body = rng.choice(base_specs(f"s{opaque}"))
    ext = dict(ext)
    flag, language, version, binary = 0, "JAVA", 401, rng.random() < 0.2
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op in (0, 1) and ext:
            ext[rng.choice(list(ext))] = rng.choice(VALUES)
        elif op == 2 and ext:
            del ext[rng.choice(list(ext))]
        elif op == 3:
            ext[rng.choice(FIELD_NAMES)] = rng.choice(VALUES)
        elif op == 4:
            code = rng.choice(CODES)
        elif op == 5:
            body = rng.choice([b"", b"{}", b"[]", b"null", b'{"a":', b"\xff" * 10, bytes(rng.randrange(256)
                               for _ in range(64)), HEARTBEAT_BODY, LOCK_BODY,
                               json.dumps({"groupName": rng.choice(VALUES)}).encode(), b"{" * 5000,
                               bytes(100_000), json.dumps({"consumerGroup": "FuzzCG", "clientId": "c",
                                                           "mqSet": [{"topic": TOPIC, "queueId": 1}] * 200}).encode()])
        else:
            flag = rng.choice([ONEWAY_FLAG, RESPONSE_FLAG, 3, rng.randint(0, (1 << 31) - 1)])
            language = rng.choice(["CPP", "PYTHON", "", "NOPE", "x" * 100])
            version = rng.choice([0, 63, -1, 32767, 479])
    if code == RequestCode.UPDATE_AND_CREATE_TOPIC and valid_topic_name(ext.get("topic", "")):
        # a topic created with ~2^31 queues would make a later GET_TOPIC_STATS_INFO/GET_CONSUME_STATS
        # of it loop for hours (Apache does the same); keep such topics out of every other request
        ext["topic"] = f"FuzzCreated{rng.randrange(3)}"
    cmd = RemotingCommand(code=code, opaque=opaque, flag=flag, ext_fields=ext, body=body, language=language,
                          version=version)
    if binary and -(1 << 15) <= code < (1 << 15):
        cmd.serialize_type = SERIALIZE_ROCKETMQ
    return cmd.encode()


# =====================================================================================================
# prediction: the protocol's rules, written out here — the broker's own decoder is never consulted
# =====================================================================================================
# remoting-protocol.md §1: the frame. Written as literals on purpose: the expectation must not come
# from the code under test (the broker runs with maxFrameLength at its default, 16 MiB).
RULE_MAX_FRAME = 16 * 1024 * 1024  # frameMaxLength default; a larger N is refused
RULE_MIN_FRAME = 4  # N counts the 4-byte header-length word at least
RULE_TYPE_JSON, RULE_TYPE_ROCKETMQ = 0, 1  # high byte of the header-length word
RULE_INT32 = (-(1 << 31), (1 << 31) - 1)
RULE_RESPONSE_BIT, RULE_ONEWAY_BIT = 1, 2  # §2 flag bits: neither is answered
RULE_PARKED_CODES = {11, 361}  # PULL_MESSAGE, LITE_PULL_MESSAGE: may be held as long polls
_RULE_INT_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")
_RULE_FIXED = struct.Struct(">hbhii")  # §3: code, language, version, opaque, flag
_RULE_I32 = struct.Struct(">i")
_RULE_I16 = struct.Struct(">h")


class Broken(Exception):
    """The rules say this frame cannot be read: the broker must close the connection."""


@dataclass(frozen=True)
class RuleFrame:
    code: int
    opaque: int
    flag: int
    body: bytes


def _rule_utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")  # strict: invalid sequences and encoded surrogates are refused
    except UnicodeDecodeError:
        raise Broken(f"{what} is not UTF-8") from None


def _rule_reject_constant(name: str):
    raise Broken(f"{name} is not JSON (RFC 8259)")


def _rule_json_int(header: dict, key: str, required: bool) -> int:
    """§2 integer fields: a JSON integer, an integral number, or a numeric string (fastjson coerces
    those into int fields); never a boolean; must fit Java's 32-bit int."""
    value = header.get(key)
    if value is None:
        if required:
            raise Broken(f"no {key!r}")
        return 0
    if isinstance(value, bool):
        raise Broken(f"{key!r} is a boolean")
    if isinstance(value, float):
        if not value.is_integer():
            raise Broken(f"{key!r} = {value} is not an integer")
        value = int(value)
    elif isinstance(value, str):
        if not _RULE_INT_TEXT.fullmatch(value) or len(value.strip().lstrip("+-")) > 40:
            raise Broken(f"{key!r} = {value!r:.30} is not an integer")
        value = int(value)
    elif not isinstance(value, int):
        raise Broken(f"{key!r} is a {type(value).__name__}")
    if not RULE_INT32[0] <= value <= RULE_INT32[1]:
        raise Broken(f"{key!r} = {value} does not fit an int")
    return value


def rule_json_header(raw: bytes) -> tuple[int, int, int]:
    """§2: UTF-8 JSON text (strict RFC 8259: no NaN/Infinity, no raw control characters) whose root
    is an object with a ``code``; ``language`` a string or a language number, ``remark`` a string or
    a number, ``extFields`` an object (values of any JSON type are kept as text); null = absent."""
    text = _rule_utf8(raw, "JSON header")
    try:
        header = json.loads(text, parse_constant=_rule_reject_constant)
    except RecursionError:
        raise Broken("JSON nested too deeply to be a header") from None
    except ValueError:  # not JSON, or a number too long to convert
        raise Broken("JSON header does not parse") from None
    if not isinstance(header, dict):
        raise Broken(f"JSON header is a {type(header).__name__}")
    if "code" not in header:
        raise Broken("JSON header has no code")
    language = header.get("language")
    if language is not None and not isinstance(language, str) and (isinstance(language, bool)
                                                                    or not isinstance(language, int)):
        raise Broken("language is neither a name nor a number")
    remark = header.get("remark")
    if remark is not None and not isinstance(remark, str) and (isinstance(remark, bool)
                                                                or not isinstance(remark, (int, float))):
        raise Broken("remark is not text")
    ext = header.get("extFields")
    if ext is not None and not isinstance(ext, dict):
        raise Broken("extFields is not an object")
    _rule_json_int(header, "version", False)
    return (_rule_json_int(header, "code", True), _rule_json_int(header, "opaque", False),
            _rule_json_int(header, "flag", False))


def rule_binary_header(raw: bytes) -> tuple[int, int, int]:
    """§3: 13 fixed bytes, remark (int length ≥ 0, UTF-8), extFields (int byte length ≥ 0 holding
    whole ``short keyLen, key, int valueLen, value`` entries, UTF-8), and nothing after them."""
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(raw):
            raise Broken(f"binary header: {what} of {n} bytes at {pos} does not fit {len(raw)}")
        pos += n
        return raw[pos - n:pos]

    code, _language, _version, opaque, flag = _RULE_FIXED.unpack(take(_RULE_FIXED.size, "fixed fields"))
    _rule_utf8(take(_RULE_I32.unpack(take(4, "remark length"))[0], "remark"), "remark")
    ext = take(_RULE_I32.unpack(take(4, "extFields length"))[0], "extFields")
    epos = 0
    while epos < len(ext):
        def etake(n: int, what: str) -> bytes:
            nonlocal epos
            if n < 0 or epos + n > len(ext):
                raise Broken(f"binary header: extFields {what} of {n} bytes overruns the extFields length")
            epos += n
            return ext[epos - n:epos]
        _rule_utf8(etake(_RULE_I16.unpack(etake(2, "key length"))[0], "key"), "extFields key")
        _rule_utf8(etake(_RULE_I32.unpack(etake(4, "value length"))[0], "value"), "extFields value")
    if pos != len(raw):
        raise Broken(f"binary header: {len(raw) - pos} bytes after the extFields")
    return code, opaque, flag


def rule_frame(payload: bytes) -> RuleFrame:
    """§1: header-length word = serialize type (high byte) | header length (low 24 bits), the
    header length within the frame, the type JSON or ROCKETMQ; the rest of the frame is the body."""
    word = _RULE_I32.unpack_from(payload, 0)[0] & 0xFFFFFFFF  # N >= 4 was checked by the caller
    kind, header_length = word >> 24, word & 0xFFFFFF
    if header_length > len(payload) - 4:
        raise Broken(f"header length {header_length} > {len(payload) - 4} bytes left in the frame")
    header = payload[4:4 + header_length]
    if kind == RULE_TYPE_JSON:
        code, opaque, flag = rule_json_header(header)
    elif kind == RULE_TYPE_ROCKETMQ:
        code, opaque, flag = rule_binary_header(header)
    else:
        raise Broken(f"serialize type {kind}")
    return RuleFrame(code, opaque, flag, payload[4 + header_length:])


@dataclass
class Expectation:
    closes: bool = False  # the broker must close the connection
    answers: list[int] = field(default_factory=list)  # opaques that must be answered
    quiet: set[int] = field(default_factory=set)  # opaques that may or may not be answered (long polls)
    reason: str = ""
    bodies: list[bytes] = field(default_factory=list)  # bodies of the frames the broker may act on


def complete(data: bytes) -> bytes:
    """Append zeros so that ``data`` ends on a frame boundary (when the lengths allow it)."""
    pos = 0
    while True:
        left = len(data) - pos
        if left == 0:
            return data
        if left < 4:
            data += bytes(4 - left)  # completes the length prefix, then pads like any other frame
            continue
        (length,) = _LEN.unpack_from(data, pos)
        if length < RULE_MIN_FRAME or length > RULE_MAX_FRAME:
            return data
        if left - 4 < length:
            return data + bytes(length - (left - 4))
        pos += 4 + length


def predict(data: bytes) -> Expectation:
    """Split ``data`` into frames and read each by the rules above; the first frame that breaks one
    ends the connection (no frame after it is read). ``data`` ends on a frame boundary."""
    exp = Expectation()
    pos = 0
    while pos < len(data):
        (length,) = _LEN.unpack_from(data, pos)
        try:
            if not RULE_MIN_FRAME <= length <= RULE_MAX_FRAME:
                raise Broken(f"frame length {length}")
            frame = rule_frame(data[pos + 4:pos + 4 + length])
        except Broken as exc:
            exp.closes, exp.reason = True, str(exc)
            return exp
        pos += 4 + length
        exp.bodies.append(frame.body)
        if frame.flag & (RULE_RESPONSE_BIT | RULE_ONEWAY_BIT):
            continue  # the broker answers neither responses nor oneway requests
        if frame.code in RULE_PARKED_CODES:
            exp.quiet.add(frame.opaque)  # may be parked as a long poll for as long as it asked
        else:
            exp.answers.append(frame.opaque)
    return exp


# =====================================================================================================
# mutation
# =====================================================================================================
def mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 5])):
        op = rng.randrange(9)
        n = len(data)
        if op == 0 and n:  # flip one bit
            i = rng.randrange(n)
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # replace a byte
            data[rng.randrange(n)] = rng.randrange(256)
        elif op == 2:  # insert bytes (often JSON-ish characters)
            i = rng.randrange(n + 1)
            data[i:i] = bytes(rng.choice(b'{}[]":,\\0123456789-aZ\x00\xff ') for _ in range(rng.randint(1, 8)))
        elif op == 3 and n > 1:  # delete a range
            i = rng.randrange(n)
            del data[i:i + rng.randint(1, 16)]
        elif op == 4 and n:  # truncate
            del data[rng.randrange(n):]
        elif op == 5:  # extend
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        elif op == 6 and n >= 4:  # new total length
            _LEN.pack_into(data, 0, rng.choice([-1, 0, 3, 4, n - 4 + rng.randint(-8, 8), DEFAULT_MAX_FRAME + 1,
                                                 rng.randint(-(1 << 31), (1 << 31) - 1)]))
        elif op == 7 and n >= 8:  # new header-length word
            word = rng.choice([rng.randint(0, 1 << 24), (rng.randrange(256) << 24) | (n - 8),
                               rng.randint(-(1 << 31), (1 << 31) - 1)])
            data[4:8] = struct.pack(">I", word & 0xFFFFFFFF)
        elif op == 8 and n > 8:  # duplicate a chunk of the header
            i = rng.randrange(8, n)
            data[i:i] = data[i:i + rng.randint(1, 32)]
    return bytes(data)


def frame_with(header: bytes, body: bytes = b"", serialize_type: int = 0, total: int | None = None,
               header_len: int | None = None) -> bytes:
    hl = len(header) if header_len is None else header_len
    n = 4 + len(header) + len(body) if total is None else total
    return _LEN.pack(n) + struct.pack(">I", ((serialize_type << 24) | hl) & 0xFFFFFFFF) + header + body


# =====================================================================================================
# broker fixture and process checks
# =====================================================================================================


@dataclass
class Cluster:
    broker: BrokerHandle
    namesrv: str
    pids: list[int]
    tmp: Path
    tmp_listing: set[str]

    @property
    def store(self) -> Path:
        return self.broker.store


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    tmp = tmp_path_factory.mktemp("fuzz")
    ns, ns_addr = start_namesrv(tmp)
    broker = start_broker(tmp / "store", ns_addr, CONFIG)
    deadline = time.monotonic() + 60
    while "broker broker-a listening on" not in broker.log.read_text(errors="replace"):
        assert broker.proc.poll() is None and time.monotonic() < deadline, "broker did not start"
        time.sleep(0.05)
    pids = live_group_pids(broker.proc.pid)
    try:
        yield Cluster(broker, ns_addr, pids, tmp, set(os.listdir(tmp)))
    finally:
        broker.stop()
        ns.terminate()
        ns.wait(10)


def assert_alive(c: Cluster) -> None:
    assert c.broker.proc.poll() is None, f"broker supervisor exited with {c.broker.proc.returncode}"
    assert live_group_pids(c.broker.proc.pid) == c.pids, "a broker process died or was replaced"


def probe(conn: Raw, opaque: int) -> None:
    resp = conn.call(request(PROBE_CODE, opaque=opaque))
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


def topic_dirs(store: Path) -> list[str]:
    root = store / "consumequeue"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def valid_topic_name(name: str) -> bool:
    limit = 255 if name.startswith(("%RETRY%", "%DLQ%")) else 127
    return bool(_VALID_TOPIC.fullmatch(name)) and len(name) <= limit


# =====================================================================================================
# targeted cases
# =====================================================================================================
def test_oversize_frame_closes_only_that_connection(cluster: Cluster) -> None:
    port = cluster.broker.port
    healthy = [Raw(port) for _ in range(6)]  # SO_REUSEPORT spreads them over the network processes
    try:
        for i, conn in enumerate(healthy):
            probe(conn, 100 + i)
        for n, length in enumerate([DEFAULT_MAX_FRAME + 1, 1 << 30, (1 << 31) - 1, -1, -(1 << 31), 0, 3]):
            bad = Raw(port)
            bad.send(_LEN.pack(length) + b"\x00\x00\x00\x10")
            assert bad.expect_closed() == [], f"length {length}: the connection must be closed unanswered"
            bad.close()
            for i, conn in enumerate(healthy):
                probe(conn, 1000 * (n + 1) + i)  # every other connection is untouched
        # a frame of exactly the limit is still read (and answered), not refused
        conn = Raw(port)
        header = request(PROBE_CODE, opaque=7).encode_json_header()
        body = bytes(DEFAULT_MAX_FRAME - 4 - len(header))
        assert conn.send(frame_with(header, body))
        resp = conn.read()
        assert (resp.opaque, resp.code) == (7, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
        conn.close()
    finally:
        for conn in healthy:
            conn.close()
    assert_alive(cluster)


def test_unknown_code_answers_3_with_remark(cluster: Cluster) -> None:
    conn = Raw(cluster.broker.port)
    try:
        for i, code in enumerate([9999, 0, -5, 65535, 200050, 1 << 30, RequestCode.GET_KV_CONFIG,
                                  RequestCode.REGISTER_BROKER]):
            for binary in (False, True):
                if binary and not -(1 << 15) <= code < (1 << 15):
                    continue  # the binary header carries a short
                resp = conn.call(request(code, {"x": "y"}, b"body", opaque=i * 2 + binary, binary=binary))
                assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, (code, resp)
                assert resp.remark and str(code) in resp.remark, resp.remark
                assert resp.serialize_type == 0, "responses are always JSON"
        # a oneway request of an unknown code is not answered, and the connection goes on
        assert conn.send(request(9999, opaque=500, flag=ONEWAY_FLAG).encode())
        probe(conn, 501)
    finally:
        conn.close()


def test_invalid_topics_are_refused_and_create_nothing(cluster: Cluster) -> None:
    store = cluster.store
    conn = Raw(cluster.broker.port)
    try:
        for i, topic in enumerate(BAD_TOPICS):
            for j, (code, ext) in enumerate([(RequestCode.SEND_MESSAGE, send_ext(topic=topic)),
                                             (RequestCode.SEND_MESSAGE_V2, send_ext(topic=topic, v2=True)),
                                             (RequestCode.UPDATE_AND_CREATE_TOPIC,
                                              {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": "1",
                                               "writeQueueNums": "1", "perm": "6",
                                               "topicFilterType": "SINGLE_TAG"})]):
                resp = conn.call(request(code, ext, b"body", opaque=i * 100 + j))
                assert resp.code != ResponseCode.SUCCESS, (topic, code)
                assert resp.remark, (topic, code)
            queue = {"topic": topic, "queueId": "0"}
            for j, (code, ext) in enumerate([(RequestCode.PULL_MESSAGE, pull_ext(topic=topic)),
                                             (RequestCode.QUERY_CONSUMER_OFFSET, {**queue, "consumerGroup": "FuzzCG"}),
                                             (RequestCode.GET_MAX_OFFSET, queue),
                                             (RequestCode.GET_MIN_OFFSET, queue),
                                             (RequestCode.GET_EARLIEST_MSG_STORETIME, queue),
                                             (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**queue, "timestamp": "0"}),
                                             (RequestCode.QUERY_MESSAGE,
                                              {"topic": topic, "key": "k", "maxNum": "1", "beginTimestamp": "0",
                                               "endTimestamp": "1"})]):
                resp = conn.call(request(code, ext, opaque=i * 100 + 10 + j))
                assert resp.code != ResponseCode.SUCCESS, (topic, code)
        probe(conn, 9000)
    finally:
        conn.close()
    for topic in BAD_TOPICS:
        if topic and "\x00" not in topic:
            assert not (store / "consumequeue" / topic).exists(), f"a queue directory exists for {topic!r}"
    assert not (store.parent / "etc").exists() and not (store / "etc").exists()
    assert all(valid_topic_name(t) for t in topic_dirs(store)), topic_dirs(store)
    assert set(os.listdir(cluster.tmp)) == cluster.tmp_listing, "something was written beside the store"


def test_bad_group_names_create_no_bad_topics(cluster: Cluster) -> None:
    """Groups name retry/DLQ topics: a heartbeat, a send-back or a group config with a hostile group
    name must not leave a topic (config entry or directory) with an invalid name."""
    conn = Raw(cluster.broker.port)
    try:
        for i, group in enumerate(["../../etc", "a/b", "x" * 300, "g\n", "g h"]):
            hb = json.loads(json.dumps(HEARTBEAT))
            hb["consumerDataSet"][0]["groupName"] = group
            conn.call(request(RequestCode.HEART_BEAT, {}, json.dumps(hb).encode(), opaque=i * 10))
            conn.call(request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                              json.dumps({"groupName": group}).encode(), opaque=i * 10 + 1))
            conn.call(request(RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": "0", "group": group, "delayLevel": "0",
                                                                   "originMsgId": "X", "originTopic": TOPIC},
                              opaque=i * 10 + 2))
            resp = conn.call(request(RequestCode.SEND_MESSAGE, send_ext(topic="%RETRY%" + group), b"b",
                                     opaque=i * 10 + 3))
            assert resp.code != ResponseCode.SUCCESS, group
        probe(conn, 999)
    finally:
        conn.close()
    resp_topics = Raw(cluster.broker.port)
    try:
        resp = resp_topics.call(request(RequestCode.GET_ALL_TOPIC_CONFIG, opaque=1))
    finally:
        resp_topics.close()
    assert resp.code == ResponseCode.SUCCESS
    topics = json.loads(resp.body)["topicConfigTable"]
    assert all(valid_topic_name(t) for t in topics), [t for t in topics if not valid_topic_name(t)]
    assert all(valid_topic_name(t) for t in topic_dirs(cluster.store)), topic_dirs(cluster.store)


def test_system_topics_cannot_be_sent_to(cluster: Cluster) -> None:
    """A forged SCHEDULE_TOPIC_XXXX record (REAL_TOPIC of the sender's choice) would be delivered by
    the schedule service, or jam its delay level when the put fails: refused like Apache does."""
    conn = Raw(cluster.broker.port)
    try:
        for i, topic in enumerate(["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"]):
            props = "REAL_TOPIC\x01../../etc\x02REAL_QID\x010\x02UNIQ_KEY\x01FORGED"
            resp = conn.call(request(RequestCode.SEND_MESSAGE, send_ext(topic=topic, props=props, queue_id=1),
                                     b"forged", opaque=i))
            assert resp.code == ResponseCode.NO_PERMISSION, (topic, resp)
    finally:
        conn.close()


def test_oversize_body_and_properties_are_message_illegal(cluster: Cluster) -> None:
    conn = Raw(cluster.broker.port)
    try:
        big = bytes(5 * 1024 * 1024)
        for i, code in enumerate([RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2]):
            resp = conn.call(request(code, send_ext(v2=code == RequestCode.SEND_MESSAGE_V2), big, opaque=i))
            assert resp.code == ResponseCode.MESSAGE_ILLEGAL, resp
            assert resp.remark
        props = "KEYS\x01k\x02big\x01" + "p" * (33 * 1024)
        resp = conn.call(request(RequestCode.SEND_MESSAGE, send_ext(props=props), b"small", opaque=10))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, resp
        # a batch whose item is too big, and a batch with a broken item
        item = encode_batch([BatchItem(bytes(4 * 1024 * 1024 + 1), "")])
        resp = conn.call(request(RequestCode.SEND_BATCH_MESSAGE, send_ext(v2=True, batch=True, props=""), item,
                                 opaque=11))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, resp
        resp = conn.call(request(RequestCode.SEND_BATCH_MESSAGE, send_ext(v2=True, batch=True, props=""),
                                 b"\x00\x00\x00\x40garbage", opaque=12))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, resp
        probe(conn, 13)
    finally:
        conn.close()
    assert_alive(cluster)


def malformed_frames() -> list[tuple[str, bytes]]:
    ok = request(RequestCode.GET_BROKER_RUNTIME_INFO, opaque=1)
    header = ok.encode_json_header()
    cases = [
        ("negative length", _LEN.pack(-1) + b"\x00" * 8),
        ("length 0", _LEN.pack(0)),
        ("length 2", _LEN.pack(2) + b"ab"),
        ("length over 16 MiB", _LEN.pack(DEFAULT_MAX_FRAME + 1)),
        ("header length past the frame", frame_with(header, header_len=len(header) + 1)),
        ("header length 0xFFFFFF", frame_with(header, header_len=0xFFFFFF)),
        ("serialize type 2", frame_with(header, serialize_type=2)),
        ("serialize type 255", frame_with(header, serialize_type=255)),
        ("binary header garbage", frame_with(b"\x00\x0a\x01", serialize_type=1)),
        ("binary header negative remark", frame_with(struct.pack(">hbhii", 28, 0, 1, 1, 0) + _LEN.pack(-7),
                                                     serialize_type=1)),
        ("binary header ext past end", frame_with(struct.pack(">hbhii", 28, 0, 1, 1, 0) + _LEN.pack(0)
                                                  + _LEN.pack(1000) + b"\x00\x01", serialize_type=1)),
        ("binary header trailing bytes", frame_with(struct.pack(">hbhii", 28, 0, 1, 1, 0) + _LEN.pack(0)
                                                    + _LEN.pack(0) + b"xx", serialize_type=1)),
    ]
    bad_json = [b"", b"{", b"{code:10}", b"[]", b'"str"', b"null", b"12", b'{"opaque":1}', b'{"code":"abc"}',
                b'{"code":1e400}', b'{"code":99999999999}', b'{"code":true}', b'{"code":10,"extFields":[1]}',
                b'{"code":10,"remark":{"a":1}}', b'{"code":10,"language":[1]}', b'{"code":10,"opaque":"x"}',
                b"\xff\xfe{}", b'{"code":10}\xc3', b"[" * 100000 + b"]" * 100000, b'{"a":' * 50000 + b"1" + b"}" * 50000,
                b'{"code":10,"flag":1.5}', b'{"code":10,"version":-9999999999}', b"{\"code\":10,\"code\":\"x\"}"]
    cases += [(f"bad JSON header {h[:20]!r}", frame_with(h)) for h in bad_json]
    return cases


def test_malformed_frames_close_the_connection(cluster: Cluster) -> None:
    for what, data in malformed_frames():
        exp = predict(complete(data))
        assert exp.closes, what  # the prediction agrees with the protocol rules
        conn = Raw(cluster.broker.port)
        try:
            conn.send(data + request(PROBE_CODE, opaque=42).encode())
            got = conn.expect_closed()
            assert all(r.opaque != 42 for r in got), f"{what}: the probe after a broken frame was answered"
        finally:
            conn.close()
    assert_alive(cluster)


# =====================================================================================================
# the random part
# =====================================================================================================
@dataclass
class Case:
    name: str
    data: bytes  # completed to a frame boundary


def build_cases(rng: random.Random) -> list[Case]:
    """Every case of the run, from the seed alone (the same list on every run)."""
    def base(tag: str) -> bytes:
        return base_frame(rng.randrange(2 * BASE_SPEC_COUNT), 1 << 20, tag)

    cases = []
    for n in range(MUTATED_CASES):
        cases.append(Case(f"mutated-{n}", complete(mutate(rng, base(f"m{n}")))))
    for n in range(RANDOM_CASES):
        size = rng.choice([1, 3, 4, 7, 8, 16, 64, 300, 2000])
        data = bytearray(rng.randrange(256) for _ in range(size))
        if rng.random() < 0.5 and size >= 8:  # plausible length, random rest
            _LEN.pack_into(data, 0, size - 4)
        data = bytes(data)
        cases.append(Case(f"random-{n}", complete(data)))
    for n in range(MULTI_FRAME_CASES):
        frames = [base(f"u{n}.{k}") if rng.random() < 0.4 else complete(mutate(rng, base(f"u{n}.{k}")))
                  for k in range(rng.randint(2, 6))]
        cases.append(Case(f"multi-{n}", b"".join(frames)))
    for n in range(STRUCTURED_CASES):
        cases.append(Case(f"structured-{n}", structured(rng, (1 << 21) + n)))
    for n, topic in enumerate(BAD_TOPICS):
        cases.append(Case(f"bad-topic-{n}", request(RequestCode.SEND_MESSAGE, send_ext(topic=topic),
                                                    f"bad topic {n}".encode(), opaque=n).encode()))
    rng.shuffle(cases)
    return cases


def run_case(port: int, case: Case, exp: Expectation, probe_opaque: int) -> tuple[str, str]:
    if probe_opaque in exp.answers or probe_opaque in exp.quiet:
        probe_opaque += 1 << 29
    conn = Raw(port)
    try:
        sent = conn.send(case.data + request(PROBE_CODE, opaque=probe_opaque).encode())
        if exp.closes:
            got = conn.expect_closed()
            assert all(r.opaque != probe_opaque for r in got), "probe answered after an undecodable frame"
            return "closed", exp.reason
        assert sent, "the broker closed the connection while we were sending"
        want = list(exp.answers) + [probe_opaque]
        codes = []
        while want:
            try:
                resp = conn.read()
            except Closed:
                raise AssertionError(f"connection closed, still waiting for opaques {want}") from None
            if resp.opaque in want:
                want.remove(resp.opaque)
                codes.append(resp.code)
            else:
                assert resp.opaque in exp.quiet, f"response to an opaque nobody asked for: {resp.describe()}"
        return "answered", ",".join(str(c) for c in codes[:-1])
    finally:
        conn.close()


def good_client_send(c: Cluster, n: int) -> bytes:
    """A well-formed client on a new connection: its send is stored (SUCCESS, a queue offset), and
    the broker's processes are still the ones it started with. Returns the body sent."""
    assert_alive(c)
    body = f"good client {n}".encode()
    conn = Raw(c.broker.port)
    try:
        resp = conn.call(request(RequestCode.SEND_MESSAGE, send_ext(topic="FuzzGoodTopic"), body, opaque=n))
    finally:
        conn.close()
    assert resp.code == ResponseCode.SUCCESS and int(resp.ext_fields["queueOffset"]) >= 0, resp
    return body


def test_random_and_mutated_frames(cluster: Cluster) -> None:
    """Every generated case is sent and checked (a count, not a time budget). A well-formed client
    is served every GOOD_CLIENT_EVERY cases and at the end; afterwards every record the run added to
    the commitlog must come from a frame the rules accept (or be the broker's copy of an earlier
    record: send-back, delayed delivery), never from a frame they refuse or one after it."""
    built = time.monotonic()
    rng = random.Random(SEED)
    cases = build_cases(rng)
    expectations = [predict(case.data) for case in cases]
    log_start = CommitLog.open(cluster.store, SEGMENT).data_end()
    started = time.monotonic()
    outcomes: Counter = Counter()
    failures: list[str] = []
    good_bodies: list[bytes] = []
    lock = threading.Lock()

    def one(n: int) -> None:
        case = cases[n]
        try:
            kind, _ = run_case(cluster.broker.port, case, expectations[n], 0x40000000 + n)
            if n % GOOD_CLIENT_EVERY == 0:
                body = good_client_send(cluster, n)
                with lock:
                    good_bodies.append(body)
        except (AssertionError, TimeoutError, OSError, ProtocolError) as exc:
            kind = "failed"
            with lock:
                failures.append(f"{case.name}: {type(exc).__name__}: {exc} (data {case.data[:120]!r})")
        with lock:
            outcomes[kind] += 1

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(one, range(len(cases))))
    good_bodies.append(good_client_send(cluster, len(cases)))
    elapsed = time.monotonic() - started
    print(f"\nfuzz: {len(cases)} cases built and predicted in {started - built:.1f} s, sent and checked in "
          f"{elapsed:.1f} s: {dict(outcomes)}, {len(good_bodies)} good-client sends")
    assert not failures, f"{len(failures)} cases failed:\n" + "\n".join(failures[:15])
    assert sum(outcomes.values()) == len(cases) == \
        MUTATED_CASES + RANDOM_CASES + MULTI_FRAME_CASES + STRUCTURED_CASES + len(BAD_TOPICS)
    assert outcomes["closed"] == sum(e.closes for e in expectations) > 1000, outcomes
    assert outcomes["answered"] == len(cases) - outcomes["closed"] > 1000, outcomes
    assert len(good_bodies) == len(range(0, len(cases), GOOD_CLIENT_EVERY)) + 1

    accepted = {body for e in expectations for body in e.bodies}
    inside_accepted = b"\x00\xff\x00".join(accepted)  # a batch item's body lies inside its frame's body
    seen: set[bytes] = set()
    added: set[bytes] = set()
    strays = []
    for rec in CommitLog.open(cluster.store, SEGMENT).iter_records():
        if rec.physical_offset >= log_start:
            added.add(rec.body)
            if rec.body not in seen and rec.body not in good_bodies and rec.body not in accepted \
                    and rec.body not in inside_accepted:
                strays.append((rec.physical_offset, rec.topic, rec.body[:80]))
        seen.add(rec.body)
    print(f"fuzz: {len(added)} records added to the commitlog, read back in {time.monotonic() - started - elapsed:.1f} s")
    assert set(good_bodies) <= added, "a good client's send is missing from the commitlog"
    assert len(added - set(good_bodies)) > 100, "too few fuzzed sends were stored for the check to mean much"
    assert not strays, f"{len(strays)} records stored from frames the rules refuse: {strays[:10]}"


# =====================================================================================================
# afterwards
# =====================================================================================================
def test_broker_still_serves_a_good_client(cluster: Cluster) -> None:
    assert_alive(cluster)
    client = SyncRemotingClient(cluster.broker.addr)
    try:
        sent = {}
        for i in range(20):
            uniq = f"GOOD{i:028X}"
            ext = send_ext(topic="GoodTopic", props=f"KEYS\x01good-{i}\x02UNIQ_KEY\x01{uniq}", queue_id=i % 2)
            resp = client.invoke(RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, f"good body {i}".encode()))
            assert resp.code == ResponseCode.SUCCESS, resp
            sent[uniq] = (int(resp.ext_fields["queueId"]), int(resp.ext_fields["queueOffset"]), f"good body {i}")
        got = {}
        for qid in (0, 1):
            resp = client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE,
                                                         pull_ext(topic="GoodTopic", group="GoodCG", queue_id=qid)))
            assert resp.code == ResponseCode.SUCCESS, resp
            pos = 0
            while pos < len(resp.body):
                phys = struct.unpack_from(">q", resp.body, pos + 28)[0]  # PHYSICALOFFSET
                rec = decode_record(resp.body, pos, phys)
                assert isinstance(rec, MessageRecord)
                got[rec.uniq_key] = (rec.queue_id, rec.queue_offset, rec.body.decode())
                pos += rec.total_size
        assert got == sent
        # the new topic reaches the name server: registration (re-done on every topic creation)
        # survived the fuzzing, so clients can still route to this broker
        deadline = time.monotonic() + 20
        while True:
            resp = client.invoke(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "GoodTopic"}),
                                 addr=cluster.namesrv)
            if resp.code == ResponseCode.SUCCESS:
                break
            assert time.monotonic() < deadline, f"GoodTopic never got a route: {resp.code} {resp.remark}"
            time.sleep(0.2)
    finally:
        client.close()
    assert_alive(cluster)


def test_nothing_invalid_was_written(cluster: Cluster) -> None:
    store = cluster.store
    assert set(os.listdir(cluster.tmp)) == cluster.tmp_listing, "something was written beside the store"
    real = store.resolve()
    for root, dirs, files in os.walk(store):
        for name in dirs + files:
            path = Path(root) / name
            assert not path.is_symlink(), path
            assert real in path.resolve().parents, f"{path} resolves outside the store"
    bad_dirs = [t for t in topic_dirs(store) if not valid_topic_name(t)]
    assert not bad_dirs, f"consume queue directories with invalid topic names: {bad_dirs}"
    cluster.broker.stop()
    assert cluster.broker.proc.returncode == 0
    assert not (store / ABORT_FILE).exists()
    topics = json.loads((store / "config" / "topics.json").read_text())["topicConfigTable"]
    bad_topics = [t for t in topics if not valid_topic_name(t)]
    assert not bad_topics, f"topics.json holds invalid topic names: {bad_topics}"
    report = verify_store(store, segment_size=SEGMENT)
    # A fuzzed SEND may say "compressed" (sysFlag bit 0) over a body that is not zlib. The broker
    # stores the body as sent, as Apache does; verify reports it, and that is the only finding allowed.
    structural = [f for f in report.findings if f.kind != fk.DECOMPRESSION_FAILED]
    assert not structural, report.summary() + "\n" + "\n".join(str(f) for f in structural[:20])
    log_ = CommitLog.open(store, SEGMENT)
    for f in report.findings:
        rec = log_.read_record(f.physical_offset)
        assert isinstance(rec, MessageRecord) and rec.sys_flag & COMPRESSED_FLAG, f
    # every bad request was refused by a check, not by an exception escaping a handler
    tracebacks = log_tracebacks(cluster.broker.log.read_text(errors="replace"))
    assert not tracebacks, f"{len(tracebacks)} tracebacks in {cluster.broker.log}:\n" + "\n\n".join(tracebacks[:3])


def log_tracebacks(text: str) -> list[str]:
    """Each traceback in a log that several processes write at once (other lines interleave)."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" not in line:
            continue
        block = [lines[i - 1] if i else "", line]
        for nxt in lines[i + 1:]:
            if re.match(r"\d{4}-\d\d-\d\d ", nxt):
                continue  # a log line of another process
            block.append(nxt)
            if nxt and not nxt[0].isspace():
                break  # the exception line ends the traceback
        out.append("\n".join(block))
    return out
