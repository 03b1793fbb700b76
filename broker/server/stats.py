"""Broker statistics, kept as Apache RocketMQ 4.9 keeps them, for ``mqadmin`` and the Dashboard.

Three Apache classes in one place, because they share one clock and one lock:

* ``BrokerStatsManager`` / ``StatsItemSet`` / ``StatsItem``: named counters (``TOPIC_PUT_NUMS`` per
  topic, ``GROUP_GET_NUMS`` per ``topic@group`` …), each a running ``value`` and ``times``. A
  sampler snapshots every item every 10 s into its minute window (7 snapshots = 1 min), every 10
  min into its hour window (7 = 1 h) and every hour into its day window (25 = 24 h); a window's
  sum/tps/avgpt is last minus first of its snapshots. The first snapshot of a window is preceded
  by a made-up zero one interval earlier, so a new item shows its whole value at once. That is
  what VIEW_BROKER_STATS_DATA (``mqadmin statsAll``) and GET_BROKER_CONSUME_STATS' consumeTps read.
* ``StoreStatsService``: store-wide totals (messages put and their bytes, gets that found or missed,
  messages transferred) sampled every second, 601 samples deep: ``putTps`` etc. are the rates over
  the last 10, 60 and 600 samples, one text of three numbers (empty parts until that many samples
  exist), as ``mqadmin clusterList`` parses them.
* ``BrokerStats``: the put/get totals recorded at each local midnight (``msgPutTotalTodayMorning``
  and the day before), from which clusterList -m prints yesterday's and today's traffic.

Counting is on the request path, so it is a few integer additions under one lock per send batch or
pull; everything else (sampling, windows) happens on the sampler's schedule or when asked.
``clock`` returns epoch milliseconds; tests inject a fake one and call :meth:`tick` themselves.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from broker.remoting.java_text import java_double
from broker.store.clock import now_ms as epoch_ms

log = logging.getLogger(__name__)

# BrokerStatsManager's stats names (what VIEW_BROKER_STATS_DATA's statsName takes)
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"  # key: topic; value: messages, times: send requests
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"  # key: topic; value: bytes written
GROUP_GET_NUMS = "GROUP_GET_NUMS"  # key: topic@group; value: messages pulled, times: pulls that found some
GROUP_GET_SIZE = "GROUP_GET_SIZE"  # key: topic@group; value: bytes pulled
GROUP_GET_LATENCY = "GROUP_GET_LATENCY"  # key: queueId@topic@group; value: ms reading the store
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"  # key: topic@group; value: messages sent back
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"  # key: cluster name; value: messages (times stay 0, as in Apache)
BROKER_GET_NUMS = "BROKER_GET_NUMS"  # key: cluster name; value: messages pulled
STATS_NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, GROUP_GET_LATENCY, SNDBCK_PUT_NUMS,
               BROKER_PUT_NUMS, BROKER_GET_NUMS)

# StatsItem's sampling: (period ms, snapshots kept) per window
MINUTE_WINDOW = (10_000, 7)
HOUR_WINDOW = (600_000, 7)
DAY_WINDOW = (3_600_000, 25)
# StoreStatsService: one sample a second, 600 intervals kept; rates over these many samples
STORE_SAMPLE_MS = 1_000
STORE_SAMPLES_KEPT = 600 + 1
STORE_TPS_SPANS = (10, 60, 600)

TICK_S = 0.5  # how often the shared sampler thread looks whether a sampling is due


def stats_key(topic: str, group: str) -> str:
    """``topic@group``: the key of the per-group items (``buildStatsKey``)."""
    return f"{topic}@{group}"


def latency_key(queue_id: int, topic: str, group: str) -> str:
    return f"{queue_id}@{topic}@{group}"


def next_morning_ms(now_ms: int) -> int:
    """Local midnight after ``now_ms`` (``UtilAll.computeNextMorningTimeMillis``)."""
    local = datetime.fromtimestamp(now_ms / 1000)
    midnight = datetime.combine(local.date() + timedelta(days=1), datetime.min.time())
    return int(midnight.timestamp() * 1000)


@dataclass(frozen=True)
class StatsSnapshot:
    """One window of one item: what ``BrokerStatsItem`` carries."""

    sum: int = 0
    tps: float = 0.0
    avgpt: float = 0.0


Sample = tuple[int, int, int]  # (timestamp ms, times, value)


def _window_stats(window: deque[Sample]) -> StatsSnapshot:
    if not window:
        return StatsSnapshot()
    first_ts, first_times, first_value = window[0]
    last_ts, last_times, last_value = window[-1]
    total = last_value - first_value
    span = last_ts - first_ts
    tps = (total * 1000.0) / span if span else (math.nan if total == 0 else math.copysign(math.inf, total))
    times = last_times - first_times
    return StatsSnapshot(total, tps, total / times if times > 0 else 0.0)


class StatsItem:
    """One counter (``value`` and ``times``) and its three windows of snapshots."""

    __slots__ = ("value", "times", "minute", "hour", "day")

    def __init__(self) -> None:
        self.value = 0
        self.times = 0
        self.minute: deque[Sample] = deque(maxlen=MINUTE_WINDOW[1])
        self.hour: deque[Sample] = deque(maxlen=HOUR_WINDOW[1])
        self.day: deque[Sample] = deque(maxlen=DAY_WINDOW[1])

    def sample(self, window: deque[Sample], now_ms: int, period_ms: int) -> None:
        if not window:
            window.append((now_ms - period_ms, 0, 0))
        window.append((now_ms, self.times, self.value))


class _Sampler:
    """One daemon thread ticking every live manager (managers are dropped when collected)."""

    def __init__(self) -> None:
        self._managers: weakref.WeakSet[BrokerStatsManager] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, manager: BrokerStatsManager) -> None:
        with self._lock:
            self._managers.add(manager)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="broker-stats", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(TICK_S)
            with self._lock:
                managers = list(self._managers)
            for manager in managers:
                try:
                    manager.tick()
                except Exception:  # a sampling bug must not stop the statistics of every broker
                    log.exception("broker stats sampling failed")
            del managers


_SAMPLER = _Sampler()


class BrokerStatsManager:
    """Counters, their windows, the store totals and the midnight records of one broker."""

    def __init__(self, cluster_name: str, clock: Callable[[], int] | None = None, *,
                 sample: bool | None = None) -> None:
        """``sample`` (default: when ``clock`` is the real one) has the shared thread call :meth:`tick`."""
        self.cluster_name = cluster_name
        self.clock = clock or epoch_ms
        self._lock = threading.Lock()
        self._sets: dict[str, dict[str, StatsItem]] = {name: {} for name in STATS_NAMES}
        # StoreStatsService totals
        self.put_times_total = 0
        self.put_size_total = 0
        self.get_found_times = 0
        self.get_miss_times = 0
        self.get_transferred_msgs = 0
        self.get_time_max_ms = 0
        self._store_samples: dict[str, deque[tuple[int, int]]] = {
            name: deque(maxlen=STORE_SAMPLES_KEPT) for name in ("put", "found", "miss", "transferred")}
        # BrokerStats' midnight records
        self.put_total_yesterday_morning = 0
        self.put_total_today_morning = 0
        self.get_total_yesterday_morning = 0
        self.get_total_today_morning = 0
        now = self.clock()
        self.boot_ms = now
        # requests waiting to be handled, {"send": n, "other": n}; the store process sets it
        self.queue_sizes: Callable[[], dict[str, int]] | None = None
        self._due = {"minute": now, "hour": now, "day": now, "store": now + STORE_SAMPLE_MS,
                     "morning": next_morning_ms(now)}
        if sample if sample is not None else clock is None:
            _SAMPLER.add(self)

    # ---- counting (request path) -------------------------------------------------------------------
    def _add(self, name: str, key: str, value: int, times: int) -> None:
        """Caller holds the lock."""
        items = self._sets[name]
        item = items.get(key)
        if item is None:
            item = items[key] = StatsItem()
        item.value += value
        item.times += times

    def on_puts(self, puts: Iterable[tuple[str, int, int]]) -> None:
        """Stored sends, ``(topic, messages, bytes written)`` each: one send request per tuple.
        Summed per topic first, then counted once per topic: the store process calls this once per
        stored group of sends, which are mostly to one or a few topics."""
        per_topic: dict[str, list[int]] = {}  # topic -> [requests, messages, bytes]
        for topic, nums, size in puts:
            acc = per_topic.get(topic)
            if acc is None:
                per_topic[topic] = [1, nums, size]
            else:
                acc[0] += 1
                acc[1] += nums
                acc[2] += size
        if not per_topic:
            return
        with self._lock:
            for topic, (requests, nums, size) in per_topic.items():
                self._add(TOPIC_PUT_NUMS, topic, nums, requests)
                self._add(TOPIC_PUT_SIZE, topic, size, requests)
                self._add(BROKER_PUT_NUMS, self.cluster_name, nums, 0)
                self.put_times_total += nums
                self.put_size_total += size

    def on_send_back(self, group: str, topic: str, size: int) -> None:
        """A consumer's send-back stored in the retry (or dead-letter) topic."""
        with self._lock:
            self._add(SNDBCK_PUT_NUMS, stats_key(topic, group), 1, 1)
            self.put_times_total += 1
            self.put_size_total += size

    def on_get(self, group: str, topic: str, queue_id: int, found: int, size: int, latency_ms: int) -> None:
        """One store read of a pull: ``found`` messages (0: a miss) of ``size`` bytes."""
        with self._lock:
            if found:
                key = stats_key(topic, group)
                self._add(GROUP_GET_NUMS, key, found, 1)
                self._add(GROUP_GET_SIZE, key, size, 1)
                self._add(GROUP_GET_LATENCY, latency_key(queue_id, topic, group), latency_ms, 1)
                self._add(BROKER_GET_NUMS, self.cluster_name, found, 0)
                self.get_found_times += 1
                self.get_transferred_msgs += found
            else:
                self.get_miss_times += 1
            if latency_ms > self.get_time_max_ms:
                self.get_time_max_ms = latency_ms

    # ---- sampling ----------------------------------------------------------------------------------
    def tick(self) -> None:
        """Take every sampling that is due at ``clock()`` (the sampler thread calls this twice a second)."""
        now = self.clock()
        with self._lock:
            due = self._due
            if now >= due["store"]:
                for name, total in (("put", self.put_times_total), ("found", self.get_found_times),
                                    ("miss", self.get_miss_times), ("transferred", self.get_transferred_msgs)):
                    self._store_samples[name].append((now, total))
                due["store"] = _next_due(due["store"], STORE_SAMPLE_MS, now)
            for window, (period, _) in (("minute", MINUTE_WINDOW), ("hour", HOUR_WINDOW), ("day", DAY_WINDOW)):
                if now >= due[window]:
                    for items in self._sets.values():
                        for item in items.values():
                            item.sample(getattr(item, window), now, period)
                    due[window] = _next_due(due[window], period, now)
            if now >= due["morning"]:
                self.put_total_yesterday_morning = self.put_total_today_morning
                self.get_total_yesterday_morning = self.get_total_today_morning
                self.put_total_today_morning = self.put_times_total
                self.get_total_today_morning = self.get_transferred_msgs
                log.info("yesterday put message total: %d, get message total: %d",
                         self.put_total_today_morning - self.put_total_yesterday_morning,
                         self.get_total_today_morning - self.get_total_yesterday_morning)
                due["morning"] = next_morning_ms(now)

    # ---- reading -----------------------------------------------------------------------------------
    def item_stats(self, name: str, key: str) -> tuple[StatsSnapshot, StatsSnapshot, StatsSnapshot] | None:
        """(minute, hour, day) of one item; None when no such item was ever counted."""
        with self._lock:
            item = self._sets.get(name, {}).get(key)
            if item is None:
                return None
            return _window_stats(item.minute), _window_stats(item.hour), _window_stats(item.day)

    def minute_tps(self, name: str, key: str) -> float:
        """``StatsItemSet.getStatsDataInMinute(key).getTps()``: 0.0 for an unknown item."""
        stats = self.item_stats(name, key)
        return 0.0 if stats is None else stats[0].tps

    def keys(self, name: str) -> list[str]:
        with self._lock:
            return sorted(self._sets.get(name, {}))

    def _rate(self, name: str, span: int) -> float | None:
        samples = self._store_samples[name]
        if len(samples) <= span:
            return None
        (t0, v0), (t1, v1) = samples[-(span + 1)], samples[-1]
        return (v1 - v0) / (t1 - t0) * 1000

    def _rates_text(self, *names: str) -> str:
        """``"r10 r60 r600"``; a part is empty until enough samples exist. Several names: their sum,
        with 0.0 standing in for a missing part (``getGetTotalTps``)."""
        parts = []
        for span in STORE_TPS_SPANS:
            rates = [self._rate(name, span) for name in names]
            if len(names) == 1:
                parts.append("" if rates[0] is None else java_double(rates[0]))
            else:
                parts.append(java_double(sum(r or 0.0 for r in rates)))
        return " ".join(parts)

    def store_runtime_info(self) -> dict[str, str]:
        """``StoreStatsService.getRuntimeInfo`` for what this broker measures, plus ``BrokerStats``."""
        now = self.clock()
        with self._lock:
            put_total = self.put_times_total or 1  # Apache divides by, and reports, at least 1
            info = {
                "bootTimestamp": str(self.boot_ms),
                "runtime": format_runtime(now - self.boot_ms),
                "putMessageTimesTotal": str(put_total),
                "putMessageSizeTotal": str(self.put_size_total),
                "putMessageAverageSize": java_double(self.put_size_total / put_total),
                "getMessageEntireTimeMax": str(self.get_time_max_ms),
                "putTps": self._rates_text("put"),
                "getFoundTps": self._rates_text("found"),
                "getMissTps": self._rates_text("miss"),
                "getTotalTps": self._rates_text("found", "miss"),
                "getTransferedTps": self._rates_text("transferred"),  # sic: Apache's spelling
                "msgPutTotalYesterdayMorning": str(self.put_total_yesterday_morning),
                "msgPutTotalTodayMorning": str(self.put_total_today_morning),
                "msgPutTotalTodayNow": str(self.put_times_total),
                "msgGetTotalYesterdayMorning": str(self.get_total_yesterday_morning),
                "msgGetTotalTodayMorning": str(self.get_total_today_morning),
                "msgGetTotalTodayNow": str(self.get_transferred_msgs),
            }
        return info


def _next_due(due: int, period: int, now: int) -> int:
    """Fixed-rate schedule; after a stall skip the missed runs rather than sample twice at one instant."""
    due += period
    return due if due > now else now + period


def format_runtime(elapsed_ms: int) -> str:
    """``[ 0 days, 1 hours, 2 minutes, 3 seconds ]`` (StoreStatsService's MessageFormat)."""
    seconds, _ = divmod(max(elapsed_ms, 0), 1000)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    return f"[ {days:,} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"
