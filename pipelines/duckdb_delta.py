"""DuckDB over the Delta tables, offline: the delta extension is loaded from its PyPI wheel.

``LOAD delta`` alone would try to download the extension; ``duckdb-extension-delta`` ships the same
binary, pinned to the DuckDB version, so it is loaded from the installed file instead.
"""

from __future__ import annotations

import glob
import os

import duckdb


def delta_extension_path() -> str:
    import duckdb_extension_delta

    root = os.path.dirname(duckdb_extension_delta.__file__)
    found = glob.glob(os.path.join(root, "extensions", f"v{duckdb.__version__}", "delta.duckdb_extension"))
    if not found:
        raise RuntimeError(f"duckdb-extension-delta has no build for DuckDB {duckdb.__version__} under {root}; "
                           "install the same version of both packages")
    return found[0]


def connect(database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with ``delta_scan`` available and no network access for extensions."""
    con = duckdb.connect(database, config={"autoinstall_known_extensions": False,
                                           "autoload_known_extensions": False})
    con.execute(f"LOAD '{delta_extension_path()}'")
    return con
