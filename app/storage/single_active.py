"""Single active consumer (contract §13, ``x-single-active-consumer``): the statements.

The subscription rows are the registry: of a queue's live subscriptions the oldest
(``created_at``, then connection id) is the one that may become active. Which one *is*
active is ``single_active_holders``: the connection the queue's deliveries go to. A holder
row outlives its subscription; the next oldest takes over (``PROMOTE``) only once none of the
holder's deliveries of the queue is in flight, so the queue's order is kept across the
hand-over, and the holder never changes while it may still claim.

Everything that reads or changes who is active runs under the queue's transaction-scoped
advisory lock (``LOCK``), taken by a statement of its own so that the statements after it
see every commit made before it was granted (READ COMMITTED takes a snapshot per statement):

- a subscription's registration (its ``created_at`` is ``clock_timestamp()``, taken under
  the lock, so "oldest" is the order in which subscriptions committed) and its first
  promotion;
- each claim for a subscriber (``GATE`` then ``queries.CLAIM``): it claims only while its
  subscription is the oldest live one *and* the holder, in a snapshot taken after every
  earlier claim and promotion committed. Two subscriptions can never both pass: only one is
  oldest, and a new holder needs the old one's in-flight copies gone, which a claim of the
  old one that committed before would have left in flight;
- a pull ``get``: refused (409) while the queue has a subscription;
- promotions (``PROMOTE``), for many queues at once, locks taken in queue id order.

Queues without the argument never run any of this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.storage import presence, queries
from app.storage.deliveries import (
    ClaimArgs,
    Claimed,
    claim_params,
    claimed_rows,
    group_claim_params,
)
from app.storage.fastpath import HotPath, Statement

# The queues' locks, in queue id order (PostgreSQL evaluates a volatile function of the
# target list after the ORDER BY), so that two multi-queue promotions cannot deadlock.
_LOCK_SQL = """
SELECT pg_advisory_xact_lock(hashtextextended('messagex.sac:' || k.q::text, 0))
FROM unnest(CAST(:queue_ids AS bigint[])) AS k(q)
ORDER BY k.q
"""
LOCK = text(_LOCK_SQL)
LOCK_HOT = Statement(text(_LOCK_SQL))

# The oldest live subscription of queue ``{q}`` (ix_subscriptions_queue_id: a queue has few).
_OLDEST = """(SELECT s.connection_id FROM subscriptions AS s WHERE s.queue_id = {q}
              ORDER BY s.created_at, s.connection_id LIMIT 1)"""

# May :connection claim from :queue_id now? It is the holder and its subscription the oldest.
GATE = Statement(
    text(f"""
SELECT coalesce(
    (SELECT h.connection_id FROM single_active_holders AS h WHERE h.queue_id = :queue_id)
        = CAST(:connection AS uuid)
    AND {_OLDEST.format(q=":queue_id")} = CAST(:connection AS uuid),
    false)
""")
)

# A pull get is refused while the queue has any subscription (active, or waiting to be).
HAS_SUBSCRIPTION = Statement(
    text("SELECT EXISTS (SELECT 1 FROM subscriptions WHERE queue_id = :queue_id)")
)

# Each candidate (queue, connection) whose subscription is the queue's oldest becomes its
# holder, unless another holder still has deliveries of the queue in flight (one probe of
# ix_messages_owner, partial on in-flight rows: as many rows as that holder has in flight).
# Returns the candidates that are now holders (a holder again included).
PROMOTE = text(f"""
WITH c AS (
    SELECT * FROM unnest(CAST(:queue_ids AS bigint[]), CAST(:connections AS uuid[]))
        AS c(queue_id, connection_id)
),
ready AS (
    SELECT c.queue_id, c.connection_id FROM c
    WHERE c.connection_id = {_OLDEST.format(q="c.queue_id")}
      AND NOT EXISTS (
          SELECT 1 FROM single_active_holders AS h
          JOIN messages AS m ON m.owner_connection = h.connection_id
          WHERE h.queue_id = c.queue_id AND h.connection_id <> c.connection_id
            AND m.status = 'in_flight' AND m.queue_id = c.queue_id)
)
INSERT INTO single_active_holders AS h (queue_id, connection_id)
SELECT queue_id, connection_id FROM ready
ON CONFLICT (queue_id) DO UPDATE SET connection_id = EXCLUDED.connection_id,
    since = CASE WHEN h.connection_id = EXCLUDED.connection_id THEN h.since ELSE now() END
