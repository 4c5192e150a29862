"""The ledger of a fault run and the checker that judges it.

Publishers record every publish as ``invoked`` and then ``ok`` (200, a publisher confirm),
``failed`` (an answer that is not 200, or a connection that was never made: nothing was
sent) or ``unknown`` (the request went out and no answer came back). Consumers record every
delivery (queue, message id, tag, delivery count, redelivered) and how it ended: ``acked``
(an ``ACKED`` reply), ``nacked:<outcome>``, ``ack_rejected:<code>`` / ``nack_rejected:<code>``
(an ``ERROR`` reply), ``ack_unconfirmed`` (the ACK went out, the socket died before the reply)
or ``unsettled`` (nothing was sent, or the socket closed first). A sampler records any moment
at which one message id had rows in two queues.

The checker then reports, after fresh consumers drained every queue:

- **lost**: a confirmed publish that was neither delivered nor left dead-lettered;
- **unexpected**: a delivery of a message id no publisher ever invoked;
- **duplicated without a cause**: a redelivery whose earlier delivery was confirmed ACKED,
  or was NACKed to a final outcome (no timeout, disconnect or requeueing NACK explains it);
- **two owners at once**: two deliveries with the same delivery count, or two confirmed ACKs
  of the same message;
- **over the limit**: a delivery whose count exceeds its queue's ``max_delivery_count``;
- **queue and DLQ at once**: a message with rows in two queues at one time (sampled), or
  delivered from its queue after it was delivered from the dead-letter queue.

Everything is plain data: the checker is tested on hand-made ledgers (test_checker.py).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

# -- records --------------------------------------------------------------------------------


@dataclass
class Publish:
    message_id: str
    queue: str
    target: str  # the broker it was sent to
    invoked_at: float
    outcome: str = "invoked"  # invoked | ok | failed | unknown
    status: int | None = None
    code: str | None = None
    seconds: float | None = None
    #: times it was published (a publisher that got no answer publishes again with the same
    #: message_id): up to this many copies may have been stored, each delivered on its own
    attempts: int = 1


@dataclass
class Delivery:
    consumer: str
    connection: str
    queue: str
    message_id: str
    tag: str
    delivery_count: int
    redelivered: bool
    at: float
    outcome: str = "unsettled"
    settled_at: float | None = None


@dataclass
class QueueSpec:
    name: str
    max_delivery_count: int | None = None
    dead_letter_queue: str | None = None


class Ledger:
    """Thread-safe record of one run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.publishes: dict[str, Publish] = {}
        self.deliveries: list[Delivery] = []
        self.twin_rows: set[str] = set()  # message ids seen with rows in two queues at once
        self.notes: list[str] = []

    # publishers
    def invoked(self, message_id: str, queue: str, target: str) -> Publish:
        record = Publish(message_id, queue, target, time.monotonic())
        with self.lock:
            assert message_id not in self.publishes, f"publish id reused: {message_id}"
            self.publishes[message_id] = record
        return record

    def published(
        self,
        record: Publish,
        outcome: str,
        status: int | None = None,
        code: str | None = None,
    ) -> None:
        with self.lock:
            record.outcome = outcome
            record.status = status
            record.code = code
            record.seconds = time.monotonic() - record.invoked_at

    def republished(self, record: Publish) -> None:
        """``record`` was published again with the same message_id and confirmed (200): it is
        now confirmed; ``status`` and ``code`` keep the first attempt's answer."""
        with self.lock:
            record.attempts += 1
            record.outcome = "ok"

    # consumers
    def delivered(self, delivery: Delivery) -> None:
        with self.lock:
            self.deliveries.append(delivery)

    def settled(self, delivery: Delivery, outcome: str) -> None:
        with self.lock:
            delivery.outcome = outcome
            delivery.settled_at = time.monotonic()

    def saw_twin_rows(self, message_ids: list[str]) -> None:
        with self.lock:
            self.twin_rows.update(message_ids)

    # views
    def confirmed(self) -> list[Publish]:
        with self.lock:
            return [p for p in self.publishes.values() if p.outcome == "ok"]

    def count(self, outcome: str) -> int:
        with self.lock:
            return sum(1 for p in self.publishes.values() if p.outcome == outcome)

    def deliveries_of(self, message_id: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.message_id == message_id]


# -- the checker ----------------------------------------------------------------------------


@dataclass
class Report:
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated_without_cause: list[str] = field(default_factory=list)
    two_owners: list[str] = field(default_factory=list)
    over_limit: list[str] = field(default_factory=list)
    queue_and_dlq: list[str] = field(default_factory=list)
    #: a publish answered with an error (which says "nothing was stored") that was stored
    #: all the same; an in-doubt commit the broker could not settle is "unknown", not this
    failed_but_stored: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    VIOLATIONS = (
        "lost",
        "unexpected",
        "duplicated_without_cause",
        "two_owners",
        "over_limit",
        "queue_and_dlq",
        "failed_but_stored",
    )

    @property
    def clean(self) -> bool:
        return not any(getattr(self, name) for name in self.VIOLATIONS)

    def summary(self) -> str:
        parts = [f"{name}={len(getattr(self, name))}" for name in self.VIOLATIONS]
        parts += [f"{k}={v}" for k, v in self.stats.items()]
        details = [
            f"  {name}: {getattr(self, name)[:10]}"
            for name in self.VIOLATIONS
            if getattr(self, name)
        ]
        return " ".join(parts) + ("\n" + "\n".join(details) if details else "")


