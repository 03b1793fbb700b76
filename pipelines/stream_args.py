"""The streaming job's command-line options (``jobs/stream_commitlog.py``, ``ingest --follow``).

Apart from :mod:`pipelines.stream` so that a job builds its parser without importing the ingest
(its decoder's compiled kernels, pyarrow, deltalake): the job imports those while its Spark
session starts (:func:`pipelines.job_args.job_session`).
"""

from __future__ import annotations

import argparse
import re

DEFAULT_TRIGGER_INTERVAL = "2s"  # best p95 freshness per commit in benchmarks/freshness.py (README)


_INTERVAL = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000}


def parse_interval(text: str) -> str:
    """``5s``, ``500ms``, ``1m`` or ``5 seconds`` as Spark's processing-time interval text
    (``"5000 milliseconds"``); a ValueError for anything else (argparse makes it a one-line error)."""
    found = _INTERVAL.fullmatch(text.strip().lower())
    if not found:
        raise ValueError(f"{text!r} is not an interval like 5s, 500ms or 1m")
    unit = found.group(2)
    ms = float(found.group(1)) * _UNIT_MS["ms" if unit.startswith("ms") or unit.startswith("milli") else unit[0]]
    if ms < 1:
        raise ValueError(f"{text!r}: the interval must be at least 1 ms")
    return f"{int(ms)} milliseconds"


def add_stream_args(ap: argparse.ArgumentParser, *, follow: bool = False) -> None:
    """The streaming options, one definition for ``jobs/stream_commitlog.py`` and ``ingest --follow``
    (there ``--checkpoint`` is required only with ``--follow``, checked by :func:`check_stream_args`)."""
    if follow:
        ap.add_argument("--follow", action="store_true",
                        help="keep ingesting as the stores grow (the streaming job, jobs/stream_commitlog.py); "
                             "needs --checkpoint")
    ap.add_argument("--checkpoint", required=not follow, default=None, metavar="DIR",
                    help="the streaming query's checkpoint directory (Spark's bookkeeping; where each batch "
                         "starts comes from the lake's marks)")
    ap.add_argument("--trigger-interval", type=_interval_arg, default=parse_interval(DEFAULT_TRIGGER_INTERVAL),
                    metavar="INTERVAL",
                    help=f"how often a micro-batch starts, e.g. 5s, 500ms (default {DEFAULT_TRIGGER_INTERVAL})")
    ap.add_argument("--max-batches", type=_positive_int, default=None, metavar="N",
                    help="stop after N micro-batches")
    ap.add_argument("--until-idle", type=_positive_float, default=None, metavar="SECONDS",
                    help="stop once no new data came for SECONDS")


def _interval_arg(text: str) -> str:
    try:
        return parse_interval(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(convert: type, what: str):
    """An argparse type: ``convert(text)`` when it is > 0, else a one-line error naming ``what``."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {what}")
        return value
    return parse


_positive_int = _positive(int, "integer")
_positive_float = _positive(float, "number")
