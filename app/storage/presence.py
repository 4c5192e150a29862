"""Presence: which broker processes are alive (their heartbeat), and which subscriptions live
on them. Every statement about ``broker_processes``, and the subscription rows that die with
their process, is here; so is the one SQL form of "alive" that queue stats and the overview
count with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from app.domain.presence import LISTEN_GONE_STALE_AFTER, PROCESS_STALE_AFTER


def is_live(heartbeat_at: ColumnElement[Any]) -> ColumnElement[bool]:
    """``heartbeat_at`` (of ``broker_processes``) is recent enough, on the database clock."""
    return heartbeat_at > func.now() - PROCESS_STALE_AFTER


REGISTER_PROCESS = text("""
INSERT INTO broker_processes (id, hostname, pid) VALUES (:id, :hostname, :pid)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
""")
# Returns the connections of this process that an administrator asked to close (§20; the
# cluster event usually closed them already).
HEARTBEAT = text("""
UPDATE broker_processes SET heartbeat_at = now(), connections = :connections,
    listen_pid = :listen_pid, pool_in_use = :pool_in_use, pool_size = :pool_size
WHERE id = :id
RETURNING ARRAY(SELECT connection_id::text FROM websocket_connections
                WHERE process_id = :id AND close_requested_at IS NOT NULL)
""")
REPORT_LISTEN_PID = text("UPDATE broker_processes SET listen_pid = :listen_pid WHERE id = :id")
# The last settlement of the subscriptions that settled since the previous heartbeat (unix
# seconds): written here, once per heartbeat, never on the ACK path (diagnosis, §19).
RECORD_SETTLED = text("""
UPDATE subscriptions AS s SET last_ack_at = to_timestamp(u.at)
FROM unnest(CAST(:connections AS uuid[]), CAST(:queues AS bigint[]), CAST(:ats AS float8[]))
     AS u(connection_id, queue_id, at)
WHERE s.connection_id = u.connection_id AND s.queue_id = u.queue_id
""")
# A process is dead, and deleted here (its subscriptions go with it, ON DELETE CASCADE; the
# caller releases what it held), by either rule of app/domain/presence.py:
# - its heartbeat is older than :stale seconds (any set-up: the fallback);
# - fast: the backend of its LISTEN connection is gone from pg_stat_activity (PostgreSQL ends
#   a dead client's backend at once) and its heartbeat is older than :grace seconds (a live
#   process reconnecting its LISTEN keeps beating, and writes its new pid or NULL). Only for
#   a heartbeat written on this server since it last started: after a restart, or on a
#   standby promoted since (its last replayed commit is at or after that heartbeat), every
#   pid recorded before is gone while the processes live. And only while the reaper's own
#   LISTEN backend (:my_listen_pid) is found: through a pooler (PgBouncer) the pids a client
#   sees are not the server's, and the rule is off.
REAP = text("""
WITH dead AS (
    DELETE FROM broker_processes AS p
    WHERE p.id <> :me
      AND (p.heartbeat_at < now() - make_interval(secs => :stale)
           OR (p.listen_pid IS NOT NULL
               AND p.heartbeat_at < now() - make_interval(secs => :grace)
               AND p.heartbeat_at > pg_postmaster_start_time()
               AND p.heartbeat_at > coalesce(pg_last_xact_replay_timestamp(), '-infinity')
               AND EXISTS (SELECT 1 FROM pg_stat_activity AS a
                           WHERE a.pid = CAST(:my_listen_pid AS integer))
               AND NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a
                               WHERE a.pid = p.listen_pid)))
    RETURNING p.id
), ended AS (
    UPDATE queues SET unsubscribed_at = now()
    WHERE id IN (SELECT queue_id FROM subscriptions WHERE process_id IN (SELECT id FROM dead))
)
SELECT id::text FROM dead
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
# Every queue notes when a subscription of it ended (unsubscribed_at, diagnosis §19).
_TOUCH_ENDED = """UPDATE queues SET unsubscribed_at = now(), idle_expires_at =
        CASE WHEN queues.idle_expires_at IS NOT NULL THEN now()
             + CAST(queues.arguments ->> 'x-expires' AS bigint) * interval '1 millisecond' END
    FROM gone WHERE queues.id = gone.queue_id"""
