"""The keep-alive wheel (app/server.py, ``KeepAlive``): each socket gets its turn at the first
slot boundary at or after the time it asked for, never before; sockets due together share one
turn; a socket that left is never asked again; an empty wheel leaves the registry."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from app.server import BatchingWebSocketProtocol, KeepAlive


async def wait_for_async(predicate: Callable[[], bool], timeout: float, message: str) -> None:
    """Poll ``predicate`` on the running loop (the wheel's timer runs meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {message}"
        await asyncio.sleep(0.01)


class FakeSocket:
    """What the wheel needs of a socket: its slot, and its turn (which it records)."""

    def __init__(self, name: str, turns: list[tuple[str, float]], again: float | None) -> None:
        self.name = name
        self.turns = turns
        self.again = again  # how long after its turn it wants the next one (None: done)
        self._keepalive_slot = 0

    def keepalive_due(self, now: float, wheel: KeepAlive) -> float | None:
        self.turns.append((self.name, now))
        if self.again is None:
            return None
        due, self.again = now + self.again, None  # one more turn, then done
        return due


async def test_turns_come_at_the_due_slot_in_order_and_a_discarded_socket_gets_none() -> None:
    loop = asyncio.get_running_loop()
    wheel = KeepAlive.of(loop, 0.4, 0.4)
    assert wheel.tick == 0.1
    turns: list[tuple[str, float]] = []
    start = loop.time()
    asked: dict[str, float] = {}
    for name, delay, again in (("late", 0.35, None), ("early", 0.12, 0.2), ("gone", 0.05, None)):
        sock = FakeSocket(name, turns, again)
        asked[name] = start + delay
        wheel.add(cast(BatchingWebSocketProtocol, sock), start + delay)
        if name == "gone":
            wheel.discard(cast(BatchingWebSocketProtocol, sock))

    await wait_for_async(lambda: len(turns) >= 3, 5, message="three turns")
    names = [name for name, _ in turns]
    assert names == ["early", "early", "late"] or names == ["early", "late", "early"], names
    first_early = turns[0][1]
    assert first_early >= asked["early"]
    assert next(t for n, t in turns if n == "late") >= asked["late"]
    assert [t for n, t in turns if n == "early"][1] >= first_early + 0.2
    await wait_for_async(lambda: not wheel.slots, 5, message="an empty wheel")
    await wait_for_async(
        lambda: (0.4, 0.4) not in cast(dict[Any, Any], KeepAlive._wheels.get(loop, {})),
        5,
        message="the empty wheel leaves the registry",
    )
    assert "gone" not in names
