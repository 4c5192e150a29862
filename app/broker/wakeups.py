"""In-process wake-ups per queue: publishes, releases and notifications set them.

Two kinds. ``wake`` says a queue may have new ready messages (a publish, a release, a
requeue, another process's notification). ``credit`` says a subscriber got room back (an
ACK): that is worth a claim only if messages may be waiting, so it is dropped for a queue
whose last claim took everything due and that had no ``wake`` since (``drained``). At light
load this saves an empty claim per ACK, and keeps the queue's dispatcher free for the
publisher's direct hand-off. A dropped wake-up costs latency at worst, never a message:
the dispatcher also polls every second.

Two kinds of listener. A long-polling pull ``register``s an event while it waits. The
dispatcher ``watch``es every queue with local subscribers for as long as it has them, with a
callback that starts the queue's claim task; it has no task while a queue is idle.
``wake_all`` (notifications were lost) sets every event and calls the ``on_wake_all`` hook
instead of every watcher: the dispatcher answers it with one poll of all its queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager


class WakeHub:
    def __init__(self) -> None:
        self._events: dict[int, set[asyncio.Event]] = {}
        self._watchers: dict[int, Callable[[int], None]] = {}
        #: called by ``wake_all`` (the dispatcher polls every watched queue at once)
        self.on_wake_all: Callable[[], None] | None = None
        #: wake-ups seen per queue (only queues someone waits on), so that a claim can tell
        #: whether one came while it ran
        self._wakes: dict[int, int] = {}
        self._drained: set[int] = set()

    def wake(self, queue_ids: Iterable[int]) -> None:
        for queue_id in queue_ids:
            events = self._events.get(queue_id)
            watcher = self._watchers.get(queue_id)
            if events or watcher is not None:
                self._wakes[queue_id] = self._wakes.get(queue_id, 0) + 1
                self._drained.discard(queue_id)
                for event in events or ():
                    event.set()
                if watcher is not None:
                    watcher(queue_id)

    def wake_waiters(self, queue_ids: Iterable[int]) -> None:
        """Wake the pulls waiting on these queues, not their watchers (the dispatcher)."""
        for queue_id in queue_ids:
            for event in self._events.get(queue_id, ()):
                event.set()

    def wake_all(self) -> None:
        """Wake-ups may have been lost: every waiting pull wakes, the dispatcher polls."""
        self._drained.clear()
        for events in self._events.values():
            for event in events:
                event.set()
        if self.on_wake_all is not None:
            self.on_wake_all()

    def credit(self, queue_ids: Iterable[int]) -> None:
        """A subscriber of these queues got prefetch room back."""
        for queue_id in queue_ids:
            if queue_id not in self._drained:
                for event in self._events.get(queue_id, ()):
                    event.set()
                watcher = self._watchers.get(queue_id)
                if watcher is not None:
                    watcher(queue_id)

    def wakes(self, queue_id: int) -> int:
        """Read before a claim; pass to ``drained`` after it."""
        return self._wakes.get(queue_id, 0)

    def drained(self, queue_id: int, wakes: int | None) -> None:
        """The claim that started at ``wakes`` took every due message (or, with None, it
        is not known whether messages wait: credit wakes it again)."""
        if wakes is not None and self._wakes.get(queue_id, 0) == wakes:
            self._drained.add(queue_id)
        else:
            self._drained.discard(queue_id)

    def watch(self, queue_id: int, watcher: Callable[[int], None]) -> None:
        """Call ``watcher(queue_id)`` on every wake-up of the queue (and every credit one
        that counts), until ``unwatch``."""
        self._watchers[queue_id] = watcher

    def unwatch(self, queue_id: int) -> None:
        if self._watchers.pop(queue_id, None) is not None:
            self._forget(queue_id)

    def watched(self) -> list[int]:
        return list(self._watchers)

    def is_watched(self, queue_id: int) -> bool:
        return queue_id in self._watchers

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
                    self._forget(queue_id)

    def _forget(self, queue_id: int) -> None:
        if queue_id not in self._events and queue_id not in self._watchers:
            self._wakes.pop(queue_id, None)
            self._drained.discard(queue_id)


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait for ``event`` at most ``seconds``; True when it was set."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), max(seconds, 0.0))
    except TimeoutError:
        return False
    return True
