"""SQL92 message filtering (Apache 4.9's enablePropertyFilter): the selector language with its
Java type rules and null semantics, malformed expressions with their positions, the broker's pull
and CHECK_CLIENT_CONFIG handling in process, and our Python client against a real broker."""

from __future__ import annotations

import time

import pytest

from broker.client import Message, MQClientError, Producer, PullConsumer, PullStatus, PushConsumer
from broker.client.consumer import decode_records
from broker.remoting.bodies import (
    CheckClientRequestBody,
    ConsumeFromWhere,
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
)
from broker.remoting.codes import ExpressionType, PullSysFlag, RequestCode, ResponseCode
from broker.engine import MessageStore, StoreSettings
from broker.server import BrokerMetadata
from broker.server.filter.expressions import EvaluationError
from broker.server.filter.java_values import JInt, JLong, parse_double
from broker.server.filter.sql92 import SelectorError, compile_selector, parse, tokenize
from broker.server.processors import BrokerCore, Request
from broker.server.settings import BrokerSettings, settings_from_mapping, to_properties
from broker.store.config_files import TopicConfig
from broker.store.hosts import Host
from broker.store.message import MessageRecord
from broker.store.properties import encode_properties
from tests.store_harness import DispatchedStore
from tests.broker_harness import cluster

NOT_SUPPORTED = "The broker does not support consumer to filter message by SQL92"


def result(expression: str, props: dict[str, str]):
    """TRUE / FALSE / None (unknown), or "error" when Apache's evaluation throws (no match)."""
    try:
        return parse(expression).evaluate(props)
    except EvaluationError:
        return "error"


