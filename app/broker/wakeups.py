"""In-process wake-ups per queue: publishes, releases and notifications set them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class WakeHub:
    def __init__(self) -> None:
        self._events: dict[int, set[asyncio.Event]] = {}

    def wake(self, queue_ids: Iterable[int]) -> None:
        for queue_id in queue_ids:
            for event in self._events.get(queue_id, ()):
                event.set()

    def wake_all(self) -> None:
        for events in self._events.values():
            for event in events:
                event.set()

    @contextmanager
    def register(self, queue_id: int) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self._events.setdefault(queue_id, set()).add(event)
        try:
            yield event
        finally:
            events = self._events.get(queue_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._events[queue_id]


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait for ``event`` at most ``seconds``; True when it was set."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), max(seconds, 0.0))
    except TimeoutError:
        return False
    return True
