"""A real S3 HTTP endpoint for tests: ``moto_server`` started as a separate process on loopback.

Not moto's in-process mocks: delta-rs (Rust) and pyarrow's S3 client (C++) talk HTTP to it exactly as
they would to AWS, so what passes here passes the wire. One server per test session; each test gets
its own bucket.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from broker.server.launcher import free_port
from tests.remote_lakes import upload_tree

ACCESS_KEY = "rocketlake-test"
SECRET_KEY = "rocketlake-test-secret"
REGION = "us-east-1"


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen

    @property
    def options(self) -> dict[str, str]:
        """Storage options (delta-rs names) for a location on this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    @property
    def env(self) -> dict[str, str]:
        """The same as environment variables (for a job run as a subprocess)."""
        return dict(self.options)

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(endpoint_override=self.endpoint.removeprefix("http://"), scheme="http",
                                 access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION,
                                 allow_bucket_creation=True)

    def new_bucket(self, prefix: str = "rl") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.filesystem().create_dir(name)
        return name

    def upload_dir(self, local: Path, bucket: str, key_prefix: str) -> str:
        """Copy a local directory tree to ``s3://bucket/key_prefix``; returns that URI."""
        upload_tree(self.filesystem(), local, f"{bucket}/{key_prefix}")
        return f"s3://{bucket}/{key_prefix}"


def start_s3_server() -> S3Server:
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.exists():
        raise RuntimeError(f"{exe} not found: moto[server] is a test dependency (make venv installs it)")
    port = free_port()
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return S3Server(f"http://127.0.0.1:{port}", proc)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto_server did not start listening within 30 s")


def stop_s3_server(server: S3Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
