"""Issue 20 (contract §13), lc-limits: what a length limit and a priority cost.

- ``limits publish``: batch publishes (4 publishers, 100 per request, no consumer) into a
  plain queue and into one with ``x-max-length`` (count / 20) under ``drop-head``, full the
  whole time (every publish drops as many as it adds) — the figure is the publish rate; the target
  is the limited one within 20 % of the plain one. RabbitMQ beside it when reachable (durable
  queue, persistent messages, publisher confirms; the same ``x-max-length``).
- ``limits publish queue=dedup-window``: the same publishes into a queue with
  ``x-deduplication-window-seconds`` (contract §15): every message has a new broker-made
  message_id, so every copy claims its row and is stored — what the claim costs.
- ``limits ws``: the headline shape (batch publish → WebSocket prefetch 100 → ack) into a
  queue whose limit is never reached: what counting costs a limited queue that drops nothing.
- ``limits claim``: ``POST /queues/{q}/get`` (max_messages 1, then ack) from a queue holding a
  backlog (1,000,000 in full mode; smoke: 2,000), plain and with ``x-max-priority`` 9 and
  priorities 0-9 spread over the backlog; the target is priority within 2x of plain.
  RabbitMQ beside it (``basic.get``) when reachable, with the same backlog published.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

import asyncpg

from bench import mx
from bench.backlog import FILL_TIMEOUT_S, _http_get
from bench.stats import BenchError, Result, latency_summary, make_body, now_ns, shares

if TYPE_CHECKING:
    from bench.harness import Run

GROUP = "limits"


def full_limit(count: int) -> int:
    """The drop-head queue's limit in the publish scenario: full after the first requests."""
    return max(10, count // 20)


#: the limit of the ws scenario: never reached
ROOMY_LIMIT = 10_000_000
#: backlog of the claim scenarios (full, smoke); ``MX_BENCH_CLAIM_BACKLOG`` sets the full one
#: (RabbitMQ takes about 15 minutes to take 1,000,000 persistent messages on a loaded VM)
BACKLOG = (int(os.environ.get("MX_BENCH_CLAIM_BACKLOG", "1000000")), 2_000)

FILL = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body, available_at, priority)
SELECT $1, 'backlog-' || g, '', $2, $3::bytea, now(),
       CASE WHEN $4 THEN (g % 10)::smallint END
