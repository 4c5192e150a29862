"""The ``scale`` group, cost that must grow with work, not clients (issue 19): idle
subscriptions, delayed messages falling due, many busy queues.

- ``scale idle ws connections=C queues=Q``: Q queues, each subscribed once, over C WebSocket
  connections (10,000 over 10,000: the browser case; 10,000 over 100), idle for ``IDLE_S``:
  broker and PostgreSQL CPU as % of one core, broker RSS; then one message at a time to a
  random one of the queues: publish → delivery latency.
- ``scale idle rabbitmq connections=100 queues=Q``: the same idle consumers on RabbitMQ.
- ``scale delayed messages=N over=S``: N delayed messages to 1,000 subscribed queues, falling
  due evenly over S seconds (the issue's 100,000 over 600 s has the same rate as the default
  20,000 over 120 s; ``MX_BENCH_DELAYED=100000:600`` runs it in full): CPU while they fall due,
  and how late each arrives after its due time (publish time + delay, as the client sees it,
  so lateness is over-stated by the publish's own latency, never under-stated).
- ``scale busy queues=N``: the same load (batch publishes, prefetch 100, one consumer each)
  over 1,000 queues and over 10: total throughput, and on the 1,000-queue row its ratio to
  the 10-queue one (``extra.busy_ratio``).
- ``scale busy rabbitmq queues=N``: its peer on RabbitMQ: the same messages, one consumer per
  queue on a channel of its own (prefetch 100, acks grouped as the MessageX consumer's:
  ``basic.ack`` with ``multiple`` per 50 or 2 ms), the channels spread over at most 100
  connections (one each for 10 queues, ten each for 1,000: RabbitMQ's socket limit here is
  832), published by the same number of publishers in batches of 100 spanning the queues,
  each batch's 100 confirms awaited together.

Everything runs against the harness's broker; the queues are deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import orjson
import psutil

from app.runtime import raise_open_files_limit
from bench.infra import BrokerProcess, Meters, PostgresSampler
from bench.mx import EXCHANGE, Mx, RawHttp
from bench.rabbit import Rabbit
from bench.stats import (
    BenchError,
    Result,
    Sink,
    cancel_all,
    chunks,
    latency_summary,
    make_body,
    now_ns,
    race,
    shares,
    throughput_result,
)
from bench.wsclient import WsClient

if TYPE_CHECKING:
    from bench.harness import Run

#: (full, smoke)
IDLE_S = (60.0, 3.0)
QUEUES = (10_000, 200)
PROBES = (200, 20)
DELAYED = ((20_000, 120.0), (400, 4.0))
DELAYED_QUEUES = (1_000, 20)
#: the waiting bracket of the delayed scenario keeps this far from the last publish and the
#: first due time
WAIT_SETTLE_S = 1.0
#: the paced scenario's size (full, smoke): messages over seconds, at the delayed rate
PACED = ((10_000, 60.0), (200, 2.0))
#: consumers' connections in the delayed and paced scenarios (1,000 queues over 10)
DUE_CONNECTIONS = 10
BUSY_QUEUES = ((1_000, 10), (20, 2))
BUSY_COUNT = (50_000, 1_000)
#: a busy consumer acks in groups of this many (or after 2 ms, AckBatcher), both brokers
BUSY_ACK_GROUP = 50
#: messages per publish batch, both brokers
BUSY_BATCH = 100
#: RabbitMQ's busy consumers share at most this many connections (a channel each): the
#: VM's RabbitMQ takes at most 832 sockets (its file-descriptor limit, 927)
RABBIT_BUSY_CONNECTIONS = 100
#: requests or handshakes in flight while setting up
SETUP_CONCURRENCY = 32

T = TypeVar("T")
R = TypeVar("R")


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children, MiB."""
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return round(float(total) / 2**20, 1)


async def bounded(
    items: Iterable[T], job: Callable[[T], Awaitable[R]], limit: int = SETUP_CONCURRENCY
) -> list[R]:
    """``job(item)`` for every item, at most ``limit`` at a time; results in item order."""
    semaphore = asyncio.Semaphore(limit)

    async def one(item: T) -> R:
        async with semaphore:
            return await job(item)

    return list(await asyncio.gather(*(one(i) for i in items)))


def cpu_percent(meters: Meters, seconds: float) -> dict[str, float | None]:
    """Each meter's CPU over the bracket as % of one core."""
    spent = meters.per_1k(1000)  # per 1,000 of 1,000 "messages": the CPU seconds themselves
    return {k: None if v is None else round(v / seconds * 100, 2) for k, v in spent.items()}


