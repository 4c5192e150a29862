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


#: The overview's plan settings, for its transaction only (``set_config(..., true)``):
#: counting a million messages
#: from the partial indexes (index-only scans of ix_messages_claim, ix_messages_lease and
#: ix_messages_dead) takes about two thirds of the time of the sequential scan of the table
#: that PostgreSQL otherwise prefers for a count of nearly every row (docs/performance.md,
#: "Scale").
OVERVIEW_SETTINGS = (
    "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)"
)


def _overview_query() -> Select[Any]:
    """Every count of ``GET /overview`` in one statement (one snapshot, one round trip).

    - ``delayed`` is derived: a ready row whose ``available_at`` is still in the future
      (database clock), exactly as browse and queue stats define it.
    - ``connections`` and ``subscriptions`` count only live broker processes (heartbeat
      within the window); a crashed process's rows linger until a survivor removes them.
    - The message counts are one count per status, each over its partial index (ready
      rows with their ``available_at`` in ix_messages_claim; in-flight and dead rows in
      their own), so none reads the table's rows (with OVERVIEW_SETTINGS).
    """
    now = func.now()
    live = broker_processes.c.heartbeat_at > now - LIVE_PROCESS_WINDOW
    m = messages.c
    ready_counts = (
        select(
            func.count().filter(m.available_at <= now).label("ready"),
            func.count().filter(m.available_at > now).label("delayed"),
        )
        .where(m.status == "ready")
        .subquery("m")
    )

    def status_count(status: str) -> Any:
        return select(func.count()).where(m.status == status).scalar_subquery()

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
        ready_counts.c.ready,
        ready_counts.c.delayed,
        status_count("in_flight").label("in_flight"),
        status_count("dead").label("dead"),
        connection_sum.label("connections"),
        subscription_count.label("subscriptions"),
    ).select_from(ready_counts)


async def overview_counts(conn: AsyncConnection) -> OverviewCounts:
    """The counts; ``conn`` must be in a transaction (OVERVIEW_SETTINGS are for it only)."""
    await conn.execute(text(OVERVIEW_SETTINGS))
    row = (await conn.execute(_overview_query())).one()
    return OverviewCounts(**{key: int(value) for key, value in row._mapping.items()})
