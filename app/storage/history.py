"""The charts' history (table ``queue_samples``): activity rows, depth samples, windows.

docs/decisions.md "Rate and depth history" says why it is shaped so. Every statement here
costs with the activity of a sample interval or with the copies stored, never with the
number of queues: an idle queue with no copies has no rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.storage.tables import queue_samples

_s = queue_samples.c

#: pg_try_advisory_xact_lock key of the depth sample ("mxhist"): one process counts a bucket
DEPTH_LOCK_KEY = 0x6D78686973740000
#: a depth count that took t waits ``DEPTH_PACE * t`` before the next (at most 5 % of a core
#: on a broker holding millions of copies); below the interval it changes nothing
DEPTH_PACE = 20


@dataclass(frozen=True, slots=True)
class Activity:
    """One row of activity: ``queue_id`` None is the broker-wide row."""

    queue_id: int | None
    published: int
    delivered: int
    acked: int


@dataclass(frozen=True, slots=True)
class Bucket:
    """The sums of one sample time; depth None where no depth row was written."""

    at: datetime
    published: int
    delivered: int
    acked: int
    ready: int | None
    delayed: int | None
    in_flight: int | None
    dead: int | None
    #: on broker-wide depth times: how long their depth stands for (the interval, or longer
    #: when the count was slow and the next one waited)
    hold_seconds: float | None = None


def hold_of(depth_ms: int | None, interval: float) -> float:
    """How long a depth sample stands for: until the next one may be taken."""
    return max(interval, (depth_ms or 0) * DEPTH_PACE / 1000)


# A process's activity rows of one sample time in one statement, its text constant: a
# multi-row VALUES built per call was compiled anew each time (SQLAlchemy caches no statement
# whose row count varies), 5 % of a broker's CPU with 1,000 queues busy (docs/performance.md).
_INSERT_ACTIVITY = text("""
INSERT INTO queue_samples (at, queue_id, published, delivered, acked)
SELECT CAST(:at AS timestamptz), a.queue_id, a.published, a.delivered, a.acked
FROM unnest(CAST(:queue_ids AS bigint[]), CAST(:published AS bigint[]),
            CAST(:delivered AS bigint[]), CAST(:acked AS bigint[]))
     AS a(queue_id, published, delivered, acked)
""")


async def insert_activity(conn: AsyncConnection, at: datetime, rows: Sequence[Activity]) -> None:
    """One INSERT of a process's activity rows for sample time ``at``."""
    if rows:
        await conn.execute(
            _INSERT_ACTIVITY,
            {
                "at": at,
                "queue_ids": [r.queue_id for r in rows],
                "published": [r.published for r in rows],
                "delivered": [r.delivered for r in rows],
                "acked": [r.acked for r in rows],
            },
        )


# Depth by status of every queue holding copies, and (the grand total, queue_id NULL, present
# even when there is no copy at all) of the broker, counted as the overview and the queue
# stats count them (``delayed``: ready, not yet due). One walk of each status's partial index
# (ix_messages_claim for ready copies, ix_messages_owner for in-flight ones, ix_messages_parked
# for dead ones) rather than a scan of the whole table: the ready walk is index-only where
# VACUUM has marked the pages all-visible, as it has for copies that wait. 100,000 delayed
# copies over 1,000 queues: 56 ms as one sequential scan with ROLLUP, 9-13 ms so
# (docs/performance.md); a table VACUUM has not visited costs what the scan did.
_DEPTH = text("""
INSERT INTO queue_samples (at, queue_id, ready, delayed, in_flight, dead)
WITH per AS MATERIALIZED (
    SELECT queue_id, sum(ready) AS ready, sum(delayed) AS delayed,
           sum(in_flight) AS in_flight, sum(dead) AS dead
    FROM (
        SELECT queue_id, count(*) FILTER (WHERE available_at <= now()) AS ready,
               count(*) FILTER (WHERE available_at > now()) AS delayed,
               0 AS in_flight, 0 AS dead
        FROM messages WHERE status = 'ready' GROUP BY queue_id
        UNION ALL
        SELECT queue_id, 0, 0, count(*), 0
        FROM messages WHERE status = 'in_flight' GROUP BY queue_id
        UNION ALL
        SELECT queue_id, 0, 0, 0, count(*)
        FROM messages WHERE status = 'dead' GROUP BY queue_id
    ) AS s
    GROUP BY queue_id
)
SELECT CAST(:at AS timestamptz), queue_id, ready, delayed, in_flight, dead FROM per
UNION ALL
SELECT CAST(:at AS timestamptz), NULL, coalesce(sum(ready), 0), coalesce(sum(delayed), 0),
       coalesce(sum(in_flight), 0), coalesce(sum(dead), 0)
FROM per
""")