@dataclass
class Scale:
    run: Run
    broker: BrokerProcess
    mx: Mx
    smoke: bool

    def pick(self, pair: tuple[Any, Any]) -> Any:
        return pair[1] if self.smoke else pair[0]

    def meters(self) -> Meters:
        """The broker's and PostgreSQL's CPU, and apart from the latter the bench database's
        own backends (``postgres_backends``: without the server's shared background
        processes, which on a shared server also work for other clients)."""
        meters = self.run.mx_meters(self.broker)
        pg = self.run.pg
        if pg is not None and pg.info.get("postmaster_pid"):
            sampler = PostgresSampler(pg.info["postmaster_pid"], pg.dbname, backends_only=True)
            meters.samplers["postgres_backends"] = sampler
            meters.polled = meters.polled | {"postgres_backends"}
        return meters

    def step(self, what: str, since: float) -> None:
        print(f"  {what}: {time.monotonic() - since:.1f} s", file=sys.stderr, flush=True)

    async def declare(self, names: Sequence[str]) -> None:
        since = time.monotonic()
        await bounded(names, self._declare_one)
        self.step(f"declared {len(names)} queues", since)

    async def _declare_one(self, name: str) -> None:
        try:
            await self.mx.call("PUT", f"/queues/{name}", {})
        except httpx.HTTPError:  # a keep-alive connection the server closed as it was reused
            await self.mx.call("PUT", f"/queues/{name}", {})

    async def delete(self, names: Sequence[str]) -> None:
        await bounded(names, self.mx.delete_queue)

    async def connect(self) -> WsClient:
        ws = await WsClient.open(self.mx.ws_url, {"Authorization": self.mx.authorization})
        hello = await ws.recv_json()
        if hello.get("type") != "CONNECTED":
            ws.abort()
            raise BenchError(f"expected CONNECTED, got {hello}")
        return ws

    async def open_subscribers(
        self, queues: Sequence[str], connections: int, prefetch: int
    ) -> list[WsClient]:
        """``connections`` sockets subscribing to ``queues`` between them (in equal shares)."""
        parts = [[queues[i] for i in r] for r in shares(len(queues), connections)]

        async def one(names: list[str]) -> WsClient:
            ws = await self.connect()
            for name in names:
                ws.send_json({"type": "SUBSCRIBE", "queue": name, "prefetch": prefetch})
            for _ in names:
                try:
                    reply = await ws.recv_json()
                except BenchError as exc:
                    raise BenchError(f"{exc} ({ws.proto.close_rcvd})") from None
                if reply.get("type") != "SUBSCRIBED":
                    ws.abort()
                    raise BenchError(f"expected SUBSCRIBED, got {reply}")
            return ws

        # The first alone: it fills the broker's credential cache, so the others do not all
        # hash the password at once.
        first = await one(parts[0])
        rest = await bounded(parts[1:], one)
        return [first, *rest]

    # -- idle subscriptions --------------------------------------------------------------

    async def idle(self, queues: Sequence[str], connections: int) -> Result:
        name = f"scale idle ws connections={connections} queues={len(queues)}"
        idle_s = float(os.environ.get("MX_BENCH_IDLE_S", self.pick(IDLE_S)))
        probes = self.pick(PROBES)
        params = {"connections": connections, "queues": len(queues), "idle_s": idle_s}
        since = time.monotonic()
        sockets = await self.open_subscribers(queues, connections, 1)
        self.step(f"{len(queues)} subscriptions over {connections} connections", since)
        sink = Sink(probes)
        tasks = [asyncio.create_task(self.mx.ws_consumer(ws, sink)) for ws in sockets]
        http = await RawHttp.open(self.mx.port)
        try:
            assert self.broker.pid is not None
            await asyncio.sleep(2.0)  # subscriptions settle (their first claims)
            meters = self.meters()
            meters.start()
            await asyncio.sleep(idle_s)
            meters.stop()
            cpu = cpu_percent(meters, idle_s)
            rss = rss_mib(self.broker.pid)
            status, started = await self.probe(http, queues, sink, tasks, probes)
            result = throughput_result("scale", name, params, sink, started, status)
            result.rate = None
            result.extra["idle_cpu_percent"] = cpu
            result.extra["idle_cpu_seconds"] = meters.per_1k(1000)
            result.extra["idle_server_cpu_percent"] = _sum(cpu.get("broker"), cpu.get("postgres"))
            result.extra["broker_rss_mib"] = rss
            return result
        finally:
            http.close()
            await cancel_all(tasks)
            await bounded(sockets, WsClient.close)

    async def probe(
        self,
        http: RawHttp,
        queues: Sequence[str],
        sink: Sink,
        tasks: list[asyncio.Task[Any]],
        probes: int,
    ) -> tuple[str, int]:
        """One message at a time, every 20 ms, each to a random one of ``queues``."""
        rng = random.Random(19)

        async def send() -> None:
            for seq in range(probes):
                queue = rng.choice(queues)
                body = b'{"body":' + make_body(seq) + b"}"
                await http.send(self.mx.post(f"/queues/{queue}/messages", body))
                await asyncio.sleep(0.02)

        started = now_ns()
        publisher = asyncio.create_task(send())
        status = await race(sink.done, [*tasks, publisher], 30.0 + probes * 0.05)
        await cancel_all([publisher])
        return status, started

    async def rabbit_idle(self, queues: Sequence[str], connections: int) -> Result:
        import aio_pika

        name = f"scale idle rabbitmq connections={connections} queues={len(queues)}"
        idle_s = float(os.environ.get("MX_BENCH_IDLE_S", self.pick(IDLE_S)))
        probes = self.pick(PROBES)
        params = {"connections": connections, "queues": len(queues), "idle_s": idle_s}
        url = self.run.cfg.rabbitmq_url
        conns: list[Any] = []
        sink = Sink(probes)
        try:
            admin = await aio_pika.connect(url, timeout=30)
            conns.append(admin)
            channel = await admin.channel()
            for name_ in queues:
                await channel.declare_queue(name_, durable=True)

            async def consume(names: list[str]) -> None:
                conn = await aio_pika.connect(url, timeout=30)
                conns.append(conn)
                ch = await conn.channel()
                await ch.set_qos(prefetch_count=1)

                async def on_message(message: Any) -> None:
                    sink.record_body(message.body, now_ns())
                    await message.ack()

                for n in names:
                    q = await ch.get_queue(n, ensure=False)
                    await q.consume(on_message)

            parts = [[queues[i] for i in r] for r in shares(len(queues), connections)]
            await bounded(parts, consume, 16)
            await asyncio.sleep(2.0)
            meters = self.run.rabbit_meters()
            meters.start()
            await asyncio.sleep(idle_s)
            meters.stop()
            cpu = cpu_percent(meters, idle_s)
            pub = await admin.channel(publisher_confirms=True)
            rng = random.Random(19)
            started = now_ns()
            for seq in range(probes):
                message = aio_pika.Message(make_body(seq), delivery_mode=2)
                await pub.default_exchange.publish(message, routing_key=rng.choice(queues))
                await asyncio.sleep(0.02)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sink.done.wait(), 10)
            status = "ok" if sink.done.is_set() else "timeout"
            result = throughput_result("scale", name, params, sink, started, status)
            result.rate = None
            result.extra["idle_cpu_percent"] = cpu
            result.extra["idle_server_cpu_percent"] = cpu.get("rabbitmq")
            return result
        finally:
            for conn in reversed(conns[1:]):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 10)
            if conns:
                with contextlib.suppress(Exception):
                    channel = await conns[0].channel()
                    for name_ in queues:
                        await channel.queue_delete(name_)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conns[0].close(), 10)

    # -- delayed messages ------------------------------------------------------------------

    def _size(
        self, sizes: tuple[tuple[int, float], tuple[int, float]], env: str
    ) -> tuple[int, float]:
        """Messages and seconds: ``env`` as ``N:S``, or the mode's of ``sizes``."""
        count, over = self.pick(sizes)
        if given := os.environ.get(env):
            count, over = int(given.split(":")[0]), float(given.split(":")[1])
        return int(count), float(over)

    def delayed_size(self) -> tuple[int, float]:
        return self._size(DELAYED, "MX_BENCH_DELAYED")

    async def delayed(self) -> Result:
        count, over = self.delayed_size()
        queues = [f"scale-delayed-{i}" for i in range(self.pick(DELAYED_QUEUES))]
        name = f"scale delayed messages={count} over={over:g}s"
        params = {"messages": count, "over_s": over, "queues": len(queues)}
        await self.declare(queues)
        for q in queues:
            binding = {"exchange": EXCHANGE, "queue": q, "routing_key": q}
            await self.mx.call("POST", "/bindings", binding)
        sockets = await self.open_subscribers(queues, DUE_CONNECTIONS, 100)
        lateness: list[int] = []
        due_ns: dict[int, int] = {}
        sink = Sink(count)

        def on_delivery(seq: int, received: int) -> None:
            lateness.append(received - due_ns[seq])

        tasks = [asyncio.create_task(_consume(ws, sink, on_delivery)) for ws in sockets]
        # every publish is done before the first is due: 100,000 took 12 to 27 s on the loaded VM
        lead = max(15.0, count / 2500) if not self.smoke else 2.0
        try:
            http = await RawHttp.open(self.mx.port)
            try:
                base = time.time_ns() + int(lead * 1e9)
                for batch in chunks(range(count), 100):
                    now = time.time_ns()
                    items: list[bytes] = []
                    for seq in batch:
                        due = base + int(seq * over * 1e9 / count)
                        due_ns[seq] = due
                        delay_ms = max(0, (due - now) // 1_000_000)
                        key = queues[seq % len(queues)]
                        items.append(
                            b'{"routing_key":"%s","delay_ms":%d,"body":%s}'
                            % (key.encode(), delay_ms, make_body(seq))
                        )
                    body = b'{"messages":[' + b",".join(items) + b"]}"
                    await http.send(self.mx.post(f"/exchanges/{EXCHANGE}/publish-batch", body))
            finally:
                http.close()
            published_s = (time.time_ns() - (base - int(lead * 1e9))) / 1e9
            if time.time_ns() > base:
                raise BenchError(f"publishing took {published_s:.1f} s, longer than the lead")
            waiting = await self._while_waiting(base)
            await asyncio.sleep(max(0, base - time.time_ns()) / 1e9)
            meters = self.meters()
            meters.start()
            started = now_ns()
            status = await race(sink.done, tasks, over + 30.0)
            meters.stop()
            elapsed = (now_ns() - started) / 1e9
            cpu = cpu_percent(meters, elapsed)
            result = throughput_result("scale", name, params, sink, started, status)
            result.rate = None
            result.latency_ms = latency_summary(max(0, x) for x in lateness)
            result.extra["late_over_100ms"] = sum(1 for x in lateness if x > 100_000_000)
            result.extra["early"] = sum(1 for x in lateness if x < -5_000_000)
            result.extra["cpu_percent"] = cpu
            result.extra["server_cpu_percent"] = _sum(cpu.get("broker"), cpu.get("postgres"))
            result.extra["publish_s"] = round(published_s, 1)
            if waiting is not None:
                result.extra["waiting_s"] = waiting[0]
                result.extra["waiting_cpu_percent"] = waiting[1]
                result.extra["waiting_server_cpu_percent"] = _sum(
                    waiting[1].get("broker"), waiting[1].get("postgres")
                )
            result.note = "latency_ms is lateness after the due time"
            return result
        finally:
            await cancel_all(tasks)
            await bounded(sockets, WsClient.close)
            await self.delete(queues)

    async def _while_waiting(
        self, first_due_ns: int
    ) -> tuple[float, dict[str, float | None]] | None:
        """The server's CPU while every delayed copy is stored and none is due yet: from a
        second after the last publish (and a VACUUM of messages, as autovacuum would run
        after that many inserts: the VM's PostgreSQL has it off) to a second before the first
        due time (the idle cost of what waits; None when that leaves under 5 s)."""
        if self.run.pg is not None:
            await self.run.pg.vacuum_messages()
        await asyncio.sleep(WAIT_SETTLE_S)
        seconds = (first_due_ns - time.time_ns()) / 1e9 - WAIT_SETTLE_S
        if seconds < 5.0:
            return None
        meters = self.meters()
        meters.start()
        started = now_ns()
        await asyncio.sleep(seconds)
        meters.stop()
        elapsed = (now_ns() - started) / 1e9
        return round(elapsed, 1), cpu_percent(meters, elapsed)

    # -- paced: the delayed scenario's deliveries, published as they fall due ---------------

    def paced_size(self) -> tuple[int, float]:
        return self._size(PACED, "MX_BENCH_PACED")

    async def paced(self) -> Result:
        """The deliveries of ``delayed`` without the delay: the same queues and consumers,
        each message published alone (``POST /queues/{q}/messages``) at the moment a delayed
        one would fall due, so the server's CPU is what publishing and delivering that rate
        costs, beside ``rabbit_paced`` (the floor of the work, next to ``delayed``'s)."""
        count, over = self.paced_size()
        queues = [f"scale-paced-{i}" for i in range(self.pick(DELAYED_QUEUES))]
        name = f"scale paced ws messages={count} over={over:g}s"
        params = {"messages": count, "over_s": over, "queues": len(queues)}
        await self.declare(queues)
        sockets = await self.open_subscribers(queues, DUE_CONNECTIONS, 100)
        sink = Sink(count)
        tasks = [asyncio.create_task(self.mx.ws_consumer(ws, sink)) for ws in sockets]
        http = await RawHttp.open(self.mx.port)

        async def publish(seq: int) -> None:
            body = b'{"body":' + make_body(seq) + b"}"
            await http.send(self.mx.post(f"/queues/{queues[seq % len(queues)]}/messages", body))

        try:
            return await self._paced_load(name, params, count, over, sink, tasks, publish)
        finally:
            http.close()
            await cancel_all(tasks)
            await bounded(sockets, WsClient.close)
            await self.delete(queues)

    async def rabbit_paced(self) -> Result:
        """``paced`` on RabbitMQ: durable queues, a consumer each (prefetch 100, an ack each)
        on channels over ``DUE_CONNECTIONS`` connections, one persistent message at a time
        with its publisher confirm."""
        import aio_pika

        count, over = self.paced_size()
        queues = [f"scale-rmq-paced-{i}" for i in range(self.pick(DELAYED_QUEUES))]
        name = f"scale paced rabbitmq messages={count} over={over:g}s"
        params = {"messages": count, "over_s": over, "queues": len(queues)}
        rabbit = Rabbit(self.run.cfg.rabbitmq_url)
        channels: list[Any] = []
        try:
            admin = await rabbit.connect()
            sink = Sink(count)
            channels = await rabbit.consumers(queues, DUE_CONNECTIONS, 100, sink)
            pub = await admin.channel(publisher_confirms=True)

            async def publish(seq: int) -> None:
                message = aio_pika.Message(make_body(seq), delivery_mode=2)
                key = queues[seq % len(queues)]
                await pub.default_exchange.publish(message, routing_key=key)

            return await self._paced_load(
                name, params, count, over, sink, [], publish, self.run.rabbit_meters()
            )
        finally:
            await rabbit.settle(channels)
            await rabbit.close(delete=queues)

    async def _paced_load(
        self,
        name: str,
        params: dict[str, Any],
        count: int,
        over: float,
        sink: Sink,
        tasks: list[asyncio.Task[Any]],
        publish: Callable[[int], Awaitable[None]],
        meters: Meters | None = None,
    ) -> Result:
        """Publish message ``seq`` at ``seq * over / count`` seconds (one at a time, each
        awaited), metered from the first to the last delivery: the server's CPU per second."""

        async def pace(start: float) -> None:
            for seq in range(count):
                await asyncio.sleep(max(0.0, start + seq * over / count - time.monotonic()))
                await publish(seq)

        meters = meters or self.meters()
        meters.start()
        started = now_ns()
        publisher = asyncio.create_task(pace(time.monotonic()))
        status = await race(sink.done, [*tasks, publisher], over + 30.0)
        meters.stop()
        elapsed = (now_ns() - started) / 1e9
        await cancel_all([publisher])
        cpu = cpu_percent(meters, elapsed)
        result = throughput_result("scale", name, params, sink, started, status)
        result.extra["cpu_percent"] = cpu
        result.extra["server_cpu_percent"] = (
            cpu.get("rabbitmq")
            if "rabbitmq" in cpu
            else _sum(cpu.get("broker"), cpu.get("postgres"))
        )
        return result

    # -- many busy queues ------------------------------------------------------------------

    def busy_count(self) -> int:
        """Messages per busy scenario: ``MX_BENCH_BUSY_COUNT``, or 50,000 (smoke 1,000)."""
        return int(os.environ.get("MX_BENCH_BUSY_COUNT", self.pick(BUSY_COUNT)))

    async def busy(self, n_queues: int) -> Result:
        count = self.busy_count()
        queues = [f"scale-busy{n_queues}-{i}" for i in range(n_queues)]
        name = f"scale busy queues={n_queues}"
        params = {"queues": n_queues, "messages": count, "prefetch": 100, "publish": "batch"}
        await self.declare(queues)
        for q in queues:
            binding = {"exchange": EXCHANGE, "queue": q, "routing_key": q}
            await self.mx.call("POST", "/bindings", binding)
        sockets = await self.open_subscribers(queues, n_queues, 100)
        sink = Sink(count)
        tasks = [
            asyncio.create_task(self.mx.ws_consumer(ws, sink, BUSY_ACK_GROUP)) for ws in sockets
        ]
        try:
            publish = partial(self._publish_spread, queues)
            return await self._busy_load(self.meters(), name, params, sink, tasks, publish)
        finally:
            await cancel_all(tasks)
            await bounded(sockets, WsClient.close)
            await self.delete(queues)

    async def _busy_load(
        self,
        meters: Meters,
        name: str,
        params: dict[str, Any],
        sink: Sink,
        consumers: list[asyncio.Task[Any]],
        publish: Callable[[range], Coroutine[Any, Any, None]],
    ) -> Result:
        """The run's publishers, each ``publish(seqs)`` of its share, until ``sink`` has
        every message (or a consumer or publisher fails, or the deadline): the result."""
        meters.start()
        started = now_ns()
        publishers = [
            asyncio.create_task(publish(seqs))
            for seqs in shares(sink.expected, self.run.cfg.publishers)
        ]
        try:
            status = await race(sink.done, [*consumers, *publishers], self.run.cfg.deadline)
        finally:
            meters.stop()
            await cancel_all(publishers)
        result = throughput_result("scale", name, params, sink, started, status)
        result.cpu_s_per_1k = meters.per_1k(sink.received)
        return result

    async def _publish_spread(self, queues: Sequence[str], seqs: range) -> None:
        """Batches of 100, message i to queue i mod N (each batch spans many queues)."""
        http = await RawHttp.open(self.mx.port)
        try:
            for chunk in chunks(seqs, BUSY_BATCH):
                items = b",".join(
                    b'{"routing_key":"%s","body":%s}'
                    % (queues[seq % len(queues)].encode(), make_body(seq))
                    for seq in chunk
                )
                body = b'{"messages":[' + items + b"]}"
                await http.send(self.mx.post(f"/exchanges/{EXCHANGE}/publish-batch", body))
        finally:
            http.close()

    async def rabbit_busy(self, n_queues: int) -> Result:
        """``busy`` on RabbitMQ: durable queues, persistent messages, publisher confirms."""
        count = self.busy_count()
        queues = [f"scale-rmq-busy{n_queues}-{i}" for i in range(n_queues)]
        name = f"scale busy rabbitmq queues={n_queues}"
        params = {"queues": n_queues, "messages": count, "prefetch": 100, "publish": "batch"}
        rabbit = Rabbit(self.run.cfg.rabbitmq_url)
        channels: list[Any] = []
        try:
            admin = await rabbit.connect()
            sink = Sink(count)
            since = time.monotonic()
            k = min(n_queues, RABBIT_BUSY_CONNECTIONS)
            channels = await rabbit.consumers(queues, k, 100, sink, BUSY_ACK_GROUP)
            self.step(f"{n_queues} queues declared, a consumer (channel) each, {k} conns", since)
            publish = partial(_rabbit_publish_spread, admin, queues)
            meters = self.run.rabbit_meters()
            return await self._busy_load(meters, name, params, sink, [], publish)
        finally:
            await rabbit.settle(channels)
            await rabbit.close(delete=queues)


async def _rabbit_publish_spread(conn: Any, queues: Sequence[str], seqs: range) -> None:
    """``Scale._publish_spread`` over AMQP: a channel with publisher confirms; batches of
    100, message i to queue i mod N through the default exchange, each batch's confirms
    awaited together (AMQP has no batch publish: 100 ``basic.publish`` in one go)."""
    import aio_pika

    channel = await conn.channel(publisher_confirms=True)
    exchange = channel.default_exchange
    persistent = aio_pika.DeliveryMode.PERSISTENT
    try:
        for chunk in chunks(seqs, BUSY_BATCH):
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(make_body(seq), delivery_mode=persistent),
                        routing_key=queues[seq % len(queues)],
                    )
                    for seq in chunk
                )
            )
    finally:
        await channel.close()


