"""Whitelist address forms of Apache's plain ACL (``RemoteAddressStrategyFactory``, ``AclUtils``).

=====================================  =========================================================
form                                   matches
=====================================  =========================================================
blank / missing                        nothing
``*``, ``*.*.*.*``, ``*:*:*:*:*:*:*:*``  every address
``192.168.1.10``, ``::1``              that address (IPv6 compared fully expanded)
``192.168.1.1,10.0.0.2``               any address of the list
``192.168.1.{1,2}``, ``1::{a,b}``      the listed last groups
``192.168.*.*``, ``192.168.1.1-200``   a range in the first group holding ``*`` or ``a-b``
``1050::5:600:300c:*``, ``…:1-ff``     IPv6 ranges (hex), ``*`` only last, ``a-b`` last or before ``*``
=====================================  =========================================================

As in Apache an IPv4 pattern has all four groups (``192.168.*.*``, not ``192.168.*``). A pattern
Apache would reject — or accept and then fail on at match time — is an error at load.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

ALL = ("*", "*.*.*.*", "*:*:*:*:*:*:*:*")
IPV4_MAX = 255
IPV6_GROUP_MAX = 0xFFFF


class AddressPatternError(ValueError):
    """A whitelist pattern that is not one of Apache's forms."""


def is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
        return True
    except ValueError:
        return False


def is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
        return True
    except ValueError:
        return False


def expand_ip(address: str, groups: int) -> str:
    """``AclUtils.expandIP``: upper case, ``::`` widened to ``groups`` groups, each group 4 digits
    (an IPv4 address comes back unchanged)."""
    address = address.upper()
    pad = groups - address.count(":")
    if pad > 0:
        address = address.replace("::", ":" * (pad + 1))
    return ":".join(part.rjust(4, "0") for part in address.split(":"))


def host_of(peer: str) -> str:
    """The host of a ``host:port`` / ``[v6]:port`` peer (Apache cuts at the last colon)."""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class AddressPattern:
    """One whitelist entry; :meth:`matches` takes a bare host (no port)."""

    def matches(self, host: str) -> bool:
        raise NotImplementedError


class NoAddress(AddressPattern):
    def matches(self, host: str) -> bool:
        return False


class AnyAddress(AddressPattern):
    def matches(self, host: str) -> bool:
        return True


@dataclass(frozen=True)
class OneAddress(AddressPattern):
    expanded: str

    def matches(self, host: str) -> bool:
        return expand_ip(host, 8) == self.expanded


@dataclass(frozen=True)
class AddressList(AddressPattern):
    addresses: frozenset[str]  # IPv4 as written, IPv6 expanded

    def matches(self, host: str) -> bool:
        return (expand_ip(host, 8) if is_ipv6(host) else host) in self.addresses


@dataclass(frozen=True)
class AddressRange(AddressPattern):
    """``head`` (everything before the ranged group) and the range of that group."""

    ipv6: bool
    head: str
    index: int  # which group holds the range
    start: int
    end: int

    def matches(self, host: str) -> bool:
        if self.ipv6:
            if not is_ipv6(host):
                return False
            full = expand_ip(host, 8)
            if not full.startswith(self.head):
                return False
            value = int(full[5 * self.index:5 * self.index + 4], 16)
        else:
            if not is_ipv4(host) or not host.startswith(self.head):
                return False
            groups = host.split(".")
            value = int(groups[self.index])
        return self.start <= value <= self.end


def _split(text: str, sep: str) -> list[str]:
    """Apache's ``StringUtils.split``: empty tokens dropped."""
    return [t for t in text.split(sep) if t]


def _address_list(candidates: list[str], text: str) -> AddressList:
    found = set()
    for candidate in candidates:
        if is_ipv4(candidate):
            found.add(candidate)
        elif is_ipv6(candidate):
            found.add(expand_ip(candidate, 8))
        else:
            raise AddressPatternError(f"{candidate!r} (from {text!r}) is not an IPv4 or IPv6 address")
    return AddressList(frozenset(found))


