"""Diagnosis (contract §19): the statements that gather a queue's facts and the database's.

Every statement about one queue is bounded by an index, whatever the queue holds (tested
with 1,000,000 copies, docs/performance.md):

- the head: one probe of the claim order (``queries.ready_in_claim_order``), else one of
  ``ix_messages_claim`` for the first delayed copy;
- in-flight copies: ``status = 'in_flight'`` rows, a set bounded by every consumer's
  prefetch, through ``ix_messages_lease``/``ix_messages_owner``;
- the subscriptions of the queue (``ix_subscriptions_queue_id``), each with its unsettled
  count (``ix_messages_owner``);
- poison copies among the in-flight ones and the first POISON_SCAN ready copies in claim
  order (a requeued copy keeps its place at the head);
- the ready count of a limited queue, up to its limit (the limit holds);
- recent dead letters: the copies that became ready within the window, at most
  DEAD_LETTER_SCAN of them, through ``ix_messages_claim``.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.diagnosis import (
    DEAD_LETTER_WINDOW,
    POISON_DELIVERIES,
    Bloat,
    Consumer,
    Head,
    Holder,
    InFlight,
    ProcessFacts,
    XminHolder,
)
from app.domain.presence import PROCESS_STALE_AFTER
from app.storage import health, queries

#: ready copies in claim order looked at for poison ones
POISON_SCAN = 1000
#: most recent arrivals looked at for dead letters
DEAD_LETTER_SCAN = 5_000
#: most ready copies counted for x-max-length (beyond: the planner's estimate)
COUNT_SCAN = 50_000
#: most ready copies whose bytes are added up for x-max-length-bytes (beyond: estimated)
BYTES_SCAN = 10_000


_COPY = "id, message_id, created_at, available_at, delivery_count, group_id, expires_at"

QUEUE = text("""
SELECT q.id, q.arguments, q.ack_timeout_seconds, q.created_at, q.unsubscribed_at, now(),
       d.name, d.id
FROM queues AS q LEFT JOIN queues AS d ON d.id = q.dead_letter_queue_id
WHERE q.name = :name
""")

HEAD_DUE = text(queries.ready_in_claim_order(_COPY + ", priority", "1"))
HEAD_DELAYED = text(f"""
SELECT {_COPY} FROM messages
WHERE queue_id = :queue_id AND status = 'ready' AND available_at > statement_timestamp()
ORDER BY available_at, id LIMIT 1
""")

# The oldest delivery in flight and its holder: a WebSocket delivery names its connection
# (whose row says the user), a pulled one its user only.
OLDEST_IN_FLIGHT = text("""
SELECT m.id, m.message_id, m.delivered_at, m.lease_expires_at, m.delivery_count,
       m.owner_connection::text, coalesce(m.owner_user, c.username), m.owner_process::text
FROM messages AS m
LEFT JOIN websocket_connections AS c ON c.connection_id = m.owner_connection
WHERE m.queue_id = :queue_id AND m.status = 'in_flight'
ORDER BY m.delivered_at, m.id LIMIT 1
""")

GROUP_IN_FLIGHT = text("""
SELECT EXISTS (SELECT 1 FROM messages
               WHERE queue_id = :queue_id AND status = 'in_flight' AND group_id = :group_id)
""")

# Live subscriptions (their process heartbeats), oldest first, each with what it holds.
CONSUMERS = text("""
SELECT s.connection_id::text, c.username, s.process_id::text, s.prefetch,
       CASE WHEN :single_active THEN h.connection_id IS NOT DISTINCT FROM s.connection_id
            ELSE true END,
       s.created_at, s.last_ack_at, held.n, held.oldest
FROM subscriptions AS s
JOIN broker_processes AS p
  ON p.id = s.process_id AND p.heartbeat_at > now() - make_interval(secs => :stale)
LEFT JOIN websocket_connections AS c ON c.connection_id = s.connection_id
LEFT JOIN single_active_holders AS h ON h.queue_id = s.queue_id
CROSS JOIN LATERAL (SELECT count(*) AS n, min(m.delivered_at) AS oldest FROM messages AS m
                    WHERE m.owner_connection = s.connection_id AND m.status = 'in_flight'
                      AND m.queue_id = s.queue_id) AS held
