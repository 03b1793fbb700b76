"""Whole-store integrity check: CommitLog records, ConsumeQueue ↔ CommitLog agreement, index files.

Everything is read with the broker down (or from a copy); nothing is written. Each problem becomes
a :class:`~broker.store.findings.Finding` naming the file and offset, so an operator can go and look.
The CommitLog is decoded with the columnar decoder (only the columns the checks need), and the
queue check is one Arrow join of all CQ units against all records.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker.store import findings as fk
from broker.store.columnar import DecodeStats, iter_decode
from broker.store.commitlog import CommitLog
from broker.store.constants import (
    CONSUME_QUEUE_DIR,
    DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE,
    PROPERTY_DELAY,
    QUEUED_TRANSACTION_TYPE_NAMES,
)
from broker.store.config_files import load_topic_fences
from broker.store.consume_queue import ConsumeQueue, QueueFiles, list_queues, queue_dir
from broker.store.delay import clamp_level, parse_delay_levels
from broker.store.findings import Finding
from broker.store.index_file import IndexService
from broker.store.java_hash import tags_code
from broker.store.topics import SCHEDULE_TOPIC

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass(slots=True)
class VerifyReport:
    findings: list[Finding] = field(default_factory=list)
    segments: int = 0
    records: int = 0
    queues: int = 0
    cq_units: int = 0
    index_files: int = 0
    data_end: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for f in self.findings:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        detail = ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())) or "no findings"
        return (f"{self.segments} commitlog files, {self.records} records, {self.queues} queues, "
                f"{self.cq_units} CQ units, {self.index_files} index files: {detail}")


def _record_table(log_: CommitLog, report: VerifyReport, progress: Progress | None) -> pa.Table:
    """Every record's position, destination and expected tagsCode inputs (CRC checked on the way)."""
    parts = []
    for n, seg in enumerate(log_.segments, 1):
        buf = seg.open()
        stats = DecodeStats()
        data_end = 0  # position just past the segment's last decoded record
        for batch in iter_decode(buf, seg.base, log_.segment_size, file_name=str(seg.path), stats=stats):
            if batch.num_rows:
                ends = pc.add(batch.column("commitlog_offset"), batch.column("store_size").cast(pa.int64()))
                data_end = max(data_end, int(pc.max(ends).as_py()) - seg.base)
            parts.append(pa.table({
                "phy": batch.column("commitlog_offset"),
                "rec_size": batch.column("store_size"),
                "rec_topic": batch.column("topic"),
                "rec_queue_id": batch.column("queue_id"),
                "rec_queue_offset": batch.column("queue_offset"),
                "txn": batch.column("transaction_type"),
                "tags": batch.column("tags"),
                "delay": pc.map_lookup(batch.column("properties"), PROPERTY_DELAY, "last"),
                "store_ts": batch.column("store_timestamp"),
            }))
        report.findings.extend(stats.findings)
        report.records += stats.records
        if stats.blank_at is None and seg is not log_.segments[-1]:
            report.findings.append(Finding(
                str(seg.path), data_end, fk.MISSING_BLANK,
                "a file that is not the last one ends without a BLANK record (Apache's recovery stops here "
                "and drops the later files)", physical_offset=seg.base + data_end))
        if progress:
            progress(f"commitlog {n}/{len(log_.segments)} {seg.name}: {report.records} records")
    if not parts:
        return pa.table({"phy": pa.array([], pa.int64())})
    return pa.concat_tables(parts)


def _expected_tags_codes(records: pa.Table, delay_levels: list[int]) -> np.ndarray:
    """tagsCode each record's CQ unit must carry: tag hashes per distinct tag, deliver times for
    the delay topic."""
    enc = pc.dictionary_encode(records.column("tags").combine_chunks())
    codes = np.array([tags_code(t) for t in enc.dictionary.to_pylist()] + [0], dtype=np.int64)
    idx = np.asarray(enc.indices.fill_null(len(enc.dictionary)))
    out = codes[idx]
    sched = np.flatnonzero(np.asarray(pc.equal(records.column("rec_topic"), SCHEDULE_TOPIC).fill_null(False)))
    if sched.size:
        delays = records.column("delay").to_pylist()
        store_ts = records.column("store_ts").to_numpy()
        for r in sched.tolist():
            text = delays[r]
            if text and text.lstrip("-").isdigit() and int(text) > 0:
                level = clamp_level(int(text), delay_levels)
                out[r] = int(store_ts[r]) + delay_levels[level - 1]
    return out


