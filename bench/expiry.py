"""Expiry (contract §13, issue 20): removing N copies by letting them expire, beside removing
the same N copies by delivering them (prefetch 100, an ack each), in MessageX and in RabbitMQ.

MessageX starts both from N ready copies inserted straight into the table (one INSERT ...
SELECT generate_series), so only the removal is measured, with the same meters (broker,
PostgreSQL, client CPU per 1,000 copies):

- ``mx expire N``: the copies carry an ``expires_at`` a moment ahead (the queue has
  ``x-message-ttl``); the broker's expiry sweep deletes them (no dead-letter target), timed
  from that moment until the queue is empty;
- ``mx deliver N``: a plain queue drained by two WebSocket consumers, timed from their start
  until every ACK is committed.

RabbitMQ gets the same N 1 KiB copies through AMQP (durable queue, persistent messages,
publisher confirms, the run's publishers each on a channel of its own, ``Rabbit.publisher``),
and the same meters (``beam.smp``, client):

- ``rabbitmq deliver N`` runs first: the copies are published into a plain durable queue
  (the publishing is timed, not metered), then two consumers, each on a connection of its
  own, with prefetch 100 and a ``basic.ack`` each, drain it; timed from their start until
  their channels are closed (which flushes the acks) and the queue holds nothing;
- ``rabbitmq expire N``: the copies are published into another plain durable queue, each
  with a per-message ``expiration`` computed at its publish as the time left until one moment
  ``due``, set before publishing to 1.5 times the deliver scenario's measured publish time
  plus LEAD_S from the start. Per-message rather than a queue's ``x-message-ttl``: a queue TTL
  counts from each message's arrival, so the copies would fall due spread over the whole
  publish (expired at the rate they were published), while per-message expirations all
  point at the same moment, a lead after the last confirm. The meters start just before
  ``due`` (EARLY_S, so that RabbitMQ's timer firing a millisecond early misses nothing);
  timed from ``due`` until a passive ``queue.declare`` counts no message. Publishing that
  runs past ``due`` is an error (raise MX_BENCH_EXPIRY_LEAD_S), as is a copy gone before it.

Each expiring row carries its system's expiry / delivery ratios: ``extra.cpu_vs_delivery``
(CPU per 1,000 of each part, and ``server``: broker + PostgreSQL, or ``beam.smp``) and
``extra.rate_vs_delivery``. The issue asks that expiring 100,000 copies costs less than
delivering them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import mx, rabbit
from bench.backlog import FILL_TIMEOUT_S
from bench.infra import Meters
from bench.stats import BenchError, Result, Sink, cancel_all, now_ns, race, shares

#: ready copies whose bodies are benchmark bodies (seq, ts) of about 1 KiB; expiring ones get
#: ``expires_at`` $4 seconds after the statement's now()
FILL = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, expires_at)
SELECT $1, 'expiry-' || g, '', $2,
       convert_to('{"seq":' || g || ',"ts":' || $3::bigint || ',"pad":"'
                  || repeat('x', 980) || '"}', 'UTF8'),
       now() + $4::float8 * interval '1 second'
FROM generate_series(1, $5::bigint) AS g
"""
DELIVERED_FILL = FILL.replace(
    "now() + $4::float8 * interval '1 second'", "CASE WHEN $4::float8 < 0 THEN now() END"
)

#: the expiring copies expire this long after they are inserted (the meters start before);
#: ``MX_BENCH_EXPIRY_LEAD_S`` sets it (a loaded machine needs longer to insert 100,000)
LEAD_S = float(os.environ.get("MX_BENCH_EXPIRY_LEAD_S", "3"))
#: seconds until the first of a queue's copies expires
_LEFT = """SELECT EXTRACT(EPOCH FROM (SELECT min(expires_at) FROM messages WHERE queue_id = $1)
                         - clock_timestamp())"""
PREFETCH = 100
CONSUMERS = 2


@dataclass
class Settings:
    mx: mx.Settings
    database_url: str
    count: int


async def _queue_id(conn: Any, name: str) -> int:
    queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = $1", name)
    if queue_id is None:
        raise BenchError(f"queue {name} not found")
    return int(queue_id)


async def _until_empty(holds: Callable[[], Awaitable[Any]], deadline: float) -> str:
    """Poll (10 ms) until ``holds()`` is falsy (the queue holds nothing): "ok", or "timeout"
    at ``deadline``."""
    while time.monotonic() < deadline:
        if not await holds():
            return "ok"
        await asyncio.sleep(0.01)
    return "timeout"