#: outcomes after which the same message may be delivered again from the same queue
_REDELIVERY_CAUSES = ("unsettled", "ack_unconfirmed", "ack_rejected", "nack_rejected")


def _explains_redelivery(previous: Delivery, same_queue: bool) -> bool:
    outcome = previous.outcome
    if outcome.startswith(_REDELIVERY_CAUSES):
        return True  # a timeout, a disconnect or a failed settle: at-least-once
    if outcome == "nacked:requeued":
        return same_queue
    if outcome == "nacked:dead_lettered":
        return not same_queue
    return False  # acked, or NACKed to dead/discarded: nothing may follow


def check(
    ledger: Ledger,
    queues: list[QueueSpec],
    final_rows: list[tuple[str, str, str]],
) -> Report:
    """Judge a run. ``final_rows``: (message_id, queue, status) left in the database after
    the drain (only ``dead`` rows should be there)."""
    report = Report()
    specs = {q.name: q for q in queues}
    dlq_of = {q.name: q.dead_letter_queue for q in queues if q.dead_letter_queue}
    with ledger.lock:
        publishes = dict(ledger.publishes)
        deliveries = list(ledger.deliveries)
        twins = set(ledger.twin_rows)

    by_message: defaultdict[str, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_message[d.message_id].append(d)
    dead_rows = {m for m, _q, status in final_rows if status == "dead"}
    leftover = [(m, q, s) for m, q, s in final_rows if s != "dead"]

    for mid, pub in publishes.items():
        if pub.outcome == "ok" and mid not in by_message and mid not in dead_rows:
            report.lost.append(mid)
        if pub.outcome == "failed" and (mid in by_message or mid in dead_rows):
            report.failed_but_stored.append(mid)

    for mid, items in by_message.items():
        if mid not in publishes:
            report.unexpected.append(mid)
            continue
        if publishes[mid].attempts > 1:
            _check_republished(report, mid, items, publishes[mid].attempts)
        else:
            _check_message(report, mid, items, specs, dlq_of)
    report.queue_and_dlq.extend(sorted(twins - set(report.queue_and_dlq)))

    report.stats = {
        "published_ok": sum(1 for p in publishes.values() if p.outcome == "ok"),
        "published_failed": sum(1 for p in publishes.values() if p.outcome == "failed"),
        "published_unknown": sum(1 for p in publishes.values() if p.outcome == "unknown"),
        "deliveries": len(deliveries),
        "redeliveries": sum(1 for d in deliveries if d.redelivered),
        "left_dead": len(dead_rows),
        "republished": sum(1 for p in publishes.values() if p.attempts > 1),
        "left_undrained": len(leftover),
    }
    if leftover:
        # The drain did not finish: everything left is suspect. Not lost (it is stored), but
        # the run cannot be judged clean.
        report.lost.extend(f"{m} (still {s} in {q})" for m, q, s in leftover[:20])
    return report


def _check_message(
    report: Report,
    mid: str,
    items: list[Delivery],
    specs: dict[str, QueueSpec],
    dlq_of: dict[str, str],
) -> None:
    items = sorted(items, key=lambda d: d.at)
    acked = [d for d in items if d.outcome == "acked"]
    if len(acked) > 1:
        report.two_owners.append(f"{mid}: ACKED {len(acked)} times")
    seen_counts: set[tuple[str, int]] = set()
    for d in items:
        key = (d.queue, d.delivery_count)
        if key in seen_counts:
            report.two_owners.append(f"{mid}: delivery_count {d.delivery_count} twice")
        seen_counts.add(key)
        spec = specs.get(d.queue)
        if spec and spec.max_delivery_count and d.delivery_count > spec.max_delivery_count:
            report.over_limit.append(f"{mid}: delivery_count {d.delivery_count} in {d.queue}")
    for previous, current in itertools.pairwise(items):
        same_queue = previous.queue == current.queue
        if not same_queue and dlq_of.get(current.queue) == previous.queue:
            # delivered from the DLQ first, then from its own queue again
            report.queue_and_dlq.append(f"{mid}: back in {current.queue} after its DLQ")
            continue
        if not _explains_redelivery(previous, same_queue):
            report.duplicated_without_cause.append(
                f"{mid}: delivered again from {current.queue} after {previous.outcome} "
                f"(count {previous.delivery_count} → {current.delivery_count})"
            )


def _check_republished(report: Report, mid: str, items: list[Delivery], attempts: int) -> None:
    """A message published ``attempts`` times (the same message_id again after no answer):
    each publish may have stored its own copy, delivered on its own, so only the bounds are
    checked: no more first deliveries and no more confirmed ACKs than copies."""
    first = sum(1 for d in items if d.delivery_count == 1)
    if first > attempts:
        report.two_owners.append(f"{mid}: {first} first deliveries of {attempts} publishes")
    acked = sum(1 for d in items if d.outcome == "acked")
    if acked > attempts:
        report.two_owners.append(f"{mid}: ACKED {acked} times of {attempts} publishes")
