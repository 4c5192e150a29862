"""The delivery side of one broker process, wired from parts with one job each:

- ``Subscriptions`` (broker/subscriptions.py): WebSocket consumers, their subscriptions and
  credit — the façade the WebSocket layer talks to; dispatch is ``Dispatcher``
  (broker/dispatcher.py), credit ``Credit`` (broker/credit.py);
- ``PullConsumers`` (broker/pull.py): HTTP get, long poll and the pulled deliveries' settlement;
- ``Settlement`` (broker/settlement.py): every path that ends a delivery, and the retry loop;
- ``Presence`` (broker/presence.py): the heartbeat, and the reaping of dead processes (1 s);
- ``SingleActive`` (broker/single_active.py): which subscriptions of single-active-consumer
  queues wait, and when one becomes active;
- ``ClusterBus`` (broker/cluster.py): the typed events processes tell each other by NOTIFY;
- ``CredentialChecks`` (broker/credentials.py): live sockets' sessions and users re-checked.

The engine starts and stops them, and routes what happens — here and, through cluster events,
on the other processes — to the parts that act on it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from app.broker.cluster import ClusterBus, ClusterEvent
from app.broker.consumers import ConsumerRegistry
from app.broker.credentials import LIVENESS_SECONDS, CredentialChecks
from app.broker.credit import RECONCILE_SECONDS, Credit
from app.broker.dispatcher import Dispatcher
from app.broker.presence import (
    CLOSED_BY_ADMIN,
    HEARTBEAT_SECONDS,
    TAKEOVER_CHECK_SECONDS,
    Presence,
)
from app.broker.pull import PullConsumers
from app.broker.settlement import Settled, Settlement
from app.broker.single_active import CHECK_SECONDS, SingleActive
from app.broker.subscriptions import Subscriptions
from app.broker.tasks import TaskOwner, every
from app.broker.wakeups import WakeHub
from app.config import Settings
from app.errors import BrokerError
from app.metrics import Metrics
from app.storage import deliveries
from app.storage.database import Database
from app.storage.listener import POLLING_PID
from app.storage.messages import DeletedMessage

log = logging.getLogger("messagex.delivery")

#: how often each process sweeps expired copies (contract §13: they leave within 1 s); every
#: process sweeps, SKIP LOCKED shares the rows out, and an idle sweep is one index probe
EXPIRY_SWEEP_SECONDS = 0.25


class DeliveryEngine:
    def __init__(
        self, db: Database, settings: Settings, metrics: Metrics, database_url: str
    ) -> None:
        self.settings = settings
        self.process_id = str(uuid.uuid4())
        #: set by ``drain`` when the server starts shutting down (``/readyz`` 503)
        self.shutting_down = False
        self.tasks = TaskOwner()
        self.hub = WakeHub()
        self.registry = ConsumerRegistry()
        self.dispatcher = Dispatcher(
            db,
            self.hub,
            self.registry,
            self.tasks,
            metrics,
            self.process_id,
            # all but two of the hot path's pool: those two are for publishes, ACKs and
            # look-ups, which then wait for one claim at most, never for a queue of them
            claim_slots=max(1, settings.db_pool_size - 2),
        )
        self.settlement = Settlement(db, self.tasks, metrics, self._after_settle)
        self.credit = Credit(db, self.registry, self.hub, self.settlement)
        #: connections whose slots to reconcile, and whether a reconcile round runs
        self._to_reconcile: set[str] = set()
        self._reconciling = False
        self.single = SingleActive(
            db, self.hub, self.registry, self.dispatcher, self.tasks, self._tell_queues
        )
        self.credit.settled_unsubscribed = self.single.settled_elsewhere
        self.subscriptions = Subscriptions(
            db,
            settings,
            metrics,
            self.hub,
            self.registry,
            self.dispatcher,
            self.credit,
            self.settlement,
            self.single,
            self.process_id,
        )
        self.pull = PullConsumers(
            db,
            settings,
            metrics,
            self.hub,
            self.settlement,
            self.process_id,
            poll_interval=self.dispatcher.poll_interval,
        )
        self.presence = Presence(
            db,
            self.registry,
            self.settlement,
            self.process_id,
            listen_pid=self._listen_pid,
        )
        self.credentials = CredentialChecks(db, self.registry, self.subscriptions.end)
        # Wake-ups may have been lost while the listening connection was down: everyone
        # polls once when it is back.
        self.cluster = ClusterBus(
            database_url,
            self.process_id,
            self._on_event,
            self._listening,
            listen_url=settings.listen_database_url,
            pool_mode=settings.database_pool_mode,
        )
        self.db = db

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self.presence.register()
        self.cluster.start(self.tasks)
        self.dispatcher.start()
        spawn = self.tasks.spawn
        spawn(every(HEARTBEAT_SECONDS, self.presence.beat, "heartbeat"), name="heartbeat")
        spawn(every(TAKEOVER_CHECK_SECONDS, self.presence.reap, "takeover"), name="takeover")
        interval = self.settings.ack_timeout_check_interval_ms / 1000
        spawn(every(interval, self.settlement.sweep_expired, "ack-timeout"), name="ack-timeout")
        spawn(
            every(EXPIRY_SWEEP_SECONDS, self.settlement.sweep_expired_copies, "expiry"),
            name="expiry",
        )
        spawn(
            every(EXPIRY_SWEEP_SECONDS, self.settlement.dead_letter_parked, "sql-parked"),
            name="sql-parked",
        )
        spawn(every(RECONCILE_SECONDS, self.credit.reconcile_all, "reconcile"), name="reconcile")
        spawn(every(LIVENESS_SECONDS, self.credentials.check, "liveness"), name="liveness")
        spawn(every(CHECK_SECONDS, self.single.check_all, "single-active"), name="single-active")
        if self.cluster.polling:
            log.warning("%s", self.polling_detail())
            poll = self.dispatcher.poll_interval
            spawn(every(poll, self._cancel_deleted, "deleted-queues"), name="deleted-queues")

    # -- polling instead of LISTEN (broker/cluster.py) ---------------------------------------

    def polling_detail(self) -> str | None:
        """Why this process polls instead of LISTENing (the log line at start and the detail
        of ``/readyz``), or None when it listens."""
        if not self.cluster.polling:
            return None
        return (
            "polling: DATABASE_URL is transaction-pooled (MESSAGEX_DATABASE_POOL_MODE="
            "transaction) and MESSAGEX_LISTEN_DATABASE_URL is not set, so this process does "
            "not LISTEN; publishes on other processes reach its consumers within "
            f"{self.dispatcher.poll_interval:g} s (its poll), not at once"
        )

    def _listen_pid(self) -> int | None:
        """What the heartbeat reports: the LISTEN backend's pid, None while that is down,
        ``POLLING_PID`` when the process polls by choice (diagnosis, §19)."""
        return POLLING_PID if self.cluster.polling else self.cluster.listener.backend_pid

    async def _cancel_deleted(self) -> None:
        """The subscriptions of queues deleted elsewhere end (a listening process is told by
        NOTIFY; a polling one looks, each poll interval)."""
        queue_ids = self.registry.queue_ids()
        if not queue_ids:
            return
        gone = set(queue_ids) - await deliveries.existing_queues(self.db.hot, queue_ids)
        names = {s.queue_name for q in gone for s in self.registry.of_queue(q)}
        for name in sorted(names):
            await self.subscriptions.cancel_queue(name)

    async def drain(self) -> None:
        """Close local WebSockets with 1001 and wait until their handlers have released what
        they held (each connection's own disconnect does it). From now on the process is
        shutting down: ``/readyz`` answers 503 and new WebSockets are refused, so that a load
        balancer sends them, and clients reconnecting, to the other brokers."""
        self.shutting_down = True
        await self.subscriptions.drain()

    async def stop(self) -> None:
        """Close local sockets (1001), release what they hold, leave the process table."""
        owners = await self.subscriptions.close_all()
        try:
            if owners:
                await self.settlement.release_connections(owners)
            await self.presence.leave()
        except Exception as exc:
            log.warning("could not release on shutdown (%s); ack timeouts will", type(exc).__name__)
        await self.tasks.close()
        await self.cluster.close()

    def _listening(self) -> None:
        """The LISTEN connection is (back) up: poll once, and tell the others its pid now
        rather than at the next heartbeat (diagnosis, §19: listen_down)."""
        self.hub.wake_all()
        self.tasks.spawn(self.presence.report_listening(), name="report-listening")

    # -- events from this process ----------------------------------------------------------

    def _tell_queues(self, queue_ids: set[int]) -> None:
        self.cluster.tell_queues(queue_ids)

    def on_published(self, queue_ids: set[int]) -> None:
        """Publisher hook, after commit: wake local dispatchers now, tell the others soon."""
        self.hub.wake(queue_ids)
        self.cluster.tell_queues(queue_ids)

    def on_delayed(self, delays: dict[int, float]) -> None:
        """Publisher hook, after commit: queues that got only delayed copies. Local claim tasks
        are not woken to find nothing due; the dispatcher's timer wakes them when the first
        falls due. Pulls waiting on them wake (to wait for that due time), and the other
        processes are told as for any publish."""
        self.hub.wake_waiters(delays)
        self.dispatcher.wake_later(delays)
        self.cluster.tell_queues(set(delays))

    def _after_settle(self, settled: Settled) -> None:
        if settled.woken_queues:
            self.on_published(settled.woken_queues)
        local = [o for o in settled.owners if o in self.registry.outlets]
        remote = settled.owners.difference(local)
        if local:
            self._reconcile_soon(local)
        if remote:
            self.cluster.tell_released(remote)

    def _reconcile_soon(self, owners: Iterable[str]) -> None:
        """Reconcile ``owners``' slots, one round at a time per process: owners named while a
        round runs wait for the next, together. (One transaction per settlement elsewhere —
        a stream of ``messagex.ack`` calls from SQL, each its own NOTIFY — took the pool.)"""
        self._to_reconcile.update(owners)
        if not self._reconciling:
            self._reconciling = True
            self.tasks.spawn(self._reconcile_rounds(), name="reconcile-soon")

    async def _reconcile_rounds(self) -> None:
        try:
            while self._to_reconcile:
                owners = sorted(self._to_reconcile)
                self._to_reconcile.clear()
                try:
                    await self.credit.reconcile(owners)
                except BrokerError as exc:  # the periodic round (1 s) tries again
                    log.warning("reconcile of %d connections failed: %s", len(owners), exc)
        finally:
            self._reconciling = False

    def on_message_deleted(self, deleted: DeletedMessage) -> None:
        """An admin deleted a message; if it was in flight, its consumer gets the slot back.
        The queue is woken too: in a group queue the deleted copy may have been its group's
        head (contract §16), and elsewhere a wake-up finds nothing new, at the cost of one
        claim."""
        owners = {deleted.owner_connection} if deleted.owner_connection else set()
        self._after_settle(Settled(owners=owners, woken_queues={deleted.queue_id}))

    async def on_queue_deleted(self, queue: str) -> None:
        await self.subscriptions.cancel_queue(queue)
        self.cluster.tell_queue_deleted(queue)

    async def on_user_changed(self, username: str) -> None:
        await self.credentials.recheck_users([username])
        self.cluster.tell_user_changed(username)

    async def on_session_revoked(self, digest: bytes) -> None:
        self.credentials.close_sessions({digest})
        self.cluster.tell_session_revoked(digest)

    def close_connection(self, connection_id: str) -> None:
        """Close a WebSocket connection of any process (contract §20): here at once, else the
        process holding it closes it when the event reaches it. Its disconnect releases
        what it held, as any close does."""
        if not self._close_local(connection_id):
            self.cluster.tell_close_connection(connection_id)

    def _close_local(self, connection_id: str) -> bool:
        outlet = self.registry.outlets.get(connection_id)
        if outlet is None:
            return False
        outlet.close(1008, CLOSED_BY_ADMIN)
        return True

    # -- events from other processes -------------------------------------------------------

    def _on_event(self, event: ClusterEvent) -> None:
        spawn = self.tasks.spawn
        if event.everything:
            self.hub.wake_all()
            spawn(self.credit.reconcile_all(), name="reconcile-remote")
            return
        self.hub.wake(event.queues)
        owners = [o for o in event.released_owners if o in self.registry.outlets]
        if owners:
            self._reconcile_soon(owners)
        for queue in event.deleted_queues:
            spawn(self.subscriptions.cancel_queue(queue), name="cancel-remote")
        if event.users:
            spawn(self.credentials.recheck_users(sorted(event.users)), name="users-remote")
        if event.sessions:
            self.credentials.close_sessions(event.sessions)
        for connection_id in event.closed_connections:
            self._close_local(connection_id)