_ANY = "SELECT EXISTS (SELECT 1 FROM messages WHERE queue_id = $1)"


def _rows(conn: Any, queue_id: int) -> Callable[[], Awaitable[Any]]:
    return lambda: conn.fetchval(_ANY, queue_id)


async def _fill(conn: Any, sql: str, queue_id: int, queue: str, count: int, lead: float) -> None:
    await conn.execute(sql, queue_id, queue, time.time_ns(), lead, count, timeout=900)
    await conn.execute("ANALYZE messages", timeout=900)


def _result(
    system: str, name: str, count: int, elapsed: float | None, status: str, meters: Meters
) -> Result:
    result = Result(
        group="expiry",
        name=name,
        params={"copies": count, "system": system},
        status=status,
        messages=count if status == "ok" else 0,
        elapsed_s=round(elapsed, 4) if elapsed else None,
        rate=round(count / elapsed, 1) if elapsed else None,
    )
    result.cpu_s_per_1k = meters.per_1k(count)
    return result


async def expire(s: Settings, conn: Any) -> Result:
    queue = mx.unique("expire")
    await s.mx.mx.call("PUT", f"/queues/{queue}", {"arguments": {"x-message-ttl": 3_600_000}})
    try:
        queue_id = await _queue_id(conn, queue)
        await _fill(conn, FILL, queue_id, queue, s.count, LEAD_S)
        s.mx.meters.start()
        # when they expire, on the database clock (the fill and ANALYZE took some of LEAD_S)
        left = await conn.fetchval(_LEFT, queue_id)
        if left is None or left <= 0:
            raise BenchError(
                "the copies expired before the meters started: raise MX_BENCH_EXPIRY_LEAD_S"
            )
        expires = time.monotonic() + float(left)
        status = await _until_empty(_rows(conn, queue_id), expires + s.mx.deadline)
        elapsed = time.monotonic() - expires
        s.mx.meters.stop()
        return _result("messagex", f"mx expire {s.count}", s.count, elapsed, status, s.mx.meters)
    finally:
        await s.mx.mx.delete_queue(queue)


async def deliver(s: Settings, conn: Any) -> Result:
    queue = mx.unique("deliver")
    await s.mx.mx.call("PUT", f"/queues/{queue}", {})
    sockets = []
    tasks: list[asyncio.Task[Any]] = []
    try:
        queue_id = await _queue_id(conn, queue)
        await _fill(conn, DELIVERED_FILL, queue_id, queue, s.count, 0.0)
        sink = Sink(s.count)
        s.mx.meters.start()
        started = now_ns()
        for _ in range(CONSUMERS):
            sockets.append(await s.mx.mx.subscribe(queue, PREFETCH))
        tasks += [asyncio.create_task(s.mx.mx.ws_consumer(ws, sink)) for ws in sockets]
        status = await race(sink.done, tasks, s.mx.deadline)
        if status == "ok":  # every ACK committed
            deadline = time.monotonic() + s.mx.deadline
            status = await _until_empty(_rows(conn, queue_id), deadline)
        elapsed = (now_ns() - started) / 1e9
        s.mx.meters.stop()
        name = f"mx deliver {s.count}"
        return _result("messagex", name, s.count, elapsed, status, s.mx.meters)
    finally:
        await cancel_all(tasks)
        for ws in sockets:
            await ws.close()
        await s.mx.mx.delete_queue(queue)


async def run(s: Settings) -> list[Result]:
    conn = await asyncpg.connect(s.database_url, timeout=10)
    try:
        expired = await expire(s, conn)
        delivered = await deliver(s, conn)
    finally:
        await conn.close()
    add_ratios(expired, delivered)
    return [expired, delivered]


def _server(cpu: dict[str, float | None]) -> float | None:
    """CPU of everything but the client: broker + PostgreSQL, or ``beam.smp``."""
    parts = [v for k, v in cpu.items() if k != "client"]
    return None if not parts or None in parts else sum(v for v in parts if v is not None)


