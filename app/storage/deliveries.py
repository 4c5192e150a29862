"""Claim, settle and release: the delivery half of the hot path.

The hot path's statements (claim, ack) are in ``storage.queries``. The retry path locks its
rows here (``lock_*``), broker/settlement.py decides what becomes of them, and
``apply_decisions`` applies that, all in the caller's one transaction. Every statement is
built once at import (constant SQL, so asyncpg's prepared-statement cache hits) and commented
with its concurrency reasoning. Callers own the transactions.

A delivery tag is ``"<message id>.<128 random bits in hex>"``: the id lets every settle look the
row up by primary key (no index on the tag, so claims stay cheap), the random part makes a tag
from an earlier delivery of the same row worthless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.arguments import DeathReason
from app.domain.model import Delivery
from app.storage import queries
from app.storage.fastpath import HotPath, Statement, jsonb_text

# -- claim ----------------------------------------------------------------------------------

Claimed = Delivery


class ClaimArgs(TypedDict):
    """What one claim of ``queries.CLAIM`` is for: up to ``n`` ready copies of the queue,
    leased for ``lease_seconds`` to ``owners`` (WebSocket connections, one a slot) or to a
    pull consumer (``owners`` None, ``owner_user``)."""

    queue_id: int
    n: int
    lease_seconds: float
    process_id: str
    owners: Sequence[str] | None
    owner_user: str | None


def claim_params(**args: Unpack[ClaimArgs]) -> dict[str, Any]:
    """The parameters of ``queries.CLAIM``."""
    owners = args["owners"]
    return {
        **args,
        "lease_seconds": float(args["lease_seconds"]),
        "owners": list(owners) if owners is not None else None,
    }


def claimed_rows(rows: Sequence[Any]) -> list[Claimed]:
    """``queries.CLAIM``'s rows as deliveries, in claim order (``slot``: the owner's index)."""
    return [Claimed(r[0] - 1, *r[1:]) for r in sorted(rows, key=lambda r: r[0])]


async def claim(hot: HotPath, **args: Unpack[ClaimArgs]) -> list[Claimed]:
    return claimed_rows(await hot.fetch(queries.CLAIM, claim_params(**args)))


@dataclass(frozen=True, slots=True)
class ClaimWant:
    """One queue's part of ``claim_due``: up to ``len(owners)`` ready copies of the queue,
    the i-th in claim order leased to ``owners[i]`` (WebSocket connections) for
    ``lease_seconds``."""

    queue_id: int
    owners: Sequence[str]
    lease_seconds: float


def claim_due_params(wants: Sequence[ClaimWant], process_id: str) -> dict[str, Any]:
    """The parameters of ``queries.CLAIM_DUE``: the owners of every queue in one array,
    queue i's from ``bases[i]`` on."""
    bases: list[int] = []
    owners: list[str] = []
    for want in wants:
        bases.append(len(owners))
        owners.extend(want.owners)
    return {
        "queue_ids": [w.queue_id for w in wants],
        "ns": [len(w.owners) for w in wants],
        "leases": [float(w.lease_seconds) for w in wants],
        "bases": bases,
        "process_id": process_id,
        "owners": owners,
    }


@dataclass(slots=True)
class DueClaim:
    """What ``claim_due`` found for one queue: its deliveries in claim order (``slot``: the
    index of the owner in its ``owners``), and the seconds until its next ready copy falls
    due (None: it has none that is not due now)."""

    claimed: list[Claimed] = field(default_factory=list)
    next_due: float | None = None


async def claim_due(
    hot: HotPath, wants: Sequence[ClaimWant], process_id: str
) -> dict[int, DueClaim]:
    """The claims of several plain queues, and when each has a copy due next, in one
    statement (``queries.CLAIM_DUE``). A queue may appear once only."""
    params = claim_due_params(wants, process_id)
    rows = await hot.fetch(queries.CLAIM_DUE, params)
    base = dict(zip(params["queue_ids"], params["bases"], strict=True))
    found = {w.queue_id: DueClaim() for w in wants}
    for r in sorted(rows, key=lambda r: (r[0], r[2] or 0)):
        queue_id = int(r[0])
        due = found[queue_id]
        due.next_due = None if r[1] is None else float(r[1])
        if r[2] is not None:
            due.claimed.append(Claimed(r[2] - 1 - base[queue_id], *r[3:]))
    return found


