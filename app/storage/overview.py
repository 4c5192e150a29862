"""The operations queries: readiness probe and the broker-wide overview counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, literal_column, select, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from app.storage.tables import broker_processes, exchanges, messages, queues, subscriptions

#: A broker process whose heartbeat is older than this is dead; its rows do not count.
LIVE_PROCESS_WINDOW: ColumnElement[Any] = literal_column("interval '15 seconds'")


@dataclass(frozen=True, slots=True)
class OverviewCounts:
    queues: int
    exchanges: int
    ready: int
    delayed: int
    in_flight: int
    dead: int
    connections: int
    subscriptions: int


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


def _overview_query() -> Select[Any]:
    """Every count of ``GET /overview`` in one statement (one snapshot, one round trip).

    - ``delayed`` is derived: a ready row whose ``available_at`` is still in the future
      (database clock), exactly as browse and queue stats define it.
    - ``connections`` and ``subscriptions`` count only live broker processes (heartbeat
      within the window); a crashed process's rows linger until a survivor removes them.
    - The message counts scan ``messages`` once with FILTERed aggregates; it is an admin
      call, not a hot path.
    """
    now = func.now()
    live = broker_processes.c.heartbeat_at > now - LIVE_PROCESS_WINDOW
    m = messages.c
    ready_now = (m.status == "ready") & (m.available_at <= now)
    delayed = (m.status == "ready") & (m.available_at > now)
    message_counts = select(
        func.count().filter(ready_now).label("ready"),
        func.count().filter(delayed).label("delayed"),
        func.count().filter(m.status == "in_flight").label("in_flight"),
        func.count().filter(m.status == "dead").label("dead"),
    ).subquery("m")
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
    return select(
        select(func.count()).select_from(queues).scalar_subquery().label("queues"),
        select(func.count()).select_from(exchanges).scalar_subquery().label("exchanges"),
        message_counts.c.ready,
        message_counts.c.delayed,
        message_counts.c.in_flight,
        message_counts.c.dead,
        connection_sum.label("connections"),
        subscription_count.label("subscriptions"),
    ).select_from(message_counts)


async def overview_counts(conn: AsyncConnection) -> OverviewCounts:
    row = (await conn.execute(_overview_query())).one()
    return OverviewCounts(**{key: int(value) for key, value in row._mapping.items()})