# ---- the language ------------------------------------------------------------------------------------
@pytest.mark.parametrize("expression, props, expected", [
    # IS [NOT] NULL
    ("seq IS NOT NULL", {"seq": "0"}, True),
    ("seq IS NOT NULL", {}, False),
    ("seq IS NULL", {}, True),
    ("seq is null", {"seq": ""}, False),
    # equality: strings, numbers converted with the literal's Java type
    ("b = 'x'", {"b": "x"}, True),
    ("b = 'x'", {"b": "X"}, False),
    ("b <> 'x'", {"b": "y"}, True),
    ("s = 'it''s'", {"s": "it's"}, True),
    ("a = 5", {"a": "5"}, True),
    ("a = 5", {"a": "+5"}, True),
    ("a = 5", {"a": "5.0"}, "error"),  # Integer.valueOf("5.0") throws
    ("a = 5.0", {"a": "5"}, True),  # Double.valueOf("5")
    ("a = 5", {"a": "abc"}, "error"),
    ("a = 3000000000", {"a": "3000000000"}, True),  # a Long literal
    ("a = 5", {"a": "3000000000"}, "error"),  # Integer overflow
    ("a = -5", {"a": "-5"}, True),
    ("a = 5L", {"a": "5"}, True),
    ("f = TRUE", {"f": "true"}, True),
    ("f = TRUE", {"f": "TRUE"}, True),
    ("f = TRUE", {"f": "yes"}, False),
    ("a = b", {"a": "1", "b": "1"}, True),
    ("a = b", {}, True),  # two missing properties are equal
    # null on one side: unknown on the left, FALSE on the right (Apache's asymmetry)
    ("a = 'x'", {}, None),
    ("'x' = a", {}, False),
    ("a <> 'x'", {}, None),
    # ordering: numbers only; two strings compare as doubles
    ("a > 5", {"a": "7"}, True),
    ("a > 5", {"a": "5"}, False),
    ("a >= 5", {"a": "5"}, True),
    ("a < 5", {"a": "-7"}, True),
    ("a <= 5", {"a": "6"}, False),
    ("a > 5", {"a": "7.5"}, "error"),  # Integer.valueOf
    ("a > 5.0", {"a": "7.5"}, True),
    ("a > 5.0", {"a": " 7.5 "}, True),  # Double.valueOf trims blanks
    ("a > 5.0", {"a": "7.5f"}, True),  # and takes a float suffix
    ("a > 1E3", {"a": "1001"}, True),
    ("a > .5", {"a": "0.6"}, True),
    ("a > 5", {}, None),
    ("a > b", {"a": "10", "b": "9"}, True),  # string vs string: as doubles, not text
    ("a > b", {"a": "x", "b": "9"}, "error"),
    ("a > -b", {"a": "1", "b": "2"}, None),  # negating a string gives null
    # BETWEEN / NOT BETWEEN
    ("a BETWEEN 1 AND 3", {"a": "1"}, True),
    ("a BETWEEN 1 AND 3", {"a": "3"}, True),
    ("a BETWEEN 1 AND 3", {"a": "4"}, False),
    ("a BETWEEN 1 AND 3", {}, None),
    ("a NOT BETWEEN 1 AND 3", {"a": "4"}, True),
    ("a NOT BETWEEN 1 AND 3", {"a": "2"}, False),
    ("a BETWEEN -3 AND -1", {"a": "-2"}, True),
    ("a BETWEEN 1 AND 3 AND b = 'x'", {"a": "2", "b": "x"}, True),
    # IN / NOT IN
    ("TAGS IN ('TagA', 'TagB')", {"TAGS": "TagB"}, True),
    ("TAGS IN ('TagA', 'TagB')", {"TAGS": "TagC"}, False),
    ("TAGS NOT IN ('TagA', 'TagB')", {"TAGS": "TagC"}, True),
    ("TAGS NOT IN ('TagA')", {}, None),
    ("a IN ('1', '2', '3', '4', '5', '6')", {"a": "6"}, True),
    # three-valued AND / OR / NOT
    ("a = 1 AND b = 2", {"a": "1", "b": "2"}, True),
    ("a = 1 AND b = 2", {"a": "1"}, None),
    ("a = 1 AND b = 2", {"b": "3"}, False),
    ("a = 1 OR b = 2", {"b": "2"}, True),
    ("a = 1 OR b = 2", {"b": "3"}, None),
    ("a = 1 OR b = 2", {"a": "0", "b": "3"}, False),
    ("NOT (a = 1)", {"a": "2"}, True),
    ("NOT (a = 1)", {}, None),
    ("a = 1 OR b = 2 AND c = 3", {"a": "1"}, True),  # AND binds tighter than OR
    ("(a = 1 OR b = 2) AND c = 3", {"a": "1"}, None),
    ("a = 1 OR b = 'x'", {"a": "one", "b": "x"}, "error"),  # an error anywhere fails the whole selector
    # NOT binds tighter than comparisons: (NOT a) = 1, and a bare property is FALSE
    ("NOT a = 1", {"a": "1"}, False),
    ("a", {"a": "true"}, False),
    ("a", {}, None),
    ("NOT a", {"a": "x"}, True),
    # constants, keywords in any case, comments
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NULL", {}, None),
    ("a = 1 aNd B = 2", {"a": "1", "B": "2"}, True),
    ("A = 1", {"a": "1"}, None),  # property names are case-sensitive
    ("-- first line\na = 1", {"a": "1"}, True),
    ("a /* inline */ = 1", {"a": "1"}, True),
    ("+a = 1", {"a": "1"}, True),
])
def test_evaluation(expression, props, expected):
    assert result(expression, props) == expected
    assert parse(expression).matches(props) is (expected is True)


def test_literal_types_and_java_conversions():
    assert type(parse("a = 2147483647").root.right.value) is JInt
    assert type(parse("a = 2147483648").root.right.value) is JLong
    assert type(parse("a = 7L").root.right.value) is JInt  # Apache narrows a long that fits, even with L
    assert parse("a = 1.5").root.right.value == 1.5
    assert (parse_double("0x1.8p1"), parse_double("-Infinity"), parse_double("2d")) == (3.0, float("-inf"), 2.0)
    with pytest.raises(EvaluationError, match='For input string: "1,5"'):
        parse_double("1,5")


