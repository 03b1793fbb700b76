"""Ingest of stores on Azure Blob Storage into a lake there (a real Azurite process over HTTP, see
tests/azurite_server.py): the tables equal a local ingest of the same stores, a rerun adds nothing, and
a location Azure access cannot be set up for is a one-line error (exit 2).

The same two stores as tests/test_ingest_s3.py (the damaged golden copy and a generated store), with
the storage options passed explicitly, so nothing comes from this process's environment.
"""

from __future__ import annotations

import pytest

from broker import cli
from pipelines.ingest import ingest
from pipelines.job_args import StoreSpec
from pipelines.lake import open_table
from pipelines.storage import Location, StorageError
from schemas.messages import MESSAGES_TABLE
from schemas.tables import CONSUME_QUEUE_TABLE, CORRUPT_RECORDS_TABLE, INDEX_ENTRIES_TABLE, INGEST_RUNS_TABLE
from tests.remote_lakes import RUN_COUNTS, SORT_KEYS, SPLIT_BYTES, comparable, ingest_remote, table


@pytest.fixture(scope="module")
def container(azurite) -> str:
    return azurite.new_container("ingest")


@pytest.fixture(scope="module")
def azure_stores(azurite, two_stores, container) -> dict[str, str]:
    return {name: azurite.upload_dir(path, container, f"stores/{name}") for name, path in two_stores.items()}


@pytest.fixture(scope="module")
def azure_lake(spark, azurite, azure_stores, container) -> Location:
    return ingest_remote(spark, azure_stores, f"abfs://{container}/lake", azurite.options)


@pytest.mark.parametrize("name", [MESSAGES_TABLE, CONSUME_QUEUE_TABLE, INDEX_ENTRIES_TABLE, CORRUPT_RECORDS_TABLE])
def test_azure_tables_equal_the_local_ones(name, two_stores_lake, azure_lake, two_stores, azure_stores):
    roots = [str(p) for p in two_stores.values()] + list(azure_stores.values())
    local, remote = comparable(two_stores_lake, name, roots), comparable(azure_lake, name, roots)
    assert local.num_rows > 0
    assert remote.schema == local.schema
    assert remote.equals(local)


def test_azure_ingest_runs_count_the_same_and_a_rerun_adds_nothing(spark, azurite, azure_stores, azure_lake,
                                                                    two_stores_lake):
    def runs(lake) -> list[tuple]:
        return sorted(tuple(r[c] for c in RUN_COUNTS) for r in table(lake, INGEST_RUNS_TABLE).to_pylist())

    assert runs(azure_lake) == runs(two_stores_lake)
    versions = {name: open_table(azure_lake, name).version() for name in SORT_KEYS}
    specs = [StoreSpec.parse(f"{name}={uri}", azurite.options) for name, uri in azure_stores.items()]
    summaries = ingest(spark, specs, azure_lake, split_bytes=SPLIT_BYTES)
    assert [(s.rows, s.status) for s in summaries] == [({}, "NOTHING_NEW")] * 2
    assert {name: open_table(azure_lake, name).version() for name in SORT_KEYS} == versions


def test_a_store_read_is_ranged_on_azure(azurite, two_stores, azure_stores):
    """A ranged read of a blob: the segment's bytes 1000-1099, as the local file holds them."""
    seg = Location.parse(f"{azure_stores['golden-x']}/commitlog/00000000000000000000", azurite.options)
    with open(two_stores["golden-x"] / "commitlog" / "00000000000000000000", "rb") as fh:
        fh.seek(1000)
        want = fh.read(100)
    assert seg.read_range(1000, 100) == want


def test_the_account_comes_from_the_uri_or_the_options(monkeypatch):
    for key in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_USE_EMULATOR"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(StorageError, match="no Azure storage account"):
        Location.parse("abfs://data/lake").filesystem()
    fs, path = Location.parse("abfss://data@myaccount.dfs.core.windows.net/lake/x",
                              {"AZURE_STORAGE_ACCOUNT_KEY": "a2V5"}).filesystem()
    assert path == "data/lake/x" and type(fs).__name__ == "AzureFileSystem"
    emulated = Location.parse("az://c/p", {"AZURE_STORAGE_USE_EMULATOR": "true"})
    assert emulated.filesystem()[1] == "c/p"


def test_lake_in_a_missing_container_is_an_error(azurite, golden_store, capsys):
    options = [arg for key, value in azurite.options.items() for arg in ("--storage-option", f"{key}={value}")]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ingest", "--store", str(golden_store), "--lake", "abfs://no-such-container/lake", *options])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "ingest_commitlog.py: error: --lake abfs://no-such-container/lake: container 'no-such-container' does not "
        "exist (or is not visible with these storage options)")


def test_azure_without_an_account_is_one_line(golden_store, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ingest", "--store", "abfs://data/store", "--lake", str(tmp_path / "lake")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("ingest_commitlog.py: error: abfs://data/store/commitlog: no Azure storage account: name it in the URI "
                       "(abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/…) or with AZURE_STORAGE_ACCOUNT_NAME")
    assert not (tmp_path / "lake").exists()
