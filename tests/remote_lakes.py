"""What the remote-lake ingest tests share (tests/test_ingest_s3.py, tests/test_ingest_azure.py): their
two stores, and tables made comparable across lakes.

Two stores: a copy of the golden Apache store with damage (a record whose magic is broken, a body
byte flipped: ``corrupt_records`` gets rows of both kinds) and a generated store (several segments,
compressed bodies, batches, delays, retries, DLQ, transactions; a live-like last segment with zeros
after the data). Files in ``corrupt_records`` are named by the store's root (its URI remotely, its
absolute path locally); :func:`comparable` swaps that root for a placeholder and nothing else. The
fixtures ``two_stores`` and ``two_stores_lake`` (tests/conftest.py) build them once per module.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from broker.store.generate import GenerateSpec, generate_store
from pipelines.ingest import ingest
from pipelines.job_args import StoreSpec
from pipelines.lake import open_table
from pipelines.storage import Location
from schemas.messages import MESSAGES_TABLE
from schemas.tables import CONSUME_QUEUE_TABLE, CORRUPT_RECORDS_TABLE, INDEX_ENTRIES_TABLE

SPLIT_BYTES = 262_144  # several messages tasks per segment: splits start inside records
ROOT = "<store>"
SORT_KEYS = {
    MESSAGES_TABLE: ["broker_name", "commitlog_offset"],
    CONSUME_QUEUE_TABLE: ["broker_name", "topic", "queue_id", "queue_offset"],
    INDEX_ENTRIES_TABLE: ["broker_name", "index_file", "key_hash", "commitlog_offset", "prev_index"],
    CORRUPT_RECORDS_TABLE: ["broker_name", "file", "offset", "reason"],
}
RUN_COUNTS = ["broker_name", "from_offset", "to_offset", "messages_rows", "consume_queue_rows",
              "index_entries_rows", "corrupt_records_rows", "status"]

def damaged_golden(golden_store: Path, golden_records: list[dict], into: Path) -> Path:
    store = into / "golden"
    shutil.copytree(golden_store, store)
    for path in store.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # the golden files are read-only
    seg = store / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    victim = golden_records[100]["phyOffset"]
    data[victim + 4:victim + 8] = b"\x00\x11\x22\x33"  # bad magic: skipped, a corrupt_records row
    data[golden_records[200]["phyOffset"] + 200] ^= 0xFF  # inside a body: kept, a crc_mismatch row
    seg.write_bytes(bytes(data))
    return store


def make_stores(root: Path, golden_store: Path, golden_records: list[dict]) -> dict[str, Path]:
    """The two stores under ``root``, by broker name."""
    generated = root / "generated"
    generate_store(generated, GenerateSpec(messages=3000, body_bytes=600, segment_bytes=1 << 20, cq_file_bytes=4000,
                                           index_slots=64, index_entries=256, seed=7))
    return {"golden-x": damaged_golden(golden_store, golden_records, root), "generated": generated}


def table(lake, name: str) -> pa.Table:
    """Table ``name`` of ``lake`` (it must exist)."""
    dt = open_table(lake, name)
    assert dt is not None, f"{name}: no Delta table in {lake}"
    return dt.to_pyarrow_table()


def comparable(lake, name: str, roots: list[str]) -> pa.Table:
    """Rows in key order without the run id; ``file`` with the store root as a placeholder."""
    rows = table(lake, name)
    rows = rows.select(sorted(c for c in rows.column_names if c != "ingest_run_id"))
    if "file" in rows.column_names:
        files = rows["file"].to_pylist()
        for root in roots:
            files = [ROOT + f[len(root):] if f.startswith(root + "/") else f for f in files]
        rows = rows.set_column(rows.column_names.index("file"), "file", pa.array(files, pa.string()))
    return rows.sort_by([(k, "ascending") for k in SORT_KEYS[name]])


def upload_tree(fs: pafs.FileSystem, local: Path, root: str) -> None:
    """Copy the local directory tree ``local`` to ``root`` (a path inside ``fs``)."""
    for path in sorted(Path(local).rglob("*")):
        if path.is_file():
            with fs.open_output_stream(f"{root}/{path.relative_to(local).as_posix()}") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out, 8 << 20)


def ingest_remote(spark, store_uris: dict[str, str], lake_uri: str, options: dict[str, str]) -> Location:
    """Ingest the stores at ``store_uris`` (broker name → URI) into the lake at ``lake_uri``, the
    storage options passed explicitly (nothing comes from this process's environment)."""
    lake = Location.parse(lake_uri, options)
    ingest(spark, [StoreSpec.parse(f"{name}={uri}", options) for name, uri in store_uris.items()], lake,
           split_bytes=SPLIT_BYTES)
    return lake
