"""Single-message publishes from many concurrent HTTP clients: group commit on and off.

Two brokers on the same database, started by the harness: the run's broker (group commit
on, the default) and a second one with ``MESSAGEX_PUBLISH_GROUP_MAX=1`` (one transaction per
request). Each gets the same load: ``clients`` keep-alive HTTP/1.1 connections, each sending
``POST /queues/{q}/messages`` (1 KiB) and waiting for its 200 before the next, until
``count`` publishes have been confirmed. Only publishing is measured (nothing consumes).

The clients are raw asyncio streams with pre-built requests rather than httpx: at these
rates httpx costs the harness more CPU per request than the broker spends, so with it the
load generator, not the broker, would set the figure (measured: 4 httpx publishers reach
~190 msg/s whatever the broker does).
"""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass
from typing import Any

from bench.infra import BrokerProcess, Meters
from bench.mx import Mx, unique
from bench.stats import BenchError, Result, latency_summary, make_body

#: concurrent publishing connections per scenario
CLIENTS = 32


@dataclass
class Settings:
    count: int
    clients: int
    deadline: float


def _request(port: int, user: str, password: str, queue: str, seq: int) -> bytes:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    body = b'{"body":' + make_body(seq) + b"}"
    head = (
        f"POST /api/v1/queues/{queue}/messages HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Basic {auth}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _client(
    port: int, request: bytes, remaining: list[int], confirms: list[int], stop_at: float
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while remaining[0] > 0 and time.monotonic() < stop_at:
            remaining[0] -= 1
            started = time.perf_counter_ns()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
                raise BenchError(f"publish → {status_line}")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            confirms.append(time.perf_counter_ns() - started)
    finally:
        writer.close()


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
        request = _request(broker.port, broker.user, broker.password, queue, 0)
        remaining, confirms = [s.count], []
        meters.start()
        started = time.monotonic()
        tasks = [
            asyncio.create_task(
                _client(broker.port, request, remaining, confirms, started + s.deadline)
            )
            for _ in range(s.clients)
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
