"""app.broker.settlement.decide_all: locked rows sorted into what storage applies (no database:
the decisions are made in Python between the lock and the apply statements)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.broker.settlement import decide_all, plan_dead_letters
from app.domain.retry import DeathReason, Outcome
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
    [(row, reason)] = decisions.dead_letter
    assert (row.id, reason) == (3, DeathReason.DELIVERY_LIMIT)
    moves, copies, drop, done = plan_dead_letters(decisions.dead_letter, {})
    [move] = moves
    assert (move.id, move.queue_id) == (3, 99)
    assert move.headers["h"] == 1
    assert move.headers["x-death"][0]["reason"] == "delivery_limit"
    assert move.headers["x-death"][0]["queue"] == "orders"
    assert (copies, drop) == ([], [])
    assert settled.woken_queues == {10}
    assert done.woken_queues == {99}
    assert settled.owners == {"c1", "c2"}


def test_an_expired_copy_is_not_requeued() -> None:
    rows = [
        _row(1, 1, None, None, expired=True),  # discarded
        _row(2, 1, None, 99, expired=True, dead_letter_queue="dlq"),  # dead-lettered
        _row(3, 1, None, None, expired=False),  # requeued
    ]
    settled, decisions = decide_all(rows, requeue=True)
    assert settled.outcomes == {1: Outcome.DISCARDED, 2: Outcome.DEAD_LETTERED, 3: Outcome.REQUEUED}
    assert settled.expired == {1: Outcome.DISCARDED, 2: Outcome.DEAD_LETTERED}
    assert [(r.id, reason) for r, reason in decisions.dead_letter] == [(2, DeathReason.EXPIRED)]


def test_a_dead_letter_exchange_fans_out_and_the_cycle_rule_drops() -> None:
    row = _row(5, 1, None, None, dead_letter_exchange="dlx", dead_letter_routing_key="k2")
    doomed = [(row, DeathReason.EXPIRED)]
    # routed to q1 and back to orders: orders is where it died for the same reason
    moves, copies, drop, done = plan_dead_letters(doomed, {5: [("q1", 1), ("orders", 10)]})
    assert [(m.id, m.queue_id, m.exchange, m.routing_key) for m in moves] == [(5, 1, "dlx", "k2")]
    assert copies == []
    assert drop == []
    # routed to two queues: moved to the first, copied to the second
    moves, copies, drop, done = plan_dead_letters(doomed, {5: [("q1", 1), ("q2", 2)]})
    assert [m.queue_id for m in moves] == [1]
    assert [c.queue_id for c in copies] == [2]
    assert done.woken_queues == {1, 2}
    # matching nothing, or only the cycle: dropped
    for routed in ({}, {5: [("orders", 10)]}):
        moves, copies, drop, done = plan_dead_letters(doomed, routed)
        assert (moves, copies, drop) == ([], [], [5])
        assert done.dropped[DeathReason.EXPIRED] == 1
    # a rejection is never a cycle
    moves, _, drop, _ = plan_dead_letters([(row, DeathReason.REJECTED)], {5: [("orders", 10)]})
    assert [m.queue_id for m in moves] == [10]
    assert drop == []


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
