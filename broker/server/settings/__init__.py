"""Broker settings under Apache's ``broker.conf`` names: declared once, read from TOML or Apache's own
``broker.conf``, changed at runtime by UPDATE_BROKER_CONFIG and written back.

* :mod:`.declared` — every setting: name, type, default, description, whether it may change at runtime;
* :mod:`.apache_keys` — Apache keys we do not implement: ignored with a warning, or refused;
* :mod:`.loading` — config files (format detection, key checks, "did you mean");
* :mod:`.persist` — runtime updates written back into the config file.
"""

from broker.remoting.java_properties import dumps
from broker.server.settings.declared import (
    RUNTIME_KEYS,
    SETTING_FIELDS,
    BrokerSettings,
    SettingsError,
    format_value,
    key_of,
    settings_dict,
)
from broker.server.settings.loading import check_entries, load_settings, read_config_file, settings_from_mapping
from broker.server.settings.persist import persist_updates


def to_properties(settings: BrokerSettings) -> str:
    """Every effective setting as ``key=value`` lines (``MixAll.properties2String``), sorted by key:
    the body of GET_BROKER_CONFIG."""
    return dumps(settings_dict(settings))


__all__ = ["RUNTIME_KEYS", "SETTING_FIELDS", "BrokerSettings", "SettingsError", "check_entries", "format_value",
           "key_of", "load_settings", "persist_updates", "read_config_file", "settings_dict", "settings_from_mapping",
           "to_properties"]