def test_tokens_and_cache():
    assert [(t.kind, t.text, t.line, t.column) for t in tokenize("a<>'x''y'\n AND b>=1.5e3 -- c\r\nOR $c_1 IN")] == [
        ("ID", "a", 1, 1), ("OP", "<>", 1, 2), ("STRING", "'x''y'", 1, 4), ("KEYWORD", "AND", 2, 2),
        ("ID", "b", 2, 6), ("OP", ">=", 2, 7), ("FLOAT", "1.5e3", 2, 9), ("KEYWORD", "OR", 3, 1),
        ("ID", "$c_1", 3, 4), ("KEYWORD", "IN", 3, 9), ("EOF", "", 3, 11)]
    assert compile_selector("x > 1") is compile_selector("x > 1")
    with pytest.raises(SelectorError) as first:
        compile_selector("x >")
    with pytest.raises(SelectorError) as second:
        compile_selector("x >")
    assert str(first.value) == str(second.value)


def test_long_chains_evaluate_and_deep_nesting_is_a_clear_error():
    chain = parse(" AND ".join(f"p{i} = {i}" for i in range(3000)))  # Apache nests these 3000 levels deep
    props = {f"p{i}": str(i) for i in range(3000)}
    assert chain.evaluate(props) is True
    assert chain.evaluate({**props, "p2999": "0"}) is False
    assert chain.evaluate({k: v for k, v in props.items() if k != "p1500"}) is None
    assert parse(" OR ".join(["a = 2"] * 3000) + " OR a = 1").evaluate({"a": "1"}) is True
    assert parse("(" * 100 + "a = 1" + ")" * 100).evaluate({"a": "1"}) is True
    with pytest.raises(SelectorError) as err:
        parse("(" * 101 + "a = 1" + ")" * 101)
    assert (err.value.detail, err.value.column) == (
        "the expression nests more than 100 parentheses or prefix operators (at line 1, column 102)", 102)
    with pytest.raises(SelectorError, match="nests more than 100"):
        parse("NOT " * 101 + "a")


