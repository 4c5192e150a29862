"""Prometheus metrics of one broker app (its own registry: several apps may share a process)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

if TYPE_CHECKING:
    from app.domain.model import QueueStats

# Counters and histograms get no ``_created`` series: they double the exposition and
# Prometheus ignores them (process-wide; prometheus_client >= 0.17).
disable_created_metrics()  # type: ignore[no-untyped-call]


class QueueActivity:
    """This process's published copies, deliveries and acks per queue id since the last
    sample (``broker/history.py`` takes them every few seconds): one dict update per queue
    of a batch on the hot paths, no lock (one event loop)."""

    __slots__ = ("acked", "delivered", "messages", "published")

    def __init__(self) -> None:
        self.published: dict[int, int] = {}
        self.delivered: dict[int, int] = {}
        self.acked: dict[int, int] = {}
        #: messages accepted by publish calls (routed or not): the broker-wide published rate
        self.messages = 0

    @staticmethod
    def add(counts: dict[int, int], queue_id: int, n: int = 1) -> None:
        counts[queue_id] = counts.get(queue_id, 0) + n

    def take(self) -> QueueActivity:
        """The counts so far, leaving this one empty."""
        taken = QueueActivity()
        taken.published, self.published = self.published, {}
        taken.delivered, self.delivered = self.delivered, {}
        taken.acked, self.acked = self.acked, {}
        taken.messages, self.messages = self.messages, 0
        return taken


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        #: per-queue activity for the charts' history (not exported to Prometheus)
        self.activity = QueueActivity()
        r = self.registry
        self.published = Counter(
            "messagex_messages_published", "Messages accepted by publish calls", registry=r
        )
        self.routed_copies = Counter(
            "messagex_message_copies_stored",
            "Message rows stored (one per routed queue)",
            registry=r,
        )
        self.publish_groups = Counter(
            "messagex_publish_group_writes",
            "Group-commit writes: one INSERT for the publish calls that arrived together",
            registry=r,
        )
        self.unroutable = Counter(
            "messagex_messages_unroutable", "Published messages that matched no queue", registry=r
        )
        self.delivered = Counter(
            "messagex_messages_delivered", "Deliveries claimed for consumers", ["via"], registry=r
        )
        self.claims = Counter(
            "messagex_claim_statements",
            "Claim statements run (deliveries per claim = delivered / claims)",
            ["via"],
            registry=r,
        )
        self.handed_off = Counter(
            "messagex_deliveries_handed_off",
            "WebSocket deliveries stored in flight by their publish, with no claim (idle "
            "subscribers with prefetch room and no message waiting); also in delivered",
            registry=r,
        )
        self.dropped = Counter(
            "messagex_message_copies_dropped",
            "Ready copies that left their queue undelivered, by reason (maxlen: drop-head of "
            "a length-limited queue) and outcome (dead_lettered or discarded)",
            ["reason", "outcome"],
            registry=r,
        )
        self.rejected = Counter(
            "messagex_message_copies_rejected",
            "Copies a publish did not store in their queue, by reason (maxlen: x-overflow "
            "reject-publish or reject-publish-dlx) and outcome (dead_lettered or discarded)",
            ["reason", "outcome"],
            registry=r,
        )
        self.duplicates = Counter(
            "messagex_message_copies_duplicate",
            "Copies a publish did not store because their message_id was published into the "
            "queue within its x-deduplication-window-seconds (contract §15)",
            registry=r,
        )
        self.acked = Counter("messagex_messages_acked", "Deliveries acknowledged", registry=r)
        self.ack_statements = Counter(
            "messagex_ack_statements",
            "ACK statements run: each settles the acks that arrived together",
            registry=r,
        )
        self.nacked = Counter(
            "messagex_messages_nacked", "Deliveries rejected, by outcome", ["outcome"], registry=r
        )
        self.released = Counter(
            "messagex_deliveries_released",
            "Deliveries released by timeout or disconnect, by outcome",
            ["reason", "outcome"],
            registry=r,
        )
        self.expired = Counter(
            "messagex_messages_expired",
            "Copies that expired (TTL, contract §13), by outcome: dead_lettered or discarded",
            ["outcome"],
            registry=r,
        )
        self.dead_lettered = Counter(
            "messagex_messages_dead_lettered",
            "Copies dead-lettered, by x-death reason (rejected, expired, maxlen, delivery_limit)",
            ["reason"],
            registry=r,
        )
        self.dead_letter_dropped = Counter(
            "messagex_dead_letters_dropped",
            "Dead-lettered copies dropped, by reason: their dead-letter exchange matched no "
            "queue, or the cycle rule",
            ["reason"],
            registry=r,
        )
        self.connections = Gauge(
            "messagex_websocket_connections", "Open WebSocket connections", registry=r
        )
        self.subscriptions = Gauge(
            "messagex_subscriptions", "Live WebSocket subscriptions", registry=r
        )
        self.http_requests = Counter(
            "messagex_http_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.http_latency = Histogram(
            "messagex_http_request_seconds", "HTTP request latency", ["route"], registry=r
        )
        self.auth_failures = Counter("messagex_auth_failures", "Failed authentications", registry=r)
        self.filter_operations = Counter(
            "messagex_message_copies_by_filter",
            "Copies moved, redriven or deleted by a filter operation (contract §17)",
            ["operation"],
            registry=r,
        )
        self.queues = Gauge(
            "messagex_queues",
            "Queues in the broker (all processes; per-queue series cover at most "
            "MESSAGEX_METRICS_MAX_QUEUES of them, the deepest)",
            registry=r,
        )
        self.queue_messages = Gauge(
            "messagex_queue_messages",
            "Copies in a queue by status (ready, delayed, in_flight, dead), counted in the "
            "database at most every 5 s: the same on every broker process",
            ["queue", "status"],
            registry=r,
        )
        self.queue_consumers = Gauge(
            "messagex_queue_consumers",
            "Live WebSocket subscriptions of a queue on every broker process",
            ["queue"],
            registry=r,
        )

    def set_queue_gauges(self, total: int, deepest: Sequence[tuple[str, QueueStats]]) -> None:
        """Replace the per-queue series by ``deepest`` (queue name, stats)."""
        self.queues.set(total)
        self.queue_messages.clear()
        self.queue_consumers.clear()
        for name, stats in deepest:
            for status, value in asdict(stats).items():
                if status == "consumers":
                    self.queue_consumers.labels(queue=name).set(value)
                else:
                    self.queue_messages.labels(queue=name, status=status).set(value)

    def render(self) -> bytes:
        out: bytes = generate_latest(self.registry)
        return out
