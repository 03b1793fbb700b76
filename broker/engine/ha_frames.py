"""The HA (master/slave replication) wire format of Apache RocketMQ 4.x, held once here.

The HA link is a plain TCP connection from a slave to its master's ``haListenPort``, outside the
remoting protocol (no frames, no headers, no JSON). All integers are big-endian (Java's
``ByteBuffer``). Two kinds of bytes travel on it:

* **slave → master: offset report**, 8 bytes: the slave's max commitlog offset (``long``), i.e. the
  physical offset just past the last byte it holds. Sent right after connecting, after every
  transfer it appended, and every ``haSendHeartbeatInterval`` ms. The master reads whatever has
  arrived and keeps the *last complete* 8-byte report (``HAConnection.ReadSocketService``).
* **master → slave: transfer**, a 12-byte header — the physical offset of the first body byte
  (``long``) and the body size (``int``) — followed by that many raw commitlog bytes, exactly as in
  the master's files (records, BLANK end-of-file records and the zero padding after them). A body
  never spans two commitlog files and holds at most ``haTransferBatchSize`` bytes; it may end in the
  middle of a record. A **heartbeat** is a header with size 0, sent when the master has nothing new
  for ``haSendHeartbeatInterval`` ms; its offset is where the next transfer will start.

The slave appends a body only at its own max offset: a header whose offset differs (once the slave
holds anything) is an error, and the slave drops the connection (``HAClient.dispatchReadRequest``).
"""

from __future__ import annotations

import select
import socket
import struct
from dataclasses import dataclass

OFFSET_REPORT = struct.Struct(">q")  # slave → master: max commitlog offset
TRANSFER_HEADER = struct.Struct(">qi")  # master → slave: physical offset, body size
OFFSET_REPORT_SIZE = OFFSET_REPORT.size  # 8
TRANSFER_HEADER_SIZE = TRANSFER_HEADER.size  # 12
# An Apache slave reads into a 4 MiB buffer (HAClient.READ_MAX_BUFFER_SIZE): no transfer can be larger.
MAX_TRANSFER_BODY = 4 * 1024 * 1024 - TRANSFER_HEADER_SIZE


class HAFrameError(ValueError):
    """Bytes on an HA link that break the format (negative offset or size, oversized body)."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """One master → slave transfer: ``body`` belongs at commitlog offset ``offset`` (empty: heartbeat)."""

    offset: int
    body: bytes

    @property
    def is_heartbeat(self) -> bool:
        return not self.body

    @property
    def end(self) -> int:
        return self.offset + len(self.body)


def encode_offset_report(offset: int) -> bytes:
    if offset < 0:
        raise HAFrameError(f"offset report {offset} is negative")
    return OFFSET_REPORT.pack(offset)


def encode_transfer_header(offset: int, size: int) -> bytes:
    """The 12-byte header; the body bytes follow it on the wire (sent separately: no copy)."""
    if offset < 0 or size < 0:
        raise HAFrameError(f"transfer header offset {offset} size {size}: neither may be negative")
    return TRANSFER_HEADER.pack(offset, size)


def encode_transfer(offset: int, body: bytes) -> bytes:
    return encode_transfer_header(offset, len(body)) + body


def encode_heartbeat(offset: int) -> bytes:
    return encode_transfer_header(offset, 0)


class OffsetReportReader:
    """Master side: the last complete offset report in the bytes received so far (a report split
    over two reads waits for its rest; several reports in one read count as the last one)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> int | None:
        """The newest complete report in ``data`` and what came before it, or None if none completed."""
        self._buf += data
        whole = len(self._buf) - len(self._buf) % OFFSET_REPORT_SIZE
        if not whole:
            return None
        (offset,) = OFFSET_REPORT.unpack_from(self._buf, whole - OFFSET_REPORT_SIZE)
        del self._buf[:whole]
        if offset < 0:
            raise HAFrameError(f"slave reported a negative offset {offset}")
        return offset


class TransferReader:
    """Slave side: cuts the master's byte stream into :class:`Transfer` s. ``max_body`` bounds a body
    (a size beyond it is a corrupt stream, not a reason to buffer gigabytes)."""

    def __init__(self, max_body: int = MAX_TRANSFER_BODY) -> None:
        self.max_body = max_body
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Transfer]:
        self._buf += data
        out: list[Transfer] = []
        pos = 0
        while len(self._buf) - pos >= TRANSFER_HEADER_SIZE:
            offset, size = TRANSFER_HEADER.unpack_from(self._buf, pos)
            if offset < 0 or size < 0 or size > self.max_body:
                raise HAFrameError(f"transfer header at stream byte {pos}: offset {offset} size {size} "
                                   f"(a body is 0..{self.max_body} bytes at a non-negative offset)")
            end = pos + TRANSFER_HEADER_SIZE + size
            if len(self._buf) < end:
                break
            out.append(Transfer(offset, bytes(self._buf[pos + TRANSFER_HEADER_SIZE:end])))
            pos = end
        del self._buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)


def wait_readable(sock: socket.socket, timeout_s: float) -> bool:
    """Whether ``sock`` has bytes (or EOF) to read within ``timeout_s``: both ends' read loops wait here.

    ``poll``, not ``select``: ``select`` refuses a descriptor numbered 1024 or above ("filedescriptor
    out of range"), and a broker process holding many queue and index files gets such numbers for
    its HA sockets (a test process that had opened enough files hit it)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))
