"""WebSocket connections of every broker process (contract §20): the list and the look-up.

A connection's row lives in ``websocket_connections`` while it is open (migration 0006), its
subscriptions in ``subscriptions``; a process whose heartbeat is stale is dead and its rows
no longer count. A page walks the primary key from the cursor; each connection's
subscriptions come with what they hold (``ix_messages_owner``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.presence import PROCESS_STALE_AFTER


@dataclass(frozen=True, slots=True)
class ConnectionSubscription:
    queue: str
    prefetch: int
    unacked: int
    active: bool


@dataclass(frozen=True, slots=True)
class ConnectionRow:
    connection_id: str
    username: str
    client_address: str | None
    process: str
    connected_at: datetime
    subscriptions: list[ConnectionSubscription]


_LIVE = "p.heartbeat_at > now() - make_interval(secs => :stale)"

LIST = text(f"""
SELECT c.connection_id::text, c.username, c.client_address, c.process_id::text, c.created_at,
       coalesce(subs.items, '[]'::jsonb)
FROM websocket_connections AS c
JOIN broker_processes AS p ON p.id = c.process_id AND {_LIVE}
LEFT JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'queue', q.name, 'prefetch', s.prefetch, 'unacked', held.n,
               'active', NOT (q.arguments @> '{{"x-single-active-consumer": true}}')
                         OR h.connection_id IS NOT DISTINCT FROM s.connection_id)
           ORDER BY q.name) AS items
    FROM subscriptions AS s
    JOIN queues AS q ON q.id = s.queue_id
    LEFT JOIN single_active_holders AS h ON h.queue_id = s.queue_id
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM messages AS m
                        WHERE m.owner_connection = s.connection_id AND m.status = 'in_flight'
                          AND m.queue_id = s.queue_id) AS held
    WHERE s.connection_id = c.connection_id
) AS subs ON true
WHERE (CAST(:after AS uuid) IS NULL OR c.connection_id > CAST(:after AS uuid))
  AND (CAST(:contains AS text) IS NULL OR strpos(c.username, :contains) > 0)
ORDER BY c.connection_id
LIMIT :limit
""")

# Mark a live process's connection for closing: its heartbeat closes it if the cluster event
# does not (contract §20: within 5 s).
REQUEST_CLOSE = text(f"""
UPDATE websocket_connections AS c SET close_requested_at = now()
FROM broker_processes AS p
WHERE c.connection_id = CAST(:id AS uuid) AND p.id = c.process_id AND {_LIVE}
RETURNING c.process_id::text
""")


def _row(r: Any) -> ConnectionRow:
    return ConnectionRow(
        connection_id=r[0],
        username=r[1],
        client_address=r[2],
        process=r[3],
        connected_at=r[4],
        subscriptions=[
            ConnectionSubscription(s["queue"], s["prefetch"], s["unacked"], s["active"])
            for s in r[5]
        ],
    )


async def list_connections(
    conn: AsyncConnection, *, limit: int, after: str | None, contains: str | None = None
) -> list[ConnectionRow]:
    params = {
        "limit": limit,
        "after": after,
        "contains": contains,
        "stale": PROCESS_STALE_AFTER.total_seconds(),
    }
    return [_row(r) for r in await conn.execute(LIST, params)]


async def request_close(conn: AsyncConnection, connection_id: str) -> str | None:
    """Mark ``connection_id`` for closing; the live process holding it, None when none does."""
    params = {"id": connection_id, "stale": PROCESS_STALE_AFTER.total_seconds()}
    row = (await conn.execute(REQUEST_CLOSE, params)).first()
    return None if row is None else str(row[0])
