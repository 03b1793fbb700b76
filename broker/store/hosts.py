"""Born/store host fields: 4 or 16 address bytes followed by a 4-byte int port."""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

from broker.store.record_layout import IPV4_HOST_SIZE, IPV6_HOST_SIZE


@dataclass(frozen=True, slots=True)
class Host:
    """An address (4 or 16 raw bytes) and a port, as stored in a commitlog record."""

    address: bytes
    port: int

    def __post_init__(self) -> None:
        if len(self.address) not in (4, 16):
            raise ValueError(f"host address must be 4 or 16 bytes, got {len(self.address)}")

    @property
    def is_ipv6(self) -> bool:
        return len(self.address) == 16

    @property
    def size(self) -> int:
        return IPV6_HOST_SIZE if self.is_ipv6 else IPV4_HOST_SIZE

    def encode(self) -> bytes:
        return self.address + struct.pack(">i", self.port)

    def __str__(self) -> str:
        return format_host(self.address, self.port)

    @classmethod
    def parse(cls, text: str) -> "Host":
        """Parse ``a.b.c.d:port`` or ``[v6]:port``."""
        text = text.strip()
        if text.startswith("["):
            addr_text, _, port_text = text[1:].partition("]:")
        else:
            addr_text, _, port_text = text.rpartition(":")
        if not addr_text or not port_text:
            raise ValueError(f"host {text!r} is not 'a.b.c.d:port' or '[v6]:port'")
        return cls(ipaddress.ip_address(addr_text).packed, int(port_text))

    @classmethod
    def decode(cls, buf: bytes | memoryview, pos: int, ipv6: bool) -> "Host":
        n = 16 if ipv6 else 4
        return cls(bytes(buf[pos : pos + n]), struct.unpack_from(">i", buf, pos + n)[0])


def format_host(address: bytes, port: int) -> str:
    """``a.b.c.d:port`` for IPv4, ``[compressed v6]:port`` for IPv6 (RFC 5952 text)."""
    if len(address) == 4:
        return f"{address[0]}.{address[1]}.{address[2]}.{address[3]}:{port}"
    return f"[{socket.inet_ntop(socket.AF_INET6, address)}]:{port}"
