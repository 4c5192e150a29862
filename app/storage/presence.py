"""Presence: which broker processes are alive (their heartbeat), and which subscriptions live
on them. Every statement about ``broker_processes``, and the subscription rows that die with
their process, is here; so is the one SQL form of "alive" that queue stats and the overview
count with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from app.domain.presence import PROCESS_STALE_AFTER


def is_live(heartbeat_at: ColumnElement[Any]) -> ColumnElement[bool]:
    """``heartbeat_at`` (of ``broker_processes``) is recent enough, on the database clock."""
    return heartbeat_at > func.now() - PROCESS_STALE_AFTER


REGISTER_PROCESS = text("""
INSERT INTO broker_processes (id, hostname, pid) VALUES (:id, :hostname, :pid)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
""")
HEARTBEAT = text("""
UPDATE broker_processes SET heartbeat_at = now(), connections = :connections WHERE id = :id
""")
# A process whose heartbeat is older than :stale seconds is dead; its subscriptions go with
# it (ON DELETE CASCADE) and the caller releases what it held.
REAP = text("""
DELETE FROM broker_processes
WHERE heartbeat_at < now() - make_interval(secs => :stale) AND id <> :me
RETURNING id::text
""")
UNREGISTER_PROCESS = text("DELETE FROM broker_processes WHERE id = :id")
# created_at is the clock when the row is written (not the transaction's start): under the
# queue's lock that a single-active queue's registration holds, it orders subscriptions by
# commit (storage/single_active.py).
ADD_SUBSCRIPTION = text("""
INSERT INTO subscriptions (connection_id, queue_id, process_id, prefetch, created_at)
VALUES (:connection_id, :queue_id, :process_id, :prefetch, clock_timestamp())
ON CONFLICT DO NOTHING
""")
# A queue with x-expires whose subscription ends starts its idle time again (contract §13);
# the rows of other queues (idle_expires_at NULL) are not written.
_TOUCH_ENDED = """UPDATE queues SET idle_expires_at =
        now() + CAST(queues.arguments ->> 'x-expires' AS bigint) * interval '1 millisecond'
    FROM gone WHERE queues.id = gone.queue_id AND queues.idle_expires_at IS NOT NULL"""
REMOVE_SUBSCRIPTION = text(f"""
WITH gone AS (
    DELETE FROM subscriptions WHERE connection_id = :connection_id AND queue_id = :queue_id
    RETURNING queue_id
)
{_TOUCH_ENDED}
""")
REMOVE_CONNECTION = text(f"""
WITH gone AS (DELETE FROM subscriptions WHERE connection_id = :connection_id
              RETURNING queue_id),
touched AS ({_TOUCH_ENDED})
DELETE FROM websocket_connections WHERE connection_id = :connection_id
""")
# Admission of a connection under a per-user lock held to the commit: concurrent upgrades of
# one user (on any process) count one after the other. Each statement in READ COMMITTED sees
# what committed before it started, so the count, run once the lock is held, sees every row
# inserted under it.
LOCK_USER_CONNECTIONS = text(
    "SELECT pg_advisory_xact_lock(hashtextextended('messagex.ws:' || :username, 0))"
)
ADMIT_CONNECTION = text("""
INSERT INTO websocket_connections (connection_id, process_id, username)
SELECT :connection_id, :process_id, :username
WHERE (SELECT count(*) FROM websocket_connections WHERE username = :username) < :limit
ON CONFLICT DO NOTHING
""")
ADD_CONNECTION = text("""
INSERT INTO websocket_connections (connection_id, process_id, username)
VALUES (:connection_id, :process_id, :username)
ON CONFLICT DO NOTHING
""")


async def register_process(conn: AsyncConnection, id: str, hostname: str, pid: int) -> None:
    await conn.execute(REGISTER_PROCESS, {"id": id, "hostname": hostname, "pid": pid})


async def rejoin(
    conn: AsyncConnection,
    id: str,
    hostname: str,
    pid: int,
    subscriptions: Sequence[tuple[str, int, int]],
    connections: Sequence[tuple[str, str]] = (),
) -> None:
    """Register again a process that was taken for dead, with its live ``subscriptions``
    (connection id, queue id, prefetch) and ``connections`` (connection id, username)."""
    await register_process(conn, id, hostname, pid)
    for connection_id, username in connections:
        await conn.execute(
            ADD_CONNECTION,
            {"connection_id": connection_id, "process_id": id, "username": username},
        )
    for connection_id, queue_id, prefetch in subscriptions:
        await add_subscription(
            conn, connection_id=connection_id, queue_id=queue_id, process_id=id, prefetch=prefetch
        )


async def heartbeat(conn: AsyncConnection, id: str, connections: int) -> bool:
    """Write this process's heartbeat; False when its row is gone (it was taken for dead)."""
    result = await conn.execute(HEARTBEAT, {"id": id, "connections": connections})
    return bool(result.rowcount)


async def reap_dead_processes(conn: AsyncConnection, me: str) -> list[str]:
    """Delete the processes other than ``me`` whose heartbeat is stale; returns their ids."""
    stale = PROCESS_STALE_AFTER.total_seconds()
    rows = (await conn.execute(REAP, {"me": me, "stale": stale})).all()
    return [str(r[0]) for r in rows]


async def unregister_process(conn: AsyncConnection, id: str) -> None:
    await conn.execute(UNREGISTER_PROCESS, {"id": id})


async def add_subscription(
    conn: AsyncConnection, *, connection_id: str, queue_id: int, process_id: str, prefetch: int
) -> bool:
    """Register a subscription; True: it is active (every subscription of a queue without a
    single active consumer is; storage/single_active.py registers those of the others)."""
    await conn.execute(
        ADD_SUBSCRIPTION,
        {
            "connection_id": connection_id,
            "queue_id": queue_id,
            "process_id": process_id,
            "prefetch": prefetch,
        },
    )
    return True


async def remove_subscription(conn: AsyncConnection, connection_id: str, queue_id: int) -> None:
    await conn.execute(REMOVE_SUBSCRIPTION, {"connection_id": connection_id, "queue_id": queue_id})


async def remove_connection(conn: AsyncConnection, connection_id: str) -> None:
    """Forget a closed connection: its subscription rows and its connection row."""
    await conn.execute(REMOVE_CONNECTION, {"connection_id": connection_id})


async def admit_connection(
    conn: AsyncConnection, *, connection_id: str, process_id: str, username: str, limit: int
) -> bool:
    """Record an authenticated WebSocket connection of ``username`` unless that user already
    has ``limit`` of them on all processes together; False when refused. Run it in a
    transaction of its own: the per-user lock is held until it ends."""
    params = {"username": username}
    await conn.execute(LOCK_USER_CONNECTIONS, params)
    result = await conn.execute(
        ADMIT_CONNECTION,
        {**params, "connection_id": connection_id, "process_id": process_id, "limit": limit},
    )
    return bool(result.rowcount)
