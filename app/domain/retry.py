"""The one retry / dead-letter decision (contract §10, §13).

Used alike by NACK, by the ack-timeout sweep and by release on disconnect or process death;
the expiry sweep and the length limit dead-letter through the same bookkeeping (``with_death``,
``is_cycle``) with reasons ``expired`` and ``maxlen``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from app.domain.arguments import DeathReason

__all__ = ["DeathReason", "Decision", "Dying", "Outcome", "death_headers", "decide", "with_death"]


__all__ = ["DeathReason", "Decision", "Outcome", "decide", "is_cycle", "with_death"]


class Outcome(StrEnum):
    REQUEUED = "requeued"
    DEAD_LETTERED = "dead_lettered"
    DEAD = "dead"
    DISCARDED = "discarded"


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    reason: DeathReason | None = None


def decide(
    *,
    delivery_count: int,
    max_delivery_count: int | None,
    has_dead_letter_target: bool,
    requeue: bool,
    expired: bool = False,
) -> Decision:
    """What happens to an in-flight delivery that was not acknowledged.

    ``requeue`` is true for NACK with requeue, ack timeout and release; false for
    NACK with ``requeue: false``. ``delivery_count`` already counts the current delivery.
    ``expired``: the copy is past its expiry (contract §13), so instead of returning to
    ready it expires — dead-lettered with reason ``expired``, or discarded. The dead-letter
    target is a dead-letter queue or a dead-letter exchange.
    """
    if not requeue:
        if has_dead_letter_target:
            return Decision(Outcome.DEAD_LETTERED, DeathReason.REJECTED)
        return Decision(Outcome.DISCARDED)
    if max_delivery_count is None or delivery_count < max_delivery_count:
        if not expired:
            return Decision(Outcome.REQUEUED)
        if has_dead_letter_target:
            return Decision(Outcome.DEAD_LETTERED, DeathReason.EXPIRED)
        return Decision(Outcome.DISCARDED, DeathReason.EXPIRED)
    if has_dead_letter_target:
        return Decision(Outcome.DEAD_LETTERED, DeathReason.DELIVERY_LIMIT)
    return Decision(Outcome.DEAD)


def is_cycle(headers: dict[str, Any], *, queue: str, reason: DeathReason) -> bool:
    """RabbitMQ's cycle rule (contract §13): a copy whose ``x-death`` (already updated for
    this death) has an entry for ``queue`` with the same reason is not dead-lettered into
    ``queue`` again — unless the reason is ``rejected``, which a consumer asked for."""
    if reason is DeathReason.REJECTED:
        return False
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return False
    return any(
        isinstance(e, dict) and e.get("queue") == queue and e.get("reason") == reason.value
        for e in deaths
    )


def with_death(
    headers: dict[str, Any],
    *,
    queue: str,
    reason: DeathReason,
    time: datetime,
    exchange: str,
    routing_key: str,
) -> dict[str, Any]:
    """``headers`` with the ``x-death`` list updated, as RabbitMQ does.

    One entry per (queue, reason), newest first; the same pair again increments its
    ``count`` and moves to the front.
    """
    previous = headers.get("x-death")
    deaths: list[Any] = list(previous) if isinstance(previous, list) else []
    count = 1
    kept: list[Any] = []
    for entry in deaths:
        if (
            isinstance(entry, dict)
            and entry.get("queue") == queue
            and entry.get("reason") == reason.value
        ):
            prior = entry.get("count")
            count = (prior if isinstance(prior, int) and not isinstance(prior, bool) else 0) + 1
        else:
            kept.append(entry)
    entry_now = {
        "queue": queue,
        "reason": reason.value,
        "count": count,
        "time": time.isoformat().replace("+00:00", "Z"),
        "exchange": exchange,
        "routing_keys": [routing_key],
    }
    return {**headers, "x-death": [entry_now, *kept]}


class Dying(Protocol):
    """A copy about to be dead-lettered, as its locking read returned it."""

    @property
    def headers(self) -> dict[str, Any]: ...
    @property
    def now(self) -> datetime: ...
    @property
    def exchange(self) -> str: ...
    @property
    def routing_key(self) -> str: ...


def death_headers(row: Dying, *, queue: str, reason: DeathReason) -> dict[str, Any]:
    """``row``'s headers with the x-death entry of its dead-lettering from ``queue``."""
    return with_death(
        row.headers,
        queue=queue,
        reason=reason,
        time=row.now,
        exchange=row.exchange,
        routing_key=row.routing_key,
    )
