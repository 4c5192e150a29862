"""Length limits (contract §13: ``x-max-length``, ``x-max-length-bytes``, ``x-overflow``):
the statements, and the one place that makes a limited queue hold its limit.

Only queues with a limit come here; a plain queue's publish, claim and settlement never run
any of this. Everything runs in the caller's transaction (a SQLAlchemy ``AsyncConnection``;
the publish's INSERT runs on its driver connection, in the same transaction):

1. ``lock_queues``: the limited queues' rows, ``FOR NO KEY UPDATE`` in id order. Every
   transaction that adds ready copies to a limited queue (publish, requeue, dead-lettering
   into it) takes it first, so they serialise per queue; claims, acks and plain queues never
   take it, and ``NO KEY UPDATE`` does not conflict with the ``KEY SHARE`` that foreign-key
   checks (inserts, subscriptions) take on the queue row.
2. ``ready_sizes``: ready copies and their body bytes, counted after the lock, so in a
   snapshot that holds every earlier commit that added ready copies (READ COMMITTED: each
   statement a new snapshot). A count of the queue's due ready rows over
   ``ix_messages_claim``: bounded by the limit, since the limit holds (the bytes need the
   heap, and are read only for queues with ``x-max-length-bytes``).
3. ``enforce``: drop-head, the oldest ready copies in claim order leave until the queue is
   within its limits — dead-lettered with reason ``maxlen`` (``drop``) or deleted.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app import jsonexact
from app.domain import limits
from app.domain.arguments import Overflow, QueueArguments, parse_queue_arguments
from app.domain.model import OutgoingMessage
from app.errors import ValidationFailed
from app.storage import deliveries, queries
from app.storage.fastpath import HotPath, Statement
from app.storage.messages import execute_insert, fetchval_insert, insert_params


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """What the limits and the claim priority need of a queue. Never changes for an id: a
    re-declaration with other arguments or another dead-letter queue is 409, and ids are
    never reused."""

    id: int
    name: str
    arguments: QueueArguments
    dead_letter_queue_id: int | None


QUEUE_INFOS = Statement(
    text(
        "SELECT id, name, arguments, dead_letter_queue_id FROM queues "
        "WHERE id = ANY(CAST(:ids AS bigint[]))"
    )
)


def _arguments(raw: Any) -> QueueArguments:
    try:
        return parse_queue_arguments(raw if isinstance(raw, dict) else {})
    except ValidationFailed:
        # declared before the arguments took effect, with a value they now refuse: ignored
        return QueueArguments()


async def queue_infos(hot: HotPath, ids: Sequence[int]) -> dict[int, QueueInfo]:
    rows = await hot.fetch(QUEUE_INFOS, {"ids": list(ids)})
    return {r[0]: QueueInfo(r[0], r[1], _arguments(r[2]), r[3]) for r in rows}


# Serialise the transactions that add ready copies to these limited queues (see above).
LOCK_QUEUES = text("""
SELECT id FROM queues WHERE id = ANY(CAST(:ids AS bigint[])) ORDER BY id FOR NO KEY UPDATE
""")

# Due ready copies of each queue, and (only where asked: the LATERAL's one-time filter skips
# it otherwise) their body bytes. Delayed copies (available_at in the future) and in-flight
# ones do not count. statement_timestamp(), not now(): copies committed while this
# transaction waited for the lock carry an available_at after the time it began.
READY_SIZES = text("""
SELECT q.id, c.n, coalesce(b.bytes, 0)
FROM unnest(CAST(:ids AS bigint[]), CAST(:with_bytes AS boolean[])) AS q(id, with_bytes)
CROSS JOIN LATERAL (SELECT count(*) AS n FROM messages
                    WHERE queue_id = q.id AND status = 'ready'
                      AND available_at <= statement_timestamp()) AS c
LEFT JOIN LATERAL (SELECT sum(length(body)) AS bytes FROM messages
                   WHERE q.with_bytes AND queue_id = q.id AND status = 'ready'
                     AND available_at <= statement_timestamp()) AS b ON true
