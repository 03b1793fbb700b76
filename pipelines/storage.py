"""Where stores and lakes live: a local directory or a URI that ``pyarrow.fs`` and delta-rs reach.

A :class:`Location` is the one value the jobs pass around for ``--store NAME=URI`` and ``--lake URI``:
the URI (a local path is kept as an absolute path) plus its storage options. Storage options use
delta-rs's names (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``, …,
``GOOGLE_SERVICE_ACCOUNT``, ``AZURE_STORAGE_ACCOUNT_NAME``, …); the same keys are read from the
environment of the process that parses the location and merged under the ones given with
``--storage-option KEY=VALUE``. They are resolved on the driver and travel *with* the location into
every Spark task (a Location pickles), so executors on other machines need no environment of their
own. ``repr`` and ``str`` never show option values (they may be secrets).

Why one class: the store reader (ranged reads of commitlog segments), the Delta writer (Parquet files
written through the filesystem, then one delta-rs commit against the URI) and every report job need
the same two views of a place: a ``pyarrow.fs`` filesystem with a path inside it, and delta-rs
``storage_options``. Translating between the two naming schemes happens here and nowhere else.
"""

from __future__ import annotations

import os
import posixpath
from datetime import timedelta
from dataclasses import dataclass, field
from typing import Iterable, Mapping
from urllib.parse import urlparse

import pyarrow.fs as pafs

# delta-rs option names (also environment variables) → pyarrow S3FileSystem keyword arguments
_S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "access_key",
    "AWS_SECRET_ACCESS_KEY": "secret_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_REGION": "region",
    "AWS_DEFAULT_REGION": "region",
    "AWS_ENDPOINT_URL": "endpoint_override",
    "AWS_ENDPOINT": "endpoint_override",
}
# delta-rs (object_store) Azure option names → pyarrow AzureFileSystem keyword arguments
_AZURE_KEYS = {
    "AZURE_STORAGE_ACCOUNT_NAME": "account_name",
    "AZURE_STORAGE_ACCOUNT_KEY": "account_key",
    "AZURE_STORAGE_ACCESS_KEY": "account_key",
    "AZURE_STORAGE_MASTER_KEY": "account_key",
    "AZURE_STORAGE_SAS_KEY": "sas_token",
    "AZURE_STORAGE_SAS_TOKEN": "sas_token",
    "AZURE_STORAGE_CLIENT_ID": "client_id",
    "AZURE_CLIENT_ID": "client_id",
    "AZURE_STORAGE_CLIENT_SECRET": "client_secret",
    "AZURE_CLIENT_SECRET": "client_secret",
    "AZURE_STORAGE_TENANT_ID": "tenant_id",
    "AZURE_TENANT_ID": "tenant_id",
}
_AZURE_ENDPOINT_KEYS = ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT")
AZURE_SCHEMES = ("abfs", "abfss", "az", "azure")
# Azurite, the Azure storage emulator: its fixed account and its published well-known key (not a
# secret), as object_store uses them for AZURE_STORAGE_USE_EMULATOR
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_DEFAULT_URL = "http://127.0.0.1:10000"
# environment variables picked up for each scheme (besides the explicit --storage-option values)
_ENV_PREFIXES = {
    "s3": ("AWS_",),
    "s3a": ("AWS_",),
    "gs": ("GOOGLE_",),
    "gcs": ("GOOGLE_",),
    "abfs": ("AZURE_",),
    "abfss": ("AZURE_",),
    "az": ("AZURE_",),
    "azure": ("AZURE_",),
}
LOCAL_SCHEMES = ("", "file")


class StorageError(ValueError):
    """A location that cannot be used (unknown scheme, bad option, unreachable filesystem)."""


