"""Exchanges, queues and bindings: every SQL statement of the topology, with its locking.

Concurrency, in one place (all transactions run at READ COMMITTED):

- Declares are ``INSERT ... ON CONFLICT DO NOTHING`` and, when nothing was inserted, a read of
  the winner. Two identical concurrent declares therefore both succeed (one 201, one 200)
  instead of one of them failing on the unique constraint. ON CONFLICT waits for an
  uncommitted conflicting insert, and the follow-up SELECT is a new statement with a new
  snapshot, so it sees the winner. If the winner was deleted in between, the declare retries.
- Row-lock order, everywhere: queue → exchange → binding rows. A binding insert takes
  ``FOR KEY SHARE`` on its queue (the lock its foreign key takes) and then ``FOR NO KEY
  UPDATE`` on its exchange (the lock its routing_version trigger takes, below, and stronger
  than its foreign key's);
  a queue delete locks the queue ``FOR UPDATE``, then its bound exchanges ``FOR UPDATE`` (in
  id order), and only then cascades into ``bindings``; an exchange delete or binding delete
  locks the exchange first and then binding rows. One order means no deadlock between these
  paths.
- Every statement that adds or removes bindings (a cascade from a queue delete included)
  increments the routing_version of their exchanges, by trigger (migration 0004), in the
  same transaction: an UPDATE of the exchange row after the binding rows. A binding insert
  already holds that lock, taken up front: had it taken KEY SHARE first (as it did), every
  concurrent bind to one exchange would have made a new multixact of the row's lockers and
  its updater, and 8 clients binding to one exchange spent their time in the multixact SLRU
  (60-73 against 149-232 binds/s, docs/performance.md "Scale"); binds to one exchange wait
  for one another at the trigger's UPDATE either way. A binding delete and a queue delete
  lock the exchanges first. Publishers rely on it to keep compiled bindings
  (storage.queries.LOAD_ROUTES).
- Checks that must hold at the moment of a delete (``if_empty``, ``if_unused``, "not a
  dead-letter queue", "last binding gone") are made after the row lock is taken, each in a
  new statement (so with a snapshot that includes every transaction that held a conflicting
  lock). ``FOR UPDATE`` conflicts with the ``FOR KEY SHARE`` lock that every foreign-key
  insert (message, binding, subscription, queue naming it as dead-letter queue) takes on its
  parent, so none of those can slip in between the check and the delete.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import asyncpg
from sqlalchemy import and_, bindparam, cast, delete, exists, func, literal, select, text, true
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.arguments import ALTERNATE_EXCHANGE
from app.domain.model import (
    Binding,
    Exchange,
    ExchangeType,
    MessageStatus,
    Queue,
    QueueStats,
)
from app.errors import NotFound, PreconditionFailed, ValidationFailed
from app.storage import tables
from app.storage.driver_errors import (
    FK_DEAD_LETTER_QUEUE,
    PROGRAM_LIMIT_EXCEEDED,
    constraint,
    sqlstate,
)
from app.storage.fastpath import HotPath, Statement
from app.storage.listing import name_contains
from app.storage.presence import is_live

#: How many times a declare re-reads when the row it conflicted with vanished meanwhile.
_DECLARE_ATTEMPTS = 5

_ex = tables.exchanges
_q = tables.queues
_dlq = tables.queues.alias("dlq")
_b = tables.bindings
_m = tables.messages
_s = tables.subscriptions
_p = tables.broker_processes

T = TypeVar("T")
LockMode = Literal["update", "key_share"]


@dataclass(frozen=True, slots=True)
class Declared(Generic[T]):
    """The outcome of a declare: the stored object, whether this call created it, and the
    properties in which the stored object differs from the declared one (empty = identical)."""

    value: T
    created: bool
    differing: tuple[str, ...] = ()


def _json(value: dict[str, Any]) -> Any:
    """A bound JSONB parameter, so comparisons use jsonb equality (``1 = 1.0``, ``true != 1``),
    the same equality as the unique constraint on bindings."""
    return cast(literal(value, JSONB), JSONB)


def _locked(stmt: Any, lock: LockMode | None) -> Any:
    if lock == "update":
        return stmt.with_for_update()
    if lock == "key_share":
        return stmt.with_for_update(key_share=True, read=True)
    return stmt


# --------------------------------------------------------------------------- exchanges

_EXCHANGE_COLUMNS = (_ex.c.name, _ex.c.type, _ex.c.durable, _ex.c.auto_delete, _ex.c.arguments)


def _exchange(row: Any) -> Exchange:
    return Exchange(
        name=row.name,
        type=ExchangeType(row.type),
        durable=row.durable,
        auto_delete=row.auto_delete,
        arguments=row.arguments,
    )


async def declare_exchange(conn: AsyncConnection, exchange: Exchange) -> Declared[Exchange]:
    insert = (
        pg_insert(_ex)
        .values(
            name=exchange.name,
            type=exchange.type.value,
            durable=exchange.durable,
            auto_delete=exchange.auto_delete,
            arguments=exchange.arguments,
            # routes on (§14); its bindings to other exchanges add to it (the trigger, 0009)
            onward=int(ALTERNATE_EXCHANGE in exchange.arguments),
        )
        .on_conflict_do_nothing(constraint="uq_exchanges_name")
        .returning(*_EXCHANGE_COLUMNS)
    )
    compare = select(
        *_EXCHANGE_COLUMNS, (_ex.c.arguments == _json(exchange.arguments)).label("same_arguments")
    ).where(_ex.c.name == exchange.name)
    for _ in range(_DECLARE_ATTEMPTS):
        created = (await conn.execute(insert)).first()
        if created is not None:
            return Declared(_exchange(created), created=True)
        row = (await conn.execute(compare)).first()
        if row is None:  # deleted between our INSERT and SELECT: try again
            continue
        existing = _exchange(row)
        differing = [
            field
            for field in ("type", "durable", "auto_delete")
            if getattr(existing, field) != getattr(exchange, field)
        ]
        if not row.same_arguments:
            differing.append("arguments")
        return Declared(existing, created=False, differing=tuple(differing))
    raise PreconditionFailed(
        f"exchange '{exchange.name}' is being declared and deleted concurrently"
    )


async def get_exchange(
    conn: AsyncConnection, name: str, *, lock: LockMode | None = None
) -> Exchange | None:
    stmt = _locked(select(*_EXCHANGE_COLUMNS).where(_ex.c.name == name), lock)
    row = (await conn.execute(stmt)).first()
    return _exchange(row) if row is not None else None


async def list_exchanges(
    conn: AsyncConnection, *, after: str | None, limit: int, contains: str | None = None
) -> list[Exchange]:
    """Up to ``limit`` exchanges after ``after``, in byte order of their names; only those
    whose name contains ``contains``, when given."""
    stmt = (
        select(*_EXCHANGE_COLUMNS)
        .where(name_contains(_ex.c.name, contains))
        .order_by(_ex.c.name.collate("C"))
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(_ex.c.name.collate("C") > after)
    return [_exchange(row) for row in await conn.execute(stmt)]


async def exchange_exists(conn: AsyncConnection, name: str) -> bool:
    return bool((await conn.execute(select(exists().where(_ex.c.name == name)))).scalar())


async def delete_exchange(conn: AsyncConnection, name: str, *, if_unused: bool) -> list[str]:
    """Delete an exchange and (by cascade) the bindings it is source or destination of (§14),
    then the auto-delete exchanges that lost their last binding so; returns their names.
    Raises NotFound / PreconditionFailed.

    One statement locks FOR UPDATE, in id order, the exchange and every exchange with a
    binding to it (the cascade's trigger bumps their routing_version, and the auto-delete
    ones may go with it): two exchanges bound to each other and deleted at once lock in the
    same order, so they cannot deadlock. ``if_unused`` is checked after the lock: a
    concurrent binding insert holds (or waits for) FOR KEY SHARE on the exchange, so it
    either committed before our check or fails its foreign key after our delete — never
    bound to a deleted exchange.
    """
    target = select(_ex.c.id).where(_ex.c.name == name).scalar_subquery()
    sources = select(_b.c.exchange_id).where(_b.c.destination_exchange_id == target)
    locked = (
        await conn.execute(
            select(_ex.c.id, _ex.c.name, _ex.c.auto_delete)
            .where((_ex.c.name == name) | _ex.c.id.in_(sources))
            .order_by(_ex.c.id)
            .with_for_update()
        )
    ).all()
    exchange_id = next((row.id for row in locked if row.name == name), None)
    if exchange_id is None:
        raise NotFound(f"exchange '{name}' not found")
    # Declares naming it as dead-letter exchange hold FOR KEY SHARE on its row (see
    # lock_exchange_key_share) until they commit: after our lock, this sees every one.
    referring = await queues_dead_lettering_to(conn, name)
    if referring:
        raise PreconditionFailed(
            f"exchange '{name}' is the dead-letter exchange of: {', '.join(referring)}"
        )
    if if_unused:
        either_end = (_b.c.exchange_id == exchange_id) | (
            _b.c.destination_exchange_id == exchange_id
        )
        used = (await conn.execute(select(exists().where(either_end)))).scalar()
        if used:
            raise PreconditionFailed(
                f"exchange '{name}' is in use (it is the source or destination of bindings)"
            )
    await conn.execute(delete(_ex).where(_ex.c.id == exchange_id))
    return await _delete_unused_auto_delete_exchanges(
        conn, [row.id for row in locked if row.auto_delete and row.id != exchange_id]
    )


_DEAD_LETTERING_TO = text("""
SELECT name FROM queues
WHERE arguments ? 'x-dead-letter-exchange' AND arguments ->> 'x-dead-letter-exchange' = :name
ORDER BY name
""")


async def queues_dead_lettering_to(conn: AsyncConnection, exchange: str) -> list[str]:
    """The queues that name ``exchange`` as their x-dead-letter-exchange, in name order
    (ix_queues_dead_letter_exchange)."""
    rows = await conn.execute(_DEAD_LETTERING_TO, {"name": exchange})
    return [str(r[0]) for r in rows]


async def lock_exchange_key_share(conn: AsyncConnection, name: str) -> bool:
    """Whether exchange ``name`` exists, holding FOR KEY SHARE on it to the commit: a queue
    declared with it as x-dead-letter-exchange cannot see it deleted meanwhile."""
    stmt = select(_ex.c.id).where(_ex.c.name == name).with_for_update(key_share=True)
    return (await conn.execute(stmt)).first() is not None


# -- queue expiry (x-expires, contract §13) ---------------------------------------------

#: A queue with x-expires is used now: its deadline moves to now + x-expires. Rows of other
#: queues have NULL there and are not written.
IDLE_DEADLINE_SQL = (
    "now() + CAST(queues.arguments ->> 'x-expires' AS bigint) * interval '1 millisecond'"
)
_TOUCH_QUEUE = text(f"""
UPDATE queues SET idle_expires_at = {IDLE_DEADLINE_SQL}
WHERE name = :name AND arguments ? 'x-expires'
""")

# Queues past their deadline and with no subscription: candidates for deletion (the delete
# re-checks under its lock). Walks ix_queues_idle_expires_at.
_IDLE_QUEUES = text("""
SELECT q.name FROM queues AS q
WHERE q.idle_expires_at IS NOT NULL AND q.idle_expires_at <= now()
  AND NOT EXISTS (SELECT 1 FROM subscriptions AS s WHERE s.queue_id = q.id)
