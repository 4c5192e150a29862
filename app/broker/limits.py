"""What a queue's arguments change on the way in (contract §13): the claim priority of each
copy, and the length limits with their overflow behaviour — one home for both, used by every
publish (REST, batch, WebSocket: broker/publisher.py) and by every path that makes a copy
ready again (NACK with requeue, ack timeout, release, dead-lettering: broker/settlement.py).

Plain queues pay a dict lookup: a queue's arguments and dead-letter queue never change for
its id, so each process reads them once per queue (``QueueInfos``) and never again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.arguments import Overflow, QueueArguments
from app.domain.limits import admits
from app.domain.model import OutgoingMessage
from app.metrics import Metrics
from app.storage import limits as store
from app.storage.database import Database
from app.storage.limits import Dropped, QueueInfo

#: queues remembered per process (then forgotten at once, and read again as needed)
CACHE_MAX = 10_000

__all__ = ["Admission", "Limits", "QueueInfo"]


def priority_of(arguments: QueueArguments, message: OutgoingMessage) -> int | None:
    """A copy's stored claim priority: None outside priority queues."""
    if arguments.max_priority is None:
        return None
    raw = message.properties.get("priority")
    return arguments.priority_of(raw if isinstance(raw, int) else None)


@dataclass(slots=True)
class Admission:
    """What the length rule did to one publish group's copies (indexes into its copies)."""

    #: copies not stored (reject-publish, reject-publish-dlx)
    rejected: set[int] = field(default_factory=set)
    #: of those, copies dead-lettered with reason maxlen (reject-publish-dlx with a target)
    dead_lettered: int = 0
    dropped: Dropped = field(default_factory=Dropped)


