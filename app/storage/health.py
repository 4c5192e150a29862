"""What the database's own statistics say about the broker's health (not its data).

``oldest_xmin_holder``: the oldest snapshot on the broker's database that keeps VACUUM from
removing dead rows — a session's ``backend_xmin`` (an open ``REPEATABLE READ`` transaction, a
long report, a forgotten ``psql`` in a transaction) or a replication slot's ``xmin`` /
``catalog_xmin``. While it is held, every ACKed message's row stays in the table as a dead
tuple, and the messages table and its indexes grow (docs/reliability.md, "A held snapshot").
One query over two small views, cheap enough to run every few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

#: Sessions of this database holding back cleanup (a snapshot, ``backend_xmin``, or a
#: transaction id of their own, ``backend_xid``; autovacuum workers excepted: VACUUM ignores
#: their xmin) and replication slots holding an xmin, the oldest first (by transaction-id
#: age). A session's age is that of its transaction; a slot has no start time (age_seconds
#: NULL). The one query behind both the xmin watch (:n = 1) and diagnosis (contract §19).
XMIN_HOLDERS = text("""
SELECT kind, pid, name, state, age_seconds, xid_age FROM (
    SELECT 'session' AS kind, pid, application_name AS name, state,
           extract(epoch FROM now() - coalesce(xact_start, query_start, backend_start))::float8
               AS age_seconds,
           greatest(age(backend_xmin), age(backend_xid)) AS xid_age
    FROM pg_stat_activity
    WHERE datname = current_database()
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
      AND pid <> pg_backend_pid() AND backend_type <> 'autovacuum worker'
    UNION ALL
    SELECT 'replication slot', active_pid, slot_name, CASE WHEN active THEN 'active'
           ELSE 'inactive' END, NULL,
           greatest(age(xmin), age(catalog_xmin))
    FROM pg_replication_slots
    WHERE (xmin IS NOT NULL OR catalog_xmin IS NOT NULL)
      AND (database IS NULL OR database = current_database())
) holders
ORDER BY xid_age DESC
LIMIT :n
""")


@dataclass(frozen=True)
class XminHolder:
    """Who holds the oldest snapshot: a session (``pid``, application ``name``, ``state``,
    its transaction's age in seconds) or a replication slot (``name``; its ``pid`` when
    active; no age in seconds). ``xid_age``: how many transactions old its xmin is."""

    kind: str  # "session" | "replication slot"
    pid: int | None
    name: str
    state: str | None
    age_seconds: float | None
    xid_age: int


async def xmin_holders(conn: AsyncConnection, n: int) -> list[XminHolder]:
    """The ``n`` oldest holders of a snapshot blocking cleanup on this database."""
    return [
        XminHolder(
            kind=row.kind,
            pid=row.pid,
            name=row.name or "",
            state=row.state,
            age_seconds=row.age_seconds,
            xid_age=int(row.xid_age),
        )
        for row in await conn.execute(XMIN_HOLDERS, {"n": n})
    ]


async def oldest_xmin_holder(conn: AsyncConnection) -> XminHolder | None:
    """The oldest snapshot blocking cleanup on this database, or None when nothing holds one."""
    holders = await xmin_holders(conn, 1)
    return holders[0] if holders else None


#: Whether autovacuum will visit ``messages``: on for the server and not disabled on the table.
AUTOVACUUM_ON_MESSAGES = text("""
SELECT current_setting('autovacuum')::bool AND coalesce(
    (SELECT option_value::bool FROM pg_class AS c, pg_options_to_table(c.reloptions)
     WHERE c.oid = 'messages'::regclass AND option_name = 'autovacuum_enabled'),
    true)
""")


async def autovacuum_on_messages(conn: AsyncConnection) -> bool:
    """False when nothing will ever reclaim the dead rows that every ACK leaves in
    ``messages``: the table then grows without bound (docs/operations.md, "Bloat and
    autovacuum")."""
    return bool((await conn.execute(AUTOVACUUM_ON_MESSAGES)).scalar_one())