def busy_ratios(results: Sequence[Result]) -> None:
    """On each busy row of many queues: its rate over that of the fewest queues of the same
    broker and round (``extra.busy_ratio``, 1.0 on the base row)."""
    series: dict[tuple[bool, Any], list[Result]] = {}
    for r in results:
        if r.name.startswith("scale busy ") and r.status == "ok" and r.rate:
            key = ("rabbitmq" in r.name, r.extra.get("round"))
            series.setdefault(key, []).append(r)
    for group in series.values():
        base = min(group, key=lambda r: r.params["queues"])
        for r in group:
            r.extra["busy_ratio"] = round((r.rate or 0.0) / (base.rate or 1.0), 3)


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a + b, 2)


async def _consume(ws: WsClient, sink: Sink, seen: Callable[[int, int], None]) -> None:
    """Receive deliveries, record each, ack each (one ACK per read's worth, as WsClient)."""

    def on_text(raw: bytes) -> None:
        received = now_ns()
        frame = orjson.loads(raw)
        if frame.get("type") != "MESSAGE_DELIVERED":
            return
        seq = frame["body"]["seq"]
        sink.record(seq, frame["body"]["ts"], received)
        seen(seq, time.time_ns())
        ws.send_text(b'{"type":"ACK","delivery_tag":"%s"}' % frame["delivery_tag"].encode())

    await ws.serve(on_text)


