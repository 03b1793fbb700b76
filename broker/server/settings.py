"""Broker settings: Apache's ``broker.conf`` names, read from TOML, overridden by the command line.

An operator who knows Apache RocketMQ recognises every key: ``brokerClusterName``, ``brokerName``,
``listenPort``, ``namesrvAddr``, ``flushDiskType``, ``messageDelayLevel``, ``autoCreateTopicEnable``…
Unknown keys are an error (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from broker.store.constants import (
    DEFAULT_MAPPED_FILE_SIZE_COMMITLOG,
    DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE,
    DEFAULT_MAX_HASH_SLOT_NUM,
    DEFAULT_MAX_INDEX_NUM,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MESSAGE_DELAY_LEVEL,
)
from broker.store.delay import parse_delay_levels

FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")


class SettingsError(ValueError):
    """A broker setting is unknown or has a bad value; the message names the key and the source."""


@dataclass(frozen=True)
class BrokerSettings:
    # identity and network
    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    broker_ip1: str = "127.0.0.1"  # the address written into STOREHOST and registered with the name server
    listen_host: str = "127.0.0.1"  # loopback unless configured otherwise
    listen_port: int = 10911
    namesrv_addr: str = ""  # "host:port;host:port"
    register_name_server_period: int = 30_000  # ms
    # processes
    request_processes: int = field(default_factory=lambda: max(2, os.cpu_count() or 2))
    # store
    store_path_root_dir: str = ""
    mapped_file_size_commit_log: int = DEFAULT_MAPPED_FILE_SIZE_COMMITLOG
    mapped_file_size_consume_queue: int = DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE
    max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM
    max_index_num: int = DEFAULT_MAX_INDEX_NUM
    flush_disk_type: str = "ASYNC_FLUSH"
    flush_interval_commit_log: int = 500  # ms
    sync_flush_timeout: int = 5_000  # ms
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    flush_consumer_offset_interval: int = 5_000  # ms
    check_crc_on_recover: bool = True
    # topics and groups
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 8
    # consumption
    long_polling_enable: bool = True
    short_polling_time_mills: int = 1_000
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    enable_property_filter: bool = False  # SQL92 subscriptions (Apache's default: off)
    client_channel_max_idle_time_seconds: int = 120
    max_frame_length: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.flush_disk_type not in FLUSH_TYPES:
            raise SettingsError(f"flushDiskType must be one of {FLUSH_TYPES}, got {self.flush_disk_type!r}")
        if not 0 < self.listen_port < 65536:
            raise SettingsError(f"listenPort {self.listen_port} is not a TCP port")
        if self.request_processes < 1:
            raise SettingsError("requestProcesses must be >= 1")
        try:
            parse_delay_levels(self.message_delay_level)
        except ValueError as exc:
            raise SettingsError(f"messageDelayLevel: {exc}") from None

    @property
    def broker_addr(self) -> str:
        return f"{self.broker_ip1}:{self.listen_port}"

    @property
    def namesrv_addrs(self) -> list[str]:
        return [a.strip() for a in self.namesrv_addr.replace(",", ";").split(";") if a.strip()]

    def with_overrides(self, **values: Any) -> "BrokerSettings":
        return replace(self, **{k: v for k, v in values.items() if v is not None})


def _snake(key: str) -> str:
    out = []
    for ch in key:
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch)
    return "".join(out).replace("i_p1", "ip1")


_FIELDS = {f.name: f for f in fields(BrokerSettings)}


def apache_name(field_name: str) -> str:
    """``max_message_size`` → ``maxMessageSize`` (``broker_ip1`` → ``brokerIP1``): the broker.conf key."""
    head, *rest = field_name.split("_")
    return head + "".join("IP1" if part == "ip1" else part.capitalize() for part in rest)


def to_properties(settings: BrokerSettings) -> str:
    """Every setting as ``key=value`` lines under its broker.conf name, sorted: the body Apache's
    broker answers GET_BROKER_CONFIG with (``mqadmin getBrokerConfig``; replay reads maxMessageSize)."""
    lines = []
    for f in sorted(fields(BrokerSettings), key=lambda f: apache_name(f.name)):
        value = getattr(settings, f.name)
        lines.append(f"{apache_name(f.name)}={str(value).lower() if isinstance(value, bool) else value}")
    return "\n".join(lines) + "\n"
_TYPES = {"int": int, "str": str, "bool": bool}


def settings_from_mapping(data: dict[str, Any], source: str = "<settings>") -> BrokerSettings:
    """Settings from Apache-style camelCase keys (or snake_case). Values are type-checked."""
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = key if key in _FIELDS else _snake(key)
        if name not in _FIELDS:
            raise SettingsError(f"{source}: unknown broker setting {key!r}")
        want = _TYPES[_FIELDS[name].type] if isinstance(_FIELDS[name].type, str) else _FIELDS[name].type
        if want is bool and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif want is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise SettingsError(f"{source}: {key} must be {want.__name__}, got {value!r}")
        values[name] = value
    return BrokerSettings(**values)


def load_settings(path: str | os.PathLike | None, **overrides: Any) -> BrokerSettings:
    """Read a ``broker.toml`` (a flat table, or a ``[broker]`` table) and apply overrides."""
    base = BrokerSettings()
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingsError(f"broker config {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"broker config {p}: {exc}") from None
        data = data.get("broker", data)
        base = settings_from_mapping(data, str(p))
    return base.with_overrides(**overrides)
