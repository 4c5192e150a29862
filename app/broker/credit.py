"""Prefetch credit of this process's subscriptions: the unsettled tags that bound each one.

A subscription's credit is its prefetch minus its unsettled tags. A slot returns when an ACK
arrives (``ack_soon``), when a NACK is settled (``nack``), and when a delivery was settled
elsewhere — ack timeout swept by any process, a release, an admin deleting an in-flight
message — which ``reconcile`` finds by asking the database (every second, and at once when an
event names the connection).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from app.broker.consumers import ConsumerRegistry, Outlet, Subscription
from app.broker.settlement import Settlement
from app.broker.wakeups import WakeHub
from app.domain.retry import Outcome
from app.storage import deliveries
from app.storage.database import Database

#: how often local prefetch credit is reconciled with the database
RECONCILE_SECONDS = 1.0


class Credit:
    def __init__(
        self, db: Database, registry: ConsumerRegistry, hub: WakeHub, settlement: Settlement
    ) -> None:
        self.db = db
        self.registry = registry
        self.hub = hub
        self.settlement = settlement
        #: told of a delivery settled by its connection when no subscription of it holds it
        #: any more (one left over by UNSUBSCRIBE): broker/single_active.py listens
        self.settled_unsubscribed: Callable[[int], None] = lambda queue_id: None

    def ack_soon(
        self,
        outlet: Outlet,
        tags: Sequence[str],
        done: Callable[[list[int | None], BaseException | None], None],
    ) -> asyncio.Future[list[int | None]]:
        """ACK ``tags`` (each as if acked alone) without a task: ``done(queue_ids, None)``
        once settled, ``queue_ids[i]`` None where ``tags[i]`` was not a live delivery of this
        connection (a tag given twice is acked once); or ``done([], error)`` (Unavailable,
        ...). Returns what to wait for.

        The prefetch slot returns when the ACK arrives, not when its DELETE commits (as in
        RabbitMQ): the next claim runs while the batched DELETE does, instead of after it.
        Should the DELETE fail (the database is unreachable), the deliveries are still in
        flight to this connection and take their slots back; the 1 s reconciliation drops
        them again if they are released meanwhile.
        """
        held = self._return_slots(outlet.id, tags)
        future = self.settlement.submit_acks(outlet.id, tags)

        def settled(f: asyncio.Future[list[int | None]]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                for tag, sub in held:
                    if sub.active:
                        sub.unsettled.add(tag)
                        self.registry.holds(sub)
                done([], exc)
                return
            queue_ids = f.result()
            if len(held) < len(tags):
                # acked but not held when it arrived: a SUBSCRIBE since may hold it now
                mine = {tag for tag, _ in held}
                for tag, queue_id in zip(tags, queue_ids, strict=True):
                    if queue_id is not None and tag not in mine:
                        self.free(outlet.id, tag, queue_id)
            done(queue_ids, None)

        future.add_done_callback(settled)
        return future

    def _return_slots(
        self, connection_id: str, tags: Sequence[str]
    ) -> list[tuple[str, Subscription]]:
        """Take ``tags`` off their subscriptions' unsettled sets now; returns who held which."""
        held: list[tuple[str, Subscription]] = []
        woken: set[int] = set()
        now = time.time()
        settled = self.registry.settled
        for tag in tags:
            sub = self.registry.find_by_tag(connection_id, tag)
            if sub is not None:
                sub.unsettled.discard(tag)
                sub.last_settled = now
                settled.add(sub)
                held.append((tag, sub))
                woken.add(sub.queue_id)
        if woken:
            self.hub.credit(woken)
        return held

    async def nack(self, outlet: Outlet, tag: str, requeue: bool) -> Outcome:
        outcome, queue_id = await self.settlement.nack(
            tag, requeue, owner_connection=outlet.id, owner_user=None
        )
        self.free(outlet.id, tag, queue_id)
        return outcome

    def free(self, connection_id: str, tag: str, queue_id: int) -> None:
        """``tag`` of this connection on ``queue_id`` was settled: its slot returns."""
        sub = self.registry.get(connection_id, queue_id)
        if sub is not None and tag in sub.unsettled:
            sub.unsettled.discard(tag)
            sub.last_settled = time.time()
            self.registry.settled.add(sub)
            self.hub.credit([queue_id])
        elif sub is None:
            self.settled_unsubscribed(queue_id)

    async def reconcile_all(self) -> None:
        """The periodic round: only connections holding unsettled deliveries have slots to
        get back, so idle subscribers cost nothing here."""
        owners = self.registry.holding_connections()
        if owners:
            await self.reconcile(owners)

    async def reconcile(self, owners: Sequence[str]) -> None:
        """Drop local unsettled tags that are no longer in flight (timed out, released,
        deleted), so their prefetch slots free up."""
        # Only tags held before the query can be judged by it: a claim that hands out while
        # it runs committed after its snapshot, and its tags must keep their slots.
        held = [(sub, set(sub.unsettled)) for o in owners for sub in self.registry.of_connection(o)]
        async with self.db.transaction() as conn:
            live = await deliveries.still_in_flight(conn, owners)
        for sub, tags in held:
            owner = sub.outlet.id
            gone = {t for t in tags if (owner, t) not in live} & sub.unsettled
            if gone:
                sub.unsettled -= gone
                self.hub.credit([sub.queue_id])