@pytest.mark.parametrize("expression, message, line, column", [
    ("a >", 'Encountered <EOF> at line 1, column 4. Was expecting a literal, a property name, "(", "+", "-" or NOT.',
     1, 4),
    ("a = 1 b", 'Encountered "b" at line 1, column 7. Was expecting one of AND, OR, "=", "<>", ">", ">=", "<", "<=", '
                "BETWEEN, IN, IS or the end.", 1, 7),
    ("a = 1 AND\n  (b = 2", 'Encountered <EOF> at line 2, column 9. Was expecting an operator or ")".', 2, 9),
    ("a IS 5", 'Encountered "5" at line 1, column 6. Was expecting NULL or NOT NULL after IS.', 1, 6),
    ("a IS NOT 5", 'Encountered "5" at line 1, column 10. Was expecting NULL after IS NOT.', 1, 10),
    ("a BETWEEN 1 OR 2", 'Encountered "OR" at line 1, column 13. Was expecting AND between the bounds of BETWEEN.',
     1, 13),
    ("a IN (1, 2)", 'Encountered "1" at line 1, column 7. Was expecting a string literal (IN lists hold quoted '
                    "strings only).", 1, 7),
    ("a IN ('x' 'y')", 'Encountered "\'y\'" at line 1, column 11. Was expecting "," or ")" in the IN list.', 1, 11),
    ("a = 'x", "Lexical error at line 1, column 5: the string literal is not closed with a single quote", 1, 5),
    ("a != 1", 'Lexical error at line 1, column 3: unexpected character "!" (U+0021)', 1, 3),
    ("a.b = 1", 'Lexical error at line 1, column 2: unexpected character "." (U+002E)', 1, 2),
    ("a = 1 /* open", "Lexical error at line 1, column 7: the comment is not closed", 1, 7),
    ("", "the expression is empty", 1, 1),
    # well-formed but refused while building, as Apache does
    ("a = NULL", "'NULL' cannot be compared. (at line 1, column 3)", 1, 3),
    ("TRUE = 1", "'TRUE' cannot be compared with '1' (at line 1, column 6)", 1, 6),
    ("a > 'x'", "Value ''x'' cannot be compared. (at line 1, column 3)", 1, 3),
    ("a > TRUE", "Value 'TRUE' cannot be compared. (at line 1, column 3)", 1, 3),
    ("(a > 1) > 2", "Value '(a > 1)' cannot be compared. (at line 1, column 9)", 1, 9),
    ("(a = 1 AND b = 2 OR c = 3) > 5", "Value '(((a == 1) && (b == 2)) || (c == 3))' cannot be compared. "
                                       "(at line 1, column 28)", 1, 28),
    ("a BETWEEN 5 AND 1", "Illegal values of between, left value(5) must less than or equal to right value(1) "
                          "(at line 1, column 3)", 1, 3),
    ("a BETWEEN 'a' AND 'b'", "Value ''a'' cannot be compared. (at line 1, column 3)", 1, 3),
    ("'x' IN ('x')", "Expected a property for In expression, got: 'x' (at line 1, column 5)", 1, 5),
    ("5", "Expression will not result in a boolean value: 5 (at line 1, column 1)", 1, 1),
    ("a = 1 AND 'x'", "Expression will not result in a boolean value: 'x' (at line 1, column 11)", 1, 11),
    ("NOT 5", "Expression will not result in a boolean value: 5 (at line 1, column 5)", 1, 5),
    ("a > 0.0", "0.0 is less than 4.9E-324 (at line 1, column 5)", 1, 5),
    ("a > 1e999", "1e999 is greater than 1.7976931348623157E308 (at line 1, column 5)", 1, 5),
    ("a > 9223372036854775808", 'For input string: "9223372036854775808" (beyond a 64-bit long) '
                                "(at line 1, column 5)", 1, 5),
])
def test_malformed_expressions_name_the_fault_and_its_position(expression, message, line, column):
    with pytest.raises(SelectorError) as err:
        parse(expression)
    assert (err.value.detail, err.value.line, err.value.column) == (message, line, column)
    assert str(err.value) == f"Invalid MessageSelector. {message}"


# ---- the broker, in process --------------------------------------------------------------------------
ROWS = [  # queue offset i: properties of message i in topic "Props"
    {"seq": "0", "a": "1", "b": "x"},
    {"a": "7", "b": "x"},
    {"seq": "2", "a": "9", "b": "y"},
    {"a": "6", "b": "x"},
    {"seq": "4"},
    {"a": "2", "b": "x"},
    {"seq": "6", "a": "8", "b": "x"},
    {"a": "abc", "b": "x"},
]


def _record(topic: str, props: dict[str, str], queue_id: int = 0) -> MessageRecord:
    return MessageRecord(topic=topic, body=b"body", properties_raw=encode_properties(props), queue_id=queue_id,
                         born_timestamp=1, born_host=Host(bytes([10, 0, 0, 1]), 5000))


@pytest.fixture
def store(tmp_path):
    """The rows put to ``Props``, dispatched by the store's dispatcher process (as in the broker)."""
    ms = DispatchedStore(tmp_path / "store", StoreSettings(segment_bytes=1 << 16, cq_file_bytes=20 * 64,
                                                           index_slots=64, index_entries=256, fsync_metadata=False))
    ms.open()
    for i, row in enumerate(ROWS):
        ms.put_message(_record("Props", {**row, "TAGS": "TagA" if i % 2 else "TagB"}))
    ms.caught_up()
    yield ms
    ms.close()


@pytest.fixture
def metadata(store):
    meta = BrokerMetadata(store)
    meta.topics.put(TopicConfig("Props", 1, 1))
    yield meta
    meta.close()


def _core(store: MessageStore, metadata: BrokerMetadata, enabled: bool = True) -> BrokerCore:
    return BrokerCore(store, metadata, cluster_name="DefaultCluster", broker_name="broker-a",
                      broker_addr="127.0.0.1:10911", max_message_size=4 << 20,
                      settings=BrokerSettings(enable_property_filter=enabled))


