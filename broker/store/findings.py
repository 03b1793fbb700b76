"""Integrity findings: what was wrong, and where (file, offset)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem found in a store file.

    ``offset`` is the byte position inside ``file``; ``physical_offset`` the global commitlog offset
    where that applies (None for other files). ``bytes_skipped`` is how much a reader had to jump
    over to resynchronise (0 when nothing was skipped, e.g. a CRC mismatch on an intact record).
    """

    file: str
    offset: int
    kind: str
    detail: str
    bytes_skipped: int = 0
    physical_offset: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        where = f"{self.file}@{self.offset}"
        skipped = f" ({self.bytes_skipped} bytes skipped)" if self.bytes_skipped else ""
        return f"{where}: {self.kind}: {self.detail}{skipped}"


# Kinds, one name each, shared by the reader, the verifier and later the audit job.
CRC_MISMATCH = "crc_mismatch"
BAD_MAGIC = "bad_magic"
BAD_SIZE = "bad_size"
OFFSET_MISMATCH = "offset_mismatch"
LENGTH_MISMATCH = "length_mismatch"
TRUNCATED_RECORD = "truncated_record"
TORN_TAIL = "torn_tail"
CORRUPT_REGION = "corrupt_region"
WRONG_FILE_SIZE = "wrong_file_size"
FILE_GAP = "file_gap"
BAD_FILE_NAME = "bad_file_name"
CQ_DANGLING = "cq_dangling_unit"
CQ_MISMATCH = "cq_mismatch"
CQ_MISSING = "cq_missing_unit"
CQ_OFFSET_GAP = "cq_offset_gap"
DECOMPRESSION_FAILED = "decompression_failed"
# consume queue, CQ ext and index files
CQ_BAD_UNIT = "cq_bad_unit"
CQ_DATA_AFTER_END = "cq_data_after_end"
CQ_EXT_BAD_UNIT = "cq_ext_bad_unit"
INDEX_BAD_HEADER = "index_bad_header"
INDEX_BAD_CHAIN = "index_bad_chain"
MISSING_BLANK = "missing_blank"
