"""Operations use cases: readiness (database reachable, schema at head) and the overview."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import astuple, dataclass

from app import __version__
from app.auth import permissions
from app.domain.model import User
from app.errors import Unavailable
from app.metrics import Metrics
from app.storage import migrations
from app.storage import overview as sql
from app.storage import topology as store
from app.storage.database import Database
from app.storage.overview import MessageCounts

__all__ = ["MessageCounts", "Overview", "OverviewService"]

log = logging.getLogger("messagex.ops")

#: /readyz answers within this bound even when the database hangs.
READY_TIMEOUT_SECONDS = 2.0


#: from this many messages on, ``/overview`` may answer from its last count (counting them
#: takes 150-400 ms at a million on the 2-core VM, about a tenth of that at 100,000)
CACHE_FROM_MESSAGES = 100_000
#: a cached count is refreshed (in the background) once it is older than this
REFRESH_AFTER_SECONDS = 1.0
#: ``/metrics`` counts the queues' copies at most this often (scrapes in between reuse it)
QUEUE_GAUGES_MAX_AGE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class _Counted:
    messages: MessageCounts
    #: time.monotonic() when the count was started
    at: float
    #: the count found at least CACHE_FROM_MESSAGES messages
    big: bool


@dataclass(frozen=True, slots=True)
class Overview:
    version: str
    queues: int
    exchanges: int
    messages: MessageCounts
    connections: int
    subscriptions: int


class OverviewService:
    """Readiness and the broker-wide overview.

    The message counts scan the ``messages`` table (about 150 ms a million rows). While the
    last count found fewer than ``CACHE_FROM_MESSAGES`` every overview counts afresh (by
    the size, not the time a count took: a loaded machine must not make a small broker's
    counts stale). From there on, an overview answers from the last count if that is at
    most ``max_age`` seconds old and starts one count in the background when it is older
    than ``REFRESH_AFTER_SECONDS`` (with no parallel workers: the requests keep the other
    cores): an operator's dashboard polling every 2 s then reads counts about 2 s old, at
    the cost of one count per poll as before. The other figures (queues, exchanges,
    connections, subscriptions) are always counted afresh. ``max_age`` 0 counts every time
    (docs/operations.md).
    """

    def __init__(
        self,
        db: Database,
        ready_timeout: float = READY_TIMEOUT_SECONDS,
        max_age: float = 0.0,
        cache_from: int = CACHE_FROM_MESSAGES,
        queue_gauges: int = 1000,
    ) -> None:
        self.db = db
        self.queue_gauges = queue_gauges
        self._gauges_at: float | None = None
        self._gauges_lock = asyncio.Lock()
        self.ready_timeout = ready_timeout
        self.max_age = max_age
        self.cache_from = cache_from
        self._head: str | None = None
        self._counted: _Counted | None = None
        self._refresh: asyncio.Task[None] | None = None

    def _head_revision(self) -> str | None:
        if self._head is None:
            self._head = migrations.head_revision()
        return self._head

    async def check_ready(self) -> None:
        """Return when the database answers and its schema is at head; else ``Unavailable``."""
        try:
            async with asyncio.timeout(self.ready_timeout):
                async with self.db.connect() as conn:
                    await sql.ping(conn)
                    revision = await sql.schema_revision(conn)
        except TimeoutError:
            raise Unavailable(
                f"the database did not answer within {self.ready_timeout:g} s"
            ) from None
        head = self._head_revision()
        if revision != head:
            log.warning("not ready: schema at %s, expected %s", revision, head)
            raise Unavailable(f"the database schema is at {revision or 'no revision'}, not {head}")

    async def overview(self, user: User) -> Overview:
        permissions.require_admin(user)
        counted = self._usable_count()
        if counted is None:
            async with self.db.transaction() as conn:
                started = time.monotonic()
                counts = await sql.overview_counts(conn)
                self._remember(counts.messages, started)
            resources, messages = counts.resources, counts.messages
        else:
            async with self.db.connect() as conn:
                resources = await sql.resource_counts(conn)
            messages = counted.messages
            if time.monotonic() - counted.at > REFRESH_AFTER_SECONDS:
                self._refresh_soon()
        return Overview(
            version=__version__,
            queues=resources.queues,
            exchanges=resources.exchanges,
            messages=messages,
            connections=resources.connections,
            subscriptions=resources.subscriptions,
        )

    async def export_queue_gauges(self, metrics: Metrics) -> None:
        """Set the per-queue gauges of ``metrics`` (copies by status, live consumers) for
        the ``queue_gauges`` deepest queues, from one statement at most every
        ``QUEUE_GAUGES_MAX_AGE_SECONDS``: a scrape in between, or one that waits for a
        concurrent scrape's count, exports that count. A queue that drops out (deleted, or
        no longer among the deepest) loses its series."""
        async with self._gauges_lock:
            now = time.monotonic()
            at = self._gauges_at
            if at is not None and now - at < QUEUE_GAUGES_MAX_AGE_SECONDS:
                return
            async with self.db.connect() as conn:
                total, deepest = await store.deepest_queues(conn, self.queue_gauges)
            metrics.set_queue_gauges(total, deepest)
            self._gauges_at = now

    def _usable_count(self) -> _Counted | None:
        """The last message count if it may be answered (of a big table, recent enough)."""
        counted = self._counted
        if counted is None or not counted.big:
            return None
        if time.monotonic() - counted.at > self.max_age:
            return None
        return counted

    def _remember(self, messages: MessageCounts, started: float) -> None:
        if self.max_age <= 0:
            return
        big = sum(astuple(messages)) >= self.cache_from
        counted = self._counted
        if counted is None or counted.at < started:
            self._counted = _Counted(messages=messages, at=started, big=big)

    def _refresh_soon(self) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._count_messages(), name="overview-count")

    async def _count_messages(self) -> None:
        try:
            async with self.db.transaction() as conn:
                started = time.monotonic()
                messages = await sql.message_counts_on_one_core(conn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next overview counts in the request and reports it
            log.warning("overview: background count failed (%s)", type(exc).__name__)
            self._counted = None
            return
        self._remember(messages, started)

    async def close(self) -> None:
        task, self._refresh = self._refresh, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