ORDER BY q.idle_expires_at
LIMIT :n
""")


async def touch_queue(conn: AsyncConnection, name: str) -> None:
    """Push the deadline of queue ``name`` if it has x-expires (declare, re-declare)."""
    await conn.execute(_TOUCH_QUEUE, {"name": name})


_IDLE_QUEUES_HOT = Statement(_IDLE_QUEUES)


async def idle_queues(hot: HotPath, n: int) -> list[str]:
    """One statement on the hot path (no transaction): the sweep runs twice a second on every
    process, and finds nothing almost always."""
    return [str(r[0]) for r in await hot.fetch(_IDLE_QUEUES_HOT, {"n": n})]


async def _delete_unused_auto_delete_exchanges(
    conn: AsyncConnection, exchange_ids: Sequence[int]
) -> list[str]:
    """Delete those of the (already locked) auto-delete exchanges that have no binding left.

    A new statement after the locks were taken, so it sees every committed binding.
    """
    if not exchange_ids:
        return []
    no_binding = ~exists().where(_b.c.exchange_id == _ex.c.id)
    # A queue's x-dead-letter-exchange is never deleted from under it (contract §13).
    dlx = _q.c.arguments.op("->>")(literal("x-dead-letter-exchange"))
    no_dead_letter_use = ~exists().where(
        _q.c.arguments.has_key("x-dead-letter-exchange"), dlx == _ex.c.name
    )
    stmt = (
        delete(_ex)
        .where(_ex.c.id.in_(exchange_ids), _ex.c.auto_delete, no_binding, no_dead_letter_use)
        .returning(_ex.c.name)
    )
    return list((await conn.execute(stmt)).scalars())


# --------------------------------------------------------------------------- queues

_QUEUE_COLUMNS = (
    _q.c.name,
    _q.c.durable,
    _q.c.max_delivery_count,
    _dlq.c.name.label("dead_letter_queue"),
    _q.c.ack_timeout_seconds,
    _q.c.arguments,
)
_QUEUE_FROM = _q.outerjoin(_dlq, _dlq.c.id == _q.c.dead_letter_queue_id)
_QUEUE_PROPERTIES = ("durable", "max_delivery_count", "dead_letter_queue", "ack_timeout_seconds")


def _queue(row: Any) -> Queue:
    return Queue(
        name=row.name,
        durable=row.durable,
        max_delivery_count=row.max_delivery_count,
        dead_letter_queue=row.dead_letter_queue,
        ack_timeout_seconds=row.ack_timeout_seconds,
        arguments=row.arguments,
    )


async def find_queue_id(
    conn: AsyncConnection, name: str, *, lock: LockMode | None = None
) -> int | None:
    stmt = _locked(select(_q.c.id).where(_q.c.name == name), lock)
    queue_id: int | None = (await conn.execute(stmt)).scalar()
    return queue_id


#: Constant statements of the declare (built once; their SQL is compiled once per engine).
_INSERT_QUEUE = pg_insert(_q).on_conflict_do_nothing(constraint="uq_queues_name").returning(_q.c.id)
_COMPARE_QUEUE = (
    select(
        *_QUEUE_COLUMNS,
        (_q.c.arguments == cast(bindparam("arguments", type_=JSONB), JSONB)).label(
            "same_arguments"
        ),
    )
    .select_from(_QUEUE_FROM)
    .where(_q.c.name == bindparam("name"))
)


#: A new queue without a dead-letter queue: one statement on the hot path's executor.
_CREATE_QUEUE = Statement(
    text(
        """
