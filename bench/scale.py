"""Cost that grows with work, not with resources (issue 19): publish latency against
exchanges of 10 to 100,000 bindings, beside RabbitMQ's; declaring many queues; a queue list
page and the overview with many queues and messages.

- ``bindings`` (topic, direct; headers apart): one exchange per size with ``n - 1``
  bindings that do not match (inserted with one SQL statement, over 10 sink queues) and one
  that does, to the probe queue (made through the API). Sequential publishes, each timed to
  its confirm (200 / basic.ack): p50/p99, and the ratio to the 10-binding exchange of the
  same type (``extra.p50_ratio_to_10``). RabbitMQ gets the same bindings (its binds are
  made through AMQP, 16 channels at once) and the same publishes (aio-pika, confirms).
- ``declare queues=N``: N queues declared and each bound to a topic exchange through the
  API, 8 clients at once; the wall time.
- ``list queues=N``: the queues of ``declare`` topped up to N with one SQL statement, then
  ``GET /queues`` pages (100 queues with their stats): the first page and pages from a
  cursor in the middle.
- ``overview messages=M queues=Q``: M ready messages spread over the first Q queues (one SQL
  statement, then VACUUM ANALYZE as autovacuum would), then ``GET /overview``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from bench import mx
from bench.infra import Meters
from bench.stats import BenchError, Result, latency_summary, now_ns

#: the non-matching bindings of each exchange go to this many sink queues
SINKS = 10
#: concurrent API clients declaring queues, and AMQP channels binding
DECLARERS = 8
RABBIT_BINDERS = 16
WARMUP = 5

_KEYS = {
    # (SQL for the routing key of non-matching binding g, the probe's binding key, the
    # publish's routing key)
    "topic": (
        "CASE g % 3 WHEN 0 THEN 's' || g || '.*' WHEN 1 THEN 's' || g || '.#' "
        "ELSE 's' || g || '.x.*' END",
        "probe.*",
        "probe.x",
    ),
    "direct": ("'d' || g", "probe", "probe"),
    "headers": ("''", "", ""),
}
_HEADERS_ARGUMENTS = "jsonb_build_object('id', g, 'kind', 'x')"
_PROBE_HEADERS: dict[str, Any] = {"id": "probe", "kind": "x"}


def _python_key(kind: str, g: int) -> str:
    """The same keys as _KEYS' SQL, for RabbitMQ."""
    if kind == "topic":
        return (f"s{g}.*", f"s{g}.#", f"s{g}.x.*")[g % 3]
    return f"d{g}" if kind == "direct" else ""


@dataclass
class Settings:
    mx: mx.Mx
    database_url: str
    rabbitmq_url: str | None  # None: RabbitMQ is skipped
    binding_sizes: list[int]
    headers_sizes: list[int]
    probes: int
    declare_queues: int
    list_queues: int
    overview_messages: int
    overview_queues: int
    deadline: float
    #: CPU of the broker, PostgreSQL and this client, for the declare scenario
    meters: Meters | None = None


# ----------------------------------------------------------------------------- bindings


async def _mx_exchange(s: Settings, conn: Any, kind: str, n: int, probe: str) -> str:
    """An exchange of ``kind`` with n - 1 non-matching bindings and one to ``probe``."""
    client = s.mx
    name = mx.unique(f"scale.{kind}.{n}")
    await client.call("PUT", f"/exchanges/{name}", {"type": kind})
    sinks = [mx.unique("scale-sink") for _ in range(SINKS)]
    for sink in sinks:
        await client.call("PUT", f"/queues/{sink}", {})
    sink_ids = await conn.fetchval(
        "SELECT array_agg(id ORDER BY id) FROM queues WHERE name = ANY($1::text[])", sinks
    )
    exchange_id = await conn.fetchval("SELECT id FROM exchanges WHERE name = $1", name)
    key_sql, probe_key, _ = _KEYS[kind]
    arguments = _HEADERS_ARGUMENTS if kind == "headers" else "'{}'::jsonb"
    # Straight into the table: 100,000 binds through the API would take minutes. The probe's
    # bind below goes through the API after it, so the exchange's routing version moves on.
    await conn.execute(
        f"""
        INSERT INTO bindings (exchange_id, queue_id, routing_key, arguments)
        SELECT $1, ($2::bigint[])[1 + g % {SINKS}], {key_sql}, {arguments}
        FROM generate_series(1, $3::bigint) AS g
        """,
        exchange_id,
        sink_ids,
        n - 1,
        timeout=s.deadline,
    )
    await conn.execute("ANALYZE bindings")
    body: dict[str, Any] = {"exchange": name, "queue": probe, "routing_key": probe_key}
    if kind == "headers":
        body["arguments"] = {"id": "probe"}
    await client.call("POST", "/bindings", body)
    return name


async def _timed(call: Callable[[], Awaitable[None]], probes: int) -> tuple[list[int], float]:
    """(latencies of ``probes`` calls after WARMUP, the first call's ms: the cold one)."""
    t0 = now_ns()
    await call()
    first_ms = (now_ns() - t0) / 1e6
    for _ in range(WARMUP - 1):
        await call()
    samples: list[int] = []
    for _ in range(probes):
        t0 = now_ns()
        await call()
        samples.append(now_ns() - t0)
    return samples, first_ms


