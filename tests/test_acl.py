"""Access control against a real broker started with ``aclEnable=true`` (``conf/plain_acl.yml`` beside
its config file): Apache's C++ client with and without the right credentials, our Python client signed
and unsigned, admin-only requests, a refused request stores nothing, and the file edited live."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from broker.acl.signature import SessionCredentials
from broker.client import Admin, Message, MQClientError, Producer, PullConsumer, PullStatus
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.transport import SyncRemotingClient
from tests.broker_harness import start_broker, start_namesrv, wait_until
from tests.cpp_client import ClientProcesses

CLIENT_AK, CLIENT_SK = "rl_client_key", "client-secret"
ADMIN_AK, ADMIN_SK = "rl_admin_key", "admin-secret"
TOPIC = "AclTopic"  # the client account may PUB and SUB
READ_ONLY = "AclReadOnly"  # SUB only: sends are refused
LATER = "AclLater"  # granted by editing the file while the broker runs
DENIED_PREFIX = "org.apache.rocketmq.acl.common.AclException: "
ACL_YML = f"""
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: {CLIENT_AK}
    secretKey: {CLIENT_SK}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {TOPIC}=PUB|SUB
      - {READ_ONLY}=SUB
  - accessKey: {ADMIN_AK}
    secretKey: {ADMIN_SK}
    admin: true
