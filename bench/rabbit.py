"""RabbitMQ through aio-pika: durable queue, persistent messages, publisher confirms, manual
acks, prefetch 1/10/100 — the same shape of load as the MessageX scenarios."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.infra import Meters, ensure_loopback
from bench.mx import BATCH, paced
from bench.stats import (
    AckBatcher,
    Result,
    Sink,
    ack_group_size,
    cancel_all,
    chunks,
    latency_summary,
    make_body,
    now_ns,
    pace_check,
    race,
    scenario_name,
    shares,
    throughput_result,
)


async def unavailable(url: str) -> str | None:
    """Why RabbitMQ cannot be benchmarked here, or None when it can."""
    ensure_loopback(url, "--rabbitmq-url")
    try:
        import aio_pika
    except ImportError:
        return "aio-pika is not installed (uv sync --group bench)"
    try:
        conn = await aio_pika.connect(url, timeout=3)
    except Exception as exc:  # aio-pika raises many kinds; every one means "not here"
        return f"RabbitMQ not reachable ({type(exc).__name__}: {exc})"
    await conn.close()
    return None


@dataclass
class Settings:
    url: str
    meters: Meters
    count: int
    publishers: int
    consumers: int
    deadline: float


class Rabbit:
    """Connections for one scenario: one for the publishers (a channel each, with publisher
    confirms), one per consumer (as each MessageX consumer has its own WebSocket)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connections: list[Any] = []
        self.batchers: list[AckBatcher[Any]] = []

    async def connect(self) -> Any:
        import aio_pika

        conn = await aio_pika.connect(self.url, timeout=10)
        self.connections.append(conn)
        return conn

    async def close(self, delete: Iterable[str] = ()) -> None:
        """Delete the queues ``delete`` (on the first connection, if any was made), then
        close every connection."""
        if self.connections:
            for queue in delete:
                await self.delete(self.connections[0], queue)
        for conn in self.connections:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 10)

    async def declare(self, conn: Any, queue: str) -> None:
        channel = await conn.channel()
        await channel.declare_queue(queue, durable=True)
        await channel.close()

    async def delete(self, conn: Any, queue: str) -> None:
        with contextlib.suppress(Exception):
            channel = await conn.channel()
            await channel.queue_delete(queue)
            await channel.close()

    async def consumer(
        self,
        queue: str,
        prefetch: int,
        sink: Sink,
        ack_group: int | None = None,
        conn: Any | None = None,
    ) -> Any:
        """A consumer that acks every message, one ``basic.ack`` each or, with ``ack_group``,
        one ``basic.ack`` with ``multiple`` per group (AckBatcher); returns its channel. On a
        connection of its own, or on a channel of its own on ``conn``."""
        if conn is None:
            conn = await self.connect()
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=prefetch)
        q = await channel.declare_queue(queue, durable=True)

        async def ack_up_to(group: list[Any]) -> None:
            await group[-1].ack(multiple=True)  # every earlier delivery on this channel too

        batcher = AckBatcher(ack_group, ack_up_to) if ack_group is not None else None
        if batcher is not None:
            self.batchers.append(batcher)

        async def on_message(message: Any) -> None:
            sink.record_body(message.body, now_ns())
            if batcher is not None:
                await batcher.add(message)
            else:
                await message.ack()

        await q.consume(on_message, no_ack=False)
        return channel

    async def consumers(
        self,
        queues: Sequence[str],
        connections: int,
        prefetch: int,
        sink: Sink,
        ack_group: int | None = None,
        at_once: int = 16,
    ) -> list[Any]:
        """A ``consumer`` of each of ``queues`` (each declares its queue) on a channel of its
        own, the channels over ``connections`` connections made for them, at most
        ``at_once`` being set up at a time; returns the channels."""
        gate = asyncio.Semaphore(at_once)

        async def limited(job: Awaitable[Any]) -> Any:
            async with gate:
                return await job

        conns = await asyncio.gather(*(limited(self.connect()) for _ in range(connections)))
        return list(
            await asyncio.gather(
                *(
                    limited(self.consumer(q, prefetch, sink, ack_group, conns[i % connections]))
                    for i, q in enumerate(queues)
                )
            )
        )

    @staticmethod
    async def ready(channel: Any, queue: str) -> int:
        """How many messages ``queue`` holds ready (a passive ``queue.declare``: no
        management plugin needed)."""
        declared = await channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count)

    @staticmethod
    async def publisher(
        conn: Any, queue: str, seqs: Sequence[int], mode: str, due: float | None = None
    ) -> None:
        """Publish ``seqs`` on a channel of its own with publisher confirms: ``single``
        waits for each confirm, ``batch`` for BATCH at a time. With ``due`` (a
        ``time.monotonic()`` moment), each message's ``expiration`` is the time left until
        then (none left: 0), so that every one of them falls due at that moment."""
        import aio_pika

        channel = await conn.channel(publisher_confirms=True)
        exchange = channel.default_exchange
        persistent = aio_pika.DeliveryMode.PERSISTENT

        async def publish(seq: int) -> None:
            left = None if due is None else max(0.0, due - time.monotonic())
            message = aio_pika.Message(make_body(seq), delivery_mode=persistent, expiration=left)
            await exchange.publish(message, routing_key=queue)

        try:
            if mode == "single":
                for seq in seqs:
                    await publish(seq)  # waits for the confirm
            else:
                for chunk in chunks(seqs, BATCH):
                    await asyncio.gather(*(publish(seq) for seq in chunk))
        finally:
            await channel.close()

    async def settle(self, channels: list[Any]) -> None:
        """Send the consumers' last grouped acks, then close ``channels``: closing a channel
        flushes its acks to the broker (frames on a channel are ordered). An ack sent after
        its channel's close would be a protocol error that closes the whole connection."""
        for batcher in self.batchers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(batcher.drain(), 10)
        for channel in channels:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), 10)


