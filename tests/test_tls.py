"""TLS on the broker and the name server (Apache 4.9's tlsMode, tls.server.*): settings, start-up
errors, and real brokers in each mode with our client, certificate rotation included.

Certificates are made in the test (``tests/tls_certs.py``). One name server in permissive mode
serves every broker here: the brokers register with it in plaintext, TLS clients look routes up
over TLS on the same port."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker.cli import main
from broker.client import Admin, ClientTlsConfig, Message, MQClientError, Producer, PullConsumer, PushConsumer
from broker.remoting.bodies import ConsumeFromWhere
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.tls import ServerTls, ServerTlsConfig, TlsConfigError, TlsMode, client_context
from broker.remoting.transport import SyncRemotingClient
from broker.server.supervisor import Broker
from broker.server.settings import SettingsError, load_settings, settings_dict, settings_from_mapping
from tests.broker_harness import (
    REPO,
    ROCKETLAKE,
    Recorder,
    drain,
    start_broker,
    start_namesrv,
    stored_messages,
    wait_until,
)
from tests.tls_certs import make_ca, serial_of

SERVER_SERIAL, ROTATED_SERIAL, CLIENT_SERIAL = 1001, 1002, 2001


# ---- certificates ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d / "ca")
    stranger = make_ca(d / "other", "other-ca")  # a CA the brokers do not trust
    return SimpleNamespace(
        dir=d, ca=ca, server=ca.issue(d, "server", serial=SERVER_SERIAL),
        client=ca.issue(d, "client", serial=CLIENT_SERIAL, server=False),
        stranger_client=stranger.issue(d / "other", "client", serial=3001, server=False))


def tls_client(pki, *, cert=None) -> ClientTlsConfig:
    """Verify the broker against the test CA; ``cert`` adds a client certificate (mutual TLS)."""
    if cert is None:
        return ClientTlsConfig(ca_file=str(pki.ca.cert_path))
    return ClientTlsConfig(ca_file=str(pki.ca.cert_path), cert_file=str(cert.cert_path), key_file=str(cert.key_path))


def server_keys(cert, mode: str, **more: str) -> dict:
    return {"tlsMode": mode, "tls.server.certPath": str(cert.cert_path), "tls.server.keyPath": str(cert.key_path),
            **more}


# ---- settings --------------------------------------------------------------------------------------
def test_tls_settings_load_from_toml_and_broker_conf(tmp_path, pki):
    toml = tmp_path / "broker.toml"
    toml.write_text(f'tlsMode = "enforcing"\ntls.server.certPath = "{pki.server.cert_path}"\n'
                    f'"tls.server.keyPath" = "{pki.server.key_path}"\n'
                    f'tls.server.need.client.auth = "require"\ntls.server.trustCertPath = "{pki.ca.cert_path}"\n')
    conf = tmp_path / "broker.conf"  # Apache's system property name for the mode is read as tlsMode
    conf.write_text(f"tls.server.mode=permissive\ntls.server.certPath={pki.server.cert_path}\n"
                    f"tls.server.keyPath={pki.server.key_path}\ntls.server.keyPassword=s3cret\n"
                    f"tls.enable=true\ntls.client.authServer=true\ntls.client.trustCertPath={pki.ca.cert_path}\n"
                    f"tls.client.certPath={pki.client.cert_path}\ntls.client.keyPath={pki.client.key_path}\n"
                    f"tls.client.keyPassword=hidden\n")
    from_toml, from_conf = load_settings(toml).server_tls(), load_settings(conf).server_tls()
    assert (from_toml.mode, from_toml.cert_path, from_toml.key_path, from_toml.need_client_auth.value,
            from_toml.trust_cert_path) == (TlsMode.ENFORCING, str(pki.server.cert_path), str(pki.server.key_path),
                                           "require", str(pki.ca.cert_path))
    assert (from_conf.mode, from_conf.key_password) == (TlsMode.PERMISSIVE, "s3cret")
    assert load_settings(conf).client_tls() == ClientTlsConfig(  # the name-server link (tls.enable = useTLS)
        ca_file=str(pki.ca.cert_path), cert_file=str(pki.client.cert_path), key_file=str(pki.client.key_path),
        key_password="hidden", check_hostname=False,
        names=("tls.client.trustCertPath", "tls.client.certPath", "tls.client.keyPath"))
    shown = settings_dict(load_settings(conf))  # GET_BROKER_CONFIG's body: the passwords never leave
    assert (shown["tlsMode"], shown["useTLS"], shown["tls.server.keyPassword"], shown["tls.client.keyPassword"]) == (
        "permissive", "true", "******", "******")
    assert settings_dict(load_settings(None))["tlsMode"] == "disabled"


@pytest.mark.parametrize("entries, message", [
    ({"tlsMode": "on"}, "tlsMode=on: must be one of disabled, permissive, enforcing"),
    ({"tlsMode": "enforcing"}, "tlsMode=enforcing needs tls.server.certPath"),
    ({"tlsMode": "permissive", "tls.server.certPath": "/c.pem"}, "tlsMode=permissive needs tls.server.keyPath"),
    ({"tls.server.need.client.auth": "maybe"}, "tls.server.need.client.auth=maybe: must be one of none"),
    ({"tlsMode": "enforcing", "tls.server.certPath": "/c.pem", "tls.server.keyPath": "/k.pem",
      "tls.server.need.client.auth": "require"}, "tls.server.need.client.auth=require needs tls.server.trustCertPath"),
    ({"tlsMode": "enforcing", "tls.server.mode": "disabled"}, "tlsMode is given twice"),
    ({"useTLS": "true", "tls.client.keyPath": "/k.pem"}, "tls.client.keyPath needs tls.client.certPath"),
    ({"useTLS": "true", "tls.enable": "false"}, "useTLS is given twice"),
    ({"tls.test.mode.enable": "true"}, "tls.test.mode.enable=true: not supported by rocketlake: rocketlake serves "
                                       "only the configured certificate"),
    ({"tls.config.file": "/etc/rocketmq/tls.properties"}, "tls.config.file=/etc/rocketmq/tls.properties: not "
                                                          "supported"),
])
def test_bad_tls_settings_are_refused_naming_the_key(entries, message):
    with pytest.raises(SettingsError) as err:
        settings_from_mapping(entries, "broker.conf")
    assert str(err.value).startswith("broker.conf: ") and message in str(err.value)


def test_harmless_apache_tls_keys_load():
    s = settings_from_mapping({"tls.test.mode.enable": "false", "tls.server.authClient": "true",
                               "tls.client.certPath": "/x.pem"})
    assert s.server_tls().mode is TlsMode.DISABLED and s.client_tls() is None  # useTLS off: no client TLS


def _start_error(settings_entries: dict, tmp_path: Path) -> str:
    broker = Broker(settings_from_mapping(settings_entries), tmp_path / "store")
    with pytest.raises(TlsConfigError) as err:
        broker.start()
    assert broker.procs is None and not (tmp_path / "store").exists()  # refused before anything started
    return str(err.value)


def test_unusable_certificate_files_stop_the_start_naming_setting_and_path(tmp_path, pki):
    missing = tmp_path / "missing.pem"
    assert _start_error(server_keys(SimpleNamespace(cert_path=missing, key_path=pki.server.key_path), "enforcing"),
                        tmp_path) == f"tls.server.certPath={missing}: no such file"
    assert _start_error(server_keys(SimpleNamespace(cert_path=pki.server.cert_path, key_path=tmp_path), "permissive"),
                        tmp_path) == f"tls.server.keyPath={tmp_path}: is a directory, not a PEM file"
    mismatched = SimpleNamespace(cert_path=pki.server.cert_path, key_path=pki.client.key_path)
    text = _start_error(server_keys(mismatched, "enforcing"), tmp_path)
    assert text.startswith(f"tls.server.certPath={pki.server.cert_path}, tls.server.keyPath={pki.client.key_path}: "
                           "not a PEM certificate chain and its private key")
    locked = pki.ca.issue(tmp_path, "locked", serial=9, key_password="right")
    text = _start_error(server_keys(locked, "enforcing", **{"tls.server.keyPassword": "wrong"}), tmp_path)
    assert "tls.server.keyPassword is wrong" in text
    assert _start_error(server_keys(pki.server, "enforcing", **{
        "tls.server.need.client.auth": "optional", "tls.server.trustCertPath": str(missing)}), tmp_path) == \
        f"tls.server.trustCertPath={missing}: no such file"
    ServerTls(ServerTlsConfig(TlsMode.ENFORCING, str(locked.cert_path), str(locked.key_path), "right"))  # loads


def test_an_unusable_client_certificate_stops_the_start_too(tmp_path, pki):
    missing = tmp_path / "client.crt"
    assert _start_error({"useTLS": "true", "tls.client.certPath": str(missing),
                         "tls.client.keyPath": str(pki.client.key_path)}, tmp_path) == \
        f"tls.client.certPath={missing}: no such file"
    assert _start_error({"useTLS": "true", "tls.client.authServer": "true",
                         "tls.client.trustCertPath": str(missing)}, tmp_path) == \
        f"tls.client.trustCertPath={missing}: no such file"


def test_cli_start_with_a_missing_key_is_a_usage_error(tmp_path, pki):
    conf = tmp_path / "broker.conf"
    conf.write_text(f"tlsMode=enforcing\ntls.server.certPath={pki.server.cert_path}\n"
                    f"tls.server.keyPath={tmp_path / 'nope.key'}\n")
    run = subprocess.run([*ROCKETLAKE, "broker", "start", "--store", str(tmp_path / "store"), "-c", str(conf),
                          "--listen", "127.0.0.1:1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.strip().splitlines()[-1] == f"error: tls.server.keyPath={tmp_path / 'nope.key'}: no such file"


def test_name_server_tls_flags_are_checked_before_it_listens(tmp_path, pki):
    run = subprocess.run([*ROCKETLAKE, "namesrv", "start", "--listen", "127.0.0.1:0", "--tls-mode", "enforcing",
                          "--tls-cert", str(pki.server.cert_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert (run.returncode, run.stderr.strip()) == (
        2, "error: tlsMode=enforcing needs tls.server.keyPath (a PEM file); it is not set")


def test_a_broken_rotation_keeps_the_last_good_certificate(tmp_path, pki):
    cert = pki.ca.issue(tmp_path, "rot", serial=10)
    tls = ServerTls(ServerTlsConfig(TlsMode.ENFORCING, str(cert.cert_path), str(cert.key_path)))
    first = tls.context
    assert not tls.reload_if_changed()  # nothing changed
    cert.cert_path.write_text("not a certificate\n")
    assert not tls.reload_if_changed() and tls.context is first and tls.reloads == 0
    pki.ca.issue(tmp_path, "rot", serial=11)  # a complete new pair
    assert tls.reload_if_changed() and tls.context is not first and tls.reloads == 1


# ---- real brokers ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def namesrv(tmp_path_factory, pki):
    d = tmp_path_factory.mktemp("tls-ns")
    proc, addr = start_namesrv(d, ["--tls-mode", "permissive", "--tls-cert", str(pki.server.cert_path),
                                   "--tls-key", str(pki.server.key_path)])
    yield addr
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def broker_factory(tmp_path_factory, namesrv):
    started = []

    def start(name: str, config: dict, processes: int = 1):
        d = tmp_path_factory.mktemp(name)
        b = start_broker(d / "store", namesrv, {"brokerName": name, **config}, processes=processes)
        started.append(b)
        return b

    yield start
    for b in started:
        assert b.stop() == 0


def make_topic(namesrv: str, broker, topic: str, tls: ClientTlsConfig | None = None) -> None:
    """The topic on this broker only: the brokers here share a name server, and a topic created on
    first send could land on any of them (each routes the default topic TBW102)."""
    with Admin(namesrv, tls=tls) as admin:
        admin.create_topic(broker.addr, topic, queues=2)
        assert admin.wait_writable(topic)


def send_all(namesrv: str, topic: str, bodies: list[bytes], tls: ClientTlsConfig | None = None) -> None:
    with Producer(f"PG_{topic}", namesrv, tls=tls) as producer:
        for body in bodies:
            assert producer.send(Message(topic, body)).status.name == "SEND_OK"


def assert_stored(namesrv: str, broker, topic: str, count: int, tls: ClientTlsConfig | None = None) -> None:
    """Exactly ``count`` messages in the topic's queues on ``broker``, once they are dispatched (the
    consume queues follow the commitlog a moment later)."""
    with Admin(namesrv, tls=tls) as admin:
        wait_until(lambda: stored_messages(admin, broker.addr, topic) >= count, f"{count} messages in {topic}")
        assert stored_messages(admin, broker.addr, topic) == count


def bodies_drained(namesrv: str, topic: str, tls: ClientTlsConfig | None = None) -> list[bytes]:
    with PullConsumer(f"CG_{topic}", namesrv, tls=tls) as consumer:
        return sorted(m.payload for m in drain(consumer, topic))


def answer_or_close(raw: socket.socket) -> bytes:
    """What the server sends back first; b"" when it closed (a reset too: the kernel answers a close
    with unread bytes, our frame, with RST)."""
    try:
        return raw.recv(1)
    except ConnectionResetError:
        return b""


def log_text(broker) -> str:
    return broker.log.read_text(errors="replace")


def test_enforcing_serves_tls_clients_and_refuses_plaintext(broker_factory, namesrv, pki, capsys):
    broker = broker_factory("tls-enforcing", server_keys(pki.server, "enforcing"))
    tls = tls_client(pki)
    make_topic(namesrv, broker, "TlsEnforced", tls)
    sent = [f"enforced-{i}".encode() for i in range(25)]
    send_all(namesrv, "TlsEnforced", sent, tls)
    assert_stored(namesrv, broker, "TlsEnforced", 25, tls)
    assert bodies_drained(namesrv, "TlsEnforced", tls) == sorted(sent)
    seen = Recorder()  # a push consumer too: heartbeats, rebalance, long polls and offset commits over TLS
    push = PushConsumer("CG_TLS_PUSH", namesrv, lambda m: seen.add(m.payload), topic="TlsEnforced",
                        consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, tls=tls)
    push.start()
    try:
        got = seen.wait_for(25, time.monotonic() + 40)
    finally:
        push.shutdown()
    assert sorted(got) == sorted(sent)

    assert main(["admin", "getBrokerConfig", "-n", namesrv, "-b", broker.addr, "--tls-ca", str(pki.ca.cert_path)]) == 0
    shown = capsys.readouterr().out.splitlines()  # the admin command line over TLS
    assert f"{'tlsMode':<50}=  enforcing" in shown and f"{'tls.server.certPath':<50}=  {pki.server.cert_path}" in shown
    assert main(["admin", "getBrokerConfig", "-n", namesrv, "-b", broker.addr, "--tls-ca", "/nowhere.pem"]) == 2
    assert capsys.readouterr().err == "error: --tls-ca=/nowhere.pem: no such file\n"

    with pytest.raises(MQClientError):  # our client in plaintext: the broker closes on it
        send_all(namesrv, "TlsEnforced", [b"plaintext"])
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as raw:  # a plaintext first frame
        raw.sendall(RemotingCommand.request(RequestCode.GET_BROKER_CONFIG, {}).encode())
        assert answer_or_close(raw) == b""  # closed, nothing answered
    wait_until(lambda: log_text(broker).count("speaks plaintext but tlsMode=enforcing requires TLS") >= 2,
               "the broker's refusal lines")
    assert_stored(namesrv, broker, "TlsEnforced", 25, tls)  # nothing of the plaintext client was stored
    send_all(namesrv, "TlsEnforced", [b"after"], tls)  # and the broker serves on
    assert_stored(namesrv, broker, "TlsEnforced", 26, tls)
    assert "Traceback" not in log_text(broker)


def test_permissive_serves_tls_and_plaintext_on_one_port(broker_factory, namesrv, pki):
    broker = broker_factory("tls-permissive", server_keys(pki.server, "permissive"))
    tls = tls_client(pki)
    over_tls = [f"tls-{i}".encode() for i in range(12)]
    plain = [f"plain-{i}".encode() for i in range(9)]
    make_topic(namesrv, broker, "TlsPermissive")
    send_all(namesrv, "TlsPermissive", over_tls, tls)
    send_all(namesrv, "TlsPermissive", plain)
    assert_stored(namesrv, broker, "TlsPermissive", 21)
    assert bodies_drained(namesrv, "TlsPermissive", tls) == sorted(over_tls + plain)
    assert bodies_drained(namesrv, "TlsPermissive") == sorted(over_tls + plain)
    with SyncRemotingClient(broker.addr, tls=client_context(tls)) as secure, SyncRemotingClient(broker.addr) as clear:
        assert serial_of(secure.connect().peer_certificate()) == SERVER_SERIAL
        assert clear.connect().peer_certificate() is None
        for client in (secure, clear):
            assert client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_CONFIG, {})).code == ResponseCode.SUCCESS


def test_mutual_tls_requires_a_client_certificate_from_the_trusted_ca(broker_factory, namesrv, pki):
    broker = broker_factory("tls-mutual", server_keys(pki.server, "enforcing", **{
        "tls.server.need.client.auth": "require", "tls.server.trustCertPath": str(pki.ca.cert_path)}))
    with pytest.raises(MQClientError):  # TLS, but no certificate
        make_topic(namesrv, broker, "TlsMutual", tls_client(pki))
    with pytest.raises(MQClientError):  # a certificate the broker does not trust
        make_topic(namesrv, broker, "TlsMutual", tls_client(pki, cert=pki.stranger_client))
    trusted = tls_client(pki, cert=pki.client)
    make_topic(namesrv, broker, "TlsMutual", trusted)
    with pytest.raises(MQClientError):  # the topic exists now: sending without a certificate is refused too
        send_all(namesrv, "TlsMutual", [b"anonymous"], tls_client(pki))
    sent = [f"mutual-{i}".encode() for i in range(7)]
    send_all(namesrv, "TlsMutual", sent, trusted)
    assert_stored(namesrv, broker, "TlsMutual", 7, trusted)
    assert bodies_drained(namesrv, "TlsMutual", trusted) == sorted(sent)
    assert "peer did not return a certificate" in log_text(broker)
    assert "Traceback" not in log_text(broker)


def test_certificate_rotation_reaches_new_connections_and_spares_old_ones(broker_factory, namesrv, pki, tmp_path):
    own = pki.ca.issue(tmp_path, "rotating", serial=SERVER_SERIAL)
    broker = broker_factory("tls-rotation", server_keys(own, "enforcing"), processes=2)
    context = client_context(tls_client(pki))
    ping = RemotingCommand.request(RequestCode.GET_BROKER_CONFIG, {})

    def new_connection_serial() -> int:
        with SyncRemotingClient(broker.addr, tls=context) as client:
            return serial_of(client.connect().peer_certificate())

    with SyncRemotingClient(broker.addr, tls=context) as old:
        old_conn = old.connect()
        assert serial_of(old_conn.peer_certificate()) == SERVER_SERIAL
        rotated = pki.ca.issue(tmp_path, "rotating", serial=ROTATED_SERIAL)  # same files, new certificate
        assert rotated.cert_path == own.cert_path
        # every network process watches the files: wait until a run of new connections (spread over
        # the processes by SO_REUSEPORT) all get the new certificate
        wait_until(lambda: all(new_connection_serial() == ROTATED_SERIAL for _ in range(8)),
                   "new connections to see the rotated certificate")
        assert old.invoke(ping).code == ResponseCode.SUCCESS  # the old connection goes on, same session
        assert old.connect() is old_conn and serial_of(old_conn.peer_certificate()) == SERVER_SERIAL
    make_topic(namesrv, broker, "TlsRotated", tls_client(pki))
    send_all(namesrv, "TlsRotated", [b"after-rotation"], tls_client(pki))
    assert_stored(namesrv, broker, "TlsRotated", 1, tls_client(pki))
    assert "new connections use the reloaded certificate" in log_text(broker)


def test_tls_client_against_a_disabled_broker_is_refused_cleanly(broker_factory, namesrv, pki):
    broker = broker_factory("tls-disabled", {})
    make_topic(namesrv, broker, "TlsDisabled")
    with pytest.raises(MQClientError):
        send_all(namesrv, "TlsDisabled", [b"over-tls"], tls_client(pki))
    wait_until(lambda: "it looks like a TLS handshake" in log_text(broker), "the broker's refusal line")
    send_all(namesrv, "TlsDisabled", [b"plain-1", b"plain-2"])  # plaintext clients are served as before
    assert_stored(namesrv, broker, "TlsDisabled", 2)
    assert bodies_drained(namesrv, "TlsDisabled") == [b"plain-1", b"plain-2"]
    assert "Traceback" not in log_text(broker)


def test_broker_registers_over_mutual_tls_with_an_enforcing_name_server(tmp_path, pki):
    """useTLS: the broker's registrations go over TLS, with its client certificate (Apache's broker
    with tls.enable and tls.client.*), to a name server that takes nothing else."""
    proc, ns = start_namesrv(tmp_path, ["--tls-mode", "enforcing", "--tls-cert", str(pki.server.cert_path),
                                        "--tls-key", str(pki.server.key_path), "--tls-need-client-auth", "require",
                                        "--tls-trust-cert", str(pki.ca.cert_path)])
    try:
        broker = start_broker(tmp_path / "store", ns, {
            "brokerName": "tls-registering", **server_keys(pki.server, "enforcing"), "useTLS": True,
            "tls.client.authServer": True, "tls.client.trustCertPath": str(pki.ca.cert_path),
            "tls.client.certPath": str(pki.client.cert_path), "tls.client.keyPath": str(pki.client.key_path)},
            processes=1)
        try:
            trusted = tls_client(pki, cert=pki.client)
            make_topic(ns, broker, "TlsRegistered", trusted)  # routed: the registration went through
            send_all(ns, "TlsRegistered", [b"one", b"two", b"three"], trusted)
            assert_stored(ns, broker, "TlsRegistered", 3, trusted)
            assert "cannot register" not in log_text(broker) and "Traceback" not in log_text(broker)
        finally:
            assert broker.stop() == 0
    finally:
        proc.terminate()
        proc.wait(10)