RETURNING queue_id, connection_id::text
""")


async def register(
    conn: AsyncConnection, *, connection_id: str, queue_id: int, process_id: str, prefetch: int
) -> bool:
    """Register a subscription to a single-active queue in the caller's transaction;
    returns whether it is active at once (else it waits)."""
    await conn.execute(LOCK, {"queue_ids": [queue_id]})
    await presence.add_subscription(
        conn,
        connection_id=connection_id,
        queue_id=queue_id,
        process_id=process_id,
        prefetch=prefetch,
    )
    return bool(await _promote(conn, [(queue_id, connection_id)]))


async def promote(
    conn: AsyncConnection, candidates: Sequence[tuple[int, str]]
) -> set[tuple[int, str]]:
    """Make each (queue id, connection) whose subscription is its queue's oldest the holder,
    where the previous holder has nothing of the queue in flight; returns those that are.
    Run it in a transaction of its own: the locks are held until it ends."""
    if not candidates:
        return set()
    await conn.execute(LOCK, {"queue_ids": sorted({q for q, _ in candidates})})
    return await _promote(conn, candidates)


async def _promote(
    conn: AsyncConnection, candidates: Sequence[tuple[int, str]]
) -> set[tuple[int, str]]:
    rows = await conn.execute(
        PROMOTE,
        {"queue_ids": [q for q, _ in candidates], "connections": [c for _, c in candidates]},
    )
    return {(int(r[0]), str(r[1])) for r in rows}


async def claim(
    hot: HotPath,
    *,
    queue_id: int,
    n: int,
    lease_seconds: float,
    process_id: str,
    connection: str,
    groups: bool = False,
) -> list[Claimed] | None:
    """Claim up to ``n`` for ``connection``'s subscription, if it is the active one; None
    when it is not (it was taken over). ``groups``: the queue has ``x-message-groups`` (the
    queue's lock here serialises its claims as the group claim needs)."""
    params = (group_claim_params if groups else claim_params)(
        queue_id=queue_id,
        n=n,
        lease_seconds=lease_seconds,
        process_id=process_id,
        owners=[connection] * n,
        owner_user=None,
    )
    gate = {"queue_id": queue_id, "connection": connection}
    return await _claim_if(hot, params, GATE, gate, passes=True)


async def claim_pull(
    hot: HotPath, *, groups: bool = False, **args: Unpack[ClaimArgs]
) -> list[Claimed] | None:
    """A pull claim from a single-active queue; None (claiming nothing) while the queue has a
    subscription."""
    check = {"queue_id": args["queue_id"]}
    params = group_claim_params(**args) if groups else claim_params(**args)
    return await _claim_if(hot, params, HAS_SUBSCRIPTION, check, passes=False)


async def _claim_if(
    hot: HotPath,
    params: dict[str, Any],
    test: Statement,
    test_params: dict[str, Any],
    *,
    passes: bool,
) -> list[Claimed] | None:
    """Under the queue's lock: ``queries.CLAIM`` with ``params`` if ``test`` answers
    ``passes``, else None."""
    async with hot.connection() as conn, conn.transaction():
        queue_ids = [params["queue_id"]]
        await conn.fetch(LOCK_HOT.sql, *LOCK_HOT.args({"queue_ids": queue_ids}))
        if bool(await conn.fetchval(test.sql, *test.args(test_params))) is not passes:
            return None
        claim = queries.CLAIM_GROUPS if "scan" in params else queries.CLAIM
        rows = await conn.fetch(claim.sql, *claim.args(params))
    return claimed_rows(rows)