def group_claim_params(**args: Unpack[ClaimArgs]) -> dict[str, Any]:
    """The parameters of ``queries.CLAIM_GROUPS``: the claim's, and the window of ready rows
    its walk looks at (see there)."""
    return {**claim_params(**args), "scan": 4 * args["n"] + GROUP_WINDOW}


#: rows beyond 4 x n that a group claim's walk looks at before it reads every group's head
GROUP_WINDOW = 128


async def claim_grouped(hot: HotPath, **args: Unpack[ClaimArgs]) -> list[Claimed]:
    """The claim of a queue with ``x-message-groups`` (contract §16): under the queue's
    group-claim lock, in a transaction of its own (``queries.CLAIM_GROUPS``)."""
    params = group_claim_params(**args)
    lock = queries.LOCK_GROUP_CLAIM
    claim = queries.CLAIM_GROUPS
    async with hot.connection() as conn, conn.transaction():
        await conn.fetch(lock.sql, *lock.args(params))
        rows = await conn.fetch(claim.sql, *claim.args(params))
    return claimed_rows(rows)


async def seconds_until_due(hot: HotPath, queue_id: int) -> float | None:
    value = await hot.fetchval(queries.NEXT_DUE, {"queue_id": queue_id})
    return None if value is None else float(value)


async def ready_queues(
    hot: HotPath, queue_ids: Sequence[int] | None = None
) -> list[tuple[int, float]]:
    """(queue id, seconds until its first ready message is due; <= 0 when one is) for every
    queue with ready messages — or, given ``queue_ids``, for those of them that have some."""
    if queue_ids is None:
        rows = await hot.fetch(queries.READY_QUEUES, {"after": 0})
    else:
        rows = await hot.fetch(queries.READY_QUEUES_OF, {"queue_ids": list(queue_ids)})
    return [(int(r[0]), float(r[1])) for r in rows]


async def existing_queues(hot: HotPath, queue_ids: Sequence[int]) -> set[int]:
    """Those of ``queue_ids`` that are still queues (not deleted)."""
    rows = await hot.fetch(queries.EXISTING_QUEUES, {"queue_ids": list(queue_ids)})
    return {int(r[0]) for r in rows}


# -- acknowledge ----------------------------------------------------------------------------


async def ack_many(
    hot: HotPath, items: Sequence[tuple[int, str, str]]
) -> dict[tuple[str, str], int]:
    """Delete in-flight rows by (id, tag, owner connection); returns the queue id of each
    (tag, owner connection) deleted. Keyed by tag, not id: two tags of one message (an earlier
    delivery's and the live one) may be in one batch, and only the live one is acked."""
    if not items:
        return {}
    rows = await hot.fetch(
        queries.ACK_MANY,
        {
            "ids": [i[0] for i in items],
            "tags": [i[1] for i in items],
            "owners": [i[2] for i in items],
        },
    )
    return {(r[0], r[1]): r[2] for r in rows}


async def ack_pull_many(
    hot: HotPath, items: Sequence[tuple[int, str]], owner_user: str
) -> dict[str, int]:
    """Delete pulled in-flight rows of ``owner_user`` by (id, tag); returns the queue id of
    each tag deleted."""
    if not items:
        return {}
    rows = await hot.fetch(
        queries.ACK_PULL_MANY,
        {"ids": [i[0] for i in items], "tags": [i[1] for i in items], "owner_user": owner_user},
    )
    return {r[0]: r[1] for r in rows}


# -- lock rows for the retry path -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unsettled:
    """A row locked for the retry path (an in-flight delivery, or a ready copy that expired
    or that a length limit drops), with what the decision and dead-lettering need."""

    id: int
    queue_id: int
    queue_name: str
    delivery_count: int
    max_delivery_count: int | None
    dead_letter_queue_id: int | None
    headers: dict[str, Any]
    exchange: str
    routing_key: str
    owner_connection: str | None
    owner_process: str | None
    now: datetime
    dead_letter_queue: str | None = None
    #: the queue's x-dead-letter-exchange and x-dead-letter-routing-key
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    #: past its expiry (contract §13): it expires instead of returning to ready
    expired: bool = False

    @property
    def has_dead_letter_target(self) -> bool:
        return self.dead_letter_queue_id is not None or self.dead_letter_exchange is not None


