"""The history's depth sample (``storage.history.sample_depth``, contract §20) against a real
PostgreSQL: per queue and in total it counts what one scan of the whole table, grouped with
ROLLUP, counts (the statement it replaced, kept here as the reference), and it reads each
status through its partial index, not the whole table."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from sqlalchemy import text

from app.storage import history
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn
from tests.integration.test_handoff import queues

#: the reference: one scan of messages, by status, per queue and (ROLLUP) in total
REFERENCE = """
SELECT m.queue_id,
       count(*) FILTER (WHERE m.status = 'ready' AND m.available_at <= now()),
       count(*) FILTER (WHERE m.status = 'ready' AND m.available_at > now()),
       count(*) FILTER (WHERE m.status = 'in_flight'),
       count(*) FILTER (WHERE m.status = 'dead')
FROM messages AS m
GROUP BY ROLLUP (m.queue_id)
"""

#: $3 copies of queue $1 with status $2, due $4 seconds from now, of $5 body bytes
FILL = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, available_at, status,
                      delivery_tag, lease_expires_at, delivered_at, owner_connection)
SELECT $1::bigint, 'm' || g, '', 'k', convert_to(repeat('x', $5), 'UTF8'),
       now() + make_interval(secs => $4), $2::text,
       CASE WHEN $2 = 'in_flight' THEN $1::bigint || '.' || g END,
       CASE WHEN $2 = 'in_flight' THEN now() + interval '1 hour' END,
       CASE WHEN $2 = 'in_flight' THEN now() END,
       CASE WHEN $2 = 'in_flight' THEN gen_random_uuid() END
FROM generate_series(1, $3) AS g
"""


async def fill(url: str, *groups: tuple[int, str, int, float], body: int = 1) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        # a commit flushed at once: VACUUM sets a page all-visible only once its rows'
        # inserting commit is flushed (the test cluster may commit asynchronously)
        await conn.execute("SET synchronous_commit = on")
        await conn.executemany(FILL, [(*g, body) for g in groups])
    finally:
        await conn.close()


async def fetch(url: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def sampled(db: Database) -> dict[int | None, tuple[int, int, int, int]]:
    """Take a depth sample now; its rows by queue id (None: the total)."""
    at = datetime.now(UTC)
    async with db.transaction() as conn:
        assert await history.sample_depth(conn, at, timedelta(minutes=15), 5.0)
    rows = await db_rows(db, at)
    return {r[0]: tuple(r[1:]) for r in rows}


async def db_rows(db: Database, at: datetime) -> list[Any]:
    async with db.transaction() as conn:
        result = await conn.execute(
            text(
                "SELECT queue_id, ready, delayed, in_flight, dead FROM queue_samples"
                " WHERE at = :at AND ready IS NOT NULL"
            ),
            {"at": at},
        )
        return list(result)


async def test_the_depth_sample_counts_what_one_scan_counts(
    db: Database, database_url: str
) -> None:
    a, b, c, _empty = await queues(database_url, "a", "b", "c", "empty")
    await fill(
        database_url,
        (a, "ready", 7, -1.0),
        (a, "ready", 3, 3600.0),  # delayed
        (a, "in_flight", 2, -1.0),
        (a, "dead", 4, -1.0),
        (b, "in_flight", 5, -1.0),  # a queue with in-flight copies only
        (c, "dead", 1, -1.0),  # and one with a dead copy only
    )
    want = {r[0]: tuple(r[1:]) for r in await fetch(database_url, REFERENCE)}
    got = await sampled(db)
    assert got == want
    assert got[a] == (7, 3, 2, 4)
    assert got[None] == (7, 3, 7, 5)


async def test_an_empty_broker_still_has_its_total_row(db: Database) -> None:
    assert await sampled(db) == {None: (0, 0, 0, 0)}


async def test_each_status_is_read_through_its_partial_index(database_url: str) -> None:
    """With a backlog the table's pages marked all-visible (as VACUUM marks copies that
    wait), the ready copies are counted from ix_messages_claim alone and the other statuses
    from their own indexes: never a sequential scan of messages."""
    (q,) = await queues(database_url, "backlog")
    # copies of 1 KiB, as the benchmarks publish: the heap is then far larger than the index
    await fill(database_url, (q, "ready", 20_000, 60.0), (q, "in_flight", 10, -1.0), body=1024)
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await conn.execute("VACUUM (ANALYZE) messages")
        sql = history._DEPTH.text.replace(":at", "$1")
        raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql, datetime.now(UTC))
    finally:
        await conn.close()
    plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
    nodes = list(_nodes(plan))
    reads = [n for n in nodes if n.get("Relation Name") == "messages"]
    assert reads, plan
    assert not [n for n in reads if n["Node Type"] in ("Seq Scan", "Parallel Seq Scan")], plan
    assert {"ix_messages_claim", "ix_messages_parked"} <= {n.get("Index Name") for n in reads}


def _nodes(plan: dict[str, Any]) -> Any:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)
