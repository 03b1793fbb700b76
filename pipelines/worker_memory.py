"""What a Python worker keeps between tasks to make the next one cheap, and one call that gives it back.

Why: the commitlog reads pool their maps per worker (:mod:`pipelines.commitlog_ranges`, about 200 MiB
once a worker has read a few splits), because a page the kernel hands out afresh is dear on this
project's machines. Those maps serve the next split; the consume-queue and index tasks that end an
ingest do not use them, yet held while those run they set each worker's peak, and that peak grew
with the store (its queues and index files are larger): 480 MiB per worker at 4 GiB, up to 594 MiB
at 16 GiB. :class:`pipelines.partition_writer.PartitionJob` calls :func:`give_back` before a
worker's small tasks; the worker's peak is then its split tasks' own, the same at any size.

A module that keeps such memory registers its release with :func:`keeps`.
"""

from __future__ import annotations

import logging
from typing import Callable

import pyarrow as pa

log = logging.getLogger(__name__)

_RELEASES: list[Callable[[], int]] = []


def keeps(release: Callable[[], int]) -> Callable[[], int]:
    """Register ``release`` (frees what its module keeps for later tasks, returns the bytes freed);
    returns it unchanged, so it can decorate."""
    _RELEASES.append(release)
    return release


def give_back() -> int:
    """Free what the registered modules keep, then Arrow's unused allocator pages; the bytes freed."""
    freed = sum(release() for release in _RELEASES)
    pa.default_memory_pool().release_unused()
    if freed:
        log.info("worker gave back %d MiB kept for the next split", freed >> 20)
    return freed