def _pull(core: BrokerCore, expression: str | None, offset: int = 0, *, topic: str = "Props", group: str = "G",
          expression_type: str = "SQL92", max_nums: int = 32):
    """A pull that carries its subscription (expression None: rely on the heartbeat's)."""
    ext = {"consumerGroup": group, "topic": topic, "queueId": "0", "queueOffset": str(offset),
           "maxMsgNums": str(max_nums), "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0",
           "subVersion": "0"}
    if expression is not None:
        ext.update(sysFlag=str(int(PullSysFlag.SUBSCRIPTION)), subscription=expression, expressionType=expression_type)
    reply = core.process(Request(code=RequestCode.PULL_MESSAGE, ext=ext, channel=("h", 1)))
    offsets = [m.queue_offset for m in decode_records(reply.body)] if reply.body else []
    return reply.code, reply.ext.get("nextBeginOffset"), offsets, reply.remark


def _heartbeat(core: BrokerCore, group: str, *subs: SubscriptionData) -> None:
    body = HeartbeatData("10.0.0.1@1", consumers=[ConsumerData(group, subscriptions=list(subs))]).encode()
    assert core.process(Request(code=RequestCode.HEART_BEAT, ext={}, body=body, channel=("h", 1))).code == 0


def _check(core: BrokerCore, expression: str, expression_type: str = "SQL92"):
    body = CheckClientRequestBody("10.0.0.1@1", "G", SubscriptionData("Props", expression,
                                                                       expression_type=expression_type)).encode()
    reply = core.process(Request(code=RequestCode.CHECK_CLIENT_CONFIG, ext={}, body=body, channel=("h", 1)))
    return reply.code, reply.remark


def test_pull_returns_only_matching_messages_and_moves_past_the_rest(store, metadata):
    core = _core(store, metadata)
    assert _pull(core, "seq IS NOT NULL") == (0, "8", [0, 2, 4, 6], "FOUND")
    assert _pull(core, "a > 5 AND b = 'x'") == (0, "8", [1, 3, 6], "FOUND")  # offset 7's "abc" fails to convert
    assert _pull(core, "TAGS = 'TagA' AND a IS NOT NULL") == (0, "8", [1, 3, 5, 7], "FOUND")
    # a full batch stops after its last message: the next pull starts right after it
    assert _pull(core, "seq IS NOT NULL", max_nums=2) == (0, "3", [0, 2], "FOUND")
    assert _pull(core, "seq IS NOT NULL", 3, max_nums=2) == (0, "7", [4, 6], "FOUND")
    # nothing left that matches: PULL_RETRY_IMMEDIATELY, and the offset still moves to the end
    assert _pull(core, "seq IS NOT NULL", 7) == (ResponseCode.PULL_RETRY_IMMEDIATELY, "8", [], "NO_MATCHED_MESSAGE")
    assert _pull(core, "nosuch = 1") == (ResponseCode.PULL_RETRY_IMMEDIATELY, "8", [], "NO_MATCHED_MESSAGE")
    assert _pull(core, "seq IS NOT NULL", 8)[:3] == (ResponseCode.PULL_NOT_FOUND, "8", [])
    # tag subscriptions are unchanged
    assert _pull(core, "TagA || TagB", expression_type="TAG")[2] == list(range(8))
    assert _pull(core, "TagA", expression_type="TAG")[2] == [1, 3, 5, 7]
    assert _pull(core, "*", expression_type="TAG")[2] == list(range(8))
    assert _pull(core, "TagB", expression_type="")[2] == [0, 2, 4, 6]


