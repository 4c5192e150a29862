"""Async Python client for the MessageX broker's WebSocket protocol.

import asyncio
from messagex_client import Client

async def main() -> None:
    async with Client("http://127.0.0.1:8000", username="guest", password="guest") as mx:
        result = await mx.publish("amq.topic", {"id": 42}, routing_key="order.created")
        print(result.queues)
        async with mx.subscribe("invoices", prefetch=10) as messages:
            async for message in messages:
                print(message.body)
                await message.ack()

asyncio.run(main())
"""

from messagex_client.client import Client, Message, PublishResult, Subscription, websocket_url
from messagex_client.errors import (
    AuthenticationError,
    BrokerError,
    ClientClosed,
    ConnectionLost,
    Forbidden,
    MessageXError,
    NotFound,
    RateLimited,
    StaleDelivery,
    SubscriptionCancelled,
    UnknownDeliveryTag,
    Unroutable,
)
from messagex_client.message_ops import DeleteResult, MoveResult, message_filter
from messagex_client.topology import ALTERNATE_EXCHANGE, Binding, Topology
from messagex_client.transactional import (
    PublishOptions,
    ack_in_transaction,
    ack_in_transaction_sync,
    publish_in_transaction,
    publish_in_transaction_sync,
    publish_to_queue_in_transaction,
    publish_to_queue_in_transaction_sync,
)

__all__ = [
    "ALTERNATE_EXCHANGE",
    "AuthenticationError",
    "Binding",
    "BrokerError",
    "Client",
    "ClientClosed",
    "ConnectionLost",
    "DeleteResult",
    "Forbidden",
    "Message",
    "MessageXError",
    "MoveResult",
    "NotFound",
    "PublishOptions",
    "PublishResult",
    "RateLimited",
    "StaleDelivery",
    "Subscription",
    "SubscriptionCancelled",
    "Topology",
    "UnknownDeliveryTag",
    "Unroutable",
    "ack_in_transaction",
    "ack_in_transaction_sync",
    "message_filter",
    "publish_in_transaction",
    "publish_in_transaction_sync",
    "publish_to_queue_in_transaction",
    "publish_to_queue_in_transaction_sync",
    "websocket_url",
]
__version__ = "0.1.0"
