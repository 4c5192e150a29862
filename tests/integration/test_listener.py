"""The LISTEN connection (app/storage/listener.py) against a real PostgreSQL: it reconnects as
soon as its session ends, not at its next keep-alive check, and push works again after it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from app.storage.dsn import asyncpg_dsn
from app.storage.listener import Listener
from tests.support import async_wait_for

#: Far longer than any wait below: a reconnect seen in time cannot come from the keep-alive.
KEEPALIVE = 120.0


@pytest.fixture
async def listening(database_url: str) -> AsyncIterator[tuple[Listener, list[str], list[int]]]:
    received: list[str] = []
    connects: list[int] = []
    listener = Listener(
        database_url,
        "messagex_test_channel",
        received.append,
        lambda: connects.append(1),
        keepalive_seconds=KEEPALIVE,
    )
    task = asyncio.create_task(listener.run())
    try:
        await async_wait_for(lambda: connects, 10, message="first LISTEN")
        yield listener, received, connects
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await listener.close()


async def _over_listener_sessions(url: str, aggregate: str) -> int:
    """``aggregate`` (a count) over this database's LISTEN sessions."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return int(
            await conn.fetchval(
                f"SELECT {aggregate} FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = 'messagex-listener'"
            )
        )
    finally:
        await conn.close()


async def _no_listener_session(url: str) -> bool:
    return await _over_listener_sessions(url, "count(*)") == 0


async def _terminate_listener(url: str) -> int:
    return await _over_listener_sessions(url, "count(pg_terminate_backend(pid))")


async def test_a_terminated_listen_session_is_replaced_at_once_and_push_resumes(
    database_url: str, listening: tuple[Listener, list[str], list[int]]
) -> None:
    listener, received, connects = listening
    assert await _terminate_listener(database_url) == 1
    await async_wait_for(lambda: len(connects) == 2, 10, message="LISTEN again")
    assert await listener.notify("after")
    await async_wait_for(lambda: "after" in received, 5, message="notification")


async def test_a_failed_notify_makes_the_listener_reconnect(
    database_url: str, listening: tuple[Listener, list[str], list[int]]
) -> None:
    listener, received, connects = listening
    # The socket under the listener breaks: a NOTIFY on it answers False (a hint lost, never
    # an error raised into a publish), and the listener is back without waiting a keep-alive.
    listener._conn._transport.abort()
    assert not await listener.notify("lost")
    await async_wait_for(lambda: len(connects) == 2, 10, message="LISTEN again")
    assert await listener.notify("after")
    await async_wait_for(lambda: "after" in received, 5, message="notification")


async def test_a_listener_cancelled_just_after_connecting_closes_that_connection(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Shutdown cancels the listener wherever it is; here the cancel lands the moment its
    # connection is made, before the LISTEN (a real connection, only the timing is forced).
    real_connect = asyncpg.connect

    async def connect_then_cancelled(*args: object, **kwargs: object) -> asyncpg.Connection:
        conn = await real_connect(*args, **kwargs)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return conn

    monkeypatch.setattr(asyncpg, "connect", connect_then_cancelled)
    connects: list[int] = []
    listener = Listener(
        database_url, "messagex_test_channel", lambda _payload: None, lambda: connects.append(1)
    )
    task = asyncio.create_task(listener.run())
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.undo()
    assert not connects
    # Closed by the listener, not left open until the event loop closes over its socket.
    await async_wait_for(
        lambda: _no_listener_session(database_url), 5, message="no LISTEN session left"
    )
