"""``plain_acl.yml``: Apache 4.9's file (``distribution/conf/plain_acl.yml``), read into :class:`AclRules`.

::

    globalWhiteRemoteAddresses: ["10.10.103.*", "192.168.0.*"]   # these hosts need no signature
    accounts:
      - accessKey: RocketMQ          # more than 6 characters, like secretKey
        secretKey: 12345678
        whiteRemoteAddress:          # this account's hosts need no signature either
        admin: false                 # admin-only requests (create/delete topic or group, broker config)
        defaultTopicPerm: DENY       # for topics not listed; DENY when missing
        defaultGroupPerm: SUB        # for groups not listed; DENY when missing
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB, groupC=SUB]

Groups are kept under their retry topic (``%RETRY%groupB``), as Apache does, so a request's group is
looked up the same way as its topics. Anything Apache would reject — or read silently as something
else, such as a misspelt permission turning into DENY — is an :class:`AclConfigError` naming the file
and the field (``accounts[1].topicPerms[0]``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from broker.acl.errors import AclConfigError
from broker.acl.permission import DENY, PERM_WORDS, parse_perm
from broker.acl.remote_address import AddressPattern, AddressPatternError, parse_pattern
from broker.store.topics import retry_topic

log = logging.getLogger(__name__)

GLOBAL_WHITE = "globalWhiteRemoteAddresses"
ACCOUNTS = "accounts"
# aclFilePath's default: Apache reads ROCKETMQ_HOME/conf/plain_acl.yml; ours is relative to the broker's
# config file's directory, which plays ROCKETMQ_HOME
DEFAULT_ACL_FILE = "conf/plain_acl.yml"
KEY_MIN_LENGTH = 7  # AclConstants: accessKey and secretKey must be longer than 6
ACCOUNT_KEYS = ("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm", "defaultGroupPerm",
                "topicPerms", "groupPerms")


@dataclass(frozen=True)
class Account:
    """One ``accounts`` entry. ``perms``: topic → bits, and ``%RETRY%group`` → bits for groups."""

    access_key: str
    secret_key: str = field(repr=False)
    white: AddressPattern
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    perms: dict[str, int]


@dataclass(frozen=True)
class AclRules:
    global_white: tuple[AddressPattern, ...]
    accounts: dict[str, Account]


def _text(value: Any, where: str, required: bool = False) -> str | None:
    if value is None:
        if required:
            raise AclConfigError(f"{where} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AclConfigError(f"{where} must be text, got {type(value).__name__}")
    return str(value)


def _pattern(value: Any, where: str) -> AddressPattern:
    try:
        return parse_pattern(_text(value, where))
    except AddressPatternError as exc:
        raise AclConfigError(f"{where}: {exc}") from None


def _perm(value: Any, where: str) -> int:
    text = _text(value, where)
    if text is None:
        return DENY  # Apache: a missing default permission is DENY
    perm = parse_perm(text)
    if perm is None:
        raise AclConfigError(f"{where}: {text!r} is not a permission (one of {', '.join(PERM_WORDS)})")
    return perm


def _resource_perms(value: Any, where: str, is_topic: bool, into: dict[str, int]) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise AclConfigError(f"{where} must be a list of name=PERM entries")
    for i, entry in enumerate(value):
        text = _text(entry, f"{where}[{i}]", required=True)
        parts = [p for p in text.split("=") if p]
        if len(parts) != 2 or not parts[0].strip():
            raise AclConfigError(f"{where}[{i}]: {text!r} is not name=PERM (e.g. topicA=PUB|SUB)")
        name = parts[0].strip()
        into[name if is_topic else retry_topic(name)] = _perm(parts[1], f"{where}[{i}]")


def _admin(value: Any, where: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise AclConfigError(f"{where} must be true or false, got {value!r}")


def _account(raw: Any, where: str) -> Account:
    if not isinstance(raw, dict):
        raise AclConfigError(f"{where} must be a mapping of accessKey, secretKey, ...")
    unknown = sorted(str(k) for k in raw if k not in ACCOUNT_KEYS)
    if unknown:
        log.warning("%s: ignoring unknown key(s) %s (known: %s)", where, ", ".join(unknown), ", ".join(ACCOUNT_KEYS))
    access_key = _text(raw.get("accessKey"), f"{where}.accessKey", required=True)
    secret_key = _text(raw.get("secretKey"), f"{where}.secretKey", required=True)
    if len(access_key) < KEY_MIN_LENGTH:
        raise AclConfigError(f"{where}.accessKey {access_key!r} must be longer than {KEY_MIN_LENGTH - 1} characters")
    if len(secret_key) < KEY_MIN_LENGTH:
        raise AclConfigError(f"{where}.secretKey must be longer than {KEY_MIN_LENGTH - 1} characters")
    perms: dict[str, int] = {}
    _resource_perms(raw.get("groupPerms"), f"{where}.groupPerms", False, perms)
    _resource_perms(raw.get("topicPerms"), f"{where}.topicPerms", True, perms)
    return Account(access_key=access_key, secret_key=secret_key,
                   white=_pattern(raw.get("whiteRemoteAddress"), f"{where}.whiteRemoteAddress"),
                   admin=_admin(raw.get("admin"), f"{where}.admin"),
                   default_topic_perm=_perm(raw.get("defaultTopicPerm"), f"{where}.defaultTopicPerm"),
                   default_group_perm=_perm(raw.get("defaultGroupPerm"), f"{where}.defaultGroupPerm"),
                   perms=perms)


def parse_rules(data: Any, source: str) -> AclRules:
    """Rules from the file's parsed YAML; errors are prefixed with ``source``."""
    try:
        if data is None:  # an empty file: no account, no whitelist — every request is refused
            return AclRules((), {})
        if not isinstance(data, dict):
            raise AclConfigError(f"the top level must be a mapping ({GLOBAL_WHITE}, {ACCOUNTS})")
        white_raw = data.get(GLOBAL_WHITE) or []
        if not isinstance(white_raw, list):
            raise AclConfigError(f"{GLOBAL_WHITE} must be a list of address patterns")
        white = tuple(_pattern(v, f"{GLOBAL_WHITE}[{i}]") for i, v in enumerate(white_raw))
        accounts_raw = data.get(ACCOUNTS) or []
        if not isinstance(accounts_raw, list):
            raise AclConfigError(f"{ACCOUNTS} must be a list of accounts")
        accounts: dict[str, Account] = {}
        for i, raw in enumerate(accounts_raw):
            account = _account(raw, f"{ACCOUNTS}[{i}]")
            if account.access_key in accounts:
                raise AclConfigError(f"{ACCOUNTS}[{i}].accessKey {account.access_key!r} is already defined above")
            accounts[account.access_key] = account
        return AclRules(white, accounts)
    except AclConfigError as exc:
        raise AclConfigError(f"{source}: {exc}") from None


def load_rules(path: str | os.PathLike) -> AclRules:
    """Read and check ``plain_acl.yml``; every problem is an :class:`AclConfigError` naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AclConfigError(f"ACL file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AclConfigError(f"ACL file {p}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AclConfigError(f"ACL file {p}: not valid YAML: {exc}") from None
    return parse_rules(data, f"ACL file {p}")


def acl_file_location(acl_file_path: str, config_path: str | os.PathLike | None) -> Path:
    """Where the ACL file is: ``aclFilePath`` (default ``conf/plain_acl.yml``) resolved against the
    directory of the broker's config file, as Apache resolves it against ``ROCKETMQ_HOME``. Without a
    config file there is nothing to resolve a relative path against: it must be absolute."""
    text = acl_file_path.strip()
    if not text:
        raise AclConfigError("aclFilePath is empty: it names the ACL file (default conf/plain_acl.yml, "
                             "beside the broker's config file)")
    given = Path(text).expanduser()
    if given.is_absolute():
        return given
    if config_path is None:
        raise AclConfigError(f"aclEnable=true: aclFilePath {text} is relative to the broker's config file, and "
                             f"the broker was given none: give an absolute aclFilePath")
    return Path(config_path).resolve().parent / given

