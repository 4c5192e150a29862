"""The delivery engine of one broker process: subscriptions, dispatch, settlement, pull,
presence across processes, and the LISTEN/NOTIFY wake-ups that tie processes together.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from app.auth.permissions import Access, allows, require
from app.broker.consumers import ConsumerRegistry, Outlet, Subscription
from app.broker.dispatcher import Dispatcher
from app.broker.settlement import Settled, Settlement
from app.broker.tasks import TaskOwner, every
from app.broker.wakeups import WakeHub, wait_event
from app.config import Settings
from app.domain.model import User
from app.domain.presence import HEARTBEAT_INTERVAL
from app.domain.retry import Outcome
from app.errors import AlreadySubscribed, NotFound, NotSubscribed, Unavailable
from app.metrics import Metrics
from app.storage import deliveries, liveness, presence
from app.storage.database import Database
from app.storage.deliveries import Claimed
from app.storage.listener import MAX_PAYLOAD, Listener
from app.storage.messages import DeletedMessage

log = logging.getLogger("messagex.delivery")

CHANNEL = "messagex_events"
HEARTBEAT_SECONDS = HEARTBEAT_INTERVAL.total_seconds()
#: how often live sockets' sessions and users are re-checked (contract: within 5 s)
LIVENESS_SECONDS = 2.0
#: how often local prefetch credit is reconciled with the database
RECONCILE_SECONDS = 1.0


@dataclass
class _Outgoing:
    """Events waiting to be sent to the other processes, coalesced."""

    queues: set[int] = field(default_factory=set)
    released_owners: set[str] = field(default_factory=set)
    deleted_queues: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)
    sessions: set[str] = field(default_factory=set)

    def empty(self) -> bool:
        return not (
            self.queues
            or self.released_owners
            or self.deleted_queues
            or self.users
            or self.sessions
        )

    def payloads(self, process_id: str) -> list[str]:
        body = {
            "p": process_id,
            "q": sorted(self.queues),
            "r": sorted(self.released_owners),
            "d": sorted(self.deleted_queues),
            "u": sorted(self.users),
            "s": sorted(self.sessions),
        }
        text = orjson.dumps(body).decode()
        if len(text) <= MAX_PAYLOAD:
            return [text]
        # Too big for one NOTIFY: everyone re-polls and re-checks instead.
        return [orjson.dumps({"p": process_id, "all": True}).decode()]


class DeliveryEngine:
    def __init__(
        self, db: Database, settings: Settings, metrics: Metrics, database_url: str
    ) -> None:
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self.process_id = str(uuid.uuid4())
        self.tasks = TaskOwner()
        self.hub = WakeHub()
        self.registry = ConsumerRegistry()
        self.dispatcher = Dispatcher(
            db, self.hub, self.registry, self.tasks, metrics, self.process_id
        )
        self.settlement = Settlement(db, self.tasks, metrics, self._after_settle)
        self.listener = Listener(database_url, CHANNEL, self._on_notify, self._on_listening)
        self._outgoing = _Outgoing()
        self._outgoing_ready = asyncio.Event()
        self._token_digests: dict[str, bytes] = {}
        self._all_closed = asyncio.Event()
        self._releasing = 0
        self.started = False

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        async with self.db.transaction() as conn:
            await presence.register_process(
                conn, self.process_id, socket.gethostname(), os.getpid()
            )
        spawn = self.tasks.spawn
        spawn(self.listener.run(), name="listener")
        spawn(self._send_notifications(), name="notify")
        spawn(every(HEARTBEAT_SECONDS, self._heartbeat, "heartbeat"), name="heartbeat")
        interval = self.settings.ack_timeout_check_interval_ms / 1000
        spawn(every(interval, self.settlement.sweep_expired, "ack-timeout"), name="ack-timeout")
        spawn(every(RECONCILE_SECONDS, self._reconcile_all, "reconcile"), name="reconcile")
        spawn(every(LIVENESS_SECONDS, self._check_liveness, "liveness"), name="liveness")
        self.started = True

    async def drain(self) -> None:
        """Close local WebSockets with 1001 and wait until their handlers have released what
        they held (each connection's own disconnect does it)."""
        for outlet in list(self.registry.outlets.values()):
            outlet.close(1001, "broker shutting down")
        if self.registry.outlets or self._releasing:
            self._all_closed.clear()
            await self._all_closed.wait()

    async def stop(self) -> None:
        """Close local sockets (1001), release what they hold, leave the process table."""
        for outlet in list(self.registry.outlets.values()):
            outlet.close(1001, "broker shutting down")
        owners = self.registry.connection_ids()
        for conn_id in owners:
            for sub in self.registry.of_connection(conn_id):
                # Under the dispatch lock: no claim for this subscriber commits after release.
                async with self.dispatcher.lock(sub.queue_id):
                    self.registry.remove(sub)
        try:
            if owners:
                await self.settlement.release_connections(owners)
            async with self.db.transaction() as conn:
                await presence.unregister_process(conn, self.process_id)
        except Exception as exc:
            log.warning("could not release on shutdown (%s); ack timeouts will", type(exc).__name__)
        await self.tasks.close()
        await self.listener.close()

    # -- consumers (WebSocket) -------------------------------------------------------------

    def connect(self, outlet: Outlet, token_digest: bytes | None) -> None:
        self.registry.add_outlet(outlet)
        if token_digest is not None:
            self._token_digests[outlet.id] = token_digest
        self.metrics.connections.set(len(self.registry.outlets))

    async def disconnect(self, outlet: Outlet) -> None:
        self._releasing += 1
        try:
            for sub in self.registry.of_connection(outlet.id):
                async with self.dispatcher.lock(sub.queue_id):
                    self.registry.remove(sub)
            self.registry.remove_outlet(outlet.id)
            self._token_digests.pop(outlet.id, None)
            self.metrics.connections.set(len(self.registry.outlets))
            self.metrics.subscriptions.set(self.registry.subscription_count())
            async with self.db.transaction() as conn:
                await presence.remove_connection(conn, outlet.id)
            await self.settlement.release_connections([outlet.id])
        finally:
            self._releasing -= 1
            if not self.registry.outlets and not self._releasing:
                self._all_closed.set()

    async def subscribe(self, outlet: Outlet, queue: str, prefetch: int) -> Subscription:
        """Register a subscription, inactive until ``activate`` (after SUBSCRIBED is queued)."""
        require(outlet.user, Access.READ, queue, "queue")
        async with self.db.transaction() as conn:
            found = await deliveries.queue_by_name(conn, queue)
            if found is None:
                raise NotFound(f"queue '{queue}' not found")
            queue_id, ack_timeout = found
            if self.registry.get(outlet.id, queue_id) is not None:
                raise AlreadySubscribed(f"already subscribed to queue '{queue}'")
            await presence.add_subscription(
                conn,
                connection_id=outlet.id,
                queue_id=queue_id,
                process_id=self.process_id,
                prefetch=prefetch,
            )
            held = await deliveries.owned_tags(conn, outlet.id, queue_id)
        lease = float(ack_timeout or self.settings.ack_timeout_seconds)
        sub = Subscription(outlet, queue_id, queue, prefetch, lease, unsettled=held, active=False)
        async with self.dispatcher.lock(queue_id):
            if self.registry.get(outlet.id, queue_id) is not None:
                raise AlreadySubscribed(f"already subscribed to queue '{queue}'")
            self.registry.add(sub)
        self.metrics.subscriptions.set(self.registry.subscription_count())
        return sub

    def activate(self, sub: Subscription) -> None:
        sub.active = True
        self.dispatcher.ensure_worker(sub.queue_id)
        self.hub.wake([sub.queue_id])

    async def unsubscribe(self, outlet: Outlet, queue: str) -> None:
        sub = next(
            (s for s in self.registry.of_connection(outlet.id) if s.queue_name == queue), None
        )
        if sub is None:
            raise NotSubscribed(f"not subscribed to queue '{queue}'")
        await self._end_subscription(sub)

    async def _end_subscription(self, sub: Subscription) -> None:
        async with self.dispatcher.lock(sub.queue_id):
            self.registry.remove(sub)
        self.metrics.subscriptions.set(self.registry.subscription_count())
        try:
            async with self.db.transaction() as conn:
                await presence.remove_subscription(conn, sub.outlet.id, sub.queue_id)
        except Unavailable:
            log.warning("could not remove a subscription row; the heartbeat reaper will")

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
        held: list[tuple[str, Subscription]] = []
        woken: set[int] = set()
        for tag in tags:
            sub = self.registry.find_by_tag(outlet.id, tag)
            if sub is not None:
                sub.unsettled.discard(tag)
                held.append((tag, sub))
                woken.add(sub.queue_id)
        if woken:
            self.hub.credit(woken)
        future = self.settlement.submit_acks(outlet.id, tags)

        def settled(f: asyncio.Future[list[int | None]]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                for tag, sub in held:
                    if sub.active:
                        sub.unsettled.add(tag)
                done([], exc)
                return
            queue_ids = f.result()
            if len(held) < len(tags):
                # acked but not held when it arrived: a SUBSCRIBE since may hold it now
                mine = {tag for tag, _ in held}
                for tag, queue_id in zip(tags, queue_ids, strict=True):
                    if queue_id is not None and tag not in mine:
                        self._free_credit(outlet.id, tag, queue_id)
            done(queue_ids, None)

        future.add_done_callback(settled)
        return future

    async def nack(self, outlet: Outlet, tag: str, requeue: bool) -> Outcome:
        outcome, queue_id = await self.settlement.nack(
            tag, requeue, owner_connection=outlet.id, owner_user=None
        )
        self._free_credit(outlet.id, tag, queue_id)
        return outcome

    def _free_credit(self, connection_id: str, tag: str, queue_id: int) -> None:
        sub = self.registry.get(connection_id, queue_id)
        if sub is not None and tag in sub.unsettled:
            sub.unsettled.discard(tag)
            self.hub.credit([queue_id])

    # -- consumers (HTTP pull) -------------------------------------------------------------

    async def get(
        self,
        user: User,
        queue: str,
        *,
        max_messages: int,
        wait_ms: int,
        ack_timeout_seconds: int | None,
    ) -> list[Claimed]:
        require(user, Access.READ, queue, "queue")
        async with self.db.transaction() as conn:
            found = await deliveries.queue_by_name(conn, queue)
        if found is None:
            raise NotFound(f"queue '{queue}' not found")
        queue_id, queue_timeout = found
        lease = float(ack_timeout_seconds or queue_timeout or self.settings.ack_timeout_seconds)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        with self.hub.register(queue_id) as event:
            while True:
                event.clear()
                claimed = await deliveries.claim(
                    self.db.hot,
                    queue_id=queue_id,
                    n=max_messages,
                    lease_seconds=lease,
                    process_id=self.process_id,
                    owners=None,
                    owner_user=user.username,
                )
                self.metrics.claims.labels(via="pull").inc()
                due = None
                remaining = deadline - loop.time()
                if not claimed and remaining > 0:
                    due = await deliveries.seconds_until_due(self.db.hot, queue_id)
                if claimed or remaining <= 0:
                    self.metrics.delivered.labels(via="pull").inc(len(claimed))
                    return claimed
                wait = min(remaining, self.dispatcher.poll_interval)
                if due is not None:
                    wait = min(wait, max(due, 0.0))
                await wait_event(event, wait)

    async def pull_ack(self, user: User, tag: str) -> None:
        await self.settlement.ack_pull(user.username, tag)

    async def pull_ack_many(self, user: User, tags: Sequence[str]) -> tuple[list[str], list[str]]:
        """ACK several pulled deliveries of ``user``; returns (acknowledged, unknown)."""
        return await self.settlement.ack_pull_many(user.username, tags)

    async def pull_nack(self, user: User, tag: str, requeue: bool) -> Outcome:
        outcome, _ = await self.settlement.nack(
            tag, requeue, owner_connection=None, owner_user=user.username
        )
        return outcome

    # -- events from this process ----------------------------------------------------------

    def on_published(self, queue_ids: set[int]) -> None:
        """Publisher hook, after commit: wake local dispatchers now, tell the others soon."""
        self.hub.wake(queue_ids)
        self._outgoing.queues |= queue_ids
        self._outgoing_ready.set()

    def _after_settle(self, settled: Settled) -> None:
        if settled.woken_queues:
            self.on_published(settled.woken_queues)
        local = [o for o in settled.owners if o in self.registry.outlets]
        remote = settled.owners.difference(local)
        if local:
            self.tasks.spawn(self._reconcile(local), name="reconcile-now")
        if remote:
            self._outgoing.released_owners |= remote
            self._outgoing_ready.set()

    def on_message_deleted(self, deleted: DeletedMessage) -> None:
        """An admin deleted a message; if it was in flight, its consumer gets the slot back."""
        if deleted.owner_connection:
            self._after_settle(Settled(owners={deleted.owner_connection}))

    async def on_queue_deleted(self, queue: str) -> None:
        await self._cancel_queue(queue)
        self._outgoing.deleted_queues.add(queue)
        self._outgoing_ready.set()

    async def on_user_changed(self, username: str) -> None:
        await self._recheck_users([username])
        self._outgoing.users.add(username)
        self._outgoing_ready.set()

    async def on_session_revoked(self, digest: bytes) -> None:
        self._close_sessions({digest})
        self._outgoing.sessions.add(digest.hex())
        self._outgoing_ready.set()

    # -- events from other processes -------------------------------------------------------

    def _on_listening(self) -> None:
        # Wake-ups may have been lost while the connection was down: everyone polls once.
        self.hub.wake_all()

    def _on_notify(self, payload: str) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict) or event.get("p") == self.process_id:
            return
        if event.get("all"):
            self.hub.wake_all()
            self.tasks.spawn(self._reconcile_all(), name="reconcile-remote")
            return
        self.hub.wake(int(q) for q in event.get("q", ()))
        owners = [o for o in event.get("r", ()) if o in self.registry.outlets]
        if owners:
            self.tasks.spawn(self._reconcile(owners), name="reconcile-remote")
        for queue in event.get("d", ()):
            self.tasks.spawn(self._cancel_queue(str(queue)), name="cancel-remote")
        if event.get("u"):
            self.tasks.spawn(self._recheck_users([str(u) for u in event["u"]]), name="users-remote")
        if event.get("s"):
            self._close_sessions({bytes.fromhex(str(s)) for s in event["s"]})

    async def _send_notifications(self) -> None:
        while True:
            await self._outgoing_ready.wait()
            self._outgoing_ready.clear()
            outgoing, self._outgoing = self._outgoing, _Outgoing()
            if outgoing.empty():
                continue
            for payload in outgoing.payloads(self.process_id):
                await self.listener.notify(payload)

    # -- periodic work ---------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        async with self.db.transaction() as conn:
            alive = await presence.heartbeat(conn, self.process_id, len(self.registry.outlets))
            if not alive:
                # We were taken for dead (a long pause): come back, with our subscriptions.
                await presence.register_process(
                    conn, self.process_id, socket.gethostname(), os.getpid()
                )
                for queue_id in self.registry.queue_ids():
                    for sub in self.registry.of_queue(queue_id):
                        await presence.add_subscription(
                            conn,
                            connection_id=sub.outlet.id,
                            queue_id=queue_id,
                            process_id=self.process_id,
                            prefetch=sub.prefetch,
                        )
            dead = await presence.reap_dead_processes(conn, self.process_id)
        if dead:
            log.warning("released the work of %d dead broker process(es)", len(dead))
            await self.settlement.release_processes(dead)

    async def _reconcile_all(self) -> None:
        owners = [o for o in self.registry.connection_ids() if self.registry.of_connection(o)]
        if owners:
            await self._reconcile(owners)

    async def _reconcile(self, owners: Sequence[str]) -> None:
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

    async def _check_liveness(self) -> None:
        digests = dict(self._token_digests)
        if digests:
            async with self.db.transaction() as conn:
                live = await liveness.live_sessions(conn, list(set(digests.values())))
            self._close_sessions(set(digests.values()) - live)
        names = {o.user.username for o in self.registry.outlets.values()}
        if names:
            await self._recheck_users(sorted(names))

    def _close_sessions(self, digests: set[bytes]) -> None:
        if not digests:
            return
        for conn_id, digest in list(self._token_digests.items()):
            outlet = self.registry.outlets.get(conn_id)
            if digest in digests and outlet is not None:
                outlet.close(4401, "session expired or revoked")

    async def _recheck_users(self, names: Sequence[str]) -> None:
        async with self.db.transaction() as conn:
            current = await liveness.users(conn, names)
        for outlet in list(self.registry.outlets.values()):
            if outlet.user.username not in names:
                continue
            user = current.get(outlet.user.username)
            if user is None:
                outlet.close(4401, "user deleted")
                continue
            outlet.user = user
            for sub in self.registry.of_connection(outlet.id):
                if not allows(user, Access.READ, sub.queue_name):
                    await self._end_subscription(sub)
                    outlet.cancel(sub.queue_name, "forbidden")

    async def _cancel_queue(self, queue: str) -> None:
        for queue_id in self.registry.queue_ids():
            for sub in self.registry.of_queue(queue_id):
                if sub.queue_name == queue:
                    async with self.dispatcher.lock(queue_id):
                        self.registry.remove(sub)
                    sub.outlet.cancel(queue, "queue_deleted")
        self.metrics.subscriptions.set(self.registry.subscription_count())