_SET_DEPTH_MS = text("""
UPDATE queue_samples SET depth_ms = :ms
WHERE queue_id IS NULL AND at = :at AND ready IS NOT NULL
""")


async def sample_depth(
    conn: AsyncConnection, at: datetime, keep: timedelta, interval: float
) -> bool:
    """In the caller's transaction: unless another process holds the depth lock, or the
    last depth sample still stands at ``at`` (taken at ``at``, or paced: ``hold_of``),
    insert the depth rows of ``at`` and delete rows older than ``keep`` before it. True
    when this call sampled."""
    if not await conn.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": DEPTH_LOCK_KEY}):
        return False
    last = (
        await conn.execute(
            select(_s.at, _s.depth_ms)
            .where(_s.queue_id.is_(None), _s.ready.isnot(None))
            .order_by(_s.at.desc())
            .limit(1)
        )
    ).first()
    if last is not None and last.at + timedelta(seconds=hold_of(last.depth_ms, interval)) > at:
        return False
    started = time.monotonic()
    await conn.execute(_DEPTH, {"at": at})
    ms = round((time.monotonic() - started) * 1000)
    await conn.execute(_SET_DEPTH_MS, {"ms": ms, "at": at})
    await conn.execute(delete(queue_samples).where(_s.at < at - keep))
    return True


async def window(
    conn: AsyncConnection, queue_id: int | None, since: datetime, interval: float
) -> list[Bucket]:
    """The sums per sample time from ``since`` on, of one queue or (None) of the broker.

    A queue's depth is 0 (not None) at a time whose broker-wide depth row exists: the depth
    sample covered it and it held no copy then. Depth-sampled times carry ``hold_seconds``."""
    which = _s.queue_id.is_(None) if queue_id is None else _s.queue_id == queue_id
    stmt = (
        select(
            _s.at,
            func.sum(_s.published).label("published"),
            func.sum(_s.delivered).label("delivered"),
            func.sum(_s.acked).label("acked"),
            func.sum(_s.ready).label("ready"),
            func.sum(_s.delayed).label("delayed"),
            func.sum(_s.in_flight).label("in_flight"),
            func.sum(_s.dead).label("dead"),
        )
        .where(which, _s.at >= since)
        .group_by(_s.at)
    )
    rows = {row.at: row for row in await conn.execute(stmt)}
    sampled = {
        row.at: hold_of(row.depth_ms, interval)
        for row in await conn.execute(
            select(_s.at, _s.depth_ms).where(
                _s.queue_id.is_(None), _s.at >= since, _s.ready.isnot(None)
            )
        )
    }
    out: list[Bucket] = []
    for at in sorted(set(rows) | set(sampled)):
        row = rows.get(at)
        depth_known = at in sampled
        out.append(
            Bucket(
                at=at,
                published=int(row.published) if row else 0,
                delivered=int(row.delivered) if row else 0,
                acked=int(row.acked) if row else 0,
                ready=_depth(row, "ready", depth_known),
                delayed=_depth(row, "delayed", depth_known),
                in_flight=_depth(row, "in_flight", depth_known),
                dead=_depth(row, "dead", depth_known),
                hold_seconds=sampled.get(at),
            )
        )
    return out


def _depth(row: object, key: str, known: bool) -> int | None:
    if not known:
        return None
    value = getattr(row, key, None) if row is not None else None
    return int(value) if value is not None else 0
