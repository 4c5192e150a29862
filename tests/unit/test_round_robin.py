"""ConsumerRegistry.round_robin (app/broker/consumers.py): the order in which a claim's rows go
to the subscribers of a queue, without a server."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from app.broker.consumers import ConsumerRegistry, Subscription
from app.domain.model import Delivery, Permissions, Role, User


@dataclass
class FakeOutlet:
    id: str
    user: User = field(default_factory=lambda: User("u", Role.USER, Permissions()))
    delivered: list[str] = field(default_factory=list)
    password_hash: str | None = None
    room: int = 1_000_000

    def deliver(self, subscription: Subscription, items: Sequence[Delivery]) -> None:
        self.delivered.extend(d.delivery_tag for d in items)

    def cancel(self, queue: str, reason: str) -> None:
        pass

    def activated(self, queue: str) -> None:
        pass

    def close(self, code: int, reason: str) -> None:
        pass


def subscribe(
    registry: ConsumerRegistry, name: str, prefetch: int, queue_id: int = 1, in_flight: int = 0
) -> Subscription:
    sub = Subscription(FakeOutlet(name), queue_id, f"q{queue_id}", prefetch, 30.0)
    sub.unsettled.update(f"{name}-{n}" for n in range(in_flight))
    registry.add(sub)
    return sub


def names(order: list[Subscription]) -> str:
    return "".join(s.outlet.id for s in order)


def test_one_per_subscriber_with_credit_per_round() -> None:
    registry = ConsumerRegistry()
    for name in "abc":
        subscribe(registry, name, prefetch=2)
    assert names(registry.round_robin(1, 10)) == "abcabc"
    assert names(registry.round_robin(1, 4)) == "abca"


def test_credit_bounds_each_subscriber() -> None:
    registry = ConsumerRegistry()
    subscribe(registry, "a", prefetch=1)
    subscribe(registry, "b", prefetch=3)
    subscribe(registry, "c", prefetch=2, in_flight=2)  # no credit left
    subscribe(registry, "d", prefetch=5, queue_id=2)  # another queue
    assert names(registry.round_robin(1, 100)) == "abbb"


def test_the_next_round_starts_after_whoever_was_served_first() -> None:
    registry = ConsumerRegistry()
    for name in "abc":
        subscribe(registry, name, prefetch=10)
    assert names(registry.round_robin(1, 2)) == "ab"
    registry.advance(1, 2)
    assert names(registry.round_robin(1, 2)) == "ca"
    registry.advance(1, 2)
    assert names(registry.round_robin(1, 4)) == "bcab"


def test_inactive_and_removed_subscriptions_get_nothing() -> None:
    registry = ConsumerRegistry()
    a = subscribe(registry, "a", prefetch=2)
    b = subscribe(registry, "b", prefetch=2)
    b.active = False  # being cancelled: credit 0
    assert names(registry.round_robin(1, 10)) == "aa"
    registry.remove(a)
    assert registry.round_robin(1, 10) == []
    assert registry.of_queue(1) == [b]


def test_no_subscribers_no_order() -> None:
    registry = ConsumerRegistry()
    assert registry.round_robin(7, 10) == []
    subscribe(registry, "a", prefetch=1, queue_id=7)
    assert registry.round_robin(7, 0) == []


def test_a_connection_without_room_gets_nothing_and_one_with_little_gets_that_much() -> None:
    """Room (deliveries that fit under the connection's buffer limit, contract §8) bounds
    credit as prefetch does."""
    registry = ConsumerRegistry()
    full = subscribe(registry, "a", prefetch=5)
    some = subscribe(registry, "b", prefetch=5)
    cast(FakeOutlet, full.outlet).room = 0
    cast(FakeOutlet, some.outlet).room = 2
    assert (full.credit, some.credit) == (0, 2)
    assert names(registry.round_robin(1, 10)) == "bb"


def test_holding_connections_are_those_with_unsettled_tags() -> None:
    """The periodic credit reconciliation asks about these only: a subscription is found
    when it is added with tags or given some (``holds``), and forgotten once it holds none or
    is removed."""
    registry = ConsumerRegistry()
    subscribe(registry, "a", prefetch=5, in_flight=2)  # resubscribed, holding two
    b = subscribe(registry, "b", prefetch=5)
    c = subscribe(registry, "c", prefetch=5, queue_id=2)
    subscribe(registry, "idle", prefetch=5, queue_id=3)
    for sub in (b, c):
        sub.unsettled.add(f"{sub.outlet.id}-x")
        registry.holds(sub)
    assert sorted(registry.holding_connections()) == ["a", "b", "c"]
    b.unsettled.clear()  # acked
    registry.remove(c)  # unsubscribed, its tag still unsettled
    assert registry.holding_connections() == ["a"]
    b.unsettled.add("b-y")
    registry.holds(b)
    assert sorted(registry.holding_connections()) == ["a", "b"]