_UNSETTLED_COLUMNS = """
    m.id, m.queue_id, q.name, m.delivery_count, q.max_delivery_count, q.dead_letter_queue_id,
    m.headers, m.exchange, m.routing_key, m.owner_connection::text, m.owner_process::text, now(),
    (SELECT d.name FROM queues AS d WHERE d.id = q.dead_letter_queue_id),
    q.arguments ->> 'x-dead-letter-exchange', q.arguments ->> 'x-dead-letter-routing-key',
    coalesce(m.expires_at <= now(), false)
FROM messages AS m JOIN queues AS q ON q.id = m.queue_id
"""

# NACK: the one delivery, if still in flight with this tag and owner. The owner is a
# connection (WebSocket) or, for pull deliveries, a user with no connection.
LOCK_BY_TAG = text(
    "SELECT"
    + _UNSETTLED_COLUMNS
    + """
WHERE m.id = :id AND m.delivery_tag = :tag
  AND m.owner_connection IS NOT DISTINCT FROM CAST(:owner_connection AS uuid)
  AND (CAST(:owner_user AS text) IS NULL OR m.owner_user = CAST(:owner_user AS text))
FOR UPDATE OF m
"""
)

# Ack-timeout sweep: expired leases via ix_messages_lease. SKIP LOCKED lets several processes
# sweep at once without waiting on each other or on a consumer's concurrent ack.
LOCK_EXPIRED = text(
    "SELECT"
    + _UNSETTLED_COLUMNS
    + """
WHERE m.status = 'in_flight' AND m.lease_expires_at <= now()
ORDER BY m.lease_expires_at
LIMIT :n
FOR UPDATE OF m SKIP LOCKED
"""
)

# Release on disconnect: everything a connection still holds (ix_messages_owner). No SKIP
# LOCKED: a concurrent ack of one of these rows finishes first and the row is then gone.
# Rows are locked in id order so two releases can never deadlock.
LOCK_OWNED_BY_CONNECTIONS = text(
    "SELECT"
    + _UNSETTLED_COLUMNS
    + """
WHERE m.status = 'in_flight' AND m.owner_connection = ANY(CAST(:owners AS uuid[]))
ORDER BY m.id
FOR UPDATE OF m
"""
)

# Release what dead broker processes' WebSockets held (their heartbeat went stale). Pull
# deliveries have no connection and wait for their ack timeout, as the contract says. The
# in-flight set is small and walked through ix_messages_lease's partial predicate.
LOCK_OWNED_BY_PROCESSES = text(
    "SELECT"
    + _UNSETTLED_COLUMNS
    + """
WHERE m.status = 'in_flight' AND m.owner_process = ANY(CAST(:processes AS uuid[]))
  AND m.owner_connection IS NOT NULL
ORDER BY m.id
FOR UPDATE OF m SKIP LOCKED
"""
)


# The expiry sweep (contract §13): ready copies past their expiry, via ix_messages_expiry
# (partial on ready rows that can expire: the sweep never reads a row that cannot). SKIP
# LOCKED lets every process sweep at once, each taking distinct rows, and never waits on a
# claim that holds a row (a claim skips expired rows anyway).
LOCK_EXPIRED_READY = text(
    "SELECT"
    + _UNSETTLED_COLUMNS
    + """
WHERE m.status = 'ready' AND m.expires_at IS NOT NULL AND m.expires_at <= now()
ORDER BY m.expires_at
LIMIT :n
FOR UPDATE OF m SKIP LOCKED
"""
)

# Rows by id, for a caller that picked them itself (the length limit's drop-head); in id
# order so that two such callers cannot deadlock.
LOCK_BY_IDS = text(
    "SELECT"
    + _UNSETTLED_COLUMNS
    + """
WHERE m.id = ANY(CAST(:ids AS bigint[]))
ORDER BY m.id
FOR UPDATE OF m
"""
)


# Whether the expiry sweep has anything to do: one probe of ix_messages_expiry on the hot
# path (no transaction), so that an idle sweep costs one short statement, not a transaction.
# :lead_s (0) is a parameter so that the plan is made for the table as it is at each call
# (app/storage/planner.py): without one, PostgreSQL kept a plan made while the table looked
# empty, a sequential scan, and ran it 8 times a second over a growing table.
ANY_EXPIRED_READY = text("""
SELECT EXISTS (SELECT 1 FROM messages AS m
               WHERE m.status = 'ready' AND m.expires_at IS NOT NULL
                 AND m.expires_at <= now() + CAST(:lead_s AS float8) * interval '1 second')
""")
_ANY_EXPIRED_READY = Statement(ANY_EXPIRED_READY)


