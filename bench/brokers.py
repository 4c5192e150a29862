"""Issue 25 item 3: the headline scenario through haproxy with 1, 2 and 3 broker processes.

``python -m bench brokers``: the run's broker and up to two more ``messagex serve``
processes on the same database, haproxy (tests/faults/haproxy.py: the configuration of
deploy/haproxy.cfg, on loopback) in front of the first 1, 2, then 3 of them, and through it
the headline scenario — batch publishes (100 a request) → WebSocket consumers at prefetch
100 → one ACK each. The same load every time: ``CONSUMERS`` sockets (spread by haproxy's
leastconn: two per broker with three) and the run's publishers, whose requests haproxy
spreads one by one. Each broker's CPU, PostgreSQL's and haproxy's are read with psutil
(cores = CPU seconds per message times the rate). Every scenario is bounded by the run's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from bench import mx
from bench.infra import (
    BrokerProcess,
    Meters,
    PostgresSampler,
    Sample,
    self_sample,
    tree_sample,
)
from bench.stats import Result
from tests.faults import haproxy

if TYPE_CHECKING:
    from bench.harness import Run

GROUP = "brokers"
BROKER_COUNTS = (1, 2, 3)
#: WebSocket consumers in every scenario (a multiple of 1, 2 and 3)
CONSUMERS = 6


def meters(run: Run, members: list[BrokerProcess], proxy: haproxy.Haproxy) -> Meters:
    samplers: dict[str, Callable[[], Sample]] = {}
    for i, broker in enumerate(members, 1):
        assert broker.pid is not None
        samplers[f"broker{i}"] = partial(tree_sample, broker.pid)
    assert run.pg is not None
    samplers["postgres"] = PostgresSampler(run.pg.info["postmaster_pid"], run.pg.dbname)
    assert proxy.proc is not None
    samplers["haproxy"] = partial(tree_sample, proxy.proc.pid)
    samplers["client"] = self_sample
    return Meters(samplers)


async def scenario(run: Run, members: list[BrokerProcess]) -> Result:
    n = len(members)
    proxy = haproxy.Haproxy([(f"broker{i}", b.port) for i, b in enumerate(members, 1)])
    await asyncio.to_thread(proxy.start)
    try:
        for i in range(1, n + 1):
            await asyncio.to_thread(proxy.wait_status, f"broker{i}", "UP")
        broker = members[0]
        client = mx.Mx(proxy.base_url, proxy.ws_url, broker.user, broker.password)
        try:
            settings = replace(
                run.mx_settings(),
                mx=client,
                meters=meters(run, members, proxy),
                consumers=CONSUMERS,
                workers=n,  # the broker counters of one process would say nothing
            )
            result = await mx.ws_throughput(settings, "batch", 100, "each")
        finally:
            await client.close()
    finally:
        await asyncio.to_thread(proxy.stop)
    result.group = GROUP
    result.name = f"brokers n={n} publish=batch prefetch=100 ack=each"
    result.params.update(brokers=n, via="haproxy")
    if result.rate:
        # cores busy: CPU seconds per 1,000 messages times messages per second / 1,000
        result.extra["cores"] = {
            name: round(v * result.rate / 1000, 2)
            for name, v in result.cpu_s_per_1k.items()
            if v is not None
        }
    return result


def skipped(reason: str) -> Result:
    return Result(GROUP, "brokers", {}, status="skipped", note=reason)


async def run(run: Run) -> None:
    reason = haproxy.missing()
    if reason is not None:
        run.results.append(skipped(reason))
        return
    assert run.pg is not None
    assert run.broker is not None
    extra: list[BrokerProcess] = []
    try:
        for n in BROKER_COUNTS:
            while len(extra) < n - 1:
                more = BrokerProcess(
                    run.pg.url,
                    user=run.broker.user,
                    password=run.broker.password,
                    extra_env=run.cfg.broker_env,
                )
                extra.append(more)
                await more.start()
            members = [run.broker, *extra]
            name = f"brokers n={n} publish=batch prefetch=100 ack=each"
            await run.scenario(GROUP, name, scenario(run, members))
    finally:
        for more in extra:
            await more.stop()
            more.cleanup()
    for r in run.results:
        if r.group == GROUP and r.rate and r.extra.get("round") == run.round:
            print(f"  {r.name}: {r.rate:,.0f} msg/s, cores {r.extra.get('cores')}", flush=True)