def test_heartbeat_subscription_filters_pulls_without_one(store, metadata):
    core = _core(store, metadata)
    _heartbeat(core, "G", SubscriptionData("Props", "a BETWEEN 2 AND 7", expression_type="SQL92"))
    assert _pull(core, None) == (0, "8", [1, 3, 5], "FOUND")
    _heartbeat(core, "G", SubscriptionData("Props", "a NOT IN ('1', '2')", expression_type="SQL92"))
    assert _pull(core, None)[2] == [1, 2, 3, 6, 7]
    _heartbeat(core, "G", SubscriptionData("Props", "TagA", expression_type="TAG"))
    assert _pull(core, None)[2] == [1, 3, 5, 7]


def test_malformed_expressions_are_refused_never_no_match(store, metadata):
    core = _core(store, metadata)
    detail = "Invalid MessageSelector. Encountered <EOF> at line 1, column 4. Was expecting a literal, a property " \
             'name, "(", "+", "-" or NOT.'
    assert _check(core, "a >") == (ResponseCode.SUBSCRIPTION_PARSE_FAILED, detail)
    assert _pull(core, "a >") == (ResponseCode.SUBSCRIPTION_PARSE_FAILED, None, [],
                                  f"parse the consumer's subscription failed: {detail}")
    _heartbeat(core, "G", SubscriptionData("Props", "a >", expression_type="SQL92"))
    assert _pull(core, None) == (
        ResponseCode.FILTER_DATA_NOT_EXIST, None, [],
        f"The broker's consumer filter data is not exist!Your expression may be wrong! {detail}")
    assert _check(core, "x > 1", "JAVA") == (
        ResponseCode.SUBSCRIPTION_PARSE_FAILED,
        "expression type JAVA is not supported: the broker filters by TAG or SQL92")
    assert _check(core, "seq IS NOT NULL") == (ResponseCode.SUCCESS, None)
    assert _check(core, "a >", "TAG") == (ResponseCode.SUCCESS, None)  # a tag list is not parsed as SQL
    assert metadata.query_consumer_offset("G", "Props", 0, False) is None  # nothing moved


def test_switch_off_refuses_sql92_as_apache(store, metadata):
    core = _core(store, metadata, enabled=False)
    assert _check(core, "seq IS NOT NULL") == (ResponseCode.SYSTEM_ERROR, NOT_SUPPORTED)
    assert _check(core, "a >") == (ResponseCode.SYSTEM_ERROR, NOT_SUPPORTED)
    assert _pull(core, "seq IS NOT NULL") == (ResponseCode.SYSTEM_ERROR, None, [], NOT_SUPPORTED)
    _heartbeat(core, "G", SubscriptionData("Props", "seq IS NOT NULL", expression_type="SQL92"))
    assert _pull(core, None) == (ResponseCode.SYSTEM_ERROR, None, [], NOT_SUPPORTED)
    assert _check(core, "TagA", "TAG") == (ResponseCode.SUCCESS, None)
    assert _pull(core, "TagA", expression_type="TAG")[2] == [1, 3, 5, 7]
    assert core.process(Request(code=RequestCode.CHECK_CLIENT_CONFIG, ext={}, body=b"{", channel=("h", 1))).code \
        == ResponseCode.SYSTEM_ERROR  # a broken body is the client's error, not a crash


def test_retry_topic_uses_the_groups_subscription_to_the_original_topic(store, metadata):
    core = _core(store, metadata)
    metadata.topics.put(TopicConfig("%RETRY%G", 1, 1))
    retried = [("Props", {"a": "9"}), ("Props", {"a": "1"}), ("Other", {"a": "1"}), ("Props", {}),
               ("Unknown", {"a": "1"}), ("Props", {"a": "6", "b": "x"})]
    for real, props in retried:
        store.put_message(_record("%RETRY%G", {**props, "RETRY_TOPIC": real}))
    store.caught_up()
    _heartbeat(core, "G", SubscriptionData("%RETRY%G", "*"),
               SubscriptionData("Props", "a > 5", expression_type="SQL92"),
               SubscriptionData("Other", "TagZ"))
    # Props retries obey "a > 5"; a TAG-subscribed or unknown original topic lets its retries through
    assert _pull(core, "*", topic="%RETRY%G", expression_type="TAG") == (0, "6", [0, 2, 4, 5], "FOUND")
    assert _pull(core, None, topic="%RETRY%G") == (0, "6", [0, 2, 4, 5], "FOUND")
    assert _pull(core, "*", 1, topic="%RETRY%G", expression_type="TAG", max_nums=1) == (0, "3", [2], "FOUND")
    # with the switch off the broker evaluates no SQL92: every retry is delivered
    off = _core(store, metadata, enabled=False)
    assert _pull(off, "*", topic="%RETRY%G", expression_type="TAG")[2] == list(range(6))


