"""The raw-SQL ceiling: publish → claim → delete through asyncpg on MessageX's own schema.

The statements do what MessageX's storage layer does per message, with nothing around them:
one multi-row INSERT of a batch, the claim (UPDATE ... FOR UPDATE SKIP LOCKED over
ix_messages_claim, setting status, delivery tag, lease and owner, RETURNING the body), and
one DELETE of the claimed rows by (id, tag). Each statement commits on its own (autocommit),
as MessageX's publish, claim and ack transactions do. Every connection loops over its share:
insert a batch, claim up to a batch, delete what it claimed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench.infra import Meters
from bench.stats import (
    Result,
    Sink,
    cancel_all,
    chunks,
    make_body,
    now_ns,
    race,
    shares,
    throughput_result,
)

INSERT = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, available_at)
SELECT $1, m.message_id, '', $2, m.body, now()
FROM unnest($3::text[], $4::bytea[]) AS m(message_id, body)
"""

CLAIM = """
UPDATE messages AS m SET
    status = 'in_flight',
    delivery_count = m.delivery_count + 1,
    delivered_at = now(),
    lease_expires_at = now() + interval '30 seconds',
    delivery_tag = m.id::text || '.' || replace(gen_random_uuid()::text, '-', ''),
    owner_process = $3::uuid,
    owner_connection = $3::uuid
FROM (
    SELECT id FROM messages
    WHERE queue_id = $1 AND status = 'ready' AND available_at <= now()
    ORDER BY available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
) AS picked
WHERE m.id = picked.id
RETURNING m.id, m.delivery_tag, m.body
"""

DELETE = """
DELETE FROM messages AS m
USING unnest($1::bigint[], $2::text[]) AS a(id, tag)
WHERE m.id = a.id AND m.delivery_tag = a.tag AND m.status = 'in_flight'
"""


@dataclass
class Settings:
    database_url: str
    meters: Meters
    count: int
    deadline: float


async def scratch_queue(conn: Any, name: str) -> int:
    """A queue row of the real schema, for the ceiling's rows only (the broker never sees it:
    nothing subscribes to it)."""
    queue_id: int = await conn.fetchval("INSERT INTO queues (name) VALUES ($1) RETURNING id", name)
    return queue_id


class Worker:
    def __init__(self, conn: Any, queue_id: int, queue: str, batch: int, sink: Sink) -> None:
        self.conn = conn
        self.queue_id = queue_id
        self.queue = queue
        self.batch = batch
        self.sink = sink
        self.owner = str(uuid.uuid4())

    async def publish(self, seqs: Sequence[int]) -> None:
        ids = [f"c-{seq}" for seq in seqs]
        bodies = [make_body(seq) for seq in seqs]
        await self.conn.execute(INSERT, self.queue_id, self.queue, ids, bodies)

    async def claim(self) -> int:
        rows = await self.conn.fetch(CLAIM, self.queue_id, self.batch, self.owner)
        received = now_ns()
        for row in rows:
            self.sink.record_body(row["body"], received)
        if rows:
            await self.conn.execute(
                DELETE, [r["id"] for r in rows], [r["delivery_tag"] for r in rows]
            )
        return len(rows)

    async def run(self, seqs: range) -> None:
        for chunk in chunks(seqs, self.batch):
            await self.publish(chunk)
            await self.claim()
        # Drain what is left (rows other workers published); bounded by the scenario deadline.
        while not self.sink.done.is_set():
            if not await self.claim():
                await asyncio.sleep(0.001)


async def run(s: Settings, batch: int, connections: int) -> Result:
    name = f"ceiling batch={batch} connections={connections}"
    params = {"batch": batch, "connections": connections}
    conns = [
        await asyncpg.connect(s.database_url, timeout=10, statement_cache_size=100)
        for _ in range(connections)
    ]
    queue = f"ceiling-b{batch}-c{connections}-{uuid.uuid4().hex[:8]}"
    tasks: list[asyncio.Task[Any]] = []
    try:
        queue_id = await scratch_queue(conns[0], queue)
        sink = Sink(s.count)
        workers = [Worker(conn, queue_id, queue, batch, sink) for conn in conns]
        s.meters.start()
        started = now_ns()
        tasks = [
            asyncio.create_task(w.run(seqs))
            for w, seqs in zip(workers, shares(s.count, connections), strict=True)
        ]
        status = await race(sink.done, tasks, s.deadline)
        # Workers stop by themselves once everything is received; a cancelled statement
        # would leave its connection unusable for the clean-up.
        await asyncio.wait(tasks, timeout=10)
        s.meters.stop()
        result = throughput_result("ceiling", name, params, sink, started, status)
        result.cpu_s_per_1k = s.meters.per_1k(sink.received)
        return result
    finally:
        await cancel_all(tasks)
        for conn in conns:
            await close_quietly(conn)
        await drop_scratch_queue(s.database_url, queue)


async def close_quietly(conn: Any) -> None:
    try:
        await asyncio.wait_for(conn.close(), 5)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        conn.terminate()


async def drop_scratch_queue(database_url: str, queue: str) -> None:
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        await conn.execute("DELETE FROM queues WHERE name = $1", queue)
    finally:
        await conn.close()
