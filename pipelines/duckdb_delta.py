"""DuckDB over the Delta tables, offline: local tables through the delta extension, remote ones as Arrow.

Local tables: ``LOAD delta`` alone would try to download the extension; ``duckdb-extension-delta``
ships the same binary, pinned to the DuckDB version, so it is loaded from the installed file instead,
and ``delta_scan`` reads the table's log at every query.

Remote tables (``s3://…``, any URI a :class:`pipelines.storage.Location` reaches): ``delta_scan``
would read the data files through DuckDB's own ``httpfs`` extension and its secrets, which are
neither installed here nor able to take the storage options a Location carries. Instead delta-rs
reads the log (with the Location's storage options) and :func:`arrow_source` hands DuckDB a
``pyarrow.dataset`` over the snapshot's files, read through ``pyarrow.fs``. DuckDB's Arrow scan
pushes projections and filters into it, and each file's partition values and statistics (from the
log) let pyarrow skip files and row groups. A dataset is one snapshot: the engine registers a new
one when the table's version moves.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as pads

    from pipelines.storage import Location

log = logging.getLogger(__name__)


def delta_extension_path() -> str:
    import duckdb_extension_delta

    root = os.path.dirname(duckdb_extension_delta.__file__)
    found = glob.glob(os.path.join(root, "extensions", f"v{duckdb.__version__}", "delta.duckdb_extension"))
    if not found:
        raise RuntimeError(f"duckdb-extension-delta has no build for DuckDB {duckdb.__version__} under {root}; "
                           "install the same version of both packages")
    return found[0]


def connect(database: str = ":memory:", *, delta: bool = True) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with no network access for extensions; ``delta_scan`` available unless
    ``delta=False`` (a connection that only scans Arrow sources needs no extension)."""
    con = duckdb.connect(database, config={"autoinstall_known_extensions": False,
                                           "autoload_known_extensions": False})
    if delta:
        con.execute(f"LOAD '{delta_extension_path()}'")
    return con


def arrow_source(dt, location: Location) -> pads.Dataset | pa.Table:
    """What DuckDB scans for the snapshot ``dt`` of the remote table at ``location``.

    A ``pyarrow.dataset`` whose files are read through the Location's ``pyarrow.fs`` filesystem
    (not delta-rs's Python filesystem handler: pyarrow's I/O threads calling into Python can abort
    the interpreter at exit). A plain Parquet read is wrong for column mapping (physical column
    names) and deletion vectors; deltalake refuses the dataset for those reader features, and for
    legacy column mapping (no reader feature) it would return nulls, so both cases are read through
    delta-rs's own engine into one Arrow table instead (rare: rocketlake's tables use neither)."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    from deltalake.exceptions import DeltaProtocolError

    mode = (dt.metadata().configuration or {}).get("delta.columnMapping.mode") or "none"
    if mode == "none":
        fs, root = location.filesystem()
        try:
            return dt.to_pyarrow_dataset(filesystem=pafs.SubTreeFileSystem(root, fs))
        except DeltaProtocolError as exc:
            reason = str(exc)
    else:
        reason = f"column mapping mode {mode!r}"
    log.info("%s v%d: read whole through delta-rs (%s)", location, dt.version(), reason)
    return pa.RecordBatchReader.from_stream(dt.scan()).read_all()
