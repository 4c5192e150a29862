"""The broker's object graph: every use-case service, built once by the lifespan."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from app.auth.service import AuthService, SessionRevoked, UserRevoked
from app.broker.connections import Connections
from app.broker.delivery import DeliveryEngine
from app.broker.diagnosis import Diagnosis
from app.broker.history import HistoryService
from app.broker.inspection import MessageBrowser
from app.broker.message_ops import MessageOps
from app.broker.overview import OverviewService
from app.broker.publisher import Publisher
from app.broker.pull import PullConsumers
from app.broker.subscriptions import Subscriptions
from app.broker.tasks import TaskOwner, every
from app.broker.topology import TopologyService
from app.broker.xmin_watch import XminWatch
from app.config import Settings
from app.metrics import Metrics
from app.storage import sqlapi
from app.storage.database import Database
from app.telemetry import Tracing, load_tracing

log = logging.getLogger("messagex.services")

#: expired sessions are deleted (and their sockets closed) this often
SESSION_SWEEP_SECONDS = 60.0
#: publish_dedup rows older than their queue's window are swept this often (contract §15;
#: the window's bookkeeping must not grow without bound, and a stale row is never mistaken
#: for a duplicate: the claim compares ages itself)
DEDUP_SWEEP_SECONDS = 2.0
#: queues whose x-expires ran out are looked for this often (contract §13: at least once a
#: second); one probe of ix_queues_idle_expires_at when there are none
QUEUE_EXPIRY_SECONDS = 0.5


@dataclass
class Services:
    settings: Settings
    db: Database
    metrics: Metrics
    auth: AuthService
    topology: TopologyService
    publisher: Publisher
    browser: MessageBrowser
    ops: OverviewService
    delivery: DeliveryEngine
    #: WebSocket consumers (the delivery engine's façade for them)
    subscriptions: Subscriptions
    #: HTTP pull consumers
    pull: PullConsumers
    #: query, move and delete copies by filter (contract §17)
    message_ops: MessageOps
    #: "why is this queue stuck?" and the database's side (contract §19)
    diagnosis: Diagnosis
    #: every process's WebSocket connections, for operators (contract §20)
    connections: Connections
    #: the charts' rate and depth history (sampled every MESSAGEX_HISTORY_INTERVAL_SECONDS)
    history: HistoryService | None = None
    #: the services' own periodic work (sweeps), apart from the delivery engine's
    tasks: TaskOwner = field(default_factory=TaskOwner)
    #: OpenTelemetry spans (MESSAGEX_TRACING), or None: the hot paths test only this
    tracing: Tracing | None = None

    async def start(self) -> None:
        """Bootstrap accounts, start the delivery engine and connect the services' events."""
        await self.auth.bootstrap()
        await sqlapi.write_settings(
            self.db,
            max_message_bytes=self.settings.max_message_bytes,
            max_header_bytes=self.settings.max_header_bytes,
        )
        self.publisher.add_published_listener(self.delivery.on_published)
        self.publisher.add_delayed_listener(self.delivery.on_delayed)
        self.publisher.set_reserve(self.subscriptions.reserve)
        self.delivery.settlement.set_router(self.publisher.route_many)
        self.publisher.limits.set_dead_letter(self.delivery.settlement.dead_letter_maxlen)
        self.topology.add_queue_deleted_listener(self.delivery.on_queue_deleted)
        self.browser.add_deleted_listener(self.delivery.on_message_deleted)
        self.auth.add_listener(self._on_auth_event)
        await self.delivery.start()
        self.tasks.spawn(
            every(SESSION_SWEEP_SECONDS, self.auth.sweep_expired_sessions, "session-sweep"),
            name="session-sweep",
        )
        self.tasks.spawn(
            every(SESSION_SWEEP_SECONDS, self.publisher.sweep_receipts, "receipt-sweep"),
            name="receipt-sweep",
        )
        self.tasks.spawn(
            every(DEDUP_SWEEP_SECONDS, self.publisher.dedup.sweep, "dedup-sweep"),
            name="dedup-sweep",
        )
        self.tasks.spawn(
            every(QUEUE_EXPIRY_SECONDS, self.topology.expire_idle_queues, "queue-expiry"),
            name="queue-expiry",
        )
        if self.history is not None:
            self.tasks.spawn(self.history.run(), name="history-sample")
        if self.settings.xmin_warn_seconds > 0:
            watch = XminWatch(self.db, self.settings.xmin_warn_seconds)
            self.tasks.spawn(every(watch.interval, watch.check, "xmin-watch"), name="xmin-watch")

    async def _on_auth_event(self, event: UserRevoked | SessionRevoked) -> None:
        if isinstance(event, UserRevoked):
            await self.delivery.on_user_changed(event.username)
        else:
            await self.delivery.on_session_revoked(event.token_digest)

    async def stop(self) -> None:
        await self.tasks.close()
        await self.delivery.stop()
        await self.publisher.close()
        await self.ops.close()
        if self.history is not None:
            try:
                await self.history.flush()
            except Exception as exc:  # the last seconds of activity are lost, nothing else
                log.warning("history: last activity not written (%s)", type(exc).__name__)


def build_services(settings: Settings, db: Database, database_url: str) -> Services:
    metrics = Metrics()
    delivery = DeliveryEngine(db, settings, metrics, database_url)
    tracing = load_tracing(settings.tracing)
    publisher = Publisher(
        db,
        metrics,
        max_message_bytes=settings.max_message_bytes,
        max_header_bytes=settings.max_header_bytes,
        group_max=settings.publish_group_max,
        routing_cache_bindings=settings.routing_cache_bindings,
    )
    publisher.tracing = tracing
    return Services(
        settings=settings,
        db=db,
        metrics=metrics,
        auth=AuthService(db, settings, metrics),
        topology=TopologyService(db),
        publisher=publisher,
        browser=MessageBrowser(db),
        ops=OverviewService(
            db,
            max_age=settings.overview_max_age_ms / 1000,
            queue_gauges=settings.metrics_max_queues,
        ),
        delivery=delivery,
        subscriptions=delivery.subscriptions,
        pull=delivery.pull,
        tracing=tracing,
        message_ops=MessageOps(db, metrics, delivery.settlement.limits, delivery.on_published),
        diagnosis=Diagnosis(db, settings.ack_timeout_seconds),
        connections=Connections(db, delivery),
        history=HistoryService(db, metrics, settings.history_interval_seconds),
    )
