"""A real Azure Blob HTTP endpoint for tests: Azurite (Microsoft's storage emulator) as a process on loopback.

pyarrow's AzureFileSystem (C++ Azure SDK) and delta-rs (Rust object_store) talk HTTP to it as they
would to Azure Storage, with Azurite's well-known account and key. One server per test session; each
test module takes its own container. ``make test`` installs it (tests/azurite/package-lock.json).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from broker.server.launcher import free_port
from tests.remote_lakes import upload_tree
from pipelines.storage import AZURITE_ACCOUNT, AZURITE_KEY

AZURITE = Path(__file__).resolve().parent / "azurite" / "node_modules" / ".bin" / "azurite-blob"


@dataclass
class AzuriteServer:
    endpoint: str  # http://127.0.0.1:PORT/devstoreaccount1, the account's blob endpoint
    process: subprocess.Popen
    data_dir: str

    @property
    def options(self) -> dict[str, str]:
        """Storage options (delta-rs names) for a location on this server."""
        return {"AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
                "AZURE_STORAGE_ENDPOINT": self.endpoint}

    def filesystem(self) -> pafs.AzureFileSystem:
        authority = self.endpoint.removeprefix("http://").split("/", 1)[0]
        return pafs.AzureFileSystem(account_name=AZURITE_ACCOUNT, account_key=AZURITE_KEY,
                                    blob_storage_authority=authority, blob_storage_scheme="http",
                                    dfs_storage_authority=authority, dfs_storage_scheme="http")

    def new_container(self, prefix: str = "rl") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.filesystem().create_dir(name)
        return name

    def upload_dir(self, local: Path, container: str, prefix: str) -> str:
        """Copy a local directory tree to ``abfs://container/prefix``; returns that URI."""
        upload_tree(self.filesystem(), local, f"{container}/{prefix}")
        return f"abfs://{container}/{prefix}"


def start_azurite() -> AzuriteServer:
    if not AZURITE.exists():
        raise RuntimeError(f"{AZURITE} not found: the Azure emulator is a test dependency ('make test' installs it "
                           "with npm from tests/azurite/package-lock.json)")
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="rocketlake-azurite-")
    proc = subprocess.Popen([str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", data_dir,
                             "--silent", "--skipApiVersionCheck", "--loose"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"azurite-blob exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return AzuriteServer(f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}", proc, data_dir)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("azurite-blob did not listen within 60 s")


def stop_azurite(server: AzuriteServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    shutil.rmtree(server.data_dir, ignore_errors=True)
