"""A daemon thread that runs one job at a fixed interval: the store's flush and checkpoint ticks and
the metadata's persist tick each own one, so stopping one owner never stops another's work."""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class Periodic:
    """A daemon thread running ``fn`` every ``interval_ms`` until stopped (errors are logged, and
    the next tick runs anyway: one failed write must not end the periodic persisting)."""

    def __init__(self, name: str, interval_ms: int, fn: Callable[[], object]) -> None:
        self._fn = fn
        self._interval = interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._fn()
            except Exception:
                log.exception("%s failed", self._thread.name)

    def stop(self) -> None:
        """Stop and wait for a running tick to finish (after this, ``fn`` is not called again)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
