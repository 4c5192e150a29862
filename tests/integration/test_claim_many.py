"""The claim of many queues in one statement (``queries.CLAIM_MANY``, the dispatcher's claims
that come together) on a real PostgreSQL: each queue gets its own rows in its own claim order
(priority, then (available_at, id)), each to its own owners in order, up to its own count,
with its own lease; copies not yet due or expired are skipped; and claimers racing on several
connections never put a copy in flight twice (contract §10)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from app.storage import deliveries
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn

FILL = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, priority,
                      available_at, expires_at)
SELECT $1, $2 || g, '', 'k', '\\x00', $3::int, now() - (1000 - g) * interval '1 ms', NULL
FROM generate_series(1, $4) AS g
"""


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        yield c
    finally:
        await c.close()


async def _queue(c: asyncpg.Connection, name: str, arguments: dict[str, object]) -> int:
    queue_id: int = await c.fetchval(
        "INSERT INTO queues (name, arguments) VALUES ($1, $2::jsonb) RETURNING id",
        name,
        json.dumps(arguments),
    )
    return queue_id


async def test_each_queue_gets_its_rows_in_its_order_to_its_owners(
    conn: asyncpg.Connection, db: Database
) -> None:
    plain = await _queue(conn, "many-plain", {})
    prio = await _queue(conn, "many-prio", {"x-max-priority": 9})
    other = await _queue(conn, "many-other", {})
    await conn.execute(FILL, plain, "p", None, 10)
    # the priority queue: 5 copies of priority 1, then 5 of priority 7 published later
    await conn.execute(FILL, prio, "low", 1, 5)
    await conn.execute(FILL, prio, "high", 7, 5)
    # not due, and expired: never claimed
    await conn.execute(
        "INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, available_at)"
        " VALUES ($1, 'later', '', 'k', '\\x00', now() + interval '1 hour')",
        plain,
    )
    await conn.execute(
        "INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, expires_at)"
        " VALUES ($1, 'gone', '', 'k', '\\x00', now() - interval '1 s')",
        other,
    )
    owners = {q: [str(uuid.uuid4()) for _ in range(n)] for q, n in ((plain, 4), (prio, 7))}
    owners[other] = [str(uuid.uuid4())]
    wants = [
        deliveries.ClaimWant(plain, owners[plain], 30.0),
        deliveries.ClaimWant(prio, owners[prio], 60.0),
        deliveries.ClaimWant(other, owners[other], 30.0),
    ]
    found = await deliveries.claim_many(db.hot, wants, str(uuid.uuid4()))
    assert [d.message_id for d in found[plain]] == ["p1", "p2", "p3", "p4"]
    assert [d.slot for d in found[plain]] == [0, 1, 2, 3]
    assert [d.message_id for d in found[prio]] == [
        "high1", "high2", "high3", "high4", "high5", "low1", "low2"
    ]  # fmt: skip
    assert [d.slot for d in found[prio]] == list(range(7))
    assert found[other] == []
    rows = await conn.fetch(
        "SELECT message_id, queue_id, owner_connection::text, "
        "extract(epoch FROM lease_expires_at - delivered_at)::int AS lease "
        "FROM messages WHERE status = 'in_flight'"
    )
    held = {r["message_id"]: (r["queue_id"], r["owner_connection"], r["lease"]) for r in rows}
    assert len(held) == 11
    for queue_id, claimed in found.items():
        for d in claimed:
            assert held[d.message_id][:2] == (queue_id, owners[queue_id][d.slot])
            assert d.delivery_tag.startswith(f"{d.id}.")
    assert held["high1"][2] == 60
    assert held["p1"][2] == 30


async def test_racing_claimers_never_take_a_copy_twice(
    conn: asyncpg.Connection, db: Database
) -> None:
    queues = [await _queue(conn, f"race-{i}", {}) for i in range(20)]
    for q in queues:
        await conn.execute(FILL, q, f"r{q}-", None, 50)

    async def claimer() -> list[int]:
        got: list[int] = []
        for _ in range(40):
            wants = [deliveries.ClaimWant(q, [str(uuid.uuid4())] * 3, 30.0) for q in queues]
            found = await deliveries.claim_many(db.hot, wants, str(uuid.uuid4()))
            got.extend(d.id for claimed in found.values() for d in claimed)
        return got

    results = await asyncio.gather(*(claimer() for _ in range(6)))
    ids = [i for r in results for i in r]
    assert len(ids) == len(set(ids)) == 20 * 50
