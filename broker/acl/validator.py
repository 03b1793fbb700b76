"""Apache's check order (``PlainPermissionManager.validate`` + ``checkPerm``), on a decoded request.

1. a host on ``globalWhiteRemoteAddresses`` is let in, signed or not;
2. no ``AccessKey`` → refused; an unknown one → refused;
3. a host on the account's ``whiteRemoteAddress`` is let in without a signature check;
4. the signature is recomputed over every extField but ``Signature`` (and, from clients up to 4.9.3,
   ``_UNIQUE_KEY_QUERY``) plus the body, with the account's secret — a mismatch is refused;
5. an admin-only request code from a non-admin account is refused;
6. every resource the request needs must be allowed, by the account's own entry for it or else by
   its default topic/group permission (an admin account without any entries may do anything).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.acl.config import Account, AclRules
from broker.acl.errors import FRAME_CHECK_PERM, AclDenied
from broker.acl.permission import check_permission
from broker.acl.resources import requested
from broker.acl.signature import ACCESS_KEY, SIGNATURE, UNIQUE_MSG_QUERY_FLAG, sign, signature_matches, signed_content
from broker.remoting.codes import Version
from broker.store.topics import RETRY_GROUP_TOPIC_PREFIX, is_retry_topic

# clients up to this version leave _UNIQUE_KEY_QUERY out of what they sign
UNSIGNED_UNIQUE_KEY_UP_TO = Version.V4_9_4 - 1  # V4_9_3


@dataclass(frozen=True)
class AccessRequest:
    """The parts of a request the ACL looks at."""

    code: int
    ext: Mapping[str, str]
    body: bytes
    host: str
    version: int = 0


def _describe(resource: str) -> str:
    """``PlainAccessResource.printStr``: ``group:G`` for a retry topic, else ``topic:T``."""
    if is_retry_topic(resource):
        return f"group:{resource[len(RETRY_GROUP_TOPIC_PREFIX):]}"
    return f"topic:{resource}"


def _check_perms(request: AccessRequest, need: dict[str, int], account: Account, admin_codes: frozenset[int]) -> None:
    if request.code in admin_codes and not account.admin:
        raise AclDenied(f"Need admin permission for request code={request.code}, but accessKey="
                        f"{account.access_key} is not", FRAME_CHECK_PERM)
    if not need or (not account.perms and account.admin):
        return
    for resource, perm in need.items():
        owned = account.perms.get(resource)
        if owned is None:
            owned = account.default_group_perm if is_retry_topic(resource) else account.default_topic_perm
        if not check_permission(perm, owned):
            raise AclDenied(f"No default permission for {_describe(resource)}", FRAME_CHECK_PERM)


def validate(rules: AclRules, request: AccessRequest, admin_codes: frozenset[int]) -> None:
    """Return if ``request`` may proceed; raise :class:`AclDenied` (Apache's message) if not.
    The resources are worked out first, as Apache parses before it validates: a request too broken
    to tell is refused even from a whitelisted host."""
    need = requested(request.code, request.ext, request.body)
    if any(p.matches(request.host) for p in rules.global_white):
        return
    access_key = request.ext.get(ACCESS_KEY)
    if access_key is None:
        raise AclDenied("No accessKey is configured")
    account = rules.accounts.get(access_key)
    if account is None:
        raise AclDenied(f"No acl config for {access_key}")
    if account.white.matches(request.host):
        return
    skip = (UNIQUE_MSG_QUERY_FLAG,) if request.version <= UNSIGNED_UNIQUE_KEY_UP_TO else ()
    expected = sign(signed_content(request.ext, request.body, skip), account.secret_key)
    if not signature_matches(expected, request.ext.get(SIGNATURE)):
        raise AclDenied(f"Check signature failed for accessKey={access_key}")
    _check_perms(request, need, account, admin_codes)