FROM generate_series(1, $5::bigint) AS g
"""


async def _declare(client: mx.Mx, name: str, arguments: dict[str, Any]) -> None:
    await client.call("PUT", f"/queues/{name}", {"arguments": arguments})
    body = {"exchange": mx.EXCHANGE, "queue": name, "routing_key": name}
    await client.call("POST", "/bindings", body)


def _rate_result(name: str, params: dict[str, Any], count: int, elapsed: float) -> Result:
    return Result(
        group=GROUP,
        name=name,
        params=params,
        messages=count,
        elapsed_s=round(elapsed, 4),
        rate=round(count / elapsed, 1) if elapsed else None,
    )


async def _publish_scenario(
    run: Run, label: str, arguments: dict[str, Any], params: dict[str, Any], expected: int
) -> Result:
    """Batch-publish the run's count into a new queue declared with ``arguments``, from
    ``publishers`` connections, metered; the rate, after checking that ``expected`` copies
    are ready."""
    s = run.mx_settings()
    queue = mx.unique("limits-" + label.rsplit(" ", 1)[-1])
    await _declare(s.mx, queue, arguments)
    try:
        s.meters.start()
        started = time.monotonic()
        await asyncio.wait_for(
            asyncio.gather(
                *(s.mx.publisher(queue, seqs, "batch") for seqs in shares(s.count, s.publishers))
            ),
            s.deadline,
        )
        elapsed = time.monotonic() - started
        s.meters.stop()
        stats = await s.mx.stats(queue)
        if stats["ready"] != expected:
            raise BenchError(f"{queue} holds {stats['ready']} ready, expected {expected}")
        result = _rate_result(
            f"limits mx publish=batch queue={label}",
            {"system": "messagex", "queue": label, "publishers": s.publishers, **params},
            s.count,
            elapsed,
        )
        result.cpu_s_per_1k = s.meters.per_1k(s.count)
        return result
    finally:
        await s.mx.delete_queue(queue)


async def mx_publish(run: Run, limited: bool) -> Result:
    count = run.cfg.count
    limit = full_limit(count)
    arguments = {"x-max-length": limit, "x-overflow": "drop-head"} if limited else {}
    label = "max-length drop-head" if limited else "plain"
    expected = min(count, limit) if limited else count
    return await _publish_scenario(run, label, arguments, {"limit": limit}, expected)


#: the window of the dedup publish scenario (longer than any run: no row expires meanwhile)
DEDUP_WINDOW_S = 3600


async def mx_publish_dedup(run: Run) -> Result:
    """Batch publishes into a queue with a deduplication window, nothing a duplicate."""
    arguments = {"x-deduplication-window-seconds": DEDUP_WINDOW_S}
    params = {"window_s": DEDUP_WINDOW_S}
    return await _publish_scenario(run, "dedup-window", arguments, params, run.cfg.count)


async def mx_ws(run: Run) -> Result:
    """The headline scenario into a limited queue that never drops."""
    s = run.mx_settings()
    original = s.mx.declare_queue

    async def declare(name: str) -> None:
        await _declare(s.mx, name, {"x-max-length": ROOMY_LIMIT})

    s.mx.declare_queue = declare  # type: ignore[method-assign]
    try:
        result = await mx.ws_throughput(s, "batch", 100)
    finally:
        s.mx.declare_queue = original  # type: ignore[method-assign]
    result.group = GROUP
    result.name = f"limits mx ws publish=batch prefetch=100 max-length={ROOMY_LIMIT}"
    return result


async def mx_claim(run: Run, priority: bool) -> Result:
    assert run.pg is not None
    s = run.mx_settings()
    size = BACKLOG[1 if run.cfg.smoke else 0]
    queue = mx.unique("limits-prio" if priority else "limits-backlog")
    await _declare(s.mx, queue, {"x-max-priority": 9} if priority else {})
    conn = await asyncpg.connect(run.pg.url, timeout=10)
    try:
        queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = $1", queue)
        started = time.monotonic()
        fill = [queue_id, queue, make_body(-1), priority, size]
        await conn.execute(FILL, *fill, timeout=FILL_TIMEOUT_S)
        await conn.execute("ANALYZE messages", timeout=FILL_TIMEOUT_S)
        fill_s = time.monotonic() - started
        measured = await _http_get(s.mx, queue, run.cfg.probes, publish=False)
        measured["sql_claim_ms"] = await _sql_claim(conn, queue_id, run.cfg.probes)
        label = "x-max-priority=9" if priority else "plain"
        result = Result(
            group=GROUP,
            name=f"limits mx claim backlog={size} queue={label}",
            params={"system": "messagex", "queue": label, "backlog": size, "probe": "http-get"},
            messages=(measured["latency"] or {}).get("n", 0),
            latency_ms=measured["latency"],
        )
        result.extra.update(
            ack_ms=measured["ack_ms"],
            sql_claim_ms=measured["sql_claim_ms"],
            fill_s=round(fill_s, 2),
        )
        return result
    finally:
        # The filled queue is left to the end-of-run DROP DATABASE (as bench/backlog.py
        # does): deleting a million rows would load the machine under the next scenario.
        await conn.close()


async def _sql_claim(conn: Any, queue_id: int, probes: int) -> dict[str, float] | None:
    """The broker's own claim statement (storage/queries.py CLAIM) alone, one row at a time,
    each deleted after: the claim's cost without HTTP and the event loop in between."""
    from app.storage import queries

    owner = "00000000-0000-4000-8000-000000000001"
    params = {
        "queue_id": queue_id,
        "n": 1,
        "lease_seconds": 30.0,
        "process_id": owner,
        "owners": [owner],
        "owner_user": None,
    }
    claims: list[int] = []
    for _ in range(probes):
        t0 = now_ns()
        rows = await conn.fetch(queries.CLAIM.sql, *queries.CLAIM.args(params))
        claims.append(now_ns() - t0)
        if not rows:
            raise BenchError("nothing to claim")
        await conn.execute("DELETE FROM messages WHERE id = $1", rows[0][1])
    return latency_summary(claims)


# -- RabbitMQ ---------------------------------------------------------------------------------


