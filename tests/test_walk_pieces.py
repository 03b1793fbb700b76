"""pipelines.walk_pieces: the messages splits' decode proving that a findings walk finds nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from broker.store import findings as fk
from broker.store.columnar import DecodeStats
from broker.store.findings import Finding
from pipelines.commitlog_ranges import SegmentFile, commitlog_end, decode_pieces, segment_files, walk_range
from pipelines.store_files import StoreFiles
from pipelines.walk_pieces import WalkPiece, from_table, to_batch, walk_finds_nothing
from tests.damaged_store import damaged_copy


def _decoded(seg: SegmentFile, lo: int, hi: int, split_bytes: int, piece_bytes: int) -> list[WalkPiece]:
    """The walk pieces of ``[lo, hi)`` decoded as the ingest cuts it: splits on multiples of
    ``split_bytes`` (each searching for its first record unless it starts the segment), each in
    pieces of ``piece_bytes``."""
    bounds = sorted({lo, hi, *range((lo // split_bytes + 1) * split_bytes, hi, split_bytes)})
    walked: list[WalkPiece] = []
    for a, b in zip(bounds, bounds[1:]):
        for _ in decode_pieces(seg, a, b, search_first=a != 0, piece_bytes=piece_bytes, walked=walked):
            pass
    return walked


@pytest.mark.parametrize("split_bytes, piece_bytes", [(1 << 30, 1 << 30), (1_000_000, 65_536), (300_000, 7_000)])
def test_the_decode_proves_clean_only_what_the_walk_finds_clean(golden_store, golden_records, tmp_path,
                                                               split_bytes, piece_bytes):
    """Over Apache's store and a damaged copy, with splits and pieces of several sizes: a range the
    decode's pieces prove clean is one the walk finds nothing in; every range of the healthy store
    that ends at the commitlog end or inside a segment is proven; no damaged range is."""
    damaged = damaged_copy(golden_store, golden_records, tmp_path)
    proven = {"golden": 0, "damaged": 0}
    walked_dirty = 0
    for name, store in (("golden", golden_store), ("damaged", damaged)):
        segments, _ = segment_files(StoreFiles(store))
        end = commitlog_end(segments)
        for seg in segments:
            data_end = min(seg.data_len, end - seg.base)
            for lo, hi in ((0, data_end), (1000, seg.data_len // 2), (seg.data_len // 3, data_end),
                           (0, seg.data_len)):
                pieces = _decoded(seg, lo, hi, split_bytes, piece_bytes)
                clean = walk_finds_nothing(pieces, seg.base, lo, hi)
                findings = walk_range(seg, lo, hi).findings
                assert not (clean and findings), (name, seg.name, lo, hi, findings)
                walked_dirty += bool(findings)
                if name == "golden" and (hi < seg.data_len or seg is not segments[-1]):
                    assert clean, (seg.name, lo, hi)  # a BLANK or the commitlog end closes the chain
                proven[name] += clean
    assert walked_dirty >= 4  # the damage was there to be missed: zeroed runs, bad magic, torn write
    assert proven["golden"] >= 7 and proven["damaged"] >= 3  # the undamaged segment's ranges


def _p(start: int, end: int, first_at: int | None, stop: int, *, walk_findings: int = 0,
       end_of_data: bool = False, blank_at: int | None = None, base: int = 0) -> WalkPiece:
    return WalkPiece(base, start, end, first_at, stop, end_of_data, blank_at, walk_findings)


def test_one_chain_over_the_whole_range_is_needed():
    chain = [_p(0, 100, 0, 120), _p(100, 200, 120, 210), _p(200, 300, 210, 300)]
    assert walk_finds_nothing(chain, 0, 0, 300)
    assert walk_finds_nothing(list(reversed(chain)), 0, 0, 300)  # in any order
    assert walk_finds_nothing(chain + [_p(0, 300, 5, 300, walk_findings=2, base=4096)], 0, 0, 300)  # other segment
    assert not walk_finds_nothing(chain[:2], 0, 0, 300)  # the range's end not covered
    assert not walk_finds_nothing(chain[1:], 0, 0, 300)  # nor its start
    assert not walk_finds_nothing([chain[0], _p(110, 200, 120, 210), chain[2]], 0, 0, 300)  # a gap
    assert not walk_finds_nothing([chain[0], _p(100, 200, 130, 210), chain[2]], 0, 0, 300)  # off the chain
    assert not walk_finds_nothing([_p(0, 100, 8, 120), *chain[1:]], 0, 0, 300)  # the walk from 0 starts at 0
    assert walk_finds_nothing([_p(40, 100, 48, 120), *chain[1:]], 0, 40, 300)  # a searched start is taken
    assert not walk_finds_nothing([chain[0], _p(100, 200, 120, 210, walk_findings=1), chain[2]], 0, 0, 300)
    assert not walk_finds_nothing([], 0, 0, 300)


def test_a_piece_without_a_record_is_right_only_when_the_chain_steps_over_it():
    over = [_p(0, 100, 0, 250), _p(100, 200, None, 200), _p(200, 300, 250, 300)]
    assert walk_finds_nothing(over, 0, 0, 300)
    short = [_p(0, 100, 0, 150), _p(100, 200, None, 200), _p(200, 300, 250, 300)]
    assert not walk_finds_nothing(short, 0, 0, 300)  # the chain went on at 150: the walk found a break
    assert walk_finds_nothing([_p(50, 100, None, 100), _p(100, 200, 130, 200)], 0, 50, 200)  # still searching


def test_the_data_may_end_at_a_blank_only():
    assert walk_finds_nothing([_p(0, 100, 0, 100), _p(100, 200, 100, 4096, end_of_data=True, blank_at=150),
                               _p(200, 300, None, 300)], 0, 0, 300)
    assert walk_finds_nothing([_p(0, 100, 0, 100), _p(100, 200, None, 4096, end_of_data=True, blank_at=100)],
                              0, 0, 200)  # a piece holding the BLANK only
    assert not walk_finds_nothing([_p(0, 100, 0, 100), _p(100, 200, None, 4096, end_of_data=True, blank_at=120)],
                                  0, 0, 200)  # a BLANK off the chain
    # zeros after the last record: the walk looks at the rest of the file, the piece did not
    assert not walk_finds_nothing([_p(0, 100, 0, 100), _p(100, 200, 100, 200, end_of_data=True)], 0, 0, 200)


def test_a_piece_counts_the_findings_a_walk_reports():
    stats = DecodeStats(first_at=10, stop=90, findings=[Finding("f", 20, fk.CRC_MISMATCH, "crc"),
                                                        Finding("f", 30, fk.DECOMPRESSION_FAILED, "zip")])
    assert WalkPiece.of(4096, 0, 100, stats) == WalkPiece(4096, 0, 100, 10, 90, False, None, 0)
    stats.findings.append(Finding("f", 40, fk.LENGTH_MISMATCH, "sizes"))
    stats.findings.append(Finding("f", 50, fk.BAD_MAGIC, "magic", bytes_skipped=8))
    assert WalkPiece.of(4096, 0, 100, stats).walk_findings == 2


def test_pieces_travel_as_rows():
    pieces = [_p(0, 100, 0, 120, base=8), _p(100, 200, None, 200, end_of_data=True, blank_at=150, walk_findings=3)]
    assert from_table(pa.Table.from_batches([to_batch(pieces)])) == pieces


def test_the_split_reader_hands_its_pieces_beside_the_rows(golden_store):
    """RocketMQReader with walkPieces (and directWrite): a SideRows of the split's pieces after its
    batches; without the option, batches only."""
    from pipelines.sources.options import DIRECT_WRITE_OPTION, WALK_PIECES_OPTION, SideRows
    from pipelines.sources.rocketmq import RocketMQReader

    options = {"path": str(golden_store), "splitBytes": str(1_000_000), DIRECT_WRITE_OPTION: "true"}
    reader = RocketMQReader({**options, WALK_PIECES_OPTION: "true"})
    parts = reader.partitions()
    items = [list(reader.read(p)) for p in parts]
    assert all(isinstance(i[-1], SideRows) and not any(isinstance(x, SideRows) for x in i[:-1]) for i in items)
    pieces = [p for i in items for p in from_table(pa.Table.from_batches([i[-1].batch]))]
    assert [(p.start, p.end) for p in pieces] == [(p.start, p.end) for p in parts]
    segments, _ = segment_files(StoreFiles(Path(golden_store)))
    assert walk_finds_nothing(pieces, segments[0].base, 0, segments[0].data_len)
    plain = RocketMQReader(options)
    assert not any(isinstance(x, SideRows) for x in plain.read(plain.partitions()[0]))