def add_ratios(expired: Result, delivered: Result) -> None:
    """Expiry / delivery of one system, on the expiring row: CPU per 1,000 copies of each
    part and of the server side (below 1: expiring costs less), and the rate."""
    ratio = {}
    mine, theirs = dict(expired.cpu_s_per_1k), dict(delivered.cpu_s_per_1k)
    mine["server"], theirs["server"] = _server(mine), _server(theirs)
    for part, cpu in mine.items():
        other = theirs.get(part)
        if cpu is not None and other:
            ratio[part] = round(cpu / other, 3)
    expired.extra["cpu_vs_delivery"] = ratio
    if expired.rate and delivered.rate:
        expired.extra["rate_vs_delivery"] = round(expired.rate / delivered.rate, 2)


# -- RabbitMQ ---------------------------------------------------------------------------------

#: RabbitMQ's copies fall due this many times the deliver scenario's publish time, plus
#: LEAD_S, after their publishing starts
PUBLISH_MARGIN = 1.5
#: the meters start this long before RabbitMQ's copies fall due
EARLY_S = 0.05


async def _publish(
    client: rabbit.Rabbit, conn: Any, queue: str, s: rabbit.Settings, due: float | None = None
) -> float:
    """Publish the scenario's copies into ``queue`` (see ``Rabbit.publisher``); seconds."""
    started = time.monotonic()
    publishers = (
        client.publisher(conn, queue, seqs, "batch", due) for seqs in shares(s.count, s.publishers)
    )
    await asyncio.wait_for(asyncio.gather(*publishers), FILL_TIMEOUT_S)
    return time.monotonic() - started


async def rabbit_deliver(s: rabbit.Settings) -> tuple[Result, float]:
    """``rabbitmq deliver N``, and how long publishing the N copies took."""
    queue = mx.unique("expiry-deliver")
    client = rabbit.Rabbit(s.url)
    try:
        conn = await client.connect()
        await client.declare(conn, queue)
        publish_s = await _publish(client, conn, queue, s)
        channel = await conn.channel()
        sink = Sink(s.count)
        s.meters.start()
        started = now_ns()
        consumers = [await client.consumer(queue, PREFETCH, sink) for _ in range(CONSUMERS)]
        status = await race(sink.done, [], s.deadline)
        await client.settle(consumers)  # closing the channels flushes their acks
        if status == "ok":  # an unacked copy would be back in the queue
            deadline = time.monotonic() + s.deadline
            status = await _until_empty(lambda: client.ready(channel, queue), deadline)
        elapsed = (now_ns() - started) / 1e9
        s.meters.stop()
        name = f"rabbitmq deliver {s.count}"
        result = _result("rabbitmq", name, s.count, elapsed, status, s.meters)
        result.extra["publish_s"] = round(publish_s, 2)
        return result, publish_s
    finally:
        await client.close(delete=[queue])


async def rabbit_expire(s: rabbit.Settings, publish_s: float) -> Result:
    """``rabbitmq expire N``: every copy falls due at one moment after its publishing ends
    (``publish_s``: how long the same publishing took in the deliver scenario)."""
    queue = mx.unique("expiry-expire")
    client = rabbit.Rabbit(s.url)
    try:
        conn = await client.connect()
        await client.declare(conn, queue)
        channel = await conn.channel()
        due = time.monotonic() + PUBLISH_MARGIN * publish_s + LEAD_S
        spent = await _publish(client, conn, queue, s, due)
        published = time.monotonic()
        held = await client.ready(channel, queue)
        if time.monotonic() >= due - EARLY_S:
            raise BenchError(
                "the RabbitMQ copies fell due before their publishing ended: "
                "raise MX_BENCH_EXPIRY_LEAD_S"
            )
        if held != s.count:
            raise BenchError(f"{queue} holds {held} of {s.count} copies before they fall due")
        await asyncio.sleep(due - EARLY_S - time.monotonic())
        s.meters.start()
        status = await _until_empty(lambda: client.ready(channel, queue), due + s.deadline)
        elapsed = time.monotonic() - due
        s.meters.stop()
        result = _result(
            "rabbitmq", f"rabbitmq expire {s.count}", s.count, elapsed, status, s.meters
        )
        result.extra.update(publish_s=round(spent, 2), lead_s=round(due - published, 2))
        return result
    finally:
        await client.close(delete=[queue])


async def run_rabbit(s: rabbit.Settings) -> list[Result]:
    """RabbitMQ's expire and deliver of ``s.count`` copies (deliver first: its publish time
    sets when the expiring copies fall due)."""
    delivered, publish_s = await rabbit_deliver(s)
    expired = await rabbit_expire(s, publish_s)
    add_ratios(expired, delivered)
    return [expired, delivered]