async def rabbit_publish(run: Run, limited: bool) -> Result:
    import aio_pika

    c = run.cfg
    conn = await aio_pika.connect(c.rabbitmq_url, timeout=10)
    queue = mx.unique("limits-full" if limited else "limits-plain")
    limit = full_limit(c.count)
    arguments: Any = {"x-max-length": limit, "x-overflow": "drop-head"} if limited else {}
    try:
        channel = await conn.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True, arguments=arguments)
        persistent = aio_pika.DeliveryMode.PERSISTENT

        async def publisher(seqs: range) -> None:
            ch = await conn.channel(publisher_confirms=True)
            for start in range(0, len(seqs), mx.BATCH):
                chunk = seqs[start : start + mx.BATCH]
                await asyncio.gather(
                    *(
                        ch.default_exchange.publish(
                            aio_pika.Message(make_body(seq), delivery_mode=persistent),
                            routing_key=queue,
                        )
                        for seq in chunk
                    )
                )
            await ch.close()

        started = time.monotonic()
        await asyncio.wait_for(
            asyncio.gather(*(publisher(seqs) for seqs in shares(c.count, c.publishers))),
            c.deadline,
        )
        elapsed = time.monotonic() - started
        label = "max-length drop-head" if limited else "plain"
        return _rate_result(
            f"limits rabbitmq publish=batch queue={label}",
            {"system": "rabbitmq", "queue": label, "limit": limit, "publishers": c.publishers},
            c.count,
            elapsed,
        )
    finally:
        channel = await conn.channel()
        await channel.queue_delete(queue)
        await conn.close()


async def rabbit_claim(run: Run, priority: bool) -> Result:
    import aio_pika

    c = run.cfg
    size = BACKLOG[1 if c.smoke else 0]
    conn = await aio_pika.connect(c.rabbitmq_url, timeout=10)
    queue = mx.unique("limits-prio" if priority else "limits-backlog")
    try:
        channel = await conn.channel(publisher_confirms=True)
        arguments: Any = {"x-max-priority": 9} if priority else {}
        q = await channel.declare_queue(queue, durable=True, arguments=arguments)
        persistent = aio_pika.DeliveryMode.PERSISTENT
        started = time.monotonic()
        for start in range(0, size, 1000):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(
                            make_body(g),
                            delivery_mode=persistent,
                            priority=g % 10 if priority else None,
                        ),
                        routing_key=queue,
                    )
                    for g in range(start, min(size, start + 1000))
                )
            )
        fill_s = time.monotonic() - started
        gets: list[int] = []
        for _ in range(c.probes):
            t0 = now_ns()
            message = await q.get(no_ack=False, fail=True)
            gets.append(now_ns() - t0)
            await message.ack()
        label = "x-max-priority=9" if priority else "plain"
        result = Result(
            group=GROUP,
            name=f"limits rabbitmq claim backlog={size} queue={label}",
            params={"system": "rabbitmq", "queue": label, "backlog": size, "probe": "basic.get"},
            messages=len(gets),
            latency_ms=latency_summary(gets),
        )
        result.extra["fill_s"] = round(fill_s, 2)
        return result
    finally:
        channel = await conn.channel()
        await channel.queue_delete(queue)
        await conn.close()


def add_ratios(results: list[Result]) -> None:
    """Each limited/priority scenario's figure against its plain twin (same system)."""
    by_name = {r.name: r for r in results if r.group == GROUP and r.status == "ok"}
    for r in list(by_name.values()):
        plain = None
        if "drop-head" in r.name or "dedup-window" in r.name:
            twin = r.name.replace("max-length drop-head", "plain").replace("dedup-window", "plain")
            plain = by_name.get(twin)
            if plain and plain.rate and r.rate:
                r.extra["rate_ratio_to_plain"] = round(r.rate / plain.rate, 3)
        elif "x-max-priority" in r.name:
            plain = by_name.get(r.name.replace("x-max-priority=9", "plain"))
            if plain and plain.latency_ms and r.latency_ms:
                r.extra["p50_ratio_to_plain"] = round(
                    r.latency_ms["p50"] / plain.latency_ms["p50"], 3
                )
            mine, theirs = r.extra.get("sql_claim_ms"), plain and plain.extra.get("sql_claim_ms")
            if mine and theirs:
                r.extra["sql_p50_ratio_to_plain"] = round(mine["p50"] / theirs["p50"], 3)


async def run(run: Run) -> None:
    rabbit = not run.rabbit_skipped
    for limited in (False, True):
        label = "max-length drop-head" if limited else "plain"
        await run.scenario(
            GROUP, f"limits mx publish=batch queue={label}", mx_publish(run, limited)
        )
        if rabbit:
            work = rabbit_publish(run, limited)
            await run.scenario(GROUP, f"limits rabbitmq publish=batch queue={label}", work)
    work = mx_publish_dedup(run)
    await run.scenario(GROUP, "limits mx publish=batch queue=dedup-window", work)
    await run.scenario(GROUP, "limits mx ws publish=batch prefetch=100", mx_ws(run))
    for priority in (False, True):
        label = "x-max-priority=9" if priority else "plain"
        await run.scenario(GROUP, f"limits mx claim queue={label}", mx_claim(run, priority))
        if rabbit:
            work = rabbit_claim(run, priority)
            await run.scenario(GROUP, f"limits rabbitmq claim queue={label}", work)
    add_ratios(run.results)
