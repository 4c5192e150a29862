"""A drop-head publish in one call (storage/limits.py TRIMMING_FUNCTION, migration 0017):
it waits for the queue's lock, then counts what committed while it waited — copies stored
after the call began included — so the queue holds its limit after its commit. Real
PostgreSQL; the racing publisher is a plain asyncpg session holding the lock as the broker's
limited publishes do."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from app.domain.arguments import QueueArguments
from app.storage import limits
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn
from app.storage.messages import QueueDeleted
from tests.integration.test_dedup_contention import _waiting_on_a_lock
from tests.integration.test_publish_atomicity import execute, message
from tests.support import async_wait_for

LIMIT = 5


async def _publish(db: Database, queue: limits.QueueInfo, n: int, tag: str) -> int:
    messages = [("", message(message_id=f"{tag}{i}", routing_key="k")) for i in range(n)]
    copies = [(i, queue.id) for i in range(n)]
    return await limits.insert_and_trim(db.hot, [queue], messages, copies, str(uuid.uuid4()), None)


async def _ready(url: str, queue_id: int) -> list[str]:
    rows = await execute(
        url,
        "SELECT message_id FROM messages WHERE queue_id = $1 AND status = 'ready' "
        "AND available_at <= now() ORDER BY available_at, id",
        queue_id,
    )
    return [r[0] for r in rows]


async def test_a_call_waiting_for_the_lock_counts_the_copies_committed_meanwhile(
    db: Database, database_url: str
) -> None:
    rows = await execute(
        database_url,
        "INSERT INTO queues (name, arguments) VALUES ('lim', $1::jsonb) RETURNING id",
        f'{{"x-max-length": {LIMIT}}}',
    )
    queue = limits.QueueInfo(rows[0][0], "lim", QueueArguments(max_length=LIMIT), None)
    assert await _publish(db, queue, LIMIT, "old") == 0
    racer = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        tx = racer.transaction()
        await tx.start()
        await racer.execute(limits.LOCK_QUEUES.text.replace(":ids", "$1"), [queue.id])
        publishing = asyncio.create_task(_publish(db, queue, 2, "new"))
        await async_wait_for(lambda: _waiting_on_a_lock(database_url), message="the wait")
        # copies due from a time after the call began (a racer that began after it): the
        # call's statement_timestamp() would not count them as due
        await racer.execute(
            "INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, "
            "available_at) SELECT $1, 'racer' || g, '', 'k', '\\x31', clock_timestamp() "
            "FROM generate_series(0, 2) AS g",
            queue.id,
        )
        assert not publishing.done()
        await tx.commit()
        dropped = await asyncio.wait_for(publishing, 10)
    finally:
        await racer.close()
    # 5 + 3 + 2 ready: the 5 oldest leave (the call's copies are due from when it began)
    assert dropped == LIMIT
    assert await _ready(database_url, queue.id) == ["new0", "new1", "racer0", "racer1", "racer2"]


async def test_a_call_into_a_deleted_queue_is_queue_deleted(db: Database) -> None:
    gone = limits.QueueInfo(999_999, "gone", QueueArguments(max_length=LIMIT), None)
    with pytest.raises(QueueDeleted):
        await _publish(db, gone, 1, "m")
