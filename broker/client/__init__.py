"""rocketlake's RocketMQ clients (standard remoting protocol only: they also work with Apache clusters)."""

from broker.client.admin import Admin
from broker.client.consumer import PullConsumer, PullResult, PullStatus, PushConsumer
from broker.client.instance import MQClientError
from broker.client.producer import Message, Producer, SendResult, SendStatus
from broker.client.transaction_producer import (
    LocalTransactionState,
    TransactionCheck,
    TransactionProducer,
    TransactionSendResult,
)
from broker.remoting.tls import ClientTlsConfig

__all__ = ["Admin", "ClientTlsConfig", "LocalTransactionState", "Message", "MQClientError", "Producer", "PullConsumer",
           "PullResult", "PullStatus", "PushConsumer", "SendResult", "SendStatus", "TransactionCheck",
           "TransactionProducer", "TransactionSendResult"]
