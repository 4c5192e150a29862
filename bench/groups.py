"""Issue 22 (contract §16): what message groups cost the claim.

Three queues, each filled with the same backlog (1,000,000 copies by default, ``--backlog N``;
smoke: 2,000) straight into the messages table, side by side in one run:

- ``plain``: no ``x-message-groups`` (the baseline);
- ``groups=10000``: ``x-message-groups: true``, copies spread round-robin over 10,000 groups
  (the contract: within 2x of the plain queue);
- ``groups=10``: 10 groups, where at most 10 copies can be in flight and the group count is
  the limit.

Two probes per queue:

- ``ws``: ``--consumers`` WebSocket subscribers (prefetch 100) consume and ack ``--count`` x 10
  copies of the backlog (at most a quarter of it), for at most 15 s (smoke: 3 s); the figure
  is deliveries per second through the broker;
- ``sql``: the broker's own claim statement alone through asyncpg (``CLAIM``, or
  ``LOCK_GROUP_CLAIM`` + ``CLAIM_GROUPS`` in a transaction as the broker runs them), 100 rows a
  claim, each claim's rows deleted after the next claim (so up to 200 in flight), for 5 s or a
  quarter of the backlog: ms per claim and copies claimed per second.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import asyncpg
import orjson

from bench import mx
from bench.backlog import FILL_TIMEOUT_S
from bench.stats import BenchError, Result, cancel_all, latency_summary, make_body, now_ns, race

if TYPE_CHECKING:
    from bench.harness import Run

GROUP = "groups"
#: backlog per queue (full, smoke)
BACKLOG = (1_000_000, 2_000)
#: (label, groups): 0 is the plain queue
KINDS = (("plain", 0), ("groups=10000", 10_000), ("groups=10", 10))
PREFETCH = 100
#: rows per claim in the sql probe
SQL_N = 100
SQL_SECONDS = (5.0, 1.0)
#: how long the ws probe consumes at most (full, smoke)
WS_SECONDS = (15.0, 3.0)

FILL = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, available_at, group_id,
                      properties)
SELECT $1, 'backlog-' || g, '', $2, $3::bytea, now(),
       CASE WHEN $4 > 0 THEN 'g' || (g % $4) END,
       CASE WHEN $4 > 0 THEN jsonb_build_object('group_id', 'g' || (g % $4)) ELSE '{}' END
FROM generate_series(1, $5::bigint) AS g
"""


def backlog_of(run: Run) -> int:
    given = run.cfg.group_backlog
    return given if given is not None else BACKLOG[1 if run.cfg.smoke else 0]


async def _declare(client: mx.Mx, name: str, groups: int) -> None:
    arguments = {"x-message-groups": True} if groups else {}
    await client.call("PUT", f"/queues/{name}", {"arguments": arguments})


async def _prepare(run: Run, label: str, groups: int) -> tuple[str, int, float]:
    """Declare and fill one queue; (name, id, fill seconds)."""
    assert run.pg is not None
    s = run.mx_settings()
    queue = mx.unique(f"groups-{groups}")
    await _declare(s.mx, queue, groups)
    conn = await asyncpg.connect(run.pg.url, timeout=10)
    try:
        queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = $1", queue)
        started = time.monotonic()
        fill = [queue_id, queue, make_body(-1), groups, backlog_of(run)]
        await conn.execute(FILL, *fill, timeout=FILL_TIMEOUT_S)
        await conn.execute("ANALYZE messages", timeout=FILL_TIMEOUT_S)
        return queue, int(queue_id), time.monotonic() - started
    finally:
        await conn.close()


async def _consume(ws: Any, counter: list[int], wanted: int, done: asyncio.Event) -> None:
    """Ack every delivery; count them; set ``done`` at ``wanted``."""

    def on_text(raw: bytes) -> None:
        frame = orjson.loads(raw)
        if frame.get("type") != "MESSAGE_DELIVERED":
            if frame.get("type") == "ERROR":
                raise BenchError(f"broker sent {frame}")
            return
        counter[0] += 1
        if counter[0] >= wanted:
            done.set()
        ws.send_text(b'{"type":"ACK","delivery_tag":"%s"}' % frame["delivery_tag"].encode())

    await ws.serve(on_text)


