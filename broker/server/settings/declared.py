"""Every broker setting, declared once: its ``broker.conf`` name, type, default and meaning.

Names are Apache RocketMQ 4.9's (``BrokerConfig``, ``MessageStoreConfig``, ``NettyServerConfig`` field
names), so an Apache operator's ``broker.conf`` and ``mqadmin updateBrokerConfig`` mean the same here.
Defaults are Apache's; where ours differ the declaration says why (``differs=``). A few settings are
our own (``ours=True``): they have no Apache counterpart. ``runtime=True`` marks the settings that
UPDATE_BROKER_CONFIG may change while the broker runs (:mod:`broker.server.admin_config` applies them);
every other one needs a restart.

Keys Apache has and we do not implement are in :mod:`broker.server.settings.apache_keys`.
"""

from __future__ import annotations

import os
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any

from broker.acl.config import DEFAULT_ACL_FILE
from broker.remoting.codes import MASTER_ID
from broker.remoting.frame import DEFAULT_MAX_FRAME
from broker.remoting.tls import (
    CERT_PATH_KEY,
    CLIENT_AUTH_SERVER_KEY,
    CLIENT_CERT_PATH_KEY,
    CLIENT_KEY_PASSWORD_KEY,
    CLIENT_KEY_PATH_KEY,
    CLIENT_TRUST_CERT_PATH_KEY,
    KEY_PASSWORD_KEY,
    KEY_PATH_KEY,
    MODE_KEY,
    MODE_PROPERTY,
    NEED_CLIENT_AUTH_KEY,
    TRUST_CERT_PATH_KEY,
    USE_TLS_KEY,
    USE_TLS_PROPERTY,
    ClientAuth,
    ClientTlsConfig,
    ServerTlsConfig,
    TlsConfigError,
    TlsMode,
)
from broker.server.clients import DEFAULT_CHANNEL_EXPIRED_S
from broker.engine.ha_frames import MAX_TRANSFER_BODY
from broker.engine.store_settings import StoreSettings
from broker.store.constants import FLUSH_DISK_TYPES
from broker.store.delay import parse_delay_levels

# The store's own defaults (Apache's MessageStoreConfig values) are the settings' defaults: one copy.
_STORE = StoreSettings()
ASYNC_MASTER = "ASYNC_MASTER"  # brokerRole: acknowledges a send once stored, replicas catch up later
SYNC_MASTER = "SYNC_MASTER"  # acknowledges a send once a slave has it too (CommitLog.handleHA)
SLAVE = "SLAVE"  # replicates a master's commitlog, refuses sends
BROKER_ROLES = (ASYNC_MASTER, SYNC_MASTER, SLAVE)
MAX_TOPIC_QUEUE_NUMS = 1024  # per topic and broker; a bound keeps stats requests from looping for ever


class SettingsError(ValueError):
    """A broker setting is unknown, unsupported or has a bad value; the message names the key."""


