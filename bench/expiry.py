"""Expiry (contract §13, issue 20): removing N copies by letting them expire, beside removing
the same N copies by delivering them (WebSocket, prefetch 100, an ACK each).

Both start from N ready copies inserted straight into the table (one INSERT ... SELECT
generate_series), so only the removal is measured, with the same meters (broker, PostgreSQL,
client CPU per 1,000 copies):

- ``mx expire N``: the copies carry an ``expires_at`` a moment ahead (the queue has
  ``x-message-ttl``); the broker's expiry sweep deletes them (no dead-letter target), timed
  from that moment until the queue is empty;
- ``mx deliver N``: a plain queue drained by two WebSocket consumers, timed from their start
  until every ACK is committed.

The issue asks that expiring 100,000 copies costs less than delivering them.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import mx
from bench.stats import BenchError, Result, Sink, cancel_all, now_ns, race

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


async def _until_empty(conn: Any, queue_id: int, deadline: float) -> str:
    """Poll (10 ms) until the queue holds no row: "ok", or "timeout" at ``deadline``."""
    while time.monotonic() < deadline:
        if not await conn.fetchval(_ANY, queue_id):
            return "ok"
        await asyncio.sleep(0.01)
    return "timeout"


_ANY = "SELECT EXISTS (SELECT 1 FROM messages WHERE queue_id = $1)"


async def _fill(conn: Any, sql: str, queue_id: int, queue: str, count: int, lead: float) -> None:
    await conn.execute(sql, queue_id, queue, time.time_ns(), lead, count, timeout=900)
    await conn.execute("ANALYZE messages", timeout=900)


def _result(name: str, count: int, elapsed: float | None, status: str, s: Settings) -> Result:
    result = Result(
        group="expiry",
        name=name,
        params={"copies": count},
        status=status,
        messages=count if status == "ok" else 0,
        elapsed_s=round(elapsed, 4) if elapsed else None,
        rate=round(count / elapsed, 1) if elapsed else None,
    )
    result.cpu_s_per_1k = s.mx.meters.per_1k(count)
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
        status = await _until_empty(conn, queue_id, expires + s.mx.deadline)
        elapsed = time.monotonic() - expires
        s.mx.meters.stop()
        return _result(f"mx expire {s.count}", s.count, elapsed, status, s)
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
            status = await _until_empty(conn, queue_id, time.monotonic() + s.mx.deadline)
        elapsed = (now_ns() - started) / 1e9
        s.mx.meters.stop()
        return _result(f"mx deliver {s.count}", s.count, elapsed, status, s)
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
    ratio = {}
    for part, cpu in expired.cpu_s_per_1k.items():
        other = delivered.cpu_s_per_1k.get(part)
        if cpu is not None and other:
            ratio[part] = round(cpu / other, 3)
    expired.extra["cpu_vs_delivery"] = ratio
    if expired.rate and delivered.rate:
        expired.extra["rate_vs_delivery"] = round(expired.rate / delivered.rate, 2)
    return [expired, delivered]
