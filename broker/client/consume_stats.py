"""A consumer's recent pull and consume rates, as Java's ``ConsumerStatsManager`` reports them in
ConsumerRunningInfo's ``statusTable``: averages and rates over the last minute, failures over the
last hour."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from broker.remoting.bodies import ConsumeStatus

MINUTE_S = 60.0
HOUR_S = 3600.0


class ConsumeStatsRecorder:
    """Thread-safe per-topic samples; the pull threads record, the request handler reads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # topic -> deque of (time, kind, count, rt_ms); kind in {"pull", "ok", "failed"}
        self._samples: dict[str, deque[tuple[float, str, int, float]]] = {}

    def _add(self, topic: str, kind: str, count: int, rt_ms: float) -> None:
        now = self._clock()
        with self._lock:
            samples = self._samples.setdefault(topic, deque())
            samples.append((now, kind, count, rt_ms))
            while samples and samples[0][0] < now - HOUR_S:
                samples.popleft()

    def pulled(self, topic: str, count: int, rt_ms: float) -> None:
        self._add(topic, "pull", count, rt_ms)

    def consumed(self, topic: str, ok: bool, rt_ms: float) -> None:
        self._add(topic, "ok" if ok else "failed", 1, rt_ms)

    def status(self, topic: str) -> ConsumeStatus:
        now = self._clock()
        with self._lock:
            samples = list(self._samples.get(topic, ()))
        minute = [s for s in samples if s[0] >= now - MINUTE_S]
        pulls = [s for s in minute if s[1] == "pull"]
        consumes = [s for s in minute if s[1] in ("ok", "failed")]

        def mean(values: list[float]) -> float:
            return sum(values) / len(values) if values else 0.0

        return ConsumeStatus(
            pull_rt=mean([s[3] for s in pulls]),
            pull_tps=sum(s[2] for s in pulls) / MINUTE_S,
            consume_rt=mean([s[3] for s in consumes]),
            consume_ok_tps=sum(1 for s in minute if s[1] == "ok") / MINUTE_S,
            consume_failed_tps=sum(1 for s in minute if s[1] == "failed") / MINUTE_S,
            consume_failed_msgs=sum(1 for s in samples if s[1] == "failed"))