def _s(key: str, default: Any = None, doc: str = "", *, runtime: bool = False, ours: bool = False,
       differs: str = "", default_factory=None, secret: bool = False) -> Any:
    """One declaration. ``differs`` says why our default is not Apache's; ``ours`` marks a key Apache
    does not have; ``secret`` keeps the value out of GET_BROKER_CONFIG's answer."""
    meta = {"key": key, "doc": doc, "runtime": runtime, "ours": ours, "differs": differs, "secret": secret}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class BrokerSettings:
    # ---- identity and network (BrokerConfig, NettyServerConfig) -----------------------------------------
    broker_cluster_name: str = _s("brokerClusterName", "DefaultCluster", "cluster the broker registers in")
    broker_name: str = _s("brokerName", "broker-a", "broker name (master and slaves share it)",
                          differs="Apache uses the host name; a fixed name keeps test stores and routes stable")
    broker_id: int = _s("brokerId", MASTER_ID, "0 = master; a slave has an id >= 1")
    broker_role: str = _s("brokerRole", ASYNC_MASTER, "ASYNC_MASTER, SYNC_MASTER (a send waits for a slave) or SLAVE")
    broker_ip1: str = _s("brokerIP1", "127.0.0.1", "address written into STOREHOST and registered with the name server",
                         differs="Apache picks a local interface address; loopback unless configured")
    listen_port: int = _s("listenPort", 10911, "TCP port of the remoting server",
                          differs="NettyServerConfig says 8888, but Apache's BrokerStartup sets 10911: we follow it")
    listen_host: str = _s("listenHost", "127.0.0.1", "address the remoting server binds to", ours=True)
    namesrv_addr: str = _s("namesrvAddr", "", "name server address(es), host:port;host:port")
    register_name_server_period: int = _s("registerNameServerPeriod", 30_000,
                                          "ms between registrations with the name servers (clamped to 10 s..60 s)")
    request_processes: int = _s("requestProcesses", doc="network processes accepting on the port", ours=True,
                                default_factory=lambda: max(2, os.cpu_count() or 2))
    max_frame_length: int = _s("maxFrameLength", DEFAULT_MAX_FRAME, "largest remoting frame accepted, in bytes",
                               ours=True)
    # ---- store (MessageStoreConfig) -------------------------------------------------------------------
    store_path_root_dir: str = _s("storePathRootDir", "", "store directory (commitlog, consumequeue, index, config)",
                                  differs="Apache defaults to ~/store; ours comes from --store unless set here")
    mapped_file_size_commit_log: int = _s("mappedFileSizeCommitLog", _STORE.segment_bytes,
                                          "bytes of one commitlog file")
    mapped_file_size_consume_queue: int = _s("mappedFileSizeConsumeQueue", _STORE.cq_file_bytes,
                                             "bytes of one consume queue file (a multiple of 20)")
    max_hash_slot_num: int = _s("maxHashSlotNum", _STORE.index_slots, "hash slots of one index file")
    max_index_num: int = _s("maxIndexNum", _STORE.index_entries, "entries of one index file")
    flush_disk_type: str = _s("flushDiskType", str(_STORE.flush_disk_type), "ASYNC_FLUSH or SYNC_FLUSH (group commit)")
    flush_interval_commit_log: int = _s("flushIntervalCommitLog", _STORE.flush_interval_ms,
                                        "ms between commitlog fsyncs (ASYNC_FLUSH)")
    flush_interval_consume_queue: int = _s("flushIntervalConsumeQueue", _STORE.checkpoint_interval_ms,
                                           "ms between consume queue/index fsyncs and checkpoint writes")
    sync_flush_timeout: int = _s("syncFlushTimeout", _STORE.sync_flush_timeout_ms,
                                 "ms a SYNC_FLUSH put waits for fsync (then FLUSH_DISK_TIMEOUT)")
    max_message_size: int = _s("maxMessageSize", _STORE.max_message_size, "largest message body accepted, in bytes")
    message_delay_level: str = _s("messageDelayLevel", _STORE.message_delay_level, "delay of each delay level")
    flush_consumer_offset_interval: int = _s("flushConsumerOffsetInterval", _STORE.persist_interval_ms,
                                             "ms between writes of consumer offsets and other config/*.json")
    check_crc_on_recover: bool = _s("checkCRCOnRecover", _STORE.check_crc_on_recover,
                                    "verify body CRCs when recovering the commitlog")
    access_message_in_memory_max_ratio: int = _s("accessMessageInMemoryMaxRatio",
                                                 _STORE.access_message_in_memory_max_ratio,
                                                 "% of RAM behind the end beyond which a pull counts as from disk")
    # ---- replication (MessageStoreConfig) --------------------------------------------------------------
    ha_listen_port: int = _s("haListenPort", 0, "TCP port a master accepts its slaves on (0 = listenPort + 1)",
                             differs="Apache's BrokerStartup always overrides it with listenPort + 1; 0 asks for that, "
                                     "any other value is honoured")
    ha_master_address: str = _s("haMasterAddress", "", "a slave's master HA address host:port (empty: the one the "
                                "name server's registration result carries)")
    ha_slave_cut_back: bool = _s("haSlaveCutBackToMaster", False,
                                 "a slave starting with more commitlog than its master (the master lost a tail) cuts "
                                 "its own back to the master's end and follows again; off: it keeps every record, "
                                 "refuses to follow and says which range only it holds (those records may have "
                                 "been acknowledged: copy them back or promote the slave)", ours=True)
    ha_send_heartbeat_interval: int = _s("haSendHeartbeatInterval", 5_000,
                                         "ms between a slave's offset reports and a master's idle heartbeats")
    ha_housekeeping_interval: int = _s("haHousekeepingInterval", 20_000,
                                       "ms without a byte from the other side before an HA connection is dropped")
    ha_transfer_batch_size: int = _s("haTransferBatchSize", 32 * 1024, "most commitlog bytes in one HA transfer")
    ha_slave_fallbehind_max: int = _s("haSlaveFallbehindMax", 256 * 1024 * 1024,
                                      "bytes a slave may lag before a SYNC_MASTER answers SLAVE_NOT_AVAILABLE")
    # ---- topics and groups (BrokerConfig) ---------------------------------------------------------------
    auto_create_topic_enable: bool = _s("autoCreateTopicEnable", _STORE.auto_create_topic_enable,
                                        "create unknown topics on first send")
    auto_create_subscription_group: bool = _s("autoCreateSubscriptionGroup", _STORE.auto_create_subscription_group,
                                              "create unknown consumer groups on first use")
    default_topic_queue_nums: int = _s("defaultTopicQueueNums", _STORE.default_topic_queue_nums,
                                       "queues of TBW102 when the broker first creates it (caps auto-created topics)")
    # ---- consumption (BrokerConfig, MessageStoreConfig, NettyClientConfig) -------------------------------
    long_polling_enable: bool = _s("longPollingEnable", True,
                                   "hold a pull that finds nothing until a message arrives or its timeout",
                                   runtime=True)
    short_polling_time_mills: int = _s("shortPollingTimeMills", 1_000,
                                       "ms a pull that finds nothing is held when longPollingEnable is false",
                                       runtime=True)
    max_transfer_count_on_message_in_memory: int = _s("maxTransferCountOnMessageInMemory", 32,
                                                      "most messages one pull returns", runtime=True)
    max_transfer_bytes_on_message_in_memory: int = _s("maxTransferBytesOnMessageInMemory", 256 * 1024,
                                                      "most bytes one pull returns (the first message always goes)",
                                                      runtime=True)
    enable_property_filter: bool = _s("enablePropertyFilter", False,
                                      "accept SQL92 (property) subscriptions and filter pulls by them")
    client_channel_max_idle_time_seconds: int = _s(
        "clientChannelMaxIdleTimeSeconds", DEFAULT_CHANNEL_EXPIRED_S,
        "s without a heartbeat after which a client's registration is dropped (its consumers rebalance); "
        "Apache closes a channel idle that long, which drops its clients the same way",
        runtime=True)
    # ---- TLS (Apache's TlsSystemConfig: tls.server.* and the server mode) -------------------------------
    tls_mode: str = _s(MODE_KEY, TlsMode.DISABLED.value,
                       "disabled (plaintext only) | permissive (TLS and plaintext on the same port, told apart "
                       f"by the first byte) | enforcing (TLS only); Apache's {MODE_PROPERTY} is read as this too",
                       differs="Apache's default is permissive, serving a throwaway self-signed certificate "
                               "(tls.test.mode.enable); rocketlake has no certificate until one is configured")
    tls_server_cert_path: str = _s(CERT_PATH_KEY, "", "PEM certificate chain the broker presents (reloaded when "
                                                      "the file changes)")
    tls_server_key_path: str = _s(KEY_PATH_KEY, "", "PEM private key of that certificate (reloaded when it changes)")
    tls_server_key_password: str = _s(KEY_PASSWORD_KEY, "", "password of an encrypted private key", secret=True)
    tls_server_trust_cert_path: str = _s(TRUST_CERT_PATH_KEY, "",
                                         "PEM CA certificates that client certificates are verified against")
    tls_server_need_client_auth: str = _s(NEED_CLIENT_AUTH_KEY, ClientAuth.NONE.value,
                                          "none | optional | require: ask TLS clients for a certificate "
                                          "(verified against tls.server.trustCertPath)")
    use_tls: bool = _s(USE_TLS_KEY, False, "register with the name servers over TLS (NettyClientConfig.useTLS; "
                                           f"Apache's {USE_TLS_PROPERTY} is read as this too)",
                       differs="Apache turns it on by default when tlsMode is enforcing; rocketlake only when "
                               "set, since a name server need not follow its brokers' mode")
    tls_client_auth_server: bool = _s(CLIENT_AUTH_SERVER_KEY, False,
                                      "verify the name servers' certificates (against tls.client.trustCertPath, "
                                      "or the system's CAs); false accepts any, as Apache does")
    tls_client_trust_cert_path: str = _s(CLIENT_TRUST_CERT_PATH_KEY, "",
                                         "PEM CA certificates the name servers' certificates are verified against")
    tls_client_cert_path: str = _s(CLIENT_CERT_PATH_KEY, "",
                                   "PEM certificate the broker presents to name servers that ask for one")
    tls_client_key_path: str = _s(CLIENT_KEY_PATH_KEY, "", "PEM private key of tls.client.certPath")
    tls_client_key_password: str = _s(CLIENT_KEY_PASSWORD_KEY, "", "password of an encrypted tls.client.keyPath",
                                      secret=True)

    # ---- access control (BrokerConfig.aclEnable; Apache reads the file from ROCKETMQ_HOME/conf) ---------
    acl_enable: bool = _s("aclEnable", False,
                          "check every request against plain_acl.yml (Apache's plain ACL): signature, "
                          "whitelists, topic/group permissions, admin-only requests")
    acl_file_path: str = _s("aclFilePath", DEFAULT_ACL_FILE,
                            "the ACL file (Apache's plain_acl.yml); a relative path is taken from the config "
                            "file's directory, as Apache takes it from ROCKETMQ_HOME", ours=True)
    # ---- transactional messages (BrokerConfig) ---------------------------------------------------------
    reject_transaction_message: bool = _s("rejectTransactionMessage", False,
                                          "refuse transactional (half) messages with NO_PERMISSION", runtime=True)
    transaction_time_out: int = _s("transactionTimeOut", 6_000,
                                   "ms after its born time a half message with no commit/rollback is checked "
                                   "(CHECK_TRANSACTION_STATE to a producer of its group)", runtime=True)
    transaction_check_max: int = _s("transactionCheckMax", 15,
                                    "checks of one half message before it is discarded to TRANS_CHECK_MAX_TIME_TOPIC",
                                    runtime=True)
    transaction_check_interval: int = _s("transactionCheckInterval", 60_000,
                                         "ms between runs of the transaction check service", runtime=True)

    def __post_init__(self) -> None:
        if self.flush_disk_type not in FLUSH_DISK_TYPES:
            raise SettingsError(f"flushDiskType must be one of {FLUSH_DISK_TYPES}, got {self.flush_disk_type!r}")
        if self.broker_role not in BROKER_ROLES:
            raise SettingsError(f"brokerRole must be one of {BROKER_ROLES}, got {self.broker_role!r}")
        if self.broker_role == SLAVE and self.broker_id <= MASTER_ID:
            raise SettingsError(f"brokerId {self.broker_id}: a SLAVE's brokerId must be > {MASTER_ID}")
        if self.broker_role != SLAVE and self.broker_id != MASTER_ID:
            raise SettingsError(f"brokerId {self.broker_id}: the brokerId of a {self.broker_role} must be {MASTER_ID}")
        if not 0 <= self.ha_listen_port < 65536:
            raise SettingsError(f"haListenPort {self.ha_listen_port} is not a TCP port")
        if self.ha_transfer_batch_size > MAX_TRANSFER_BODY:
            raise SettingsError(f"haTransferBatchSize {self.ha_transfer_batch_size} is more than a slave can read "
                                f"in one transfer ({MAX_TRANSFER_BODY} bytes)")
        if self.ha_master_address and not _is_host_port(self.ha_master_address):
            raise SettingsError(f"haMasterAddress must be host:port, got {self.ha_master_address!r}")
        if not 0 < self.listen_port < 65536:
            raise SettingsError(f"listenPort {self.listen_port} is not a TCP port")
        if self.request_processes < 1:
            raise SettingsError("requestProcesses must be >= 1")
        if not 1 <= self.default_topic_queue_nums <= MAX_TOPIC_QUEUE_NUMS:
            raise SettingsError(f"defaultTopicQueueNums {self.default_topic_queue_nums} is outside "
                                f"1..{MAX_TOPIC_QUEUE_NUMS}")
        for name in ("max_transfer_count_on_message_in_memory", "max_transfer_bytes_on_message_in_memory",
                     "short_polling_time_mills", "client_channel_max_idle_time_seconds", "flush_interval_commit_log",
                     "flush_interval_consume_queue", "flush_consumer_offset_interval", "sync_flush_timeout",
                     "max_message_size", "max_frame_length", "transaction_check_interval",
                     "ha_send_heartbeat_interval", "ha_housekeeping_interval", "ha_transfer_batch_size",
                     "ha_slave_fallbehind_max"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{key_of(name)} must be >= 1, got {getattr(self, name)}")
        try:
            parse_delay_levels(self.message_delay_level)
        except ValueError as exc:
            raise SettingsError(f"messageDelayLevel: {exc}") from None
        try:
            self.server_tls()
            self.client_tls()
        except TlsConfigError as exc:
            raise SettingsError(str(exc)) from None

    def client_tls(self) -> ClientTlsConfig | None:
        """TLS of the broker's connections to the name servers, None when they are plaintext.
        Host names are not matched: Apache's client does not, and its certificates need not name
        the address a broker dials."""
        if not self.use_tls:
            return None
        if self.tls_client_key_path and not self.tls_client_cert_path:
            raise TlsConfigError(f"{CLIENT_KEY_PATH_KEY} needs {CLIENT_CERT_PATH_KEY}; it is not set")
        verify = self.tls_client_auth_server
        return ClientTlsConfig(ca_file=self.tls_client_trust_cert_path if verify else "", insecure=not verify,
                               cert_file=self.tls_client_cert_path, key_file=self.tls_client_key_path,
                               key_password=self.tls_client_key_password, check_hostname=False,
                               names=(CLIENT_TRUST_CERT_PATH_KEY, CLIENT_CERT_PATH_KEY, CLIENT_KEY_PATH_KEY))

    def server_tls(self) -> ServerTlsConfig:
        """The TLS settings as the transport takes them (the files are read when a server starts)."""
        return ServerTlsConfig(mode=self.tls_mode, cert_path=self.tls_server_cert_path,
                               key_path=self.tls_server_key_path, key_password=self.tls_server_key_password,
                               trust_cert_path=self.tls_server_trust_cert_path,
                               need_client_auth=self.tls_server_need_client_auth)

    @property
    def broker_addr(self) -> str:
        return f"{self.broker_ip1}:{self.listen_port}"

    @property
    def effective_ha_listen_port(self) -> int:
        return self.ha_listen_port or self.listen_port + 1

    @property
    def ha_server_addr(self) -> str:
        """What a master registers as its HA address (Apache: brokerIP2:haListenPort; IP2 is IP1 here)."""
        return f"{self.broker_ip1}:{self.effective_ha_listen_port}"

    @property
    def namesrv_addrs(self) -> list[str]:
        return [a.strip() for a in self.namesrv_addr.replace(",", ";").split(";") if a.strip()]

    def with_overrides(self, **values: Any) -> "BrokerSettings":
        return replace(self, **{k: v for k, v in values.items() if v is not None})


def _is_host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


SETTING_FIELDS: dict[str, Field] = {f.metadata["key"]: f for f in fields(BrokerSettings)}  # broker.conf key → field
_KEY_OF = {f.name: key for key, f in SETTING_FIELDS.items()}
_TYPES = {"int": int, "str": str, "bool": bool}
RUNTIME_KEYS = frozenset(key for key, f in SETTING_FIELDS.items() if f.metadata["runtime"])
# Other names Apache gives a declared setting (the system property of the same TLS mode).
KEY_ALIASES = {MODE_PROPERTY: MODE_KEY, USE_TLS_PROPERTY: USE_TLS_KEY}
SECRET_MASK = "******"  # a secret's value as GET_BROKER_CONFIG shows it when set


def key_of(field_name: str) -> str:
    """``max_message_size`` → ``maxMessageSize``: the broker.conf key of a field."""
    return _KEY_OF[field_name]


def type_of(key: str) -> type:
    t = SETTING_FIELDS[key].type
    return _TYPES[t] if isinstance(t, str) else t


def format_value(value: Any) -> str:
    """A value as Java's ``String.valueOf`` prints it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_dict(settings: BrokerSettings) -> dict[str, str]:
    """Every effective setting under its broker.conf name, sorted by name, values as text (a set
    secret as :data:`SECRET_MASK`: the answer goes to any client that asks)."""
    out = {}
    for key in sorted(SETTING_FIELDS):
        value = format_value(getattr(settings, SETTING_FIELDS[key].name))
        out[key] = SECRET_MASK if value and SETTING_FIELDS[key].metadata["secret"] else value
    return out


def convert(key: str, value: Any, source: str) -> Any:
    """A value from a file or a request, checked against the key's type. Text (properties files,
    UPDATE_BROKER_CONFIG) is converted with its surrounding blanks dropped; a boolean must be spelled
    ``true``/``false`` (Java's ``Boolean.parseBoolean`` would quietly read a typo as false)."""
    want = type_of(key)
    if isinstance(value, str) and want is not str:
        text = value.strip()
        if want is bool and text.lower() in ("true", "false"):
            value = text.lower() == "true"
        elif want is int and text.lstrip("+-").isdigit():
            value = int(text)
    elif isinstance(value, str):
        value = value.strip()
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise SettingsError(f"{source}: {key} must be {want.__name__}, got {value!r}")
    return value