async def _mx_publishes(s: Settings, kind: str, exchange: str, probe: str) -> Any:
    _, _, routing_key = _KEYS[kind]
    payload: dict[str, Any] = {"routing_key": routing_key, "body": {"scale": True}}
    if kind == "headers":
        payload["headers"] = _PROBE_HEADERS
    http = await mx.RawHttp.open(s.mx.port)
    request = s.mx.post(f"/exchanges/{exchange}/publish", orjson.dumps(payload))

    async def publish() -> None:
        answer = orjson.loads(await http.send(request))
        if answer["queues"] != [probe]:
            raise BenchError(f"publish to {exchange} routed to {answer['queues'][:5]}")

    try:
        return await _timed(publish, s.probes)
    finally:
        http.close()


async def mx_bindings(s: Settings, kind: str, n: int) -> Result:
    conn = await asyncpg.connect(s.database_url, timeout=10)
    probe = mx.unique("scale-probe")
    await s.mx.call("PUT", f"/queues/{probe}", {})
    try:
        started = time.monotonic()
        exchange = await _mx_exchange(s, conn, kind, n, probe)
        setup_s = time.monotonic() - started
        samples, first_ms = await _mx_publishes(s, kind, exchange, probe)
        await s.mx.call("DELETE", f"/exchanges/{exchange}")
    finally:
        await conn.close()
        await s.mx.delete_queue(probe)
    return _binding_result("mx", kind, n, samples, first_ms, setup_s)


async def rabbit_bindings(s: Settings, kind: str, n: int) -> Result:
    import aio_pika

    assert s.rabbitmq_url is not None
    conn = await aio_pika.connect(s.rabbitmq_url, timeout=10)
    try:
        channel = await conn.channel(publisher_confirms=True)
        probe = await channel.declare_queue(mx.unique("scale-probe"), durable=True)
        sinks = [
            await channel.declare_queue(mx.unique("scale-sink"), durable=True) for _ in range(SINKS)
        ]
        binders = []  # per binding channel, its handle of each sink queue
        for _ in range(RABBIT_BINDERS):
            chan = await conn.channel()
            binders.append([await chan.get_queue(sink.name, ensure=False) for sink in sinks])
        started = time.monotonic()
        name = mx.unique(f"scale.{kind}.{n}")
        exchange = await channel.declare_exchange(name, kind, durable=True)

        async def bind_share(i: int) -> None:
            queues = binders[i]
            for g in range(1 + i, n, RABBIT_BINDERS):
                arguments: Any = {"id": g, "kind": "x", "x-match": "all"}
                await queues[g % SINKS].bind(
                    name,
                    routing_key=_python_key(kind, g),
                    arguments=arguments if kind == "headers" else None,
                )

        await asyncio.gather(*(bind_share(i) for i in range(RABBIT_BINDERS)))
        _, probe_key, routing_key = _KEYS[kind]
        probe_arguments: Any = {"id": "probe", "x-match": "all"}
        arguments = probe_arguments if kind == "headers" else None
        await probe.bind(exchange, routing_key=probe_key, arguments=arguments)
        setup_s = time.monotonic() - started
        message = aio_pika.Message(
            b'{"scale":true}',
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers=_PROBE_HEADERS if kind == "headers" else None,
        )

        async def publish() -> None:
            await exchange.publish(message, routing_key=routing_key, mandatory=True)

        samples, first_ms = await _timed(publish, s.probes)
        await exchange.delete()
        for queue in [probe, *sinks]:
            await queue.delete(if_unused=False, if_empty=False)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 10)
    return _binding_result("rabbitmq", kind, n, samples, first_ms, setup_s)


def _binding_result(
    broker: str, kind: str, n: int, samples: list[int], first_ms: float, setup_s: float
) -> Result:
    result = Result(
        group="scale",
        name=f"{broker} {kind} bindings={n}",
        params={"broker": broker, "kind": kind, "bindings": n},
        messages=len(samples),
        latency_ms=latency_summary(samples),
    )
    result.extra.update(first_publish_ms=round(first_ms, 2), setup_s=round(setup_s, 2))
    return result


def add_ratios(results: list[Result]) -> None:
    """p50 and p99 of each binding result over those of the smallest exchange of the same
    broker and type (10 bindings), in ``extra``."""
    series: dict[tuple[str, str], list[Result]] = {}
    for result in results:
        if result.status == "ok" and "bindings" in result.params:
            series.setdefault((result.params["broker"], result.params["kind"]), []).append(result)
    for group in series.values():
        base = min(group, key=lambda r: r.params["bindings"])
        smallest = base.params["bindings"]
        for result in group:
            for which in ("p50", "p99"):
                mine = (result.latency_ms or {}).get(which)
                theirs = (base.latency_ms or {}).get(which)
                if mine is not None and theirs:
                    result.extra[f"{which}_ratio_to_{smallest}"] = round(mine / theirs, 2)


