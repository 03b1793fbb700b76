"""Spark Python Data Sources (PySpark 4 ``pyspark.sql.datasource``) over RocketMQ broker stores."""

from pipelines.sources.rocketmq import (
    RocketMQConsumeQueueDataSource,
    RocketMQDataSource,
    RocketMQIndexDataSource,
    register_sources,
)

__all__ = [
    "RocketMQConsumeQueueDataSource",
    "RocketMQDataSource",
    "RocketMQIndexDataSource",
    "register_sources",
]
