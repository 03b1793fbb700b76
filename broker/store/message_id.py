"""Message ids: the broker's offsetMsgId and the client's UNIQ_KEY (MessageClientIDSetter format)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from broker.store.hosts import Host


def encode_offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """Uppercase hex of store address, port (int) and physical offset (long): 32 or 56 chars."""
    return (store_host.address + struct.pack(">iq", store_host.port, physical_offset)).hex().upper()


@dataclass(frozen=True, slots=True)
class OffsetMsgId:
    store_host: Host
    physical_offset: int


def decode_offset_msg_id(msg_id: str) -> OffsetMsgId:
    """Inverse of :func:`encode_offset_msg_id`; length 32 means IPv4, 56 means IPv6."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise ValueError(f"offsetMsgId {msg_id!r} is not hex") from exc
    if len(raw) == 16:
        n = 4
    elif len(raw) == 28:
        n = 16
    else:
        raise ValueError(f"offsetMsgId {msg_id!r} has {len(msg_id)} hex chars, expected 32 or 56")
    port, offset = struct.unpack_from(">iq", raw, n)
    return OffsetMsgId(Host(raw[:n], port), offset)


def _start_of_month_ms(now_ms: int) -> int:
    """Epoch ms of 00:00 on the 1st of the current month in local time (the Java client's base)."""
    local = datetime.fromtimestamp(now_ms / 1000).astimezone()
    start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp() * 1000)


class UniqKeyGenerator:
    """Generates UNIQ_KEYs the way the Java client does.

    Layout: client IP (4|16) · pid (short) · class-loader hash (int) · ms since the start of the month
    (int) · counter (short, wraps). The prefix is fixed per process; the rest changes per message.
    """

    def __init__(self, ip: bytes | None = None, pid: int | None = None, loader_hash: int | None = None) -> None:
        if ip is None:
            ip = _local_ip()
        if len(ip) not in (4, 16):
            raise ValueError("client ip must be 4 or 16 bytes")
        pid = os.getpid() if pid is None else pid
        loader_hash = (id(self) & 0x7FFFFFFF) if loader_hash is None else loader_hash
        self._prefix = (ip + struct.pack(">hi", pid & 0x7FFF, loader_hash)).hex().upper()
        self._lock = threading.Lock()
        self._counter = 0
        self._month_start = 0
        self._next_month_start = 0

    def _base(self, now_ms: int) -> int:
        if now_ms >= self._next_month_start or now_ms < self._month_start:
            self._month_start = _start_of_month_ms(now_ms)
            local = datetime.fromtimestamp(self._month_start / 1000).astimezone()
            nxt = local.replace(year=local.year + (local.month == 12), month=local.month % 12 + 1)
            self._next_month_start = int(nxt.timestamp() * 1000)
        return self._month_start

    def next(self, now_ms: int | None = None) -> str:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            base = self._base(now_ms)
            counter = self._counter
            self._counter = (counter + 1) & 0xFFFF
        # Java writes (int) (now - startTime): past ~24.8 days into a month the difference no longer
        # fits a signed int and wraps; the same four bytes, as unsigned hex. Formatted directly
        # (the hex of ``struct.pack(">IH", …)``): a network process makes one per drafted send
        return "%s%08X%04X" % (self._prefix, (now_ms - base) & 0xFFFFFFFF, counter)


def _local_ip() -> bytes:
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return bytes([127, 0, 0, 1])
