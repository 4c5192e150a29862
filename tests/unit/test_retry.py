"""app.domain.retry: the one retry / dead-letter decision and the x-death bookkeeping."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.domain.retry import DeathReason, Decision, Outcome, decide, is_cycle, with_death

T1 = datetime(2026, 1, 31, 12, 0, 0, tzinfo=UTC)
T2 = datetime(2026, 2, 1, 8, 30, 15, 250000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("count", "limit", "dlq", "requeue", "expected"),
    [
        # unlimited: always back to ready, whatever the count
        (1, None, False, True, Decision(Outcome.REQUEUED)),
        (10_000, None, True, True, Decision(Outcome.REQUEUED)),
        # below the limit
        (1, 3, False, True, Decision(Outcome.REQUEUED)),
        (2, 3, True, True, Decision(Outcome.REQUEUED)),
        # at (or past) the limit, with and without a dead-letter queue
        (3, 3, True, True, Decision(Outcome.DEAD_LETTERED, DeathReason.DELIVERY_LIMIT)),
        (3, 3, False, True, Decision(Outcome.DEAD)),
        (1, 1, False, True, Decision(Outcome.DEAD)),
        (5, 3, True, True, Decision(Outcome.DEAD_LETTERED, DeathReason.DELIVERY_LIMIT)),
        # requeue false: rejected to the DLQ, or discarded; the count does not matter
        (1, None, True, False, Decision(Outcome.DEAD_LETTERED, DeathReason.REJECTED)),
        (1, None, False, False, Decision(Outcome.DISCARDED)),
        (3, 3, False, False, Decision(Outcome.DISCARDED)),
        (3, 3, True, False, Decision(Outcome.DEAD_LETTERED, DeathReason.REJECTED)),
    ],
)
def test_decide(
    count: int, limit: int | None, dlq: bool, requeue: bool, expected: Decision
) -> None:
    got = decide(
        delivery_count=count,
        max_delivery_count=limit,
        has_dead_letter_target=dlq,
        requeue=requeue,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("count", "limit", "target", "requeue", "expected"),
    [
        # past its expiry, a copy that would be requeued expires instead
        (1, None, True, True, Decision(Outcome.DEAD_LETTERED, DeathReason.EXPIRED)),
        (1, None, False, True, Decision(Outcome.DISCARDED, DeathReason.EXPIRED)),
        (2, 3, True, True, Decision(Outcome.DEAD_LETTERED, DeathReason.EXPIRED)),
        # the delivery limit and a rejection decide as before
        (3, 3, True, True, Decision(Outcome.DEAD_LETTERED, DeathReason.DELIVERY_LIMIT)),
        (3, 3, False, True, Decision(Outcome.DEAD)),
        (1, None, True, False, Decision(Outcome.DEAD_LETTERED, DeathReason.REJECTED)),
        (1, None, False, False, Decision(Outcome.DISCARDED)),
    ],
)
def test_decide_expired(
    count: int, limit: int | None, target: bool, requeue: bool, expected: Decision
) -> None:
    got = decide(
        delivery_count=count,
        max_delivery_count=limit,
        has_dead_letter_target=target,
        requeue=requeue,
        expired=True,
    )
    assert got == expected


def test_cycle_rule() -> None:
    h = death({}, queue="a", reason=DeathReason.EXPIRED)
    assert is_cycle(h, queue="a", reason=DeathReason.EXPIRED)
    assert not is_cycle(h, queue="b", reason=DeathReason.EXPIRED)
    assert not is_cycle(h, queue="a", reason=DeathReason.MAXLEN)
    r = death({}, queue="a", reason=DeathReason.REJECTED)
    assert not is_cycle(r, queue="a", reason=DeathReason.REJECTED)
    assert not is_cycle({"x-death": "junk"}, queue="a", reason=DeathReason.EXPIRED)


def test_outcome_values_are_the_wire_names() -> None:
    assert {o.value for o in Outcome} == {"requeued", "dead_lettered", "dead", "discarded"}
    assert {r.value for r in DeathReason} == {"delivery_limit", "rejected", "expired", "maxlen"}


def death(
    headers: dict[str, Any],
    queue: str = "q",
    reason: DeathReason = DeathReason.DELIVERY_LIMIT,
    time: datetime = T1,
    exchange: str = "x",
    routing_key: str = "rk",
) -> dict[str, Any]:
    return with_death(
        headers, queue=queue, reason=reason, time=time, exchange=exchange, routing_key=routing_key
    )


def test_first_death_adds_one_entry_and_keeps_other_headers() -> None:
    before = {"a": 1, "nested": {"b": [1, 2]}}
    after = death(before)
    assert after["a"] == 1
    assert after["nested"] == {"b": [1, 2]}
    assert after["x-death"] == [
        {
            "queue": "q",
            "reason": "delivery_limit",
            "count": 1,
            "time": "2026-01-31T12:00:00Z",
            "exchange": "x",
            "routing_keys": ["rk"],
        }
    ]
    assert "x-death" not in before  # the input is not mutated


def test_same_queue_and_reason_increments_and_moves_to_front() -> None:
    h = death({}, queue="q1", reason=DeathReason.DELIVERY_LIMIT)
    h = death(h, queue="q2", reason=DeathReason.REJECTED)
    assert [(e["queue"], e["reason"]) for e in h["x-death"]] == [
        ("q2", "rejected"),
        ("q1", "delivery_limit"),
    ]
    h = death(
        h, queue="q1", reason=DeathReason.DELIVERY_LIMIT, time=T2, exchange="", routing_key="k2"
    )
    deaths = h["x-death"]
    assert len(deaths) == 2
    assert deaths[0]["queue"] == "q1"
    assert deaths[0]["reason"] == "delivery_limit"
    assert deaths[0]["count"] == 2
    assert deaths[0]["time"] == "2026-02-01T08:30:15.250000Z"
    assert deaths[0]["exchange"] == ""
    assert deaths[0]["routing_keys"] == ["k2"]
    # the other entry is kept as it was
    assert deaths[1]["queue"] == "q2"
    assert deaths[1]["reason"] == "rejected"
    assert deaths[1]["count"] == 1


def test_same_queue_other_reason_is_a_separate_entry() -> None:
    h = death({}, queue="q", reason=DeathReason.DELIVERY_LIMIT)
    h = death(h, queue="q", reason=DeathReason.REJECTED)
    assert [(e["reason"], e["count"]) for e in h["x-death"]] == [
        ("rejected", 1),
        ("delivery_limit", 1),
    ]


def test_foreign_entries_are_kept_untouched() -> None:
    foreign = [{"queue": "elsewhere", "reason": "expired", "count": 7, "custom": True}, "junk"]
    h = death({"x-death": foreign})
    assert h["x-death"][0]["queue"] == "q"
    assert h["x-death"][0]["count"] == 1
    assert h["x-death"][1:] == foreign


def test_non_list_x_death_is_replaced() -> None:
    for bad in ("a string", 42, {"queue": "q"}, None):
        h = death({"x-death": bad, "keep": "me"})
        assert h["keep"] == "me"
        assert len(h["x-death"]) == 1
        assert h["x-death"][0]["count"] == 1


def test_a_non_integer_count_restarts_from_one() -> None:
    h = death({"x-death": [{"queue": "q", "reason": "delivery_limit", "count": "many"}]})
    assert h["x-death"][0]["count"] == 1
    h = death({"x-death": [{"queue": "q", "reason": "delivery_limit", "count": True}]})
    assert h["x-death"][0]["count"] == 1
