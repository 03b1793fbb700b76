"""Which topics have typed payloads, and how their bodies are encoded: the declaration file.

A TOML file (default ``<lake>/_rocketlake/payload_schemas.toml``, or a path given to the job), one
table per topic::

    [topics.Orders]
    format = "json"                      # json | avro | protobuf | text
    schema = "orders.schema.json"        # JSON Schema (.json), Avro (.avsc) or FileDescriptorSet (.pb/.desc)
    key_fields = ["order_id"]            # optional: payload fields the producer uses as message keys

    [topics.Payments]
    format = "protobuf"
    schema = "payments.pb"
    message = "shop.v1.Payment"          # protobuf only: the full message type name

``schema`` paths are relative to the declaration file, which may be local or on object storage
(read through :class:`pipelines.storage.Location` with the lake's storage options). Everything is
checked when the file is loaded (formats, schema files, the schema mapping to Arrow, protobuf
message names, table names, key fields), and every problem is one :class:`PayloadSchemaError`
line naming the file and the topic, so a job fails before reading any store.

Only topics named here are payload topics. A retry or dead-letter topic (``%RETRY%group``,
``%DLQ%group``) is one only when declared by that name: its bodies are the original topic's, and a
dead letter's original row is found through the ``messages`` table by commitlog offset (the
``payload_quarantine`` and payload tables carry ``broker_name`` and ``commitlog_offset`` for that).

``key_fields`` are documentation: they are checked to be top-level payload fields and written into
the payload table's description (the message's own ``keys`` column is always there).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, Mapping

import pyarrow as pa

from pipelines.payloads.codec import Codec
from pipelines.payloads.errors import PayloadSchemaError
from pipelines.storage import Location
from schemas.contract import TableContract
from schemas.payloads import PAYLOAD_QUARANTINE_TABLE, payload_contract, payload_table_name

log = logging.getLogger(__name__)

DECLARATIONS_DIR = "_rocketlake"
DECLARATIONS_FILE = "payload_schemas.toml"
FORMATS = ("json", "avro", "protobuf", "text")
_KEYS = {"format", "schema", "message", "key_fields"}


@dataclass(frozen=True)
class TopicDeclaration:
    """One declared topic: its codec (which knows the payload's Arrow schema) and table."""

    topic: str
    format: str
    codec: Codec
    table_name: str
    schema_file: str | None = None
    message: str | None = None
    key_fields: tuple[str, ...] = ()

    @property
    def schema(self) -> pa.Schema:
        """The payload's columns (without the metadata columns)."""
        return self.codec.schema

    @cached_property
    def contract(self) -> TableContract:
        """The payload table's contract (metadata columns, then the payload's fields)."""
        return payload_contract(self.topic, self.schema, table_name=self.table_name,
                                source=self._source(), key_fields=self.key_fields)

    def _source(self) -> str:
        name = posixpath.basename(self.schema_file) if self.schema_file else None
        if self.format == "protobuf":
            return f"protobuf {self.message} from {name}"
        return f"{self.format} {name}" if name else self.format


@dataclass(frozen=True)
class Declarations:
    """Every declared topic of a declaration file (``source``), by topic name."""

    source: str
    topics: Mapping[str, TopicDeclaration] = field(default_factory=dict)

    def __iter__(self) -> Iterator[TopicDeclaration]:
        return iter(self.topics.values())

    def __len__(self) -> int:
        return len(self.topics)

    def get(self, topic: str) -> TopicDeclaration | None:
        return self.topics.get(topic)

    @property
    def topic_names(self) -> frozenset[str]:
        return frozenset(self.topics)


def declarations_location(lake: "str | os.PathLike | Location") -> Location:
    """Where a lake keeps its declarations by default: ``<lake>/_rocketlake/payload_schemas.toml``."""
    return Location.parse(lake).child(DECLARATIONS_DIR, DECLARATIONS_FILE)


def declarations_source(path: "str | os.PathLike | Location | None" = None, *,
                        lake: "str | os.PathLike | Location | None" = None) -> Location:
    """Where :func:`load_declarations` reads: ``path``, else the lake's own file."""
    if path is None:
        if lake is None:
            raise ValueError("give the declarations file or the lake")
        return declarations_location(lake)
    if isinstance(path, Location) or lake is None:
        return Location.parse(path)
    return Location.parse(path, Location.parse(lake).option_map)


def load_declarations(path: "str | os.PathLike | Location | None" = None, *,
                      lake: "str | os.PathLike | Location | None" = None) -> Declarations:
    """The declarations at ``path`` (default: the lake's, see :func:`declarations_location`).
    A remote ``path`` given as a string gets the lake's storage options."""
    where = declarations_source(path, lake=lake)
    try:
        data = where.read_bytes()
    except FileNotFoundError:
        raise PayloadSchemaError(f"{where}: no payload declarations file") from None
    except OSError as exc:
        raise PayloadSchemaError(f"{where}: cannot read the payload declarations ({exc})") from None
    return parse_declarations(data, where)


def install_declarations(source: "str | os.PathLike", lake: "str | os.PathLike | Location") -> Declarations:
    """Check the declarations file ``source`` and copy it, with the schema files it names, to the
    lake's own place (:func:`declarations_location`), where every batch and streaming run on the
    lake finds it. Schema paths must be relative to ``source`` (they stay relative to the copy).
    Returns the installed declarations; nothing is written when any check fails."""
    declared = load_declarations(Location.parse(source))
    target = declarations_location(lake)
    files = {}
    for decl in declared:
        if decl.schema_file is None:
            continue
        rel = os.path.relpath(decl.schema_file, os.path.dirname(os.path.abspath(source)))
        if rel.startswith(".."):
            raise PayloadSchemaError(f"{source}: topic {decl.topic!r}: schema {decl.schema_file} is outside the "
                                     "declarations file's directory; give it a relative path below it to install")
        files[rel] = Location.parse(decl.schema_file).read_bytes()
    for rel, data in files.items():
        _beside(target, rel.replace(os.sep, "/")).write_bytes(data)
    target.write_bytes(Location.parse(source).read_bytes())
    return load_declarations(target)


def parse_declarations(data: bytes, where: Location) -> Declarations:
    """Declarations from the TOML text of the file at ``where`` (schema paths resolve beside it)."""
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PayloadSchemaError(f"{where}: not valid TOML ({exc})") from None
    topics = doc.get("topics")
    extra = sorted(set(doc) - {"topics"})
    if extra:
        raise PayloadSchemaError(f"{where}: unknown top-level key(s) {', '.join(extra)} (declare topics as [topics.NAME])")
    if not isinstance(topics, dict) or not topics:
        raise PayloadSchemaError(f"{where}: no [topics.NAME] table declared")
    out: dict[str, TopicDeclaration] = {}
    tables: dict[str, str] = {}
    for topic, spec in topics.items():
        try:
            decl = _declaration(topic, spec, where)
        except PayloadSchemaError as exc:
            raise PayloadSchemaError(f"{where}: topic {topic!r}: {exc}") from None
        other = tables.get(decl.table_name)
        if other is not None:
            raise PayloadSchemaError(f"{where}: topics {other!r} and {topic!r} both map to table {decl.table_name!r} "
                                     "(lower-cased, non-alphanumerics as '_'); rename one")
        tables[decl.table_name] = topic
        out[topic] = decl
    log.info("%s: payload topics %s", where, ", ".join(f"{t} ({d.format})" for t, d in out.items()))
    return Declarations(str(where), out)


def _declaration(topic: str, spec, where: Location) -> TopicDeclaration:
    if not isinstance(spec, dict):
        raise PayloadSchemaError("must be a table ([topics.NAME] with format = …)")
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise PayloadSchemaError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")
    fmt = spec.get("format")
    if fmt not in FORMATS:
        raise PayloadSchemaError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    table_name = payload_table_name(topic)
    if table_name == PAYLOAD_QUARANTINE_TABLE:
        raise PayloadSchemaError(f"its table name {table_name!r} is the quarantine's; rename the topic's declaration")
    schema_file, message = spec.get("schema"), spec.get("message")
    if fmt == "protobuf" and not isinstance(message, str):
        raise PayloadSchemaError("format protobuf needs message = \"package.MessageName\"")
    if fmt != "protobuf" and message is not None:
        raise PayloadSchemaError("message is only for format protobuf")
    if fmt == "text":
        if schema_file is not None:
            raise PayloadSchemaError("format text takes no schema")
        codec = _codec(fmt, None, None)
        schema_path = None
    else:
        if not isinstance(schema_file, str) or not schema_file:
            raise PayloadSchemaError(f"format {fmt} needs schema = \"FILE\" (relative to the declarations file)")
        schema_loc = _beside(where, schema_file)
        schema_path = str(schema_loc)
        try:
            data = schema_loc.read_bytes()
        except FileNotFoundError:
            raise PayloadSchemaError(f"schema file {schema_path} not found") from None
        except OSError as exc:
            raise PayloadSchemaError(f"cannot read schema file {schema_path} ({exc})") from None
        try:
            codec = _codec(fmt, data, message)
        except PayloadSchemaError as exc:
            raise PayloadSchemaError(f"{schema_path}: {exc}") from None
    key_fields = spec.get("key_fields", [])
    if not isinstance(key_fields, list) or not all(isinstance(k, str) for k in key_fields):
        raise PayloadSchemaError("key_fields must be a list of field names")
    missing = [k for k in key_fields if k not in codec.schema.names]
    if missing:
        raise PayloadSchemaError(f"key_fields {', '.join(map(repr, missing))} are not top-level payload fields")
    decl = TopicDeclaration(topic, fmt, codec, table_name, schema_path, message, tuple(key_fields))
    try:
        decl.contract
    except ValueError as exc:
        raise PayloadSchemaError(str(exc).replace(f" of topic {topic!r}", "")) from None
    return decl


def _beside(where: Location, relative: str) -> Location:
    """``relative`` resolved against the directory of the file at ``where`` (an absolute local path
    or a URI is taken as it is)."""
    if "://" in relative or os.path.isabs(relative):
        return Location.parse(relative, where.option_map)
    if where.is_local:
        return Location(os.path.normpath(os.path.join(os.path.dirname(where.uri), relative)), where.options)
    scheme, _, rest = where.uri.partition("://")
    return Location(f"{scheme}://{posixpath.normpath(posixpath.join(posixpath.dirname(rest), relative))}",
                    where.options)


def _codec(fmt: str, data: bytes | None, message: str | None) -> Codec:
    """The codec of one declaration (each format's module imported only when declared)."""
    if fmt == "text":
        from pipelines.payloads.text_codec import TextCodec

        return TextCodec()
    if fmt == "json":
        from pipelines.payloads.json_codec import JsonCodec, parse_json_schema_text

        return JsonCodec.from_json_schema(parse_json_schema_text(data))
    if fmt == "avro":
        from pipelines.payloads.avro_codec import AvroCodec

        try:
            document = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PayloadSchemaError(f"not valid JSON (an .avsc file is JSON): {exc}") from None
        return AvroCodec(document)
    from pipelines.payloads.protobuf_codec import ProtobufCodec

    return ProtobufCodec(data, message)
