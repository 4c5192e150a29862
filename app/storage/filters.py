"""Operations on a queue's copies by filter (contract §17): the one WHERE builder, and the
query, count, move and delete statements built on it.

``where`` turns a ``MessageFilter`` into one SQL condition over ``messages AS m`` with bound
parameters only (no value is ever spliced into the text): the status as browse and stats
define it (``delayed`` = ready with ``available_at`` after ``now()``); the routing key by
equality, or by a regular expression (``domain.filters.topic_regex``) for a pattern with
wildcards; each header by ``jsonb`` equality (value and type, ``1`` = ``1.0``, as routing
compares them), all pairs travelling as one ``jsonb`` object; message ids by ``= ANY``;
``created_at`` bounds; ``delivery_count >=``; the newest ``x-death`` entry's reason.

Move and delete are ONE statement each, whatever their size: a CTE picks up to ``:limit``
matching copies of the source in id order ``FOR UPDATE SKIP LOCKED`` — a copy a claim holds
is skipped, and one claimed since the statement's snapshot is re-checked after the lock
(READ COMMITTED), is in flight and so no longer matches: in-flight copies are never
touched — and the outer UPDATE or DELETE works through that id set by primary key. Nothing
runs row by row in Python, and no lock is taken beyond the rows moved and the target queue
rows (``KEY SHARE``, so that a target cannot be deleted under the move): publishes and
claims on other queues do not wait for it. The caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.domain.filters import MessageFilter, is_wildcard_free, topic_regex
from app.domain.model import BrowseStatus, StoredMessage
from app.errors import NotFound
from app.storage.deliveries import TARGET_EXPIRES_AT, TARGET_PRIORITY
from app.storage.driver_errors import FK_MESSAGES_QUEUE, constraint
from app.storage.fastpath import jsonb_text
from app.storage.messages import BROWSE_COLUMNS, stored_message

_STATUS_SQL = {
    BrowseStatus.READY: "(m.status = 'ready' AND m.available_at <= now())",
    BrowseStatus.DELAYED: "(m.status = 'ready' AND m.available_at > now())",
    BrowseStatus.IN_FLIGHT: "m.status = 'in_flight'",
    BrowseStatus.DEAD: "m.status = 'dead'",
}

#: The routing key as ``domain.filters.topic_subject`` makes it, in SQL.
SUBJECT_SQL = "(CASE WHEN m.routing_key = '' THEN '' ELSE '.' || m.routing_key END)"
#: The newest x-death entry (contract §10: newest first).
_NEWEST_DEATH = "(m.headers -> 'x-death' -> 0)"


def _statuses(statuses: Sequence[BrowseStatus]) -> str:
    wanted = set(statuses)
    if {BrowseStatus.READY, BrowseStatus.DELAYED} <= wanted:
        wanted -= {BrowseStatus.READY, BrowseStatus.DELAYED}
        parts = ["m.status = 'ready'", *(_STATUS_SQL[s] for s in sorted(wanted))]
    else:
        parts = [_STATUS_SQL[s] for s in sorted(wanted)]
    return "(" + " OR ".join(parts) + ")"


def where(f: MessageFilter) -> tuple[str, dict[str, Any]]:
    """The filter as one SQL condition over ``messages AS m`` and its parameters (all
    prefixed ``f_``)."""
    parts = [_statuses(f.statuses)]
    params: dict[str, Any] = {}
    if f.routing_key is not None and f.routing_key != "#":
        if is_wildcard_free(f.routing_key):
            parts.append("m.routing_key = :f_key")
            params["f_key"] = f.routing_key
        else:
            parts.append(f"{SUBJECT_SQL} ~ :f_key_re")
            params["f_key_re"] = topic_regex(f.routing_key)
    if f.headers:
        # every pair equal: no pair of the filter's object whose value differs (or is absent)
        parts.append(
            "NOT EXISTS (SELECT 1 FROM jsonb_each(CAST(:f_headers AS jsonb)) AS h(k, v) "
            "WHERE (m.headers -> h.k) IS DISTINCT FROM h.v)"
        )
        params["f_headers"] = jsonb_text(dict(f.headers))
    if f.message_ids is not None:
        parts.append("m.message_id = ANY(CAST(:f_ids AS text[]))")
        params["f_ids"] = list(f.message_ids)
    if f.published_after is not None:
        parts.append("m.created_at > :f_after")
        params["f_after"] = f.published_after
    if f.published_before is not None:
        parts.append("m.created_at < :f_before")
        params["f_before"] = f.published_before
    if f.min_delivery_count is not None:
        parts.append("m.delivery_count >= :f_min_count")
        params["f_min_count"] = f.min_delivery_count
    if f.death_reason is not None:
        parts.append(f"{_NEWEST_DEATH} ->> 'reason' = :f_reason")
        params["f_reason"] = f.death_reason.value
    return " AND ".join(parts), params


#: A move or delete of 100,000 copies is one statement of a few seconds — more on a loaded
#: machine than MESSAGEX_DB_STATEMENT_TIMEOUT_MS (30 s) allows a request: its transaction
#: gets this bound instead.
LONG_STATEMENT_TIMEOUT = "300s"


async def allow_long_statements(conn: AsyncConnection) -> None:
    """For the rest of ``conn``'s transaction, statements may run ``LONG_STATEMENT_TIMEOUT``."""
    await conn.execute(
        text("SELECT set_config('statement_timeout', :t, true)"), {"t": LONG_STATEMENT_TIMEOUT}
    )


