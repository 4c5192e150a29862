"""Idempotent publish (contract §15): the statements on ``publish_dedup``.

One row per (queue, message_id) published into a queue declared with
``x-deduplication-window-seconds`` (migration 0011), kept while the window lasts. Only such
queues come here: a plain queue's publish never runs any of this.

Each runs on an asyncpg connection in the caller's transaction: the publish's own on the
hot path's stable pool (every plan of these statements is safe: they read nothing of
``messages``; storage/planner.py), or the length-limited publish's (storage/limits.py).

- ``claim``: in the publish's transaction, before its INSERT of copies, one statement claims
  the row of every copy bound for a windowed queue. A row that is absent, or older than its
  queue's window, is (re)written: that copy is stored. A row within the window is left
  alone: the copy is a duplicate, and the statement answers with it. Two transactions
  claiming one (queue, message_id) serialise on the primary key: the second waits for the
  first to end and then sees its row (a duplicate) or, after a rollback, none (it claims).
  Every claim takes its rows in (queue_id, message_id) order, so two publishes never wait on
  each other in a cycle.
- ``release``: in the same transaction, the claims of copies the length rule then rejected
  (``x-overflow`` reject-publish*): a copy that was not stored does not burn its message_id
  (docs/decisions.md).
- ``sweep``: rows older than their queue's window go, in bounded batches, by the sweep index
  (migration 0013). The window is read from the queue's arguments in SQL, so the broker's
  claim, the SQL functions' claim (contract §18) and the sweep use one value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
from sqlalchemy import text

from app.errors import InternalError
from app.storage.driver_errors import FK_PUBLISH_DEDUP_QUEUE, constraint
from app.storage.fastpath import HotPath, Statement
from app.storage.messages import QueueDeleted

_WINDOW = "CAST(q.arguments ->> 'x-deduplication-window-seconds' AS bigint) * interval '1 second'"

# ON CONFLICT DO UPDATE ... WHERE: the row is rewritten (and returned by the INSERT) only
# when it is older than the queue's window (one probe of the queues' primary key, only for a
# conflicting row); otherwise the conflicting row is locked, left as it is, and not returned.
# published_at is statement_timestamp() (the column's default): the clock of every claim and
# of the sweep. ORDER BY: the rows are taken in one order by every claim (no deadlock
# between two of ours). The statement answers with the 1-based ordinals of the keys NOT
# claimed — the duplicates — so the common answer is no row at all.
CLAIM = Statement(
    text(f"""
WITH k AS (
    SELECT * FROM unnest(CAST(:queue_id AS bigint[]), CAST(:message_id AS text[]))
             WITH ORDINALITY AS k(queue_id, message_id, ord)
),
claimed AS (
    INSERT INTO publish_dedup AS d (queue_id, message_id)
    SELECT k.queue_id, k.message_id FROM k ORDER BY k.queue_id, k.message_id COLLATE "C"
    ON CONFLICT (queue_id, message_id) DO UPDATE SET published_at = EXCLUDED.published_at
    WHERE d.published_at <= EXCLUDED.published_at
                            - (SELECT {_WINDOW} FROM queues AS q WHERE q.id = d.queue_id)
    RETURNING d.queue_id, d.message_id
)
SELECT k.ord FROM k
WHERE NOT EXISTS (SELECT FROM claimed AS c
                  WHERE c.queue_id = k.queue_id AND c.message_id = k.message_id)
""")
)

# This transaction's own claims, undone: the rows it wrote (whether new or rewritten over a
# row older than the window, which the sweep would delete anyway).
RELEASE = Statement(
    text("""
DELETE FROM publish_dedup AS d
USING unnest(CAST(:queue_id AS bigint[]), CAST(:message_id AS text[])) AS c(queue_id, message_id)
WHERE d.queue_id = c.queue_id AND d.message_id = c.message_id
""")
)

# Up to :batch rows older than their queue's window, in ONE statement that never waits:
# - ``owners``: the queues that have rows, found by skipping through the sweep index's first
#   column (a recursive "loose index scan": one probe per such queue; none on an empty table);
# - for each, its rows older than its own window: one range of ix_publish_dedup_sweep, oldest
#   first, locked SKIP LOCKED (a row a claim holds is being rewritten; it is not stale);
# - a queue whose arguments carry no numeric window (none is claimed for) keeps no rows;
# - the locked rows go by their ctid (a TID scan; locked, they cannot move meanwhile): as a
#   join, the planner hashed a scan of the whole table for a thousand rows.
# A claim that waits on a row this deletes inserts it afresh once this commits.
SWEEP = Statement(
    text(f"""
WITH RECURSIVE owners(queue_id) AS (
    (SELECT queue_id FROM publish_dedup ORDER BY queue_id LIMIT 1)
  UNION ALL
    SELECT (SELECT d.queue_id FROM publish_dedup AS d
            WHERE d.queue_id > o.queue_id ORDER BY d.queue_id LIMIT 1)
    FROM owners AS o WHERE o.queue_id IS NOT NULL
),
stale AS (
    SELECT s.ctid
    FROM owners AS o
    JOIN queues AS q ON q.id = o.queue_id
    CROSS JOIN LATERAL (
        SELECT d.ctid FROM publish_dedup AS d
        WHERE d.queue_id = o.queue_id
          AND d.published_at < statement_timestamp() - CASE
                WHEN jsonb_typeof(q.arguments -> 'x-deduplication-window-seconds') = 'number'
                THEN {_WINDOW} ELSE interval '0' END
        ORDER BY d.published_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    ) AS s
    LIMIT :batch
)
DELETE FROM publish_dedup WHERE ctid = ANY(ARRAY(SELECT ctid FROM stale))
""")
)


class ClaimDeadlocked(InternalError):
    """The claim was a deadlock's victim (40P01: only a transaction of the application's own,
    contract §18, can claim in another order than ours); nothing was stored and the publish
    may run again."""


def _keys(keys: Sequence[tuple[int, str]]) -> dict[str, Any]:
    return {"queue_id": [k[0] for k in keys], "message_id": [k[1] for k in keys]}


async def claim(conn: asyncpg.Connection, keys: Sequence[tuple[int, str]]) -> set[int]:
    """Claim (queue id, message_id) ``keys`` (distinct) in ``conn``'s transaction; returns
    the indexes of those NOT claimed: duplicates within their queue's window. Raises
    QueueDeleted when a queue no longer exists (nothing stored), ClaimDeadlocked."""
    if not keys:
        return set()
    try:
        rows = await conn.fetch(CLAIM.sql, *CLAIM.args(_keys(keys)))
    except asyncpg.ForeignKeyViolationError as exc:
        if constraint(exc) == FK_PUBLISH_DEDUP_QUEUE:
            raise QueueDeleted() from None
        raise
    except asyncpg.DeadlockDetectedError:
        raise ClaimDeadlocked() from None
    return {int(r[0]) - 1 for r in rows}


async def release(conn: asyncpg.Connection, keys: Sequence[tuple[int, str]]) -> None:
    """Undo this transaction's claims of ``keys``."""
    if keys:
        await conn.execute(RELEASE.sql, *RELEASE.args(_keys(keys)))


async def sweep(hot: HotPath, batch: int) -> int:
    """Delete up to ``batch`` rows older than their queue's window; returns how many."""
    async with hot.connection() as conn:
        status: str = await conn.execute(SWEEP.sql, *SWEEP.args({"batch": batch}))
    return int(status.rsplit(" ", 1)[-1])