""")

# The first :n ready copies of one queue in claim order, locked: the head that drop-head
# removes. SKIP LOCKED: a row another transaction holds is being claimed (or deleted), so it
# is leaving the ready set anyway; this never waits on a claim.
HEAD = text(f"""
SELECT s.id, s.headers::text, s.exchange, s.routing_key, s.size, now()
FROM ({
    queries.ready_in_claim_order(
        "id, priority, available_at, headers, exchange, routing_key, length(body) AS size",
        ":n",
        "FOR UPDATE SKIP LOCKED",
    )
}) AS s
ORDER BY {queries.CLAIM_ORDER}
""")


# Drop-head in ONE statement where nothing needs the dropped rows (a limit on copies only, no
# dead-letter target): count, then delete the head beyond :max_length, locked as HEAD locks
# it. The count is a CTE, so it runs once: as a subquery in the walk's three LIMITs it ran
# once for each, every time over all the queue's rows and the dead index entries that
# earlier trims left at its head until vacuum (half the statement's buffer reads). The rows
# go by primary key (= ANY(ARRAY(...)): with IN, the planner hashed a scan of the table).
# (Walking back from the tail with OFFSET :max_length instead, one walk, let the planner
# pick a sort of the whole queue or spend 40 ms planning while the dead entries stood.)
_TRIMMED = queries.ready_in_claim_order(
    "id, priority, available_at", "(SELECT n FROM over)", "FOR UPDATE SKIP LOCKED"
)
TRIM_HEAD = text(f"""
WITH over AS MATERIALIZED (
    SELECT GREATEST(count(*) - :max_length, 0) AS n FROM messages
    WHERE queue_id = :queue_id AND status = 'ready' AND available_at <= statement_timestamp())
DELETE FROM messages WHERE id = ANY(ARRAY(SELECT s.id FROM ({_TRIMMED}) AS s))
""")


# A publish group's INSERT and the drop-head of its limited queues in ONE statement, run
# right after LOCK_QUEUES (``insert_and_trim``, inside TRIMMING_FUNCTION below). The INSERT is
# INSERT_COPIES' own; the DELETE's snapshot (the statement's: every commit up to the lock
# included) does not hold the rows it inserts, so each queue's excess is its counted ready
# copies plus the :trim_added due copies the group brings, minus its limit, and that many
# leave from the head of the rows already there — exactly TRIM_HEAD run after the INSERT,
# as long as no new copy belongs in that head: the queue has no priority (new copies come
# last in claim order) and the group brings at most the limit (else some new copies drop
# too). ``insert_and_trim`` falls back to TRIM_HEAD otherwise. The count runs once per
# queue (MATERIALIZED), and the head walk is TRIM_HEAD's, per queue by LATERAL.
# ``generic_checks``: the statement itself is planned for the table as it is now (the
# connection's force_custom_plan, storage/planner.py), and only then, as it runs, sets
# plan_cache_mode back to PostgreSQL's default until the transaction ends, so that the
# foreign-key check its INSERT makes for each row (run at the statement's end) keeps its one
# generic plan instead of being planned for every row (it reads only the queues' primary key:
# every plan of it is safe). Measured: PostgreSQL CPU per 100 copies into a full queue of
# 1,000, 4.5 → 3.85 ms; the plain INSERT 1.85 ms (docs/performance.md).
_HEAD_OF_OVER = queries.ready_in_claim_order(
    "id, priority, available_at", "o.n", "FOR UPDATE SKIP LOCKED", queue="o.queue_id"
)
INSERT_TRIMMING = text(f"""
{queries.INSERT_COPIES_WITH},
stored AS ({queries.INSERT_COPY_ROWS}),
over AS MATERIALIZED (
    SELECT l.queue_id, GREATEST(c.n + l.added - l.max_length, 0) AS n
    FROM unnest(CAST(:trim_queue AS bigint[]), CAST(:trim_max AS bigint[]),
                CAST(:trim_added AS bigint[])) AS l(queue_id, max_length, added)
    CROSS JOIN (SELECT set_config('plan_cache_mode', 'auto', true)) AS generic_checks
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM messages
        WHERE queue_id = l.queue_id AND status = 'ready'
          AND available_at <= statement_timestamp()) AS c
)
DELETE FROM messages WHERE id = ANY(ARRAY(
    SELECT h.id FROM over AS o CROSS JOIN LATERAL ({_HEAD_OF_OVER}) AS h))