async def ws_probe(run: Run, label: str, groups: int, queue: str, fill_s: float) -> Result:
    s = run.mx_settings()
    wanted = min(s.count * 10, backlog_of(run) // 4)
    sockets = [await s.mx.subscribe(queue, PREFETCH) for _ in range(s.consumers)]
    counter = [0]
    done = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    try:
        before = await mx._counters_before(s)
        s.meters.start()
        started = time.monotonic()
        tasks = [asyncio.create_task(_consume(ws, counter, wanted, done)) for ws in sockets]
        limit = min(s.deadline, WS_SECONDS[1 if run.cfg.smoke else 0])
        status = await race(done, tasks, limit)
        if status == "timeout" and counter[0]:
            status = "ok"  # the probe's time is up: the rate so far is the figure
        elapsed = time.monotonic() - started
        s.meters.stop()
        batching = await mx._batching(s, before)
    finally:
        await cancel_all(tasks)
        for ws in sockets:
            await ws.close()
    result = Result(
        group=GROUP,
        name=f"groups mx ws backlog={backlog_of(run)} queue={label}",
        params={"queue": label, "groups": groups, "backlog": backlog_of(run), "probe": "ws"},
        status=status,
        messages=counter[0],
        elapsed_s=round(elapsed, 3),
        rate=round(counter[0] / elapsed, 1) if elapsed else None,
    )
    result.cpu_s_per_1k = s.meters.per_1k(counter[0])
    result.extra.update(fill_s=round(fill_s, 2), consumers=s.consumers, prefetch=PREFETCH)
    result.extra.update(batching)
    return result


async def sql_probe(run: Run, label: str, groups: int, queue_id: int) -> Result:
    """The claim statement alone, as the broker runs it for this queue."""
    from app.storage import queries

    assert run.pg is not None
    seconds = SQL_SECONDS[1 if run.cfg.smoke else 0]
    owner = "00000000-0000-4000-8000-000000000001"
    params = {
        "queue_id": queue_id,
        "n": SQL_N,
        "lease_seconds": 60.0,
        "process_id": owner,
        "owners": None,
        "owner_user": "bench",
        "scan": 4 * SQL_N + 128,
    }
    claim = queries.CLAIM_GROUPS if groups else queries.CLAIM
    lock = queries.LOCK_GROUP_CLAIM
    conn = await asyncpg.connect(run.pg.url, timeout=10)
    times: list[int] = []
    claimed = 0
    held: list[int] = []
    try:
        started = time.monotonic()
        while time.monotonic() - started < seconds and claimed < backlog_of(run) // 4:
            t0 = now_ns()
            async with conn.transaction():
                if groups:
                    await conn.fetch(lock.sql, *lock.args(params))
                rows = await conn.fetch(claim.sql, *claim.args(params))
            times.append(now_ns() - t0)
            claimed += len(rows)
            if held:
                await conn.execute("DELETE FROM messages WHERE id = ANY($1::bigint[])", held)
            held = [r[1] for r in rows]
            if not rows and not groups:
                raise BenchError("nothing to claim")
        elapsed = time.monotonic() - started
    finally:
        await conn.close()
    result = Result(
        group=GROUP,
        name=f"groups sql claim backlog={backlog_of(run)} queue={label}",
        params={"queue": label, "groups": groups, "backlog": backlog_of(run), "probe": "sql"},
        messages=claimed,
        elapsed_s=round(elapsed, 3),
        rate=round(claimed / elapsed, 1) if elapsed else None,
        latency_ms=latency_summary(times),
    )
    result.extra["copies_per_claim"] = round(claimed / len(times), 1) if times else 0
    return result


def add_ratios(results: list[Result]) -> None:
    """Each group queue's rate against the plain queue's, per probe."""
    by_name = {r.name: r for r in results if r.group == GROUP and r.status == "ok"}
    for r in by_name.values():
        if "queue=plain" in r.name:
            continue
        plain = by_name.get(r.name.split(" queue=")[0] + " queue=plain")
        if plain and plain.rate and r.rate:
            r.extra["rate_ratio_to_plain"] = round(r.rate / plain.rate, 3)
        if plain and plain.latency_ms and r.latency_ms:
            r.extra["p50_ratio_to_plain"] = round(r.latency_ms["p50"] / plain.latency_ms["p50"], 3)


async def run(run: Run) -> None:
    prepared: list[tuple[str, int, str, int, float]] = []
    for label, groups in KINDS:
        queue, queue_id, fill_s = await _prepare(run, label, groups)
        prepared.append((label, groups, queue, queue_id, fill_s))
    # all filled before any is measured: every probe sees the same table; each probe takes
    # at most a quarter of a queue's backlog
    for label, groups, queue, _, fill_s in prepared:
        work = ws_probe(run, label, groups, queue, fill_s)
        await run.scenario(GROUP, f"groups mx ws queue={label}", work)
    for label, groups, _, queue_id, _ in prepared:
        work = sql_probe(run, label, groups, queue_id)
        await run.scenario(GROUP, f"groups sql claim queue={label}", work)
    add_ratios(run.results)
