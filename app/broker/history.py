"""The charts' history: samples this process's activity and (one process per sample time)
the depth of every queue, and answers the last 10 minutes of them.

Design and costs: docs/decisions.md "Rate and depth history".
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from app.auth import permissions
from app.domain.model import User
from app.errors import NotFound
from app.metrics import Metrics, QueueActivity
from app.storage import history as store
from app.storage import topology as topology_store
from app.storage.database import Database
from app.storage.history import Activity, Bucket

log = logging.getLogger("messagex.history")

#: the window the history answers
WINDOW_SECONDS = 600
#: rows older than this are deleted by the depth sampler
KEEP_SECONDS = 900
#: each process samples this long after a sample time, by its own clock (the sample times
#: are multiples of the interval since the epoch, so every process labels alike)
SAMPLE_DELAY_SECONDS = 0.2


@dataclass(frozen=True, slots=True)
class History:
    interval_seconds: int
    samples: list[Bucket]


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


class HistoryService:
    def __init__(self, db: Database, metrics: Metrics, interval_seconds: int = 5) -> None:
        self.db = db
        self.activity = metrics.activity
        self.interval = interval_seconds

    def _sample_time(self, now: float) -> float:
        """The latest sample time at or before ``now``."""
        return math.floor(now / self.interval) * self.interval

    async def run(self) -> None:
        """Sample just after every sample time until cancelled; a failed sample is logged
        and its activity kept for the next one."""
        while True:
            now = time.time()
            await asyncio.sleep(self._sample_time(now) + self.interval - now + SAMPLE_DELAY_SECONDS)
            try:
                await self.sample(self._sample_time(time.time()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("history sample failed (%s)", type(exc).__name__)

    async def sample(self, at: float) -> None:
        """Write the activity since the last sample as of ``at``, then the depth unless
        another process did."""
        taken = self.activity.take()
        rows = _rows(taken)
        when = _utc(at)
        try:
            async with self.db.transaction() as conn:
                await store.insert_activity(conn, when, rows)
        except BaseException:
            _merge(self.activity, taken)
            raise
        async with self.db.transaction() as conn:
            await store.sample_depth(
                conn, when, timedelta(seconds=KEEP_SECONDS), float(self.interval)
            )

    async def flush(self) -> None:
        """At shutdown: this process's last activity, as of the coming sample time (which
        readers show once it is over, summed with the other processes')."""
        taken = self.activity.take()
        rows = _rows(taken)
        if rows:
            when = _utc(self._sample_time(time.time()) + self.interval)
            async with self.db.transaction() as conn:
                await store.insert_activity(conn, when, rows)

    async def overview_history(self, user: User) -> History:
        permissions.require_admin(user)
        return await self._history(None)

    async def queue_history(self, user: User, name: str) -> History:
        permissions.require_any(user, name, "queue")
        async with self.db.connect() as conn:
            queue_id = await topology_store.find_queue_id(conn, name)
        if queue_id is None:
            raise NotFound(f"queue '{name}' not found")
        return await self._history(queue_id)

    async def _history(self, queue_id: int | None) -> History:
        """The last ``WINDOW_SECONDS`` of sample times, oldest first, each present: those
        still being written (less than half an interval old, at most 2 s) are left out. A
        time between paced depth samples (``store.hold_of``) shows the last depth."""
        step = self.interval
        last = self._sample_time(time.time() - min(step / 2, 2.0))
        count = WINDOW_SECONDS // step
        first = last - (count - 1) * step
        async with self.db.connect() as conn:
            # from further back: the depth sample that may still stand at ``first``
            since = first - (KEEP_SECONDS - WINDOW_SECONDS)
            found = await store.window(conn, queue_id, _utc(since), step)
        by_time = {b.at.timestamp(): b for b in found}
        depth: Bucket | None = None  # the last depth sample, and until when it stands
        until = 0.0
        for b in found:
            if b.at.timestamp() >= first:
                break
            if b.hold_seconds is not None:
                depth, until = b, b.at.timestamp() + b.hold_seconds
        samples = []
        for i in range(count):
            at = first + i * step
            bucket = by_time.get(at) or Bucket(_utc(at), 0, 0, 0, None, None, None, None)
            if bucket.hold_seconds is not None:
                depth, until = bucket, at + bucket.hold_seconds
            elif depth is not None and at < until:
                bucket = replace(
                    bucket,
                    ready=depth.ready,
                    delayed=depth.delayed,
                    in_flight=depth.in_flight,
                    dead=depth.dead,
                )
            samples.append(bucket)
        return History(interval_seconds=step, samples=samples)


def _rows(taken: QueueActivity) -> list[Activity]:
    """The activity rows of ``taken``: one per queue with activity, one broker-wide (the
    published messages, the deliveries and acks of every queue), none when idle."""
    ids = taken.published.keys() | taken.delivered.keys() | taken.acked.keys()
    rows = [
        Activity(q, taken.published.get(q, 0), taken.delivered.get(q, 0), taken.acked.get(q, 0))
        for q in sorted(ids)
    ]
    delivered = sum(taken.delivered.values())
    acked = sum(taken.acked.values())
    if rows or taken.messages:
        rows.append(Activity(None, taken.messages, delivered, acked))
    return rows


def _merge(into: QueueActivity, taken: QueueActivity) -> None:
    for mine, theirs in (
        (into.published, taken.published),
        (into.delivered, taken.delivered),
        (into.acked, taken.acked),
    ):
        for q, n in theirs.items():
            mine[q] = mine.get(q, 0) + n
    into.messages += taken.messages
