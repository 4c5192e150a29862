"""The claim of the queues whose delayed copies fall due together (``queries.CLAIM_DUE``,
``deliveries.claim_due``, issue 19) against a real PostgreSQL: each queue's copies in its own
claim order to its own owners, never a copy that is not due, never one another transaction
holds, and each queue's next due time in the same statement."""

from __future__ import annotations

import uuid

import asyncpg

from app.storage import deliveries
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn
from tests.integration.test_handoff import queues, rows

PROCESS = str(uuid.uuid4())

#: a copy of queue $1 named $2 due $3 seconds from now (negative: already due), priority $4
COPY = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, available_at, priority)
VALUES ($1, $2, '', 'k', '\\x00', now() + make_interval(secs => $3), $4)
"""


async def add(url: str, *copies: tuple[int, str, float, int | None]) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.executemany(COPY, copies)
    finally:
        await conn.close()


def owners(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


async def test_each_queue_gets_its_due_copies_in_its_claim_order_and_its_next_due(
    db: Database, database_url: str
) -> None:
    a, b, c, p = await queues(database_url, "a", "b", "c", "p")
    await add(
        database_url,
        (a, "a1", -3.0, None),
        (a, "a2", -2.0, None),
        (a, "a3", -1.0, None),
        (a, "a-later", 60.0, None),
        (b, "b-later", 5.0, None),
        (b, "b1", -1.0, None),
        (c, "c-later", 30.0, None),
        (p, "p-low", -2.0, 1),
        (p, "p-high", -1.0, 9),
    )
    oa, ob, oc, op = owners(2), owners(3), owners(1), owners(2)
    found = await deliveries.claim_due(
        db.hot,
        [
            deliveries.ClaimWant(a, oa, 30.0),
            deliveries.ClaimWant(b, ob, 7.0),
            deliveries.ClaimWant(c, oc, 30.0),
            deliveries.ClaimWant(p, op, 30.0),
        ],
        PROCESS,
    )
    assert set(found) == {a, b, c, p}
    # a: two owners, three due copies: the first two in (available_at, id) order, slot by slot
    assert [(d.message_id, d.slot) for d in found[a].claimed] == [("a1", 0), ("a2", 1)]
    # b: one due copy for three owners; the delayed one is not taken
    assert [(d.message_id, d.slot) for d in found[b].claimed] == [("b1", 0)]
    assert found[c].claimed == []
    # p: priority first
    assert [d.message_id for d in found[p].claimed] == ["p-high", "p-low"]
    # next due: the first copy due after the statement (a's third copy is due now: not it)
    next_due = {q: found[q].next_due for q in (a, b, c, p)}
    assert next_due[p] is None
    for queue, seconds in ((a, 60.0), (b, 5.0), (c, 30.0)):
        due = next_due[queue]
        assert due is not None, queue
        assert seconds - 1.0 < due <= seconds, (queue, due)

    stored = {r["message_id"]: r for r in await rows(database_url)}
    for queue_owners, claimed in ((oa, found[a]), (ob, found[b]), (op, found[p])):
        for d in claimed.claimed:
            row = stored[d.message_id]
            assert row["status"] == "in_flight"
            assert row["delivery_tag"] == d.delivery_tag
            assert row["owner_connection"] == queue_owners[d.slot]
            assert row["owner_process"] == PROCESS
            assert row["delivery_count"] == 1
    assert stored["b1"]["lease"].total_seconds() == 7.0
    assert stored["a1"]["lease"].total_seconds() == 30.0
    for name in ("a3", "a-later", "b-later", "c-later"):
        assert stored[name]["status"] == "ready"


async def test_a_copy_another_transaction_holds_is_stepped_over(
    db: Database, database_url: str
) -> None:
    (q,) = await queues(database_url, "held")
    await add(database_url, (q, "first", -2.0, None), (q, "second", -1.0, None))
    other = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        async with other.transaction():
            await other.execute("SELECT id FROM messages WHERE message_id = 'first' FOR UPDATE")
            found = await deliveries.claim_due(
                db.hot, [deliveries.ClaimWant(q, owners(2), 30.0)], PROCESS
            )
    finally:
        await other.close()
    assert [d.message_id for d in found[q].claimed] == ["second"]
    # the held copy is due now, not later: nothing to wait for on the timer
    assert found[q].next_due is None