WHERE s.queue_id = :queue_id
ORDER BY s.created_at, s.connection_id
""")

POISON = text(f"""
SELECT id, delivery_count FROM (
    SELECT id, delivery_count FROM messages
    WHERE queue_id = :queue_id AND status = 'in_flight' AND delivery_count >= :min
    UNION ALL
    SELECT id, delivery_count FROM ({
    queries.ready_in_claim_order("id, delivery_count, priority, available_at", str(POISON_SCAN))
}) AS head WHERE delivery_count >= :min
) AS p ORDER BY id LIMIT 10
""")

READY_COUNT = text("""
SELECT count(*) FROM (SELECT 1 FROM messages
                      WHERE queue_id = :queue_id AND status = 'ready'
                        AND available_at <= statement_timestamp() LIMIT :n) AS r
""")
READY_BYTES = text(f"""
SELECT coalesce(sum(length(body)), 0), count(*) FROM (
    SELECT body FROM messages
    WHERE queue_id = :queue_id AND status = 'ready' AND available_at <= statement_timestamp()
    LIMIT {BYTES_SCAN}) AS r
""")
# The planner's estimate of a queue's ready copies (from the table's statistics: no row read).
READY_ESTIMATE = text("""
EXPLAIN (FORMAT JSON) SELECT 1 FROM messages WHERE queue_id = :queue_id AND status = 'ready'
""")

# Copies that became ready in ``:queue_id`` within the window (dead-lettering sets
# available_at to its time) and carry an x-death entry whose queue is :source (NULL: any
# queue but this one).
DEAD_LETTERS = text(f"""
SELECT count(*) FROM (
    SELECT headers -> 'x-death' -> 0 ->> 'queue' AS source FROM messages
    WHERE queue_id = :queue_id AND status = 'ready'
      AND available_at > now() - make_interval(secs => :window)
      AND available_at <= now()
    LIMIT {DEAD_LETTER_SCAN}) AS r
WHERE r.source IS NOT NULL
  AND (r.source = :source OR (CAST(:source AS text) IS NULL AND r.source <> :own))
""")


def _head(row: Any) -> Head:
    return Head(
        id=row[0],
        message_id=row[1],
        created_at=row[2],
        available_at=row[3],
        delivery_count=row[4],
        group_id=row[5],
        expires_at=row[6],
    )


async def queue_row(conn: AsyncConnection, name: str) -> Any:
    """(id, arguments, ack_timeout_seconds, created_at, unsubscribed_at, now, dead-letter
    queue name, its id)."""
    return (await conn.execute(QUEUE, {"name": name})).first()


async def head(conn: AsyncConnection, queue_id: int) -> Head | None:
    params = {"queue_id": queue_id}
    row = (await conn.execute(HEAD_DUE, params)).first()
    if row is None:
        row = (await conn.execute(HEAD_DELAYED, params)).first()
    return None if row is None else _head(row)


async def oldest_in_flight(conn: AsyncConnection, queue_id: int) -> InFlight | None:
    row = (await conn.execute(OLDEST_IN_FLIGHT, {"queue_id": queue_id})).first()
    if row is None:
        return None
    holder = Holder(
        connection_id=row[5],
        username=row[6],
        process=row[7],
        kind="websocket" if row[5] is not None else "pull",
    )
    return InFlight(row[0], row[1], row[2], row[3], row[4], holder)


async def group_in_flight(conn: AsyncConnection, queue_id: int, group_id: str) -> bool:
    params = {"queue_id": queue_id, "group_id": group_id}
    return bool((await conn.execute(GROUP_IN_FLIGHT, params)).scalar_one())


async def consumers(conn: AsyncConnection, queue_id: int, single_active: bool) -> list[Consumer]:
    params = {
        "queue_id": queue_id,
        "single_active": single_active,
        "stale": PROCESS_STALE_AFTER.total_seconds(),
    }
    return [
        Consumer(
            connection_id=r[0],
            username=r[1],
            process=r[2],
            prefetch=r[3],
            active=bool(r[4]),
            since=r[5],
            last_ack_at=r[6],
            unacked=r[7],
            oldest_held_at=r[8],
        )
        for r in await conn.execute(CONSUMERS, params)
    ]


async def poison(conn: AsyncConnection, queue_id: int) -> list[tuple[int, int]]:
    params = {"queue_id": queue_id, "min": POISON_DELIVERIES}
    return [(r[0], r[1]) for r in await conn.execute(POISON, params)]


async def ready_count(conn: AsyncConnection, queue_id: int, up_to: int) -> tuple[int, bool]:
    """Ready copies, counted up to ``up_to`` (exact) when that is at most COUNT_SCAN or the
    queue holds fewer; else the planner's estimate (False: estimated)."""
    params = {"queue_id": queue_id, "n": min(up_to, COUNT_SCAN)}
    counted = int((await conn.execute(READY_COUNT, params)).scalar_one())
    if counted < COUNT_SCAN or up_to <= COUNT_SCAN:
        return counted, True
    return max(counted, await _estimate(conn, queue_id)), False


