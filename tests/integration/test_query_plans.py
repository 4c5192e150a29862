"""The hot statements use the indexes they were written for, whatever the backlog.

Asserted through ``EXPLAIN (FORMAT JSON)`` on a real PostgreSQL holding a backlog, for the
custom plan (the first executions of a prepared statement) and the generic plan (what
PostgreSQL may switch to after five), with statistics taken by ANALYZE:

- the claim walks ``ix_messages_claim`` (never a sequential scan or a sort of the queue),
  with the backlog in the claimed queue and in another one;
- a batched ACK finds its rows by primary key even when many deliveries are in flight (it
  used to walk the partial in-flight index, a cost that grew with the deliveries in flight).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from app.storage import deliveries
from app.storage.fastpath import Statement
from tests.support import asyncpg_dsn

BACKLOG = 50_000
IN_FLIGHT = 5_000


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        busy = await c.fetchval("INSERT INTO queues (name) VALUES ('busy') RETURNING id")
        probed = await c.fetchval("INSERT INTO queues (name) VALUES ('probed') RETURNING id")
        # A backlog of ready rows in both queues, and deliveries in flight in the busy one.
        await c.execute(
            """
            INSERT INTO messages (queue_id, message_id, exchange, routing_key, body)
            SELECT CASE WHEN g % 10 = 0 THEN $2::bigint ELSE $1::bigint END,
                   'm' || g, '', 'k', '\\x00'
            FROM generate_series(1, $3) AS g
            """,
            busy,
            probed,
            BACKLOG,
        )
        await c.execute(
            """
            UPDATE messages SET status = 'in_flight', delivery_tag = id::text || '.t',
                   lease_expires_at = now() + interval '1 hour', delivered_at = now(),
                   owner_connection = gen_random_uuid()
            WHERE id IN (SELECT id FROM messages WHERE queue_id = $1 ORDER BY id LIMIT $2)
            """,
            busy,
            IN_FLIGHT,
        )
        await c.execute("ANALYZE messages")
        yield c
    finally:
        await c.close()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


async def _plan(
    conn: asyncpg.Connection, statement: Statement, params: dict[str, Any], mode: str
) -> list[dict[str, Any]]:
    await conn.execute(f"SET plan_cache_mode = {mode}")
    raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + statement.sql, *statement.args(params))
    document = raw if isinstance(raw, list) else json.loads(raw)
    return list(_nodes(document[0]["Plan"]))


def _scans(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan's reads of the messages table (not the UPDATE/DELETE node itself)."""
    return [
        n for n in nodes if n.get("Relation Name") == "messages" and n["Node Type"] != "ModifyTable"
    ]


def _limited(node: dict[str, Any]) -> bool:
    """Every path from ``node`` down to a scan of messages passes through a Limit."""
    if node["Node Type"] == "Limit":
        return True
    if node.get("Relation Name") == "messages":
        return False
    return all(_limited(child) for child in node.get("Plans", ()))


async def _in_flight(conn: asyncpg.Connection, n: int) -> list[asyncpg.Record]:
    """(id, delivery tag, owner connection) of n deliveries in flight."""
    return list(
        await conn.fetch(
            "SELECT id, delivery_tag, owner_connection::text FROM messages "
            "WHERE status = 'in_flight' ORDER BY id LIMIT $1",
            n,
        )
    )


MODES = ["force_custom_plan", "force_generic_plan"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("queue", ["busy", "probed"])
async def test_the_claim_walks_its_index(conn: asyncpg.Connection, mode: str, queue: str) -> None:
    queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = $1", queue)
    params = {
        "queue_id": queue_id,
        "n": 100,
        "lease_seconds": 30.0,
        "process_id": str(uuid.uuid4()),
        "owners": [str(uuid.uuid4())] * 100,
        "owner_user": None,
    }
    nodes = await _plan(conn, deliveries._CLAIM, params, mode)
    scans = _scans(nodes)
    assert any(n.get("Index Name") == "ix_messages_claim" for n in scans), nodes
    assert not any(n["Node Type"] == "Seq Scan" for n in scans), nodes
    # The picked rows are numbered in claim order: a sort of at most n rows, above the Limit.
    for sort in (n for n in nodes if n["Node Type"] == "Sort"):
        assert _limited(sort), sort


@pytest.mark.parametrize("mode", MODES)
async def test_batched_acks_find_their_rows_by_primary_key(
    conn: asyncpg.Connection, mode: str
) -> None:
    rows = await _in_flight(conn, 50)
    ids, tags = [r[0] for r in rows], [r[1] for r in rows]
    for statement, params in (
        (deliveries._ACK_MANY, {"ids": ids, "tags": tags, "owners": [r[2] for r in rows]}),
        (deliveries._ACK_PULL_MANY, {"ids": ids, "tags": tags, "owner_user": "u"}),
    ):
        nodes = await _plan(conn, statement, params, mode)
        scans = _scans(nodes)
        assert scans, nodes
        assert all(n.get("Index Name") == "pk_messages" for n in scans), scans


@pytest.mark.parametrize("mode", MODES)
async def test_a_pull_ack_and_a_nack_find_their_row_by_primary_key(
    conn: asyncpg.Connection, mode: str
) -> None:
    [row] = await _in_flight(conn, 1)
    for statement, params in (
        (deliveries._ACK_PULL_MANY, {"ids": [row[0]], "tags": [row[1]], "owner_user": "u"}),
        (
            Statement(deliveries.LOCK_BY_TAG),
            {"id": row[0], "tag": row[1], "owner_connection": None, "owner_user": "u"},
        ),
    ):
        nodes = await _plan(conn, statement, params, mode)
        assert [n.get("Index Name") for n in _scans(nodes)] == ["pk_messages"], nodes
