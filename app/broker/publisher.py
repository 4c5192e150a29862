"""Route + persist atomically, then wake the dispatchers (contract §5, §7).

A publish call is batched from end to end, whether it carries one message or a thousand,
and concurrent calls are grouped (group commit): one query checks the routes of every
exchange the group publishes to (reading the bindings only of those that changed since this
process compiled them: ``broker.routing_cache``), every message is routed in Python
(``app.domain.routing``), and ONE INSERT — one statement, so one atomic commit without a
transaction block — stores every copy of every message of the group. Nothing of a call is
stored unless everything is: an oversize body, an unroutable mandatory message or a database
error fails the whole call; a call that fails inside a group is retried alone so that it
cannot fail the others.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from app.auth.permissions import Access, require
from app.broker.dedup import Claims, Dedup
from app.broker.limits import Admission, Limits, QueueInfo
from app.broker.routing_cache import MAX_BINDINGS, Router, Routes, RoutingCache
from app.broker.tasks import TaskOwner
from app.domain.model import Delivery, OutgoingMessage, PublishResult, User
from app.errors import (
    BrokerError,
    DiskFull,
    InternalError,
    MessageTooLarge,
    NotFound,
    Unavailable,
    Unroutable,
)
from app.metrics import Metrics
from app.storage import dedup as dedup_store
from app.storage import limits as limits_store
from app.storage import messages as store
from app.storage.database import Database
from app.telemetry import Tracing

if TYPE_CHECKING:
    from app.broker.dispatcher import HandOff

log = logging.getLogger("messagex.publisher")

#: Called after each successful commit with the ids of the queues that received copies due
#: now (and not all handed off).
PublishedListener = Callable[[set[int]], None]
#: Called after each successful commit with the queues whose every copy of it is delayed:
#: queue id → seconds until the first of them is due.
DelayedListener = Callable[[dict[int, float]], None]

#: Prefetch room for a group's direct hand-off (``Dispatcher.reserve``).
Reserve = Callable[[Mapping[int, int]], Awaitable["HandOff | None"]]

#: A queue deleted between routing and insert makes the insert fail; the publish is then
#: retried with fresh bindings (it is ordered after the delete). Each attempt collides again
#: only if another bound queue is deleted within its own few milliseconds: three attempts
#: lost now and then to a loop that declares, binds and deletes queues without pause
#: (tests/api/test_routing_cache.py, under a loaded CI), eight make that chance negligible
#: and cost nothing until a collision.
_ATTEMPTS = 8

#: what makes a lone request's write run again: nothing was stored and its cause has passed
_AGAIN = (store.QueueDeleted, dedup_store.ClaimDeadlocked)

#: at most this many publish calls share one group write (MESSAGEX_PUBLISH_GROUP_MAX)
GROUP_MAX = 256

#: how long a publish whose commit is in doubt keeps asking the database whether it was
#: stored (a restarting PostgreSQL takes about a second or two) before it answers 503
IN_DOUBT_SECONDS = 5.0

#: at most this many queue ids are remembered for direct publishes (then forgotten at once)
QUEUE_ID_CACHE_MAX = 10_000

#: publish receipts older than this are swept (they matter for IN_DOUBT_SECONDS only)
RECEIPT_TTL_SECONDS = 300


@dataclass(slots=True)
class _Plan:
    """Routed messages of one call: rows to insert and what to answer."""

    messages: list[OutgoingMessage]
    exchange: str = ""
    copies: list[tuple[int, int]] = field(default_factory=list)
    results: list[PublishResult] = field(default_factory=list)
    queue_ids: set[int] = field(default_factory=set)
    unroutable: int = 0
    #: copies the length rule did not store (x-overflow reject-publish*)
    rejected: int = 0
    #: copies not stored as duplicates (x-deduplication-window-seconds, contract §15)
    duplicates: int = 0
    #: the queue of each copy not stored (rejected or duplicate), for the charts' counts
    refused_queues: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Request:
    """One publish call waiting for its group write: to an exchange, or straight to a queue."""

    exchange: str | None
    queue: str | None
    messages: list[OutgoingMessage]
    future: asyncio.Future[list[PublishResult]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class _Router:
    """Routes many messages published to one exchange (``routing_cache.Router``); when the
    routing key alone decides (no headers exchange on the way), each distinct key is routed
    once per call."""

    def __init__(self, found: Routes | Router) -> None:
        # A leaf exchange (no e2e binding, no alternate) is routed by its compiled bindings
        # directly, as before §14: no Router is built for it.
        self._route: Callable[[str, Mapping[str, Any]], list[str]]
        if isinstance(found, Routes):
            self._route = found.route
            self.queue_ids = found.queue_ids
            by_key_only = found.route.by_key_only
        else:
            self._route = found
            self.queue_ids = found.queue_ids
            by_key_only = found.by_key_only
        self._memo: dict[str, list[str]] | None = {} if by_key_only else None

    def __call__(self, message: OutgoingMessage) -> list[str]:
        if self._memo is None:
            return self._route(message.routing_key, message.headers)
        queues = self._memo.get(message.routing_key)
        if queues is None:
            queues = self._memo[message.routing_key] = self._route(message.routing_key, {})
        return queues


def _where(index: int, total: int) -> str:
    return f"message {index} of the batch" if total > 1 else "the message"


class Publisher:
    def __init__(
        self,
        db: Database,
        metrics: Metrics,
        *,
        max_message_bytes: int,
        max_header_bytes: int = 64 * 1024,
        group_max: int = GROUP_MAX,
        routing_cache_bindings: int = MAX_BINDINGS,
    ) -> None:
        self.db = db
        self.metrics = metrics
        #: OpenTelemetry spans (app.telemetry), or None
        self.tracing: Tracing | None = None
        self.max_message_bytes = max_message_bytes
        self.max_header_bytes = max_header_bytes
        self._listeners: list[PublishedListener] = []
        self._delayed_listeners: list[DelayedListener] = []
        self._pending: list[_Request] = []
        self._flushing = False
        self.group_max = group_max
        self.tasks = TaskOwner()
        #: queue name → id for direct publishes, saving a lookup per publish. Never wrong for
        #: long: ids are never reused, so a stale entry (the queue was deleted, or deleted
        #: and declared again) makes the insert's foreign key fail (QueueDeleted, nothing
        #: stored), and the retry looks the name up again.
        self._queue_ids: dict[str, int] = {}
        self._reserve: Reserve | None = None
        #: each exchange's bindings, compiled, re-read only when their version changed
        self.routing = RoutingCache(routing_cache_bindings)
        #: queues' priorities and length limits (contract §13)
        self.limits = Limits(db, metrics)
        #: idempotent publish (contract §15)
        self.dedup = Dedup(db, metrics)

    def set_reserve(self, reserve: Reserve) -> None:
        """Let copies go straight to idle subscribers with prefetch room (the direct
        hand-off): ``reserve(copies per queue id)`` is the dispatcher's ``reserve``."""
        self._reserve = reserve

    def add_published_listener(self, callback: PublishedListener) -> None:
        """Call ``callback(queue_ids)`` after each commit that stored at least one copy.

        A plain sync function, called on the event loop: it must not block (set events,
        schedule tasks). Its exceptions are logged and do not fail the publish.
        """
        self._listeners.append(callback)

    def add_delayed_listener(self, callback: DelayedListener) -> None:
        """Call ``callback({queue id: seconds})`` after each commit that stored copies only
        delayed ones in some queues (a wake-up now would find nothing due there). The same
        rules as ``add_published_listener``."""
        self._delayed_listeners.append(callback)

    # ------------------------------------------------------------------------- use cases

    async def publish(
        self, actor: User, exchange_name: str, messages: Sequence[OutgoingMessage]
    ) -> list[PublishResult]:
        """Publish ``messages`` to an exchange, atomically; results in order."""
        require(actor, Access.WRITE, exchange_name, "exchange")
        if self.tracing is None:
            return await self._submit(_Request(exchange_name, None, self._prepare(messages)))
        with self.tracing.publishing(exchange_name, messages) as traced:
            return await self._submit(_Request(exchange_name, None, self._prepare(traced)))

    async def publish_to_queue(
        self, actor: User, queue_name: str, messages: Sequence[OutgoingMessage]
    ) -> list[PublishResult]:
        """Publish straight into a queue (the default exchange): exchange ``""``, routing key
        the queue's name, no routing. A missing queue is 404."""
        require(actor, Access.WRITE, queue_name, "queue")
        if self.tracing is None:
            prepared = [m.evolve(routing_key=queue_name) for m in self._prepare(messages)]
            return await self._submit(_Request(None, queue_name, prepared))
        with self.tracing.publishing(queue_name, messages) as traced:
            prepared = [m.evolve(routing_key=queue_name) for m in self._prepare(traced)]
            return await self._submit(_Request(None, queue_name, prepared))

    async def route_many(
        self, exchange: str, items: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[list[tuple[str, int]]]:
        """Route (routing key, headers) pairs through ``exchange`` as a publish would, storing
        nothing: for each, the (name, id) of every queue it reaches; none when the exchange
        is gone. Dead-lettering through an exchange uses it (broker/settlement.py), so both
        share one router."""
        found = await self.routing.load(self.db.hot, [exchange])
        if exchange not in found:
            return [[] for _ in items]
        router = Router(found, exchange)  # through e2e bindings and alternates (§14)
        ids = router.queue_ids
        return [[(q, ids[q]) for q in router(key, headers)] for key, headers in items]

    async def close(self) -> None:
        await self.tasks.close()

    # ------------------------------------------------------------------------- group commit

    async def _submit(self, request: _Request) -> list[PublishResult]:
        """Queue the request for the next group write and wait for its own outcome.

        Requests that arrive while a group is being written share the next one: one read of
        the routes and one INSERT (one commit) for all of them. Each is answered only after
        that commit. When idle, a request is written at once: grouping adds no latency.
        """
        self._pending.append(request)
        if not self._flushing:
            self._flushing = True
            self.tasks.spawn(self._flush(), name="publish-group")
        return await request.future

    async def _flush(self) -> None:
        try:
            while self._pending:
                size = self.group_max
                group, self._pending = self._pending[:size], self._pending[size:]
                await self._write_group(group)
        finally:
            self._flushing = False

    async def _write_group(self, group: list[_Request], attempt: int = 1) -> None:
        try:
            plans = await self._plan_group(group)
            written = [(r, p) for r, p in zip(group, plans, strict=True) if isinstance(p, _Plan)]
            handed_off = await self._insert([p for _, p in written])
            self.metrics.publish_groups.inc()
        except Unavailable as exc:
            _fail(group, exc)
            # The requests queued behind this group were not written: they get a plain 503
            # now rather than each wait out the same dead link (a black-holed network costs
            # a statement's command timeout and the in-doubt settle: seconds). A publish is
            # thus answered within one group write's bound, never two (docs/reliability.md).
            # A full disk refuses them too, and says so.
            waiting, self._pending = self._pending, []
            _fail(waiting, DiskFull() if isinstance(exc, DiskFull) else Unavailable())
            return
        except BrokerError as exc:
            if len(group) > 1:
                # One request's problem must not fail the others: write each on its own.
                for request in group:
                    await self._write_group([request])
            elif isinstance(exc, _AGAIN) and attempt < _ATTEMPTS:
                self._queue_ids.clear()
                await self._write_group(group, attempt + 1)
            elif isinstance(exc, store.QueueDeleted) and group[0].queue is not None:
                _fail(group, NotFound(f"queue '{group[0].queue}' not found"))
            else:
                _fail(group, exc)
            return
        except Exception:
            log.exception("publish group write failed")
            _fail(group, InternalError())
            return
        queue_ids: set[int] = set()
        delayed: dict[int, float] = {}
        for request, plan in zip(group, plans, strict=True):
            if isinstance(plan, _Plan):
                _split_delayed(plan, queue_ids, delayed)
                request.future.set_result(self._committed(plan))
            elif not request.future.done():
                request.future.set_exception(plan)
        self._notify(queue_ids - handed_off, delayed)

    async def _plan_group(self, group: list[_Request]) -> list[_Plan | BrokerError]:
        """Route every request against one snapshot of the routes (two reads at most, run
        side by side); a request that cannot be routed gets its error, the others go on."""
        exchanges = sorted({r.exchange for r in group if r.exchange is not None})
        cached = self._queue_ids
        queues = sorted({r.queue for r in group if r.queue is not None and r.queue not in cached})
        routes: dict[str, Routes] = {}
        found: dict[str, int] = {}
        if exchanges and queues:
            routes, found = await asyncio.gather(
                self.routing.load(self.db.hot, exchanges),
                store.find_queue_ids(self.db.hot, queues),
            )
        elif exchanges:
            routes = await self.routing.load(self.db.hot, exchanges)
        elif queues:
            found = await store.find_queue_ids(self.db.hot, queues)
        if found:
            if len(cached) + len(found) > QUEUE_ID_CACHE_MAX:
                cached.clear()
            cached.update(found)
        queue_ids = cached
        plans: list[_Plan | BrokerError] = []
        for request in group:
            try:
                plans.append(self._plan_one(request, routes, queue_ids))
            except BrokerError as exc:
                plans.append(exc)
        return plans

    def _plan_one(
        self,
        request: _Request,
        routes: dict[str, Routes],
        queue_ids: dict[str, int],
    ) -> _Plan:
        if request.exchange is not None:
            root = routes.get(request.exchange)
            if root is None:
                raise NotFound(f"exchange '{request.exchange}' not found")
            found = root if root.leaf else Router(routes, request.exchange)
            return self._route(found, request.messages, request.exchange)
        assert request.queue is not None
        queue_id = queue_ids.get(request.queue)
        if queue_id is None:
            raise NotFound(f"queue '{request.queue}' not found")
        plan = _Plan(request.messages, exchange="")
        for index, message in enumerate(request.messages):
            plan.copies.append((index, queue_id))
            plan.results.append(PublishResult(True, [request.queue], message.message_id))
        plan.queue_ids.add(queue_id)
        return plan

    async def _insert(self, plans: list[_Plan]) -> set[int]:
        """ONE statement for every copy of every message of the group. Returns the queues
        whose copies all went straight to a subscriber (the direct hand-off): no message
        of this group waits in them, so there is no one to wake."""
        messages: list[tuple[str, OutgoingMessage]] = []
        copies: list[tuple[int, int]] = []
        for plan in plans:
            offset = len(messages)
            messages.extend((plan.exchange, m) for m in plan.messages)
            copies.extend((offset + index, queue_id) for index, queue_id in plan.copies)
        receipt = str(uuid.uuid4())
        infos, priorities = await self.limits.priorities(messages, copies)
        if any(i.arguments.limited or i.arguments.deduplicated for i in infos.values()):
            await self._insert_admitted(plans, messages, copies, receipt, infos, priorities)
            return set()
        handoff = await self._reserve_room(messages, copies)
        try:
            target = None
            if handoff is not None:
                owners = handoff.owners(copies, lambda i: _may_hand_off(messages[i][1]))
                target = store.HandOffTo(handoff.process_id, owners)
            try:
                handed = await store.insert_copies(
                    self.db.hot, messages, copies, receipt, handoff=target, priorities=priorities
                )
            except store.PublishInDoubt as doubt:
                # Stored or not, it was not seen: copies handed off by it (if it was) are in
                # flight to their subscribers unannounced, and their ack timeout redelivers
                # them. Everything is woken, as for any publish.
                await self._settle_in_doubt(receipt, doubt.cause)
                return set()
            if not handed or handoff is None:
                return set()
            try:
                queues = handoff.deliver(handed, partial(_handed_delivery, messages, copies))
            except Exception:
                # The publish is stored and must be answered so. Its handed-off copies are
                # in flight to subscribers that were not sent them: their ack timeout (or
                # the subscriber's disconnect) releases them.
                log.exception("handing off a stored publish failed")
                return set()
        finally:
            if handoff is not None:
                handoff.close()
        done = {row.copy for row in handed}
        return queues.difference(q for i, (_, q) in enumerate(copies) if i not in done)

    async def _insert_admitted(
        self,
        plans: list[_Plan],
        messages: list[tuple[str, OutgoingMessage]],
        copies: list[tuple[int, int]],
        receipt: str,
        infos: dict[int, QueueInfo],
        priorities: list[int | None] | None,
    ) -> None:
        """The group has copies for length-limited or deduplicated queues: one transaction
        that locks the limited ones (broker/limits.py), claims the message_ids bound for the
        deduplicated ones (broker/dedup.py: in that order, so that no two publishes wait on
        each other in a cycle), leaves out the duplicates and then the copies x-overflow
        rejects (releasing their claims: a rejected copy does not burn its message_id),
        inserts the rest with the same statement as any publish (no direct hand-off), and
        drops the head of the queues that went over. Each plan's results then name the
        refusing queues under ``rejected`` and ``duplicates``."""
        limited = [q for q, info in infos.items() if info.arguments.limited]
        deduplicated = any(info.arguments.deduplicated for info in infos.values())
        if (
            limited
            and not deduplicated
            and all(limits_store.deletes_only(infos[q]) for q in limited)
        ):
            await self._insert_trimmed(
                messages, copies, receipt, [infos[q] for q in limited], priorities
            )
            return
        admission = Admission()
        claims = Claims()
        try:
            if not limited:
                # Deduplication alone: no statement here reads messages, so the hot path's
                # stable pool (generic plans: storage/planner.py) and no SQLAlchemy.
                async with self.db.hot.connection(stable=True) as raw, raw.transaction():
                    claims = await self.dedup.claim(raw, messages, copies, infos)
                    kept = [i for i in range(len(copies)) if i not in claims.duplicates]
                    await self._insert_kept(raw, messages, copies, receipt, priorities, kept)
            else:
                async with self.db.transaction() as conn:
                    held = await self.limits.hold(conn, limited)
                    raw = await limits_store.driver(conn)
                    claims = await self.dedup.claim(raw, messages, copies, infos)
                    candidates = [i for i in range(len(copies)) if i not in claims.duplicates]
                    admission = await self._admit(
                        conn, held, messages, copies, priorities, candidates
                    )
                    if admission.rejected:
                        await self.dedup.release(raw, claims, admission.rejected)
                    kept = [i for i in candidates if i not in admission.rejected]
                    await self._insert_kept(raw, messages, copies, receipt, priorities, kept)
                    await self.limits.settle_publish(conn, held, limited, admission)
        except Unavailable as exc:
            await self._settle_in_doubt(receipt, exc)  # stored (returns) or not (503)
        self.limits.count_admission(admission)
        self.dedup.count(len(claims.duplicates))
        self._notify(admission.dropped.woken, {})
        if admission.rejected:
            _mark(plans, admission.rejected, infos, "rejected")
        if claims.duplicates:
            _mark(plans, claims.duplicates, infos, "duplicates")

    async def _insert_kept(
        self,
        raw: Any,
        messages: list[tuple[str, OutgoingMessage]],
        copies: list[tuple[int, int]],
        receipt: str,
        priorities: list[int | None] | None,
        kept: list[int],
    ) -> None:
        """Insert the copies ``kept`` (indexes into ``copies``) on ``raw``, in its
        transaction, with the statement of every publish."""
        if kept:
            await store.insert_copies(
                self.db.hot,
                messages,
                [copies[i] for i in kept],
                receipt,
                priorities=None if priorities is None else [priorities[i] for i in kept],
                within=raw,
            )

    async def _admit(
        self,
        conn: Any,
        held: dict[int, QueueInfo],
        messages: list[tuple[str, OutgoingMessage]],
        copies: list[tuple[int, int]],
        priorities: list[int | None] | None,
        candidates: list[int],
    ) -> Admission:
        """The length rule on the copies ``candidates`` (those not duplicates), with
        ``rejected`` as indexes into all ``copies``."""
        chosen = [copies[i] for i in candidates]
        chosen_priorities = None if priorities is None else [priorities[i] for i in candidates]
        admission = await self.limits.admit(conn, held, messages, chosen, chosen_priorities)
        admission.rejected = {candidates[i] for i in admission.rejected}
        return admission

    async def _insert_trimmed(
        self,
        messages: list[tuple[str, OutgoingMessage]],
        copies: list[tuple[int, int]],
        receipt: str,
        limited: list[QueueInfo],
        priorities: list[int | None] | None,
    ) -> None:
        """``_insert_admitted`` where every limited queue only deletes its head (drop-head, a
        limit on copies, no dead-letter target: the common case): lock, insert, trim in one
        transaction on the hot path (storage/limits.py, ``insert_and_trim``: where it can, the
        trim is part of the INSERT's statement)."""
        try:
            dropped = await limits_store.insert_and_trim(
                self.db.hot, limited, messages, copies, receipt, priorities
            )
        except Unavailable as exc:
            await self._settle_in_doubt(receipt, exc)  # stored (returns) or not (503)
            return
        self.limits.count_dropped(limits_store.Dropped(discarded=dropped))

    async def _reserve_room(
        self, messages: list[tuple[str, OutgoingMessage]], copies: list[tuple[int, int]]
    ) -> HandOff | None:
        if self._reserve is None:
            return None
        wanted = Counter(q for i, q in copies if _may_hand_off(messages[i][1]))
        return await self._reserve(wanted) if wanted else None

    async def _settle_in_doubt(self, receipt: str, cause: Unavailable) -> None:
        """The connection broke while the group's statement was committing: ask the database,
        on a fresh connection, whether it was stored (return) or not (Unavailable: a 503 that
        did nothing, as the contract says). Only when the database cannot be asked within
        IN_DOUBT_SECONDS is the outcome still unknown; the 503 then says so. Not stored: the
        503 is ``cause``'s (e.g. the database is out of disk space)."""
        if isinstance(cause, DiskFull):
            # PostgreSQL answered the statement with an error (53100): it rolled back, so
            # nothing is in doubt; and asking would insert a receipt, which a full disk
            # refuses too (each such publish waited out IN_DOUBT_SECONDS, then "may have been")
            raise DiskFull()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + IN_DOUBT_SECONDS
        pause = 0.05
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    stored = await store.settle_in_doubt(self.db.hot, receipt)
            except (Unavailable, TimeoutError):
                if loop.time() + pause > deadline:
                    log.warning("publish in doubt: the database could not be asked in time")
                    raise Unavailable(
                        "the database connection broke while the publish was committing and "
                        "the database could not be asked whether it was stored: it may have "
                        "been; publish again with the same properties.message_id"
                    ) from None
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
                continue
            log.warning("publish in doubt settled: %s", "stored" if stored else "not stored")
            if not stored:
                raise type(cause)(cause.message)
            return

    async def sweep_receipts(self) -> None:
        await store.sweep_receipts(self.db.hot, RECEIPT_TTL_SECONDS)

    # ------------------------------------------------------------------------- steps

    def _prepare(self, messages: Sequence[OutgoingMessage]) -> list[OutgoingMessage]:
        """Enforce the size limits (the rules' one home: REST, batch and WebSocket publishes
        all come here) and settle each message's id.

        The id is the publisher's ``message_id`` or a new UUID; it is also written into the
        stored properties, so every copy and every delivery carries it. Headers and
        properties are encoded here, once, as they will be stored: their size together is
        checked against ``max_header_bytes``, and the INSERT takes the same text.
        """
        limit = self.max_message_bytes
        total = len(messages)
        for index, message in enumerate(messages):
            if len(message.body) > limit:
                raise MessageTooLarge(
                    f"{_where(index, total)}: the body is {len(message.body)} bytes, "
                    f"over the limit of {limit} bytes; nothing was stored"
                )
        header_limit = self.max_header_bytes
        prepared: list[OutgoingMessage] = []
        ids = _uuid4_strings(sum(1 for m in messages if not m.message_id))
        for index, message in enumerate(messages):
            message_id = message.message_id or next(ids)
            properties = message.properties
            if not (message.message_id and properties.get("message_id") == message_id):
                properties = {**properties, "message_id": message_id}
            stored, size = store.encode_metadata(message.headers, properties)
            if size > header_limit:
                raise MessageTooLarge(
                    f"{_where(index, total)}: its headers and properties are {size} bytes as "
                    f"JSON, over the limit of {header_limit} bytes; nothing was stored"
                )
            prepared.append(
                message.evolve(message_id=message_id, properties=properties, stored_json=stored)
            )
        return prepared

    def _route(
        self, found: Routes | Router, messages: list[OutgoingMessage], exchange: str
    ) -> _Plan:
        """Route every message; raise Unroutable for a mandatory message with no queue."""
        router = _Router(found)
        queue_ids = router.queue_ids
        plan = _Plan(messages, exchange=exchange)
        for index, message in enumerate(messages):
            queues = router(message)
            if not queues:
                if message.mandatory:
                    self.metrics.unroutable.inc()
                    raise Unroutable(
                        f"{_where(index, len(messages))} is mandatory and matched no queue; "
                        "nothing was stored"
                    )
                plan.unroutable += 1
            for queue in queues:
                queue_id = queue_ids[queue]
                plan.copies.append((index, queue_id))
                plan.queue_ids.add(queue_id)
            plan.results.append(PublishResult(bool(queues), list(queues), message.message_id))
        return plan

    def _committed(self, plan: _Plan) -> list[PublishResult]:
        self.metrics.published.inc(len(plan.messages))
        stored = len(plan.copies) - plan.rejected - plan.duplicates
        if stored > 0:
            self.metrics.routed_copies.inc(stored)
        if plan.unroutable:
            self.metrics.unroutable.inc(plan.unroutable)
        self._count_activity(plan)
        return plan.results

    def _count_activity(self, plan: _Plan) -> None:
        """The charts' per-queue published copies (``QueueActivity``)."""
        activity = self.metrics.activity
        activity.messages += len(plan.messages)
        published = activity.published
        for _, queue_id in plan.copies:
            published[queue_id] = published.get(queue_id, 0) + 1
        for queue_id in plan.refused_queues:
            published[queue_id] -= 1

    def _notify(self, queue_ids: set[int], delayed: dict[int, float]) -> None:
        """``delayed``: queue id → seconds, for queues with delayed copies (those that also
        got a copy due now, in ``queue_ids``, are woken now and left out)."""
        if queue_ids:
            for listener in self._listeners:
                try:
                    listener(set(queue_ids))
                except Exception:
                    log.exception("a published listener failed")
        delayed = {q: s for q, s in delayed.items() if q not in queue_ids}
        if delayed:
            for delayed_listener in self._delayed_listeners:
                try:
                    delayed_listener(delayed)
                except Exception:
                    log.exception("a delayed listener failed")


def _uuid4_strings(n: int) -> Iterator[str]:
    """``n`` random (version 4) UUIDs in their text form, from one read of ``os.urandom``:
    a third of what ``str(uuid.uuid4())`` costs each, which shows at 100 per batch."""
    raw = bytearray(os.urandom(16 * n))
    for start in range(0, 16 * n, 16):
        raw[start + 6] = (raw[start + 6] & 0x0F) | 0x40  # version 4
        raw[start + 8] = (raw[start + 8] & 0x3F) | 0x80  # RFC 4122 variant
        h = raw[start : start + 16].hex()
        yield f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _split_delayed(plan: _Plan, due_now: set[int], delayed: dict[int, float]) -> None:
    """Add the plan's queues to ``due_now`` (a copy is due at once) or ``delayed`` (queue id
    → the earliest delay in seconds of its copies, all delayed so far)."""
    messages = plan.messages
    if not any(m.delay_ms for m in messages):
        due_now |= plan.queue_ids
        return
    for index, queue_id in plan.copies:
        delay_ms = messages[index].delay_ms
        if delay_ms == 0:
            due_now.add(queue_id)
        else:
            seconds = delay_ms / 1000
            if seconds < delayed.get(queue_id, seconds + 1):
                delayed[queue_id] = seconds


def _may_hand_off(message: OutgoingMessage) -> bool:
    """A delayed message waits for its due time in the queue: it is never handed off."""
    return message.delay_ms == 0


def _handed_delivery(
    messages: list[tuple[str, OutgoingMessage]],
    copies: list[tuple[int, int]],
    row: store.HandedOff,
    slot: int,
) -> Delivery:
    """The delivery of a copy the publish stored in flight: what a claim would return."""
    message_index, queue_id = copies[row.copy]
    exchange, m = messages[message_index]
    return Delivery(
        slot,
        row.id,
        queue_id,
        m.message_id,
        exchange,
        m.routing_key,
        row.headers,
        row.properties,
        m.body,
        m.binary,
        1,
        row.created_at,
        row.delivery_tag,
    )


def _mark(plans: list[_Plan], refused: set[int], infos: dict[int, QueueInfo], kind: str) -> None:
    """Move each refused copy's queue from its result's ``queues`` to ``rejected`` or
    ``duplicates`` (``kind``); ``refused`` indexes the group's copies, plan after plan."""
    index = 0
    for plan in plans:
        for message, queue_id in plan.copies:
            if index in refused:
                result = plan.results[message]
                name = infos[queue_id].name
                result.queues.remove(name)
                plan.refused_queues.append(queue_id)
                if kind == "rejected":
                    result.rejected.append(name)
                    plan.rejected += 1
                else:
                    result.duplicates.append(name)
                    plan.duplicates += 1
            index += 1


def _fail(group: list[_Request], exc: BaseException) -> None:
    for request in group:
        if not request.future.done():
            request.future.set_exception(exc)