async def ready_bytes(conn: AsyncConnection, queue_id: int) -> tuple[int, bool]:
    """Body bytes of the ready copies: exact for up to BYTES_SCAN copies, else the first
    BYTES_SCAN's mean size times the estimated count (False: estimated)."""
    total, n = (await conn.execute(READY_BYTES, {"queue_id": queue_id})).one()
    if n < BYTES_SCAN:
        return int(total), True
    return max(int(total), int(total / n * await _estimate(conn, queue_id))), False


async def _estimate(conn: AsyncConnection, queue_id: int) -> int:
    plan = (await conn.execute(READY_ESTIMATE, {"queue_id": queue_id})).scalar_one()
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


async def dead_letters(
    conn: AsyncConnection, queue_id: int, *, source: str | None, own: str
) -> int:
    """Recent arrivals in ``queue_id`` dead-lettered from ``source`` (None: from any other
    queue than ``own``)."""
    params = {
        "queue_id": queue_id,
        "source": source,
        "own": own,
        "window": DEAD_LETTER_WINDOW.total_seconds(),
    }
    return int((await conn.execute(DEAD_LETTERS, params)).scalar_one())


# -- the database ---------------------------------------------------------------------------

NOW = text("SELECT now()")
BLOAT = text("""
SELECT n_live_tup, n_dead_tup, last_autovacuum, last_vacuum FROM pg_stat_user_tables
WHERE relid = 'messages'::regclass
""")
# The oldest open transactions on this database that hold a snapshot or an xid (they hold
# back vacuum's horizon), this session's own left out.
# Every process row, and whether the LISTEN backend its last heartbeat named still exists.
PROCESSES = text("""
SELECT p.id::text, p.hostname, p.pid, p.started_at, p.heartbeat_at, p.listen_pid,
       EXISTS (SELECT 1 FROM pg_stat_activity AS a WHERE a.pid = p.listen_pid),
       p.pool_in_use, p.pool_size,
       p.listen_pid = 0  -- it polls by choice (storage/listener.py, POLLING_PID)
FROM broker_processes AS p ORDER BY p.id
""")
NOTIFY_USAGE = text("SELECT pg_notification_queue_usage()")


async def now(conn: AsyncConnection) -> datetime:
    value: datetime = (await conn.execute(NOW)).scalar_one()
    return value


async def bloat(conn: AsyncConnection) -> Bloat | None:
    row = (await conn.execute(BLOAT)).first()
    return None if row is None else Bloat(int(row[0]), int(row[1]), row[2], row[3])


async def xmin_holders(conn: AsyncConnection, n: int = 5) -> list[XminHolder]:
    """The oldest holders of cleanup (storage/health.py's one query), as diagnosis shows them."""
    return [
        XminHolder(
            "replication_slot",
            h.pid,
            None,
            h.state,
            None,
            slot_name=h.name,
            xmin_age=h.xid_age,
        )
        if h.kind == "replication slot"
        else XminHolder(
            "transaction",
            h.pid,
            h.name,
            h.state,
            None if h.age_seconds is None else timedelta(seconds=h.age_seconds),
            xmin_age=h.xid_age,
        )
        for h in await health.xmin_holders(conn, n)
    ]


async def processes(conn: AsyncConnection) -> list[ProcessFacts]:
    return [
        ProcessFacts(
            id=r[0],
            hostname=r[1],
            pid=r[2],
            started_at=r[3],
            heartbeat_at=r[4],
            listen_pid=r[5],
            listening=bool(r[6]),
            pool_in_use=r[7],
            pool_size=r[8],
            polling=bool(r[9]),
        )
        for r in await conn.execute(PROCESSES)
    ]


async def notify_queue_usage(conn: AsyncConnection) -> float:
    return float((await conn.execute(NOTIFY_USAGE)).scalar_one())


def ack_timeout(seconds: int | None, default: int) -> timedelta:
    return timedelta(seconds=seconds or default)
