"""An example consumer service built on messagex_client (clients/python).

It consumes one queue with a prefetch, handles each message, ACKs it when the work is done
and NACKs it when the work fails (without requeue, so a queue with a dead-letter queue
keeps the failures for inspection; with requeue for errors worth retrying). It reconnects
and resubscribes by itself when the connection drops, and stops cleanly on SIGINT/SIGTERM:
it finishes the message in hand, unsubscribes (unread deliveries go back to the queue at
once) and closes.

    pip install ./clients/python          # or: uv pip install ./clients/python
    MESSAGEX_URL=http://127.0.0.1:8000 MESSAGEX_USER=guest MESSAGEX_PASSWORD=guest \\
        python examples/consumer.py invoices --prefetch 10

Settings come from the environment: MESSAGEX_URL (default http://127.0.0.1:8000), and
MESSAGEX_TOKEN or MESSAGEX_USER + MESSAGEX_PASSWORD.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

from messagex_client import Client, Message, MessageXError, StaleDelivery, SubscriptionCancelled

log = logging.getLogger("consumer")


class RetryLater(Exception):
    """The work failed for a reason worth retrying (a dependency is down, say)."""


async def handle(message: Message) -> None:
    """The service's work. Replace with yours; raise RetryLater or any other exception."""
    body: Any = message.body
    if isinstance(body, dict) and body.get("fail"):
        raise ValueError("this message asks to fail")
    log.info(
        "handled %s from %s (routing key %r, delivery %d): %r",
        message.message_id,
        message.queue,
        message.routing_key,
        message.delivery_count,
        body,
    )


async def settle(message: Message) -> None:
    try:
        await handle(message)
    except RetryLater:
        outcome = await message.nack(requeue=True)
        log.warning("will retry %s (%s)", message.message_id, outcome)
    except Exception:
        outcome = await message.nack(requeue=False)
        log.exception("failed %s (%s)", message.message_id, outcome)
    else:
        await message.ack()


async def consume(client: Client, queue: str, prefetch: int, stop: asyncio.Event) -> None:
    async with client.subscribe(queue, prefetch=prefetch) as messages:
        log.info("consuming %s (prefetch %d)", queue, prefetch)
        while not stop.is_set():
            next_message = asyncio.ensure_future(anext(messages))
            stopping = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({next_message, stopping}, return_when="FIRST_COMPLETED")
            stopping.cancel()
            if next_message not in done:
                next_message.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await next_message
                break
            try:
                message = next_message.result()
            except StopAsyncIteration:
                break
            try:
                await settle(message)
            except StaleDelivery:
                log.warning("connection lost mid-work: %s will be redelivered", message.message_id)


def client_from_env() -> Client:
    url = os.environ.get("MESSAGEX_URL", "http://127.0.0.1:8000")
    token = os.environ.get("MESSAGEX_TOKEN")
    if token:
        return Client(url, token=token)
    return Client(
        url,
        username=os.environ.get("MESSAGEX_USER", "guest"),
        password=os.environ.get("MESSAGEX_PASSWORD", "guest"),
    )


async def main(queue: str, prefetch: int) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with client_from_env() as client:
            await consume(client, queue, prefetch, stop)
    except SubscriptionCancelled as exc:
        log.error("the broker ended the subscription: %s", exc.reason)
        return 1
    except MessageXError as exc:
        log.error("%s", exc)
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("queue")
    parser.add_argument("--prefetch", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raise SystemExit(asyncio.run(main(args.queue, args.prefetch)))
