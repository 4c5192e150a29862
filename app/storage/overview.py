"""The operations queries: readiness probe and the broker-wide overview counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.storage.presence import is_live
from app.storage.tables import broker_processes, exchanges, messages, queues, subscriptions


@dataclass(frozen=True, slots=True)
class MessageCounts:
    ready: int
    delayed: int
    in_flight: int
    dead: int


@dataclass(frozen=True, slots=True)
class ResourceCounts:
    queues: int
    exchanges: int
    connections: int
    subscriptions: int


@dataclass(frozen=True, slots=True)
class OverviewCounts:
    resources: ResourceCounts
    messages: MessageCounts


async def ping(conn: AsyncConnection) -> None:
    """One round trip: proves the database answers."""
    await conn.execute(text("SELECT 1"))


async def schema_revision(conn: AsyncConnection) -> str | None:
    """The alembic revision the database is at (None: never migrated).

    Plain SQL rather than alembic's MigrationContext, which logs at INFO on every call: a
    readiness probe runs every few seconds.
    """
    exists = await conn.scalar(text("SELECT to_regclass('alembic_version') IS NOT NULL"))
    if not exists:
        return None
    rows = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
    return str(rows[0]) if len(rows) == 1 else None


def _message_counts() -> Select[int, int, int, int]:
    """The messages by status: one scan of ``messages`` with FILTERed aggregates.

    ``delayed`` is derived: a ready row whose ``available_at`` is still in the future
    (database clock), exactly as browse and queue stats define it. Its cost grows with the
    table (about 150 ms a million rows on the 2-core VM), which is why the overview service
    may answer from its last count (``broker/overview.py``).
    """
    now = func.now()
    m = messages.c
    ready_now = (m.status == "ready") & (m.available_at <= now)
    delayed = (m.status == "ready") & (m.available_at > now)
    return select(
        func.count().filter(ready_now).label("ready"),
        func.count().filter(delayed).label("delayed"),
        func.count().filter(m.status == "in_flight").label("in_flight"),
        func.count().filter(m.status == "dead").label("dead"),
    )


def _resource_columns() -> list[Any]:
    """Queues, exchanges, connections and subscriptions: cheap counts, always current.

    ``connections`` and ``subscriptions`` count only live broker processes (heartbeat
    within the window); a crashed process's rows linger until a survivor removes them.
    """
    live = is_live(broker_processes.c.heartbeat_at)
    connection_sum = (
        select(func.coalesce(func.sum(broker_processes.c.connections), 0))
        .where(live)
        .scalar_subquery()
    )
    subscription_count = (
        select(func.count())
        .select_from(
            subscriptions.join(
                broker_processes, broker_processes.c.id == subscriptions.c.process_id
            )
        )
        .where(live)
        .scalar_subquery()
    )
    return [
        select(func.count()).select_from(queues).scalar_subquery().label("queues"),
        select(func.count()).select_from(exchanges).scalar_subquery().label("exchanges"),
        connection_sum.label("connections"),
        subscription_count.label("subscriptions"),
    ]


def _overview_query() -> Select[Any]:
    """Every count of ``GET /overview`` in one statement (one snapshot, one round trip)."""
    m = _message_counts().subquery("m")
    return select(*_resource_columns(), m.c.ready, m.c.delayed, m.c.in_flight, m.c.dead)


def _ints(row: Any, keys: tuple[str, ...]) -> dict[str, int]:
    return {key: int(row._mapping[key]) for key in keys}


_MESSAGE_KEYS = ("ready", "delayed", "in_flight", "dead")
_RESOURCE_KEYS = ("queues", "exchanges", "connections", "subscriptions")


async def overview_counts(conn: AsyncConnection) -> OverviewCounts:
    """Every count, from one snapshot."""
    row = (await conn.execute(_overview_query())).one()
    return OverviewCounts(
        resources=ResourceCounts(**_ints(row, _RESOURCE_KEYS)),
        messages=MessageCounts(**_ints(row, _MESSAGE_KEYS)),
    )


async def message_counts_on_one_core(conn: AsyncConnection) -> MessageCounts:
    """The message counts with no parallel workers (in the caller's transaction): slower
    alone, but a count made in the background leaves the other cores to the requests."""
    await conn.execute(text("SET LOCAL max_parallel_workers_per_gather = 0"))
    row = (await conn.execute(_message_counts())).one()
    return MessageCounts(**_ints(row, _MESSAGE_KEYS))


async def resource_counts(conn: AsyncConnection) -> ResourceCounts:
    row = (await conn.execute(select(*_resource_columns()))).one()
    return ResourceCounts(**_ints(row, _RESOURCE_KEYS))
