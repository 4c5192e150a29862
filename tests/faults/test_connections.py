"""Many concurrent idle WebSocket connections (each authenticated and subscribed): the
broker's memory per connection is measured and reported; its database connections stay
within the pool (pool size + overflow, plus the LISTEN connection); it stays responsive.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.faults.harness import ADMIN, BrokerProc, brokers, sessions
from tests.wsclient import basic

POOL = 5
OVERFLOW = 5
MB = 1024 * 1024


async def open_many(url: str, n: int, queue: str) -> list[ClientConnection]:
    room = asyncio.Semaphore(50)
    headers = basic()

    async def one() -> ClientConnection:
        async with room:
            ws = await connect(
                url, additional_headers=headers, open_timeout=30, proxy=None, compression=None
            )
            connected = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
            assert connected["type"] == "CONNECTED", connected
            await ws.send(orjson.dumps({"type": "SUBSCRIBE", "queue": queue, "id": 1}).decode())
            subscribed = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
            assert subscribed["type"] == "SUBSCRIBED", subscribed
            return ws

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def scenario(broker: BrokerProc, n: int) -> dict[str, Any]:
    url, base = broker.ws_url, broker.base_url
    async with httpx.AsyncClient(base_url=broker.api, auth=ADMIN, timeout=30) as api:
        queue = f"idle{n}"
        assert (await api.put(f"/queues/{queue}", json={})).status_code in (200, 201)
        await asyncio.sleep(1)  # let start-up garbage settle
        before = broker.rss()
        started = time.monotonic()
        sockets = await open_many(url, n, queue)
        opened = time.monotonic() - started
        await asyncio.sleep(2)  # a heartbeat and a liveness round with them all
        after = broker.rss()
        db_sessions = await asyncio.to_thread(sessions, broker.database_url)
        t0 = time.monotonic()
        health = await api.get(f"{base}/healthz")
        overview = (await api.get("/overview")).json()
        latency = time.monotonic() - t0
        # one publish reaches exactly one of them
        assert (await api.post(f"/queues/{queue}/messages", json={"body": 1})).status_code == 200
        got = await first_delivery(sockets)
        stats = (await api.get(f"/queues/{queue}")).json()["stats"]
        await api.delete(f"/queues/{queue}")
        for ws in sockets:
            await ws.close()
    return {
        "n": n,
        "per_connection_kb": (after - before) / n / 1024,
        "rss_before_mb": before / MB,
        "rss_after_mb": after / MB,
        "open_seconds": opened,
        "db_sessions": len(db_sessions),
        "rest_latency_ms": latency * 1000,
        "health": health.status_code,
        "overview_connections": overview["connections"],
        "delivered": got,
        "consumers": stats["consumers"],
    }


async def first_delivery(sockets: list[ClientConnection]) -> dict[str, Any]:
    async def wait(ws: ClientConnection) -> dict[str, Any]:
        frame: dict[str, Any] = orjson.loads(await ws.recv())
        return frame

    tasks = [asyncio.create_task(wait(ws)) for ws in sockets]
    done, pending = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    assert len(done) == 1, f"{len(done)} deliveries of one message"
    return next(iter(done)).result()


@pytest.fixture(scope="module")
def broker(module_db: str, module_logs: Path) -> Iterator[BrokerProc]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 5000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 10000), hard))
    with brokers(
        module_db,
        module_logs,
        1,
        MESSAGEX_DB_POOL_SIZE=POOL,
        MESSAGEX_DB_MAX_OVERFLOW=OVERFLOW,
        MESSAGEX_LOG_LEVEL="warning",
    ) as (b,):
        yield b


def check(figures: dict[str, Any]) -> None:
    print(
        f"{figures['n']} idle WebSockets: {figures['per_connection_kb']:.1f} KiB RSS each "
        f"(broker {figures['rss_before_mb']:.0f} → {figures['rss_after_mb']:.0f} MB), opened in "
        f"{figures['open_seconds']:.1f} s; {figures['db_sessions']} database sessions; REST "
        f"answered in {figures['rest_latency_ms']:.0f} ms"
    )
    assert figures["health"] == 200
    assert figures["db_sessions"] <= POOL + OVERFLOW + 1  # + the LISTEN connection
    assert figures["overview_connections"] == figures["n"]
    assert figures["consumers"] == figures["n"]
    assert figures["delivered"]["type"] == "MESSAGE_DELIVERED"
    assert figures["rest_latency_ms"] < 2000
    assert figures["per_connection_kb"] < 200


def test_idle_websocket_connections(broker: BrokerProc) -> None:
    check(asyncio.run(scenario(broker, 200)))


@pytest.mark.slow
def test_2000_idle_websocket_connections(broker: BrokerProc) -> None:
    check(asyncio.run(scenario(broker, 2000)))
