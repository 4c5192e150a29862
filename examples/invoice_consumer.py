"""An exactly-once consumer (contract §18): it writes its result and acks in one transaction.

It receives ``order.created`` messages (examples/orders_service.py publishes them) over the
WebSocket with the MessageX client, and for each one, in ONE transaction of the broker's
database: inserts the invoice row and calls ``messagex.ack`` with the delivery's tag. Either
both commit or neither does, so each order's invoice exists exactly once — even when this
process is killed between the two, or the broker's ack timeout hands the message to another
consumer meanwhile (then ``messagex.ack`` returns false and the invoice is rolled back: the
other consumer's delivery is the one that counts).

Rules for such a consumer:

- ack through SQL only: never also ``message.ack()`` over the WebSocket (the SQL ack has
  settled it; the socket's would fail with ``unknown_delivery_tag``);
- when ``messagex.ack`` returns false, roll back: the delivery is no longer yours;
- a failure of the work itself rolls back too, and may ``nack`` over the WebSocket (here:
  dead-letter it, when the queue has a dead-letter queue).

    make run                                          # the broker, in another terminal
    export DATABASE_URL="$(.venv/bin/messagex database-url)"
    MESSAGEX_USER=guest MESSAGEX_PASSWORD=guest .venv/bin/python examples/invoice_consumer.py

Settings: DATABASE_URL (the broker's database: ``messagex database-url``), MESSAGEX_URL
(default http://127.0.0.1:8000), MESSAGEX_TOKEN or MESSAGEX_USER + MESSAGEX_PASSWORD. At
start it declares queue ``invoices``, binds it to ``amq.topic`` with ``order.created`` and
creates table ``invoices``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from typing import Any

import asyncpg
from messagex_client import Client, Message, MessageXError, ack_in_transaction

log = logging.getLogger("invoices")

QUEUE = "invoices"
EXCHANGE = "amq.topic"
ROUTING_KEY = "order.created"

# No unique key on the order: exactly-once comes from the ack, not from de-duplication.
INVOICES_TABLE = """
CREATE TABLE IF NOT EXISTS invoices (
    id bigserial PRIMARY KEY,
    order_reference text NOT NULL,
    customer text NOT NULL,
    amount_cents bigint NOT NULL,
    message_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


class NoLongerOurs(Exception):
    """messagex.ack returned false: the delivery timed out or was released meanwhile."""


async def setup(client: Client, pool: asyncpg.Pool) -> None:
    """The queue, its binding (once) and the result table."""
    await client.topology.declare_queue(QUEUE)
    bound = await client.topology.bindings(exchange=EXCHANGE, queue=QUEUE)
    if not any(b.routing_key == ROUTING_KEY for b in bound):
        await client.topology.bind(EXCHANGE, queue=QUEUE, routing_key=ROUTING_KEY)
    async with pool.acquire() as conn:
        await conn.execute(INVOICES_TABLE)


async def write_invoice(conn: asyncpg.Connection, message: Message) -> None:
    """The work. Replace with yours: it runs inside the transaction that acks."""
    order: Any = message.body
    if not isinstance(order, dict) or not isinstance(order.get("total_cents"), int):
        raise ValueError("not an order")
    await conn.execute(
        "INSERT INTO invoices (order_reference, customer, amount_cents, message_id) "
        "VALUES ($1, $2, $3, $4)",
        str(order["reference"]),
        str(order["customer"]),
        order["total_cents"],
        message.message_id,
    )


async def process(pool: asyncpg.Pool, message: Message) -> bool:
    """Write the invoice and ack, in one transaction. True when it committed."""
    try:
        async with pool.acquire() as conn, conn.transaction():
            await write_invoice(conn, message)
            if not await ack_in_transaction(conn, message.delivery_tag):
                raise NoLongerOurs
    except NoLongerOurs:
        log.warning("%s is no longer ours (timed out or released): rolled back", message.message_id)
        return False
    except (asyncpg.PostgresError, OSError):
        raise  # the database is in trouble: let the service stop (or retry) loudly
    except Exception:
        log.exception("failed %s: rolled back, dead-lettering it", message.message_id)
        try:
            await message.nack(requeue=False)
        except MessageXError as exc:  # timed out meanwhile: it comes again
            log.warning("could not nack %s: %s", message.message_id, exc)
        return False
    log.info("invoiced %s (delivery %d)", message.message_id, message.delivery_count)
    return True


async def consume(client: Client, pool: asyncpg.Pool, prefetch: int = 10) -> None:
    async with client.subscribe(QUEUE, prefetch=prefetch) as messages:
        log.info("consuming %s (prefetch %d)", QUEUE, prefetch)
        async for message in messages:
            await process(pool, message)


def client_from_env() -> Client:
    url = os.environ.get("MESSAGEX_URL", "http://127.0.0.1:8000")
    if token := os.environ.get("MESSAGEX_TOKEN"):
        return Client(url, token=token)
    return Client(
        url,
        username=os.environ.get("MESSAGEX_USER", "guest"),
        password=os.environ.get("MESSAGEX_PASSWORD", "guest"),
    )


async def main(prefetch: int) -> int:
    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        log.error("set DATABASE_URL (it is what `messagex database-url` prints)")
        return 2
    async with (
        asyncpg.create_pool(database_url, min_size=1, max_size=2) as pool,
        client_from_env() as client,
    ):
        await setup(client, pool)
        task = asyncio.ensure_future(consume(client, pool, prefetch))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # a transaction cut short rolls back: its message is not acked and comes again
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            log.info("stopped")
        except MessageXError as exc:
            log.error("%s", exc)
            return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefetch", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raise SystemExit(asyncio.run(main(args.prefetch)))