INSERT INTO queues (name, durable, max_delivery_count, ack_timeout_seconds, arguments,
                    idle_expires_at)
VALUES (:name, :durable, :max_delivery_count, :ack_timeout_seconds, CAST(:arguments AS jsonb),
        now() + CAST(CAST(:arguments AS jsonb) ->> 'x-expires' AS bigint)
                * interval '1 millisecond')
ON CONFLICT ON CONSTRAINT uq_queues_name DO NOTHING
RETURNING id
"""
    ).bindparams(bindparam("arguments", type_=JSONB))
)


async def create_queue(hot: HotPath, queue: Queue) -> bool:
    """Insert a queue that names no dead-letter queue, unless one of that name exists:
    whether it did. One statement, no transaction around it (the common declare; the
    comparison with an existing queue is ``declare_queue``'s)."""
    if queue.dead_letter_queue is not None:
        raise ValueError("create_queue is for queues without a dead-letter queue")
    params = {
        "name": queue.name,
        "durable": queue.durable,
        "max_delivery_count": queue.max_delivery_count,
        "ack_timeout_seconds": queue.ack_timeout_seconds,
        "arguments": queue.arguments,
    }
    return bool(await hot.fetch(_CREATE_QUEUE, params))


async def declare_queue(conn: AsyncConnection, queue: Queue) -> Declared[Queue]:
    """Declare a queue. Raises NotFound when its dead-letter queue does not exist.

    The dead-letter queue is locked FOR KEY SHARE (as the foreign key would) so that it cannot
    be deleted between the lookup and our insert; should it vanish anyway, the foreign-key
    violation is reported as the same NotFound. That lock needs ``conn`` in a transaction;
    without a dead-letter queue, an autocommit connection is enough (each statement stands
    alone at READ COMMITTED anyway), and a new queue costs one round trip.
    """
    dlq_id: int | None = None
    if queue.dead_letter_queue is not None:
        dlq_id = await find_queue_id(conn, queue.dead_letter_queue, lock="key_share")
        if dlq_id is None:
            raise NotFound(f"dead-letter queue '{queue.dead_letter_queue}' not found")
    values = {
        "name": queue.name,
        "durable": queue.durable,
        "max_delivery_count": queue.max_delivery_count,
        "dead_letter_queue_id": dlq_id,
        "ack_timeout_seconds": queue.ack_timeout_seconds,
        "arguments": queue.arguments,
    }
    compare = {"name": queue.name, "arguments": queue.arguments}
    for _ in range(_DECLARE_ATTEMPTS):
        try:
            created = (await conn.execute(_INSERT_QUEUE, values)).first()
        except IntegrityError as exc:
            if constraint(exc) == FK_DEAD_LETTER_QUEUE:
                raise NotFound(f"dead-letter queue '{queue.dead_letter_queue}' not found") from None
            raise
        if created is not None:
            return Declared(queue, created=True)
        row = (await conn.execute(_COMPARE_QUEUE, compare)).first()
        if row is None:  # deleted between our INSERT and SELECT: try again
            continue
        existing = _queue(row)
        differing = [f for f in _QUEUE_PROPERTIES if getattr(existing, f) != getattr(queue, f)]
        if not row.same_arguments:
            differing.append("arguments")
        return Declared(existing, created=False, differing=tuple(differing))
    raise PreconditionFailed(f"queue '{queue.name}' is being declared and deleted concurrently")


async def get_queue(conn: AsyncConnection, name: str) -> Queue | None:
    stmt = select(*_QUEUE_COLUMNS).select_from(_QUEUE_FROM).where(_q.c.name == name)
    row = (await conn.execute(stmt)).first()
    return _queue(row) if row is not None else None


async def list_queues(
    conn: AsyncConnection, *, after: str | None, limit: int, contains: str | None = None
) -> list[Queue]:
    """Up to ``limit`` queues after ``after``, in byte order of their names (no stats); only
    those whose name contains ``contains``, when given."""
    stmt = (
        select(*_QUEUE_COLUMNS)
        .select_from(_QUEUE_FROM)
        .where(name_contains(_q.c.name, contains))
        .order_by(_q.c.name.collate("C"))
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(_q.c.name.collate("C") > after)
    return [_queue(row) for row in await conn.execute(stmt)]


def _live_subscriptions(queue_id: Any) -> Any:
    """Subscriptions of ``queue_id`` whose broker process heartbeated recently (database clock)."""
    return (
        select(_s.c.connection_id)
        .select_from(_s.join(_p, _p.c.id == _s.c.process_id))
        .where(_s.c.queue_id == queue_id, is_live(_p.c.heartbeat_at))
    )


def _stats_columns() -> tuple[Any, Any]:
    """Two LATERAL aggregates of a queue row ``_q``: its message counts by status (through
    ix_messages_queue) and its live consumers. ``delayed`` is derived: ready with
    ``available_at`` still ahead of the database clock."""
    ready = _m.c.status == MessageStatus.READY.value
    counts = (
        select(
            func.count().filter(and_(ready, _m.c.available_at <= func.now())).label("ready"),
            func.count().filter(and_(ready, _m.c.available_at > func.now())).label("delayed"),
            func.count().filter(_m.c.status == MessageStatus.IN_FLIGHT.value).label("in_flight"),
            func.count().filter(_m.c.status == MessageStatus.DEAD.value).label("dead"),
        )
        .where(_m.c.queue_id == _q.c.id)
        .lateral("counts")
    )
    consumers = (
        select(func.count().label("consumers"))
        .select_from(_s.join(_p, _p.c.id == _s.c.process_id))
        .where(_s.c.queue_id == _q.c.id, is_live(_p.c.heartbeat_at))
        .lateral("consumers")
    )
    return counts, consumers


def _stats_of(row: Any) -> QueueStats:
    return QueueStats(
        ready=row.ready,
        delayed=row.delayed,
        in_flight=row.in_flight,
        dead=row.dead,
        consumers=row.consumers,
    )


async def queue_stats(conn: AsyncConnection, names: Sequence[str]) -> dict[str, QueueStats]:
    """Stats of the named queues, in ONE statement whatever their number (``_stats_columns``).
    Missing queues are simply absent from the result."""
    if not names:
        return {}
    counts, consumers = _stats_columns()
    stmt = (
        select(_q.c.name, counts, consumers)
        .select_from(_q.join(counts, true()).join(consumers, true()))
        .where(_q.c.name.in_(list(names)))
    )
    return {row.name: _stats_of(row) for row in await conn.execute(stmt)}


async def deepest_queues(
    conn: AsyncConnection, limit: int
) -> tuple[int, list[tuple[str, QueueStats]]]:
    """The number of queues, and the stats of the ``limit`` queues holding the most copies
    (then by name), in ONE statement: what ``/metrics`` exports per queue."""
    counts, consumers = _stats_columns()
    depth = counts.c.ready + counts.c.delayed + counts.c.in_flight + counts.c.dead
    stmt = (
        select(_q.c.name, counts, consumers, func.count().over().label("queues"))
        .select_from(_q.join(counts, true()).join(consumers, true()))
        .order_by(depth.desc(), _q.c.name.collate("C"))
        .limit(limit)
    )
    rows = (await conn.execute(stmt)).all()
    total = rows[0].queues if rows else await conn.scalar(select(func.count()).select_from(_q))
    return int(total or 0), [(row.name, _stats_of(row)) for row in rows]


# x-expires: still past its deadline and unsubscribed, once the queue row is locked (a
# subscribe's insert and a get's touch wait for that lock, or committed before it).
_STILL_IDLE = text("""
SELECT q.idle_expires_at <= now()
       AND NOT EXISTS (SELECT 1 FROM subscriptions AS s WHERE s.queue_id = q.id)
FROM queues AS q WHERE q.id = :id
""")


async def delete_queue(
    conn: AsyncConnection, name: str, *, if_empty: bool, if_unused: bool, if_idle: bool = False
) -> list[str]:
    """Delete a queue with (by cascade) its messages, bindings and subscriptions, then the
    auto-delete exchanges that lost their last binding; returns the names of those exchanges.

    Raises NotFound, or PreconditionFailed when the queue is another queue's dead-letter
    queue or ``if_empty`` / ``if_unused`` do not hold. The queue row is locked FOR UPDATE
    before those checks: message inserts (publish, dead-lettering), subscription inserts and
    declares naming it as dead-letter queue all take FOR KEY SHARE on it and so cannot
    interleave between check and delete.
    """
    queue_id = await find_queue_id(conn, name, lock="update")
    if queue_id is None:
        raise NotFound(f"queue '{name}' not found")
    referring = list(
        (
            await conn.execute(
                select(_q.c.name)
                .where(_q.c.dead_letter_queue_id == queue_id)
                .order_by(_q.c.name.collate("C"))
            )
        ).scalars()
    )
    if referring:
        raise PreconditionFailed(
            f"queue '{name}' is the dead-letter queue of: {', '.join(referring)}"
        )
    if (
        if_empty
        and (await conn.execute(select(exists().where(_m.c.queue_id == queue_id)))).scalar()
    ):
        raise PreconditionFailed(f"queue '{name}' is not empty")
    if if_unused and (await conn.execute(select(_live_subscriptions(queue_id).exists()))).scalar():
        raise PreconditionFailed(f"queue '{name}' is in use (it has consumers)")
    if if_idle and not (await conn.execute(_STILL_IDLE, {"id": queue_id})).scalar():
        raise PreconditionFailed(f"queue '{name}' was used again")
    # Lock the exchanges bound to this queue, in id order, before the cascade touches
    # bindings (lock order queue → exchange → bindings, as everywhere else): the auto-delete
    # ones may go with it, and the cascade's trigger bumps every one's routing_version.
    bound = (
        await conn.execute(
            select(_ex.c.id, _ex.c.auto_delete)
            .where(_ex.c.id.in_(select(_b.c.exchange_id).where(_b.c.queue_id == queue_id)))
            .order_by(_ex.c.id)
            .with_for_update()
        )
    ).all()
    auto_delete_ids = [row.id for row in bound if row.auto_delete]
    try:
        await conn.execute(delete(_q).where(_q.c.id == queue_id))
    except IntegrityError as exc:  # the lock makes this unreachable; keep the 409 regardless
        if constraint(exc) == FK_DEAD_LETTER_QUEUE:
            raise PreconditionFailed(
                f"queue '{name}' is another queue's dead-letter queue"
            ) from None
        raise
    return await _delete_unused_auto_delete_exchanges(conn, auto_delete_ids)


async def purge_queue(conn: AsyncConnection, name: str) -> int:
    """Delete the queue's ready (delayed included) and dead messages; in-flight ones stay.

    A message being claimed concurrently is row-locked by its claimer; the DELETE waits for it
    and re-checks its status, so a message that has just gone in flight is left alone.
    """
    queue_id = await find_queue_id(conn, name)
    if queue_id is None:
        raise NotFound(f"queue '{name}' not found")
    result = await conn.execute(
        delete(_m).where(
            _m.c.queue_id == queue_id,
            _m.c.status.in_([MessageStatus.READY.value, MessageStatus.DEAD.value]),
        )
    )
    return int(result.rowcount)


# --------------------------------------------------------------------------- bindings

_dex = tables.exchanges.alias("destination_exchange")
_BINDING_COLUMNS = (
    _b.c.id,
    _ex.c.name.label("exchange"),
    _q.c.name.label("queue"),
    _b.c.routing_key,
    _b.c.arguments,
    _dex.c.name.label("destination_exchange"),
)
_BINDING_FROM = (
    _b.join(_ex, _ex.c.id == _b.c.exchange_id)
    .outerjoin(_q, _q.c.id == _b.c.queue_id)
    .outerjoin(_dex, _dex.c.id == _b.c.destination_exchange_id)
)


def _binding(row: Any) -> Binding:
    return Binding(
        id=row.id,
        exchange=row.exchange,
        queue=row.queue,
        routing_key=row.routing_key,
        arguments=row.arguments,
        destination_exchange=row.destination_exchange,
    )


@dataclass(frozen=True, slots=True)
class BindingEnds:
    """The locked exchange and queue of a binding about to be created."""

    exchange_id: int
    exchange_type: ExchangeType
    queue_id: int


def _key_share(stmt: Any) -> Any:
    return stmt.with_for_update(key_share=True, read=True).scalar_subquery()


def _no_key_update(stmt: Any) -> Any:
    return stmt.with_for_update(key_share=True).scalar_subquery()


#: Both ends of a new binding locked in ONE statement: the select list's subqueries run in
#: order, so the queue is locked before the exchange (the one lock order). The exchange's
#: type is immutable; it is read beside the lock, from the same snapshot.
_LOCK_BINDING_ENDS = select(
    _key_share(select(_q.c.id).where(_q.c.name == bindparam("queue"))).label("queue_id"),
    _no_key_update(select(_ex.c.id).where(_ex.c.name == bindparam("exchange"))).label(
        "exchange_id"
    ),
    select(_ex.c.type)
    .where(_ex.c.name == bindparam("exchange"))
    .scalar_subquery()
    .label("exchange_type"),
)


async def lock_binding_ends(conn: AsyncConnection, exchange: str, queue: str) -> BindingEnds:
    """Lock the queue FOR KEY SHARE, then the exchange FOR NO KEY UPDATE (the locks the
    binding's foreign key and routing_version trigger would take, in the one lock order).
    Raises NotFound (the exchange is reported first)."""
    row = (await conn.execute(_LOCK_BINDING_ENDS, {"queue": queue, "exchange": exchange})).one()
    if row.exchange_id is None:
        raise NotFound(f"exchange '{exchange}' not found")
    if row.queue_id is None:
        raise NotFound(f"queue '{queue}' not found")
    return BindingEnds(row.exchange_id, ExchangeType(row.exchange_type), row.queue_id)


_INSERT_BINDING = (
    pg_insert(_b)
    .on_conflict_do_nothing(constraint="uq_bindings_exchange_id_queue_id_routing_key_arguments")
    .returning(_b.c.id)
)
_FIND_BINDING = select(_b.c.id).where(
    _b.c.exchange_id == bindparam("exchange_id"),
    _b.c.queue_id == bindparam("queue_id"),
    _b.c.routing_key == bindparam("routing_key"),
    _b.c.arguments == cast(bindparam("arguments", type_=JSONB), JSONB),
)


def _too_large(exc: Exception) -> ValidationFailed | None:
    """The unique index holds key and arguments; PostgreSQL caps an index row's size."""
    if sqlstate(exc) != PROGRAM_LIMIT_EXCEEDED:
        return None
    return ValidationFailed.on_field(
        "arguments",
        "the binding's arguments are too large",
        "too large: keep routing key and arguments under 2 kB",
    )


async def create_binding(
    conn: AsyncConnection,
    ends: BindingEnds,
    *,
    routing_key: str,
    arguments: dict[str, Any],
) -> tuple[int, bool]:
    """Insert the binding unless an identical one exists: its id, and whether it is new.

    ON CONFLICT DO NOTHING on (exchange, queue, key, arguments) makes concurrent identical
    creates idempotent; the follow-up SELECT sees the winner (new statement, new snapshot).
    """
    values = {
        "exchange_id": ends.exchange_id,
        "queue_id": ends.queue_id,
        "routing_key": routing_key,
        "arguments": arguments,
    }
    return await _insert_or_find(conn, _INSERT_BINDING, _FIND_BINDING, values)


async def _insert_or_find(
    conn: AsyncConnection, insert: Any, find: Any, values: dict[str, Any]
) -> tuple[int, bool]:
    """``insert`` (ON CONFLICT DO NOTHING RETURNING id), else ``find`` the identical row:
    (id, whether inserted)."""
    for _ in range(_DECLARE_ATTEMPTS):
        try:
            new_id = (await conn.execute(insert, values)).scalar()
        except DBAPIError as exc:
            raise (_too_large(exc) or exc) from None
        if new_id is not None:
            return int(new_id), True
        old_id = (await conn.execute(find, values)).scalar()
        if old_id is not None:
            return int(old_id), False
        # The identical binding was deleted between our two statements: try again.
    raise PreconditionFailed("the binding is being created and deleted concurrently")


#: lock_binding_ends and create_binding's INSERT in ONE statement, for an autocommit
#: connection: no round trip between the exchange's row lock (the one its routing_version
#: trigger takes, which every bind to that exchange waits for) and the commit. The
#: ends are locked in the one order (queue, then exchange: the select list's subqueries run
#: in order; the CTE is evaluated once, before the INSERT reads it). The caller checks the
#: arguments first: only arguments valid for every exchange type may come this way.
_BIND = text(
    """
WITH ends AS MATERIALIZED (
    SELECT (SELECT id FROM queues WHERE name = :queue FOR KEY SHARE) AS queue_id,
           (SELECT id FROM exchanges WHERE name = :exchange FOR NO KEY UPDATE) AS exchange_id
), inserted AS (
    INSERT INTO bindings (exchange_id, queue_id, routing_key, arguments)
    SELECT exchange_id, queue_id, :routing_key, CAST(:arguments AS jsonb)
    FROM ends WHERE queue_id IS NOT NULL AND exchange_id IS NOT NULL
    ON CONFLICT ON CONSTRAINT uq_bindings_exchange_id_queue_id_routing_key_arguments DO NOTHING
    RETURNING id
)
SELECT ends.queue_id, ends.exchange_id, (SELECT id FROM inserted) AS new_id FROM ends
"""
).bindparams(bindparam("arguments", type_=JSONB))


_BIND_HOT = Statement(_BIND)
_FIND_BINDING_HOT = Statement(
    text(
        """
SELECT id FROM bindings
WHERE exchange_id = :exchange_id AND queue_id = :queue_id AND routing_key = :routing_key
  AND arguments = CAST(:arguments AS jsonb)
"""
    )
)


async def bind(
    hot: HotPath, exchange: str, queue: str, *, routing_key: str, arguments: dict[str, Any]
) -> tuple[int, bool]:
    """Bind in one statement per attempt, on the hot path's executor: (binding id, created).

    Raises NotFound (the exchange is reported first), ValidationFailed when too large.
    """
    params = {"queue": queue, "exchange": exchange, "routing_key": routing_key}
    for _ in range(_DECLARE_ATTEMPTS):
        async with hot.connection() as conn:
            try:
                row = await conn.fetchrow(
                    _BIND_HOT.sql, *_BIND_HOT.args({**params, "arguments": arguments})
                )
            except asyncpg.PostgresError as exc:
                raise (_too_large(exc) or exc) from None
        if row["exchange_id"] is None:
            raise NotFound(f"exchange '{exchange}' not found")
        if row["queue_id"] is None:
            raise NotFound(f"queue '{queue}' not found")
        if row["new_id"] is not None:
            return int(row["new_id"]), True
        found = {
            "exchange_id": row["exchange_id"],
            "queue_id": row["queue_id"],
            "routing_key": routing_key,
            "arguments": arguments,
        }
        old_id = await hot.fetchval(_FIND_BINDING_HOT, found)
        if old_id is not None:
            return int(old_id), False
        # The identical binding was deleted between our two statements: try again.
    raise PreconditionFailed("the binding is being created and deleted concurrently")


#: Both exchanges of a new exchange-to-exchange binding locked FOR KEY SHARE in ONE
#: statement (the destination first, as a queue binding locks its queue first), with the
#: source's type (immutable) for checking the arguments.
_LOCK_E2E_ENDS = select(
    _key_share(select(_ex.c.id).where(_ex.c.name == bindparam("destination"))).label(
        "destination_id"
    ),
    _key_share(select(_ex.c.id).where(_ex.c.name == bindparam("exchange"))).label("exchange_id"),
    select(_ex.c.type)
    .where(_ex.c.name == bindparam("exchange"))
    .scalar_subquery()
    .label("exchange_type"),
)
_E2E_WHERE = _b.c.destination_exchange_id.isnot(None)
_INSERT_E2E = (
    pg_insert(_b)
    .on_conflict_do_nothing(
        index_elements=["exchange_id", "destination_exchange_id", "routing_key", "arguments"],
        index_where=_E2E_WHERE,
    )
    .returning(_b.c.id)
)
_FIND_E2E = select(_b.c.id).where(
    _b.c.exchange_id == bindparam("exchange_id"),
    _b.c.destination_exchange_id == bindparam("destination_exchange_id"),
    _b.c.routing_key == bindparam("routing_key"),
    _b.c.arguments == cast(bindparam("arguments", type_=JSONB), JSONB),
)


async def lock_exchange_binding_ends(
    conn: AsyncConnection, exchange: str, destination: str
) -> tuple[int, int, ExchangeType]:
    """Lock the destination, then the source exchange, FOR KEY SHARE: (source id, destination
    id, source type). Raises NotFound (the source is reported first)."""
    row = (
        await conn.execute(_LOCK_E2E_ENDS, {"exchange": exchange, "destination": destination})
    ).one()
    if row.exchange_id is None:
        raise NotFound(f"exchange '{exchange}' not found")
    if row.destination_id is None:
        raise NotFound(f"destination exchange '{destination}' not found")
    return row.exchange_id, row.destination_id, ExchangeType(row.exchange_type)


async def create_exchange_binding(
    conn: AsyncConnection,
    exchange_id: int,
    destination_id: int,
    *,
    routing_key: str,
    arguments: dict[str, Any],
) -> tuple[int, bool]:
    """Insert the exchange-to-exchange binding unless an identical one exists: its id, and
    whether it is new (as ``create_binding``, on the partial unique index of e2e rows)."""
    values = {
        "exchange_id": exchange_id,
        "destination_exchange_id": destination_id,
        "routing_key": routing_key,
        "arguments": arguments,
    }
    return await _insert_or_find(conn, _INSERT_E2E, _FIND_E2E, values)


async def get_binding(conn: AsyncConnection, binding_id: int) -> Binding | None:
    stmt = select(*_BINDING_COLUMNS).select_from(_BINDING_FROM).where(_b.c.id == binding_id)
    row = (await conn.execute(stmt)).first()
    return _binding(row) if row is not None else None


async def list_bindings(
    conn: AsyncConnection,
    *,
    after: int | None,
    limit: int,
    exchange: str | None = None,
    queue: str | None = None,
    destination_exchange: str | None = None,
) -> list[Binding]:
    """Up to ``limit`` bindings with an id above ``after``, by id; optionally filtered."""
    stmt = select(*_BINDING_COLUMNS).select_from(_BINDING_FROM).order_by(_b.c.id).limit(limit)
    if after is not None:
        stmt = stmt.where(_b.c.id > after)
    if exchange is not None:
        stmt = stmt.where(_ex.c.name == exchange)
    if queue is not None:
        stmt = stmt.where(_q.c.name == queue)
    if destination_exchange is not None:
        stmt = stmt.where(_dex.c.name == destination_exchange)
    return [_binding(row) for row in await conn.execute(stmt)]


async def delete_binding(conn: AsyncConnection, binding_id: int) -> tuple[bool, list[str]]:
    """Delete a binding; then its exchange too if that is auto-delete and this was its last
    binding. Returns (deleted, names of the exchanges deleted with it).

    An auto-delete exchange is locked FOR UPDATE before the binding row is touched (exchange
    → binding, the one lock order), so two concurrent deletes of its last two bindings cannot
    both miss that the exchange became unused, and a concurrent bind either commits first
    (the exchange stays) or finds the exchange gone (404).
    """
    row = (
        await conn.execute(
            select(_b.c.exchange_id, _ex.c.auto_delete)
            .select_from(_b.join(_ex, _ex.c.id == _b.c.exchange_id))
            .where(_b.c.id == binding_id)
        )
    ).first()
    if row is None:
        return False, []
    exchange_id, auto_delete = row.exchange_id, row.auto_delete
    # Lock the exchange before the binding row (the lock order): the delete's trigger
    # updates its routing_version. FOR UPDATE when it may be deleted with its last binding
    # (auto_delete is immutable, so reading it before the lock is fine).
    lock = select(_ex.c.id).where(_ex.c.id == exchange_id)
    await conn.execute(lock.with_for_update(key_share=not auto_delete))
    deleted = (
        await conn.execute(delete(_b).where(_b.c.id == binding_id).returning(_b.c.id))
    ).scalar()
    if deleted is None:
        return False, []
    if not auto_delete:
        return True, []
    return True, await _delete_unused_auto_delete_exchanges(conn, [exchange_id])
