"""Reading broker settings: our TOML or Apache's own ``broker.conf`` (Java properties), one key table.

``rocketlake broker start -c FILE`` takes either: ``.toml`` is TOML; ``.conf``/``.properties`` is Java
properties; any other name is TOML if it parses as TOML and properties otherwise. Both go through
:func:`check_entries`, so a key means the same in either format and in UPDATE_BROKER_CONFIG:
declared keys are type-checked, Apache keys we do not implement are ignored with a warning (once)
or refused (see :mod:`~broker.server.settings.apache_keys`), and anything else is an error naming
the key, with a "did you mean" for a near miss.
"""

from __future__ import annotations

import difflib
import logging
import os
import tomllib
from pathlib import Path
from typing import Any

from broker.remoting import java_properties
from broker.server.settings.apache_keys import APACHE_ONLY_KEYS, IMPLIED_BY_SETTINGS, STORE_PATH
from broker.server.settings.declared import (
    KEY_ALIASES,
    SETTING_FIELDS,
    BrokerSettings,
    SettingsError,
    convert,
    format_value,
)

log = logging.getLogger(__name__)

TOML = "toml"
PROPERTIES = "properties"
PROPERTIES_SUFFIXES = (".conf", ".properties")
_FIELD_NAMES = {f.name: key for key, f in SETTING_FIELDS.items()}  # snake_case spelling, accepted too
_warned: set[str] = set()


def canonical_key(key: str) -> str | None:
    """The broker.conf name of a declared setting (``maxMessageSize``, ``max_message_size``, or another
    Apache name of it such as ``tls.server.mode``), or None."""
    if key in SETTING_FIELDS:
        return key
    return _FIELD_NAMES.get(key) or KEY_ALIASES.get(key)


def _suggestion(key: str) -> str:
    known = [*SETTING_FIELDS, *APACHE_ONLY_KEYS]
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.75)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def unknown_key_message(key: str, source: str) -> str:
    return f"{source}: unknown broker setting {key!r}{_suggestion(key)}"


def refused_key_message(key: str, value: Any, source: str) -> str | None:
    """Why an Apache-only key with this value is refused, or None when it is harmless."""
    spec = APACHE_ONLY_KEYS[key]
    text = format_value(value).strip()
    if spec.is_harmless(text):
        return None
    return f"{source}: {key}={text}: not supported by rocketlake: {spec.reason}"


def _warn_ignored(key: str, source: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("%s: %s ignored: %s", source, key, APACHE_ONLY_KEYS[key].reason)


def check_entries(data: dict[str, Any], source: str) -> dict[str, Any]:
    """Declared settings among ``data`` as field name → typed value. Harmless Apache-only keys are
    dropped (one warning per key and process); refused and unknown keys raise, naming the key."""
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # field → the key it was given under
    for key, value in data.items():
        canonical = canonical_key(key)
        if canonical is not None:
            name = SETTING_FIELDS[canonical].name
            if name in spelled:
                raise SettingsError(f"{source}: {canonical} is given twice (as {spelled[name]} and as {key})")
            spelled[name] = key
            values[name] = convert(canonical, value, source)
        elif key in APACHE_ONLY_KEYS:
            refused = refused_key_message(key, value, source)
            if refused:
                raise SettingsError(refused)
            if key not in IMPLIED_BY_SETTINGS:  # those are checked, not ignored (_check_implied_keys)
                _warn_ignored(key, source)
        else:
            raise SettingsError(unknown_key_message(key, source))
    return values


def settings_from_mapping(data: dict[str, Any], source: str = "<settings>") -> BrokerSettings:
    """Settings from broker.conf keys (or their snake_case field names); values are type-checked."""
    values = check_entries(data, source)
    try:
        settings = BrokerSettings(**values)
    except SettingsError as exc:
        raise SettingsError(f"{source}: {exc}") from None
    _check_implied_keys(data, settings, source)
    return settings


def _check_implied_keys(data: dict[str, Any], settings: BrokerSettings, source: str) -> None:
    """An Apache-only key of :data:`IMPLIED_BY_SETTINGS` is harmless only with the value rocketlake
    uses anyway (a store path under storePathRootDir, or a declared setting's value); another value
    asks for something the broker would not do, so it is refused, naming both values."""
    for key, (kind, what) in IMPLIED_BY_SETTINGS.items():
        given = str(data.get(key, "")).strip()
        if not given:
            continue
        if kind == STORE_PATH:
            root = settings.store_path_root_dir
            wanted = str(Path(root) / what) if root else f"<storePathRootDir>/{what}"
            same = bool(root) and Path(given).resolve() == Path(wanted).resolve()
            unset = "" if root else " (storePathRootDir is not set)"
        else:
            wanted = str(getattr(settings, what))
            same, unset = given == wanted, ""
        if not same:
            raise SettingsError(f"{source}: {key}={given}: not supported by rocketlake: "
                                f"{APACHE_ONLY_KEYS[key].reason}; only {wanted} is accepted{unset}")


def detect_format(path: Path, text: str) -> str:
    """``.toml`` → TOML, ``.conf``/``.properties`` → properties, else TOML when it parses as TOML."""
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return TOML
    if suffix in PROPERTIES_SUFFIXES:
        return PROPERTIES
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return PROPERTIES
    return TOML


def read_config_file(path: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """``(format, key → value)`` of a broker config file; TOML's ``[broker]`` table if it has one."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise SettingsError(f"broker config {p} does not exist") from None
    except OSError as exc:
        raise SettingsError(f"broker config {p}: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode(java_properties.FILE_ENCODING)
    fmt = detect_format(p, text)
    if fmt == PROPERTIES:
        try:
            return fmt, java_properties.loads(raw.decode(java_properties.FILE_ENCODING))
        except java_properties.PropertiesError as exc:
            raise SettingsError(f"broker config {p}: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"broker config {p}: {exc}") from None
    table = data.get("broker", data)
    if not isinstance(table, dict):
        raise SettingsError(f"broker config {p}: [broker] must be a table")
    return fmt, _dotted(table)


def _dotted(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """TOML reads Apache's dotted names (``tls.server.certPath = "…"``) as nested tables; back to the
    one dotted key they are in broker.conf. A quoted key (``"tls.server.certPath"``) is already one."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def load_settings(path: str | os.PathLike | None, **overrides: Any) -> BrokerSettings:
    """Read a broker config file (TOML or Apache's broker.conf) and apply command-line overrides."""
    base = BrokerSettings()
    if path is not None:
        _, data = read_config_file(path)
        base = settings_from_mapping(data, str(path))
    try:
        return base.with_overrides(**overrides)
    except SettingsError as exc:
        raise SettingsError(f"command line: {exc}") from None
