"""The checker itself: each kind of anomaly, made by hand, is reported; a clean run is clean."""

from __future__ import annotations

import itertools

from tests.faults.checker import Delivery, Ledger, QueueSpec, Report, check

Q = [QueueSpec("q", max_delivery_count=3, dead_letter_queue="q.dlq"), QueueSpec("q.dlq")]
_t = itertools.count(1)


def published(ledger: Ledger, mid: str, outcome: str = "ok") -> None:
    ledger.published(ledger.invoked(mid, "q", "a"), outcome, 200 if outcome == "ok" else 503)


def delivered(
    ledger: Ledger, mid: str, count: int = 1, outcome: str = "acked", queue: str = "q"
) -> None:
    d = Delivery("c", "c/1", queue, mid, f"{mid}.{count}", count, count > 1, float(next(_t)))
    ledger.delivered(d)
    ledger.settled(d, outcome)


def judged(ledger: Ledger, rows: list[tuple[str, str, str]] | None = None) -> Report:
    return check(ledger, Q, rows or [])


def test_a_clean_run_is_clean() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    delivered(ledger, "m1", 1, "unsettled")  # released by a disconnect
    delivered(ledger, "m1", 2, "ack_rejected:unknown_delivery_tag")  # timed out
    delivered(ledger, "m1", 3, "nacked:dead_lettered")
    delivered(ledger, "m1", 1, "acked", queue="q.dlq")
    published(ledger, "m2", "unknown")  # never delivered: fine, nobody was promised it
    published(ledger, "m3")
    delivered(ledger, "m3", 1, "nacked:dead")
    report = judged(ledger, [("m3", "q", "dead")])
    assert report.clean, report.summary()
    assert report.stats["published_ok"] == 2


def test_lost_is_a_confirmed_publish_never_delivered() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    published(ledger, "m2", "failed")
    assert judged(ledger).lost == ["m1"]


def test_a_dead_row_left_behind_is_not_lost() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    assert judged(ledger, [("m1", "q", "dead")]).lost == []


def test_rows_left_undrained_make_the_run_unclean() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    delivered(ledger, "m1")
    assert not judged(ledger, [("m1", "q", "ready")]).clean


def test_unexpected_is_a_delivery_nobody_published() -> None:
    ledger = Ledger()
    delivered(ledger, "ghost")
    assert judged(ledger).unexpected == ["ghost"]


def test_redelivery_after_a_confirmed_ack_has_no_cause() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    delivered(ledger, "m1", 1, "acked")
    delivered(ledger, "m1", 2, "unsettled")
    report = judged(ledger)
    assert len(report.duplicated_without_cause) == 1


def test_redelivery_after_a_final_nack_has_no_cause() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    delivered(ledger, "m1", 1, "nacked:discarded")
    delivered(ledger, "m1", 2, "acked")
    assert len(judged(ledger).duplicated_without_cause) == 1


def test_two_deliveries_with_one_count_are_two_owners() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    delivered(ledger, "m1", 1, "unsettled")
    delivered(ledger, "m1", 1, "unsettled")
    assert judged(ledger).two_owners


def test_two_confirmed_acks_are_two_owners() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    delivered(ledger, "m1", 1, "acked")
    delivered(ledger, "m1", 2, "acked")
    assert judged(ledger).two_owners


def test_delivery_count_over_the_limit() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    for n in (1, 2, 3):
        delivered(ledger, "m1", n, "unsettled")
    delivered(ledger, "m1", 4, "acked")
    assert judged(ledger).over_limit == ["m1: delivery_count 4 in q"]


def test_back_in_the_queue_after_the_dlq() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    delivered(ledger, "m1", 1, "nacked:dead_lettered")
    delivered(ledger, "m1", 1, "unsettled", queue="q.dlq")
    delivered(ledger, "m1", 2, "acked")
    assert judged(ledger).queue_and_dlq


def test_rows_in_two_queues_at_once_are_reported() -> None:
    ledger = Ledger()
    published(ledger, "m1")
    delivered(ledger, "m1")
    ledger.saw_twin_rows(["m1"])
    assert judged(ledger).queue_and_dlq == ["m1"]


def test_a_failed_publish_that_was_stored_is_reported() -> None:
    ledger = Ledger()
    published(ledger, "m1", "failed")
    delivered(ledger, "m1")
    report = judged(ledger)
    assert report.failed_but_stored == ["m1"]
    assert not report.clean


def test_an_unknown_publish_may_or_may_not_be_stored() -> None:
    ledger = Ledger()
    published(ledger, "m1", "unknown")
    delivered(ledger, "m1")
    published(ledger, "m2", "unknown")
    assert judged(ledger).clean


def test_a_publish_retried_after_no_answer_may_be_delivered_once_per_attempt() -> None:
    ledger = Ledger()
    record = ledger.invoked("m1", "q", "a")
    ledger.published(record, "unknown", 503, "unavailable")
    ledger.republished(record)  # the same message_id again: 200
    delivered(ledger, "m1", 1, "acked")  # the first publish was stored after all
    delivered(ledger, "m1", 1, "acked")  # and so was the retry
    report = judged(ledger)
    assert report.clean, report.summary()
    assert report.stats["republished"] == 1
    delivered(ledger, "m1", 1, "acked")  # a third copy of two publishes
    assert judged(ledger).two_owners == [
        "m1: 3 first deliveries of 2 publishes",
        "m1: ACKED 3 times of 2 publishes",
    ]


def test_a_retried_publish_is_still_lost_when_never_delivered() -> None:
    ledger = Ledger()
    record = ledger.invoked("m1", "q", "a")
    ledger.published(record, "unknown", 503, "unavailable")
    ledger.republished(record)
    assert judged(ledger).lost == ["m1"]
