"""Single-message publishes from many concurrent HTTP clients: group commit on and off.

Two brokers on the same database, started by the harness: the run's broker (group commit
on, the default) and a second one with ``MESSAGEX_PUBLISH_GROUP_MAX=1`` (one transaction per
request). Each gets the same load: ``clients`` keep-alive HTTP/1.1 connections, each sending
``POST /queues/{q}/messages`` (1 KiB) and waiting for its 200 before the next, until
``count`` publishes have been confirmed. Only publishing is measured (nothing consumes).

The clients are raw keep-alive connections with a pre-built request (``bench.mx.RawHttp``)
rather than httpx: at these rates httpx costs the harness more CPU per request than the
broker spends, so with it the load generator, not the broker, would set the figure.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from bench.infra import BrokerProcess, Meters
from bench.mx import Mx, RawHttp, unique
from bench.stats import Result, latency_summary, make_body

#: concurrent publishing connections per scenario
CLIENTS = 32


@dataclass
class Settings:
    count: int
    clients: int
    deadline: float


async def _client(
    http: RawHttp, request: bytes, remaining: list[int], confirms: list[int], stop_at: float
) -> None:
    try:
        while remaining[0] > 0 and time.monotonic() < stop_at:
            remaining[0] -= 1
            started = time.perf_counter_ns()
            await http.send(request)
            confirms.append(time.perf_counter_ns() - started)
    finally:
        http.close()


async def publish_load(
    s: Settings, broker: BrokerProcess, meters: Meters, name: str, grouped: bool
) -> Result:
    mx = Mx(broker.base_url, broker.ws_url, broker.user, broker.password)
    queue = unique("gc")
    params: dict[str, Any] = {
        "publish": "single",
        "clients": s.clients,
        "group_commit": grouped,
        "transport": "http",
    }
    try:
        await mx.declare_queue(queue)
        body = b'{"body":' + make_body(0) + b"}"
        path = f"/api/v1/queues/{queue}/messages"
        request = RawHttp.post_request(broker.port, mx.authorization, path, body)
        connections = [await RawHttp.open(broker.port) for _ in range(s.clients)]
        remaining: list[int] = [s.count]
        confirms: list[int] = []
        meters.start()
        started = time.monotonic()
        tasks = [
            asyncio.create_task(_client(http, request, remaining, confirms, started + s.deadline))
            for http in connections
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            meters.stop()
        elapsed = time.monotonic() - started
        status = "ok" if len(confirms) >= s.count else "timeout"
        result = Result("groupcommit", name, params, status=status, messages=len(confirms))
        result.elapsed_s = round(elapsed, 3)
        result.rate = len(confirms) / elapsed if elapsed > 0 else None
        result.latency_ms = latency_summary(confirms)
        result.cpu_s_per_1k = meters.per_1k(len(confirms))
        return result
    finally:
        await mx.delete_queue(queue)
        await mx.close()
