"""Contract §13's sweeps use their indexes, whatever the backlog (``EXPLAIN (FORMAT JSON)``,
custom and generic plans, statistics by ANALYZE):

- the expiry sweep walks ``ix_messages_expiry`` (partial on ready rows that can expire): it
  never reads the rows that cannot expire nor scans the table;
- the queue-expiry sweep walks ``ix_queues_idle_expires_at``;
- "which queues name this exchange as dead-letter exchange" (deleting it: 409) walks
  ``ix_queues_dead_letter_exchange``;
- the claim still walks ``ix_messages_claim`` with expiring rows at the head of its queue.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import TextClause

from app.storage import deliveries, queries, topology
from app.storage.dsn import asyncpg_dsn
from app.storage.fastpath import Statement
from tests.integration.test_query_plans import MODES, _plan, _scans, claim_params

BACKLOG = 50_000
QUEUES = 20_000


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        plain = await c.fetchval("INSERT INTO queues (name) VALUES ('plain') RETURNING id")
        ttl = await c.fetchval(
            "INSERT INTO queues (name, arguments) VALUES ('ttl', '{\"x-message-ttl\": 60000}')"
            " RETURNING id"
        )
        # Many queues, few of them with x-expires or a dead-letter exchange.
        await c.execute(
            """
            INSERT INTO queues (name, arguments, idle_expires_at)
            SELECT 'q' || g,
                   CASE WHEN g % 100 = 0 THEN '{"x-dead-letter-exchange": "amq.direct"}'::jsonb
                        ELSE '{}'::jsonb END,
                   CASE WHEN g % 100 = 1 THEN now() + interval '1 hour' END
            FROM generate_series(1, $1) AS g
            """,
            QUEUES,
        )
        # A backlog that never expires, and one that expires in a minute.
        await c.execute(
            """
            INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, expires_at)
            SELECT CASE WHEN g % 10 = 0 THEN $2::bigint ELSE $1::bigint END, 'm' || g, '',
                   'k', '\\x00',
                   CASE WHEN g % 10 = 0 THEN now() + interval '1 minute' END
            FROM generate_series(1, $3) AS g
            """,
            plain,
            ttl,
            BACKLOG,
        )
        await c.execute("ANALYZE messages")
        await c.execute("ANALYZE queues")
        yield c
    finally:
        await c.close()


def _statement(clause: TextClause) -> Statement:
    return Statement(clause)


def _uses(nodes: list[dict[str, Any]], relation: str, index: str) -> bool:
    reads = [n for n in nodes if n.get("Relation Name") == relation]
    return any(n.get("Index Name") == index for n in reads) and not any(
        n["Node Type"] == "Seq Scan" for n in reads
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("clause", "params"),
    [
        (deliveries.LOCK_EXPIRED_READY, {"n": 2000}),  # the copies that take the retry path
        (deliveries.ANY_EXPIRED_READY, {"lead_s": 0}),  # the idle sweep's probe
        (deliveries.DISCARD_EXPIRED, {"n": 25_000}),  # the bulk delete (EXPIRY_DISCARD_BATCH)
    ],
    ids=["lock", "probe", "discard"],
)
async def test_the_expiry_sweep_walks_its_partial_index(
    conn: asyncpg.Connection, mode: str, clause: TextClause, params: dict[str, Any]
) -> None:
    nodes = await _plan(conn, _statement(clause), params, mode)
    assert _uses(nodes, "messages", "ix_messages_expiry"), nodes


@pytest.mark.parametrize("mode", MODES)
async def test_the_queue_expiry_sweep_walks_its_index(conn: asyncpg.Connection, mode: str) -> None:
    nodes = await _plan(conn, _statement(topology._IDLE_QUEUES), {"n": 500}, mode)
    assert _uses(nodes, "queues", "ix_queues_idle_expires_at"), nodes


@pytest.mark.parametrize("mode", MODES)
async def test_the_dead_letter_exchange_lookup_walks_its_index(
    conn: asyncpg.Connection, mode: str
) -> None:
    nodes = await _plan(conn, _statement(topology._DEAD_LETTERING_TO), {"name": "amq.direct"}, mode)
    assert _uses(nodes, "queues", "ix_queues_dead_letter_exchange"), nodes


@pytest.mark.parametrize("mode", MODES)
async def test_the_claim_of_an_expiring_queue_walks_its_index(
    conn: asyncpg.Connection, mode: str
) -> None:
    queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = 'ttl'")
    params = claim_params(queue_id)
    scans = _scans(await _plan(conn, queries.CLAIM, params, mode))
    assert any(n.get("Index Name") == "ix_messages_claim" for n in scans), scans
    assert not any(n["Node Type"] == "Seq Scan" for n in scans), scans


@pytest.mark.parametrize("mode", MODES)
async def test_the_bulk_expiry_delete_stops_after_its_batch(
    conn: asyncpg.Connection, mode: str
) -> None:
    """With many copies expired at once, each DISCARD_EXPIRED batch walks ix_messages_expiry
    in order and stops after its :n rows: no sort of every expired copy (as a join to queues
    planned it, once per batch), however many have expired."""
    ttl = await conn.fetchval("SELECT id FROM queues WHERE name = 'ttl'")
    transaction = conn.transaction()
    await transaction.start()
    try:
        await conn.execute(
            """
            INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, expires_at)
            SELECT $1, 'gone' || g, '', 'k', '\\x00', now() - interval '1 minute'
            FROM generate_series(1, 30000) AS g
            """,
            ttl,
        )
        await conn.execute("ANALYZE messages")
        nodes = await _plan(conn, _statement(deliveries.DISCARD_EXPIRED), {"n": 25_000}, mode)
        # an index scan, or a bitmap of the expired entries whose heap read the Limit stops
        assert "ix_messages_expiry" in {n.get("Index Name") for n in nodes}, nodes
        assert not [n for n in _scans(nodes) if n["Node Type"] == "Seq Scan"], nodes
        assert not [n for n in nodes if n["Node Type"] in ("Sort", "Hash Join")], nodes
    finally:
        await transaction.rollback()