async def throughput(s: Settings, mode: str, prefetch: int, ack: str = "each") -> Result:
    queue = f"bench-{mode}-p{prefetch}-{uuid.uuid4().hex[:8]}"
    name = scenario_name("rabbitmq", mode, prefetch, ack)
    params = {
        "publish": mode,
        "prefetch": prefetch,
        "ack": ack,
        "publishers": s.publishers,
        "consumers": s.consumers,
    }
    rabbit = Rabbit(s.url)
    tasks: list[asyncio.Task[Any]] = []
    try:
        pub_conn = await rabbit.connect()
        await rabbit.declare(pub_conn, queue)
        sink = Sink(s.count)
        group = ack_group_size(prefetch) if ack == "batch" else None
        channels = [await rabbit.consumer(queue, prefetch, sink, group) for _ in range(s.consumers)]
        s.meters.start()
        started = now_ns()
        tasks = [
            asyncio.create_task(rabbit.publisher(pub_conn, queue, seqs, mode))
            for seqs in shares(s.count, s.publishers)
        ]
        status = await race(sink.done, tasks, s.deadline)
        await rabbit.settle(channels)
        s.meters.stop()
        result = throughput_result("rabbitmq", name, params, sink, started, status)
        result.cpu_s_per_1k = s.meters.per_1k(sink.received)
        return result
    finally:
        await cancel_all(tasks)
        await rabbit.close(delete=[queue])


async def idle_latency(s: Settings, count: int, interval: float = 0.01) -> Result:
    """One persistent, confirmed message every 10 ms to a subscribed consumer (prefetch 1)."""
    queue = f"bench-idle-{uuid.uuid4().hex[:8]}"
    params = {"interval_ms": interval * 1000, "prefetch": 1, "publish": "single"}
    rabbit = Rabbit(s.url)
    tasks: list[asyncio.Task[Any]] = []
    try:
        import aio_pika

        pub_conn = await rabbit.connect()
        await rabbit.declare(pub_conn, queue)
        sink = Sink(count)
        consumer = await rabbit.consumer(queue, 1, sink)
        channel = await pub_conn.channel(publisher_confirms=True)
        persistent = aio_pika.DeliveryMode.PERSISTENT

        async def send(seq: int) -> None:
            message = aio_pika.Message(make_body(seq), delivery_mode=persistent)
            await channel.default_exchange.publish(message, routing_key=queue)

        s.meters.start()
        started = now_ns()
        publisher = asyncio.create_task(paced(count, interval, send))
        tasks = [publisher]
        status = await race(sink.done, tasks, s.deadline + count * interval)
        confirms = publisher.result() if publisher.done() and not publisher.cancelled() else []
        await rabbit.settle([consumer, channel])
        s.meters.stop()
        name = "rabbitmq idle 1 msg/10 ms"
        result = throughput_result("idle", name, params, sink, started, status)
        result.rate = None
        result.cpu_s_per_1k = s.meters.per_1k(sink.received)
        result.extra["publish_confirm_ms"] = latency_summary(confirms)
        trend, result.note = pace_check(sink.latencies_ns, interval)
        result.extra.update(trend)
        return result
    finally:
        await cancel_all(tasks)
        await rabbit.close(delete=[queue])