# ----------------------------------------------------------------------------- resources


async def declare_queues(s: Settings, n: int) -> Result:
    """n queues declared and bound through the API by DECLARERS clients at once, each over
    a keep-alive connection of its own (RawHttp: httpx's client spent more CPU per request
    than the broker, on the same two cores). CPU per declare + bind pair, by process, in
    ``extra.cpu_ms_per_pair``."""
    exchange = mx.unique("scale.declare")
    await s.mx.call("PUT", f"/exchanges/{exchange}", {"type": "topic"})
    names = [f"scale-q-{i:07d}" for i in range(n)]
    durations: list[int] = []

    async def declarer(share: list[str]) -> None:
        http = await mx.RawHttp.open(s.mx.port)
        try:
            for name in share:
                bind = orjson.dumps(
                    {"exchange": exchange, "queue": name, "routing_key": f"{name}.#"}
                )
                declare = s.mx.raw("PUT", f"/queues/{name}", b"{}")
                t0 = now_ns()
                await http.send(declare, expect=201)
                await http.send(s.mx.raw("POST", "/bindings", bind), expect=201)
                durations.append(now_ns() - t0)
        finally:
            http.close()

    if s.meters is not None:
        s.meters.start()
    started = time.monotonic()
    try:
        await asyncio.gather(*(declarer(names[i::DECLARERS]) for i in range(DECLARERS)))
    finally:
        elapsed = time.monotonic() - started
        if s.meters is not None:
            s.meters.stop()
    extra: dict[str, Any] = {
        "what": "latency: one PUT /queues + POST /bindings; elapsed: all of them"
    }
    if s.meters is not None:
        # CPU seconds per 1,000 pairs = CPU milliseconds per pair
        extra["cpu_ms_per_pair"] = s.meters.per_1k(n)
    return Result(
        group="scale",
        name=f"mx declare queues={n}",
        params={"broker": "mx", "declare_queues": n},
        messages=n,
        elapsed_s=round(elapsed, 2),
        rate=round(n / elapsed, 1),
        latency_ms=latency_summary(durations),
        extra=extra,
    )


async def _get_timed(s: Settings, path: str, probes: int) -> list[int]:
    samples: list[int] = []
    for i in range(probes + WARMUP):
        t0 = now_ns()
        response = await s.mx.http.get(path)
        if response.status_code != 200:
            raise BenchError(f"GET {path} → {response.status_code}: {response.text[:200]}")
        if i >= WARMUP:
            samples.append(now_ns() - t0)
    return samples


async def list_queues(s: Settings, n: int) -> list[Result]:
    conn = await asyncpg.connect(s.database_url, timeout=10)
    try:
        # the names declare_queues used: those it made are kept
        await conn.execute(
            """
            INSERT INTO queues (name)
            SELECT 'scale-q-' || lpad(g::text, 7, '0') FROM generate_series(0, $1 - 1) AS g
            ON CONFLICT DO NOTHING
            """,
            n,
            timeout=max(s.deadline, 600),
        )
        await conn.execute("ANALYZE queues")
        total = await conn.fetchval("SELECT count(*) FROM queues")
        middle = f"scale-q-{n // 2:07d}"
    finally:
        await conn.close()
    results = []
    for where, path in (("first", "/queues"), ("middle", f"/queues?after={middle}")):
        samples = await _get_timed(s, path, s.probes)
        results.append(
            Result(
                group="scale",
                name=f"mx list queues={n} page={where}",
                params={"broker": "mx", "list_queues": n, "page": where},
                messages=len(samples),
                latency_ms=latency_summary(samples),
                extra={"queues_in_table": total},
            )
        )
    return results


async def overview(s: Settings, messages: int, queues: int) -> Result:
    conn = await asyncpg.connect(s.database_url, timeout=10)
    try:
        ids = await conn.fetchval(
            "SELECT array_agg(id) FROM (SELECT id FROM queues ORDER BY id LIMIT $1) AS q", queues
        )
        if not ids or len(ids) < queues:
            raise BenchError(f"{queues} queues needed; run list queues first")
        started = time.monotonic()
        await conn.execute(
            """
            INSERT INTO messages (queue_id, message_id, exchange, routing_key, body)
            SELECT ($1::bigint[])[1 + g % cardinality($1::bigint[])], 'scale-' || g, '', 'k',
                   '\\x7b7d'::bytea
            FROM generate_series(1, $2::bigint) AS g
            """,
            ids,
            messages,
            timeout=max(s.deadline, 600),
        )
        await conn.execute("VACUUM ANALYZE messages", timeout=max(s.deadline, 600))
        fill_s = time.monotonic() - started
        total = await conn.fetchval("SELECT count(*) FROM messages")
    finally:
        await conn.close()
    samples = await _get_timed(s, "/overview", s.probes)
    return Result(
        group="scale",
        name=f"mx overview messages={messages} queues={queues}",
        params={"broker": "mx", "overview_messages": messages, "overview_queues": queues},
        messages=len(samples),
        latency_ms=latency_summary(samples),
        extra={"fill_s": round(fill_s, 1), "messages_in_table": total},
    )
