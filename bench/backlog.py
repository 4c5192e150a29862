"""Backlog behaviour: claim latency with 0, 100 k and 1 M ready messages, in the same queue
as the consumer's and in another one.

The backlog goes straight into the messages table with one INSERT ... SELECT generate_series
(then ANALYZE, as autovacuum would soon do). Three probes per configuration, each ``probes``
times, one at a time: ``http-get`` — POST /queues/{q}/get with max_messages 1, timed to the
response (the ack follows, timed apart); ``sql-claim`` — the ceiling's claim statement alone
through asyncpg; ``ws-delivery`` — publish → WebSocket delivery, one message every 10 ms
(other-queue case only: in the same queue a consumer would get the backlog first).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from bench import ceiling, mx
from bench.stats import BenchError, Result, latency_summary, make_body, now_ns

FILL = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, available_at)
SELECT $1, 'backlog-' || g, '', $2, $3::bytea, now()
FROM generate_series($4::bigint, $5::bigint) AS g
"""

#: the backlog insert is one statement; it gets its own bound rather than the scenario's
FILL_TIMEOUT_S = 900


@dataclass
class Settings:
    mx: mx.Settings
    database_url: str
    sizes: list[int]
    probes: int


async def _queue_id(conn: Any, name: str) -> int:
    queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = $1", name)
    if queue_id is None:
        raise BenchError(f"queue {name} not found")
    return int(queue_id)


async def _fill(conn: Any, queue_id: int, queue: str, first: int, last: int) -> float:
    started = time.monotonic()
    body = make_body(-1)
    await conn.execute(FILL, queue_id, queue, body, first, last, timeout=FILL_TIMEOUT_S)
    await conn.execute("ANALYZE messages", timeout=FILL_TIMEOUT_S)
    return time.monotonic() - started


async def _http_get(client: mx.Mx, queue: str, probes: int, publish: bool) -> dict[str, Any]:
    gets: list[int] = []
    acks: list[int] = []
    request = orjson.dumps({"max_messages": 1})
    for i in range(probes):
        if publish:
            await client.publish_one(queue, i)
        t0 = now_ns()
        response = await client.http.post(f"/queues/{queue}/get", content=request, headers=mx.JSON)
        gets.append(now_ns() - t0)
        messages = orjson.loads(response.content).get("messages") if response.is_success else None
        if not messages:
            raise BenchError(f"get from {queue} → {response.status_code}: {response.text[:200]}")
        t1 = now_ns()
        ack = await client.http.post(f"/deliveries/{messages[0]['delivery_tag']}/ack")
        acks.append(now_ns() - t1)
        if ack.status_code != 204:
            raise BenchError(f"ack → {ack.status_code}")
    return {"latency": latency_summary(gets), "ack_ms": latency_summary(acks)}


async def _sql_claim(conn: Any, queue_id: int, queue: str, probes: int, publish: bool) -> Any:
    claims: list[int] = []
    owner = "00000000-0000-4000-8000-000000000001"
    for i in range(probes):
        if publish:
            await conn.execute(ceiling.INSERT, queue_id, queue, [f"p-{i}"], [make_body(i)])
        t0 = now_ns()
        rows = await conn.fetch(ceiling.CLAIM, queue_id, 1, owner)
        claims.append(now_ns() - t0)
        if not rows:
            raise BenchError(f"nothing to claim in {queue}")
        await conn.execute(ceiling.DELETE, [rows[0]["id"]], [rows[0]["delivery_tag"]])
    return {"latency": latency_summary(claims)}


def _result(size: int, where: str, probe: str, measured: dict[str, Any], **extra: Any) -> Result:
    result = Result(
        group="backlog",
        name=f"backlog {size:,} {where}: {probe}",
        params={"backlog": size, "where": where, "probe": probe},
        messages=(measured["latency"] or {}).get("n", 0),
        latency_ms=measured["latency"],
    )
    result.extra.update({k: v for k, v in measured.items() if k != "latency"}, **extra)
    return result


async def _probe(
    s: Settings, conn: Any, size: int, where: str, queue: str, queue_id: int
) -> list[Result]:
    publish = where != "same"
    http = await _http_get(s.mx.mx, queue, s.probes, publish)
    sql = await _sql_claim(conn, queue_id, queue, s.probes, publish)
    results = [_result(size, where, "http-get", http), _result(size, where, "sql-claim", sql)]
    if where != "same":
        ws = await mx.idle_latency(s.mx, s.probes)
        results.append(_result(size, where, "ws-delivery", {"latency": ws.latency_ms}))
    return results


async def run(s: Settings) -> list[Result]:
    probe_queue = mx.unique("backlog-probe")
    fill_queue = mx.unique("backlog-fill")
    await s.mx.mx.declare_queue(probe_queue)
    await s.mx.mx.declare_queue(fill_queue)
    conn = await asyncpg.connect(s.database_url, timeout=10)
    results: list[Result] = []
    try:
        probe_id = await _queue_id(conn, probe_queue)
        fill_id = await _queue_id(conn, fill_queue)
        inserted = 0
        for size in sorted(s.sizes):
            fill_s = 0.0
            if size > inserted:
                fill_s = await _fill(conn, fill_id, fill_queue, inserted + 1, size)
                inserted = size
            # Top up what the previous "same" probes consumed, so the backlog is `size`.
            ready = await conn.fetchval(
                "SELECT count(*) FROM messages WHERE queue_id = $1 AND status = 'ready'", fill_id
            )
            if ready < size:
                missing = size - ready
                fill_s += await _fill(conn, fill_id, fill_queue, inserted + 1, inserted + missing)
                inserted += missing
            where = "other" if size else "none"
            batch = await _probe(s, conn, size, where, probe_queue, probe_id)
            if size:
                batch += await _probe(s, conn, size, "same", fill_queue, fill_id)
            for result in batch:
                result.extra["fill_s"] = round(fill_s, 2)
            results += batch
    finally:
        await conn.close()
        # The filled queue is left to the end-of-run DROP DATABASE: deleting a million
        # rows here would only add minutes.
        await s.mx.mx.delete_queue(probe_queue)
    return results
