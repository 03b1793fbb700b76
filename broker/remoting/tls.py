"""TLS for the remoting transport: modes, settings names, contexts, and certificate rotation.

Apache RocketMQ 4.9 (``TlsMode``, ``TlsSystemConfig``, ``TlsHelper``, ``NettyRemotingServer``'s
handshake handler) serves one port in one of three modes:

* ``disabled`` — plaintext only; a TLS handshake is refused (the connection is closed);
* ``permissive`` — the first byte of each connection decides: 0x16 (a TLS handshake record) is served
  over TLS, anything else in plaintext, on the same port;
* ``enforcing`` — TLS only; a plaintext client is refused (the connection is closed).

The server's certificate chain and key are PEM files; a client certificate is asked for when
``tls.server.need.client.auth`` is ``optional`` or ``require`` and then verified against
``tls.server.trustCertPath``. Like Apache's broker (``FileWatchService``), a running server reloads
its certificate when the files change: :class:`ServerTls` polls their signatures, and only new
connections use the new context, while established ones keep the session they negotiated. A file
that cannot be loaded (half written, wrong key) keeps the last good context and is logged.

The setting names below are Apache's (``TlsSystemConfig`` system properties; the mode is its
``tlsMode``); the broker declares them once in ``broker.server.settings.declared`` and the name
server's command line maps its flags onto the same :class:`ServerTlsConfig`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import ssl
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Apache's names (TlsSystemConfig); errors name the setting they come from.
MODE_KEY = "tlsMode"
MODE_PROPERTY = "tls.server.mode"  # Apache's system property for the same mode: read as MODE_KEY
CERT_PATH_KEY = "tls.server.certPath"
KEY_PATH_KEY = "tls.server.keyPath"
KEY_PASSWORD_KEY = "tls.server.keyPassword"
TRUST_CERT_PATH_KEY = "tls.server.trustCertPath"
NEED_CLIENT_AUTH_KEY = "tls.server.need.client.auth"
# the broker's own outgoing connections (NettyClientConfig.useTLS; its system property tls.enable)
USE_TLS_KEY = "useTLS"
USE_TLS_PROPERTY = "tls.enable"
CLIENT_CERT_PATH_KEY = "tls.client.certPath"
CLIENT_KEY_PATH_KEY = "tls.client.keyPath"
CLIENT_KEY_PASSWORD_KEY = "tls.client.keyPassword"
CLIENT_TRUST_CERT_PATH_KEY = "tls.client.trustCertPath"
CLIENT_AUTH_SERVER_KEY = "tls.client.authServer"

TLS_HANDSHAKE_RECORD = 0x16  # first byte of a TLS ClientHello record (Apache's HandshakeHandler peeks it)
HANDSHAKE_TIMEOUT_S = 10.0  # Netty SslHandler's default handshake timeout
# How long a permissive/enforcing server waits for a new connection's first byte before giving up on
# it: Apache's serverChannelMaxIdleTimeSeconds (120 s), after which it closes an idle channel anyway.
FIRST_BYTE_TIMEOUT_S = 120.0
WATCH_INTERVAL_S = 1.0  # certificate files are polled this often (Apache's FileWatchService: 500 ms)


class TlsMode(str, enum.Enum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


class ClientAuth(str, enum.Enum):
    """``tls.server.need.client.auth`` (Netty's ``ClientAuth``)."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"


_VERIFY_MODE = {ClientAuth.NONE: ssl.CERT_NONE, ClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
                ClientAuth.REQUIRE: ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    """A TLS setting is wrong or a file it names cannot be used; the message names setting and path."""


def _choice(kind: type[enum.Enum], value: object, key: str):
    """``value`` as a member of ``kind`` (text in any case, blanks trimmed); the error names ``key``."""
    if isinstance(value, kind):
        return value
    try:
        return kind(str(value).strip().lower())
    except ValueError:
        raise TlsConfigError(f"{key}={value}: must be one of {', '.join(m.value for m in kind)}") from None


@dataclass(frozen=True)
class ServerTlsConfig:
    """The server side's TLS settings, checked for consistency (files are read by :func:`server_context`)."""

    mode: TlsMode = TlsMode.DISABLED
    cert_path: str = ""
    key_path: str = ""
    key_password: str = ""
    trust_cert_path: str = ""
    need_client_auth: ClientAuth = ClientAuth.NONE

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", _choice(TlsMode, self.mode, MODE_KEY))
        object.__setattr__(self, "need_client_auth", _choice(ClientAuth, self.need_client_auth, NEED_CLIENT_AUTH_KEY))
        if self.mode is TlsMode.DISABLED:
            return
        for key, value in ((CERT_PATH_KEY, self.cert_path), (KEY_PATH_KEY, self.key_path)):
            if not value:
                raise TlsConfigError(f"{MODE_KEY}={self.mode.value} needs {key} (a PEM file); it is not set")
        if self.need_client_auth is not ClientAuth.NONE and not self.trust_cert_path:
            raise TlsConfigError(f"{NEED_CLIENT_AUTH_KEY}={self.need_client_auth.value} needs "
                                 f"{TRUST_CERT_PATH_KEY} (the PEM certificates client certificates are verified "
                                 f"against); it is not set")

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.DISABLED

    @property
    def watched_files(self) -> tuple[tuple[str, str], ...]:
        """(setting, path) of every file the context is built from."""
        files = [(CERT_PATH_KEY, self.cert_path), (KEY_PATH_KEY, self.key_path)]
        if self.need_client_auth is not ClientAuth.NONE:
            files.append((TRUST_CERT_PATH_KEY, self.trust_cert_path))
        return tuple(files)


def _check_readable(key: str, path: str) -> None:
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except FileNotFoundError:
        raise TlsConfigError(f"{key}={path}: no such file") from None
    except IsADirectoryError:
        raise TlsConfigError(f"{key}={path}: is a directory, not a PEM file") from None
    except OSError as exc:
        raise TlsConfigError(f"{key}={path}: cannot be read: {exc.strerror or exc}") from None


def server_context(cfg: ServerTlsConfig) -> ssl.SSLContext:
    """A server ``SSLContext`` from the configured PEM files; TlsConfigError names what is wrong."""
    for key, path in cfg.watched_files:
        _check_readable(key, path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cfg.cert_path, cfg.key_path, password=cfg.key_password or None)
    except ssl.SSLError as exc:
        raise TlsConfigError(f"{CERT_PATH_KEY}={cfg.cert_path}, {KEY_PATH_KEY}={cfg.key_path}: not a PEM "
                             f"certificate chain and its private key (or the key does not match it, or "
                             f"{KEY_PASSWORD_KEY} is wrong): {exc.reason or exc}") from None
    ctx.verify_mode = _VERIFY_MODE[cfg.need_client_auth]
    if cfg.need_client_auth is not ClientAuth.NONE:
        try:
            ctx.load_verify_locations(cafile=cfg.trust_cert_path)
        except ssl.SSLError as exc:
            raise TlsConfigError(f"{TRUST_CERT_PATH_KEY}={cfg.trust_cert_path}: no PEM certificate in it: "
                                 f"{exc.reason or exc}") from None
    return ctx


def _signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class ServerTls:
    """A server's TLS mode and its current context, rebuilt when the certificate files change.

    Built once per server process; ``context`` is what the next accepted TLS connection uses.
    Raises TlsConfigError at construction when the files cannot be used: a server must not start
    with a certificate it cannot serve."""

    def __init__(self, config: ServerTlsConfig, *, watch_interval_s: float = WATCH_INTERVAL_S) -> None:
        self.config = config
        self.watch_interval_s = watch_interval_s
        self.context: ssl.SSLContext | None = None
        self._signatures = self._current_signatures()
        if config.enabled:
            self.context = server_context(config)
        self.reloads = 0  # contexts built after the first: rotation seen by this process

    @property
    def mode(self) -> TlsMode:
        return self.config.mode

    def _current_signatures(self) -> tuple:
        return tuple(_signature(path) for _, path in self.config.watched_files)

    def reload_if_changed(self) -> bool:
        """Rebuild the context if a watched file changed since the last look; True when it was
        replaced. A file that does not load keeps the old context (logged once per change): a
        rotation writes the certificate and the key one after the other, and between the two the
        pair does not match."""
        signatures = self._current_signatures()
        if signatures == self._signatures:
            return False
        self._signatures = signatures
        try:
            context = server_context(self.config)
        except TlsConfigError as exc:
            log.warning("TLS certificate files changed but cannot be loaded; keeping the previous "
                        "certificate: %s", exc)
            return False
        self.context = context
        self.reloads += 1
        log.info("TLS certificate files changed: new connections use the reloaded certificate (%s)",
                 ", ".join(f"{key}={path}" for key, path in self.config.watched_files))
        return True

    async def watch(self) -> None:
        """Poll the files until cancelled (one task per serving process)."""
        while True:
            await asyncio.sleep(self.watch_interval_s)
            try:
                self.reload_if_changed()
            except Exception:  # noqa: BLE001 - the watcher must outlive any surprise
                log.exception("TLS certificate watcher failed; it keeps watching")


@dataclass(frozen=True)
class ClientTlsConfig:
    """A client's TLS: verify the server against ``ca_file`` (or the system's CAs when neither it nor
    ``insecure`` is given), or skip verification with ``insecure=True`` (self-signed test servers;
    Apache's client does that by default, ``tls.test.mode.enable``). ``cert_file``/``key_file`` give
    a client certificate for mutual TLS. ``check_hostname`` matches the server's certificate with
    the host of the address dialled (Apache's client does not; turn it off for such certificates)."""

    ca_file: str = ""
    insecure: bool = False
    cert_file: str = ""
    key_file: str = ""
    key_password: str = ""
    check_hostname: bool = True
    # the setting each field came from, for errors (a broker's tls.client.*); empty: the field's name
    names: tuple[str, str, str] = ("", "", "")  # ca_file, cert_file, key_file

    def __post_init__(self) -> None:
        if self.insecure and self.ca_file:
            raise TlsConfigError("client TLS: give ca_file (verify the server) or insecure=True, not both")
        if self.key_file and not self.cert_file:
            raise TlsConfigError("client TLS: key_file needs cert_file")


def client_context(cfg: ClientTlsConfig) -> ssl.SSLContext:
    """A client ``SSLContext``; TlsConfigError names the file that cannot be used."""
    ca_name, cert_name, key_name = (given or default for given, default in
                                    zip(cfg.names, ("ca_file", "cert_file", "key_file")))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cfg.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.check_hostname = cfg.check_hostname
        if cfg.ca_file:
            _check_readable(ca_name, cfg.ca_file)
            try:
                ctx.load_verify_locations(cafile=cfg.ca_file)
            except ssl.SSLError as exc:
                raise TlsConfigError(f"{ca_name}={cfg.ca_file}: no PEM certificate in it: {exc.reason or exc}") from None
        else:
            ctx.load_default_certs()
    if cfg.cert_file:
        _check_readable(cert_name, cfg.cert_file)
        if cfg.key_file:
            _check_readable(key_name, cfg.key_file)
        try:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None, password=cfg.key_password or None)
        except ssl.SSLError as exc:
            raise TlsConfigError(f"{cert_name}={cfg.cert_file}, {key_name}={cfg.key_file}: not a PEM certificate "
                                 f"and its private key (or a wrong password): {exc.reason or exc}") from None
    return ctx
