"""The ACK/NACK/PUBLISH operations of one WebSocket connection that are still running.

They run concurrently (acks that arrive together settle together), at most ``limit`` at once:
past that the reader stops reading frames until one finishes (backpressure). On close, those
already read still take effect (an ACK sent just before closing must not become a
redelivery), for a bounded time.
"""

from __future__ import annotations

import asyncio
from typing import Any


class InFlight:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._ops: set[asyncio.Future[Any]] = set()
        self._room = asyncio.Event()  # set when an op finished (room for another)

    def __len__(self) -> int:
        return len(self._ops)

    def track(self, op: asyncio.Future[Any]) -> None:
        self._ops.add(op)
        op.add_done_callback(self._done)

    def _done(self, op: asyncio.Future[Any]) -> None:
        self._ops.discard(op)
        self._room.set()

    async def wait_for_room(self) -> None:
        """Until fewer than ``limit`` run (a plain count, not a Semaphore: its bookkeeping
        showed at 2 % of a busy consumer's CPU). Callers check ``len() >= limit`` first, so
        the common case costs no coroutine."""
        while len(self._ops) >= self.limit:
            self._room.clear()
            await self._room.wait()

    async def drain(self, grace: float) -> None:
        """Let the running operations finish, for at most ``grace`` seconds; then cancel the
        rest and wait for them to end."""
        if self._ops:
            await asyncio.wait(set(self._ops), timeout=grace)
        for op in list(self._ops):
            op.cancel()
        if self._ops:
            await asyncio.gather(*self._ops, return_exceptions=True)
