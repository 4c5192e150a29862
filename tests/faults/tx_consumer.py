"""The exactly-once consumer of test_exactly_once.py, as a process the test kills (SIGKILL).

``python -m tests.faults.tx_consumer BROKER_URL DATABASE_URL QUEUE LEDGER NAME --user U
--password P [--workers 8] [--slow N ...]``

It consumes QUEUE over the WebSocket (messagex_client) and hands each delivery to one of
``--workers`` tasks (the database's latency, not its CPU, bounds one task), which in ONE
transaction inserts the message's effect row into ``eo_effects`` and calls
``messagex.ack(tag)`` (ack_in_transaction); when the ack returns false it rolls back. It never
acks over the WebSocket. Messages whose ``n`` is listed in ``--slow`` wait past the ack timeout
on their first delivery, so their ack must return false and their effect be rolled back.

Each event is appended to LEDGER as one JSON line, flushed at once, so that what a killed
process did up to its death is on disk: ``{"e": "d", ...}`` a delivery, ``{"e": "s", "tag",
"outcome"}`` how it ended (``acked``: committed with ack true; ``ack_rejected:false``: ack
returned false, rolled back). A kill between the commit and the line leaves the delivery
``unsettled`` in the ledger, which the checker treats as an explained redelivery cause; the
effect table is the judge of exactly-once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Sequence
from typing import IO, Any

import asyncpg
from messagex_client import Client, Message, ack_in_transaction

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS eo_effects (
    id bigserial PRIMARY KEY,
    message_id text NOT NULL,
    n integer NOT NULL,
    consumer text NOT NULL,
    delivery_tag text NOT NULL
)
"""


class NotOurs(Exception):
    pass


def _write(ledger: IO[str], record: dict[str, Any]) -> None:
    ledger.write(json.dumps(record) + "\n")
    ledger.flush()


async def _work(
    args: argparse.Namespace,
    pool: asyncpg.Pool,
    inbox: asyncio.Queue[Message],
    ledger: IO[str],
) -> None:
    """One of ``--workers`` tasks."""
    while True:
        message = await inbox.get()
        try:
            await _handle(args, pool, message, ledger)
        finally:
            inbox.task_done()


async def _handle(
    args: argparse.Namespace, pool: asyncpg.Pool, message: Message, ledger: IO[str]
) -> None:
    """The message's effect and its SQL ack, in one transaction."""
    n = int(message.body["n"])
    if n in args.slow and message.delivery_count == 1:
        await asyncio.sleep(args.slow_seconds)  # past the ack timeout
    try:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO eo_effects (message_id, n, consumer, delivery_tag) "
                "VALUES ($1, $2, $3, $4)",
                message.message_id,
                n,
                args.name,
                message.delivery_tag,
            )
            if not await ack_in_transaction(conn, message.delivery_tag):
                raise NotOurs
        outcome = "acked"
    except NotOurs:
        outcome = "ack_rejected:false"
    _write(
        ledger,
        {"e": "s", "tag": message.delivery_tag, "outcome": outcome, "at": time.monotonic()},
    )


async def _read(
    args: argparse.Namespace,
    messages: AsyncIterator[Message],
    connection: str,
    inbox: asyncio.Queue[Message],
    workers: Sequence[asyncio.Future[None]],
    ledger: IO[str],
) -> None:
    async for message in messages:
        _write(
            ledger,
            {
                "e": "d",
                "consumer": args.name,
                "connection": connection,
                "queue": message.queue,
                "message_id": message.message_id,
                "tag": message.delivery_tag,
                "count": message.delivery_count,
                "redelivered": message.redelivered,
                "at": time.monotonic(),
            },
        )
        inbox.put_nowait(message)
        for worker in workers:
            if worker.done():
                worker.result()  # a worker died: so does the process


async def run(args: argparse.Namespace) -> None:
    """Consume until SIGTERM (then finish every delivery taken, and exit) or SIGKILL."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    with open(args.ledger, "a", encoding="utf-8") as ledger:  # noqa: ASYNC230 - line writes
        async with (
            asyncpg.create_pool(args.database_url, min_size=1, max_size=args.workers) as pool,
            Client(args.broker_url, username=args.user, password=args.password) as client,
            client.subscribe(args.queue, prefetch=args.prefetch) as messages,
        ):
            inbox: asyncio.Queue[Message] = asyncio.Queue()
            workers = [
                asyncio.ensure_future(_work(args, pool, inbox, ledger)) for _ in range(args.workers)
            ]
            connection = f"{args.name}:{client.connection_id}"
            reader = asyncio.ensure_future(
                _read(args, messages, connection, inbox, workers, ledger)
            )
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()  # it ended by itself: an error, raised here
            reader.cancel()
            await inbox.join()  # every delivery taken is settled (or found no longer ours)
            for worker in workers:
                worker.cancel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("broker_url")
    parser.add_argument("database_url")
    parser.add_argument("queue")
    parser.add_argument("ledger")
    parser.add_argument("name")
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=50)
    parser.add_argument("--slow", type=int, nargs="*", default=[])
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    args = parser.parse_args()
    args.slow = set(args.slow)
    print(f"tx_consumer {args.name} pid {os.getpid()}", flush=True)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
