"""The group claim (contract §16, ``queries.CLAIM_GROUPS``) against a real PostgreSQL with a
backlog: its plans use the indexes of migration 0012 and never walk the backlog, also with
few groups whose every waiting copy is blocked; concurrent claimers on several connections
never put two copies of a group in flight; ``storage.groups.blocked_groups`` names the blocked
groups.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from app.storage import groups, queries
from app.storage.database import Database
from app.storage.deliveries import group_claim_params
from app.storage.dsn import asyncpg_dsn

BACKLOG = 30_000

FILL = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, group_id)
SELECT $1, 'm' || g, '', 'k', '\\x00', 'g' || (g % $2)
FROM generate_series(1, $3) AS g
"""


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        for name, n in (("many", 1000), ("few", 10)):
            queue_id = await c.fetchval(
                "INSERT INTO queues (name, arguments) VALUES ($1, $2::jsonb) RETURNING id",
                name,
                json.dumps({"x-message-groups": True}),
            )
            await c.execute(FILL, queue_id, n, BACKLOG)
        await c.execute("ANALYZE messages")
        yield c
    finally:
        await c.close()


def _params(queue_id: int, n: int) -> dict[str, Any]:
    return group_claim_params(
        queue_id=queue_id,
        n=n,
        lease_seconds=30.0,
        process_id=str(uuid.uuid4()),
        owners=None,
        owner_user="u",
    )


async def _claim(c: asyncpg.Connection, queue_id: int, n: int) -> list[asyncpg.Record]:
    params = _params(queue_id, n)
    lock, claim = queries.LOCK_GROUP_CLAIM, queries.CLAIM_GROUPS
    async with c.transaction():
        await c.fetch(lock.sql, *lock.args(params))
        return list(await c.fetch(claim.sql, *claim.args(params)))


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


async def _analyze(c: asyncpg.Connection, queue_id: int, n: int, mode: str) -> list[dict[str, Any]]:
    await c.execute(f"SET plan_cache_mode = {mode}")
    claim = queries.CLAIM_GROUPS
    tr = c.transaction()
    await tr.start()
    try:
        raw = await c.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + claim.sql, *claim.args(_params(queue_id, n))
        )
    finally:
        await tr.rollback()
    document = raw if isinstance(raw, list) else json.loads(raw)
    return list(_nodes(document[0]["Plan"]))


def _rows_read(nodes: list[dict[str, Any]]) -> int:
    """Index entries returned by every scan of messages, over all loops."""
    return sum(
        int(n.get("Actual Rows", 0)) * int(n.get("Actual Loops", 1))
        for n in nodes
        if n.get("Relation Name") == "messages" and n["Node Type"] != "ModifyTable"
    )


async def _queue(c: asyncpg.Connection, name: str) -> int:
    return int(await c.fetchval("SELECT id FROM queues WHERE name = $1", name))


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
async def test_the_group_claim_reads_a_bounded_number_of_rows(
    conn: asyncpg.Connection, mode: str
) -> None:
    many, few = await _queue(conn, "many"), await _queue(conn, "few")
    # many groups: one claim of 100 heads reads about what it claims
    assert len(await _claim(conn, many, 100)) == 100
    nodes = await _analyze(conn, many, 100, mode)
    names = {n.get("Index Name") for n in nodes}
    assert "ix_messages_claim" in names, nodes
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), nodes
    assert _rows_read(nodes) < 2_000, nodes
    # few groups, all busy: every waiting copy is blocked, and the claim still reads only its
    # window and the 10 groups' heads, not the 30,000 copies
    assert len(await _claim(conn, few, 100)) == 10
    nodes = await _analyze(conn, few, 100, mode)
    assert "ix_messages_group_head" in {n.get("Index Name") for n in nodes}, nodes
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), nodes
    print("rows read with 10 busy groups:", _rows_read(nodes))
    assert _rows_read(nodes) < 3_000, nodes


async def test_concurrent_claimers_never_take_two_copies_of_a_group(
    conn: asyncpg.Connection, database_url: str
) -> None:
    few = await _queue(conn, "few")
    dsn = asyncpg_dsn(database_url)
    claimers = [await asyncpg.connect(dsn) for _ in range(6)]
    rng = random.Random(3)
    violations: list[Any] = []

    async def work(c: asyncpg.Connection) -> None:
        for _ in range(15):
            rows = await _claim(c, few, rng.choice([1, 3, 20]))
            bad = await c.fetch(
                "SELECT group_id FROM messages WHERE queue_id = $1 AND status = 'in_flight' "
                "GROUP BY group_id HAVING count(*) > 1",
                few,
            )
            violations.extend(bad)
            done = [r[1] for r in rows if rng.random() < 0.8]
            await c.execute("DELETE FROM messages WHERE id = ANY($1::bigint[])", done)
            back = [r[1] for r in rows if r[1] not in done]
            await c.execute(
                "UPDATE messages SET status = 'ready', delivery_tag = NULL, "
                "lease_expires_at = NULL WHERE id = ANY($1::bigint[])",
                back,
            )

    try:
        await asyncio.gather(*(work(c) for c in claimers))
    finally:
        for c in claimers:
            await c.close()
    assert violations == []
    # every group's copies were taken in order: the smallest ids are gone first
    left = await conn.fetch(
        "SELECT group_id, min(id) AS first, count(*) FROM messages WHERE queue_id = $1 "
        "GROUP BY group_id",
        few,
    )
    assert len(left) == 10
    assert sum(r[2] for r in left) < BACKLOG


async def test_blocked_groups_names_the_holder_and_the_next(
    conn: asyncpg.Connection, db: Database
) -> None:
    few = await _queue(conn, "few")
    claimed = await _claim(conn, few, 3)
    async with db.transaction() as c:
        blocked = await groups.blocked_groups(c, few, n=10)
    assert len(blocked) == 3
    assert {b.in_flight_id for b in blocked} == {r[1] for r in claimed}
    assert all(b.owner_user == "u" and b.owner_connection is None for b in blocked)
    for b in blocked:
        nxt = await conn.fetchval(
            "SELECT min(id) FROM messages WHERE queue_id = $1 AND group_id = $2 "
            "AND status = 'ready'",
            few,
            b.group_id,
        )
        assert b.next_id == nxt
