"""WebSocket consumption behind one façade: connections, their subscriptions, and the credit
that bounds what is dispatched to them (the WebSocket layer talks to nothing else here).

Subscriptions change under their queue's dispatch lock (``Dispatcher.lock``), so an
UNSUBSCRIBED, a SUBSCRIPTION_CANCELLED or a close is never followed by a delivery from that
queue. Dispatch is in broker/dispatcher.py, credit in broker/credit.py.
"""

from __future__ import annotations

import asyncio
import logging

from app.auth.permissions import Access, require
from app.broker.consumers import ConsumerRegistry, Outlet, Subscription
from app.broker.credit import Credit
from app.broker.dispatcher import Dispatcher
from app.broker.settlement import Settlement
from app.broker.single_active import SingleActive
from app.broker.wakeups import WakeHub
from app.config import Settings
from app.domain.retry import Outcome
from app.errors import AlreadySubscribed, LimitExceeded, NotFound, NotSubscribed, Unavailable
from app.metrics import Metrics
from app.storage import deliveries, presence, single_active
from app.storage.database import Database

log = logging.getLogger("messagex.delivery")


class Subscriptions:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        metrics: Metrics,
        hub: WakeHub,
        registry: ConsumerRegistry,
        dispatcher: Dispatcher,
        credit: Credit,
        settlement: Settlement,
        single: SingleActive,
        process_id: str,
    ) -> None:
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self.hub = hub
        self.registry = registry
        self.dispatcher = dispatcher
        self.credit = credit
        self.settlement = settlement
        self.single = single
        self.process_id = process_id
        self._all_closed = asyncio.Event()
        self._releasing = 0
        # The two calls of the hot path are the parts' own bound methods, not a method that
        # calls them: one Python call less per ACK frame and per publish.
        #: ACK tags and return their slots at once (``Credit.ack_soon``)
        self.ack_soon = credit.ack_soon
        #: prefetch room for a publish's direct hand-off (``Dispatcher.reserve``)
        self.reserve = dispatcher.reserve

    # -- connections ------------------------------------------------------------------------

    async def admit(
        self, connection_id: str, username: str, client_address: str | None = None
    ) -> None:
        """Count an authenticated connection against its user's limit on all processes
        (contract §8); LimitExceeded when the user has them all. ``disconnect`` forgets it."""
        limit = self.settings.max_connections_per_user
        async with self.db.transaction() as conn:
            admitted = await presence.admit_connection(
                conn,
                connection_id=connection_id,
                process_id=self.process_id,
                username=username,
                limit=limit,
                client_address=client_address,
            )
        if not admitted:
            raise LimitExceeded(
                f"user '{username}' already has {limit} WebSocket connections"
                " (MESSAGEX_MAX_CONNECTIONS_PER_USER)"
            )

    def resume(self, outlet: Outlet) -> None:
        """``outlet`` has room again (it read what waited): its queues may hand it more."""
        queue_ids = [sub.queue_id for sub in self.registry.of_connection(outlet.id)]
        if queue_ids:
            self.hub.credit(queue_ids)

    def connect(self, outlet: Outlet, token_digest: bytes | None) -> None:
        self.registry.add_outlet(outlet, token_digest)
        self.metrics.connections.set(len(self.registry.outlets))

    async def disconnect(self, outlet: Outlet) -> None:
        self._releasing += 1
        try:
            subs = self.registry.of_connection(outlet.id)
            for sub in subs:
                async with self.dispatcher.lock(sub.queue_id):
                    self.registry.remove(sub)
                self.dispatcher.forget(sub.queue_id)
            self.registry.remove_outlet(outlet.id)
            self.metrics.connections.set(len(self.registry.outlets))
            self.metrics.subscriptions.set(self.registry.subscription_count())
            async with self.db.transaction() as conn:
                await presence.remove_connection(conn, outlet.id)
            await self.settlement.release_connections([outlet.id])
            for sub in subs:
                if sub.single_active:
                    sub.unsettled.clear()  # released above
                    self.single.ended(sub)
        finally:
            self._releasing -= 1
            if not self.registry.outlets and not self._releasing:
                self._all_closed.set()

    async def drain(self) -> None:
        """Close local WebSockets with 1001 and wait until their handlers have released what
        they held (each connection's own disconnect does it)."""
        for outlet in list(self.registry.outlets.values()):
            outlet.close(1001, "broker shutting down")
        if self.registry.outlets or self._releasing:
            self._all_closed.clear()
            await self._all_closed.wait()

    async def close_all(self) -> list[str]:
        """Close local sockets (1001) and end their subscriptions at once (shutdown); returns
        the connections, whose deliveries the caller releases."""
        for outlet in list(self.registry.outlets.values()):
            outlet.close(1001, "broker shutting down")
        owners = self.registry.connection_ids()
        for conn_id in owners:
            for sub in self.registry.of_connection(conn_id):
                # Under the dispatch lock: no claim for this subscriber commits after release.
                async with self.dispatcher.lock(sub.queue_id):
                    self.registry.remove(sub)
                self.dispatcher.forget(sub.queue_id)
        return owners

    # -- subscriptions ----------------------------------------------------------------------

    async def subscribe(self, outlet: Outlet, queue: str, prefetch: int) -> Subscription:
        """Register a subscription, inactive until ``activate`` (after SUBSCRIBED is queued)."""
        require(outlet.user, Access.READ, queue, "queue")
        limit = self.settings.max_subscriptions_per_connection
        if len(self.registry.of_connection(outlet.id)) >= limit:
            raise LimitExceeded(
                f"this connection already has {limit} subscriptions"
                " (MESSAGEX_MAX_SUBSCRIPTIONS_PER_CONNECTION)"
            )
        async with self.db.transaction() as conn:
            found = await deliveries.queue_by_name(conn, queue)
            if found is None:
                raise NotFound(f"queue '{queue}' not found")
            queue_id = found.id
            if self.registry.get(outlet.id, queue_id) is not None:
                raise AlreadySubscribed(f"already subscribed to queue '{queue}'")
            register = single_active.register if found.single_active else presence.add_subscription
            active = await register(
                conn,
                connection_id=outlet.id,
                queue_id=queue_id,
                process_id=self.process_id,
                prefetch=prefetch,
            )
            held = await deliveries.owned_tags(conn, outlet.id, queue_id)
        lease = float(found.ack_timeout_seconds or self.settings.ack_timeout_seconds)
        sub = Subscription(
            outlet,
            queue_id,
            queue,
            prefetch,
            lease,
            unsettled=held,
            active=False,
            single_active=found.single_active,
            groups=found.groups,
            waiting=not active,
        )
        async with self.dispatcher.lock(queue_id):
            if self.registry.get(outlet.id, queue_id) is not None:
                raise AlreadySubscribed(f"already subscribed to queue '{queue}'")
            self.registry.add(sub)
        if sub.single_active:
            self.single.added(sub)
        self.metrics.subscriptions.set(self.registry.subscription_count())
        return sub

    def activate(self, sub: Subscription) -> None:
        """SUBSCRIBED is queued: deliveries may follow (not while it waits for its turn as
        the single active consumer: ``SingleActive`` activates it then)."""
        if sub.single_active:
            sub.active = not sub.waiting
            self.dispatcher.watch(sub.queue_id, self.single.watcher)
        else:
            sub.active = True
            self.dispatcher.watch(sub.queue_id)
        self.hub.wake([sub.queue_id])

    async def unsubscribe(self, outlet: Outlet, queue: str) -> None:
        sub = next(
            (s for s in self.registry.of_connection(outlet.id) if s.queue_name == queue), None
        )
        if sub is None:
            raise NotSubscribed(f"not subscribed to queue '{queue}'")
        await self.end(sub)

    async def end(self, sub: Subscription) -> None:
        """End one subscription (UNSUBSCRIBE, read permission withdrawn); what it holds stays
        owned by its connection."""
        async with self.dispatcher.lock(sub.queue_id):
            self.registry.remove(sub)
        self.dispatcher.forget(sub.queue_id)
        self.metrics.subscriptions.set(self.registry.subscription_count())
        try:
            async with self.db.transaction() as conn:
                await presence.remove_subscription(conn, sub.outlet.id, sub.queue_id)
        except Unavailable:
            log.warning("could not remove a subscription row; the heartbeat reaper will")
        if sub.single_active:
            self.single.ended(sub)

    async def cancel_queue(self, queue: str) -> None:
        """The queue was deleted: its subscribers get SUBSCRIPTION_CANCELLED."""
        for queue_id in self.registry.queue_ids():
            for sub in self.registry.of_queue(queue_id):
                if sub.queue_name == queue:
                    async with self.dispatcher.lock(queue_id):
                        self.registry.remove(sub)
                    self.dispatcher.forget(queue_id)
                    sub.outlet.cancel(queue, "queue_deleted")
                    if sub.single_active:
                        self.single.ended(sub)
        self.metrics.subscriptions.set(self.registry.subscription_count())

    # -- credit ---------------------------------------------------------------------------

    async def nack(self, outlet: Outlet, tag: str, requeue: bool) -> Outcome:
        return await self.credit.nack(outlet, tag, requeue)
