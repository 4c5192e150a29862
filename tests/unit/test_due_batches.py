"""``dispatcher.due_batches``: the queues the timer finds due together go in statements of at
most ``MAX_DUE_SLOTS`` owner slots each, so that a thousand queues with prefetch 1000 falling
due at once never make one statement of a million owners."""

from __future__ import annotations

from app.broker.dispatcher import MAX_DUE_SLOTS, due_batches


def test_queues_fill_a_batch_up_to_the_limit_in_order() -> None:
    assert due_batches({1: 3, 2: 3, 3: 4, 4: 1}, limit=6) == [[1, 2], [3, 4]]


def test_a_queue_above_the_limit_goes_alone() -> None:
    assert due_batches({1: 2, 2: 9, 3: 2}, limit=5) == [[1], [2], [3]]


def test_nothing_due_is_no_batch() -> None:
    assert due_batches({}) == []


def test_a_thousand_queues_of_prefetch_1000_stay_within_the_default() -> None:
    slots = dict.fromkeys(range(1000), 1000)
    batches = due_batches(slots)
    assert [q for batch in batches for q in batch] == list(range(1000))
    assert all(sum(slots[q] for q in batch) <= MAX_DUE_SLOTS for batch in batches)
    assert len(batches) == 1000 * 1000 // MAX_DUE_SLOTS