"""


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ns, self.namesrv = start_namesrv(tmp)
        self.acl_file = tmp / "conf" / "plain_acl.yml"  # the default: conf/ beside the broker's config file
        self.acl_file.parent.mkdir()
        self.acl_file.write_text(ACL_YML)
        self.broker = start_broker(tmp / "store", self.namesrv, {"aclEnable": True})
        self.admin = Admin(self.namesrv, access_key=ADMIN_AK, secret_key=ADMIN_SK)
        self.cpp = ClientProcesses(tmp)
        for topic in (TOPIC, READ_ONLY, LATER):
            self.admin.create_topic(self.broker.addr, topic, queues=2)
            assert self.admin.wait_writable(topic)

    def close(self) -> None:
        self.cpp.kill_all()
        self.admin.close()
        self.broker.stop()
        self.ns.send_signal(signal.SIGTERM)
        self.ns.wait(10)

    def stored(self, topic: str) -> int:
        return sum(o.max_offset for o in self.admin.topic_stats(self.broker.addr, topic).offset_table.values())

    def wait_stored(self, topic: str, count: int) -> None:
        """The consume queues are built by the dispatcher after the append: wait for them to say so."""
        wait_until(lambda: self.stored(topic) == count, f"{count} messages in {topic}'s queues")

    def commitlog_end(self) -> int:
        return int(self.admin.broker_runtime_info(self.broker.addr)["commitLogMaxOffset"])

    def log_text(self) -> str:
        return self.broker.log.read_text()

    def cpp_produce(self, name: str, topic: str, count: int, *creds: str) -> dict:
        spec = self.tmp / f"{name}.json"
        spec.write_text(json.dumps({"topic": topic, "messages": [
            {"seq": f"{name}-{i}", "mode": "sync", "body": f"{name} body {i}", "props": {"seq": f"{name}-{i}"}}
            for i in range(count)]}))
        args = ["produce.py", self.namesrv, "PG_ACL", str(spec)]
        if creds:
            args += ["--access-key", creds[0], "--secret-key", creds[1]]
        return self.cpp.client(name, args, timeout=90).result()

    def raw(self, code: int, ext: dict, creds: SessionCredentials | None, body: bytes = b"") -> RemotingCommand:
        hook = creds.sign_request if creds else None
        with SyncRemotingClient(self.broker.addr, before_request=hook) as client:
            return client.invoke(RemotingCommand.request(code, ext, body), timeout=10)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = Env(tmp_path_factory.mktemp("acl"))
    try:
        yield e
    finally:
        e.close()


def test_cpp_client_with_its_keys_produces_and_consumes(env):
    res = env.cpp_produce("good", TOPIC, 4, CLIENT_AK, CLIENT_SK)
    assert res["errors"] == [] and [r["status"] for r in res["results"]] == [0, 0, 0, 0]
    pull = env.cpp.client("pull", ["pull_consume.py", env.namesrv, "CG_ACL_PULL", TOPIC, "*", "--unique", "4",
                                   "--timeout", "30", "--access-key", CLIENT_AK, "--secret-key", CLIENT_SK], 90)
    push = env.cpp.client("push", ["push_consume.py", env.namesrv, "CG_ACL_PUSH", TOPIC, "*", "--unique", "4",
                                   "--timeout", "40", "--settle", "0.5", "--access-key", CLIENT_AK,
                                   "--secret-key", CLIENT_SK], 90)
    pulled, pushed = pull.result(), push.result()
    want = {f"good-{i}" for i in range(4)}
    assert pulled["complete"] and {d["props"]["seq"] for d in pulled["deliveries"]} == want
    assert pushed["complete"] and {d["props"]["seq"] for d in pushed["deliveries"]} == want


@pytest.mark.parametrize("name, topic, creds, reason", [
    ("wrong-secret", TOPIC, (CLIENT_AK, "not-the-secret"), f"Check signature failed for accessKey={CLIENT_AK}"),
    ("unknown-key", TOPIC, ("rl_stranger", "whatever-secret"), "No acl config for rl_stranger"),
    ("no-pub", READ_ONLY, (CLIENT_AK, CLIENT_SK), f"No default permission for topic:{READ_ONLY}"),
    ("unsigned", TOPIC, (), None),  # the C++ client still sends AccessKey "" and a signature
])
def test_cpp_client_refused_stores_nothing(env, name, topic, creds, reason):
    before, end_before = env.stored(topic), env.commitlog_end()
    res = env.cpp_produce(name, topic, 3, *creds)
    assert res["results"] == [] and len(res["errors"]) == 3
    assert env.stored(topic) == before and env.commitlog_end() == end_before
    log = env.log_text()
    if reason is not None:
        assert "ACL refused SEND_MESSAGE(10) from 127.0.0.1:" in log and reason in log
    else:
        assert "(accessKey=): No acl config for " in log
    for secret in (CLIENT_SK, "not-the-secret", "whatever-secret"):
        assert secret not in log


def test_python_client_signed_and_unsigned(env):
    with Producer("PG_PY_ACL", env.namesrv, access_key=CLIENT_AK, secret_key=CLIENT_SK) as producer:
        before = env.stored(TOPIC)
        producer.send(Message(TOPIC, b"signed by python"))
        env.wait_stored(TOPIC, before + 1)
    with PullConsumer("CG_PY_ACL", env.namesrv, access_key=CLIENT_AK, secret_key=CLIENT_SK) as consumer:
        bodies = []
        for mq in consumer.queues(TOPIC):
            res = consumer.pull(mq, 0)
            assert res.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG)
            bodies += [m.body for m in res.messages]
        assert b"signed by python" in bodies
    end_before = env.commitlog_end()
    with Producer("PG_PY_ACL", env.namesrv, retry_times=0) as unsigned:
        with pytest.raises(MQClientError) as info:
            unsigned.send(Message(TOPIC, b"unsigned"))
    assert info.value.code == ResponseCode.SYSTEM_ERROR
    assert f"{DENIED_PREFIX}No accessKey is configured, " in str(info.value)
    assert env.commitlog_end() == end_before


def test_refusal_is_apaches_response(env):
    resp = env.raw(RequestCode.SEND_MESSAGE, {"producerGroup": "PG", "topic": TOPIC, "queueId": 0, "sysFlag": 0,
                                              "bornTimestamp": 1, "flag": 0, "properties": "", "reconsumeTimes": 0,
                                              "unitMode": "false", "defaultTopic": "TBW102",
                                              "defaultTopicQueueNums": 4},
                   SessionCredentials(CLIENT_AK, "forged-secret"), b"forged")
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, (
        f"{DENIED_PREFIX}Check signature failed for accessKey={CLIENT_AK}, "
        "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java)"))


def test_admin_requests_need_an_admin_account(env):
    client = SessionCredentials(CLIENT_AK, CLIENT_SK)
    create = {"topic": "AclMadeByAdmin", "defaultTopic": "TBW102", "readQueueNums": 1, "writeQueueNums": 1,
              "perm": 6, "topicFilterType": "SINGLE_TAG"}
    resp = env.raw(RequestCode.UPDATE_AND_CREATE_TOPIC, create, client)
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, (
        f"{DENIED_PREFIX}Need admin permission for request code=17, but accessKey={CLIENT_AK} is not, "
        "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java)"))
    assert "AclMadeByAdmin" not in env.admin.topic_list()
    resp = env.raw(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": READ_ONLY}, client)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "Need admin permission for request code=215" in resp.remark
    assert env.admin.topic_stats(env.broker.addr, READ_ONLY).offset_table  # still there
    env.admin.create_topic(env.broker.addr, "AclMadeByAdmin", queues=1)
    assert len(env.admin.topic_stats(env.broker.addr, "AclMadeByAdmin").offset_table) == 1
    env.admin.delete_topic_in_broker(env.broker.addr, "AclMadeByAdmin")
    with pytest.raises(MQClientError) as info:
        env.admin.topic_stats(env.broker.addr, "AclMadeByAdmin")
    assert info.value.code == ResponseCode.TOPIC_NOT_EXIST


def test_file_edited_while_running(env):
    with Producer("PG_PY_ACL", env.namesrv, access_key=CLIENT_AK, secret_key=CLIENT_SK, retry_times=0) as producer:
        with pytest.raises(MQClientError, match=f"No default permission for topic:{LATER}"):
            producer.send(Message(LATER, b"before"))
        assert env.stored(LATER) == 0
        env.acl_file.write_text(ACL_YML.replace(f"      - {READ_ONLY}=SUB\n",
                                                f"      - {READ_ONLY}=SUB\n      - {LATER}=PUB\n"))

        def sent() -> bool:
            try:
                producer.send(Message(LATER, b"after"))
                return True
            except MQClientError as exc:
                assert "No default permission" in str(exc)
                return False

        wait_until(sent, "the edited ACL file to let the send in")
        # each network process reloads on its own: once both have, every send is let in
        wait_until(lambda: env.log_text().count("ACL rules reloaded from") >= 2, "both network processes to reload")
        sends = 1 + sum(1 for _ in range(4) if producer.send(Message(LATER, b"after")))
        env.wait_stored(LATER, sends)
        # a broken file keeps the last good rules
        env.acl_file.write_text("accounts: [\n")
        wait_until(lambda: env.log_text().count("previous rules stay in force") >= 2, "both processes to refuse it")
        producer.send(Message(LATER, b"still allowed"))
        env.wait_stored(LATER, sends + 1)
    env.acl_file.write_text(ACL_YML)


# =====================================================================================================
# a short fuzz round with ACL on (the frame fuzzer of test_broker_fuzz, every request unsigned or forged)
# =====================================================================================================
FUZZ_SEED = 0xAC1
FUZZ_CASES = 1200


def forged_frame(rng, opaque: int) -> bytes:
    """A request of (nearly) every code the broker serves — or a send to the topic the client account
    may write — unsigned, with an unknown key, or signed for the client account with a guessed
    secret / a random signature; then often mutated like test_broker_fuzz's cases."""
    from tests.test_broker_fuzz import base_specs, complete, mutate, request, send_ext

    specs = base_specs(f"acl{opaque}") + [(RequestCode.SEND_MESSAGE, send_ext(topic=TOPIC), b"forged to AclTopic")]
    code, ext, body = rng.choice(specs)
    ext = {k: str(v) for k, v in ext.items()}
    how = rng.randrange(4)
    if how == 1:
        SessionCredentials("rl_stranger", "stranger-secret").sign_ext(ext, body)
    elif how == 2:
        SessionCredentials(CLIENT_AK, rng.choice(["client-secreT", "", "x" * 64, CLIENT_SK[:-1]]) or "g").sign_ext(
            ext, body)
    elif how == 3:
        ext.update(AccessKey=CLIENT_AK, Signature=rng.choice(["", "AAAA", "N/YT7X6tJe5UfutmW+uNwTTJ7Fc=", "\x00"]))
    frame = request(code, ext, body, opaque=opaque, binary=rng.random() < 0.3).encode()
    return complete(mutate(rng, frame)) if rng.random() < 0.6 else frame


