"""Numbers of the RocketMQ remoting protocol (remoting-protocol.md sections 2, 5, 6 and 9.1).

Kept as ``IntEnum`` so a log line can say ``GET_ROUTEINFO_BY_TOPIC`` instead of ``105`` while the
wire still carries plain integers; codes we have never heard of stay plain ints everywhere (a
request we do not know must still be answered with REQUEST_CODE_NOT_SUPPORTED, not crash a lookup).
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class RequestCode(IntEnum):
    """``org.apache.rocketmq.remoting.protocol.RequestCode`` — every code of section 5."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    GET_CLIENT_CONFIG = 47
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    REGISTER_TOPIC_IN_NAMESRV = 217
    GET_KVLIST_BY_NAMESPACE = 219
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    QUERY_CONSUME_TIME_SPAN = 303
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    CLONE_GROUP_OFFSET = 314
    SEND_MESSAGE_V2 = 310
    VIEW_BROKER_STATS_DATA = 315
    GET_BROKER_CONSUME_STATS = 317
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    ADD_WRITE_PERM_OF_BROKER = 327
    GET_TOPIC_CONFIG = 351
    GET_SUBSCRIPTIONGROUP_CONFIG = 352
    LITE_PULL_MESSAGE = 361
    QUERY_ASSIGNMENT = 400
    SET_MESSAGE_REQUEST_MODE = 401
    GET_ALL_MESSAGE_REQUEST_MODE = 402
    BROKER_HEARTBEAT = 904
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    PEEK_MESSAGE = 200052
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    NOTIFICATION = 200054
    POLLING_INFO = 200055
    BATCH_ACK_MESSAGE = 200151


class ResponseCode(IntEnum):
    """``ResponseCode`` + ``RemotingSysResponseCode`` — every code of section 6."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202  # sic, Java's spelling
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    BROKER_NOT_EXIST = 211
    BROKER_DISPATCH_NOT_COMPLETE = 212
    BROADCAST_CONSUMPTION = 213
    FLOW_CONTROL = 215
    NOT_LEADER_FOR_QUEUE = 501
    ILLEGAL_OPERATION = 604
    GO_AWAY = 1500
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_NOT_LEADER = 2007
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
    CONTROLLER_BROKER_ID_INVALID = 2014
    CONTROLLER_JRAFT_INTERNAL_ERROR = 2015
    CONTROLLER_BROKER_LIVE_INFO_NOT_EXISTS = 2016
    USER_NOT_EXIST = 3001
    POLICY_NOT_EXIST = 3002
    # client-side only: never sent on the wire, used to report local failures
    RPC_UNKNOWN = -1000
    RPC_ADDR_IS_NULL = -1002
    RPC_SEND_TO_CHANNEL_FAILED = -1004
    RPC_TIME_OUT = -1006


class LanguageCode(IntEnum):
    """``LanguageCode``: the JSON header carries the *name*, the binary header the byte value."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13


class PullSysFlag(IntFlag):
    """``sysFlag`` of PULL_MESSAGE (section 9.1)."""

    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL_MESSAGE = 0x10


class ExpressionType:
    """``expressionType`` of a subscription (``org.apache.rocketmq.common.filter.ExpressionType``)."""

    TAG = "TAG"
    SQL92 = "SQL92"


class PermName(IntFlag):
    """Topic / broker permission bits (section 9.1). Normal topics have 6, ``TBW102`` 7."""

    INHERIT = 0x1
    WRITE = 0x2
    READ = 0x4
    PRIORITY = 0x8


def is_readable(perm: int) -> bool:
    return bool(perm & PermName.READ)


def is_writeable(perm: int) -> bool:
    return bool(perm & PermName.WRITE)


def is_inherited(perm: int) -> bool:
    return bool(perm & PermName.INHERIT)


def perm_to_string(perm: int) -> str:
    """Java ``PermName.perm2String``: 6 -> ``RW-`` (read, write, inherit)."""
    return ("R" if is_readable(perm) else "-") + ("W" if is_writeable(perm) else "-") + \
        ("X" if is_inherited(perm) else "-")


class Version(IntEnum):
    """Ordinals of Java's ``MQVersion.Version`` that change server behaviour (section 2)."""

    V3_0_7_SNAPSHOT = 28  # clients at or above take RESET_CONSUMER_CLIENT_OFFSET and GET_CONSUMER_STATUS
    V3_0_11 = 37  # REGISTER_BROKER body becomes RegisterBrokerBody (with filter servers)
    V3_1_8_SNAPSHOT = 62  # clients at or above answer GET_CONSUMER_RUNNING_INFO / CONSUME_MESSAGE_DIRECTLY
    V3_1_8 = 63  # what the C++ client in the rocketmq==0.4.4 wheel sends
    V3_4_9 = 121  # threshold for honouring a send-back's maxReconsumeTimes
    V4_9_4 = 401  # threshold for the name server answering routes in standard JSON
    V4_9_8 = 409
    V5_0_0 = 413
    V5_3_3 = 479  # Java's CURRENT_VERSION at the time of writing


MASTER_ID = 0  # brokerId of a master (MixAll.MASTER_ID)
DEFAULT_VERSION = int(Version.V4_9_4)  # what we send: new enough for standard-JSON routes


def request_code_name(code: int) -> str:
    """``SEND_MESSAGE(10)``-style label for logs; unknown codes just print their number."""
    try:
        return f"{RequestCode(code).name}({code})"
    except ValueError:
        return str(code)


def version_desc(version: int) -> str:
    """Java's ``MQVersion.getVersionDesc`` for the versions named here; others print their number."""
    try:
        return Version(version).name
    except ValueError:
        return str(version)


def response_code_name(code: int) -> str:
    try:
        return f"{ResponseCode(code).name}({code})"
    except ValueError:
        return str(code)