#: the broker of this group: 10,000 connections of one user, 100 subscriptions on one
SCALE_ENV = {
    "MESSAGEX_MAX_CONNECTIONS_PER_USER": "20000",
    "MESSAGEX_MAX_SUBSCRIPTIONS_PER_CONNECTION": "100",
}


def wants(run: Run, name: str) -> bool:
    return not run.cfg.only or re.search(run.cfg.only, name) is not None


async def run(run: Run) -> None:
    """The idle-subscription, delayed and busy-queue scenarios of the ``scale`` group, on a
    broker of their own (the same database) that allows 10,000 connections of one user."""
    raise_open_files_limit()
    assert run.pg is not None
    assert run.broker is not None
    broker = BrokerProcess(
        run.pg.url,
        user=run.broker.user,
        password=run.broker.password,
        workers=run.cfg.workers,
        extra_env={**SCALE_ENV, **run.cfg.broker_env},
    )
    await broker.start()
    client = Mx(broker.base_url, broker.ws_url, broker.user, broker.password)
    try:
        await client.setup()
        await scenarios(Scale(run, broker, client, run.cfg.smoke))
    finally:
        await client.close()
        await broker.stop()
        if any(r.status != "ok" for r in run.results if r.group == "scale"):
            print(f"scale broker log:\n{broker.log_tail()}", file=sys.stderr)
        broker.cleanup()


