"""Issue 21 (contract §18): what publishing from SQL, inside the application's transaction,
costs beside the REST publish and the raw-SQL ceiling — side by side, in one run.

Every scenario publishes ``count`` 1 KiB messages through the direct exchange ``bench.direct``
into one queue (no consumer), from ``publishers`` concurrent clients:

- ``sqlpublish rest single`` / ``rest batch=100``: ``POST /exchanges/{x}/publish`` (one
  message per request) and ``publish-batch`` (100), over raw keep-alive HTTP (``RawHttp``);
- ``sqlpublish sql single``: ``SELECT messagex.publish(...)`` on its own (one transaction, one
  commit per message), one asyncpg connection per publisher;
- ``sqlpublish sql batch=100``: 100 ``messagex.publish`` calls in one transaction (pipelined
  with ``executemany``), as an application publishing a batch of events with its own writes;
- ``sqlpublish raw single`` / ``raw batch=100``: the ceiling — a plain ``INSERT INTO
  messages`` of the same row (queue id known, no routing, no validation, no NOTIFY), one per
  transaction and 100 per transaction.

And the wake-up: ``sqlpublish sql idle``, one ``messagex.publish`` every 10 ms to a subscribed
WebSocket consumer (prefetch 1): commit to delivery, beside ``sqlpublish mx idle`` (REST).

Ratios (in each result's ``extra``): SQL to REST and SQL to raw, at the same batch size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import asyncpg

from bench import mx
from bench.stats import BenchError, Result, chunks, make_body, shares

if TYPE_CHECKING:
    from bench.harness import Run

GROUP = "sqlpublish"
BATCH = mx.BATCH

PUBLISH = "SELECT messagex.publish($1, $2, $3::text::jsonb)"
RAW_INSERT = """
INSERT INTO messages (queue_id, message_id, exchange, routing_key, body)
VALUES ($1, gen_random_uuid()::text, $2, $3, $4)
"""

#: publish(connection or http, queue, queue id, seqs) of one publisher
Publisher = Callable[[Any, str, int, range], Awaitable[None]]


async def _rest(http: mx.RawHttp, client: mx.Mx, queue: str, seqs: range, batch: int) -> None:
    key = b'{"routing_key":"' + queue.encode() + b'","body":'
    if batch == 1:
        for seq in seqs:
            body = key + make_body(seq) + b"}"
            await http.send(client.post(f"/exchanges/{mx.EXCHANGE}/publish", body))
        return
    for chunk in chunks(seqs, batch):
        items = b",".join(key + make_body(seq) + b"}" for seq in chunk)
        body = b'{"messages":[' + items + b"]}"
        await http.send(client.post(f"/exchanges/{mx.EXCHANGE}/publish-batch", body))


async def _sql(conn: asyncpg.Connection, queue: str, seqs: range, batch: int) -> None:
    if batch == 1:
        for seq in seqs:
            await conn.fetchval(PUBLISH, mx.EXCHANGE, queue, make_body(seq).decode())
        return
    for chunk in chunks(seqs, batch):
        rows = [(mx.EXCHANGE, queue, make_body(seq).decode()) for seq in chunk]
        async with conn.transaction():
            await conn.executemany(PUBLISH, rows)


async def _raw(
    conn: asyncpg.Connection, queue: str, queue_id: int, seqs: range, batch: int
) -> None:
    if batch == 1:
        for seq in seqs:
            await conn.execute(RAW_INSERT, queue_id, mx.EXCHANGE, queue, make_body(seq))
        return
    for chunk in chunks(seqs, batch):
        rows = [(queue_id, mx.EXCHANGE, queue, make_body(seq)) for seq in chunk]
        async with conn.transaction():
            await conn.executemany(RAW_INSERT, rows)


async def scenario(run: Run, way: str, batch: int) -> Result:
    assert run.pg is not None
    s = run.mx_settings()
    queue = mx.unique(f"sqlpub-{way}")
    await s.mx.declare_queue(queue)
    parts = shares(s.count, s.publishers)
    conns: list[asyncpg.Connection] = []
    https: list[mx.RawHttp] = []
    try:
        if way == "rest":
            https = [await mx.RawHttp.open(s.mx.port) for _ in parts]
        else:
            conns = [await asyncpg.connect(run.pg.url, timeout=10) for _ in parts]
        queue_id = 0
        if conns:
            queue_id = await conns[0].fetchval("SELECT id FROM queues WHERE name = $1", queue)

        def work(index: int, seqs: range) -> Awaitable[None]:
            if way == "rest":
                return _rest(https[index], s.mx, queue, seqs, batch)
            if way == "sql":
                return _sql(conns[index], queue, seqs, batch)
            return _raw(conns[index], queue, queue_id, seqs, batch)

        s.meters.start()
        started = time.monotonic()
        await asyncio.wait_for(
            asyncio.gather(*(work(i, seqs) for i, seqs in enumerate(parts))), s.deadline
        )
        elapsed = time.monotonic() - started
        s.meters.stop()
        stats = await s.mx.stats(queue)
        if stats["ready"] != s.count:
            raise BenchError(f"{queue} holds {stats['ready']} ready, expected {s.count}")
        label = "single" if batch == 1 else f"batch={batch}"
        result = Result(
            group=GROUP,
            name=f"sqlpublish {way} {label}",
            params={"way": way, "batch": batch, "publishers": s.publishers},
            messages=s.count,
            elapsed_s=round(elapsed, 4),
            rate=round(s.count / elapsed, 1) if elapsed else None,
        )
        result.cpu_s_per_1k = s.meters.per_1k(s.count)
        return result
    finally:
        for http in https:
            http.close()
        for conn in conns:
            await conn.close()
        await s.mx.delete_queue(queue)


async def idle(run: Run) -> Result:
    """Commit of a ``messagex.publish`` → delivery to a subscribed WebSocket consumer."""
    assert run.pg is not None
    conn = await asyncpg.connect(run.pg.url, timeout=10)

    async def via(queue: str, seq: int) -> None:
        await conn.fetchval(PUBLISH, mx.EXCHANGE, queue, make_body(seq).decode())

    try:
        result = await mx.idle_latency(
            run.mx_settings(),
            run.cfg.idle_count,
            via=via,
            name="sqlpublish sql idle",
            group=GROUP,
        )
    finally:
        await conn.close()
    result.group = GROUP
    return result


def add_ratios(results: list[Result]) -> None:
    """SQL to REST and SQL to raw (rate, and CPU per 1,000 of broker + PostgreSQL), per batch
    size, of the latest results of this group."""
    found: dict[tuple[str, int], Result] = {}
    for r in results:
        if r.group == GROUP and r.status == "ok" and "way" in r.params:
            found[r.params["way"], r.params["batch"]] = r
    for (way, batch), mine in found.items():
        if way != "sql":
            continue
        for base in ("rest", "raw"):
            other = found.get((base, batch))
            if other is None or not other.rate or not mine.rate:
                continue
            mine.extra[f"rate_ratio_to_{base}"] = round(mine.rate / other.rate, 3)
            cpu_mine = _server_cpu(mine)
            cpu_other = _server_cpu(other)
            if cpu_mine and cpu_other:
                mine.extra[f"cpu_ratio_to_{base}"] = round(cpu_mine / cpu_other, 3)


def _server_cpu(r: Result) -> float | None:
    cpu = r.cpu_s_per_1k
    postgres = cpu.get("postgres")
    if postgres is None:
        return None
    return float(cpu.get("broker") or 0.0) + float(postgres)


async def run(run: Run) -> None:
    for batch in (1, BATCH):
        for way in ("rest", "sql", "raw"):
            label = "single" if batch == 1 else f"batch={batch}"
            await run.scenario(GROUP, f"sqlpublish {way} {label}", scenario(run, way, batch))
    await run.scenario(GROUP, "sqlpublish sql idle", idle(run))
    await run.scenario(
        GROUP,
        "sqlpublish mx idle",
        mx.idle_latency(
            run.mx_settings(), run.cfg.idle_count, name="sqlpublish mx idle", group=GROUP
        ),
    )
    add_ratios(run.results)
    for r in run.results:
        if r.group == GROUP and any(k.startswith("rate_ratio") for k in r.extra):
            ratios = {k: v for k, v in r.extra.items() if "ratio" in k}
            print(f"  {r.name}: {ratios}", flush=True)