def _braces(text: str) -> AddressList:
    """``192.168.1.{1,2}`` / ``1::{a,b}``: the brace group must be the last one."""
    sep = ":" if ":" in text else "."
    groups = _split(text, sep)
    last = groups[-1] if sep == ":" else (groups[3] if len(groups) > 3 else "")
    if not last.startswith("{"):
        raise AddressPatternError(f"{text!r}: a {{a,b}} list must be the last group of the address")
    prefix = text[:text.index("{")]
    return _address_list([prefix + item for item in _split(last[1:-1], ",")], text)


def _group_range(value: str, base: int, top: int, text: str) -> tuple[int, int] | None:
    """``*`` or ``a-b`` (decimal for IPv4, hex for IPv6) → (start, end); None for a plain group."""
    value = value.strip()
    if value == "*":
        return 0, top
    if "-" not in value:
        return None
    bounds = _split(value, "-")
    if value.startswith("-") or len(bounds) != 2:
        raise AddressPatternError(f"{text!r}: range {value!r} must be start-end")
    try:
        start, end = int(bounds[0], base), int(bounds[1], base)
    except ValueError:
        raise AddressPatternError(f"{text!r}: range {value!r} is not numeric") from None
    if not (0 <= start <= end <= top):
        raise AddressPatternError(f"{text!r}: range {value!r} must lie within 0..{top:{'x' if base == 16 else 'd'}} "
                                  f"with start <= end")
    return start, end


def _ipv4_range(text: str) -> AddressRange:
    groups = _split(text, ".")
    if len(groups) != 4:
        raise AddressPatternError(f"{text!r}: an IPv4 pattern has four groups (e.g. 192.168.*.*)")
    for index in (1, 2, 3):
        found = _group_range(groups[index], 10, IPV4_MAX, text)
        if found is not None and found[1] > 0:  # Apache takes the first group whose range ends above 0
            for fixed in groups[:index]:
                if not fixed.strip().isdigit() or int(fixed) > IPV4_MAX:
                    raise AddressPatternError(f"{text!r}: {fixed!r} is not a number 0..255")
            return AddressRange(False, "".join(g.strip() + "." for g in groups[:index]), index, *found)
    raise AddressPatternError(f"{text!r}: no group of 2..4 holds a range (* or a-b ending above 0)")


def _ipv6_range(text: str) -> AddressRange:
    star, minus = text.find("*"), text.find("-")
    if star > -1 and star != len(text) - 1:
        raise AddressPatternError(f"{text!r}: '*' may only be the last group")
    if minus > -1:
        bound = text.rfind(":") if star == -1 else text.rfind(":", 0, text.rfind(":"))
        if minus <= bound:
            raise AddressPatternError(f"{text!r}: a range a-b may only be the last group (or the one before '*')")
    groups = _split(text, ":")
    for index in range(1, len(groups)):
        found = _group_range(groups[index], 16, IPV6_GROUP_MAX, text)
        if found is not None and found[1] > 0:
            if star > -1 and minus > -1:
                head_groups, sub = 6, text[:text.rfind(":", 0, text.rfind(":"))]
            else:
                head_groups, sub = 7, text[:text.rfind(":")]
            head = expand_ip(sub, head_groups)
            for group in head.split(":"):
                try:
                    int(group, 16)
                except ValueError:
                    raise AddressPatternError(f"{text!r}: {group!r} is not an IPv6 group") from None
            return AddressRange(True, head, len(head.split(":")), *found)
    raise AddressPatternError(f"{text!r}: no group holds a range (* or a-b ending above 0)")


def parse_pattern(text: str | None) -> AddressPattern:
    """One whitelist entry; :class:`AddressPatternError` says what is wrong with it."""
    if text is None or not text.strip():
        return NoAddress()
    if text in ALL:
        return AnyAddress()
    if text.endswith("}"):
        return _braces(text)
    if "," in text:
        return _address_list(_split(text, ","), text)
    if "*" in text or "-" in text:
        return _ipv6_range(text) if ":" in text else _ipv4_range(text)
    if is_ipv4(text) or is_ipv6(text):
        return OneAddress(expand_ip(text, 8))
    raise AddressPatternError(f"{text!r} is not an IP address or one of the whitelist forms")
