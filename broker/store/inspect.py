"""The offline inspector's reading side: messages, queues and key lookups as plain rows.

Works on a store with the broker down (or a copy), like ``kafka-dump-log`` does for Kafka. Messages
come from the columnar decoder, so the inspector prints exactly what the Spark jobs ingest.
"""

from __future__ import annotations

import base64
import logging
import mmap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from broker.store.columnar import DecodeFilter, DecodeStats, iter_decode
from broker.store.commitlog import CommitLog
from broker.store.consume_queue import ConsumeQueue, list_queues
from broker.store.findings import Finding
from broker.store.index_file import IndexService

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MessageQuery:
    topic: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    from_offset: int | None = None
    limit: int | None = None
    findings: list[Finding] = field(default_factory=list)


def json_row(row: dict) -> dict:
    """A decoded row as JSON-ready values: properties as an object, body as base64."""
    out = dict(row)
    out["properties"] = dict(row["properties"]) if row["properties"] is not None else {}
    out["body"] = base64.b64encode(row["body"]).decode("ascii") if row["body"] is not None else None
    return out


def iter_messages(store_dir: str | Path, query: MessageQuery) -> Iterator[dict]:
    """Rows of ``rocketlake store messages`` in commitlog order; findings go to ``query.findings``."""
    log_ = CommitLog.open(store_dir)
    query.findings.extend(log_.findings)
    flt = DecodeFilter(
        topics=frozenset({query.topic}) if query.topic else None,
        min_store_timestamp=query.since_ms, max_store_timestamp=query.until_ms,
        min_offset=query.from_offset)
    emitted = 0
    for seg in log_.segments:
        if query.from_offset is not None and seg.base + log_.segment_size <= query.from_offset:
            continue
        buf = seg.open()
        start = max(0, (query.from_offset or 0) - seg.base)
        stats = DecodeStats()
        try:
            for batch in iter_decode(buf, seg.base, log_.segment_size, start, file_name=str(seg.path),
                                     flt=flt, stats=stats, search_first=start != 0,
                                     batch_rows=min(4096, query.limit or 4096)):
                for row in batch.to_pylist():
                    yield row
                    emitted += 1
                    if query.limit is not None and emitted >= query.limit:
                        return
        finally:
            query.findings.extend(stats.findings)
            if isinstance(buf, mmap.mmap):
                try:
                    buf.close()
                except BufferError:  # rows still reference the map; it closes when they go
                    pass


def message_at(log_: CommitLog, offset: int) -> dict | None:
    """The decoded row of the record at a physical offset (None if no message starts there)."""
    seg = log_.segment_for(offset)
    if seg is None:
        return None
    pos = offset - seg.base
    batches = list(iter_decode(seg.open(), seg.base, log_.segment_size, pos, pos + 1,
                               file_name=str(seg.path), search_first=False))
    rows = [r for b in batches for r in b.to_pylist()]
    return rows[0] if rows and rows[0]["commitlog_offset"] == offset else None


@dataclass(frozen=True, slots=True)
class QueueSummary:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    messages: int
    directory: str


def queue_summaries(store_dir: str | Path, topic: str | None = None,
                    findings: list[Finding] | None = None) -> list[QueueSummary]:
    log_ = CommitLog.open(store_dir)
    out = []
    for t, qid in list_queues(store_dir):
        if topic is not None and t != topic:
            continue
        cq = ConsumeQueue(store_dir, t, qid, commitlog_min_offset=log_.min_offset)
        lo, hi = cq.min_offset, cq.max_offset
        out.append(QueueSummary(t, qid, lo, hi, hi - lo, str(cq.directory)))
        if findings is not None:
            findings.extend(cq.findings)
    return out


def queue_units(store_dir: str | Path, topic: str, queue_id: int) -> Iterator[dict]:
    cq = ConsumeQueue(store_dir, topic, queue_id)
    for u in cq.units().tolist():
        logical, phy, size, tags, is_ext = u
        yield {"topic": topic, "queue_id": queue_id, "queue_offset": logical, "commitlog_offset": phy,
               "size": size, "tags_code": tags, "ext_address": bool(is_ext)}


def query_key(store_dir: str | Path, topic: str, key: str, begin_ms: int = 0,
              end_ms: int = (1 << 63) - 1) -> list[dict]:
    """Messages of ``topic`` carrying ``key`` (KEYS token or UNIQ_KEY), through the IndexFiles, with
    no cap on the number of results (mqadmin's queryMsgByKey stops at 64)."""
    log_ = CommitLog.open(store_dir)
    index = IndexService(store_dir)
    try:
        offsets = index.query(topic, key, begin_ms, end_ms, log_)
    finally:
        index.close()
    rows = [message_at(log_, off) for off in offsets]
    return [r for r in rows if r is not None]
