"""A publish's direct hand-off (Dispatcher.reserve and HandOff, app/broker/dispatcher.py),
without a database: which copies go straight to which subscriber, and what they get."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

from app.broker.consumers import ConsumerRegistry
from app.broker.dispatcher import Dispatcher, HandOff
from app.broker.tasks import TaskOwner
from app.broker.wakeups import WakeHub
from app.domain.model import Delivery
from app.metrics import Metrics
from app.storage.database import Database
from app.storage.messages import HandedOff
from tests.unit.test_round_robin import FakeOutlet, subscribe

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def dispatcher(registry: ConsumerRegistry, *idle_queues: int) -> Dispatcher:
    """A dispatcher whose workers for ``idle_queues`` exist and are not claiming."""
    d = Dispatcher(cast(Database, None), WakeHub(), registry, TaskOwner(), Metrics(), "proc-1")
    for queue_id in idle_queues:
        d.lock(queue_id)
    return d


def build(row: HandedOff, slot: int) -> Delivery:
    return Delivery(
        slot, row.id, 0, f"m{row.id}", "", "k", row.headers, row.properties, b"1", False, 1,
        row.created_at, row.delivery_tag,
    )  # fmt: skip


def handed(copy: int) -> HandedOff:
    return HandedOff(copy, 100 + copy, f"tag-{copy}", NOW, "{}", "{}")


async def test_reserve_takes_idle_queues_with_room_and_holds_them_until_closed() -> None:
    registry = ConsumerRegistry()
    subscribe(registry, "a", prefetch=2, queue_id=1)
    subscribe(registry, "b", prefetch=2, queue_id=2)  # busy: its worker is claiming
    subscribe(registry, "c", prefetch=2, queue_id=3)  # no worker yet
    d = dispatcher(registry, 1, 2, 4)  # 4: a worker, no subscribers any more
    await d.lock(2).acquire()
    handoff = await d.reserve({1: 5, 2: 1, 3: 1, 4: 1})
    assert isinstance(handoff, HandOff)
    assert d.lock(1).locked()  # no claim, unsubscribe or close until the write is done
    assert not d.lock(4).locked()
    owners = handoff.owners([(0, 1), (1, 2), (2, 3), (3, 1), (4, 1)], lambda m: True)
    assert owners == [("a", 30.0), None, None, ("a", 30.0), None]  # a's credit is 2
    handoff.close()
    assert not d.lock(1).locked()
    d.lock(2).release()


async def test_reserve_gives_nothing_when_no_queue_has_room() -> None:
    registry = ConsumerRegistry()
    subscribe(registry, "a", prefetch=1, queue_id=1, in_flight=1)
    d = dispatcher(registry, 1)
    assert await d.reserve({1: 1, 9: 1}) is None
    assert not d.lock(1).locked()


async def test_copies_take_the_slots_in_round_robin_order_and_skip_the_ineligible() -> None:
    registry = ConsumerRegistry()
    a = subscribe(registry, "a", prefetch=1)
    b = subscribe(registry, "b", prefetch=2)
    d = dispatcher(registry, 1)
    handoff = await d.reserve({1: 4})
    assert handoff is not None
    # message 1 is delayed (not eligible): it is stored, not handed off
    owners = handoff.owners([(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)], lambda m: m != 1)
    assert owners == [("a", 30.0), None, ("b", 30.0), ("b", 30.0), None]

    queues = handoff.deliver([handed(0), handed(2), handed(3)], build)
    handoff.close()
    assert queues == {1}
    assert cast(FakeOutlet, a.outlet).delivered == ["tag-0"]
    assert cast(FakeOutlet, b.outlet).delivered == ["tag-2", "tag-3"]
    assert a.unsettled == {"tag-0"}  # in flight: the credit is taken
    assert b.unsettled == {"tag-2", "tag-3"}
    assert d.metrics.registry.get_sample_value("messagex_deliveries_handed_off_total") == 3


async def test_a_copy_that_was_not_stored_in_flight_is_not_handed_out() -> None:
    registry = ConsumerRegistry()
    a = subscribe(registry, "a", prefetch=2)
    d = dispatcher(registry, 1)
    handoff = await d.reserve({1: 2})
    assert handoff is not None
    assert handoff.owners([(0, 1), (1, 1)], lambda m: True) == [("a", 30.0), ("a", 30.0)]
    # the write stored copy 1 as ready (its queue's claim takes it later)
    assert handoff.deliver([handed(0)], build) == {1}
    handoff.close()
    assert cast(FakeOutlet, a.outlet).delivered == ["tag-0"]
    assert registry.round_robin(1, 10) == [a]  # one slot of credit left