def test_fuzz_with_acl_stores_nothing_and_keeps_serving(env):
    import random
    from concurrent.futures import ThreadPoolExecutor

    from tests.test_broker_fuzz import Case, complete, predict, run_case, structured

    rng = random.Random(FUZZ_SEED)
    cases = [Case(f"forged-{n}", forged_frame(rng, (1 << 20) + n)) for n in range(FUZZ_CASES)]
    cases += [Case(f"structured-{n}", structured(rng, (1 << 21) + n)) for n in range(FUZZ_CASES // 4)]
    cases += [Case(f"random-{n}", complete(bytes(rng.randrange(256) for _ in range(rng.choice([3, 8, 64, 300])))))
              for n in range(FUZZ_CASES // 10)]
    expectations = [predict(case.data) for case in cases]
    end_before = env.commitlog_end()
    log_before = len(env.log_text())

    def one(n: int) -> tuple[str, str]:
        return run_case(env.broker.port, cases[n], expectations[n], 0x40000000 + n)

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(len(cases))))
    answered = [codes for kind, codes in outcomes if kind == "answered"]
    assert sum(1 for kind, _ in outcomes if kind == "closed") == sum(e.closes for e in expectations)
    assert len(answered) > len(cases) // 3
    # every answered request was refused by the ACL (SYSTEM_ERROR), the probes included
    assert {code for codes in answered for code in codes.split(",") if code} == {str(int(ResponseCode.SYSTEM_ERROR))}
    assert env.commitlog_end() == end_before, "a refused request reached the store"
    denials = env.log_text()[log_before:].count("ACL refused ")
    assert denials >= sum(len(e.answers) for e in expectations)
    # and a signed client is still served
    with Producer("PG_PY_ACL", env.namesrv, access_key=CLIENT_AK, secret_key=CLIENT_SK) as producer:
        before = env.stored(TOPIC)
        producer.send(Message(TOPIC, b"after the fuzz"))
        env.wait_stored(TOPIC, before + 1)


# =====================================================================================================
# the name server: admin requests need an admin account, routes stay open
# =====================================================================================================
def test_namesrv_admin_requests_need_an_admin_account(tmp_path):
    import subprocess

    from tests.broker_harness import REPO, ROCKETLAKE, free_port, wait_port

    acl = tmp_path / "namesrv_acl.yml"
    acl.write_text(ACL_YML)
    port = free_port()
    with open(tmp_path / "namesrv.log", "w") as log:
        proc = subprocess.Popen([*ROCKETLAKE, "--log-level", "INFO", "namesrv", "start", "--listen",
                                 f"127.0.0.1:{port}", "--acl-enable", "--acl-file", str(acl)], cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_port(port, proc=proc)
        addr = f"127.0.0.1:{port}"
        put = {"namespace": "ORDER_TOPIC_CONFIG", "key": "AclTopic", "value": "broker-a:2"}

        def call(code: int, ext: dict, creds: SessionCredentials | None) -> RemotingCommand:
            with SyncRemotingClient(addr, before_request=creds.sign_request if creds else None) as client:
                return client.invoke(RemotingCommand.request(code, ext), timeout=10)

        resp = call(RequestCode.PUT_KV_CONFIG, put, None)
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, (
            f"{DENIED_PREFIX}No accessKey is configured, "
            "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java)"))
        resp = call(RequestCode.PUT_KV_CONFIG, put, SessionCredentials(CLIENT_AK, CLIENT_SK))
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert resp.remark.startswith(f"{DENIED_PREFIX}Need admin permission for request code=100, but accessKey="
                                      f"{CLIENT_AK} is not")
        get = {"namespace": "ORDER_TOPIC_CONFIG", "key": "AclTopic"}
        assert call(RequestCode.GET_KV_CONFIG, get, None).code == ResponseCode.QUERY_NOT_FOUND  # nothing was put
        assert call(RequestCode.PUT_KV_CONFIG, put, SessionCredentials(ADMIN_AK, ADMIN_SK)).code == ResponseCode.SUCCESS
        got = call(RequestCode.GET_KV_CONFIG, get, None)  # reads stay open
        assert (got.code, got.ext_fields["value"]) == (ResponseCode.SUCCESS, "broker-a:2")
    finally:
        proc.terminate()
        proc.wait(10)


def test_namesrv_acl_needs_a_file(tmp_path, capsys):
    from broker.cli import main

    assert main(["namesrv", "start", "--listen", "127.0.0.1:0", "--acl-enable"]) == 2
    assert capsys.readouterr().err == \
        "error: --acl-enable needs --acl-file (the name server has no config file to find it beside)\n"
    bad = tmp_path / "bad.yml"
    bad.write_text("accounts:\n  - accessKey: short\n")
    assert main(["namesrv", "start", "--listen", "127.0.0.1:0", "--acl-enable", "--acl-file", str(bad)]) == 2
    assert capsys.readouterr().err == f"error: ACL file {bad}: accounts[0].secretKey is missing\n"


def test_admin_cli_signs_with_its_keys(env, capsys):
    from broker.cli import main

    base = ["admin", "updateTopic", "-n", env.namesrv, "-b", env.broker.addr, "-t", "AclCliTopic", "-r", "1", "-w", "1"]
    assert main([*base, "--access-key", CLIENT_AK, "--secret-key", CLIENT_SK]) == 1
    err = capsys.readouterr().err
    assert "Need admin permission for request code=17" in err and err.startswith("error: ")
    assert main([*base, "--access-key", ADMIN_AK]) == 2
    assert capsys.readouterr().err == "error: --access-key and --secret-key go together\n"
    assert main([*base, "--access-key", ADMIN_AK, "--secret-key", ADMIN_SK]) == 0
    assert len(env.admin.topic_stats(env.broker.addr, "AclCliTopic").offset_table) == 1
