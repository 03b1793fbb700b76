"""The ACL's pieces on their own: signature, whitelist forms, plain_acl.yml errors, permission
resolution in Apache's order, and the gate's reload. The live broker is in test_acl.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging

import pytest

from broker.acl.config import AclRules, acl_file_location, load_rules, parse_rules
from broker.acl.errors import AclConfigError, AclDenied
from broker.acl.gate import AclGate
from broker.acl.permission import ADMIN_CODES, ANY, DENY, PUB, SUB, check_permission, parse_perm
from broker.acl.remote_address import AddressPatternError, host_of, parse_pattern
from broker.acl.signature import SessionCredentials, sign, signed_content
from broker.acl.validator import AccessRequest, validate
from broker.remoting.bodies import ConsumerData, HeartbeatData, SubscriptionData
from broker.remoting.codes import RequestCode

AK, SK = "rl_tester", "tester-secret"


def expected_signature(ext: dict[str, str], body: bytes, secret: str) -> str:
    """Written out here, independently of broker.acl: values sorted by key, no Signature, then the body."""
    text = "".join(value for key, value in sorted(ext.items()) if key != "Signature")
    mac = hmac.new(secret.encode("utf-8"), text.encode("utf-8") + body, hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


# ---- signature ---------------------------------------------------------------------------------------
def test_signature_matches_an_independent_computation():
    ext = {"topic": "TopicA", "queueId": "3", "OnsChannel": "ALIYUN", "b": "ü-text", "AccessKey": AK,
           "Signature": "stale"}
    body = b"\x00\x01body bytes\xff"
    assert sign(signed_content(ext, body), SK) == expected_signature(ext, body, SK)
    signed = dict(ext)
    SessionCredentials(AK, SK).sign_ext(signed, body)
    assert signed["AccessKey"] == AK and "SecurityToken" not in signed
    assert signed["Signature"] == expected_signature({k: v for k, v in ext.items() if k != "Signature"}, body, SK)


def test_security_token_is_signed_too():
    ext = {"topic": "T"}
    SessionCredentials(AK, SK, "token-1").sign_ext(ext, b"")
    assert ext["SecurityToken"] == "token-1"
    assert ext["Signature"] == expected_signature({"topic": "T", "AccessKey": AK, "SecurityToken": "token-1"},
                                                  b"", SK)


def test_credentials_never_print_the_secret():
    assert SK not in repr(SessionCredentials(AK, SK))
    with pytest.raises(ValueError, match="both an access key and a secret key"):
        SessionCredentials(AK, "")


# ---- permissions -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, perm", [("PUB", PUB), ("SUB", SUB), (" PUB|SUB ", PUB | SUB), ("SUB|PUB", PUB | SUB),
                                        ("DENY", DENY), ("pub", None), ("PUB | SUB", None), ("", None)])
def test_permission_words(text, perm):
    assert parse_perm(text) == perm


@pytest.mark.parametrize("needed, owned, ok", [(PUB, PUB, True), (PUB, SUB, False), (SUB, PUB | SUB, True),
                                               (PUB, PUB | DENY, False), (ANY, SUB, True), (ANY, PUB, True),
                                               (ANY, DENY, False), (SUB, DENY, False)])
def test_check_permission(needed, owned, ok):
    assert check_permission(needed, owned) is ok


def test_admin_codes_are_apaches():
    assert ADMIN_CODES == {17, 25, 215, 200, 207}


# ---- whitelist forms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern, host, ok", [
    ("*", "10.1.2.3", True), ("*.*.*.*", "10.1.2.3", True), ("", "127.0.0.1", False), (None, "127.0.0.1", False),
    ("127.0.0.1", "127.0.0.1", True), ("127.0.0.1", "127.0.0.2", False),
    ("10.0.0.1,10.0.0.2", "10.0.0.2", True), ("10.0.0.1,10.0.0.2", "10.0.0.3", False),
    ("192.168.1.{1,2}", "192.168.1.2", True), ("192.168.1.{1,2}", "192.168.1.3", False),
    ("192.168.*.*", "192.168.77.1", True), ("192.168.*.*", "192.169.0.1", False),
    ("192.*.*.*", "192.0.0.1", True), ("192.168.1.*", "192.168.10.1", False),
    ("192.168.1.1-200", "192.168.1.200", True), ("192.168.1.1-200", "192.168.1.201", False),
    ("192.168.1.1-200", "192.168.1.0", False), ("192.168.10-20.*", "192.168.15.9", True),
    ("192.168.10-20.*", "192.168.21.9", False),
    ("::1", "0:0:0:0:0:0:0:1", True), ("::1", "::2", False), ("1::{a,b}", "1:0:0:0:0:0:0:b", True),
    ("1050::5:600:300c:*", "1050:0:0:0:5:600:300c:beef", True), ("1050::5:600:300c:*", "1050::5:600:300d:1", False),
    ("2::ac5:78:1-200:*", "2::ac5:78:1ff:9", True), ("2::ac5:78:1-200:*", "2::ac5:78:201:9", False),
    ("192.168.*.*", "::1", False),
])
def test_whitelist_forms(pattern, host, ok):
    assert parse_pattern(pattern).matches(host) is ok


@pytest.mark.parametrize("pattern, message", [
    ("192.168.*", "four groups"), ("localhost", "not an IP address"), ("1-2.3.4.5", "no group"),
    ("192.168.1.300-400", "0..255"), ("192.168.1.9-3", "start <= end"), ("1::*:2", "'\\*' may only be the last"),
    ("192.168.1.{x,y}", "'192.168.1.x'"), ("10.0.0.1,nohost", "'nohost'"), ("192.168.1.-5", "start-end"),
])
def test_bad_whitelist_patterns(pattern, message):
    with pytest.raises(AddressPatternError, match=message):
        parse_pattern(pattern)


@pytest.mark.parametrize("peer, host", [("127.0.0.1:5000", "127.0.0.1"), ("[::1]:5000", "::1"), ("10.0.0.1", "10.0.0.1")])
def test_host_of_peer(peer, host):
    assert host_of(peer) == host


# ---- plain_acl.yml -----------------------------------------------------------------------------------
GOOD = f"""
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: {AK}
    secretKey: {SK}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
  - accessKey: rl_admin_key
    secretKey: admin-secret
    whiteRemoteAddress: 192.168.0.*
    admin: true
