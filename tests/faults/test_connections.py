"""Many concurrent idle WebSocket connections (each authenticated and subscribed): the
broker's memory per connection is measured and reported; its database connections stay
within the pool (pool size + overflow, plus the LISTEN connection); it stays responsive.
"""

from __future__ import annotations

import asyncio
import random
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import psutil
import pytest
from websockets.asyncio.client import ClientConnection, connect

from app.runtime import raise_open_files_limit
from app.storage.dsn import asyncpg_dsn
from tests.faults.harness import ADMIN, BrokerProc, brokers, sessions
from tests.wsclient import basic

POOL = 5
OVERFLOW = 5
MB = 1024 * 1024
#: the brokers of this module: a small pool, so that its bound shows
BROKER_ENV: dict[str, Any] = {
    "MESSAGEX_DB_POOL_SIZE": POOL,
    "MESSAGEX_DB_MAX_OVERFLOW": OVERFLOW,
    "MESSAGEX_LOG_LEVEL": "warning",
}


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
        **memory_figures(n, before, after, opened, db_sessions),
        "rest_latency_ms": latency * 1000,
        "health": health.status_code,
        "overview_connections": overview["connections"],
        "delivered": got,
        "consumers": stats["consumers"],
    }


def memory_figures(
    n: int, before: int, after: int, opened: float, db_sessions: list[Any]
) -> dict[str, Any]:
    """What n idle sockets cost: broker RSS before and after them, per connection, the time
    to open them, the database sessions while they idle."""
    return {
        "n": n,
        "per_connection_kb": (after - before) / n / 1024,
        "rss_before_mb": before / MB,
        "rss_after_mb": after / MB,
        "open_seconds": opened,
        "db_sessions": len(db_sessions),
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
    with brokers(module_db, module_logs, 1, **BROKER_ENV) as (b,):
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


# -- 10,000 idle browser tabs, each on its own queue (issue 19 target 1, issue 23 item 6) ---

OWN_QUEUES = 10_000
#: queues published to, at random, once the sockets have been idle
SAMPLED = 100
#: the idle window whose broker CPU is measured, and the bound on it (% of one core; the
#: issue's target is 5 % with PostgreSQL, on a quiet machine: this is the loaded-CI guard)
IDLE_WINDOW_S = 10.0
IDLE_CPU_BOUND = 25.0


async def open_own(url: str, queues: list[str]) -> list[ClientConnection]:
    """One authenticated socket per queue, each subscribed to its queue (prefetch 1); no
    client pings, so that the idle window is idle. As many at once as the broker's pool has
    connections (a subscribe is a transaction): more would only queue for the pool, and on a
    loaded machine wait out its timeout (503 ``unavailable``)."""
    room = asyncio.Semaphore(POOL + OVERFLOW)
    headers = basic()

    async def one(queue: str) -> ClientConnection:
        async with room:
            ws = await connect(
                url,
                additional_headers=headers,
                open_timeout=60,
                proxy=None,
                compression=None,
                ping_interval=None,
            )
            connected = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
            assert connected["type"] == "CONNECTED", connected
            frame = {"type": "SUBSCRIBE", "queue": queue, "prefetch": 1, "id": 1}
            await ws.send(orjson.dumps(frame).decode())
            subscribed = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
            assert subscribed["type"] == "SUBSCRIBED", subscribed
            return ws

    return list(await asyncio.gather(*(one(q) for q in queues)))


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def own_queues_scenario(broker: BrokerProc, n: int) -> dict[str, Any]:
    prefix = f"tab{n}-"
    queues = [f"{prefix}{i:05d}" for i in range(n)]
    db = await asyncpg.connect(asyncpg_dsn(broker.database_url))
    sockets: list[ClientConnection] = []
    try:
        # 10,000 declares through the API take minutes on two cores: the rows, as a declare
        # makes them (the API path of a declare has tests of its own)
        await db.execute(
            "INSERT INTO queues (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING", queues
        )
        async with httpx.AsyncClient(base_url=broker.api, auth=ADMIN, timeout=60) as api:
            await asyncio.sleep(1)  # let start-up garbage settle
            before = broker.rss()
            started = time.monotonic()
            sockets = await open_own(broker.ws_url, queues)
            opened = time.monotonic() - started
            await asyncio.sleep(2)  # a heartbeat and a liveness round with them all
            after = broker.rss()
            db_sessions = await asyncio.to_thread(sessions, broker.database_url)
            cpu0, t0 = cpu_seconds(broker.pid), time.monotonic()
            await asyncio.sleep(IDLE_WINDOW_S)
            idle_cpu = (cpu_seconds(broker.pid) - cpu0) / (time.monotonic() - t0) * 100
            overview = (await api.get("/overview")).json()
            # every sampled idle subscriber gets the message published to its queue
            rng = random.Random(19)
            sample = rng.sample(range(n), SAMPLED)
            latencies: list[float] = []
            for i in sample:
                sent = time.monotonic()
                reply = await api.post(f"/queues/{queues[i]}/messages", json={"body": i})
                assert reply.status_code == 200, reply.text
                frame = orjson.loads(await asyncio.wait_for(sockets[i].recv(), 10))
                latencies.append((time.monotonic() - sent) * 1000)
                assert frame["type"] == "MESSAGE_DELIVERED", frame
                assert frame["body"] == i, frame
                assert frame["queue"] == queues[i], frame
                ack = {"type": "ACK", "delivery_tag": frame["delivery_tag"]}
                await sockets[i].send(orjson.dumps(ack).decode())
    finally:
        closing = asyncio.Semaphore(200)

        async def close(ws: ClientConnection) -> None:
            async with closing:
                await ws.close()

        await asyncio.gather(*(close(ws) for ws in sockets), return_exceptions=True)
        await db.execute("DELETE FROM queues WHERE name LIKE $1", prefix + "%")
        await db.close()
    latencies.sort()
    return {
        **memory_figures(n, before, after, opened, db_sessions),
        "idle_cpu_percent": idle_cpu,
        "overview_connections": overview["connections"],
        "publish_to_delivery_ms_p50": latencies[len(latencies) // 2],
        "publish_to_delivery_ms_max": latencies[-1],
    }


@pytest.fixture(scope="module")
def tabs_broker(module_db: str, module_logs: Path) -> Iterator[BrokerProc]:
    """A broker that lets one user open 10,000 sockets (the default allows fewer)."""
    raise_open_files_limit()
    limit = {"MESSAGEX_MAX_CONNECTIONS_PER_USER": str(OWN_QUEUES + 100)}
    with brokers(module_db, module_logs, 1, **BROKER_ENV, **limit) as (b,):
        yield b


@pytest.mark.slow
def test_10000_idle_websockets_each_on_its_own_queue(tabs_broker: BrokerProc) -> None:
    """The browser case: 10,000 sockets, each authenticated and subscribed to a queue of its
    own, idle. Memory per connection and database sessions are reported and bounded; the
    broker's CPU while they idle is bounded; 100 of them, at random, each get the message
    published to their queue."""
    figures = asyncio.run(own_queues_scenario(tabs_broker, OWN_QUEUES))
    print(
        f"{figures['n']} idle WebSockets on their own queues: "
        f"{figures['per_connection_kb']:.1f} KiB RSS each (broker {figures['rss_before_mb']:.0f}"
        f" → {figures['rss_after_mb']:.0f} MB), opened in {figures['open_seconds']:.1f} s; "
        f"{figures['db_sessions']} database sessions; broker CPU idle "
        f"{figures['idle_cpu_percent']:.1f} % of a core; publish → delivery p50 "
        f"{figures['publish_to_delivery_ms_p50']:.1f} ms, max "
        f"{figures['publish_to_delivery_ms_max']:.1f} ms over {SAMPLED} sampled queues"
    )
    assert figures["db_sessions"] <= POOL + OVERFLOW + 1  # + the LISTEN connection
    assert figures["overview_connections"] == figures["n"]
    assert figures["per_connection_kb"] < 200
    assert figures["idle_cpu_percent"] < IDLE_CPU_BOUND
