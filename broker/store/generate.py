"""Synthetic, realistic broker stores for demos, tests and benchmarks.

A generated store looks like one a busy Apache broker left behind: CommitLog segments with BLANK
ends, ConsumeQueues, IndexFiles, checkpoint and ``config/*.json``; producers on IPv4 and IPv6
hosts; keys, tags and user properties; compressed large bodies (ZLIB, LZ4, ZSTD); 4.x batches;
delayed messages and their delivered copies; consumer retries through ``SCHEDULE_TOPIC_XXXX`` into
``%RETRY%`` and ``%DLQ%``; transactional half/commit/op records. Everything is derived from the seed,
and store timestamps come from a synthetic clock, so the same arguments give the same bytes.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from broker.store.checkpoint import Checkpoint, write_checkpoint
from broker.store.commitlog import AppendResult, CommitLogWriter
from broker.store.compression import compress
from broker.store.config_files import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    StoreConfig,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    TopicConfig,
    TopicConfigTable,
)
from broker.store.constants import (
    COMPRESSED_FLAG,
    COMPRESSION_BITS_BY_NAME,
    DEFAULT_MAPPED_FILE_SIZE_COMMITLOG,
    DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE,
    DEFAULT_MAX_HASH_SLOT_NUM,
    DEFAULT_MAX_INDEX_NUM,
    MULTI_TAGS_FLAG,
    TRANSACTION_COMMIT_TYPE,
)
from broker.store.consume_queue import ConsumeQueueDispatcher
from broker.store.delay import parse_delay_levels
from broker.store.hosts import Host
from broker.store.index_file import IndexService
from broker.store.message import MessageRecord
from broker.store.message_id import UniqKeyGenerator
from broker.store.properties import encode_properties
from broker.store import topics as special

log = logging.getLogger(__name__)

TOPIC_PREFIX = "demo-topic-"
GROUP_PREFIX = "demo-group-"
CLUSTER = "DefaultCluster"
BROKER_NAME = "broker-a"
STORE_HOST = Host(bytes([192, 168, 0, 10]), 10911)
START_MS = 1_793_491_200_000  # 2026-11-01T00:00:00Z
TAGS = ("TagA", "TagB", "TagC", "TagD", "TagE")
COMPRESS_OVER = 4096  # compressMsgBodyOverHowmuch
RETRY_MAX_TIMES = 16
_WORDS = ("order", "payment", "shipment", "refund", "invoice", "customer", "amount", "currency",
          "EUR", "USD", "status", "created", "updated", "sku", "quantity", "warehouse", "région",
          "支付", "заказ", "🚀")


@dataclass(frozen=True, slots=True)
class GenerateSpec:
    messages: int
    body_bytes: int = 1024
    topics: int = 4
    queues: int = 4
    seed: int = 1
    segment_bytes: int = DEFAULT_MAPPED_FILE_SIZE_COMMITLOG
    cq_file_bytes: int = DEFAULT_MAPPED_FILE_SIZE_CONSUME_QUEUE
    index_slots: int = DEFAULT_MAX_HASH_SLOT_NUM
    index_entries: int = DEFAULT_MAX_INDEX_NUM
    start_ms: int = START_MS
    special: bool = True  # delays, retries, DLQ, transactions, batches, compression

    def __post_init__(self) -> None:
        if self.messages < 0:
            raise ValueError("--messages must be >= 0")
        if self.body_bytes < 0 or self.body_bytes > 4 * 1024 * 1024:
            raise ValueError("--body-bytes must be between 0 and 4 MiB (maxMessageSize)")
        if self.topics < 1 or self.queues < 1:
            raise ValueError("--topics and --queues must be >= 1")
        if self.segment_bytes < 64 * 1024:
            raise ValueError("--segment-bytes must be at least 64 KiB")
        if self.segment_bytes < 4 * self.body_bytes + 64 * 1024:
            raise ValueError("--segment-bytes must hold the largest generated record (4 × body + 64 KiB)")


@dataclass(slots=True)
class GenerateResult:
    messages: int  # commitlog message records written (exactly GenerateSpec.messages)
    bytes: int  # commitlog bytes (physical end offset)
    seconds: float


class _Generator:
    def __init__(self, store: Path, spec: GenerateSpec, progress: Callable[[int, int], None] | None) -> None:
        self.store, self.spec, self.progress = store, spec, progress
        self.rnd = random.Random(spec.seed)
        self.now = spec.start_ms
        self.tick = max(1, 3_600_000 // max(spec.messages, 1))  # spread over about an hour
        self.levels = parse_delay_levels()
        self.writer = CommitLogWriter(store, segment_size=spec.segment_bytes)
        self.cq = ConsumeQueueDispatcher(store, file_size=spec.cq_file_bytes, delay_levels=self.levels)
        self.index = IndexService(store, spec.index_slots, spec.index_entries, clock=lambda: self.now)
        self.uniq = UniqKeyGenerator(ip=bytes([10, 1, 2, 3]), pid=4242, loader_hash=spec.seed & 0x7FFFFFFF)
        self.producers = [Host(bytes([10, 0, self.rnd.randrange(256), self.rnd.randrange(1, 255)]),
                               self.rnd.randrange(30000, 60000)) for _ in range(8)]
        self.producers_v6 = [Host(bytes.fromhex("20010db8000000000000000000000000")[:12]
                                  + self.rnd.randbytes(4), self.rnd.randrange(30000, 60000)) for _ in range(2)]
        text = " ".join(self.rnd.choice(_WORDS) for _ in range(200_000)).encode()
        self.text = text
        self.written = 0
        self.pending_delivery: list[tuple[int, MessageRecord]] = []  # (due index, record to deliver)
        self.delivered_by_level: dict[int, int] = {}
        self.topics = [f"{TOPIC_PREFIX}{i}" for i in range(spec.topics)]

    # ---- building records ------------------------------------------------------------------------
    def body(self, size: int) -> bytes:
        start = self.rnd.randrange(0, max(1, len(self.text) - size - 64))
        start = self.text.find(b" ", start) + 1  # start on a word, so bodies are valid UTF-8 text
        return self.text[start:start + size]

    def born(self) -> Host:
        return self.rnd.choice(self.producers_v6) if self.rnd.random() < 0.05 else self.rnd.choice(self.producers)

    def new_message(self, topic: str, n: int) -> MessageRecord:
        spec = self.spec
        size = max(0, int(spec.body_bytes * self.rnd.uniform(0.75, 1.25))) if spec.body_bytes else 0
        sys_flag = 0
        props: dict[str, str] = {}
        tags = self.rnd.choice(TAGS)
        if spec.special and self.rnd.random() < 0.02:
            tags = "TagA||TagB"
            sys_flag |= MULTI_TAGS_FLAG
        props["KEYS"] = f"order-{n} user-{self.rnd.randrange(1000)}"
        props["UNIQ_KEY"] = self.uniq.next(self.now)
        props["CLUSTER"] = CLUSTER
        if self.rnd.random() < 0.2:
            props["region"] = self.rnd.choice(("eu-west-1", "us-east-1", "ap-southeast-1"))
        props["TAGS"] = tags
        body = self.body(size)
        if spec.special and n % 50 == 7:  # an occasional large body, compressed by the producer
            body = self.body(max(COMPRESS_OVER, 4 * spec.body_bytes))
            codec = ("ZLIB", "LZ4", "ZSTD")[(n // 50) % 3]
            body = compress(body, codec)
            sys_flag |= COMPRESSED_FLAG | COMPRESSION_BITS_BY_NAME[codec]
        return MessageRecord(topic=topic, body=body, properties_raw=encode_properties(props),
                             queue_id=self.rnd.randrange(spec.queues), flag=0, sys_flag=sys_flag,
                             born_timestamp=self.now - self.rnd.randrange(1, 50), born_host=self.born(),
                             store_host=STORE_HOST)

    # ---- appending -------------------------------------------------------------------------------
    def append(self, records: list[MessageRecord]) -> list[AppendResult]:
        results = self.writer.append_batch(records, store_timestamp=self.now)
        for res in results:
            self.cq.dispatch(res.record)
            self.index.dispatch(res.record)
        self.written += len(results)
        return results

    def schedule(self, rec: MessageRecord, level: int, due: int) -> None:
        """Store ``rec`` under SCHEDULE_TOPIC_XXXX and deliver it to its real topic later."""
        props = rec.properties
        props["DELAY"] = str(level)
        wrapped = dict(props, REAL_TOPIC=rec.topic, REAL_QID=str(rec.queue_id))
        stored = self.append([MessageRecord(
            topic=special.SCHEDULE_TOPIC, body=rec.body, properties_raw=encode_properties(wrapped),
            queue_id=special.delay_level_to_queue_id(level), sys_flag=rec.sys_flag, flag=rec.flag,
            born_timestamp=rec.born_timestamp, born_host=rec.born_host, store_host=STORE_HOST,
            reconsume_times=rec.reconsume_times)])[0]
        # The delivered copy keeps DELAY/REAL_TOPIC/REAL_QID on disk (built before they are removed).
        self.pending_delivery.append((due, MessageRecord(
            topic=rec.topic, body=rec.body, properties_raw=encode_properties(wrapped), queue_id=rec.queue_id,
            sys_flag=rec.sys_flag, flag=rec.flag, born_timestamp=rec.born_timestamp, born_host=rec.born_host,
            store_host=STORE_HOST, reconsume_times=rec.reconsume_times)))
        self.delivered_by_level[level] = stored.queue_offset + 1

    def deliver_due(self, i: int) -> None:
        due = [p for p in self.pending_delivery if p[0] <= i]
        if due:
            self.pending_delivery = [p for p in self.pending_delivery if p[0] > i]
            for _, rec in due:
                self.append([rec])

    def send_back(self, original: AppendResult, group: str, attempts: int) -> None:
        """A consumer failing a message ``attempts`` times: retries, then the DLQ if over the max."""
        rec = original.record
        base = rec.properties
        origin = base.get("UNIQ_KEY", original.record.offset_msg_id)
        for attempt in range(1, min(attempts, 2) + 1):
            props = dict(base, RETRY_TOPIC=rec.topic, ORIGIN_MESSAGE_ID=origin)
            retry = MessageRecord(topic=special.retry_topic(group), body=rec.body,
                                  properties_raw=encode_properties(props), queue_id=0, sys_flag=rec.sys_flag,
                                  born_timestamp=rec.born_timestamp, born_host=rec.born_host,
                                  store_host=STORE_HOST, reconsume_times=attempt)
            self.schedule(retry, 3 + attempt - 1, self.written + 5 * attempt)
        if attempts > RETRY_MAX_TIMES:
            props = dict(base, RETRY_TOPIC=rec.topic, ORIGIN_MESSAGE_ID=origin, DELAY="0")
            self.append([MessageRecord(topic=special.dlq_topic(group), body=rec.body,
                                       properties_raw=encode_properties(props), queue_id=0,
                                       sys_flag=rec.sys_flag, born_timestamp=rec.born_timestamp,
                                       born_host=rec.born_host, store_host=STORE_HOST,
                                       reconsume_times=RETRY_MAX_TIMES + 1)])

    def transaction(self, rec: MessageRecord) -> None:
        props = dict(rec.properties, TRAN_MSG="true", PGROUP="demo-tx-producer")
        half_props = dict(props, REAL_TOPIC=rec.topic, REAL_QID=str(rec.queue_id))
        half = self.append([MessageRecord(topic=special.TRANS_HALF_TOPIC, body=rec.body,
                                          properties_raw=encode_properties(half_props), queue_id=0,
                                          born_timestamp=rec.born_timestamp, born_host=rec.born_host,
                                          store_host=STORE_HOST)])[0]
        self.now += self.tick
        self.append([MessageRecord(topic=rec.topic, body=rec.body, properties_raw=encode_properties(half_props),
                                   queue_id=rec.queue_id, sys_flag=TRANSACTION_COMMIT_TYPE,
                                   born_timestamp=rec.born_timestamp, born_host=rec.born_host,
                                   store_host=STORE_HOST, prepared_transaction_offset=half.physical_offset)])
        self.append([MessageRecord(topic=special.TRANS_OP_HALF_TOPIC, body=str(half.queue_offset).encode(),
                                   properties_raw=encode_properties({"TAGS": "d"}), queue_id=0,
                                   born_timestamp=self.now, born_host=STORE_HOST, store_host=STORE_HOST)])

    # ---- the run -----------------------------------------------------------------------------------
    def run(self) -> GenerateResult:
        t0 = time.monotonic()
        spec, n = self.spec, 0
        first_topic_results: list[AppendResult] = []
        while self.written + len(self.pending_delivery) < spec.messages:
            self.now += self.tick
            topic = self.topics[min(int(self.rnd.paretovariate(1.5)) - 1, len(self.topics) - 1)]
            room = spec.messages - self.written - len(self.pending_delivery)
            # multi-record events only while there is room, so exactly ``messages`` records result
            roll = self.rnd.random() if spec.special and room > 40 else 1.0
            if roll < 0.02 and spec.messages - self.written >= 4:
                self.append([self._batch_item(topic, n + k) for k in range(4)])
                n += 4
            elif roll < 0.03:
                self.schedule(self.new_message(topic, n), 2, self.written + 20)
                n += 1
            elif roll < 0.035:
                self.transaction(self.new_message(topic, n))
                n += 1
            else:
                res = self.append([self.new_message(topic, n)])[0]
                n += 1
                if topic == self.topics[0]:
                    first_topic_results.append(res)
                if roll < 0.045 and topic == self.topics[0]:
                    self.send_back(res, f"{GROUP_PREFIX}0", RETRY_MAX_TIMES + 1 if roll < 0.037 else 2)
            self.deliver_due(self.written)
            if self.progress and n % 20_000 < 4:
                self.progress(self.written, spec.messages)
        for _, rec in self.pending_delivery:
            self.append([rec])
        self.pending_delivery.clear()
        self._finish()
        end = self.writer.write_offset
        self.writer.close()
        self.cq.close()
        self.index.close()
        return GenerateResult(self.written, end, time.monotonic() - t0)

    def _batch_item(self, topic: str, n: int) -> MessageRecord:
        rec = self.new_message(topic, n)
        props = dict(rec.properties, WAIT="true")
        return MessageRecord(topic=topic, body=rec.body if not rec.sys_flag & COMPRESSED_FLAG else b"batch-" + bytes(n % 7),
                             properties_raw=encode_properties(props), queue_id=0,
                             born_timestamp=rec.born_timestamp, born_host=rec.born_host, store_host=STORE_HOST)

    def _finish(self) -> None:
        """config/*.json and checkpoint the way a cleanly stopped broker leaves them."""
        spec = self.spec
        topics = TopicConfigTable()
        for name, queues in ((special.SCHEDULE_TOPIC, 18), ("SELF_TEST_TOPIC", 1),
                             (special.DEFAULT_TOPIC, special.DEFAULT_TOPIC_QUEUE_NUMS), ("BenchmarkTest", 1024), ("OFFSET_MOVED_EVENT", 1), (CLUSTER, 16), (BROKER_NAME, 1),
                             (special.TRANS_HALF_TOPIC, 1), (special.TRANS_OP_HALF_TOPIC, 1)):
            topics.put(TopicConfig(name, read_queue_nums=queues, write_queue_nums=queues,
                                   perm=7 if name in (special.DEFAULT_TOPIC, CLUSTER, BROKER_NAME) else 6))
        for t in self.topics:
            topics.put(TopicConfig(t, read_queue_nums=spec.queues, write_queue_nums=spec.queues))
        groups = SubscriptionGroupTable()
        offsets = ConsumerOffsetTable()
        for g in range(min(3, spec.topics) or 1):
            group = f"{GROUP_PREFIX}{g}"
            groups.put(SubscriptionGroupConfig(group, retry_max_times=RETRY_MAX_TIMES))
            topics.put(TopicConfig(special.retry_topic(group), read_queue_nums=1, write_queue_nums=1))
        topics.put(TopicConfig(special.dlq_topic(f"{GROUP_PREFIX}0"), read_queue_nums=1, write_queue_nums=1))
        queue_ends = self.writer.queue_offsets
        # demo-group-0 has consumed everything of topic 0; demo-group-1 about half of topic 1;
        # demo-group-2 subscribed to the last topic but never committed.
        for (topic, qid), end in sorted(queue_ends.items()):
            if topic == self.topics[0]:
                offsets.set_offset(f"{GROUP_PREFIX}0", topic, qid, end)
            elif len(self.topics) > 1 and topic == self.topics[1]:
                offsets.set_offset(f"{GROUP_PREFIX}1", topic, qid, end // 2)
            elif topic == special.retry_topic(f"{GROUP_PREFIX}0"):
                offsets.set_offset(f"{GROUP_PREFIX}0", topic, qid, end)
        delay = DelayOffsetTable()
        for level, offset in sorted(self.delivered_by_level.items()):
            delay.set_offset(level, offset)
        # put() stamps dataVersion with the wall clock: use the synthetic one, so a seed gives the same bytes
        topics.data_version.timestamp = groups.data_version.timestamp = self.now
        StoreConfig(topics, groups, offsets, delay).save(self.store, fsync=False)
        write_checkpoint(self.store, Checkpoint(self.now, self.now, self.now), fsync=False)


def generate_store(store_dir: str | Path, spec: GenerateSpec,
                   progress: Callable[[int, int], None] | None = None) -> GenerateResult:
    """Write a new store into ``store_dir`` (which must not already hold a commitlog)."""
    store = Path(store_dir)
    if (store / "commitlog").exists() and any((store / "commitlog").iterdir()):
        raise FileExistsError(f"{store} already holds a commitlog; generate into a new directory")
    store.mkdir(parents=True, exist_ok=True)
    result = _Generator(store, spec, progress).run()
    log.info("generated %d messages, %d bytes in %.1f s", result.messages, result.bytes, result.seconds)
    return result
