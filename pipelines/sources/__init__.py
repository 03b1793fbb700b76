"""Spark Python Data Sources (PySpark 4 ``pyspark.sql.datasource``) over RocketMQ broker stores.

The names below are loaded on first use (PEP 562), so that importing a light submodule
(``pipelines.sources.options``, e.g. for a job's argument parser) does not load the readers and
their decoder's compiled kernels."""

from __future__ import annotations

import importlib

__all__ = [
    "RocketMQConsumeQueueDataSource",
    "RocketMQDataSource",
    "RocketMQIndexDataSource",
    "register_sources",
]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("pipelines.sources.rocketmq"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