"""


def test_load_good_file(tmp_path):
    f = tmp_path / "plain_acl.yml"
    f.write_text(GOOD)
    rules = load_rules(f)
    assert sorted(rules.accounts) == ["rl_admin_key", AK]
    acc = rules.accounts[AK]
    assert (acc.admin, acc.default_topic_perm, acc.default_group_perm) == (False, DENY, SUB)
    assert acc.perms == {"topicA": DENY, "topicB": PUB | SUB, "topicC": SUB, "%RETRY%groupA": DENY,
                         "%RETRY%groupB": PUB | SUB}
    admin = rules.accounts["rl_admin_key"]
    assert admin.admin and admin.default_topic_perm == DENY and admin.perms == {}
    assert rules.global_white[0].matches("10.10.103.7") and not rules.global_white[0].matches("10.10.104.7")


@pytest.mark.parametrize("text, message", [
    ("accounts:\n  - secretKey: 12345678\n", "accounts\\[0\\].accessKey is missing"),
    ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", "accounts\\[0\\].accessKey 'short' must be longer"),
    ("accounts:\n  - accessKey: rl_tester\n    secretKey: 123456\n", "accounts\\[0\\].secretKey must be longer"),
    ("accounts:\n  - accessKey: rl_tester\n    secretKey: 1234567\n    defaultTopicPerm: PUBSUB\n",
     "accounts\\[0\\].defaultTopicPerm: 'PUBSUB' is not a permission"),
    ("accounts:\n  - accessKey: rl_tester\n    secretKey: 1234567\n    topicPerms: [topicA]\n",
     "accounts\\[0\\].topicPerms\\[0\\]: 'topicA' is not name=PERM"),
    ("accounts:\n  - accessKey: rl_tester\n    secretKey: 1234567\n    groupPerms: [g=READ]\n",
     "accounts\\[0\\].groupPerms\\[0\\]: 'READ' is not a permission"),
    ("accounts:\n  - accessKey: rl_tester\n    secretKey: 1234567\n    topicPerms: topicA=PUB\n",
     "accounts\\[0\\].topicPerms must be a list"),
    ("accounts:\n  - accessKey: rl_tester\n    secretKey: 1234567\n    admin: yes please\n",
     "accounts\\[0\\].admin must be true or false"),
    ("accounts:\n  - accessKey: rl_tester\n    secretKey: 1234567\n    whiteRemoteAddress: 10.0.*\n",
     "accounts\\[0\\].whiteRemoteAddress: '10.0.\\*': an IPv4 pattern has four groups"),
    ("globalWhiteRemoteAddresses: [127.0.0.1, nothost]\n", "globalWhiteRemoteAddresses\\[1\\]: 'nothost'"),
    ("globalWhiteRemoteAddresses: 127.0.0.1\n", "globalWhiteRemoteAddresses must be a list"),
    ("accounts: {accessKey: rl_tester}\n", "accounts must be a list"),
    ("accounts:\n  - just-text\n", "accounts\\[0\\] must be a mapping"),
    ("- a\n- b\n", "the top level must be a mapping"),
    ("accounts:\n  - accessKey: rl_tester\n    secretKey: 1234567\n  - accessKey: rl_tester\n    secretKey: 7654321\n",
     "accounts\\[1\\].accessKey 'rl_tester' is already defined"),
    ("accounts: [\n", "not valid YAML"),
])
def test_bad_files_name_the_field(tmp_path, text, message):
    f = tmp_path / "plain_acl.yml"
    f.write_text(text)
    with pytest.raises(AclConfigError, match=f"^ACL file {f}: .*{message}"):
        load_rules(f)


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(AclConfigError, match=f"ACL file {tmp_path / 'nope.yml'} does not exist"):
        load_rules(tmp_path / "nope.yml")
    (tmp_path / "empty.yml").write_text("")
    assert load_rules(tmp_path / "empty.yml") == AclRules((), {})


def test_acl_file_location(tmp_path):
    from broker.server.settings import BrokerSettings

    cfg = tmp_path / "broker.conf"
    default = BrokerSettings().acl_file_path
    assert default == "conf/plain_acl.yml"
    assert acl_file_location(default, cfg) == tmp_path / "conf" / "plain_acl.yml"
    assert acl_file_location("acl/mine.yml", cfg) == tmp_path / "acl" / "mine.yml"
    assert acl_file_location(str(tmp_path / "x.yml"), None) == tmp_path / "x.yml"
    with pytest.raises(AclConfigError, match="aclFilePath conf/plain_acl.yml is relative to the broker's config file, "
                                             "and the broker was given none: give an absolute aclFilePath"):
        acl_file_location(default, None)
    with pytest.raises(AclConfigError, match="aclFilePath is empty"):
        acl_file_location(" ", cfg)


# ---- validation in Apache's order --------------------------------------------------------------------
@pytest.fixture
def rules():
    return parse_rules({
        "globalWhiteRemoteAddresses": ["10.10.103.*"],
        "accounts": [
            {"accessKey": AK, "secretKey": SK, "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB",
             "topicPerms": ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"], "groupPerms": ["groupA=DENY"]},
            {"accessKey": "rl_open_key", "secretKey": "open-secret", "defaultTopicPerm": "PUB|SUB",
             "defaultGroupPerm": "PUB|SUB", "whiteRemoteAddress": "192.168.0.{1,2}"},
            {"accessKey": "rl_admin_key", "secretKey": "admin-secret", "admin": True},
        ]}, "test")


def signed(code: int, ext: dict, body: bytes = b"", ak: str = AK, sk: str = SK) -> dict:
    ext = {k: str(v) for k, v in ext.items()}
    SessionCredentials(ak, sk).sign_ext(ext, body)
    return ext


def refusal(rules, code, ext, body=b"", host="127.0.0.1", version=0) -> str | None:
    try:
        validate(rules, AccessRequest(code, ext, body, host, version), ADMIN_CODES)
    except AclDenied as denied:
        return denied.message
    return None


def send(topic: str, group: str = "PG") -> dict:
    return {"producerGroup": group, "topic": topic, "queueId": "0"}


def test_topic_permissions(rules):
    assert refusal(rules, RequestCode.SEND_MESSAGE, signed(10, send("topicB"))) is None
    assert refusal(rules, RequestCode.SEND_MESSAGE, signed(10, send("topicA"))) == "No default permission for topic:topicA"
    assert refusal(rules, RequestCode.SEND_MESSAGE, signed(10, send("topicC"))) == "No default permission for topic:topicC"
    # not listed: defaultTopicPerm (DENY)
    assert refusal(rules, RequestCode.SEND_MESSAGE, signed(10, send("other"))) == "No default permission for topic:other"
    v2 = {"a": "PG", "b": "topicB", "e": "0"}
    assert refusal(rules, RequestCode.SEND_MESSAGE_V2, signed(310, v2)) is None
    assert refusal(rules, RequestCode.SEND_BATCH_MESSAGE, signed(320, {**v2, "b": "topicC"})) == \
        "No default permission for topic:topicC"


def test_group_permissions_and_retry_topics(rules):
    pull = {"consumerGroup": "groupX", "topic": "topicC", "queueId": "0", "queueOffset": "0"}
    assert refusal(rules, RequestCode.PULL_MESSAGE, signed(11, pull)) is None  # groupX: defaultGroupPerm SUB
    assert refusal(rules, RequestCode.PULL_MESSAGE, signed(11, {**pull, "consumerGroup": "groupA"})) == \
        "No default permission for group:groupA"
    assert refusal(rules, RequestCode.PULL_MESSAGE, signed(11, {**pull, "topic": "topicA"})) == \
        "No default permission for topic:topicA"
    # a retry topic is its group: pulling %RETRY%groupA is groupA's permission
    assert refusal(rules, RequestCode.PULL_MESSAGE, signed(11, {**pull, "topic": "%RETRY%groupA"})) == \
        "No default permission for group:groupA"
    # sending to a retry topic needs SUB on the sending group, not PUB on the topic
    assert refusal(rules, RequestCode.SEND_MESSAGE, signed(10, send("%RETRY%groupX", "groupX"))) is None
    assert refusal(rules, RequestCode.SEND_MESSAGE, signed(10, send("%RETRY%groupA", "groupA"))) == \
        "No default permission for group:groupA"
    assert refusal(rules, RequestCode.CONSUMER_SEND_MSG_BACK, signed(36, {"group": "groupA", "offset": "1"})) == \
        "No default permission for group:groupA"
    offset = {"consumerGroup": "groupX", "topic": "topicA", "queueId": "0", "commitOffset": "1"}
    assert refusal(rules, RequestCode.UPDATE_CONSUMER_OFFSET, signed(15, offset)) == \
        "No default permission for topic:topicA"
    assert refusal(rules, RequestCode.GET_CONSUMER_LIST_BY_GROUP, signed(38, {"consumerGroup": "groupA"})) == \
        "No default permission for group:groupA"
    assert refusal(rules, RequestCode.GET_CONSUMER_LIST_BY_GROUP, signed(38, {})) == \
        "the custom field <consumerGroup> is null"


def test_heartbeat_subscriptions(rules):
    hb = HeartbeatData("c1", consumers=[ConsumerData("groupX", subscriptions=[SubscriptionData("topicC")])])
    assert refusal(rules, RequestCode.HEART_BEAT, signed(34, {}, hb.encode()), hb.encode()) is None
    hb.consumers[0].subscriptions.append(SubscriptionData("topicA"))
    assert refusal(rules, RequestCode.HEART_BEAT, signed(34, {}, hb.encode()), hb.encode()) == \
        "No default permission for topic:topicA"
    assert refusal(rules, RequestCode.HEART_BEAT, signed(34, {}, b"{not json"), b"{not json").startswith("heartbeat body")


def test_apache_order(rules):
    ext = signed(10, send("topicB"))
    # 1. global whitelist: unsigned and unknown keys pass
    assert refusal(rules, 10, send("topicA"), host="10.10.103.9") is None
    # 2. the key
    assert refusal(rules, 10, send("topicB")) == "No accessKey is configured"
    assert refusal(rules, 10, {**ext, "AccessKey": "rl_nobody"}) == "No acl config for rl_nobody"
    # 3. the account's whitelist: no signature check, no permission check
    open_ext = {**send("anything"), "AccessKey": "rl_open_key"}
    assert refusal(rules, 10, open_ext, host="192.168.0.2") is None
    assert refusal(rules, 10, open_ext, host="192.168.0.3") == "Check signature failed for accessKey=rl_open_key"
    # 4. the signature covers every field and the body
    assert refusal(rules, 10, {**ext, "queueId": "1"}) == f"Check signature failed for accessKey={AK}"
    assert refusal(rules, 10, ext, body=b"x") == f"Check signature failed for accessKey={AK}"
    assert refusal(rules, 10, signed(10, send("topicB"), sk="wrong-secret")) == f"Check signature failed for accessKey={AK}"
    assert refusal(rules, 10, {k: v for k, v in ext.items() if k != "Signature"}) == \
        f"Check signature failed for accessKey={AK}"
    # 5. admin codes
    create = {"topic": "NewTopic", "defaultTopic": "TBW102"}
    assert refusal(rules, 17, signed(17, create)) == f"Need admin permission for request code=17, but accessKey={AK} is not"
    assert refusal(rules, 17, signed(17, create, ak="rl_admin_key", sk="admin-secret")) is None
    # an admin without entries may send anywhere; other codes need no resource
    assert refusal(rules, 10, signed(10, send("topicA"), ak="rl_admin_key", sk="admin-secret")) is None
    assert refusal(rules, RequestCode.GET_MAX_OFFSET, signed(30, {"topic": "topicA", "queueId": "0"})) is None


def test_unique_key_flag_unsigned_by_old_clients(rules):
    ext = signed(12, {"topic": "topicC", "key": "k", "maxNum": "1", "beginTimestamp": "0", "endTimestamp": "1"})
    with_flag = {**ext, "_UNIQUE_KEY_QUERY": "true"}
    assert refusal(rules, 12, with_flag, version=400) is None  # up to 4.9.3 the flag is added after signing
    assert refusal(rules, 12, with_flag, version=401) == f"Check signature failed for accessKey={AK}"


def test_denial_remark_is_apaches_shape():
    assert AclDenied("No acl config for x").remark == (
        "org.apache.rocketmq.acl.common.AclException: No acl config for x, "
        "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java)")


# ---- reload ------------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_gate_reloads_changed_file_and_keeps_last_good(tmp_path, caplog):
    f = tmp_path / "plain_acl.yml"
    f.write_text(f"accounts:\n  - accessKey: {AK}\n    secretKey: {SK}\n    defaultTopicPerm: SUB\n")
    clock = Clock()
    gate = AclGate(f, clock=clock)
    ext = signed(10, send("topicZ"))
    assert gate.check(10, ext, b"", "127.0.0.1:1").message == "No default permission for topic:topicZ"
    f.write_text(f"accounts:\n  - accessKey: {AK}\n    secretKey: {SK}\n    defaultTopicPerm: PUB\n")
    assert gate.check(10, ext, b"", "127.0.0.1:1") is not None  # looked at once a second at most
    clock.now += 1.0
    assert gate.check(10, ext, b"", "127.0.0.1:1") is None
    f.write_text("accounts: [\n")  # broken: the last good rules stay
    clock.now += 1.0
    with caplog.at_level(logging.ERROR, logger="broker.acl.gate"):
        assert gate.check(10, ext, b"", "127.0.0.1:1") is None
    assert any("previous rules stay in force" in r.getMessage() and "not valid YAML" in r.getMessage()
               for r in caplog.records)
    f.unlink()  # gone: still the last good rules
    clock.now += 1.0
    assert gate.check(10, ext, b"", "127.0.0.1:1") is None


def test_gate_logs_peer_and_key_never_secret(tmp_path, caplog):
    f = tmp_path / "plain_acl.yml"
    f.write_text(f"accounts:\n  - accessKey: {AK}\n    secretKey: {SK}\n")
    ext = signed(10, send("topicZ"), sk="forged-secret")
    with caplog.at_level(logging.WARNING, logger="broker.acl.gate"):
        AclGate(f).check(10, ext, b"", "127.0.0.1:4242")
    [line] = [r.getMessage() for r in caplog.records]
    assert line == (f"ACL refused SEND_MESSAGE(10) from 127.0.0.1:4242 (accessKey={AK}): "
                    f"Check signature failed for accessKey={AK}")
    assert SK not in line and ext["Signature"] not in line
