"""``spark.readStream.format("rocketmq_commitlog_stream")``: how far each broker store's commitlog can
safely be ingested, as a Spark streaming source whose offsets are commitlog physical offsets.

Why a source of *ranges* and not of messages: the micro-batch writer (:mod:`pipelines.stream`) hands
each broker's ``[mark, end)`` to the batch ingest (:func:`pipelines.ingest.ingest_store`), so a
micro-batch decodes, plans splits and commits exactly as a batch run does, with the same per-broker
app-transaction marks. The source only decides *where the safe end is*; the rows it yields are one
``(broker, start, end)`` per broker range, which the writer collects.

Offsets are JSON objects ``{"broker-a": 123456, ...}``:

* ``initialOffset()``: the lake's mark per broker (the ``messages`` table's app-transaction version
  for :func:`pipelines.ingest.app_id_for`), 0 for a broker never ingested. Spark only uses it for a
  fresh checkpoint; the writer reads the marks again anyway, so the lake, not the checkpoint, decides
  where a batch starts.
* ``latestOffset()``: per store, never a record still being written. While a live broker holds the
  store (its ``lock`` file is locked, see :mod:`broker.store.store_lock`) the end is how far the
  broker's dispatcher has got (:meth:`StoreFiles.dispatched_end`), bounded by the end of the complete
  records (:func:`pipelines.commitlog_ranges.commitlog_end`): every table (consume queue and index
  entries included) can then be ingested to the same end. A store no broker holds ends where its
  complete records end, as the batch ingest computes it. Never below the start (offsets only grow).

Options (strings, as Spark passes them): ``stores`` (JSON, :func:`stream_source_options`) and ``lake``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from broker.store.store_lock import held_by_another_process
from pipelines import commitlog_ranges
from pipelines.commitlog_ranges import segment_files
from pipelines.job_args import StoreSpec
from pipelines.storage import Location
from pipelines.store_files import StoreFiles

log = logging.getLogger(__name__)

SOURCE_NAME = "rocketmq_commitlog_stream"
RANGE_SCHEMA = "broker string, start long, end long"


# ---- options ------------------------------------------------------------------------------------------

def _location_json(location: Location) -> dict:
    return {"uri": location.uri, "options": dict(location.options)}


def _location_from_json(value: Mapping) -> Location:
    # built directly (not Location.parse): the options are already merged with the environment
    return Location(value["uri"], tuple(sorted(value.get("options", {}).items())))


def stream_source_options(stores: Sequence[StoreSpec], lake: Location) -> dict[str, str]:
    """The source's options for ``stores`` and ``lake`` (their storage options travel inside)."""
    return {"stores": json.dumps([{"name": s.name, **_location_json(s.location)} for s in stores]),
            "lake": json.dumps(_location_json(lake))}


def stores_from_options(options: Mapping[str, str]) -> list[StoreSpec]:
    raw = options.get("stores")
    if not raw:
        raise ValueError(f"{SOURCE_NAME}: no 'stores' option (see stream_source_options)")
    out = []
    for item in json.loads(raw):
        location = _location_from_json(item)
        out.append(StoreSpec(item["name"], location.uri, location))
    return out


def lake_from_options(options: Mapping[str, str]) -> Location:
    raw = options.get("lake")
    if not raw:
        raise ValueError(f"{SOURCE_NAME}: no 'lake' option (see stream_source_options)")
    return _location_from_json(json.loads(raw))


# ---- where a store may be read up to ----------------------------------------------------------------

def broker_holds_store(location: Location) -> bool:
    """Whether a process (a live broker) holds the store's lock (a remote store cannot be asked: False)."""
    return location.is_local and held_by_another_process(location.uri)


def safe_end(spec: StoreSpec) -> int:
    """How far ``spec``'s commitlog can be ingested now without taking a record still being written
    (module docstring). Raises :class:`pipelines.storage.StorageError` when the store lists no segment."""
    store = StoreFiles(spec.location)
    live = broker_holds_store(spec.location)
    segments, _ = segment_files(store)
    dispatched = store.dispatched_end()
    complete = commitlog_ranges.commitlog_end(segments, dispatched or None)
    return min(dispatched, complete) if live else complete


def lake_mark(lake: Location, broker: str) -> int:
    """The broker's ingest mark on ``messages`` (0 when never ingested): where the next batch starts."""
    from pipelines.ingest import app_id_for
    from pipelines.lake import app_version
    from schemas.messages import MESSAGES_TABLE

    return app_version(lake, MESSAGES_TABLE, app_id_for(broker)) or 0


# ---- the source ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BrokerRange(InputPartition):
    """One broker's ``[start, end)`` of a micro-batch."""

    broker: str
    start: int
    end: int

    @property
    def value(self):  # InputPartition's attribute (for repr/debugging)
        return (self.broker, self.start, self.end)


class CommitLogStreamReader(DataSourceStreamReader):
    """Offsets per broker (module docstring); everything it holds pickles (specs and locations)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.stores = stores_from_options(options)
        self.lake = lake_from_options(options)

    def initialOffset(self) -> dict:
        return {s.name: lake_mark(self.lake, s.name) for s in self.stores}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:  # noqa: ARG002 (no read limit)
        start = start or {}
        return {s.name: max(int(start.get(s.name, 0)), safe_end(s)) for s in self.stores}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [BrokerRange(s.name, int(start.get(s.name, 0)), int(end.get(s.name, 0)))
                for s in self.stores if int(end.get(s.name, 0)) > int(start.get(s.name, 0))]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, BrokerRange)
        yield (partition.broker, partition.start, partition.end)

    def commit(self, end: dict) -> None:
        pass  # nothing to release: the lake's marks record what was ingested


class CommitLogStreamDataSource(DataSource):
    """``spark.readStream.format("rocketmq_commitlog_stream").options(**stream_source_options(...))``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return RANGE_SCHEMA

    def streamReader(self, schema) -> DataSourceStreamReader:
        return CommitLogStreamReader(self.options)
