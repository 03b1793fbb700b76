"""The request signature of Apache's plain ACL (``AclUtils.combineRequestContent``, ``AclSigner``).

Content = the request's extFields sorted by key (Java's ``TreeMap``: UTF-16 code-unit order), minus
``Signature``, their values concatenated and encoded as UTF-8, followed by the body. Signature =
Base64(HMAC-SHA1(secretKey, content)). The client signs what it sends and the server recomputes over
what arrived — every field, whoever added it (the C++ client adds ``OnsChannel``) — so both sides
agree without knowing each other's header classes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from broker.remoting.command import RemotingCommand, normalise_ext

# SessionCredentials' extFields names
ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"  # MixAll.UNIQUE_MSG_QUERY_FLAG: unsigned by clients up to 4.9.3
CHARSET = "utf-8"  # SessionCredentials.CHARSET


def _java_key_order(key: str) -> bytes:
    """``String.compareTo`` order: UTF-16 code units, which differs from code points above U+FFFF."""
    return key.encode("utf-16-be", "surrogatepass")


def signed_content(ext: Mapping[str, str], body: bytes | None, skip: Iterable[str] = ()) -> bytes:
    """The bytes a signature covers: sorted extFields values (without ``Signature`` and ``skip``), then the body."""
    left_out = {SIGNATURE, *skip}
    values = "".join(ext[k] for k in sorted(ext, key=_java_key_order) if k not in left_out)
    return values.encode(CHARSET, "surrogatepass") + (body or b"")


def sign(content: bytes, secret_key: str) -> str:
    """Base64 of HMAC-SHA1 over ``content`` keyed with ``secret_key`` (UTF-8), as ``AclSigner``."""
    digest = hmac.new(secret_key.encode(CHARSET, "surrogatepass"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signature_matches(expected: str, given: str | None) -> bool:
    """Constant-time comparison (a timing difference must not leak how much of a forgery was right)."""
    return given is not None and hmac.compare_digest(expected.encode(CHARSET, "surrogatepass"),
                                                     given.encode(CHARSET, "surrogatepass"))


@dataclass(frozen=True)
class SessionCredentials:
    """What a client signs with (Apache's ``SessionCredentials``); ``security_token`` is optional."""

    access_key: str
    secret_key: str
    security_token: str | None = None

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("ACL credentials need both an access key and a secret key")

    def __repr__(self) -> str:  # never print the secret
        return f"SessionCredentials(access_key={self.access_key!r})"

    def sign_request(self, cmd: RemotingCommand) -> None:
        """Sign a request about to be sent (``RemotingClient(before_request=creds.sign_request)``)."""
        cmd.ext_fields = normalise_ext(cmd.ext_fields)  # sign the text that goes on the wire
        self.sign_ext(cmd.ext_fields, cmd.body)

    def sign_ext(self, ext: dict[str, str], body: bytes | None) -> None:
        """Add ``AccessKey``, ``SecurityToken`` (if any) and ``Signature`` to ``ext`` in place
        (``AclClientRPCHook.doBeforeRequest``): the signature covers every other field and the body."""
        ext.pop(SIGNATURE, None)
        ext[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            ext[SECURITY_TOKEN] = self.security_token
        ext[SIGNATURE] = sign(signed_content(ext, body), self.secret_key)
