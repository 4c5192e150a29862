"""Issue 23, item 3: MessageX behind PgBouncer in transaction mode, beside direct, in one run.

The run's broker (direct to PostgreSQL) and a second ``messagex serve`` on the same database
whose DATABASE_URL is a PgBouncer (bench/pgbouncer.py, ``pool_mode = transaction``) started
with ``MESSAGEX_DATABASE_POOL_MODE=transaction`` and ``MESSAGEX_LISTEN_DATABASE_URL`` direct.
Each scenario runs on the direct broker, then on the pooled one: the headline (batch publish
→ WebSocket prefetch 100 → an ACK each), single publishes at prefetch 10 (a statement per
message: what each statement's extra round trip costs), and the idle latency. The pooled rows
carry ``extra.rate_ratio_to_direct`` / ``p50_ratio_to_direct``; their CPU includes
PgBouncer's (``cpu_s_per_1k.pgbouncer``).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from bench import mx
from bench.infra import BrokerProcess, tree_sample
from bench.pgbouncer import MISSING, PgBouncer
from bench.stats import BenchError, Result, scenario_name

if TYPE_CHECKING:
    from bench.harness import Run

GROUP = "pooler"
#: (publish mode, prefetch) of the WebSocket scenarios; the first is the headline
WS_SCENARIOS = (("batch", 100), ("single", 10))
VIAS = ("direct", "pgbouncer-transaction")


async def run(r: Run) -> None:
    assert r.pg is not None
    assert r.broker is not None
    assert r.client is not None
    if MISSING is not None:
        raise BenchError(MISSING)
    c = r.cfg
    with PgBouncer.in_front_of(r.pg.url, "transaction") as bouncer:
        pooled = BrokerProcess(
            bouncer.url_for(r.pg.url),
            user=r.broker.user,
            password=r.broker.password,
            workers=c.workers,
            extra_env={
                **c.broker_env,
                "MESSAGEX_DATABASE_POOL_MODE": "transaction",
                "MESSAGEX_LISTEN_DATABASE_URL": r.pg.url,
            },
        )
        await pooled.start()
        client = mx.Mx(pooled.base_url, pooled.ws_url, pooled.user, pooled.password)
        try:
            await client.setup()
            brokers = {VIAS[0]: (r.broker, r.client), VIAS[1]: (pooled, client)}
            results: dict[str, Result] = {}

            def settings(via: str) -> mx.Settings:
                broker, mx_client = brokers[via]
                meters = r.mx_meters(broker)
                if via != "direct" and bouncer.proc is not None:
                    pid = bouncer.proc.pid
                    meters.samplers["pgbouncer"] = lambda: tree_sample(pid)
                return mx.Settings(
                    mx_client, meters, c.count, c.publishers, c.consumers, c.deadline, c.workers
                )

            for mode, prefetch in WS_SCENARIOS:
                for via in VIAS:
                    name = f"pooler {scenario_name('ws', mode, prefetch, 'each')} via={via}"
                    work = mx.ws_throughput(settings(via), mode, prefetch)
                    await r.scenario(GROUP, name, _named(name, work, results))
            for via in VIAS:
                name = f"pooler idle 1 msg/10 ms via={via}"
                work = mx.idle_latency(settings(via), c.idle_count)
                await r.scenario(GROUP, name, _named(name, work, results))
            _compare(results)
        finally:
            await client.close()
            await pooled.stop()
            pooled.cleanup()


async def _named(name: str, work: Awaitable[Result], into: dict[str, Result]) -> Result:
    result = await work
    result.group, result.name = GROUP, name
    into[name] = result
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _compare(results: dict[str, Result]) -> None:
    """Each pooled row against its direct twin."""
    for name, pooled in results.items():
        if not name.endswith(f"via={VIAS[1]}"):
            continue
        direct = results.get(name.replace(VIAS[1], VIAS[0]))
        if direct is None or pooled.status != "ok" or direct.status != "ok":
            continue
        pooled.extra["rate_ratio_to_direct"] = _ratio(pooled.rate, direct.rate)
        p50 = (pooled.latency_ms or {}).get("p50"), (direct.latency_ms or {}).get("p50")
        pooled.extra["p50_ratio_to_direct"] = _ratio(*p50)
