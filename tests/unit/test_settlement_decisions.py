"""app.broker.settlement.decide_all: locked rows sorted into what storage applies (no database:
the decisions are made in Python between the lock and the apply statements)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.broker.settlement import decide_all
from app.domain.retry import Outcome
from app.storage.deliveries import Unsettled

NOW = datetime(2026, 3, 1, 9, 0, 0, tzinfo=UTC)


def _row(id: int, count: int, limit: int | None, dlq: int | None, **kw: Any) -> Unsettled:
    fields: dict[str, Any] = {
        "id": id,
        "queue_id": 10,
        "queue_name": "orders",
        "delivery_count": count,
        "max_delivery_count": limit,
        "dead_letter_queue_id": dlq,
        "headers": {"h": 1},
        "exchange": "ex",
        "routing_key": "rk",
        "owner_connection": None,
        "owner_process": None,
        "now": NOW,
    }
    fields.update(kw)
    return Unsettled(**fields)


def test_each_outcome_lands_in_its_list_and_wakes_the_queue_it_makes_ready() -> None:
    rows = [
        _row(1, 1, None, None, owner_connection="c1"),  # requeued
        _row(2, 3, 3, None),  # dead at the limit, no DLQ
        _row(3, 3, 3, 99, owner_connection="c2"),  # dead-lettered at the limit
    ]
    settled, decisions = decide_all(rows, requeue=True)
    assert settled.outcomes == {
        1: Outcome.REQUEUED,
        2: Outcome.DEAD,
        3: Outcome.DEAD_LETTERED,
    }
    assert decisions.requeue == [1]
    assert decisions.dead == [2]
    assert decisions.discard == []
    [(moved, dlq, headers)] = decisions.dead_letter
    assert (moved, dlq) == (3, 99)
    assert headers["h"] == 1
    assert headers["x-death"][0]["reason"] == "delivery_limit"
    assert headers["x-death"][0]["queue"] == "orders"
    assert settled.woken_queues == {10, 99}
    assert settled.owners == {"c1", "c2"}


def test_a_rejection_discards_without_a_dlq_and_wakes_nothing() -> None:
    settled, decisions = decide_all([_row(7, 1, None, None)], requeue=False)
    assert settled.outcomes == {7: Outcome.DISCARDED}
    assert decisions.discard == [7]
    assert decisions.requeue == decisions.dead == []
    assert decisions.dead_letter == []
    assert settled.woken_queues == set()


def test_no_rows_decide_nothing() -> None:
    settled, decisions = decide_all([], requeue=True)
    assert settled.outcomes == {}
    assert (decisions.requeue, decisions.dead, decisions.discard, decisions.dead_letter) == (
        [],
        [],
        [],
        [],
    )