@dataclass(slots=True)
class _UnitPlaces:
    """Names the CQ file and byte position of a unit for findings (like Apache's names), for queues that may
    have no files: each queue's file size, else the size most queues use. The geometry is QueueFiles'."""

    store_dir: Path
    file_sizes: dict[tuple[str, int], int] = field(default_factory=dict)
    _usual: int | None = None

    def _usual_size(self) -> int:
        """For a queue with no files: the size most queues use, else Apache's default."""
        if self._usual is None:
            sizes = list(self.file_sizes.values())
            self._usual = max(set(sizes), key=sizes.count) if sizes else DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE
        return self._usual

    def locate(self, topic: str, queue_id: int, logical: int) -> tuple[str, int]:
        """The file that holds (or would hold) unit ``logical`` of a queue, and its position in it."""
        size = self.file_sizes.get((topic, queue_id)) or self._usual_size()
        try:
            reader = QueueFiles(queue_dir(self.store_dir, topic, queue_id), size)
        except ValueError:  # a topic or queue id that cannot name a directory
            return str(self.store_dir / CONSUME_QUEUE_DIR), 0
        base, pos = reader.locate(logical)
        return str(reader.path_of(base)), pos


def _queue_table(store_dir: Path, cl_min: int, report: VerifyReport, files: _UnitPlaces) -> pa.Table:
    parts = []
    for topic, qid in list_queues(store_dir):
        cq = ConsumeQueue(store_dir, topic, qid, commitlog_min_offset=cl_min)
        files.file_sizes[(topic, qid)] = cq.file_size
        units = cq.units()
        report.findings.extend(cq.findings)
        report.queues += 1
        report.cq_units += len(units)
        parts.append(pa.table({
            "phy": pa.array(units["commitlog_offset"], pa.int64()),
            "cq_topic": pa.array([topic] * len(units), pa.string()),
            "cq_queue_id": pa.array(np.full(len(units), qid, np.int32)),
            "logical": pa.array(units["logical_offset"], pa.int64()),
            "cq_size": pa.array(units["size"].astype(np.int32)),
            "cq_tags": pa.array(units["tags_code"].astype(np.int64)),
            "cq_file": pa.array([str(cq.directory)] * len(units), pa.string()),
        }))
    if not parts:
        return pa.table({"phy": pa.array([], pa.int64()), "cq_topic": pa.array([], pa.string()),
                         "cq_queue_id": pa.array([], pa.int32()), "logical": pa.array([], pa.int64()),
                         "cq_size": pa.array([], pa.int32()), "cq_tags": pa.array([], pa.int64()),
                         "cq_file": pa.array([], pa.string())})
    return pa.concat_tables(parts)


