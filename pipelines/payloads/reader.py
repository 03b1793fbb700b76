"""The payload tables' Spark data-source reader: commitlog splits → ``(table name, RecordBatch)``.

Built from the same options dict as the ``messages`` reader
(:class:`pipelines.sources.rocketmq.RocketMQReader`: store path and storage options, brokerName,
splitBytes, fromOffset/untilOffset, ingestRunId, …) plus the declarations, so
:meth:`PayloadReader.partitions` are exactly the messages reader's commitlog splits and a fan-out
write (:mod:`pipelines.partition_writer`) can run both over the same tasks. :meth:`read` decodes a
split with the decoder's topic filter set to the declared topics: records of other topics are
walked over but none of their columns is built. Bodies come already decompressed by the decoder
(what the producer sent).

The reader pickles (Spark ships it to the tasks): its options, its Location and the declarations
(whose codecs rebuild what does not pickle).
"""

from __future__ import annotations

from typing import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pipelines.payloads.declarations import Declarations
from pipelines.payloads.rows import payload_batches, payload_outputs
from pipelines.sources.options import DIRECT_WRITE_OPTION
from pipelines.sources.rocketmq import RocketMQReader

__all__ = ["PayloadReader", "payload_outputs"]


class PayloadReader(DataSourceReader):
    """``read(split)`` yields ``(table name, RecordBatch)`` pairs of :func:`payload_batches` for the
    split's records of the declared topics (see the module doc)."""

    def __init__(self, options: Mapping[str, str], declarations: Declarations) -> None:
        self.declarations = declarations
        # bodies as plain binary: Arrow has no take/filter kernel for binary_view, and the decoder only
        # builds the bodies of declared topics' records anyway
        self.messages = RocketMQReader({**options, DIRECT_WRITE_OPTION: "false"})
        # the decoder keeps only records stored in (or delivered to) a declared topic; payload_batches
        # then keeps the stored ones (no declared topic: same splits, read() yields nothing)
        if len(declarations):
            self.messages.pushed._narrow("topics", declarations.topic_names)

    def partitions(self) -> list[InputPartition]:
        return self.messages.partitions()

    def read(self, partition: InputPartition) -> Iterator[tuple[str, pa.RecordBatch]]:
        if not len(self.declarations):
            return
        for batch in self.messages.read(partition):
            yield from payload_batches(batch, self.declarations)

    def outputs(self) -> list[tuple[str, pa.Schema, list[str]]]:
        """:func:`payload_outputs` of this reader's declarations."""
        return payload_outputs(self.declarations)
