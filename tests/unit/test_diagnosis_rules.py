"""The findings of app/domain/diagnosis.py from given facts: thresholds and severities that
the API tests cannot reach in their time (an hour-old snapshot, a full NOTIFY queue, a pool
in use to the last connection at a heartbeat)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.diagnosis import (
    Bloat,
    Consumer,
    DatabaseFacts,
    Head,
    ProcessFacts,
    QueueFacts,
    XminHolder,
    blocked_by,
    database_findings,
    queue_findings,
    stalled,
)

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def process(**kw: object) -> ProcessFacts:
    base = ProcessFacts("p1", "h", 1, NOW - 60 * S, NOW, 7, True, 1, 10)
    return replace(base, **kw)  # type: ignore[arg-type]


def db(**kw: object) -> DatabaseFacts:
    base = DatabaseFacts(NOW, Bloat(1000, 0, None, None), [], [process()], 0.0)
    return replace(base, **kw)  # type: ignore[arg-type]


def severities(facts: DatabaseFacts, code: str) -> list[str]:
    return [f.severity.value for f in database_findings(facts) if f.code == code]


def test_a_healthy_database_has_no_findings() -> None:
    assert database_findings(db()) == []


@pytest.mark.parametrize(
    ("age", "expected"),
    [(9, []), (10, ["info"]), (299, ["info"]), (300, ["warning"]), (3600, ["critical"])],
)
def test_xmin_held_severity_by_age(age: int, expected: list[str]) -> None:
    holder = XminHolder("transaction", 42, "psql", "idle in transaction", age * S)
    assert severities(db(xmin=[holder]), "xmin_held") == expected


def test_a_replication_slot_holding_xmin_is_named() -> None:
    slot = XminHolder("replication_slot", None, None, "inactive", None, "old_slot", 1234)
    (found,) = [f for f in database_findings(db(xmin=[slot])) if f.code == "xmin_held"]
    assert "'old_slot'" in found.message
    assert "pg_drop_replication_slot" in found.message


def test_process_stale_then_dead_and_listen_down() -> None:
    assert severities(db(processes=[process(heartbeat_at=NOW - 5 * S)]), "process_stale") == []
    stale = db(processes=[process(heartbeat_at=NOW - 6 * S)])
    assert severities(stale, "process_stale") == ["warning"]
    dead = db(processes=[process(heartbeat_at=NOW - 15 * S)])
    assert severities(dead, "process_stale") == ["critical"]
    down = db(processes=[process(listening=False, listen_pid=None)])
    assert severities(down, "listen_down") == ["warning"]


def test_a_process_that_polls_by_choice_is_not_listen_down() -> None:
    """Transaction-pooled without MESSAGEX_LISTEN_DATABASE_URL (docs/operations.md)."""
    polling = db(processes=[process(listening=False, listen_pid=0, polling=True)])
    assert severities(polling, "listen_down") == []


def test_pool_exhausted_and_notify_queue() -> None:
    assert severities(db(processes=[process(pool_in_use=10)]), "pool_exhausted") == ["warning"]
    assert severities(db(notify_queue_usage=0.49), "notify_queue_filling") == []
    assert severities(db(notify_queue_usage=0.5), "notify_queue_filling") == ["warning"]
    assert severities(db(notify_queue_usage=0.95), "notify_queue_filling") == ["critical"]


def test_bloat_by_dead_share() -> None:
    assert severities(db(bloat=Bloat(100_000, 9_999, None, None)), "bloat") == []
    assert severities(db(bloat=Bloat(100_000, 20_000, None, None)), "bloat") == []
    assert severities(db(bloat=Bloat(100_000, 30_000, None, None)), "bloat") == ["info"]
    assert severities(db(bloat=Bloat(10_000, 30_000, None, None)), "bloat") == ["warning"]


def consumer(**kw: object) -> Consumer:
    base = Consumer("c1", "u", "p1", 2, 0, True, NOW - 60 * S, None, None)
    return replace(base, **kw)  # type: ignore[arg-type]


def queue(**kw: object) -> QueueFacts:
    head = Head(1, "m", NOW - S, NOW - S, 0, None, None)
    base = QueueFacts(
        "q",
        NOW,
        NOW - 60 * S,
        None,
        30 * S,
        False,
        False,
        head,
        False,
        None,
        [],
        [],
        None,
        None,
        0,
        0,
        None,
        0,
        0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_stalled_counts_from_the_later_of_last_ack_and_oldest_delivery() -> None:
    full = consumer(unacked=2, oldest_held_at=NOW - 20 * S)
    assert stalled(full, NOW, 30 * S)
    assert not stalled(replace(full, last_ack_at=NOW - 10 * S), NOW, 30 * S)
    assert not stalled(replace(full, oldest_held_at=NOW - 10 * S), NOW, 30 * S)
    assert not stalled(replace(full, unacked=1), NOW, 30 * S)


def test_blocked_by_single_active_hand_over_and_credit() -> None:
    waiting = queue(single_active=True, consumers=[consumer(active=False)])
    assert blocked_by(waiting) == ("single_active_consumer", None)
    full = queue(consumers=[consumer(unacked=2)])
    assert blocked_by(full) == ("no_subscriber_with_credit", None)
    assert blocked_by(queue(consumers=[consumer()])) == (None, None)


def test_findings_most_severe_first_and_no_consumers_since_last_unsubscribe() -> None:
    assert [f.code for f in queue_findings(queue())] == ["no_consumers"]
    recent = queue(unsubscribed_at=NOW - 29 * S)
    assert queue_findings(recent) == []
