"""Interoperability with Apache's C++ RocketMQ client (the ``rocketmq`` wheel, librocketmq 1.2.3).

One name server and one broker serve the whole module. The C++ client always runs in a subprocess
(``tests/cpp_client_scripts/``, HOME in the tmp dir) so that a crash of librocketmq cannot take
pytest down; each script prints one JSON document. The scenario, in fixture order:

1. an idle push consumer starts on an empty topic, connected through counting proxies (a name-server
   proxy rewrites its routes to a broker proxy that logs requests and decodes PULL answers);
2. a producer sends 3,000 messages (sync, oneway, async, batches of 10, orderly) with keys, tags, user
   properties (non-ASCII too) and bodies from 1 byte to 200 KB; the async sends are still in flight
   while the batches and orderly messages go out;
3. in parallel: push consumers for ``*`` (concurrent and orderly) and ``TagA || TagB``, a pull
   consumer, and, one message at a time, a consumer that fails everything (retryMaxTimes 2 →
   ``%RETRY%`` → ``%DLQ%``);
4. after 20 idle seconds a message wakes the idle consumer; the broker is stopped cleanly and the
   store is verified and decoded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.remoting import event_loop
from broker.remoting.codes import RequestCode, ResponseCode
from broker.store.config_files import (
    ConsumerOffsetTable,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    TopicConfigTable,
    config_path,
)
from broker.store.constants import CONSUMER_OFFSET_FILE, SUBSCRIPTION_GROUP_FILE, TOPICS_FILE
from broker.store.inspect import MessageQuery, iter_messages
from broker.store.message import MessageRecord, decode_record
from broker.store.verify import verify_store
from tests.broker_harness import start_broker, start_namesrv
from tests.cpp_client import ClientProcesses, create_routed_topic, max_offset, wait_for


TOPIC = "InteropTopic"
RETRY_SRC_TOPIC = "InteropRetry"
IDLE_TOPIC = "InteropIdle"
PRODUCER_GROUP = "PG_INTEROP"
GROUP_ALL = "CG_INTEROP_ALL"
GROUP_TAGS = "CG_INTEROP_TAGS"
GROUP_PULL = "CG_INTEROP_PULL"
GROUP_DLQ = "CG_INTEROP_DLQ"
GROUP_ORDERLY = "CG_INTEROP_ORDERLY"
GROUP_IDLE = "CG_INTEROP_IDLE"
TAG_EXPRESSION = "TagA || TagB"
WANTED_TAGS = {"TagA", "TagB"}
RETRY_MAX_TIMES = 2
DLQ_MESSAGES = 4
DELAY_LEVELS = " ".join(["1s"] * 18)
USER_PROPS = ["seq", "kind", "note", "extra"]
IDLE_SECONDS = 20.0
QUEUES = 4  # auto-created topics: min(defaultTopicQueueNums 4 from the C++ client, TBW102's 8)
BROKER_CONFIG = {"messageDelayLevel": DELAY_LEVELS, "flushDiskType": "SYNC_FLUSH",
                 "mappedFileSizeCommitLog": 1024 * 1024}

N_SYNC, N_ONEWAY, N_ASYNC, N_BATCHES, BATCH_SIZE, N_ORDERLY = 2000, 300, 200, 30, 10, 200
REPLY_MODES = ("sync", "async", "orderly")  # single sends whose SendResult names the message


# =====================================================================================================
# helpers
# =====================================================================================================
def _fail_lines(title: str, items, limit: int = 15) -> str:
    items = list(items)
    shown = "\n  ".join(str(i) for i in items[:limit])
    more = f"\n  … and {len(items) - limit} more" if len(items) > limit else ""
    return f"{title} ({len(items)}):\n  {shown}{more}"


class FrameProxy:
    """A TCP proxy that understands remoting frames: logs client requests by (code, consumerGroup),
    decodes the records of every PULL_MESSAGE answer, and can rewrite answer bodies (to point a
    client's routes at another proxy)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, upstream: str, rewrite: tuple[bytes, bytes] | None = None):
        self.loop = loop
        self.upstream = upstream
        self.rewrite = rewrite
        self.requests: Counter = Counter()
        self.events: list[tuple[float, int, str | None]] = []  # (monotonic time, code, consumerGroup)
        self.pulled: dict[str | None, list[MessageRecord]] = defaultdict(list)  # records in PULL answers
        self.sends: Counter = Counter()  # SEND_MESSAGE by (batch, compressed)
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), loop).result(10)
        self.addr = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def count(self, code: int, group: str | None, since: float = 0.0, until: float = float("inf")) -> int:
        with self.lock:
            return sum(1 for t, c, g in self.events if c == code and g == group and since <= t < until)

    async def _accept(self, reader, writer) -> None:
        host, port = self.upstream.rsplit(":", 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        pending: dict[int, tuple[int, str | None]] = {}  # opaque -> (code, group) of this connection
        await asyncio.gather(self._pump(reader, up_writer, True, pending),
                             self._pump(up_reader, writer, False, pending), return_exceptions=True)

    def _pull_answer(self, group: str | None, body: bytes) -> None:
        pos, records = 0, []
        try:
            while pos < len(body):
                phys = int.from_bytes(body[pos + 28:pos + 36], "big", signed=True)
                records.append(decode_record(body, pos, phys))
                pos += int.from_bytes(body[pos:pos + 4], "big")
        except Exception as exc:  # reported by the tests
            self.errors.append(f"PULL answer for {group}: record at {pos} does not decode: {exc}")
        with self.lock:
            self.pulled[group].extend(records)

    async def _pump(self, reader, writer, from_client: bool, pending: dict) -> None:
        try:
            while True:
                length = int.from_bytes(await reader.readexactly(4), "big")
                payload = await reader.readexactly(length)
                header_len = int.from_bytes(payload[:4], "big") & 0xFFFFFF
                header = json.loads(payload[4:4 + header_len]) if payload[0] == 0 else {}
                is_response = bool(header.get("flag", 0) & 1)
                if from_client and not is_response:
                    key = (header.get("code"), (header.get("extFields") or {}).get("consumerGroup"))
                    pending[header.get("opaque")] = key
                    ext = header.get("extFields") or {}
                    if key[0] == RequestCode.SEND_MESSAGE:
                        compressed = bool(int(ext.get("sysFlag", 0)) & 1)
                        with self.lock:
                            self.sends[(str(ext.get("batch")) in ("1", "true"), compressed)] += 1
                    with self.lock:
                        self.requests[key] += 1
                        self.events.append((time.monotonic(), *key))
                if not from_client and is_response:
                    code, group = pending.pop(header.get("opaque"), (None, None))
                    if code == RequestCode.PULL_MESSAGE and header.get("code") == ResponseCode.SUCCESS:
                        self._pull_answer(group, payload[4 + header_len:])
                if not from_client and self.rewrite is not None:
                    body = payload[4 + header_len:].replace(*self.rewrite)
                    payload = payload[:4 + header_len] + body
                writer.write(len(payload).to_bytes(4, "big") + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()


# =====================================================================================================
# the messages
# =====================================================================================================
_ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789,.;:-_\n\tüéß€日本語✓🚀"
_ASCII = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "


def _body(rng: random.Random, seq: str, size: int, ascii_only: bool = False) -> str:
    """A text body of exactly ``size`` UTF-8 bytes (C strings: no NUL), starting with its seq."""
    head = f"{seq}|"
    if size <= len(head):
        return "x" * size
    alphabet = _ASCII if ascii_only else _ALPHABET
    text = head + "".join(rng.choices(alphabet, k=size - len(head)))
    raw = text.encode("utf-8")[:size].decode("utf-8", "ignore")
    return raw + "a" * (size - len(raw.encode("utf-8")))


def build_messages() -> list[dict]:
    rng = random.Random(20240917)
    msgs: list[dict] = []
    special_sizes = {3: 1, 7: 4095, 11: 4096, 13: 4097, 17: 5000, 19: 65_536, 23: 200_000, 29: 3_999}
    tag_choices = ["TagA", "TagB", "TagC", "TagD", None]

    def new(mode: str, i: int, size: int, **extra) -> dict:
        seq = f"{mode[:2]}{i:05d}"
        tags = tag_choices[rng.randrange(len(tag_choices))]
        props = {"seq": seq, "kind": mode, "note": rng.choice(["plain", "naïve café ✓", "日本語のテキスト",
                                                                  "Ελληνικά & emoji 🚀", "a=b;c"])}
        if i % 3 == 0:
            props["extra"] = f"x{i}-ü"
        keys = None if i % 5 == 4 else (f"key-{seq}" if i % 2 else f"key-{seq} ключ-{i % 17}")
        m = {"seq": seq, "mode": mode, "tags": tags, "keys": keys, "props": props,
             "body": _body(rng, seq, size, ascii_only=i in special_sizes)}
        m.update(extra)
        return m

    for i in range(N_SYNC):
        size = special_sizes.get(i) or int(rng.choice([rng.randint(1, 80), rng.randint(80, 600),
                                                         rng.randint(600, 2500)]))
        msgs.append(new("sync", i, size))
    for i in range(N_ONEWAY):
        msgs.append(new("oneway", i, special_sizes.get(i) or rng.randint(2, 900)))
    for i in range(N_ASYNC):
        size = special_sizes.get(i) or int(rng.choice([rng.randint(1, 80), rng.randint(80, 1200),
                                                         rng.randint(1200, 6000)]))
        msgs.append(new("async", i, size))
    for b in range(N_BATCHES):
        for k in range(BATCH_SIZE):
            i = b * BATCH_SIZE + k
            # small batches stay < 4 KiB (sent raw), most are larger (the client compresses the whole body)
            size = rng.randint(5, 60) if b % 3 == 0 else (5000 if k == 4 and b % 3 == 1 else rng.randint(50, 1500))
            msgs.append(new("batch", i, size, batch=b))
    for i in range(N_ORDERLY):
        msgs.append(new("orderly", i, special_sizes.get(i) or rng.randint(2, 700), arg=i % 7))
    seqs = [m["seq"] for m in msgs]
    assert len(set(seqs)) == len(seqs)
    return msgs


def build_dlq_messages() -> list[dict]:
    rng = random.Random(7)
    return [{"seq": f"dlq{i}", "mode": "sync", "tags": "TagR", "keys": f"retry-{i}",
             "props": {"seq": f"dlq{i}", "kind": "dlq", "note": "wiederholt ✓"},
             "body": _body(rng, f"dlq{i}", 5000 if i == 0 else 100 + i)} for i in range(DLQ_MESSAGES)]


def expected_view(m: dict) -> dict:
    return {"body": m["body"].encode("utf-8"), "keys": m["keys"], "tags": m["tags"], "props": m["props"]}


def delivered_view(d: dict) -> dict:
    return {"body": base64.b64decode(d["body"]), "keys": d["keys"], "tags": d["tags"], "props": d["props"]}


def check_deliveries(name: str, deliveries: list[dict], expected: dict[str, dict], topic: str) -> None:
    """Every expected message exactly once, identical; nothing else."""
    counts = Counter(d["props"].get("seq") for d in deliveries)
    missing = sorted(set(expected) - set(counts))
    unexpected = sorted((s for s in counts if s not in expected), key=str)
    duplicated = sorted((s, c) for s, c in counts.items() if c > 1)
    mismatched = []
    for d in deliveries:
        seq = d["props"].get("seq")
        if seq in expected:
            want, got = expected_view(expected[seq]), delivered_view(d)
            if want != got or d["topic"] != topic:
                diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
                if d["topic"] != topic:
                    diff["topic"] = (topic, d["topic"])
                mismatched.append((seq, {k: (repr(v[0])[:80], repr(v[1])[:80]) for k, v in diff.items()}))
    problems = []
    if missing:
        problems.append(_fail_lines("missing", missing))
    if unexpected:
        problems.append(_fail_lines("not expected", unexpected))
    if duplicated:
        problems.append(_fail_lines("delivered more than once (seq, times)", duplicated))
    if mismatched:
        problems.append(_fail_lines("content differs (field: (sent, received))", mismatched))
    assert not problems, f"{name}: {len(deliveries)} deliveries, {len(expected)} expected\n" + "\n".join(problems)


# =====================================================================================================
# fixtures: one broker for the module, the scenario in stages
# =====================================================================================================
@dataclass
class Env:
    tmp: Path
    store: Path
    namesrv: str
    broker: object
    ns_proc: subprocess.Popen
    loop: asyncio.AbstractEventLoop
    broker_proxy: FrameProxy | None = None
    ns_proxy: FrameProxy | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.clients = ClientProcesses(self.tmp)
        self.client = self.clients.client


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interop")
    store = tmp / "store"
    # the failing group's retryMaxTimes, in place before the broker starts
    groups = SubscriptionGroupTable()
    groups.put(SubscriptionGroupConfig(group_name=GROUP_DLQ, retry_max_times=RETRY_MAX_TIMES))
    groups.save(config_path(store, SUBSCRIPTION_GROUP_FILE))
    t0 = time.monotonic()
    ns_proc, ns_addr = start_namesrv(tmp)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="interop-proxies", daemon=True)
    thread.start()
    e = None
    try:
        broker = start_broker(store, ns_addr, BROKER_CONFIG)
        e = Env(tmp, store, ns_addr, broker, ns_proc, loop)
        e.timings["broker start"] = time.monotonic() - t0
        # Some clients reach the broker through a proxy that logs their requests and decodes the PULL
        # answers; a second proxy, in front of the name server, points their routes there.
        e.broker_proxy = FrameProxy(loop, broker.addr)
        e.ns_proxy = FrameProxy(loop, ns_addr, rewrite=(broker.addr.encode(), e.broker_proxy.addr.encode()))
        yield e
    finally:
        if e is not None:
            e.clients.kill_all()
            e.broker.stop()
            print("\ninterop timings:", {k: round(v, 1) for k, v in e.timings.items()})
        ns_proc.send_signal(signal.SIGTERM)
        try:
            ns_proc.wait(10)
        except subprocess.TimeoutExpired:
            ns_proc.kill()
        event_loop.stop_loop_thread(loop, thread, 5)


def create_topic(env: Env, topic: str, queues: int) -> None:
    create_routed_topic(env.broker.addr, env.namesrv, topic, queues)


@pytest.fixture(scope="module")
def idle(env):
    """A push consumer on an empty topic, started first; measured in test_long_polling."""
    create_topic(env, IDLE_TOPIC, QUEUES)
    c = env.client("idle", ["push_consume.py", env.ns_proxy.addr, GROUP_IDLE, IDLE_TOPIC, "*", "--unique", "1",
                            "--props", "seq", "--timeout", "400", "--settle", "0.5"], timeout=420)
    c.wait_line("started")
    # its first pulls (one per queue) reach the broker right after the first rebalance (the %RETRY%
    # queue follows at the client's first route refresh, ~3 s later)
    wait_for("the idle consumer's first pulls",
             lambda: env.broker_proxy.count(RequestCode.PULL_MESSAGE, GROUP_IDLE) >= QUEUES, 20,
             detail=lambda: f"requests seen: {dict(env.broker_proxy.requests)}")
    return {"client": c, "since": time.monotonic()}


@pytest.fixture(scope="module")
def produced(env, idle):
    msgs = build_messages()
    spec = env.tmp / "spec.json"
    spec.write_text(json.dumps({"topic": TOPIC, "messages": msgs}, ensure_ascii=False), encoding="utf-8")
    t0 = time.monotonic()
    # through the proxies, which record the sysFlag of each SEND_MESSAGE
    main = env.client("producer", ["produce.py", env.ns_proxy.addr, PRODUCER_GROUP, str(spec)],
                      timeout=150).result()
    env.timings[f"produce {len(msgs)}"] = time.monotonic() - t0
    # oneway sends have no answer: wait until the broker holds every message before consuming
    wait_for(f"{len(msgs)} messages in {TOPIC}",
             lambda: sum(max_offset(env.broker.addr, TOPIC, q) for q in range(QUEUES)) >= len(msgs), 30,
             detail=lambda: f"have {sum(max_offset(env.broker.addr, TOPIC, q) for q in range(QUEUES))}")
    return {"messages": msgs, "by_seq": {m["seq"]: m for m in msgs}, "result": main}


@pytest.fixture(scope="module")
def consumed(env, produced):
    """Four consumers of TOPIC in parallel with the retry/DLQ round trips of RETRY_SRC_TOPIC."""
    n = len(produced["messages"])
    n_tags = sum(1 for m in produced["messages"] if m["tags"] in WANTED_TAGS)
    props = ",".join(USER_PROPS)
    t0 = time.monotonic()
    procs = {
        "all": env.client("push-all", ["push_consume.py", env.namesrv, GROUP_ALL, TOPIC, "*", "--unique", str(n),
                                       "--total", str(n), "--props", props, "--timeout", "120",
                                       "--settle", "3"], timeout=150),
        # through the proxies: the records in its PULL answers show whether the broker filtered
        "tags": env.client("push-tags", ["push_consume.py", env.ns_proxy.addr, GROUP_TAGS, TOPIC, TAG_EXPRESSION,
                                         "--unique", str(n_tags), "--props", props, "--timeout", "120",
                                         "--settle", "3"], timeout=150),
        "orderly": env.client("push-orderly", ["push_consume.py", env.namesrv, GROUP_ORDERLY, TOPIC, "*",
                                               "--unique", str(n), "--total", str(n), "--props", props,
                                               "--orderly", "--timeout", "120", "--settle", "3"], timeout=150),
        "pull": env.client("pull", ["pull_consume.py", env.namesrv, GROUP_PULL, TOPIC, "*", "--unique", str(n),
                                    "--props", props, "--timeout", "120"], timeout=150),
    }
    # The failing consumer. The C wrapper hands a pulled batch to the callback message by message and
    # stops at the first failure; the rest of the batch is sent back unseen. So that the callback sees
    # every delivery, only one message is in flight at a time: the next is sent once the previous one
    # reached the DLQ. Both topics exist beforehand, so the consumer has their routes from the start
    # (otherwise %RETRY% is first consumed after the client's 10 s rebalance).
    dlq_msgs = build_dlq_messages()
    create_topic(env, RETRY_SRC_TOPIC, QUEUES)
    create_topic(env, f"%RETRY%{GROUP_DLQ}", 1)
    dlq = env.client("push-dlq", ["push_consume.py", env.namesrv, GROUP_DLQ, RETRY_SRC_TOPIC, "*",
                                  "--unique", str(DLQ_MESSAGES),
                                  "--total", str(DLQ_MESSAGES * (1 + RETRY_MAX_TIMES)), "--props", props,
                                  "--fail", "--timeout", "120", "--settle", "3"], timeout=150)
    dlq.wait_line("started")
    t1 = time.monotonic()
    dlq_sends = []
    for i, m in enumerate(dlq_msgs):
        spec = env.tmp / f"spec-dlq{i}.json"
        spec.write_text(json.dumps({"topic": RETRY_SRC_TOPIC, "messages": [m]}, ensure_ascii=False), encoding="utf-8")
        dlq_sends.append(env.client(f"producer-dlq{i}", ["produce.py", env.namesrv, PRODUCER_GROUP, str(spec)],
                                    timeout=60).result())
        wait_for(f"{m['seq']} in %DLQ%{GROUP_DLQ} after {RETRY_MAX_TIMES} retries",
                 lambda: max_offset(env.broker.addr, f"%DLQ%{GROUP_DLQ}", 0) >= i + 1, 60,
                 detail=lambda: f"%RETRY% max offset {max_offset(env.broker.addr, f'%RETRY%{GROUP_DLQ}', 0)}")
    env.timings[f"retry/DLQ round trips ({DLQ_MESSAGES} one after another)"] = time.monotonic() - t1
    results = {k: p.result() for k, p in procs.items()}
    results["dlq"] = dlq.result()
    results["dlq_messages"] = dlq_msgs
    results["dlq_sends"] = dlq_sends
    env.timings["consume (all of it)"] = time.monotonic() - t0
    return results


@pytest.fixture(scope="module")
def idle_result(env, idle, consumed):
    """After IDLE_SECONDS of nothing: count the idle consumer's pulls, then wake it with one message."""
    since = idle["since"]
    remaining = IDLE_SECONDS - (time.monotonic() - since)
    if remaining > 0:
        time.sleep(remaining)
    idle_for = time.monotonic() - since
    pulls_idle = env.broker_proxy.count(RequestCode.PULL_MESSAGE, GROUP_IDLE, since, since + IDLE_SECONDS)
    spec = env.tmp / "spec-idle.json"
    spec.write_text(json.dumps({"topic": IDLE_TOPIC, "messages": [
        {"seq": "wake", "mode": "sync", "tags": "TagA", "keys": "wake", "props": {"seq": "wake"}, "body": "wake up"}]}))
    sent_at = time.time()
    prod = env.client("producer-idle", ["produce.py", env.namesrv, PRODUCER_GROUP, str(spec)], timeout=60).result()
    res = idle["client"].result()
    return {"pulls_idle": pulls_idle, "idle_for": idle_for, "sent_at": sent_at, "producer": prod, "consumer": res,
            "requests": dict(env.broker_proxy.requests)}


@pytest.fixture(scope="module")
def stopped(env, produced, consumed, idle_result):
    """Stop the broker cleanly and decode the store."""
    live_max = {q: max_offset(env.broker.addr, TOPIC, q) for q in range(QUEUES)}
    t0 = time.monotonic()
    code = env.broker.stop()
    env.timings["broker stop"] = time.monotonic() - t0
    t0 = time.monotonic()
    query = MessageQuery()
    rows = [dict(r, properties=dict(r["properties"] or [])) for r in iter_messages(env.store, query)]
    env.timings["decode store"] = time.monotonic() - t0
    t0 = time.monotonic()
    report = verify_store(env.store, message_delay_level=DELAY_LEVELS)
    env.timings["verify store"] = time.monotonic() - t0
    return {"exit_code": code, "rows": rows, "findings": query.findings, "report": report, "live_max": live_max}


# =====================================================================================================
# tests
# =====================================================================================================
def test_producer_every_send_succeeded(env, produced):
    res, msgs = produced["result"], produced["messages"]
    assert res["errors"] == [], _fail_lines("send errors", res["errors"])
    sent = [s for r in res["results"] for s in r["seqs"]]
    assert sent == [m["seq"] for m in msgs]
    by_mode = Counter(r["mode"] for r in res["results"])
    assert by_mode == {"sync": N_SYNC, "oneway": N_ONEWAY, "async": N_ASYNC, "batch": N_BATCHES,
                       "orderly": N_ORDERLY}
    # what the wire carried: single messages ≥ 4 KiB and batches ≥ 4 KiB zlib-compressed (sysFlag 1)
    big = sum(1 for m in msgs if m["mode"] != "batch" and len(m["body"].encode("utf-8")) >= 4096)
    sends = env.broker_proxy.sends
    assert sends[(False, True)] == big > 0
    assert sends[(False, False)] == N_SYNC + N_ONEWAY + N_ASYNC + N_ORDERLY - big
    assert any(m["mode"] == "async" and len(m["body"].encode("utf-8")) >= 4096 for m in msgs)
    assert sends[(True, True)] > 0 and sends[(True, False)] > 0
    assert sends[(True, True)] + sends[(True, False)] == N_BATCHES
    for r in res["results"]:
        if r["mode"] == "oneway":
            continue
        assert r["status"] == 0, r  # SendStatus.OK
        if r["mode"] == "batch":
            assert r["msg_id"] == "", r  # the batch wrapper has no UNIQ_KEY
        else:
            assert len(r["msg_id"]) == 32 and int(r["msg_id"], 16) >= 0, r  # the client's UNIQ_KEY
            assert isinstance(r["offset"], int) and r["offset"] >= 0, r
    ids = [r["msg_id"] for r in res["results"] if r["mode"] in REPLY_MODES]
    assert len(set(ids)) == len(ids) == N_SYNC + N_ASYNC + N_ORDERLY


def test_push_consumer_receives_every_message_exactly_as_sent(produced, consumed):
    res = consumed["all"]
    assert res["complete"], f"push consumer saw {res['unique']} of {len(produced['messages'])} messages in 120 s"
    check_deliveries("push consumer (*)", res["deliveries"], produced["by_seq"], TOPIC)
    # the message id the consumer sees is the producer's UNIQ_KEY
    ids = {r["seqs"][0]: r["msg_id"] for r in produced["result"]["results"] if r["mode"] in REPLY_MODES}
    wrong = [(d["props"]["seq"], ids[d["props"]["seq"]], d["id"]) for d in res["deliveries"]
             if d["props"]["seq"] in ids and d["id"] != ids[d["props"]["seq"]]]
    assert not wrong, _fail_lines("msg id differs (seq, sent, received)", wrong)
    assert all(d["reconsume_times"] == 0 for d in res["deliveries"])
    assert len({d["id"] for d in res["deliveries"]}) == len(res["deliveries"])


def test_tag_filtered_push_consumer_receives_exactly_the_matching_messages(produced, consumed):
    res = consumed["tags"]
    expected = {s: m for s, m in produced["by_seq"].items() if m["tags"] in WANTED_TAGS}
    assert 0 < len(expected) < len(produced["messages"])
    assert res["complete"], f"tag consumer saw {res['unique']} of {len(expected)} in 120 s"
    check_deliveries(f"push consumer ({TAG_EXPRESSION})", res["deliveries"], expected, TOPIC)


def test_broker_filters_by_tag(env, produced, consumed):
    """The C++ client filters again on its side; what the broker itself sent is in the PULL answers."""
    assert env.broker_proxy.errors == []
    with env.broker_proxy.lock:
        pulled = [r for r in env.broker_proxy.pulled[GROUP_TAGS] if r.topic == TOPIC]
    assert pulled, "the tag consumer's pulls did not go through the proxy"
    wrong = [(r.properties.get("seq"), r.tags) for r in pulled if r.tags not in WANTED_TAGS]
    assert not wrong, _fail_lines("the broker sent records the tag expression excludes (seq, tags)", wrong)
    expected = {s for s, m in produced["by_seq"].items() if m["tags"] in WANTED_TAGS}
    assert {r.properties.get("seq") for r in pulled} == expected


def test_orderly_push_consumer_gets_each_queue_in_order(produced, consumed):
    """An orderly consumer locks its queues (LOCK_BATCH_MQ) and consumes each one in offset order."""
    res = consumed["orderly"]
    assert res["complete"], f"orderly consumer saw {res['unique']} of {len(produced['messages'])} in 120 s"
    check_deliveries("orderly push consumer", res["deliveries"], produced["by_seq"], TOPIC)
    per_queue = defaultdict(list)
    for d in res["deliveries"]:
        per_queue[d["queue_id"]].append(d["queue_offset"])
    for q, offsets in sorted(per_queue.items()):
        assert offsets == list(range(len(offsets))), f"queue {q}: consumed out of order"


def test_pull_consumer_receives_every_message(produced, consumed):
    res = consumed["pull"]
    assert res["complete"], f"pull consumer saw {len(res['deliveries'])} of {len(produced['messages'])}"
    check_deliveries("pull consumer", res["deliveries"], produced["by_seq"], TOPIC)
    # per queue, offsets 0..n-1 in order
    per_queue = defaultdict(list)
    for d in res["deliveries"]:
        per_queue[d["queue_id"]].append(d["queue_offset"])
    assert sorted(per_queue) == list(range(QUEUES))
    for q, offsets in per_queue.items():
        assert offsets == list(range(len(offsets))), f"queue {q}: offsets not contiguous"


def test_failing_consumer_retries_then_dead_letters(produced, consumed):
    res = consumed["dlq"]
    by_seq = defaultdict(list)
    for d in res["deliveries"]:
        by_seq[d["props"].get("seq")].append(d)
    expected = {m["seq"]: m for m in consumed["dlq_messages"]}
    assert all(r["errors"] == [] for r in consumed["dlq_sends"])
    assert res["complete"], (f"failing consumer saw {len(res['deliveries'])} of "
                             f"{DLQ_MESSAGES * (1 + RETRY_MAX_TIMES)} deliveries: "
                             f"{ {s: [d['reconsume_times'] for d in v] for s, v in by_seq.items()} }")
    assert set(by_seq) == set(expected)
    for seq, ds in by_seq.items():
        # 1 + retryMaxTimes deliveries (none after the DLQ hand-off: the consumer waited 4 s more)
        assert [d["reconsume_times"] for d in ds] == list(range(1 + RETRY_MAX_TIMES)), (seq, ds)
        for d in ds:
            assert delivered_view(d) == expected_view(expected[seq]), seq
            assert d["topic"] == RETRY_SRC_TOPIC  # RETRY_TOPIC makes the retry look like the original
        assert len({d["id"] for d in ds}) == 1  # UNIQ_KEY survives the retries
        # each retry waited in SCHEDULE_TOPIC_XXXX for its (1 s) delay level
        gaps = [b["received_at"] - a["received_at"] for a, b in zip(ds, ds[1:])]
        assert all(g >= 0.8 for g in gaps), (seq, gaps)


def test_long_polling_keeps_an_idle_consumer_quiet(idle_result):
    r = idle_result
    print(f"\nidle consumer: {r['pulls_idle']} PULL_MESSAGE in {IDLE_SECONDS:.0f} s")
    # 4 queues + %RETRY%: each pull is held up to 15 s, so ~2 rounds in 20 s; without long polling
    # this client sends thousands per second
    assert r["idle_for"] >= IDLE_SECONDS
    assert r["pulls_idle"] <= 3 * (QUEUES + 1), (
        f"{r['pulls_idle']} PULL_MESSAGE requests in {IDLE_SECONDS:.0f} idle seconds; all requests of the "
        f"idle consumer over {r['idle_for']:.0f} s by (code, group): {r['requests']}")
    res = r["consumer"]
    assert r["producer"]["errors"] == []
    assert res["complete"] and [d["props"]["seq"] for d in res["deliveries"]] == ["wake"]
    latency = res["deliveries"][0]["received_at"] - r["sent_at"]
    # a parked pull is answered when the message arrives, not at its 15 s timeout
    assert latency < 5.0, f"the idle consumer got the message {latency:.1f} s after it was sent"


def _records(stopped, topic):
    return [r for r in stopped["rows"] if r["topic"] == topic]


def test_clean_stop_leaves_a_verified_store(env, stopped):
    assert stopped["exit_code"] == 0
    assert not (env.store / "abort").exists()
    report = stopped["report"]
    assert report.ok, report.summary() + "\n" + "\n".join(map(str, report.findings[:20]))
    assert stopped["findings"] == []
    assert report.segments >= 2  # 1 MiB commitlog files: the log rolled over


def test_store_holds_exactly_the_sent_messages(env, produced, stopped):
    rows = _records(stopped, TOPIC)
    by_seq = produced["by_seq"]
    counts = Counter(r["properties"].get("seq") for r in rows)
    assert counts == Counter({s: 1 for s in by_seq}), (
        _fail_lines("missing", sorted(set(by_seq) - set(counts))) + "\n"
        + _fail_lines("extra/duplicated", sorted((s, c) for s, c in counts.items() if c != 1 or s not in by_seq)))
    results = {s: r for r in produced["result"]["results"] for s in r["seqs"]}
    problems = []
    uniq_keys = set()
    for row in rows:
        props = dict(row["properties"])
        m = by_seq[props["seq"]]
        want_props = set(m["props"]) | {"UNIQ_KEY", "CLUSTER"} | ({"KEYS"} if m["keys"] else set()) \
            | ({"TAGS"} if m["tags"] else set())
        body = m["body"].encode("utf-8")
        checks = {
            "body": row["body"] == body,
            "tags": row["tags"] == m["tags"],
            "keys": row["keys"] == (m["keys"].split(" ") if m["keys"] else []),
            "user props": {k: props.get(k) for k in m["props"]} == m["props"],
            "property names": set(props) - {"WAIT"} == want_props,
            "cluster": props.get("CLUSTER") == "DefaultCluster",
            "store host": row["store_host"] == env.broker.addr,
            "born host": row["born_host"].startswith("127.0.0.1:"),
            "crc": row["body_crc_ok"],
            "reconsume": row["reconsume_times"] == 0,
            "uniq key": len(row["uniq_key"] or "") == 32,
        }
        if m["mode"] == "batch":
            # the client compresses a batch as a whole; stored items are plain
            checks["compression"] = row["compression"] == "NONE" and not row["sys_flag"] & 1
        else:
            want = "ZLIB" if len(body) >= 4096 else "NONE"
            checks["compression"] = row["compression"] == want and bool(row["sys_flag"] & 1) == (want == "ZLIB")
        r = results[m["seq"]]
        if m["mode"] in REPLY_MODES:
            checks["send result"] = row["uniq_key"] == r["msg_id"] and row["queue_offset"] == r["offset"]
        if m["mode"] == "orderly":
            checks["orderly queue"] = row["queue_id"] == m["arg"] % QUEUES
        uniq_keys.add(row["uniq_key"])
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            problems.append((m["seq"], m["mode"], bad))
    assert not problems, _fail_lines("records that differ from what was sent (seq, mode, checks)", problems)
    assert len(uniq_keys) == len(rows)
    big = sum(1 for m in by_seq.values() if m["mode"] != "batch" and len(m["body"].encode("utf-8")) >= 4096)
    assert sum(1 for r in rows if r["compression"] == "ZLIB") == big > 0
    # queue offsets per queue: 0..n-1, matching the broker's max offsets
    per_queue = defaultdict(list)
    for row in rows:
        per_queue[row["queue_id"]].append(row["queue_offset"])
    assert {q: sorted(o) for q, o in per_queue.items()} == {q: list(range(n)) for q, n in stopped["live_max"].items()}
    # a batch lands in one queue with consecutive offsets from the reported one, in send order
    row_of = {r["properties"]["seq"]: r for r in rows}
    for r in produced["result"]["results"]:
        if r["mode"] == "batch":
            got = [(row_of[s]["queue_id"], row_of[s]["queue_offset"]) for s in r["seqs"]]
            q = got[0][0]
            assert got == [(q, r["offset"] + k) for k in range(len(r["seqs"]))], (r["seqs"][0], got)
    # orderly messages keep their send order within their queue
    for arg in range(7):
        offs = [row_of[m["seq"]]["queue_offset"] for m in produced["messages"]
                if m["mode"] == "orderly" and m["arg"] == arg]
        assert offs == sorted(offs), f"orderly arg {arg}: queue offsets not in send order"
    topics = TopicConfigTable.load(config_path(env.store, TOPICS_FILE))
    assert topics.get(TOPIC).write_queue_nums == QUEUES


def test_dead_letter_records_in_store(env, consumed, stopped):
    originals = {r["properties"]["seq"]: r for r in _records(stopped, RETRY_SRC_TOPIC)}
    assert sorted(originals) == sorted(m["seq"] for m in consumed["dlq_messages"])
    dlq = _records(stopped, f"%DLQ%{GROUP_DLQ}")
    retries = _records(stopped, f"%RETRY%{GROUP_DLQ}")
    scheduled = [r for r in stopped["rows"] if r["topic"] == "SCHEDULE_TOPIC_XXXX"
                 and r["real_topic"] == f"%RETRY%{GROUP_DLQ}"]
    assert Counter(r["properties"]["seq"] for r in dlq) == Counter({s: 1 for s in originals}), dlq
    assert sorted((r["properties"]["seq"], r["reconsume_times"]) for r in retries) == \
        sorted((s, n) for s in originals for n in range(1, RETRY_MAX_TIMES + 1))
    assert len(scheduled) == DLQ_MESSAGES * RETRY_MAX_TIMES
    for r in dlq:
        props = dict(r["properties"])
        orig = originals[props["seq"]]
        assert props["RETRY_TOPIC"] == RETRY_SRC_TOPIC
        assert props["ORIGIN_MESSAGE_ID"] == orig["offset_msg_id"]
        assert r["reconsume_times"] == RETRY_MAX_TIMES + 1
        assert r["uniq_key"] == orig["uniq_key"] and r["body"] == orig["body"]
        assert r["queue_id"] == 0 and r["store_host"] == env.broker.addr
        assert r["sys_flag"] == orig["sys_flag"]


def test_committed_offsets_reach_consumer_offset_json(env, produced, stopped):
    table = ConsumerOffsetTable.load(config_path(env.store, CONSUMER_OFFSET_FILE))
    # the group that consumed everything committed every queue up to its max offset
    assert table.offsets_for(GROUP_ALL, TOPIC) == stopped["live_max"]
    assert table.offsets_for(GROUP_ORDERLY, TOPIC) == stopped["live_max"]
    assert sum(stopped["live_max"].values()) == len(produced["messages"])
    # the tag-filtered group can only have committed up to the same ends
    tags = table.offsets_for(GROUP_TAGS, TOPIC)
    assert tags and all(0 < tags[q] <= stopped["live_max"][q] for q in tags), tags
    # the failing group consumed (and sent back) every original message
    dlq_max = {q: n for q, n in Counter(r["queue_id"] for r in _records(stopped, RETRY_SRC_TOPIC)).items()}
    committed = table.offsets_for(GROUP_DLQ, RETRY_SRC_TOPIC)
    assert {q: committed.get(q) for q in dlq_max} == dlq_max
