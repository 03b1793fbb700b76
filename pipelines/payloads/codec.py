"""What every payload codec gives and the checks they share (UTF-8, body arrays).

A codec turns a batch of bodies into :class:`Decoded`: an Arrow table of typed columns holding the
rows that decoded, in input order, and a ``(row index, reason)`` per row that did not. Every input
row is in exactly one of the two, which is what lets :mod:`pipelines.payloads.rows` promise that
each message of a declared topic lands in its payload table or in the quarantine.

Codecs pickle (they travel inside the declarations to Spark tasks): whatever a library builds that
does not pickle (a protobuf message class) is rebuilt lazily after unpickling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import pyarrow as pa

Failure = tuple[int, str]


@dataclass(frozen=True)
class Decoded:
    """Rows that decoded (``table``, input order) and the rows that did not (``failures``,
    ascending row index)."""

    table: pa.Table
    failures: list[Failure]

    def ok_mask(self, n: int) -> np.ndarray:
        """Boolean mask over the ``n`` input rows: True where the row is in ``table``."""
        mask = np.ones(n, dtype=bool)
        if self.failures:
            mask[np.fromiter((i for i, _ in self.failures), np.int64, len(self.failures))] = False
        return mask


class Codec(Protocol):
    """Decodes one topic's bodies into the columns of :attr:`schema`."""

    format: str

    @property
    def schema(self) -> pa.Schema: ...

    def decode(self, bodies: "pa.Array | Sequence[bytes]") -> Decoded: ...


def as_binary(bodies: "pa.Array | pa.ChunkedArray | Sequence[bytes]") -> pa.BinaryArray:
    """``bodies`` as one contiguous ``binary`` array (a ``binary_view`` column from the decoder,
    a chunked column or a list of bytes); codecs work on its buffers."""
    if isinstance(bodies, pa.ChunkedArray):
        bodies = bodies.combine_chunks() if bodies.num_chunks != 1 else bodies.chunk(0)
    if not isinstance(bodies, pa.Array):
        bodies = pa.array(list(bodies), pa.binary())
    if bodies.type != pa.binary():
        bodies = bodies.cast(pa.binary())
    return bodies


def utf8_failures(bodies: pa.BinaryArray) -> list[Failure]:
    """``(row, "invalid UTF-8 at byte N")`` for every body that is not valid UTF-8 (null bodies
    count as empty). One vectorised validation of the whole array; rows are looked at one by one
    only when it fails."""
    try:
        bodies.view(pa.string()).validate(full=True)
        return []
    except pa.ArrowInvalid:
        pass
    out: list[Failure] = []
    for i, body in enumerate(bodies.to_pylist()):
        if body is None:
            continue
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            out.append((i, f"invalid UTF-8 at byte {exc.start}"))
    return out


def table_of(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """Python rows (already checked against ``schema`` by their decoder) as an Arrow table."""
    return pa.Table.from_pylist(rows, schema=schema)