def test_enable_property_filter_setting():
    assert BrokerSettings().enable_property_filter is False  # Apache's default
    assert settings_from_mapping({"enablePropertyFilter": "true"}).enable_property_filter is True
    assert "enablePropertyFilter=false\n" in to_properties(BrokerSettings())  # GET_BROKER_CONFIG shows it


# ---- a real broker and our client -------------------------------------------------------------------
@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("sql92"), {"enablePropertyFilter": True}) as b:
        yield b


def _wait(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_python_client_subscribes_by_sql92(broker):
    rows = [{"seq": str(i)} if i % 3 == 0 else {"a": str(i), "b": "x" if i % 2 else "y"} for i in range(24)]
    with Producer("PG_SQL", broker.namesrv) as producer:
        for i, props in enumerate(rows):
            producer.send(Message("SqlTopic", f"m{i}".encode(), properties={**props, "i": str(i)}))
    want_seq = sorted(i for i, r in enumerate(rows) if "seq" in r)
    want_ab = sorted(i for i, r in enumerate(rows) if "a" in r and int(r["a"]) > 5 and r["b"] == "x")
    assert want_ab == [7, 11, 13, 17, 19, 23]

    with PullConsumer("CG_SQL_PULL", broker.namesrv) as consumer:
        # acknowledged sends reach the consume queues a moment later (the dispatcher process)
        _wait(lambda: sum(consumer.max_offset(mq) for mq in consumer.queues("SqlTopic")) == len(rows),
              "every send to be dispatched")
        got, nexts = [], []
        for mq in consumer.queues("SqlTopic"):
            res = consumer.pull(mq, 0, 32, "a > 5 AND b = 'x'", expression_type=ExpressionType.SQL92)
            assert res.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG)
            got += [int(m.properties["i"]) for m in res.messages]
            nexts.append((res.next_begin_offset, consumer.max_offset(mq)))
        assert sorted(got) == want_ab
        assert all(n == hi for n, hi in nexts)  # every queue scanned to its end in one pull
        with pytest.raises(MQClientError) as err:
            consumer.pull(consumer.queues("SqlTopic")[0], 0, 32, "a > > 5", expression_type=ExpressionType.SQL92)
        assert err.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert 'Encountered ">" at line 1, column 5' in str(err.value)

    seen: list[int] = []
    push = PushConsumer("CG_SQL_PUSH", broker.namesrv, lambda m: seen.append(int(m.properties["i"])),
                        topic="SqlTopic", expression="seq IS NOT NULL", expression_type=ExpressionType.SQL92,
                        consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    push.start()
    try:
        queues = push.queues("SqlTopic")
        ends = {mq: push.max_offset(mq) for mq in queues}
        _wait(lambda: len(seen) >= len(want_seq) and all(push._offsets.get(mq) == end for mq, end in ends.items()),
              "the push consumer to scan every queue")
    finally:
        push.shutdown()
    assert sorted(seen) == want_seq

    bad = PushConsumer("CG_SQL_BAD", broker.namesrv, lambda m: None, topic="SqlTopic", expression="seq IS",
                       expression_type=ExpressionType.SQL92)
    with pytest.raises(MQClientError) as err:
        bad.start()
    assert err.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert str(err.value) == ("CODE: 23  DESC: Invalid MessageSelector. Encountered <EOF> at line 1, column 7. "
                              "Was expecting NULL or NOT NULL after IS.")
