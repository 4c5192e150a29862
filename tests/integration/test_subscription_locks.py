"""A queue deleted while a consumer of it disconnects: both finish, neither deadlocks.

A queue's deletion locks the queue row and then, by cascade, its subscription rows. Ending a
connection used to delete its subscription rows and then update their queues' rows: the
other order, and PostgreSQL's deadlock detector killed one of the two (seen at the end of
benchmark runs as "release on disconnect failed"). Now the queue rows are locked first.
Real PostgreSQL; the deletion is a plain session taking the queue's lock as delete_queue
does, then deleting it once the disconnect waits on that lock.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from app.storage import presence
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn
from tests.integration.test_publish_atomicity import execute
from tests.support import async_wait_for


async def _subscribed(db: Database, queues: list[int]) -> str:
    process, connection = str(uuid.uuid4()), str(uuid.uuid4())
    async with db.transaction() as conn:
        await presence.register_process(conn, process, "test", 1)
        assert await presence.admit_connection(
            conn, connection_id=connection, process_id=process, username="admin", limit=10
        )
        for queue_id in queues:
            await presence.add_subscription(
                conn, connection_id=connection, queue_id=queue_id, process_id=process, prefetch=1
            )
    return connection


async def _waiting_on_a_lock(database_url: str) -> bool:
    rows = await execute(
        database_url,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database() AND pid <> pg_backend_pid() AND $1",
        True,
    )
    return int(rows[0][0]) > 0


async def _deleted_while_disconnecting(db: Database, database_url: str, remove: str) -> None:
    rows = await execute(
        database_url, "INSERT INTO queues (name) VALUES ($1), ($2) RETURNING id", "a", "b"
    )
    a, b = (int(r[0]) for r in rows)
    connection = await _subscribed(db, [a, b])
    deleter = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        tx = deleter.transaction()
        await tx.start()
        await deleter.execute("SET LOCAL lock_timeout = '10s'")
        # delete_queue's first step: the queue row, FOR UPDATE
        await deleter.execute("SELECT 1 FROM queues WHERE id = $1 FOR UPDATE", b)

        async def end() -> None:
            async with db.transaction() as conn:
                if remove == "connection":
                    await presence.remove_connection(conn, connection)
                else:
                    await presence.remove_subscription(conn, connection, b)

        ending = asyncio.create_task(end())
        await async_wait_for(lambda: _waiting_on_a_lock(database_url), timeout=10)
        # the cascade to subscription rows: with the old order it waited on the row the
        # disconnect had deleted, while the disconnect waited on the queue row
        await deleter.execute("DELETE FROM queues WHERE id = $1", b)
        await tx.commit()
        await asyncio.wait_for(ending, 10)
    finally:
        await deleter.close()
    left = await execute(
        database_url, "SELECT queue_id FROM subscriptions WHERE connection_id = $1", connection
    )
    assert [int(r[0]) for r in left] == ([] if remove == "connection" else [a])


async def test_a_queue_deleted_while_its_consumer_disconnects(
    db: Database, database_url: str
) -> None:
    await _deleted_while_disconnecting(db, database_url, "connection")


async def test_a_queue_deleted_while_its_subscription_ends(db: Database, database_url: str) -> None:
    await _deleted_while_disconnecting(db, database_url, "subscription")
