"""Claim up to each subscriber's credit, in one statement per queue, and push.

One worker task per queue that has local subscribers. It sleeps on the queue's wake-up
(publish, ack, release, NOTIFY from another process), on the next delayed message's due time
(measured on the database clock), or on a slow poll that covers a lost wake-up.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from app.broker.consumers import ConsumerRegistry, Subscription
from app.broker.tasks import TaskOwner
from app.broker.wakeups import WakeHub, wait_event
from app.errors import Unavailable
from app.metrics import Metrics
from app.storage import deliveries
from app.storage.database import Database
from app.storage.messages import HandedOff

log = logging.getLogger("messagex.dispatch")

#: at most this many rows per claim statement
MAX_CLAIM = 1000


class Dispatcher:
    def __init__(
        self,
        db: Database,
        hub: WakeHub,
        registry: ConsumerRegistry,
        tasks: TaskOwner,
        metrics: Metrics,
        process_id: str,
        *,
        poll_interval: float = 1.0,
    ) -> None:
        self.db = db
        self.hub = hub
        self.registry = registry
        self.tasks = tasks
        self.metrics = metrics
        self.process_id = process_id
        self.poll_interval = poll_interval
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    def lock(self, queue_id: int) -> asyncio.Lock:
        """Held while claiming and handing out for a queue, and while its subscriptions change,
        so an UNSUBSCRIBED or a close is never followed by a delivery from that queue."""
        lock = self._locks.get(queue_id)
        if lock is None:
            lock = self._locks[queue_id] = asyncio.Lock()
        return lock

    def ensure_worker(self, queue_id: int) -> None:
        task = self._workers.get(queue_id)
        if task is None or task.done():
            self._workers[queue_id] = self.tasks.spawn(
                self._run(queue_id), name=f"dispatch-{queue_id}"
            )

    async def _run(self, queue_id: int) -> None:
        try:
            with self.hub.register(queue_id) as event:
                while self.registry.has_queue(queue_id):
                    event.clear()
                    try:
                        due = await self._dispatch(queue_id)
                    except Unavailable:
                        due = self.poll_interval
                    except Exception:
                        log.exception("dispatch for queue %s failed", queue_id)
                        due = self.poll_interval
                    wait = self.poll_interval if due is None else min(due, self.poll_interval)
                    if wait > 0:
                        await wait_event(event, wait)
        finally:
            if self._workers.get(queue_id) is asyncio.current_task():
                del self._workers[queue_id]
                if not self.registry.has_queue(queue_id):
                    self._locks.pop(queue_id, None)

    async def _dispatch(self, queue_id: int) -> float | None:
        """Hand out until credit or ready messages run out.

        Returns seconds until the next delayed message is due (0 to go again at once), or
        None when there is nothing to wait for but a wake-up.
        """
        while True:
            async with self.lock(queue_id):
                order = self.registry.round_robin(queue_id, MAX_CLAIM)
                if not order:
                    self.hub.drained(queue_id, None)
                    return None
                wakes = self.hub.wakes(queue_id)
                claimed = await deliveries.claim(
                    self.db.hot,
                    queue_id=queue_id,
                    n=len(order),
                    lease_seconds=order[0].lease_seconds,
                    process_id=self.process_id,
                    owners=[s.outlet.id for s in order],
                    owner_user=None,
                )
                self._hand_out(queue_id, order, claimed)
            self.metrics.claims.labels(via="websocket").inc()
            if len(claimed) < len(order):
                self.hub.drained(queue_id, wakes)
                return await deliveries.seconds_until_due(self.db.hot, queue_id)
            self.hub.drained(queue_id, None)  # it took all it could: more may wait

    async def reserve(self, wanted: Mapping[int, int]) -> HandOff | None:
        """Prefetch room for a publish's direct hand-off: for each queue of ``wanted`` (queue
        id → copies) whose dispatcher is idle, who would get its next copies, in round-robin
        order, as a claim would hand them out. Holds those queues' locks (so no claim, and no
        unsubscribe or close, runs in between) until the HandOff is closed; None when no
        queue has room. A busy queue is skipped, not waited for."""
        orders: dict[int, list[Subscription]] = {}
        locks: list[asyncio.Lock] = []
        for queue_id, n in wanted.items():
            lock = self._locks.get(queue_id)
            if lock is None or lock.locked() or not self.registry.has_queue(queue_id):
                continue
            await lock.acquire()
            locks.append(lock)
            order = self.registry.round_robin(queue_id, min(n, MAX_CLAIM))
            if order:
                orders[queue_id] = order
        if not orders:
            for lock in locks:
                lock.release()
            return None
        return HandOff(self, self.process_id, orders, locks)

    def _hand_out(
        self, queue_id: int, order: list[Subscription], claimed: list[deliveries.Claimed]
    ) -> None:
        batches: dict[int, tuple[Subscription, list[deliveries.Claimed]]] = {}
        grouped: defaultdict[int, list[deliveries.Claimed]] = defaultdict(list)
        for item in claimed:
            sub = order[item.slot]
            sub.unsettled.add(item.delivery_tag)
            grouped[id(sub)].append(item)
            batches[id(sub)] = (sub, grouped[id(sub)])
        for sub, items in batches.values():
            sub.outlet.deliver(sub, items)
        self.registry.advance(queue_id, len(claimed))
        if claimed:
            self.metrics.delivered.labels(via="websocket").inc(len(claimed))


class HandOff:
    """Prefetch room held for one publish write (``Dispatcher.reserve``): which copies may go
    straight to a subscriber, and, once the write has committed, handing them out."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        process_id: str,
        orders: dict[int, list[Subscription]],
        locks: list[asyncio.Lock],
    ) -> None:
        self.process_id = process_id
        self._dispatcher = dispatcher
        self._orders = orders
        self._locks = locks
        self._slots: dict[int, tuple[int, int]] = {}  # copy index -> (queue id, slot)

    def owners(
        self, copies: Sequence[tuple[int, int]], eligible: Callable[[int], bool]
    ) -> list[tuple[str, float] | None]:
        """Per copy ``(message index, queue id)``: (connection, lease) to hand it to, or None.
        Each reserved queue's first eligible copies take its slots in order."""
        used = dict.fromkeys(self._orders, 0)
        owners: list[tuple[str, float] | None] = []
        for index, (message, queue_id) in enumerate(copies):
            order = self._orders.get(queue_id)
            slot = used.get(queue_id, 0)
            if order is None or slot >= len(order) or not eligible(message):
                owners.append(None)
                continue
            used[queue_id] = slot + 1
            self._slots[index] = (queue_id, slot)
            sub = order[slot]
            owners.append((sub.outlet.id, sub.lease_seconds))
        return owners

    def deliver(
        self,
        handed: Sequence[HandedOff],
        build: Callable[[HandedOff, int], deliveries.Claimed],
    ) -> set[int]:
        """After the commit: hand out what was stored in flight, ``build(row, slot)`` making
        each delivery. Returns the queues that got deliveries."""
        per_queue: dict[int, list[deliveries.Claimed]] = {}
        for row in handed:
            queue_id, slot = self._slots[row.copy]
            per_queue.setdefault(queue_id, []).append(build(row, slot))
        for queue_id, items in per_queue.items():
            self._dispatcher._hand_out(queue_id, self._orders[queue_id], items)
        self._dispatcher.metrics.handed_off.inc(len(handed))
        return set(per_queue)

    def close(self) -> None:
        for lock in self._locks:
            lock.release()
        self._locks = []
