"""Operations on a queue's copies by filter (contract §17): query, move (and redrive), delete.

Permissions: query needs read on the queue; move needs configure on the source and write on
every target (a redrive's targets are the queues named by the matching copies' newest
x-death entries, all of them checked, also beyond ``limit``); delete needs configure. Each
move or delete is one transaction (storage/filters.py): the counts, the target locks, the
one UPDATE or DELETE, and — for moves — the length rule on the targets (``Limits.after_ready``,
as a requeue or a dead-lettering applies it: drop-head, so no commit leaves a target above
its limit). After the commit the targets are woken as a publish wakes them (and the source,
whose group heads may have left it: contract §16). Deduplication (§15) does not apply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from app.auth.permissions import Access, require
from app.broker.limits import Limits
from app.domain.filters import MessageFilter
from app.domain.model import StoredMessage, User
from app.errors import NotFound
from app.metrics import Metrics
from app.storage import filters as store
from app.storage.database import Connection, Database
from app.storage.topology import find_queue_id

log = logging.getLogger("messagex.message_ops")

#: the most copies one move or delete takes (contract §17)
MAX_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class MoveResult:
    #: every matching copy (also beyond the limit)
    matched: int
    #: copies moved (0 with dry_run)
    moved: int
    #: redrive only: matching copies with no x-death entry, or whose queue no longer exists
    skipped: int


@dataclass(frozen=True, slots=True)
class DeleteResult:
    matched: int
    deleted: int


def _missing(queue: str) -> NotFound:
    return NotFound(f"queue '{queue}' not found")


async def _begin(conn: Connection, queue: str) -> int:
    """At the start of a move's or delete's transaction: the source queue's id (NotFound),
    and the long statement timeout (storage/filters.py)."""
    await store.allow_long_statements(conn)
    source = await find_queue_id(conn, queue)
    if source is None:
        raise _missing(queue)
    return source


class MessageOps:
    def __init__(
        self,
        db: Database,
        metrics: Metrics,
        limits: Limits,
        on_ready: Callable[[set[int]], None],
    ) -> None:
        """``limits``: the settlement's length rule (its dead-letter hook set);
        ``on_ready``: wake these queues' consumers here and on every broker process (the
        publisher's after-commit wake-up)."""
        self.db = db
        self.metrics = metrics
        self.limits = limits
        self.on_ready = on_ready

    async def query(
        self, actor: User, queue: str, f: MessageFilter, *, limit: int, after: int | None
    ) -> tuple[list[StoredMessage], int | None]:
        """A page of the matching copies by id, and the next page's cursor (the last id of
        a full page), as browse pages."""
        require(actor, Access.READ, queue, "queue")
        async with self.db.connect() as conn:
            source = await find_queue_id(conn, queue)
            if source is None:
                raise _missing(queue)
            items = await store.query(conn, source, queue, f, limit=limit, after=after or 0)
        return items, items[-1].id if len(items) == limit else None

    async def move(
        self,
        actor: User,
        queue: str,
        f: MessageFilter,
        *,
        to: str | None,
        limit: int,
        dry_run: bool = False,
    ) -> MoveResult:
        """Move up to ``limit`` matching copies (never in flight) to ``to``, or with None
        back to the queue each one's newest x-death entry names (redrive)."""
        require(actor, Access.CONFIGURE, queue, "queue")
        if to is not None:
            require(actor, Access.WRITE, to, "queue")
        f = f.movable()
        async with self.db.transaction() as conn:
            source = await _begin(conn, queue)
            target: int | None = None
            if to is not None:
                target = await find_queue_id(conn, to, lock="key_share")
                if target is None:
                    raise _missing(to)
                matched, skipped, allowed = await store.count(conn, source, f), 0, [target]
            else:
                found = await store.redrive_targets(conn, source, f)
                for name, _ in sorted(found.targets.values()):
                    require(actor, Access.WRITE, name, "queue")
                matched, skipped = found.matched, found.skipped
                allowed = sorted(await store.hold_queues(conn, list(found.targets)))
            if dry_run or not allowed:
                return MoveResult(matched, 0, skipped)
            moved = await store.move(conn, source, f, limit=limit, target=target, allowed=allowed)
            dropped = await self.limits.after_ready(conn, moved)
        self.limits.count_dropped(dropped)
        total = sum(moved.values())
        if total:
            self.on_ready({source, *moved, *dropped.woken})
            operation = "moved" if to is not None else "redriven"
            self.metrics.filter_operations.labels(operation=operation).inc(total)
        log.info(
            "%d of %d copies moved from queue '%s' to %s by '%s'",
            total,
            matched,
            queue,
            f"'{to}'" if to else "their x-death queues",
            actor.username,
        )
        return MoveResult(matched, total, skipped)

    async def delete(
        self, actor: User, queue: str, f: MessageFilter, *, limit: int, dry_run: bool = False
    ) -> DeleteResult:
        """Delete up to ``limit`` matching copies (never in flight)."""
        require(actor, Access.CONFIGURE, queue, "queue")
        f = f.movable()
        async with self.db.transaction() as conn:
            source = await _begin(conn, queue)
            matched = await store.count(conn, source, f)
            deleted = 0 if dry_run else await store.delete(conn, source, f, limit=limit)
        if deleted:
            self.on_ready({source})  # a group's head may have gone: its next copy is due
            self.metrics.filter_operations.labels(operation="deleted").inc(deleted)
            log.info(
                "%d of %d copies deleted from queue '%s' by '%s'",
                deleted,
                matched,
                queue,
                actor.username,
            )
        return DeleteResult(matched, deleted)