async def any_expired_ready(hot: HotPath) -> bool:
    return bool(await hot.fetchval(_ANY_EXPIRED_READY, {"lead_s": 0}))


# The expiry sweep's bulk of the work: expired copies whose queue has no dead-letter target
# are deleted in ONE statement, no row leaving the database (the rest go through
# LOCK_EXPIRED_READY and the retry path's dead-lettering). A read of ix_messages_expiry
# with the same SKIP LOCKED as LOCK_EXPIRED_READY; the queues that dead-letter are read
# first, once (an InitPlan: few rows), and their copies stepped over. No ORDER BY: every
# expired copy goes in this sweep, in any order, so the read stops after :n rows. (Written
# as a join to queues ORDER BY expires_at, the planner hashed the join and sorted EVERY
# expired copy for each batch of :n: 100,000 copies expiring at once were read
# 10 + 9 + ... + 1 times, 55 x 10,000 rows, the sort spilling to disk; and with the join
# gone, an underestimate of the rows still planned a sort: docs/performance.md.)
DISCARD_EXPIRED = text("""
DELETE FROM messages WHERE id = ANY(ARRAY(
    SELECT m.id FROM messages AS m
    WHERE m.status = 'ready' AND m.expires_at IS NOT NULL AND m.expires_at <= now()
      AND m.queue_id <> ALL(ARRAY(
          SELECT q.id FROM queues AS q
          WHERE q.dead_letter_queue_id IS NOT NULL OR q.arguments ? 'x-dead-letter-exchange'))
    LIMIT :n
    FOR UPDATE OF m SKIP LOCKED))
""")
_DISCARD_EXPIRED = Statement(DISCARD_EXPIRED)


async def discard_expired(hot: HotPath, n: int) -> int:
    """Delete up to ``n`` expired copies of queues without a dead-letter target; how many."""
    async with hot.connection() as conn:
        status: str = await conn.execute(_DISCARD_EXPIRED.sql, *_DISCARD_EXPIRED.args({"n": n}))
    return int(status.rsplit(" ", 1)[-1])


async def lock_expired_ready(conn: AsyncConnection, n: int) -> list[Unsettled]:
    return _unsettled((await conn.execute(LOCK_EXPIRED_READY, {"n": n})).all())


async def lock_by_ids(conn: AsyncConnection, ids: Sequence[int]) -> list[Unsettled]:
    if not ids:
        return []
    return _unsettled((await conn.execute(LOCK_BY_IDS, {"ids": list(ids)})).all())


def _unsettled(rows: Sequence[Any]) -> list[Unsettled]:
    return [Unsettled(*r) for r in rows]


async def lock_by_tag(
    conn: AsyncConnection,
    *,
    id: int,
    tag: str,
    owner_connection: str | None,
    owner_user: str | None,
) -> Unsettled | None:
    rows = (
        await conn.execute(
            LOCK_BY_TAG,
            {"id": id, "tag": tag, "owner_connection": owner_connection, "owner_user": owner_user},
        )
    ).all()
    found = _unsettled(rows)
    return found[0] if found else None


async def lock_expired(conn: AsyncConnection, n: int) -> list[Unsettled]:
    return _unsettled((await conn.execute(LOCK_EXPIRED, {"n": n})).all())


async def lock_owned_by_connections(
    conn: AsyncConnection, owners: Sequence[str]
) -> list[Unsettled]:
    if not owners:
        return []
    return _unsettled(
        (await conn.execute(LOCK_OWNED_BY_CONNECTIONS, {"owners": list(owners)})).all()
    )


async def lock_owned_by_processes(
    conn: AsyncConnection, processes: Sequence[str]
) -> list[Unsettled]:
    if not processes:
        return []
    rows = (await conn.execute(LOCK_OWNED_BY_PROCESSES, {"processes": list(processes)})).all()
    return _unsettled(rows)


# -- apply retry decisions, in batches ------------------------------------------------------

# Back to ready (or dead) in place: available_at is kept, so a requeued message keeps its
# place in (available_at, id) order; the tag is cleared, so a late ack of it matches nothing.
_RETURN = """
UPDATE messages SET status = :status, delivery_tag = NULL, lease_expires_at = NULL,
    owner_process = NULL, owner_connection = NULL, owner_user = NULL
WHERE id = ANY(CAST(:ids AS bigint[]))
"""
RETURN_TO_STATUS = text(_RETURN)

