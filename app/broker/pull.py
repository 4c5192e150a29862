"""Pull consumption over HTTP: ``GET`` (long-polling up to ``wait_ms``) and the settlements of
pulled deliveries, which belong to the user that got them and to no connection."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Unpack

from app.auth.permissions import Access, require
from app.broker.settlement import Settlement
from app.broker.wakeups import WakeHub, wait_event
from app.config import Settings
from app.domain.model import User
from app.domain.retry import Outcome
from app.errors import NotFound, PreconditionFailed
from app.metrics import Metrics
from app.storage import deliveries, single_active
from app.storage.database import Database
from app.storage.deliveries import ClaimArgs, Claimed


class PullConsumers:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        metrics: Metrics,
        hub: WakeHub,
        settlement: Settlement,
        process_id: str,
        *,
        poll_interval: float,
    ) -> None:
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self.hub = hub
        self.settlement = settlement
        self.process_id = process_id
        #: the longest a long poll sleeps without a wake-up (covers a lost one)
        self.poll_interval = poll_interval

    async def get(
        self,
        user: User,
        queue: str,
        *,
        max_messages: int,
        wait_ms: int,
        ack_timeout_seconds: int | None,
    ) -> list[Claimed]:
        """Claim up to ``max_messages`` for ``user``, waiting up to ``wait_ms`` for the first
        on the queue's wake-ups and its next delayed message's due time."""
        require(user, Access.READ, queue, "queue")
        async with self.db.transaction() as conn:
            found = await deliveries.queue_by_name(conn, queue)
        if found is None:
            raise NotFound(f"queue '{queue}' not found")
        queue_id = found.id
        timeout = ack_timeout_seconds or found.ack_timeout_seconds
        lease = float(timeout or self.settings.ack_timeout_seconds)
        single = found.single_active
        groups = found.groups
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        with self.hub.register(queue_id) as event:
            while True:
                event.clear()
                claimed = await self._claim(
                    single,
                    groups,
                    queue_id=queue_id,
                    n=max_messages,
                    lease_seconds=lease,
                    process_id=self.process_id,
                    owners=None,
                    owner_user=user.username,
                )
                remaining = deadline - loop.time()
                if claimed or remaining <= 0:
                    self.metrics.delivered.labels(via="pull").inc(len(claimed))
                    if claimed:
                        activity = self.metrics.activity
                        activity.add(activity.delivered, queue_id, len(claimed))
                    return claimed
                due = await deliveries.seconds_until_due(self.db.hot, queue_id)
                wait = min(remaining, self.poll_interval)
                if due is not None and not (groups and due <= 0):
                    # (in a group queue, due copies left behind wait for their group's head:
                    # its settlement wakes this wait)
                    wait = min(wait, max(due, 0.0))
                await wait_event(event, wait)

    async def _claim(self, single: bool, groups: bool, **args: Unpack[ClaimArgs]) -> list[Claimed]:
        """One claim; from a queue with a single active consumer through its gate: 409 while
        the queue has a subscription; from a group queue by the group claim (contract §16)."""
        if not single:
            claim = deliveries.claim_grouped if groups else deliveries.claim
            claimed = await claim(self.db.hot, **args)
        else:
            gated = await single_active.claim_pull(self.db.hot, groups=groups, **args)
            if gated is None:
                raise PreconditionFailed(
                    "the queue has a single active consumer subscribed (x-single-active-consumer)"
                )
            claimed = gated
        self.metrics.claims.labels(via="pull").inc()
        return claimed

    async def ack(self, user: User, tag: str) -> None:
        """ACK one pulled delivery of ``user``. Raises UnknownDeliveryTag."""
        await self.settlement.ack_pull(user.username, tag)

    async def ack_many(self, user: User, tags: Sequence[str]) -> tuple[list[str], list[str]]:
        """ACK several pulled deliveries of ``user``; returns (acknowledged, unknown)."""
        return await self.settlement.ack_pull_many(user.username, tags)

    async def nack(self, user: User, tag: str, requeue: bool) -> Outcome:
        outcome, _ = await self.settlement.nack(
            tag, requeue, owner_connection=None, owner_user=user.username
        )
        return outcome
