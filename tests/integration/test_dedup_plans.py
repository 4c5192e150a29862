"""Contract §15's bookkeeping stays cheap, whatever it holds (``EXPLAIN (FORMAT JSON)``,
custom and generic plans, statistics by ANALYZE), and the sweep deletes exactly the rows
older than their own queue's window:

- the sweep finds the queues that have rows by probing ``ix_publish_dedup_sweep`` (never a
  scan of the table), reads each queue's stale rows as one range of it and deletes them by
  ctid; with a long window's rows in front of a short window's, it deletes the short one's
  stale rows and no other;
- the claim reads nothing of the table but its primary key (the ON CONFLICT arbiter).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from app.storage import dedup
from app.storage.dsn import asyncpg_dsn
from tests.integration.test_query_plans import MODES, _plan

ROWS = 20_000


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        # A one-day window full of rows up to an hour old, and a 60 s window whose rows are
        # as old: the short window's stale rows lie behind the long one's live rows by age.
        await c.execute(
            """
            INSERT INTO queues (name, arguments) VALUES
              ('day', '{"x-deduplication-window-seconds": 86400}'),
              ('minute', '{"x-deduplication-window-seconds": 60}')
            """
        )
        await c.execute(
            """
            INSERT INTO publish_dedup (queue_id, message_id, published_at)
            SELECT q.id, 'm' || g, now() - (g % 3600) * interval '1 second'
            FROM queues AS q, generate_series(1, $1) AS g
            WHERE q.name IN ('day', 'minute')
            """,
            ROWS,
        )
        await c.execute("ANALYZE publish_dedup")
        await c.execute("ANALYZE queues")
        yield c
    finally:
        await c.close()


def _reads(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        n
        for n in nodes
        if n.get("Relation Name") == "publish_dedup" and n["Node Type"] != "ModifyTable"
    ]


async def _count(conn: asyncpg.Connection, queue: str) -> int:
    found: int = await conn.fetchval(
        "SELECT count(*) FROM publish_dedup d JOIN queues q ON q.id = d.queue_id WHERE q.name = $1",
        queue,
    )
    return found


@pytest.mark.parametrize("mode", MODES)
async def test_the_sweep_probes_its_index(conn: asyncpg.Connection, mode: str) -> None:
    reads = _reads(await _plan(conn, dedup.SWEEP, {"batch": 1000}, mode))
    assert reads, reads
    found = {(n["Node Type"], n.get("Index Name")) for n in reads}
    # the queues that have rows, each queue's stale range, then the locked rows by ctid
    assert found <= {
        ("Index Only Scan", "ix_publish_dedup_sweep"),
        ("Index Scan", "ix_publish_dedup_sweep"),
        ("Tid Scan", None),
    }, found
    assert ("Index Scan", "ix_publish_dedup_sweep") in found, found


async def test_the_sweep_deletes_only_rows_older_than_their_window(
    conn: asyncpg.Connection,
) -> None:
    stale = await conn.fetchval(
        "SELECT count(*) FROM publish_dedup d JOIN queues q ON q.id = d.queue_id "
        "WHERE q.name = 'minute' AND d.published_at < now() - interval '60 seconds'"
    )
    assert stale > 1000
    statement = dedup.SWEEP
    deleted = 0
    while True:
        status = await conn.execute(statement.sql, *statement.args({"batch": 1000}))
        done = int(status.rsplit(" ", 1)[-1])
        assert done <= 1000
        deleted += done
        if done < 1000:
            break
    assert deleted >= stale
    assert await _count(conn, "day") == ROWS
    left = await _count(conn, "minute")
    assert 0 < left <= ROWS - stale
    assert not await conn.fetchval(
        "SELECT count(*) FROM publish_dedup d JOIN queues q ON q.id = d.queue_id "
        "WHERE q.name = 'minute' AND d.published_at < now() - interval '61 seconds'"
    )


@pytest.mark.parametrize("mode", MODES)
async def test_the_claim_probes_the_primary_key(conn: asyncpg.Connection, mode: str) -> None:
    queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = 'day'")
    params = {"queue_id": [queue_id] * 3, "message_id": ["m1", "m2", "new"]}
    async with conn.transaction():
        nodes = await _plan(conn, dedup.CLAIM, params, mode)
    assert not _reads(nodes), nodes  # nothing but the insert's own arbiter probe
    conflict = [n for n in nodes if n["Node Type"] == "ModifyTable"]
    assert conflict, nodes
    assert conflict[0].get("Conflict Arbiter Indexes") == ["pk_publish_dedup"], nodes
