"""WakeHub: a credit wake-up (an ACK) is dropped only for a queue known to have nothing due."""

from __future__ import annotations

from app.broker.wakeups import WakeHub


def test_credit_wakes_a_queue_until_a_claim_finds_it_drained() -> None:
    hub = WakeHub()
    with hub.register(1) as event:
        hub.credit([1])
        assert event.is_set()  # nothing known: every credit wake-up counts
        event.clear()
        hub.drained(1, hub.wakes(1))
        hub.credit([1])
        assert not event.is_set()
        hub.wake([1])  # a publish: messages may wait again
        assert event.is_set()
        event.clear()
        hub.credit([1])
        assert event.is_set()


def test_a_wake_during_a_claim_keeps_credit_wakes() -> None:
    hub = WakeHub()
    with hub.register(1) as event:
        seen = hub.wakes(1)  # a claim starts
        hub.wake([1])  # a publish commits while it runs
        hub.drained(1, seen)  # the claim came back short, from its older snapshot
        event.clear()
        hub.credit([1])
        assert event.is_set()


def test_unknown_and_full_claims_forget_drained() -> None:
    hub = WakeHub()
    with hub.register(1) as event:
        hub.drained(1, hub.wakes(1))
        hub.drained(1, None)
        hub.credit([1])
        assert event.is_set()


def test_leaving_forgets_the_queue() -> None:
    hub = WakeHub()
    with hub.register(1):
        hub.wake([1])
        hub.drained(1, hub.wakes(1))
    with hub.register(1) as event:
        assert hub.wakes(1) == 0
        hub.credit([1])
        assert event.is_set()
    hub.wake([2])  # nobody waits: nothing is remembered
    assert hub.wakes(2) == 0