def parse_storage_options(values: Iterable[str]) -> dict[str, str]:
    """``--storage-option KEY=VALUE`` values as a dict (later ones win); a malformed one raises."""
    out: dict[str, str] = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise StorageError(f"--storage-option {text!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out


def _scheme(uri: str) -> str:
    scheme = urlparse(uri).scheme.lower()
    return "" if len(scheme) <= 1 else scheme  # a Windows drive letter is not a scheme


def is_uri(text: str) -> bool:
    """True for ``scheme://…`` (``file://`` included), False for a plain local path."""
    return _scheme(text) != ""


@dataclass(frozen=True)
class Location:
    """A directory: local (``uri`` is an absolute path) or remote (``uri`` is ``scheme://…``)."""

    uri: str
    options: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    # ---------------------------------------------------------------------------------- creation
    @classmethod
    def parse(cls, text: "str | os.PathLike | Location", options: Mapping[str, str] | None = None) -> "Location":
        """``text`` as a Location. A relative local path becomes absolute, ``file:///x`` becomes
        ``/x``; for a remote URI the scheme's environment variables are merged under ``options``."""
        if isinstance(text, Location):
            if not options:
                return text
            return cls(text.uri, tuple(sorted({**dict(text.options), **options}.items())))
        raw = os.fspath(text)
        scheme = _scheme(raw)
        if scheme == "file":
            raw = urlparse(raw).path or "/"
            scheme = ""
        if not scheme:
            return cls(os.path.abspath(raw), tuple(sorted((options or {}).items())))
        merged = {k: v for k, v in os.environ.items()
                  if k.startswith(_ENV_PREFIXES.get(scheme, ("\0",)))}
        merged.update(options or {})
        return cls(raw.rstrip("/"), tuple(sorted(merged.items())))

    # --------------------------------------------------------------------------------- properties
    @property
    def scheme(self) -> str:
        return _scheme(self.uri)

    @property
    def is_local(self) -> bool:
        return self.scheme == ""

    @property
    def option_map(self) -> dict[str, str]:
        return dict(self.options)

    def child(self, *parts: str) -> "Location":
        """``<self>/<part>/…`` (same options)."""
        if self.is_local:
            return Location(os.path.join(self.uri, *parts), self.options)
        return Location(posixpath.join(self.uri, *parts), self.options)

    @property
    def name(self) -> str:
        return posixpath.basename(self.uri.rstrip("/"))

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:  # never the option values
        keys = ",".join(k for k, _ in self.options)
        return f"Location({self.uri!r}{', options: ' + keys if keys else ''})"

    def __fspath__(self) -> str:
        if not self.is_local:
            raise StorageError(f"{self.uri} is not a local path")
        return self.uri

    # --------------------------------------------------------------------------------- filesystems
    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """(pyarrow filesystem, path of this location inside it). Cached per process."""
        return _filesystem(self.uri, self.options)

    def delta_uri(self) -> str:
        """The URI to give delta-rs (a local path as it is)."""
        return self.uri

    def delta_options(self) -> dict[str, str] | None:
        """delta-rs ``storage_options`` (None for a local directory)."""
        if self.is_local:
            return None
        opts = dict(self.options)
        if self.scheme in ("s3", "s3a"):
            endpoint = opts.get("AWS_ENDPOINT_URL") or opts.get("AWS_ENDPOINT") or ""
            if endpoint.startswith("http://"):
                opts.setdefault("AWS_ALLOW_HTTP", "true")
        elif self.scheme in AZURE_SCHEMES:
            if _azure_endpoint(opts).startswith("http://"):
                opts.setdefault("AZURE_ALLOW_HTTP", "true")
        return opts

    # --------------------------------------------------------------------------------- file access
    def exists(self) -> bool:
        fs, path = self.filesystem()
        return fs.get_file_info(path).type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        fs, path = self.filesystem()
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            return True
        if info.type == pafs.FileType.NotFound and not self.is_local:
            # object stores have no directories: a prefix with objects under it counts as one
            return bool(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=False)))
        return False

    def list(self, recursive: bool = False) -> list[pafs.FileInfo]:
        """Entries under this location ([] when there is none)."""
        fs, path = self.filesystem()
        try:
            return fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=recursive))
        except FileNotFoundError:
            return []

    def read_bytes(self) -> bytes:
        fs, path = self.filesystem()
        with fs.open_input_file(path) as fh:
            return fh.readall()

    def read_range(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end of the file): a ranged read, never the
        whole object."""
        fs, path = self.filesystem()
        with fs.open_input_file(path) as fh:
            return fh.read_at(length, offset)

    def size(self) -> int:
        fs, path = self.filesystem()
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(self.uri)
        return int(info.size or 0)

    def write_bytes(self, data: bytes) -> None:
        fs, path = self.filesystem()
        parent = posixpath.dirname(path)
        if parent:
            fs.create_dir(parent, recursive=True)
        with fs.open_output_stream(path) as fh:
            fh.write(data)


_LOCAL_FS = pafs.LocalFileSystem()
GCS_RETRY_LIMIT = timedelta(seconds=30)
# S3 clients per option set (one client for every path of a bucket: its connections are reused,
# and a location's children do not each build a client); other schemes per URI
_S3_CACHE: dict[tuple[tuple[str, str], ...], pafs.S3FileSystem] = {}
_FS_CACHE: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[pafs.FileSystem, str]] = {}
# Azure clients per (account host of the URI, option set), as S3's per option set
_AZURE_CACHE: dict[tuple[str, tuple[tuple[str, str], ...]], pafs.FileSystem] = {}


def _filesystem(uri: str, options: tuple[tuple[str, str], ...]) -> tuple[pafs.FileSystem, str]:
    scheme = _scheme(uri)
    if scheme == "":
        return _LOCAL_FS, uri
    if scheme in ("s3", "s3a"):
        parsed = urlparse(uri)
        return _s3_filesystem(uri, options), (parsed.netloc + parsed.path).rstrip("/")
    if scheme in AZURE_SCHEMES:
        return _azure_filesystem(uri, options)
    key = (uri, options)
    hit = _FS_CACHE.get(key)
    if hit is None:
        try:
            if scheme in ("gs", "gcs"):
                # pyarrow's default keeps retrying for 15 minutes when no credentials answer: a
                # wrong set-up must fail within a minute with its message instead of hanging
                parsed = urlparse(uri)
                hit = (pafs.GcsFileSystem(retry_time_limit=GCS_RETRY_LIMIT), (parsed.netloc + parsed.path).rstrip("/"))
            else:
                hit = pafs.FileSystem.from_uri(uri)
            _FS_CACHE[key] = hit
        except Exception as exc:
            raise StorageError(f"{uri}: pyarrow.fs cannot open this URI ({exc})") from exc
    return hit


def _pyarrow_kwargs(opts: Mapping[str, str], names: Mapping[str, str]) -> dict[str, object]:
    """pyarrow filesystem arguments from delta-rs option names (``names``: option → argument); of
    several options for one argument the first in ``names`` that is set wins."""
    kwargs: dict[str, object] = {}
    for key_name, arg in names.items():
        if opts.get(key_name) and arg not in kwargs:
            kwargs[arg] = opts[key_name]
    return kwargs


def _azure_endpoint(opts: Mapping[str, str]) -> str:
    """The Azure endpoint the options name ("" for Azure's own)."""
    return next((opts[k] for k in _AZURE_ENDPOINT_KEYS if opts.get(k)), "")


def _s3_filesystem(uri: str, options: tuple[tuple[str, str], ...]) -> pafs.S3FileSystem:
    hit = _S3_CACHE.get(options)
    if hit is not None:
        return hit
    opts = dict(options)
    kwargs: dict[str, object] = _pyarrow_kwargs(opts, _S3_KEYS)
    endpoint = kwargs.get("endpoint_override")
    if isinstance(endpoint, str) and "://" in endpoint:
        parsed = urlparse(endpoint)
        kwargs["scheme"] = parsed.scheme
        kwargs["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
    if opts.get("AWS_ALLOW_HTTP", "").lower() == "true" and "scheme" not in kwargs:
        kwargs["scheme"] = "http"
    try:
        fs = _S3_CACHE[options] = pafs.S3FileSystem(**kwargs)
    except Exception as exc:  # pragma: no cover - pyarrow reports bad arguments as ArrowInvalid
        raise StorageError(f"{uri}: cannot set up S3 access: {exc}") from exc
    return fs


def _azure_filesystem(uri: str, options: tuple[tuple[str, str], ...]) -> tuple[pafs.FileSystem, str]:
    """pyarrow's AzureFileSystem for ``abfs[s]://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH`` or
    ``abfs|az|azure://CONTAINER/PATH`` (account from the options), with the credentials delta-rs
    gets from the same options: an account key, a SAS token, or a service principal (client id,
    secret, tenant); none of them means Azure's default credential chain. ``AZURE_STORAGE_ENDPOINT``
    (or ``AZURE_ENDPOINT``) points both at another endpoint, e.g. Azurite's
    ``http://127.0.0.1:10000/devstoreaccount1``; ``AZURE_STORAGE_USE_EMULATOR=true`` means Azurite
    at ``AZURITE_BLOB_STORAGE_URL`` (default ``http://127.0.0.1:10000``) with its well-known account."""
    parsed = urlparse(uri)
    container, _, host = parsed.netloc.rpartition("@")
    if not container:
        container, host = parsed.netloc, ""
    path = (container + parsed.path).rstrip("/")
    hit = _AZURE_CACHE.get((host, options))
    if hit is not None:
        return hit, path
    opts = dict(options)
    kwargs = _pyarrow_kwargs(opts, _AZURE_KEYS)
    if host and "account_name" not in kwargs:
        kwargs["account_name"] = host.split(".", 1)[0]
    endpoint = _azure_endpoint(opts)
    if opts.get("AZURE_STORAGE_USE_EMULATOR", "").lower() == "true":
        kwargs.setdefault("account_name", AZURITE_ACCOUNT)
        if "sas_token" not in kwargs:
            kwargs.setdefault("account_key", AZURITE_KEY)
        endpoint = endpoint or (os.environ.get("AZURITE_BLOB_STORAGE_URL") or AZURITE_DEFAULT_URL).rstrip("/") \
            + "/" + kwargs["account_name"]
    if "account_name" not in kwargs:
        raise StorageError(f"{uri}: no Azure storage account: name it in the URI "
                           "(abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/…) or with AZURE_STORAGE_ACCOUNT_NAME")
    if endpoint:
        ep = urlparse(endpoint)
        if not ep.scheme or not ep.netloc:
            raise StorageError(f"{uri}: Azure endpoint {endpoint!r} is not scheme://host[:port][/account]")
        # pyarrow names the account in the path for any endpoint but Azure's own (Azurite's style)
        kwargs.update(blob_storage_authority=ep.netloc, blob_storage_scheme=ep.scheme,
                      dfs_storage_authority=ep.netloc, dfs_storage_scheme=ep.scheme)
    try:
        fs = pafs.AzureFileSystem(**kwargs)
    except Exception as exc:
        raise StorageError(f"{uri}: cannot set up Azure access: {exc}") from exc
    _AZURE_CACHE[(host, options)] = fs
    return fs, path


SOURCE_OPTION_PREFIX = "storage."  # a Spark data source gets a Location's options as storage.KEY


def source_options(location: Location) -> dict[str, str]:
    """The storage options of ``location`` as Spark data-source options (``storage.KEY``): string
    options are all a Python data source receives. Spark redacts options whose names match
    ``spark.redaction.regex`` (secret, token, access key) in plans and the UI."""
    return {SOURCE_OPTION_PREFIX + key: value for key, value in location.options}


def location_from_source_options(path: str, options: Mapping[str, str]) -> Location:
    """The Location a data source was given as ``path`` plus ``storage.KEY`` options. Spark
    lower-cases option names; they are upper-cased back (delta-rs and object_store read storage
    option names in either case, pyarrow's S3 set-up here reads the upper-case ones)."""
    prefix = SOURCE_OPTION_PREFIX
    given = {key[len(prefix):].upper(): value for key, value in options.items()
             if key.lower().startswith(prefix)}
    return Location.parse(path, given)


def as_location(value: "str | os.PathLike | Location") -> Location:
    """Accept what callers have always passed (a path string) as well as a Location."""
    return Location.parse(value)