""")

# INSERT_TRIMMING is exact only in a snapshot taken after LOCK_QUEUES was granted, and READ
# COMMITTED takes a statement's snapshot when it starts, before any lock it then waits for:
# so two statements, which on the client were three round trips (BEGIN with the lock, the
# statement, COMMIT), where a plain publish makes one. A VOLATILE PL/pgSQL function runs each
# of its statements in a snapshot of its own: TRIMMING_FUNCTION (migration 0017) takes the
# lock, then runs INSERT_TRIMMING, in one call that is its own transaction. Its body is
# INSERT_TRIMMING as compiled (``$n``: the function's parameters, in the Statement's order)
# with one change: "due" is by the clock read once the lock is granted, not by
# ``statement_timestamp()``, which inside a function is when the call arrived, before the
# wait; a racing publish that committed meanwhile stored its copies with a later
# ``available_at`` (its own start), and they would not be counted. Inside the function
# INSERT_TRIMMING keeps what it does on a connection: its plan is made for each call (the
# connection's force_custom_plan holds for a function's statements too), and
# ``generic_checks`` still lets its foreign-key checks, run when the INSERT ends, keep one
# generic plan. The migration holds the text ``trimming_function()`` gave when it was
# written; tests/unit/test_limits.py checks that it still gives it (a change to
# INSERT_TRIMMING or to the INSERT_COPIES it is built on needs a migration replacing it).
TRIMMING_FUNCTION = "messagex._insert_trimming"
_INSERT_TRIMMING = Statement(INSERT_TRIMMING)


def _parameter_types(statement: Statement, sql: str) -> list[str]:
    """The type of each of ``statement``'s parameters, from the CAST that ``sql`` (its text)
    gives it: the function's signature."""
    casts = dict(re.findall(r"CAST\(:(\w+) AS ([\w\[\]]+)\)", sql))
    return [casts[name] for name in statement.names]


def trimming_function() -> str:
    """The CREATE FUNCTION of TRIMMING_FUNCTION (above), ``{path}`` standing for its
    search_path (the migration's: ``pg_catalog``, the broker's schema, ``pg_temp``)."""
    types = ", ".join(_parameter_types(_INSERT_TRIMMING, INSERT_TRIMMING.text))
    trim_queue = f"${_INSERT_TRIMMING.names.index('trim_queue') + 1}"
    lock = LOCK_QUEUES.text.strip().replace("SELECT id FROM", "PERFORM FROM", 1)
    body = _INSERT_TRIMMING.sql.strip().replace("statement_timestamp()", "due_by")
    return (
        f"CREATE FUNCTION {TRIMMING_FUNCTION}({types}) RETURNS bigint\n"
        "LANGUAGE plpgsql VOLATILE SET search_path = {path} AS $fn$\n"
        "DECLARE\n    due_by timestamptz;\n    dropped bigint;\nBEGIN\n"
        f"{lock.replace('CAST(:ids AS bigint[])', trim_queue)};\n"
        "due_by := clock_timestamp();\n"
        f"{body};\n"
        "GET DIAGNOSTICS dropped = ROW_COUNT;\nRETURN dropped;\nEND\n$fn$"
    )


_TRIMMING_CALL = Statement(
    text(f"SELECT {TRIMMING_FUNCTION}({', '.join(':' + n for n in _INSERT_TRIMMING.names)})")
)


_LOCK_QUEUES = Statement(LOCK_QUEUES)
_TRIM_HEAD = Statement(TRIM_HEAD)


def _begin_locking(ids: Sequence[int]) -> str:
    """BEGIN and LOCK_QUEUES in one simple-protocol message (one round trip): the ids are
    integers, written by ``int``, never text from outside."""
    listed = ",".join(str(int(i)) for i in ids)
    return (
        "BEGIN; SELECT id FROM queues WHERE id = ANY('{" + listed + "}'::bigint[]) "
        "ORDER BY id FOR NO KEY UPDATE"
    )


def due_copies(
    messages: Sequence[tuple[str, OutgoingMessage]], copies: Sequence[tuple[int, int]]
) -> dict[int, int]:
    """Copies of a group due at once (not delayed), by queue: what they add to the ready."""
    added: dict[int, int] = {}
    for m, q in copies:
        if not messages[m][1].delay_ms:
            added[q] = added.get(q, 0) + 1
    return added


def trims_in_insert(queues: Sequence[QueueInfo], added: Mapping[int, int]) -> bool:
    """Whether INSERT_TRIMMING (so TRIMMING_FUNCTION) is exact for these limited queues."""
    return all(
        q.arguments.max_priority is None
        and q.arguments.max_length is not None
        and added.get(q.id, 0) <= q.arguments.max_length
        for q in queues
    )


