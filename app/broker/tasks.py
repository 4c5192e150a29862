"""Every background task has an owner: it keeps a reference, logs a crash, cancels on close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from app.errors import Unavailable

log = logging.getLogger("messagex.tasks")


class TaskOwner:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        if self.closed:
            coro.close()
            raise RuntimeError("task owner is closed")
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("background task %s crashed", task.get_name(), exc_info=exc)

    async def close(self, grace: float = 5.0) -> None:
        self.closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)


async def every(interval: float, fn: Any, name: str) -> None:
    """Run ``await fn()`` every ``interval`` seconds; a failure is logged and the loop goes on.
    A database that cannot serve now (down, restarting, out of disk space) is a one-line
    warning: it is not a bug, and the storage layer has already logged why."""
    while True:
        await asyncio.sleep(interval)
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except Unavailable as exc:
            log.warning("periodic task %s failed: %s", name, exc.message)
        except Exception:
            log.exception("periodic task %s failed", name)
