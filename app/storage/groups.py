"""Ordered message groups (contract §16) as the operator sees them: which groups of a queue are
blocked, and by which delivery. The claim itself is ``queries.CLAIM_GROUPS``.

For diagnosis (contract §19, ``group_blocked``): a group is blocked when a copy of it is in
flight and another waits ready behind it. One probe of ``ix_messages_group_busy`` per in-flight
copy with a group id (as many as the queue's deliveries in flight, at most), and one probe of
``ix_messages_group_head`` each; never a walk of the backlog.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# The oldest deliveries first: the group blocked longest leads.
BLOCKED_GROUPS = text("""
SELECT f.group_id, f.id, f.delivered_at, f.delivery_count, f.owner_connection::text,
       f.owner_user, h.id
FROM messages AS f
CROSS JOIN LATERAL (SELECT h.id FROM messages AS h
                    WHERE h.queue_id = f.queue_id AND h.group_id = f.group_id
                      AND h.status = 'ready'
                    ORDER BY h.priority DESC, h.available_at, h.id LIMIT 1) AS h
WHERE f.queue_id = :queue_id AND f.status = 'in_flight' AND f.group_id IS NOT NULL
ORDER BY f.delivered_at, f.id
LIMIT :n
""")


@dataclass(frozen=True, slots=True)
class BlockedGroup:
    """A group whose next copy waits for one in flight."""

    group_id: str
    #: the copy in flight (the head) and its delivery
    in_flight_id: int
    delivered_at: datetime
    delivery_count: int
    #: who holds it: a WebSocket connection, or (pull) a user
    owner_connection: str | None
    owner_user: str | None
    #: the copy that goes next once the head is settled
    next_id: int


async def blocked_groups(conn: AsyncConnection, queue_id: int, n: int = 10) -> list[BlockedGroup]:
    """Up to ``n`` blocked groups of the queue, longest blocked first (any queue: in one
    without ``x-message-groups`` nothing is held back, and the caller should not ask)."""
    rows = (await conn.execute(BLOCKED_GROUPS, {"queue_id": queue_id, "n": n})).all()
    return [BlockedGroup(*r) for r in rows]
