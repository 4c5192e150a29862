"""The harness's grouped acks: a consumer's last, partial group is sent by ``drain`` and nothing
is sent after it returns (the RabbitMQ consumers' channels are closed next, and an ack on a
closed channel closes the whole AMQP connection)."""

from __future__ import annotations

import asyncio

from bench.stats import AckBatcher


async def test_drain_sends_the_partial_group_and_nothing_follows() -> None:
    sent: list[list[int]] = []
    closed = False

    async def send(group: list[int]) -> None:
        assert not closed, "an ack sent after the drain"
        await asyncio.sleep(0)  # a send that yields, as a network write does
        sent.append(group)

    batcher = AckBatcher(4, send)
    for item in range(6):
        await batcher.add(item)
    assert sent == [[0, 1, 2, 3]]  # a full group goes at once, the rest waits for the timer

    await batcher.drain()
    closed = True
    assert sent == [[0, 1, 2, 3], [4, 5]]

    # the timer the partial group armed is cancelled, and no flush of its is left running
    assert batcher._timer is None
    assert not batcher._tasks
    assert batcher.pending == []


async def test_drain_waits_for_a_send_the_timer_started() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    sent: list[list[int]] = []

    async def send(group: list[int]) -> None:
        started.set()
        await release.wait()
        sent.append(group)

    batcher = AckBatcher(10, send)
    await batcher.add(1)
    await asyncio.wait_for(started.wait(), 5)  # the timer's flush is under way
    drained = asyncio.create_task(batcher.drain())
    await asyncio.sleep(0)
    assert not drained.done()  # it waits for the send in flight
    release.set()
    await asyncio.wait_for(drained, 5)
    assert sent == [[1]]