# --------------------------------------------------------------------------- query


async def query(
    conn: AsyncConnection, queue_id: int, queue: str, f: MessageFilter, *, limit: int, after: int
) -> list[StoredMessage]:
    """Up to ``limit`` matching copies with id > ``after``, in id order: a snapshot read
    through ix_messages_queue (queue_id, id), no locks (as browse)."""
    condition, params = where(f)
    statement = text(f"""
SELECT {BROWSE_COLUMNS}
FROM messages AS m
WHERE m.queue_id = :queue_id AND m.id > :after AND {condition}
ORDER BY m.id
LIMIT :limit
""")
    params |= {"queue_id": queue_id, "after": after, "limit": limit}
    rows = (await conn.execute(statement, params)).all()
    return [stored_message(queue, row) for row in rows]


# --------------------------------------------------------------------------- counts


async def count(conn: AsyncConnection, queue_id: int, f: MessageFilter) -> int:
    """Every matching copy of the queue (no limit)."""
    condition, params = where(f)
    statement = text(
        f"SELECT count(*) FROM messages AS m WHERE m.queue_id = :queue_id AND {condition}"
    )
    return int((await conn.execute(statement, params | {"queue_id": queue_id})).scalar_one())


@dataclass(frozen=True, slots=True)
class RedriveTargets:
    """The matching copies of a redrive by where they would go: per existing target queue
    (id → (name, copies)), and the copies with no x-death entry or whose queue is gone."""

    targets: dict[int, tuple[str, int]]
    skipped: int

    @property
    def matched(self) -> int:
        return self.skipped + sum(n for _, n in self.targets.values())


async def redrive_targets(conn: AsyncConnection, queue_id: int, f: MessageFilter) -> RedriveTargets:
    """Group the matching copies by the queue their newest x-death entry names."""
    condition, params = where(f)
    statement = text(f"""
SELECT t.id, t.name, count(*)
FROM messages AS m
LEFT JOIN queues AS t ON t.name = {_NEWEST_DEATH} ->> 'queue'
WHERE m.queue_id = :queue_id AND {condition}
GROUP BY t.id, t.name
""")
    rows = (await conn.execute(statement, params | {"queue_id": queue_id})).all()
    targets = {int(r[0]): (str(r[1]), int(r[2])) for r in rows if r[0] is not None}
    skipped = sum(int(r[2]) for r in rows if r[0] is None)
    return RedriveTargets(targets, skipped)