async def insert_and_trim(
    hot: HotPath,
    queues: Sequence[QueueInfo],
    messages: Sequence[tuple[str, OutgoingMessage]],
    copies: Sequence[tuple[int, int]],
    receipt: str,
    priorities: Sequence[int | None] | None,
) -> int:
    """A publish whose limited queues ``queues`` all drop their head by deleting it
    (``deletes_only``): their locks, the group's INSERT and the trim of each, in one
    transaction on a hot-path connection; returns the copies dropped. What ``Limits.hold``,
    ``admit`` and ``settle_publish`` do for such queues (no closure, nothing rejected,
    nothing dead-lettered), without SQLAlchemy's execution path around each statement.
    One round trip where it can (TRIMMING_FUNCTION: the locks, then INSERT_TRIMMING); else
    BEGIN with the locks, the INSERT, a TRIM_HEAD per queue, COMMIT."""
    params = insert_params(messages, copies, receipt, priorities)
    added = due_copies(messages, copies)
    async with hot.connection() as conn:
        if trims_in_insert(queues, added):
            params["trim_queue"] = [q.id for q in queues]
            params["trim_max"] = [q.arguments.max_length for q in queues]
            params["trim_added"] = [added.get(q.id, 0) for q in queues]
            return int(await fetchval_insert(conn, _TRIMMING_CALL, params))
        await conn.execute(_begin_locking(sorted({q.id for q in queues})))
        try:
            await execute_insert(conn, queries.INSERT_COPIES, params)
            dropped = 0
            for queue in queues:
                trim = {"queue_id": queue.id, "max_length": queue.arguments.max_length}
                status = await conn.execute(_TRIM_HEAD.sql, *_TRIM_HEAD.args(trim))
                dropped += int(status.rsplit(" ", 1)[-1])
        except Exception as exc:
            # (a statement cut short leaves the connection mid-query: the pool closes it)
            if not isinstance(exc, TimeoutError) and not conn.is_closed():
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT")
    return dropped


def deletes_only(queue: QueueInfo) -> bool:
    """Drop-head needs nothing of ``queue``'s dropped rows, and nothing is rejected there: a
    limit on copies only, ``drop-head``, no dead-letter target."""
    return _deletes_only(queue) and queue.arguments.overflow is Overflow.DROP_HEAD


def _deletes_only(queue: QueueInfo) -> bool:
    """Drop-head needs nothing of the dropped rows: TRIM_HEAD does it in one statement."""
    arguments = queue.arguments
    return (
        arguments.max_length is not None
        and arguments.max_length_bytes is None
        and not has_target(queue)
    )


@dataclass(frozen=True, slots=True)
class Row:
    """A copy that leaves its queue by the length rule (what its x-death entry needs)."""

    id: int
    headers: dict[str, Any]
    exchange: str
    routing_key: str
    size: int
    now: datetime


def _row(r: Sequence[Any], size: int | None = None) -> Row:
    return Row(r[0], jsonexact.loads(r[1]), r[2], r[3], r[4] if size is None else size, r[-1])


@dataclass(slots=True)
class Dropped:
    """What the length rule did in one transaction: copies dead-lettered (reason ``maxlen``)
    and deleted, by queue; and the dead-letter queues that received copies."""

    dead_lettered: int = 0
    discarded: int = 0
    woken: set[int] = field(default_factory=set)


async def lock_queues(conn: AsyncConnection, ids: Iterable[int]) -> None:
    await conn.execute(LOCK_QUEUES, {"ids": sorted(set(ids))})


async def ready_sizes(
    conn: AsyncConnection, queues: Sequence[QueueInfo]
) -> dict[int, tuple[int, int]]:
    """(ready copies, their body bytes) of each queue; bytes are 0 where the queue has no
    ``x-max-length-bytes``."""
    params = {
        "ids": [q.id for q in queues],
        "with_bytes": [q.arguments.max_length_bytes is not None for q in queues],
    }
    rows = (await conn.execute(READY_SIZES, params)).all()
    return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}


