"""GET_BROKER_CONFIG (26) and UPDATE_BROKER_CONFIG (25): the broker's settings, read and changed live.

As Apache's ``AdminBrokerProcessor``:

* GET answers every effective setting as ``key=value`` lines (``MixAll.properties2String``) and the
  configuration's ``DataVersion`` as JSON in the ``version`` header field
  (``GetBrokerConfigResponseHeader``); the version's counter goes up with every applied update.
* UPDATE's body is properties text (``MixAll.string2Properties``). Apache applies whatever keys it
  knows and ignores the rest; we apply all or nothing and refuse instead of ignoring, naming the key:
  a key that cannot change while the broker runs, or one rocketlake does not implement, gets
  ``NO_PERMISSION`` (Apache's answer for keys it will not update); an unknown key, a bad value or a
  body that does not parse gets ``SYSTEM_ERROR`` (Apache's answer for an update it cannot read).
  Only :data:`~broker.server.settings.RUNTIME_KEYS` change at runtime: they are read per request
  (pull limits, long/short polling, client expiry, rejectTransactionMessage) or per run of the
  transaction check service (its timeout, check maximum and interval). Flush intervals, sizes,
  ports and identities are fixed when the store and the network processes start, so they are
  refused rather than accepted and not applied.

An applied update is written back into the broker's config file (see
:mod:`broker.server.settings.persist`) before it takes effect, so the broker restarts with it; a
broker started without a config file keeps the change until it stops.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker.remoting.bodies import dumps_json
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.headers import GetBrokerConfigResponseHeader
from broker.remoting import java_properties
from broker.server.processors import Reply, Request
from broker.server.settings import (
    RUNTIME_KEYS,
    SETTING_FIELDS,
    BrokerSettings,
    SettingsError,
    format_value,
    persist_updates,
    to_properties,
)
from broker.server.settings.apache_keys import APACHE_ONLY_KEYS
from broker.server.settings.declared import convert
from broker.server.settings.loading import canonical_key, unknown_key_message
from broker.store.config_files import DataVersion

if TYPE_CHECKING:
    from broker.server.processors import BrokerCore

log = logging.getLogger(__name__)

SOURCE = "UPDATE_BROKER_CONFIG"


class BrokerConfigAdmin:
    """The handlers of one :class:`~broker.server.processors.BrokerCore`; updates replace
    ``core.settings`` whole (request threads read one consistent object)."""

    def __init__(self, core: "BrokerCore", config_path: str | None) -> None:
        self.core = core
        self.config_path = config_path
        self.version = DataVersion()  # Configuration's dataVersion: counter 0, the start time
        self._lock = threading.Lock()

    def get_broker_config(self, req: Request) -> Reply:
        with self._lock:
            version = dumps_json(self.version.to_json()).decode("utf-8")
            body = to_properties(self.core.settings).encode("utf-8")
        return Reply(ext=GetBrokerConfigResponseHeader(version=version).to_ext(), body=body)

    def _check(self, props: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]] | Reply:
        """Field name → typed value and broker.conf key → value text, or the refusal."""
        values: dict[str, Any] = {}
        texts: dict[str, str] = {}
        for key, raw in props.items():
            canonical = canonical_key(key)
            if canonical is None:
                if key in APACHE_ONLY_KEYS:
                    return Reply(code=ResponseCode.NO_PERMISSION,
                                 remark=f"{key}: not supported by rocketlake: {APACHE_ONLY_KEYS[key].reason}")
                return Reply(code=ResponseCode.SYSTEM_ERROR, remark=unknown_key_message(key, SOURCE))
            if canonical not in RUNTIME_KEYS:
                return Reply(code=ResponseCode.NO_PERMISSION,
                             remark=f"{canonical} can not be changed while the broker runs (set it in the config "
                                    f"file and restart); runtime settings: {', '.join(sorted(RUNTIME_KEYS))}")
            try:
                value = convert(canonical, raw, SOURCE)
            except SettingsError as exc:
                return Reply(code=ResponseCode.SYSTEM_ERROR, remark=str(exc))
            values[SETTING_FIELDS[canonical].name] = value
            texts[canonical] = format_value(value)
        return values, texts

    def update_broker_config(self, req: Request) -> Reply:
        try:
            props = java_properties.loads(req.body.decode("utf-8"))
        except UnicodeDecodeError:
            return Reply(code=ResponseCode.SYSTEM_ERROR, remark="string2Properties error: the body is not UTF-8 text")
        except java_properties.PropertiesError as exc:
            return Reply(code=ResponseCode.SYSTEM_ERROR, remark=f"string2Properties error: {exc}")
        checked = self._check(props)
        if isinstance(checked, Reply):
            log.info("refused broker config update from %s: %s", req.peer, checked.remark)
            return checked
        values, texts = checked
        if not values:
            return Reply()
        with self._lock:
            try:
                new: BrokerSettings = replace(self.core.settings, **values)
            except SettingsError as exc:
                return Reply(code=ResponseCode.SYSTEM_ERROR, remark=f"{SOURCE}: {exc}")
            if self.config_path:
                try:
                    persist_updates(self.config_path, texts)
                except (OSError, SettingsError) as exc:
                    log.error("cannot write broker config %s: %s", self.config_path, exc)
                    return Reply(code=ResponseCode.SYSTEM_ERROR,
                                 remark=f"not applied: cannot write the config file {self.config_path}: {exc}")
            self.core.settings = new
            self.core.clients.channel_expired_s = new.client_channel_max_idle_time_seconds
            self.version.bump()
        log.info("broker config updated from %s: %s%s", req.peer, texts,
                 f" (written to {self.config_path})" if self.config_path else " (no config file: until restart)")
        return Reply()


def install_config_handlers(core: "BrokerCore", config_path: str | None) -> BrokerConfigAdmin:
    """Register GET/UPDATE_BROKER_CONFIG on ``core`` (called from its ``__init__``)."""
    admin = BrokerConfigAdmin(core, config_path)
    core.config_admin = admin
    core._handlers[RequestCode.GET_BROKER_CONFIG] = admin.get_broker_config
    core._handlers[RequestCode.UPDATE_BROKER_CONFIG] = admin.update_broker_config
    return admin
