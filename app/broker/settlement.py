"""ACK, NACK, timeout and release: every path that ends a delivery, and the retry decision
loop of the ones that are not acknowledged (domain.retry decides, storage applies).

Each retry-path settlement is one transaction of the same round trips as when storage made
the decisions itself: one statement locks the rows (``deliveries.lock_*``), ``decide_all``
runs in Python in between, and at most three statements apply what it decided
(``deliveries.apply_decisions``, none for an empty list); dead-lettering (``dead_letter``, the
one way a copy is dead-lettered, for every reason) adds at most three more, and one read of
the routes when the target is an exchange.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.broker.limits import Limits
from app.broker.tasks import TaskOwner
from app.domain.retry import DeathReason, Decision, Outcome, decide, is_cycle, with_death
from app.errors import UnknownDeliveryTag
from app.metrics import Metrics
from app.storage import deliveries, sqlapi
from app.storage.database import Connection, Database
from app.storage.deliveries import DeadLetterMove, Decisions, Unsettled

log = logging.getLogger("messagex.settle")

#: rows per statement when sweeping expired leases
SWEEP_BATCH = 500
#: rows per transaction when sweeping expired copies (contract §13)
EXPIRY_BATCH = 2000
#: rows per statement when deleting expired copies that no dead-letter target wants
EXPIRY_DISCARD_BATCH = 25_000


#: "<message id>.<128 bits in lowercase hex>": ASCII digits only, so ``int`` reads the id
_TAG = re.compile(r"([0-9]{1,19})\.[0-9a-f]{32}", re.ASCII)
_MAX_ID = 2**63 - 1


def parse_tag(tag: str) -> int | None:
    """The message id a delivery tag names, or None when it cannot be one of ours.

    Strict (ASCII digits within bigint, 32 lowercase hex): a tag that reaches the batched
    ack statement must never make it fail, or it would fail every other ack in the batch.
    One compiled pattern: half the cost of testing the parts one by one (once per ACK).
    """
    match = _TAG.fullmatch(tag)
    if match is None:
        return None
    value = int(match.group(1))
    return value if value <= _MAX_ID else None


@dataclass
class Settled:
    """What a retry-path batch did: outcome per row id, the queues that got ready rows, and
    the connections whose deliveries it ended (their local credit is reconciled)."""

    outcomes: dict[int, Outcome] = field(default_factory=dict)
    woken_queues: set[int] = field(default_factory=set)
    owners: set[str] = field(default_factory=set)
    #: the rows that expired instead of returning to ready, with their outcome
    expired: dict[int, Outcome] = field(default_factory=dict)
    #: the queues the rows were settled in
    sources: set[int] = field(default_factory=set)


def decide_all(rows: Sequence[Unsettled], *, requeue: bool) -> tuple[Settled, Decisions]:
    """The retry decision of each locked row, sorted by what storage is to do with it."""
    settled = Settled()
    decisions = Decisions()
    for row in rows:
        decision = decide(
            delivery_count=row.delivery_count,
            max_delivery_count=row.max_delivery_count,
            has_dead_letter_target=row.has_dead_letter_target,
            requeue=requeue,
            expired=row.expired,
        )
        settled.outcomes[row.id] = decision.outcome
        settled.sources.add(row.queue_id)
        if decision.reason is DeathReason.EXPIRED:
            settled.expired[row.id] = decision.outcome
        if row.owner_connection:
            settled.owners.add(row.owner_connection)
        _sort(row, decision, settled, decisions)
    return settled, decisions


def _sort(row: Unsettled, decision: Decision, settled: Settled, decisions: Decisions) -> None:
    if decision.outcome is Outcome.REQUEUED:
        decisions.requeue.append(row.id)
        settled.woken_queues.add(row.queue_id)
    elif decision.outcome is Outcome.DEAD:
        decisions.dead.append(row.id)
    elif decision.outcome is Outcome.DISCARDED:
        decisions.discard.append(row.id)
    else:
        assert decision.reason is not None
        decisions.dead_letter.append((row, decision.reason))


#: ``route(exchange, [(routing key, headers)])``: for each item, the (name, id) of every queue
#: that the exchange routes it to — the publisher's router (``Publisher.route_many``).
DeadLetterRouter = Callable[
    [str, Sequence[tuple[str, Mapping[str, Any]]]], Awaitable[list[list[tuple[str, int]]]]
]


@dataclass
class DeadLettered:
    """What ``Settlement.dead_letter`` did: the queues that got ready copies, and the copies
    dropped instead (matched no queue, or the cycle rule), by reason."""

    woken_queues: set[int] = field(default_factory=set)
    dropped: Counter[DeathReason] = field(default_factory=Counter)


def plan_dead_letters(
    doomed: Sequence[tuple[Unsettled, DeathReason]],
    routed: Mapping[int, list[tuple[str, int]]],
) -> tuple[list[DeadLetterMove], list[DeadLetterMove], list[int], DeadLettered]:
    """Where each doomed copy goes (contract §10, §13), no I/O: ``routed`` gives, for a copy
    whose queue has a dead-letter exchange, the queues that exchange routes it to. Returns
    (moves, further copies, ids to drop, result)."""
    moves: list[DeadLetterMove] = []
    copies: list[DeadLetterMove] = []
    drop: list[int] = []
    result = DeadLettered()
    for row, reason in doomed:
        headers = with_death(
            row.headers,
            queue=row.queue_name,
            reason=reason,
            time=row.now,
            exchange=row.exchange,
            routing_key=row.routing_key,
        )
        if row.dead_letter_queue_id is not None:
            targets = [(row.dead_letter_queue or "", row.dead_letter_queue_id)]
            exchange, key = row.exchange, row.routing_key
        else:
            assert row.dead_letter_exchange is not None
            targets = routed.get(row.id, [])
            exchange = row.dead_letter_exchange
            key = dead_letter_key(row)
        targets = [t for t in targets if not is_cycle(headers, queue=t[0], reason=reason)]
        if not targets:
            drop.append(row.id)
            result.dropped[reason] += 1
            continue
        first, *rest = targets
        moves.append(DeadLetterMove(row.id, first[1], headers, exchange, key))
        copies.extend(DeadLetterMove(row.id, q, headers, exchange, key) for _, q in rest)
        result.woken_queues.update(q for _, q in targets)
    return moves, copies, drop, result


def dead_letter_key(row: Unsettled) -> str:
    """The routing key a copy is dead-lettered with through an exchange: the queue's
    x-dead-letter-routing-key, else the copy's own."""
    if row.dead_letter_routing_key is not None:
        return row.dead_letter_routing_key
    return row.routing_key