# The TTL a dead-lettered copy gets in the queue it lands in (contract §13): the smaller of
# that queue's x-message-ttl and the message's expiration, from its new available_at (now).
_TARGET_EXPIRES_AT = """now() + LEAST(
        CAST(t.arguments ->> 'x-message-ttl' AS bigint),
        CAST(m.properties ->> 'expiration' AS bigint)) * interval '1 millisecond'"""

# The claim priority in the target queue ``t`` (QueueArguments.priority_of, in SQL: NULL
# outside a priority queue, the message's priority capped at x-max-priority in one, 0
# without one).
_TARGET_PRIORITY = """CASE WHEN t.arguments ? 'x-max-priority'
                    THEN least(coalesce((m.properties ->> 'priority')::int, 0),
                               (t.arguments ->> 'x-max-priority')::int) END"""

# Moved to a dead-letter target: ready there at the tail, delivery_count 0, x-death headers
# computed by domain.retry; message_id, created_at and body are kept; exchange and routing
# key are the given ones (the copy's own for a dead-letter queue, the dead-letter exchange's
# for one routed through it).
DEAD_LETTER = text(f"""
UPDATE messages AS m SET queue_id = d.queue_id, status = 'ready', delivery_count = 0,
    headers = d.headers, exchange = d.exchange, routing_key = d.routing_key,
    available_at = now(), expires_at = {_TARGET_EXPIRES_AT},
    delivery_tag = NULL, lease_expires_at = NULL,
    owner_process = NULL, owner_connection = NULL, owner_user = NULL,
    priority = {_TARGET_PRIORITY}
FROM unnest(CAST(:ids AS bigint[]), CAST(:queues AS bigint[]), CAST(:headers AS jsonb[]),
            CAST(:exchanges AS text[]), CAST(:keys AS text[]))
     AS d(id, queue_id, headers, exchange, routing_key)
JOIN queues AS t ON t.id = d.queue_id
WHERE m.id = d.id
""")

# The further copies of a copy that a dead-letter exchange routed to several queues: new rows
# read from the source row (before DEAD_LETTER moves it, in the same transaction).
DEAD_LETTER_COPIES = text(f"""
INSERT INTO messages (queue_id, message_id, exchange, routing_key, headers, properties, body,
                      "binary", created_at, available_at, expires_at, priority, group_id)
SELECT d.queue_id, m.message_id, d.exchange, d.routing_key, d.headers, m.properties, m.body,
       m."binary", m.created_at, now(), {_TARGET_EXPIRES_AT}, {_TARGET_PRIORITY}, m.group_id
FROM unnest(CAST(:ids AS bigint[]), CAST(:queues AS bigint[]), CAST(:headers AS jsonb[]),
            CAST(:exchanges AS text[]), CAST(:keys AS text[]))
     WITH ORDINALITY AS d(id, queue_id, headers, exchange, routing_key, ord)
JOIN messages AS m ON m.id = d.id
JOIN queues AS t ON t.id = d.queue_id
ORDER BY d.ord
""")

DISCARD = text("DELETE FROM messages WHERE id = ANY(CAST(:ids AS bigint[]))")

#: The target queue's TTL and claim priority of a copy ``m`` landing in queue ``t``, for the
#: other statements that move copies between queues (storage/filters.py, contract §17).
TARGET_EXPIRES_AT = _TARGET_EXPIRES_AT
TARGET_PRIORITY = _TARGET_PRIORITY


async def return_to_status(conn: AsyncConnection, ids: Sequence[int], status: str) -> None:
    if ids:
        await conn.execute(RETURN_TO_STATUS, {"ids": list(ids), "status": status})


@dataclass(frozen=True, slots=True)
class DeadLetterMove:
    """A copy going to one queue: its id, the target queue, its new headers, exchange and
    routing key."""

    id: int
    queue_id: int
    headers: dict[str, Any]
    exchange: str
    routing_key: str


def _moves(moves: Sequence[DeadLetterMove]) -> dict[str, Any]:
    return {
        "ids": [m.id for m in moves],
        "queues": [m.queue_id for m in moves],
        "headers": [jsonb_text(m.headers) for m in moves],
        "exchanges": [m.exchange for m in moves],
        "keys": [m.routing_key for m in moves],
    }


