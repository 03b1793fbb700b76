"""Reading a Python data source's string options (``.option("splitBytes", 65536)`` arrives as "65536")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

# Reader option of the store sources: the batches go straight into this project's Parquet writer
# (pipelines.partition_writer), not to Spark. The reader may then hand columns in the encodings
# Parquet stores as the declared plain type without a copy: bodies as binary_view into the split's
# read buffer, a task's constant strings (broker, file, run id) as one-entry dictionaries. Spark
# itself needs the declared types exactly, so a DataFrame read never sets it.
DIRECT_WRITE_OPTION = "directWrite"

# Reader option of the commitlog source, with DIRECT_WRITE_OPTION: after each split's batches the
# reader yields a SideRows of the split's walk pieces (pipelines.walk_pieces), which the ingest uses
# to skip the findings walk of segments the decode has proven clean.
WALK_PIECES_OPTION = "walkPieces"


@dataclass(frozen=True)
class SideRows:
    """Rows a direct-write reader yields beside its table's batches: not written to the table but
    handed to the driver (:meth:`pipelines.partition_writer.PartitionJob.side_rows`)."""

    batch: "pa.RecordBatch"

# Commitlog bytes per Spark task (the store sources' ``splitBytes``; the ingest and stream jobs'
# ``--split-bytes``). Each task pays a fixed start (Spark launching the Python task, ~60-90 ms on two
# cores) and the last one decides when a run ends; this size weighs the two.
DEFAULT_SPLIT_BYTES = 256 * 1024 * 1024


def opt_int(options, name: str, default: int | None, source: str = "") -> int | None:
    """An integer option; blank or absent: ``default``; anything else is a ValueError naming it."""
    value = options.get(name)
    if value is None or str(value).strip() == "":
        return default
    try:
        return int(str(value).strip())
    except ValueError:
        prefix = f"{source}: " if source else ""
        raise ValueError(f"{prefix}option {name!r} must be an integer, got {value!r}") from None


def opt_bool(options, name: str, default: bool) -> bool:
    """A flag: 1/true/yes/on (any case) is true, anything else false; absent: ``default``."""
    value = options.get(name)
    if value is None:
        return default
    return str(value).strip().lower() in ("1", "true", "yes", "on")