def _check_queues(records: pa.Table, units: pa.Table, cl_min: int, delay_levels: list[int],
                  report: VerifyReport, files: _UnitPlaces, fences: dict[str, int] | None = None) -> None:
    """Join units to records on the commitlog offset; only rows with a problem become Python.
    ``fences`` (deleted topic -> commitlog offset at deletion): those records need no unit."""
    if records.num_rows:
        records = records.append_column("want_tags", pa.array(_expected_tags_codes(records, delay_levels)))
        joined = units.join(records, keys="phy", join_type="left outer")
    else:
        joined = units.append_column("rec_size", pa.nulls(units.num_rows, pa.int32()))
    dangling = pc.and_(pc.is_null(joined.column("rec_size")), pc.greater_equal(joined.column("phy"), cl_min))
    for r in joined.filter(dangling).to_pylist():
        report.findings.append(Finding(
            *files.locate(r["cq_topic"], r["cq_queue_id"], r["logical"]), fk.CQ_DANGLING,
            f"{r['cq_topic']}/{r['cq_queue_id']} offset {r['logical']} points at commitlog offset {r['phy']}, "
            "where no record starts"))
    if not records.num_rows:
        return
    matched = joined.filter(pc.is_valid(joined.column("rec_size")))
    bad = pc.or_(
        pc.or_(pc.not_equal(matched.column("rec_topic"), matched.column("cq_topic")),
               pc.not_equal(matched.column("rec_queue_id"), matched.column("cq_queue_id"))),
        pc.or_(pc.or_(pc.not_equal(matched.column("rec_size"), matched.column("cq_size")),
                      pc.not_equal(matched.column("rec_queue_offset"), matched.column("logical"))),
               pc.not_equal(matched.column("want_tags"), matched.column("cq_tags"))))
    for r in matched.filter(bad).to_pylist():
        problems = []
        if r["rec_topic"] != r["cq_topic"] or r["rec_queue_id"] != r["cq_queue_id"]:
            problems.append(f"record is in {r['rec_topic']}/{r['rec_queue_id']}")
        if r["rec_size"] != r["cq_size"]:
            problems.append(f"size {r['cq_size']} != record size {r['rec_size']}")
        if r["rec_queue_offset"] != r["logical"]:
            problems.append(f"record QUEUEOFFSET is {r['rec_queue_offset']}")
        if r["want_tags"] != r["cq_tags"]:
            problems.append(f"tagsCode {r['cq_tags']} != expected {r['want_tags']}")
        report.findings.append(Finding(
            *files.locate(r["cq_topic"], r["cq_queue_id"], r["logical"]), fk.CQ_MISMATCH,
            f"{r['cq_topic']}/{r['cq_queue_id']} offset {r['logical']} -> commitlog {r['phy']}: "
            + "; ".join(problems)))
    dispatchable = records.filter(pc.is_in(records.column("txn"), value_set=pa.array(list(QUEUED_TRANSACTION_TYPE_NAMES))))
    for topic, fence in (fences or {}).items():  # a deleted topic's old records belong to no queue
        dispatchable = dispatchable.filter(pc.invert(pc.and_(pc.equal(dispatchable.column("rec_topic"), topic),
                                                             pc.less(dispatchable.column("phy"), fence))))
    covered = pc.is_in(dispatchable.column("phy"), value_set=units.column("phy").combine_chunks())
    missing = dispatchable.filter(pc.invert(covered))
    last_dispatched = int(pc.max(units.column("phy")).as_py()) if units.num_rows else -1
    for r in missing.select(["phy", "rec_topic", "rec_queue_id", "rec_queue_offset"]).to_pylist():
        tail = (" (past the last dispatched record; a broker re-dispatches these on start)"
                if r["phy"] > last_dispatched else "")
        report.findings.append(Finding(
            *files.locate(r["rec_topic"], r["rec_queue_id"], r["rec_queue_offset"]), fk.CQ_MISSING,
            f"record at commitlog {r['phy']} ({r['rec_topic']}/{r['rec_queue_id']} offset "
            f"{r['rec_queue_offset']}) has no ConsumeQueue unit{tail}", physical_offset=r["phy"]))


def verify_store(store_dir: str | Path, *, segment_size: int | None = None,
                 message_delay_level: str | None = None, progress: Progress | None = None) -> VerifyReport:
    """Check a store. ``report.ok`` is True when nothing was found."""
    store_dir = Path(store_dir)
    report = VerifyReport()
    log_ = CommitLog.open(store_dir, segment_size)
    report.findings.extend(log_.findings)
    report.segments = len(log_.segments)
    records = _record_table(log_, report, progress)
    report.data_end = int(pc.max(pc.add(records.column("phy"), records.column("rec_size"))).as_py()) \
        if records.num_rows else log_.min_offset
    levels = parse_delay_levels(message_delay_level) if message_delay_level else parse_delay_levels()
    files = _UnitPlaces(store_dir)
    units = _queue_table(store_dir, log_.min_offset, report, files)
    if progress:
        progress(f"consume queues: {report.queues} queues, {report.cq_units} units")
    _check_queues(records, units, log_.min_offset, levels, report, files, load_topic_fences(store_dir))
    index = IndexService(store_dir)
    report.index_files = len(index.files)
    report.findings.extend(index.findings)
    index.close()
    report.findings.sort(key=lambda f: (f.file, f.offset, f.kind))
    return report