async def dead_letter(
    conn: AsyncConnection,
    moves: Sequence[DeadLetterMove],
    copies: Sequence[DeadLetterMove] = (),
) -> None:
    """Move each copy of ``moves`` to its target queue, after inserting ``copies`` (further
    queues of the same source rows) as new rows."""
    if copies:
        await conn.execute(DEAD_LETTER_COPIES, _moves(copies))
    if moves:
        await conn.execute(DEAD_LETTER, _moves(moves))


async def discard(conn: AsyncConnection, ids: Sequence[int]) -> None:
    if ids:
        await conn.execute(DISCARD, {"ids": list(ids)})


@dataclass(slots=True)
class Decisions:
    """What becomes of rows locked for the retry path, by outcome. broker/settlement.py
    decides (through domain.retry) between the lock and this, in the same transaction, and
    dead-letters the ``dead_letter`` rows itself (it routes them)."""

    requeue: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    discard: list[int] = field(default_factory=list)
    #: (row, reason): dead-lettered by ``Settlement.dead_letter``
    dead_letter: list[tuple[Unsettled, DeathReason]] = field(default_factory=list)


async def apply_decisions(conn: AsyncConnection, decisions: Decisions) -> None:
    """Apply the requeue, dead and discard decisions in at most three statements (none for an
    empty list)."""
    await return_to_status(conn, decisions.requeue, "ready")
    await return_to_status(conn, decisions.dead, "dead")
    await discard(conn, decisions.discard)


# -- reconcile local credit with the database -----------------------------------------------

# Which of these connections' deliveries are still in flight (ix_messages_owner). A local
# delivery missing here was settled elsewhere: timed out, released, or deleted by an admin.
STILL_IN_FLIGHT = text("""
SELECT owner_connection::text, delivery_tag FROM messages
WHERE status = 'in_flight' AND owner_connection = ANY(CAST(:owners AS uuid[]))
""")


async def still_in_flight(conn: AsyncConnection, owners: Sequence[str]) -> set[tuple[str, str]]:
    if not owners:
        return set()
    rows = (await conn.execute(STILL_IN_FLIGHT, {"owners": list(owners)})).all()
    return {(r[0], r[1]) for r in rows}


# The tags a connection still holds on one queue (ix_messages_owner). A new subscription of the
# same (connection, queue) pair starts with them, so prefetch bounds the pair (contract §10)
# even after an UNSUBSCRIBE or a SUBSCRIPTION_CANCELLED left deliveries unsettled.
OWNED_TAGS = text("""
SELECT delivery_tag FROM messages
WHERE status = 'in_flight' AND owner_connection = CAST(:owner AS uuid) AND queue_id = :queue_id
""")


async def owned_tags(conn: AsyncConnection, owner: str, queue_id: int) -> set[str]:
    rows = (await conn.execute(OWNED_TAGS, {"owner": owner, "queue_id": queue_id})).all()
    return {str(r[0]) for r in rows}


# -- queues as the delivery side sees them --------------------------------------------------

# A subscribe or a get uses the queue: one with x-expires has its deadline pushed forward in
# the same statement (contract §13); no other queue's row is written. Also returned: whether
# the queue has a single active consumer (contract §13) and message groups (§16).
QUEUE_BY_NAME = text("""
WITH q AS (
    SELECT id, ack_timeout_seconds, idle_expires_at IS NOT NULL AS expires,
           coalesce(arguments -> 'x-single-active-consumer' = 'true'::jsonb, false) AS sac,
           coalesce(arguments -> 'x-message-groups' = 'true'::jsonb, false) AS groups
    FROM queues WHERE name = :name
), touched AS (
    UPDATE queues SET
        idle_expires_at = now() + CAST(arguments ->> 'x-expires' AS bigint)
                                  * interval '1 millisecond'
    FROM q WHERE queues.id = q.id AND q.expires
)
SELECT id, ack_timeout_seconds, sac, groups FROM q
""")


@dataclass(frozen=True, slots=True)
class ConsumedQueue:
    """A queue as its consumers need it."""

    id: int
    ack_timeout_seconds: int | None
    single_active: bool
    #: ``x-message-groups`` (contract §16): claimed with ``claim_grouped``
    groups: bool = False


async def queue_by_name(conn: AsyncConnection, name: str) -> ConsumedQueue | None:
    row = (await conn.execute(QUEUE_BY_NAME, {"name": name})).first()
    if row is None:
        return None
    return ConsumedQueue(int(row[0]), row[1], bool(row[2]), bool(row[3]))