async def driver(conn: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under ``conn``, in its transaction (which must have begun:
    call after a statement ran on ``conn``)."""
    raw = await conn.get_raw_connection()
    found: asyncpg.Connection = raw.driver_connection
    return found


async def store_rejected(
    conn: AsyncConnection,
    messages: Sequence[tuple[str, OutgoingMessage]],
    copies: Sequence[tuple[int, int]],
    priorities: Sequence[int | None],
) -> list[Row]:
    """Store copies that ``drop`` then dead-letters at once, in order: reject-publish-dlx's
    rejected copies (stored in their full queue for an instant of this transaction)."""
    if not copies:
        return []
    db = await driver(conn)
    stmt = queries.INSERT_COPIES_RETURNING
    params = insert_params(messages, copies, str(uuid.uuid4()), priorities)
    rows = await db.fetch(stmt.sql, *stmt.args(params))
    return [_row((*r[:4], 0, r[4])) for r in rows]


#: ``dead_letter(conn, ids)``: dead-letter the locked copies ``ids`` with reason ``maxlen``
#: through the retry path's one dead-lettering (``Settlement.dead_letter_maxlen``: a
#: dead-letter queue or exchange, the cycle rule), in ``conn``'s transaction; returns the
#: queues that received copies.
DeadLetterHook = Callable[[AsyncConnection, list[int]], Awaitable[set[int]]]


def has_target(queue: QueueInfo) -> bool:
    """Whether ``queue`` dead-letters (to a queue or through an exchange)."""
    return queue.dead_letter_queue_id is not None or (
        queue.arguments.dead_letter_exchange is not None
    )


async def drop(
    conn: AsyncConnection, queue: QueueInfo, rows: Sequence[Row], dead_letter: DeadLetterHook
) -> Dropped:
    """``rows`` of ``queue`` leave it for the length rule: dead-lettered with reason
    ``maxlen`` when it has a dead-letter target (``dead_letter``), else deleted."""
    done = Dropped()
    if not rows:
        return done
    if not has_target(queue):
        await deliveries.discard(conn, [r.id for r in rows])
        done.discarded = len(rows)
        return done
    done.woken |= await dead_letter(conn, [r.id for r in rows])
    done.dead_lettered = len(rows)
    return done


async def _head(conn: AsyncConnection, queue_id: int, n: int) -> list[Row]:
    rows = (await conn.execute(HEAD, {"queue_id": queue_id, "n": n})).all()
    return [_row(r) for r in rows]


async def trim(
    conn: AsyncConnection,
    queue: QueueInfo,
    ready: int,
    ready_bytes: int,
    dead_letter: DeadLetterHook,
    *,
    delete: bool = False,
) -> tuple[Dropped, int, int]:
    """Drop-head ``queue`` (holding ``ready`` copies of ``ready_bytes`` body bytes, counted
    under its lock) until it is within its limits; returns what left and what remains.
    ``delete``: delete them even if the queue has a dead-letter target."""
    leaving: list[Row] = []
    over, over_bytes = limits.over(queue.arguments, ready, ready_bytes)
    batch = max(over, 16 if over_bytes else 0)
    while over > 0 or over_bytes > 0:
        head = await _head(conn, queue.id, len(leaving) + batch)
        fresh = head[len(leaving) :]
        if not fresh:
            break  # the rest is locked by claims: leaving the ready set anyway
        for row in fresh:
            if over <= 0 and over_bytes <= 0:
                break
            leaving.append(row)
            over -= 1
            over_bytes -= row.size
            ready -= 1
            ready_bytes -= row.size
        batch *= 2
    if delete and leaving:
        await deliveries.discard(conn, [r.id for r in leaving])
        return Dropped(discarded=len(leaving)), ready, ready_bytes
    return await drop(conn, queue, leaving, dead_letter), ready, ready_bytes


async def enforce(
    conn: AsyncConnection,
    queues: Mapping[int, QueueInfo],
    ids: Iterable[int],
    dead_letter: DeadLetterHook,
) -> Dropped:
    """Bring each limited queue of ``ids`` within its limits (drop-head), and on through the
    dead-letter queues that receive its dropped copies; the caller holds ``lock_queues`` on
    all of them (``Limits.closure``). A cycle of full dead-letter queues is cut after a few
    rounds by deleting instead."""
    total = Dropped()
    pending = {i for i in ids if i in queues and queues[i].arguments.limited}
    for round_ in range(_ROUNDS):
        if not pending:
            break
        infos = [queues[i] for i in sorted(pending)]
        for info in [i for i in infos if _deletes_only(i)]:
            params = {"queue_id": info.id, "max_length": info.arguments.max_length}
            total.discarded += (await conn.execute(TRIM_HEAD, params)).rowcount
        infos = [i for i in infos if not _deletes_only(i)]
        sizes = await ready_sizes(conn, infos) if infos else {}
        pending = set()
        for info in infos:
            ready, ready_bytes = sizes.get(info.id, (0, 0))
            last = round_ == _ROUNDS - 1
            done, _, _ = await trim(conn, info, ready, ready_bytes, dead_letter, delete=last)
            total.dead_lettered += done.dead_lettered
            total.discarded += done.discarded
            total.woken |= done.woken
            pending |= {q for q in done.woken if q in queues and queues[q].arguments.limited}
    return total


#: dead-letter hops that enforce follows in one transaction
_ROUNDS = 8