async def scenarios(scale: Scale) -> None:
    run = scale.run
    count = int(os.environ.get("MX_BENCH_IDLE_QUEUES", scale.pick(QUEUES)))
    queues = [f"scale-idle-{i}" for i in range(count)]
    names = [
        f"scale idle ws connections={len(queues)} queues={len(queues)}",
        f"scale idle ws connections=100 queues={len(queues)}",
    ]
    if any(wants(run, n) for n in names):
        await scale.declare(queues)
        try:
            await run.scenario("scale", names[0], scale.idle(queues, len(queues)))
            await run.scenario("scale", names[1], scale.idle(queues, min(100, len(queues))))
        finally:
            await scale.delete(queues)
    if not run.rabbit_skipped:
        name = f"scale idle rabbitmq connections=100 queues={len(queues)}"
        rabbit_queues = [f"scale-rmq-idle-{i}" for i in range(len(queues))]
        await run.scenario("scale", name, scale.rabbit_idle(rabbit_queues, 100))
    count, over = scale.delayed_size()
    await run.scenario("scale", f"scale delayed messages={count} over={over:g}s", scale.delayed())
    count, over = scale.paced_size()
    await run.scenario("scale", f"scale paced ws messages={count} over={over:g}s", scale.paced())
    if not run.rabbit_skipped:
        name = f"scale paced rabbitmq messages={count} over={over:g}s"
        await run.scenario("scale", name, scale.rabbit_paced())
    for n in scale.pick(BUSY_QUEUES):
        await run.scenario("scale", f"scale busy queues={n}", scale.busy(n))
    if not run.rabbit_skipped:
        for n in scale.pick(BUSY_QUEUES):
            work = scale.rabbit_busy(n)
            await run.scenario("scale", f"scale busy rabbitmq queues={n}", work)
    busy_ratios(run.results)
