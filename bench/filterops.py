"""Operations on messages by filter (contract §17, issue 22): a move and a delete of N copies
(100,000 by default) by a filter, while a publisher and a consumer run on another queue.

The source queue is filled straight into the table (one INSERT ... SELECT generate_series):
N copies that match the filter (``routing_key`` ``order.#`` and header ``tenant: acme``) and
N/4 that do not, each about 1 KiB. Then, on another queue, one publisher (single REST
publishes over one keep-alive connection) and one WebSocket consumer (prefetch 100, an ACK
each) run for the whole scenario. Their rates are measured over a quiet window first
(``BASELINE_S``), then over the move request (``POST /queues/src/messages/move``, all N to
another queue, one transaction) and over the delete request (``.../delete`` of those N from
the target). The result gives each operation's time and the background rates during it as
ratios to the quiet window's: the contract asks that it take seconds and not block
publishing or claiming on other queues.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import mx
from bench.stats import BenchError, Result, Sink, cancel_all, make_body

FILL = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, headers, body)
SELECT $1, 'filterops-' || g, 'bench.topic',
       CASE WHEN g <= $3 THEN 'order.created.eu' ELSE 'user.signed_up' END,
       CASE WHEN g <= $3 THEN '{"tenant": "acme"}'::jsonb ELSE '{"tenant": "zeta"}'::jsonb END,
       convert_to('{"seq":' || g || ',"ts":' || $2::bigint || ',"pad":"'
                  || repeat('x', 980) || '"}', 'UTF8')
FROM generate_series(1, $3::bigint + $3::bigint / 4) AS g
"""
FILTER = {"routing_key": "order.#", "headers": {"tenant": "acme"}, "status": ["ready"]}
#: the quiet window over which the background rates are measured first
BASELINE_S = 4.0
PREFETCH = 100


@dataclass
class Settings:
    mx: mx.Settings
    database_url: str
    count: int


class Background:
    """One publisher and one consumer on their own queue, counting as they go."""

    def __init__(self, s: Settings, queue: str) -> None:
        self.s = s
        self.queue = queue
        self.published = 0
        self.sink = Sink(1 << 60)
        self.tasks: list[asyncio.Task[Any]] = []
        self.ws: Any = None

    async def start(self) -> None:
        client = self.s.mx.mx
        self.ws = await client.subscribe(self.queue, PREFETCH)
        self.tasks.append(asyncio.create_task(client.ws_consumer(self.ws, self.sink)))
        self.tasks.append(asyncio.create_task(self._publish()))

    async def _publish(self) -> None:
        client = self.s.mx.mx
        http = await mx.RawHttp.open(client.port)
        try:
            seq = 0
            while True:
                seq += 1
                body = b'{"body":' + make_body(seq) + b"}"
                await http.send(client.post(f"/queues/{self.queue}/messages", body))
                self.published += 1
        finally:
            http.close()

    def sample(self) -> tuple[float, int, int]:
        for task in self.tasks:
            if task.done() and task.exception() is not None:
                raise BenchError(f"background load failed: {task.exception()!r}")
        return time.monotonic(), self.published, self.sink.received

    async def stop(self) -> None:
        await cancel_all(self.tasks)
        if self.ws is not None:
            await self.ws.close()


def _rates(a: tuple[float, int, int], b: tuple[float, int, int]) -> tuple[float, float]:
    elapsed = b[0] - a[0]
    return (b[1] - a[1]) / elapsed, (b[2] - a[2]) / elapsed


async def _timed(bg: Background, call: Any) -> tuple[float, Any, float, float]:
    """Run ``call`` (a REST request) and return its time, its answer and the background's
    publish and consume rates while it ran."""
    before = bg.sample()
    answer = await call
    after = bg.sample()
    publish_rate, consume_rate = _rates(before, after)
    return after[0] - before[0], answer, publish_rate, consume_rate


async def run(s: Settings) -> list[Result]:
    client = s.mx.mx
    source, target, busy = mx.unique("fo-src"), mx.unique("fo-dst"), mx.unique("fo-busy")
    for name in (source, target, busy):
        await client.call("PUT", f"/queues/{name}", {})
    conn = await asyncpg.connect(s.database_url, timeout=10)
    bg = Background(s, busy)
    try:
        source_id = await conn.fetchval("SELECT id FROM queues WHERE name = $1", source)
        await conn.execute(FILL, source_id, time.time_ns(), s.count, timeout=900)
        await conn.execute("ANALYZE messages", timeout=900)
        await bg.start()
        await asyncio.sleep(1.0)  # warm up: connections open, the consumer has credit
        start = bg.sample()
        await asyncio.sleep(BASELINE_S)
        base_publish, base_consume = _rates(start, bg.sample())
        if base_publish <= 0 or base_consume <= 0:
            raise BenchError("the background load did not run")
        path = f"/queues/{source}/messages"
        move = client.call(
            "POST", f"{path}/move", {"filter": FILTER, "to": target, "limit": s.count}
        )
        moved_s, moved, move_publish, move_consume = await _timed(bg, move)
        delete = client.call(
            "POST", f"/queues/{target}/messages/delete", {"filter": FILTER, "limit": s.count}
        )
        deleted_s, deleted, delete_publish, delete_consume = await _timed(bg, delete)
    finally:
        await bg.stop()
        await conn.close()
        for name in (source, target, busy):
            await client.delete_queue(name)
    ok = moved["moved"] == s.count and deleted["deleted"] == s.count
    results = []
    for name, elapsed, answer, publish, consume in (
        (f"mx move {s.count}", moved_s, moved, move_publish, move_consume),
        (f"mx delete {s.count}", deleted_s, deleted, delete_publish, delete_consume),
    ):
        result = Result(
            group="filterops",
            name=name,
            params={"copies": s.count, "not_matching": s.count // 4},
            status="ok" if ok else "wrong",
            messages=s.count if ok else 0,
            elapsed_s=round(elapsed, 3),
            rate=round(s.count / elapsed, 1),
        )
        result.extra = {
            "answer": answer,
            "background_publish_per_s": {
                "quiet": round(base_publish, 1),
                "during": round(publish, 1),
            },
            "background_consume_per_s": {
                "quiet": round(base_consume, 1),
                "during": round(consume, 1),
            },
            "publish_ratio": round(publish / base_publish, 2),
            "consume_ratio": round(consume / base_consume, 2),
        }
        results.append(result)
    return results
