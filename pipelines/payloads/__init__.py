"""Typed per-topic tables from message bodies ("payloads").

The ``messages`` table keeps every body as opaque bytes. A declaration file
(:mod:`~pipelines.payloads.declarations`, ``<lake>/_rocketlake/payload_schemas.toml`` by default)
says, per topic, how its bodies are encoded (JSON with a JSON Schema, Avro, Protobuf, plain text);
the codecs (:mod:`.json_codec`, :mod:`.avro_codec`, :mod:`.protobuf_codec`, :mod:`.text_codec`)
turn a batch of bodies into Arrow columns plus per-row failure reasons; :mod:`.rows` turns a batch
of ``messages`` rows into rows of ``payload_<topic>`` tables and of ``payload_quarantine``;
:mod:`.reader` is the Spark data-source reader the ingest fans out from; :mod:`.evolution` says
which schema changes a payload table may take; :mod:`.infer` proposes a JSON Schema from a
topic's bodies in the lake.

This package's ``__init__`` imports nothing heavy: :mod:`pipelines.delta_commit` imports
:mod:`.evolution` and must not pull in fastavro or protobuf.
"""

from pipelines.payloads.errors import PayloadSchemaError

__all__ = ["PayloadSchemaError"]
