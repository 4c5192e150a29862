"""Operations use cases: readiness (database reachable, schema at head) and the overview."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from app import __version__
from app.auth import permissions
from app.domain.model import User
from app.errors import Unavailable
from app.storage import migrations
from app.storage import overview as sql
from app.storage.database import Database

log = logging.getLogger("messagex.ops")

#: /readyz answers within this bound even when the database hangs.
READY_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class MessageCounts:
    ready: int
    delayed: int
    in_flight: int
    dead: int


@dataclass(frozen=True, slots=True)
class Overview:
    version: str
    queues: int
    exchanges: int
    messages: MessageCounts
    connections: int
    subscriptions: int


class OverviewService:
    def __init__(self, db: Database, ready_timeout: float = READY_TIMEOUT_SECONDS) -> None:
        self.db = db
        self.ready_timeout = ready_timeout
        self._head: str | None = None

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
        async with self.db.transaction() as conn:
            counts = await sql.overview_counts(conn)
        return Overview(
            version=__version__,
            queues=counts.queues,
            exchanges=counts.exchanges,
            messages=MessageCounts(
                ready=counts.ready,
                delayed=counts.delayed,
                in_flight=counts.in_flight,
                dead=counts.dead,
            ),
            connections=counts.connections,
            subscriptions=counts.subscriptions,
        )