# A queue's deletion locks its row (FOR UPDATE) and then, by cascade, its subscription rows;
# ending a subscription deletes the subscription row and then updates the queue's. Taken in
# those two orders, a queue deleted while a consumer of it disconnects deadlocks (seen at the
# end of benchmark runs). So the queue rows are locked first, in id order, as a deletion does.
LOCK_QUEUE = text("SELECT 1 FROM queues WHERE id = :queue_id FOR NO KEY UPDATE")
LOCK_QUEUES_OF_CONNECTION = text("""
SELECT id FROM queues
WHERE id IN (SELECT queue_id FROM subscriptions WHERE connection_id = :connection_id)
ORDER BY id FOR NO KEY UPDATE
""")
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
INSERT INTO websocket_connections (connection_id, process_id, username, client_address)
SELECT :connection_id, :process_id, :username, :client_address
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


@dataclass(frozen=True, slots=True)
class Report:
    """What a process tells the others with its heartbeat (diagnosis, contract §19)."""

    connections: int
    #: backend pid of its LISTEN connection, None while that is down
    listen_pid: int | None
    pool_in_use: int
    pool_size: int


async def heartbeat(conn: AsyncConnection, id: str, report: Report) -> list[str] | None:
    """Write this process's heartbeat; None when its row is gone (it was taken for dead),
    else the connections of this process to close (asked by an administrator)."""
    row = await conn.execute(
        HEARTBEAT,
        {
            "id": id,
            "connections": report.connections,
            "listen_pid": report.listen_pid,
            "pool_in_use": report.pool_in_use,
            "pool_size": report.pool_size,
        },
    )
    found = row.first()
    return None if found is None else list(found[0])


async def report_listen_pid(conn: AsyncConnection, id: str, listen_pid: int | None) -> None:
    await conn.execute(REPORT_LISTEN_PID, {"id": id, "listen_pid": listen_pid})


async def record_settled(conn: AsyncConnection, settled: Sequence[tuple[str, int, float]]) -> None:
    """Note the last settlement (unix seconds) of these (connection id, queue id) subscriptions."""
    if settled:
        await conn.execute(
            RECORD_SETTLED,
            {
                "connections": [c for c, _, _ in settled],
                "queues": [q for _, q, _ in settled],
                "ats": [a for _, _, a in settled],
            },
        )


async def reap_dead_processes(
    conn: AsyncConnection, me: str, my_listen_pid: int | None = None
) -> list[str]:
    """Delete the processes other than ``me`` that are dead (REAP's two rules; the fast one
    only with ``my_listen_pid``, this process's LISTEN backend); returns their ids."""
    params = {
        "me": me,
        "stale": PROCESS_STALE_AFTER.total_seconds(),
        "grace": LISTEN_GONE_STALE_AFTER.total_seconds(),
        "my_listen_pid": my_listen_pid,
    }
    rows = (await conn.execute(REAP, params)).all()
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
    await conn.execute(LOCK_QUEUE, {"queue_id": queue_id})
    await conn.execute(REMOVE_SUBSCRIPTION, {"connection_id": connection_id, "queue_id": queue_id})


async def remove_connection(conn: AsyncConnection, connection_id: str) -> None:
    """Forget a closed connection: its subscription rows and its connection row."""
    await conn.execute(LOCK_QUEUES_OF_CONNECTION, {"connection_id": connection_id})
    await conn.execute(REMOVE_CONNECTION, {"connection_id": connection_id})


async def admit_connection(
    conn: AsyncConnection,
    *,
    connection_id: str,
    process_id: str,
    username: str,
    limit: int,
    client_address: str | None = None,
) -> bool:
    """Record an authenticated WebSocket connection of ``username`` unless that user already
    has ``limit`` of them on all processes together; False when refused. Run it in a
    transaction of its own: the per-user lock is held until it ends."""
    params = {"username": username}
    await conn.execute(LOCK_USER_CONNECTIONS, params)
    result = await conn.execute(
        ADMIT_CONNECTION,
        {
            **params,
            "connection_id": connection_id,
            "process_id": process_id,
            "limit": limit,
            "client_address": client_address,
        },
    )
    return bool(result.rowcount)
