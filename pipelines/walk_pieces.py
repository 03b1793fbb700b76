"""What a decode saw of the commitlog's record chain, and when that proves a findings walk needless.

Why: the ingest's ``corrupt_records`` table takes the findings of a walk over each segment
(:class:`pipelines.sources.rocketmq.CommitLogFindingsReader`). The messages splits have already
walked every record of the segment to decode it, so a second walk reads the whole store from the
disk again (on a cold 16 GiB store, 16 GiB more reads beside the decode). The split decodes cannot
simply stand in for the walk: each split and each piece of one finds its first record by the
self-identifying rule, and around damage near an edge that need not be where the one walk from the
segment's start would go on, so their findings could differ from the walk's.

What they can do is prove the walk would find nothing. Each decoded piece reports a
:class:`WalkPiece`: where its first record starts, where its walk stopped, and whether it found
anything a walk reports. When the pieces of a segment's walk range follow one chain (each piece's
first record is where the piece before stopped) and none found anything, the walk from the range's
start would step over exactly those records and end as they did: its findings are none. Any doubt
(a finding, a break in the chain, an end of data that is not a BLANK record, pieces that do not
cover the range) leaves the segment to the walk, so the table is the walk's in every case.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

import pyarrow as pa

from broker.store import findings as fk
from broker.store.columnar import DecodeStats

# Findings about one intact record's content (the decoder's, after the walk): a walk never reports
# them, and they do not change the chain. Every other kind is the walk's, or changes where it goes.
_ROW_KINDS = frozenset({fk.CRC_MISMATCH, fk.DECOMPRESSION_FAILED})


@dataclass(frozen=True)
class WalkPiece:
    """One decode of the records starting in ``[start, end)`` of segment ``base`` (positions are
    segment positions): its first record (None: its search found none), where its walk stopped,
    whether it ended the data (at ``blank_at``, a BLANK record, or at zeros when that is None),
    and whether it found anything a walk reports (``walk_findings``)."""

    base: int
    start: int
    end: int
    first_at: int | None
    stop: int
    end_of_data: bool
    blank_at: int | None
    walk_findings: int

    @classmethod
    def of(cls, base: int, start: int, end: int, stats: DecodeStats) -> "WalkPiece":
        return cls(base, start, end, stats.first_at, stats.stop, stats.end_of_data, stats.blank_at,
                   sum(1 for f in stats.findings if f.kind not in _ROW_KINDS))


WALK_PIECE_SCHEMA = pa.schema([
    pa.field("base", pa.int64(), nullable=False),
    pa.field("start", pa.int64(), nullable=False),
    pa.field("end", pa.int64(), nullable=False),
    pa.field("first_at", pa.int64()),
    pa.field("stop", pa.int64(), nullable=False),
    pa.field("end_of_data", pa.bool_(), nullable=False),
    pa.field("blank_at", pa.int64()),
    pa.field("walk_findings", pa.int32(), nullable=False),
])


def to_batch(pieces: Iterable[WalkPiece]) -> pa.RecordBatch:
    """The pieces as rows (a Spark task hands them to the driver this way)."""
    return pa.RecordBatch.from_pylist([asdict(p) for p in pieces], schema=WALK_PIECE_SCHEMA)


def from_table(table: pa.Table) -> list[WalkPiece]:
    return [WalkPiece(**row) for row in table.select(WALK_PIECE_SCHEMA.names).to_pylist()]


def walk_finds_nothing(pieces: Iterable[WalkPiece], base: int, start: int, end: int) -> bool:
    """True when the decoded ``pieces`` prove that a findings walk of ``[start, end)`` of segment
    ``base`` (a first-record search unless ``start`` is 0, as the walk does) finds nothing: they
    cover the range exactly, follow one record chain, found nothing a walk reports, and end the
    data, if at all, at a BLANK record. Pieces of other segments or ranges are ignored."""
    mine = sorted((p for p in pieces if p.base == base and start <= p.start and p.end <= end), key=lambda p: p.start)
    if not mine or mine[0].start != start or mine[-1].end != end:
        return False
    if any(a.end != b.start for a, b in zip(mine, mine[1:])):
        return False
    expect: int | None = 0 if start == 0 else None  # where the chain's next record starts, once known
    for p in mine:
        if p.walk_findings or (p.end_of_data and p.blank_at is None):
            return False
        head = p.first_at if p.first_at is not None else p.blank_at  # the piece's first step
        if head is None:  # no record starts here: right only if the chain steps over the piece
            if expect is not None and expect < p.end:
                return False
            continue
        if expect is not None and head != expect:
            return False
        expect = p.stop
    return True
