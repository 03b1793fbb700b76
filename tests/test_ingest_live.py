"""Ingest while our broker is running and producers are writing: no record twice, none lost.

Three ingest runs happen while a producer thread keeps sending; a last one after it stops. Every
acknowledged message must be in ``messages`` exactly once (found by its commitlog offset, decoded
from the offset message id the broker returned), the runs' offset ranges must chain without gap or
overlap, and the consume-queue units ingested must match the queues' final state.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow.compute as pc

from broker.client import Message, Producer
from broker.store.consume_queue import ConsumeQueue
from broker.store.message_id import decode_offset_msg_id
from pipelines.ingest import ingest
from pipelines.job_args import StoreSpec
from pipelines.lake import scan_arrow
from schemas.messages import MESSAGES_TABLE
from schemas.tables import CONSUME_QUEUE_TABLE, INGEST_RUNS_TABLE
from tests.broker_harness import cluster

TOPIC = "LiveIngest"


def test_ingest_during_live_traffic(spark, tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    acked: list[tuple[int, bytes]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    with cluster(tmp_path) as broker:
        def produce() -> None:
            try:
                with Producer("PG_LIVE", broker.namesrv) as producer:
                    i = 0
                    while not stop.is_set() or i < 300:
                        body = f"live-{i}-".encode() * (1 + i % 40)
                        res = producer.send(Message(TOPIC, body, keys=[f"k{i}"]))
                        acked.append((decode_offset_msg_id(res.offset_msg_id).physical_offset, body))
                        i += 1
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)

        sender = threading.Thread(target=produce, daemon=True)
        sender.start()
        spec = StoreSpec("broker-a", str(broker.store))
        during = []
        for _ in range(3):
            time.sleep(1.0)
            during += ingest(spark, [spec], lake, split_bytes=256 * 1024)
        stop.set()
        sender.join(60)
        assert not sender.is_alive() and not errors, errors
        # the dispatcher runs behind the store: wait until every queue reaches the acked count
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            total = sum(ConsumeQueue(str(broker.store), TOPIC, q).max_offset for q in range(4))
            if total >= len(acked):
                break
            time.sleep(0.2)
        final = ingest(spark, [spec], lake)

    assert sum(1 for s in during if s.rows.get(MESSAGES_TABLE)) >= 2  # ingested while sending
    msgs = scan_arrow(lake, MESSAGES_TABLE, ["commitlog_offset", "topic", "body"],
                      pc.field("topic") == TOPIC).sort_by("commitlog_offset")
    offsets = msgs["commitlog_offset"].to_pylist()
    assert len(offsets) == len(set(offsets))  # nothing twice
    expected = sorted(acked)
    assert offsets == [o for o, _ in expected]  # nothing lost, nothing extra
    assert msgs["body"].to_pylist() == [b for _, b in expected]

    runs = scan_arrow(lake, INGEST_RUNS_TABLE).sort_by("from_offset").to_pylist()
    assert len(runs) == sum(1 for s in during + final if s.rows)  # a run that found nothing new adds no row
    for prev, nxt in zip(runs, runs[1:]):
        assert nxt["from_offset"] == prev["to_offset"]  # ranges chain: no gap, no overlap
    assert runs[0]["from_offset"] == 0 and runs[-1]["to_offset"] == final[0].to_offset

    cq = scan_arrow(lake, CONSUME_QUEUE_TABLE, ["queue_id", "queue_offset", "commitlog_offset"],
                    pc.field("topic") == TOPIC)
    assert sorted(cq["commitlog_offset"].to_pylist()) == offsets
    for q in range(4):
        mine = sorted(r for r, qq in zip(cq["queue_offset"].to_pylist(), cq["queue_id"].to_pylist()) if qq == q)
        assert mine == list(range(len(mine)))  # every unit once, from 0