class Limits:
    def __init__(self, db: Database, metrics: Metrics) -> None:
        self.db = db
        self.metrics = metrics
        self._infos: dict[int, QueueInfo] = {}
        self._hook: store.DeadLetterHook | None = None

    def set_dead_letter(self, hook: store.DeadLetterHook) -> None:
        """Dead-letter dropped and rejected copies (reason maxlen) with the retry path's one
        dead-lettering (``Settlement.dead_letter_maxlen``)."""
        self._hook = hook

    async def _dead_letter(self, conn: Any, ids: list[int]) -> set[int]:
        if self._hook is None:
            raise RuntimeError("no dead-letter hook set")
        return await self._hook(conn, ids)

    async def infos(self, ids: Iterable[int]) -> dict[int, QueueInfo]:
        """The queues of ``ids`` that exist (a deleted one is simply missing)."""
        cache = self._infos
        wanted = set(ids)
        missing = [i for i in wanted if i not in cache]
        if missing:
            found = await store.queue_infos(self.db.hot, missing)
            if len(cache) + len(found) > CACHE_MAX:
                cache.clear()
            cache.update(found)
        return {i: cache[i] for i in wanted if i in cache}

    async def priorities(
        self, messages: Sequence[tuple[str, OutgoingMessage]], copies: Sequence[tuple[int, int]]
    ) -> tuple[dict[int, QueueInfo], list[int | None] | None]:
        """The copies' queues, and each copy's claim priority (None: no priority queue)."""
        infos = await self.infos(q for _, q in copies)
        if not any(i.arguments.max_priority is not None for i in infos.values()):
            return infos, None
        plain = QueueArguments()
        return infos, [
            priority_of(infos[q].arguments if q in infos else plain, messages[m][1])
            for m, q in copies
        ]

    async def _closure(self, ids: Iterable[int]) -> dict[int, QueueInfo]:
        """The limited queues of ``ids`` and every queue their dropped copies can reach
        through dead-letter queues, with their infos."""
        found = await self.infos(ids)
        todo = [i for i in found.values() if i.arguments.limited]
        seen = {i.id for i in todo}
        while todo:
            targets = {
                i.dead_letter_queue_id for i in todo if i.dead_letter_queue_id is not None
            } - seen
            seen |= targets
            more = await self.infos(targets)
            found.update(more)
            todo = [i for i in more.values() if i.arguments.limited]
        return found

    async def hold(self, conn: Any, ids: Iterable[int]) -> dict[int, QueueInfo]:
        """Lock the limited queues of ``ids`` and of their dead-letter chains (see
        storage/limits.py) in ``conn``'s transaction; returns the infos of all of them."""
        found = await self._closure(ids)
        limited = [i for i, info in found.items() if info.arguments.limited]
        if limited:
            await store.lock_queues(conn, limited)
        return found

    async def any_limited(self, ids: Iterable[int]) -> bool:
        found = await self.infos(ids)
        return any(i.arguments.limited for i in found.values())

    # -- a copy became ready again (settlement) -----------------------------------------

    async def after_ready(self, conn: Any, queue_ids: Iterable[int]) -> Dropped:
        """In a settlement's transaction, after copies became ready in ``queue_ids``
        (requeue, dead-lettering): limited queues among them shed their head (drop-head,
        whatever their x-overflow: a requeued copy is no publish to reject) so that the
        commit leaves none above its limit. Nothing for plain queues."""
        ids = set(queue_ids)
        if not ids or not await self.any_limited(ids):
            return Dropped()
        found = await self.hold(conn, ids)
        return await store.enforce(conn, found, ids, self._dead_letter)

    # -- a publish --------------------------------------------------------------------------

    async def admit(
        self,
        conn: Any,
        infos: dict[int, QueueInfo],
        messages: Sequence[tuple[str, OutgoingMessage]],
        copies: Sequence[tuple[int, int]],
        priorities: Sequence[int | None] | None,
    ) -> Admission:
        """Under the locks of ``hold``, before the group's INSERT: which copies the length
        rule rejects (reject-publish and reject-publish-dlx, in copy order, each counted as
        the ones before it were stored); the reject-publish-dlx ones with a target are stored
        and dead-lettered (reason maxlen) here. Delayed copies are never rejected: they do
        not count until due."""
        admission = Admission()
        checked = [
            q
            for q in {q for _, q in copies}
            if q in infos
            and infos[q].arguments.limited
            and infos[q].arguments.overflow is not Overflow.DROP_HEAD
        ]
        if not checked:
            return admission
        sizes = await store.ready_sizes(conn, [infos[q] for q in checked])
        dlx: list[int] = []
        for index, (m, q) in enumerate(copies):
            if q not in sizes or messages[m][1].delay_ms:
                continue
            ready, ready_bytes = sizes[q]
            size = len(messages[m][1].body)
            if admits(infos[q].arguments, ready, ready_bytes, size):
                sizes[q] = (ready + 1, ready_bytes + size)
                continue
            admission.rejected.add(index)
            info = infos[q]
            if info.arguments.overflow is Overflow.REJECT_PUBLISH_DLX and store.has_target(info):
                dlx.append(index)
        if dlx:
            rows = await store.store_rejected(
                conn,
                messages,
                [copies[i] for i in dlx],
                [priorities[i] if priorities else None for i in dlx],
            )
            by_queue: dict[int, list[store.Row]] = {}
            for index, row in zip(dlx, rows, strict=True):
                by_queue.setdefault(copies[index][1], []).append(row)
            for q, queue_rows in by_queue.items():
                done = await store.drop(conn, infos[q], queue_rows, self._dead_letter)
                admission.dead_lettered += done.dead_lettered
                admission.dropped.woken |= done.woken
        return admission

    async def settle_publish(
        self, conn: Any, infos: dict[int, QueueInfo], limited: Iterable[int], admission: Admission
    ) -> None:
        """After the group's INSERT: drop-head the limited queues (and the dead-letter queues
        that just received copies) back within their limits."""
        done = await store.enforce(
            conn, infos, set(limited) | admission.dropped.woken, self._dead_letter
        )
        # Queues a dead-letter exchange reached are not in the dead-letter-queue closure
        # that ``hold`` locked: the settlement's rule covers them (locked now, in this
        # transaction), so no commit leaves one above its limit either.
        beyond = (admission.dropped.woken | done.woken) - infos.keys()
        more = await self.after_ready(conn, beyond)
        for part in (done, more):
            admission.dropped.dead_lettered += part.dead_lettered
            admission.dropped.discarded += part.discarded
            admission.dropped.woken |= part.woken

    # -- metrics ----------------------------------------------------------------------------

    def count_dropped(self, dropped: Dropped) -> None:
        if dropped.dead_lettered:
            self.metrics.dropped.labels(reason="maxlen", outcome="dead_lettered").inc(
                dropped.dead_lettered
            )
        if dropped.discarded:
            self.metrics.dropped.labels(reason="maxlen", outcome="discarded").inc(dropped.discarded)

    def count_admission(self, admission: Admission) -> None:
        self.count_dropped(admission.dropped)
        if admission.rejected:
            kept = len(admission.rejected) - admission.dead_lettered
            if admission.dead_lettered:
                self.metrics.rejected.labels(reason="maxlen", outcome="dead_lettered").inc(
                    admission.dead_lettered
                )
            if kept:
                self.metrics.rejected.labels(reason="maxlen", outcome="discarded").inc(kept)