async def hold_queues(conn: AsyncConnection, ids: Sequence[int]) -> set[int]:
    """Lock the queue rows ``ids`` (KEY SHARE: no delete until commit; publishes, claims and
    the length rule's NO KEY UPDATE go on); returns those that still exist."""
    rows = await conn.execute(
        text(
            "SELECT id FROM queues WHERE id = ANY(CAST(:ids AS bigint[])) ORDER BY id FOR KEY SHARE"
        ),
        {"ids": sorted(set(ids))},
    )
    return {int(r[0]) for r in rows}


# --------------------------------------------------------------------------- move, delete

# The copies picked: matching, in id order, up to :limit, row-locked (see the docstring).
_PICK = """SELECT m.id{extra} FROM messages AS m{join}
    WHERE m.queue_id = :queue_id AND {condition}
    ORDER BY m.id
    LIMIT :limit
    FOR UPDATE OF m SKIP LOCKED"""

# Moved copies become ready in the target, available now, delivery_count 0; message_id,
# created_at, exchange, routing key, body, properties, headers (x-death included) and
# group_id are kept. Priority and expiry are the target's (as dead-lettering sets them).
_SET = f"""queue_id = t.id, status = 'ready', delivery_count = 0,
        available_at = now(), expires_at = {TARGET_EXPIRES_AT},
        priority = {TARGET_PRIORITY}"""

_MOVE_TO = """WITH picked AS ({pick}),
moved AS (
    UPDATE messages AS m SET {set}
    FROM picked AS p, queues AS t
    WHERE m.id = p.id AND t.id = :target
    RETURNING m.queue_id
)
SELECT queue_id, count(*) FROM moved GROUP BY queue_id"""

_REDRIVE = """WITH picked AS ({pick}),
moved AS (
    UPDATE messages AS m SET {set}
    FROM picked AS p JOIN queues AS t ON t.id = p.target
    WHERE m.id = p.id
    RETURNING m.queue_id
)
SELECT queue_id, count(*) FROM moved GROUP BY queue_id"""

_DELETE = """WITH picked AS ({pick})
DELETE FROM messages AS m USING picked AS p WHERE m.id = p.id"""


async def move(
    conn: AsyncConnection,
    queue_id: int,
    f: MessageFilter,
    *,
    limit: int,
    target: int | None,
    allowed: Sequence[int] = (),
) -> dict[int, int]:
    """Move up to ``limit`` matching copies to queue ``target``, or with None (redrive)
    each to the queue its newest x-death entry names — only to the queues ``allowed``
    (the caller checked and locked them; copies whose target is not among them stay).
    Returns the copies moved per target queue id. NotFound when a target was deleted."""
    condition, params = where(f)
    params |= {"queue_id": queue_id, "limit": limit}
    if target is not None:
        pick = _PICK.format(extra="", join="", condition=condition)
        sql = _MOVE_TO.format(pick=pick, set=_SET)
        params["target"] = target
    else:
        pick = _PICK.format(
            extra=", t.id AS target",
            join=(
                f"\n    JOIN queues AS t ON t.name = {_NEWEST_DEATH} ->> 'queue'"
                " AND t.id = ANY(CAST(:allowed AS bigint[]))"
            ),
            condition=condition,
        )
        sql = _REDRIVE.format(pick=pick, set=_SET)
        params["allowed"] = list(allowed)
    try:
        rows = (await conn.execute(text(sql), params)).all()
    except sa_exc.IntegrityError as exc:
        if constraint(exc) == FK_MESSAGES_QUEUE:
            raise NotFound("the target queue was deleted") from None
        raise
    return {int(r[0]): int(r[1]) for r in rows}


async def delete(conn: AsyncConnection, queue_id: int, f: MessageFilter, *, limit: int) -> int:
    """Delete up to ``limit`` matching copies; returns how many."""
    condition, params = where(f)
    pick = _PICK.format(extra="", join="", condition=condition)
    result = await conn.execute(
        text(_DELETE.format(pick=pick)), params | {"queue_id": queue_id, "limit": limit}
    )
    return int(result.rowcount)
