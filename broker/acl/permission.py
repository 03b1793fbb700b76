"""Apache's ``Permission``: the permission bits, their spelling in ``plain_acl.yml``, and the
request codes only an admin account may send."""

from __future__ import annotations

from broker.remoting.codes import RequestCode

DENY = 1
ANY = 1 << 1
PUB = 1 << 2
SUB = 1 << 3

# how plain_acl.yml spells them (Permission.parsePermFromString; surrounding blanks ignored)
PERM_WORDS = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}

# Permission.ADMIN_CODE in 4.9: requests that change the broker's topics, groups or settings
ADMIN_CODES = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC,
    RequestCode.UPDATE_BROKER_CONFIG,
    RequestCode.DELETE_TOPIC_IN_BROKER,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_SUBSCRIPTIONGROUP,
})
# the name server's own admin requests (Apache 4.9's name server has no ACL; ours guards these)
NAMESRV_ADMIN_CODES = frozenset({
    RequestCode.PUT_KV_CONFIG,
    RequestCode.DELETE_KV_CONFIG,
    RequestCode.DELETE_TOPIC_IN_NAMESRV,
    RequestCode.UPDATE_NAMESRV_CONFIG,
})


def parse_perm(text: str) -> int | None:
    """``"PUB|SUB"`` → PUB|SUB; None for a word Apache does not know (it would read it as DENY)."""
    return PERM_WORDS.get(text.strip())


def check_permission(needed: int, owned: int) -> bool:
    """``Permission.checkPermission``: DENY wins; ANY is satisfied by PUB or SUB; else the bits must meet."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def perm_name(perm: int) -> str:
    """A permission as plain_acl.yml would spell it, for logs."""
    names = [w for w, bit in (("DENY", DENY), ("ANY", ANY), ("PUB", PUB), ("SUB", SUB)) if perm & bit]
    return "|".join(names) or "0"