class _AckGroup:
    """The tags of one ACK frame: one future for all of them, resolved with the queue id of
    each tag (None where the tag is not a live delivery of that connection)."""

    __slots__ = ("future", "queue_ids")

    def __init__(self, size: int) -> None:
        self.future: asyncio.Future[list[int | None]] = asyncio.get_running_loop().create_future()
        self.queue_ids: list[int | None] = [None] * size


class Settlement:
    """Settles deliveries; acks that arrive together (from any connection) share a statement."""

    def __init__(
        self,
        db: Database,
        tasks: TaskOwner,
        metrics: Metrics,
        after_settle: Callable[[Settled], None],
    ) -> None:
        self.db = db
        self.tasks = tasks
        self.metrics = metrics
        self.after_settle = after_settle
        #: the length rule for copies that become ready again (contract §13)
        self.limits = Limits(db, metrics)
        self.limits.set_dead_letter(self.dead_letter_maxlen)
        # (message id, tag, owner connection, group, index in the group)
        self._pending: list[tuple[int, str, str, _AckGroup, int]] = []
        self._flushing = False
        self._router: DeadLetterRouter | None = None

    # -- ACK ------------------------------------------------------------------------------

    def submit_acks(
        self, owner_connection: str, tags: Sequence[str]
    ) -> asyncio.Future[list[int | None]]:
        """Queue acknowledgements for the next batched statement. The future resolves to the
        queue id of each tag, or None where the tag is not a live delivery of that connection
        (the caller's UnknownDeliveryTag); it fails with Unavailable/InternalError like a
        query. No task per ack: a consumer acking every message sends thousands a second."""
        group = _AckGroup(len(tags))
        queued = False
        for index, tag in enumerate(tags):
            message_id = parse_tag(tag)
            if message_id is not None:
                self._pending.append((message_id, tag, owner_connection, group, index))
                queued = True
        if not queued:
            group.future.set_result(group.queue_ids)
        elif not self._flushing:
            self._flushing = True
            self.tasks.spawn(self._flush(), name="ack-flush")
        return group.future

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                groups = {id(p[3]): p[3] for p in batch}
                try:
                    deleted = await deliveries.ack_many(self.db.hot, [p[:3] for p in batch])
                except Exception as exc:
                    for group in groups.values():
                        if not group.future.done():
                            group.future.set_exception(exc)
                    continue
                self.metrics.ack_statements.inc()
                self.metrics.acked.inc(len(deleted))
                self._count_acks(deleted.values())
                left = set(deleted.values())
                for _, tag, owner, group, index in batch:
                    # pop: the same tag twice in one batch is acked once, unknown the second time
                    group.queue_ids[index] = deleted.pop((tag, owner), None)
                for group in groups.values():
                    if not group.future.done():
                        group.future.set_result(group.queue_ids)
                await self._release_groups(left)
        finally:
            self._flushing = False

    def _count_acks(self, queue_ids: Iterable[int]) -> None:
        """The charts' per-queue acks (``QueueActivity``)."""
        acked = self.metrics.activity.acked
        for queue_id in queue_ids:
            acked[queue_id] = acked.get(queue_id, 0) + 1

    async def _grouped(self, queue_ids: set[int]) -> set[int]:
        """Those of ``queue_ids`` that have ``x-message-groups`` (cached per process)."""
        if not queue_ids:
            return set()
        infos = await self.limits.infos(queue_ids)
        return {q for q, info in infos.items() if info.arguments.message_groups}

    async def _release_groups(self, queue_ids: set[int]) -> None:
        """Copies left these queues (acked): in a group queue the next copy of the group
        may go now, to a subscriber here or on another process (contract §16), so the
        queue is woken everywhere, as after a publish. A failed look-up wakes nothing (the
        dispatchers' 1 s poll finds the copy) rather than fail the acks it follows."""
        try:
            woken = await self._grouped(queue_ids)
        except Exception as exc:
            log.warning("could not tell whether acked queues have groups (%s)", type(exc).__name__)
            return
        if woken:
            self.after_settle(Settled(woken_queues=woken))

    async def ack_pull(self, owner_user: str, tag: str) -> None:
        """ACK one pulled delivery. Raises UnknownDeliveryTag."""
        acked, _ = await self.ack_pull_many(owner_user, [tag])
        if not acked:
            raise UnknownDeliveryTag()

    async def ack_pull_many(
        self, owner_user: str, tags: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        """ACK several pulled deliveries in one statement, each as if acked alone. Returns
        (acknowledged, unknown), both in request order; a tag given twice is acknowledged
        once and unknown the second time."""
        items = [(message_id, tag) for tag in tags if (message_id := parse_tag(tag)) is not None]
        by_tag = await deliveries.ack_pull_many(self.db.hot, items, owner_user)
        deleted = set(by_tag)
        if items:
            self.metrics.ack_statements.inc()
            self.metrics.acked.inc(len(deleted))
            self._count_acks(by_tag.values())
            await self._release_groups(set(by_tag.values()))
        acked: list[str] = []
        unknown: list[str] = []
        for tag in tags:
            if tag in deleted:
                deleted.discard(tag)
                acked.append(tag)
            else:
                unknown.append(tag)
        return acked, unknown

    # -- NACK -----------------------------------------------------------------------------

    async def nack(
        self, tag: str, requeue: bool, *, owner_connection: str | None, owner_user: str | None
    ) -> tuple[Outcome, int]:
        """Reject one delivery; returns its outcome and queue id. Raises UnknownDeliveryTag."""
        message_id = parse_tag(tag)
        if message_id is None:
            raise UnknownDeliveryTag()
        async with self.db.transaction() as conn:
            row = await deliveries.lock_by_tag(
                conn,
                id=message_id,
                tag=tag,
                owner_connection=owner_connection,
                owner_user=owner_user,
            )
            if row is None:
                raise UnknownDeliveryTag()
            settled, decisions = decide_all([row], requeue=requeue)
            await self._apply(conn, settled, decisions)
        outcome = settled.outcomes[row.id]
        self.metrics.nacked.labels(outcome=outcome.value).inc()
        self._count_expired(settled)
        settled.owners.discard(owner_connection or "")
        self.after_settle(settled)
        return outcome, row.queue_id

    # -- release --------------------------------------------------------------------------

    async def release_connections(self, owners: Sequence[str]) -> Settled:
        """Release everything these connections hold (disconnect), through the retry path."""
        async with self.db.transaction() as conn:
            rows = await deliveries.lock_owned_by_connections(conn, owners)
            settled, decisions = decide_all(rows, requeue=True)
            await self._apply(conn, settled, decisions)
        self._count("disconnect", settled)
        self.after_settle(settled)
        return settled

    async def release_processes(self, processes: Sequence[str]) -> Settled:
        async with self.db.transaction() as conn:
            rows = await deliveries.lock_owned_by_processes(conn, processes)
            settled, decisions = decide_all(rows, requeue=True)
            await self._apply(conn, settled, decisions)
        self._count("process_lost", settled)
        self.after_settle(settled)
        return settled

    async def sweep_expired(self) -> int:
        """Release deliveries whose ack timeout passed; safe when several processes sweep."""
        total = 0
        while True:
            async with self.db.transaction() as conn:
                rows = await deliveries.lock_expired(conn, SWEEP_BATCH)
                settled, decisions = decide_all(rows, requeue=True)
                await self._apply(conn, settled, decisions)
            if rows:
                self._count("ack_timeout", settled)
                self.after_settle(settled)
            total += len(rows)
            if len(rows) < SWEEP_BATCH:
                return total

    def _count(self, reason: str, settled: Settled) -> None:
        for outcome in settled.outcomes.values():
            self.metrics.released.labels(reason=reason, outcome=outcome.value).inc()
        self._count_expired(settled)

    def _count_expired(self, settled: Settled) -> None:
        for outcome in settled.expired.values():
            self.metrics.expired.labels(outcome=outcome.value).inc()

    # -- dead-lettering: the one way a copy is dead-lettered -------------------------------

    def set_router(self, router: DeadLetterRouter) -> None:
        """Route copies dead-lettered through an exchange with the publisher's router."""
        self._router = router

    async def _apply(self, conn: Connection, settled: Settled, decisions: Decisions) -> None:
        """Apply the retry decisions and dead-letter, then the length rule to the queues that
        got ready copies (broker/limits.py): in the same transaction, so no commit leaves a
        limited queue above its limit. Counted as it happens (a rollback fails the
        settlement)."""
        await deliveries.apply_decisions(conn, decisions)
        if decisions.dead_letter:
            done = await self.dead_letter(conn, decisions.dead_letter)
            settled.woken_queues |= done.woken_queues
        dropped = await self.limits.after_ready(conn, settled.woken_queues)
        self.limits.count_dropped(dropped)
        settled.woken_queues |= dropped.woken
        # a group's head left or became ready again: its next copy (or itself) may go
        settled.woken_queues |= await self._grouped(settled.sources)

    async def dead_letter(
        self, conn: Connection, doomed: Sequence[tuple[Unsettled, DeathReason]]
    ) -> DeadLettered:
        """Dead-letter locked rows (``deliveries.lock_*``), each for its reason, to its queue's
        dead-letter target, in the caller's transaction: the one way a copy is dead-lettered
        (contract §10, §13). A dead-letter queue gets the copy itself; a dead-letter exchange
        routes it like a publish (with x-dead-letter-routing-key, else its own key) and each
        queue it matches gets a new ready copy; the cycle rule drops it from a queue it died
        in for the same reason (unless rejected); a copy left with no queue is deleted.
        Every row must have a dead-letter target. The caller wakes ``woken_queues`` after
        its commit (``after_settle``)."""
        routed: dict[int, list[tuple[str, int]]] = {}
        by_exchange: dict[str, list[Unsettled]] = {}
        for row, _ in doomed:
            if row.dead_letter_queue_id is None and row.dead_letter_exchange is not None:
                by_exchange.setdefault(row.dead_letter_exchange, []).append(row)
        for exchange, rows in by_exchange.items():
            if self._router is None:
                raise RuntimeError("no dead-letter router set")
            items = [(dead_letter_key(r), r.headers) for r in rows]
            for row, queues in zip(rows, await self._router(exchange, items), strict=True):
                routed[row.id] = queues
        moves, copies, drop, done = plan_dead_letters(doomed, routed)
        await deliveries.dead_letter(conn, moves, copies)
        await deliveries.discard(conn, drop)
        for reason, n in Counter(reason for _, reason in doomed).items():
            self.metrics.dead_lettered.labels(reason=reason.value).inc(n)
        for reason, n in done.dropped.items():
            self.metrics.dead_letter_dropped.labels(reason=reason.value).inc(n)
        return done

    async def dead_letter_ids(
        self, conn: Connection, ids: Sequence[int], reason: DeathReason
    ) -> DeadLettered:
        """Lock the copies ``ids`` and dead-letter those whose queue has a dead-letter target
        for ``reason``, deleting the others (e.g. ``maxlen`` drop-head), in the caller's
        transaction; the caller wakes ``woken_queues`` after its commit."""
        rows = await deliveries.lock_by_ids(conn, ids)
        await deliveries.discard(conn, [r.id for r in rows if not r.has_dead_letter_target])
        return await self.dead_letter(conn, [(r, reason) for r in rows if r.has_dead_letter_target])

    async def dead_letter_maxlen(self, conn: Connection, ids: list[int]) -> set[int]:
        """The length rule's dead-lettering (``storage.limits.DeadLetterHook``): the copies
        ``ids`` leave with reason ``maxlen``; returns the queues that received copies."""
        return (await self.dead_letter_ids(conn, ids, DeathReason.MAXLEN)).woken_queues

    async def dead_letter_parked(self) -> int:
        """Dead-letter (reason ``maxlen``) the copies a SQL publish (contract §18) parked:
        the ones a limited queue with a dead-letter target shed or rejected, which SQL cannot
        route on (storage/sqlapi.py). Within a second of its commit; SKIP LOCKED, so that
        several processes may run it at once."""
        total = 0
        while True:
            async with self.db.transaction() as conn:
                ids = await sqlapi.lock_parked(conn, EXPIRY_BATCH)
                woken = await self.dead_letter_maxlen(conn, ids) if ids else set()
                dropped = await self.limits.after_ready(conn, woken)
            self.limits.count_dropped(dropped)
            woken |= dropped.woken
            if woken:
                self.after_settle(Settled(woken_queues=woken))
            total += len(ids)
            if len(ids) < EXPIRY_BATCH:
                return total

    async def sweep_expired_copies(self) -> int:
        """Remove ready copies past their expiry (contract §13): dead-lettered with reason
        ``expired`` where their queue has a target, else deleted. Safe when several processes
        sweep at once (SKIP LOCKED); batches until none is left. An idle sweep is one probe on
        the hot path, no transaction; copies that are only deleted go first, by a statement
        each 10,000 of them, and only those with a dead-letter target come into Python."""
        if not await deliveries.any_expired_ready(self.db.hot):
            return 0
        total = 0
        while True:  # first those that are only deleted: one statement a batch
            deleted = await deliveries.discard_expired(self.db.hot, EXPIRY_DISCARD_BATCH)
            if deleted:
                self.metrics.expired.labels(outcome=Outcome.DISCARDED.value).inc(deleted)
            total += deleted
            if deleted < EXPIRY_DISCARD_BATCH:
                break
        while True:
            async with self.db.transaction() as conn:
                rows = await deliveries.lock_expired_ready(conn, EXPIRY_BATCH)
                doomed = [(r, DeathReason.EXPIRED) for r in rows if r.has_dead_letter_target]
                gone = [r.id for r in rows if not r.has_dead_letter_target]
                await deliveries.discard(conn, gone)
                done = await self.dead_letter(conn, doomed)
                dropped = await self.limits.after_ready(conn, done.woken_queues)
            self.limits.count_dropped(dropped)
            done.woken_queues |= dropped.woken
            if gone:
                self.metrics.expired.labels(outcome=Outcome.DISCARDED.value).inc(len(gone))
            if doomed:
                self.metrics.expired.labels(outcome=Outcome.DEAD_LETTERED.value).inc(len(doomed))
            # an expired head lets its group's next copy go (contract §16)
            done.woken_queues |= await self._grouped({r.queue_id for r in rows})
            if done.woken_queues:
                self.after_settle(Settled(woken_queues=done.woken_queues))
            total += len(rows)
            if len(rows) < EXPIRY_BATCH:
                return total
