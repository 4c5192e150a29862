"""Claims that meet (contract §15, §18): an application's own transaction holding a
message_id makes the broker's publish of it wait, and then a duplicate; one that claims in
the other order than the broker makes a deadlock, whose victim — the broker's publish —
stored nothing and runs again. Real PostgreSQL, the application being a plain asyncpg
session writing ``publish_dedup`` as the SQL functions do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from asyncpg.transaction import Transaction

from app.domain.model import OutgoingMessage
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn
from tests.integration.test_publish_atomicity import ADMIN, count, execute, message, publisher_for
from tests.support import async_wait_for

CLAIM = "INSERT INTO publish_dedup (queue_id, message_id) VALUES ($1, $2)"


@pytest.fixture
async def app(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    await execute(
        database_url,
        "INSERT INTO queues (name, arguments) "
        "VALUES ('w', '{\"x-deduplication-window-seconds\": 600}')",
    )
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        yield conn
    finally:
        await conn.close()


async def _waiting_on_a_lock(database_url: str) -> bool:
    rows = await execute(
        database_url,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND application_name = $1 AND datname = current_database()",
        "messagex",
    )
    return int(rows[0][0]) > 0


def _sent(message_id: str) -> OutgoingMessage:
    return message(message_id=message_id, properties={"message_id": message_id})


async def _holding(app: asyncpg.Connection, message_id: str, *settings: str) -> Transaction:
    """The application's transaction, open, holding its claim of ``message_id`` in 'w'."""
    queue_id = await app.fetchval("SELECT id FROM queues WHERE name = 'w'")
    tx = app.transaction()
    await tx.start()
    for setting in settings:
        await app.execute(setting)
    await app.execute(CLAIM, queue_id, message_id)
    return tx


async def test_a_claim_held_by_an_open_transaction_waits_then_is_a_duplicate(
    db: Database, app: asyncpg.Connection, database_url: str
) -> None:
    publisher, _metrics, _woken = publisher_for(db)
    tx = await _holding(app, "held")
    publishing = asyncio.create_task(publisher.publish_to_queue(ADMIN, "w", [_sent("held")]))
    await async_wait_for(lambda: _waiting_on_a_lock(database_url), message="the wait")
    assert not publishing.done()
    await tx.commit()
    (result,) = await asyncio.wait_for(publishing, 10)
    assert (result.queues, result.duplicates) == ([], ["w"])
    assert await count(database_url) == 0


async def test_a_deadlocked_publish_runs_again(
    db: Database, app: asyncpg.Connection, database_url: str
) -> None:
    publisher, _metrics, _woken = publisher_for(db)
    # the broker's session detects the deadlock first (1 s by default): it is the victim
    tx = await _holding(app, "b", "SET LOCAL deadlock_timeout = '20s'")
    # the broker claims "a", then waits for "b"
    batch = [_sent("a"), _sent("b")]
    publishing = asyncio.create_task(publisher.publish_to_queue(ADMIN, "w", batch))
    await async_wait_for(lambda: _waiting_on_a_lock(database_url), message="the wait")
    queue_id = await app.fetchval("SELECT id FROM queues WHERE name = 'w'")
    await app.execute(CLAIM, queue_id, "a")  # waits for the broker: a cycle
    await tx.commit()
    results = await asyncio.wait_for(publishing, 10)
    assert [(r.queues, r.duplicates) for r in results] == [([], ["w"]), ([], ["w"])]
    assert await count(database_url) == 0
