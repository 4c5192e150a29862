"""The overview's message counts: exact on a small broker, from a recent count on a big one.

``slow_count=0`` stands for a messages table whose count takes longer than the threshold
(the size that makes it so is measured in docs/performance.md, "Scale").
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from app.broker.overview import Overview, OverviewService
from app.domain.model import Permissions, Role, User
from app.storage.database import Database
from tests.support import async_wait_for

ADMIN = User("admin", Role.ADMIN, Permissions(".*", ".*", ".*"))


async def _add(db: Database, queue: str, ready: int) -> None:
    async with db.transaction() as conn:
        await conn.execute(text("INSERT INTO queues (name) VALUES (:q)"), {"q": queue})
        await conn.execute(
            text(
                "INSERT INTO messages (queue_id, message_id, exchange, routing_key, body) "
                "SELECT q.id, 'm' || g, '', 'k', '\\x00'::bytea "
                "FROM queues q, generate_series(1, :n) g WHERE q.name = :q"
            ),
            {"q": queue, "n": ready},
        )


@pytest.fixture
async def cached(db: Database) -> AsyncIterator[OverviewService]:
    service = OverviewService(db, max_age=30.0, slow_count=0.0)
    try:
        yield service
    finally:
        await service.close()


async def test_a_slow_count_is_answered_from_the_last_then_recounted(
    db: Database, cached: OverviewService
) -> None:
    await _add(db, "ov-a", 2)
    first = await cached.overview(ADMIN)
    assert (first.queues, first.messages.ready) == (1, 2)

    await _add(db, "ov-b", 3)
    second = await cached.overview(ADMIN)
    # The queue count is current; the message counts are the last count's.
    assert (second.queues, second.messages.ready) == (2, 2)

    # Asking again once the count is over REFRESH_AFTER_SECONDS old recounts in the
    # background; a later answer has the new count.
    async def recounted() -> Overview | None:
        o = await cached.overview(ADMIN)
        return o if o.messages.ready == 5 else None

    third = await async_wait_for(recounted, timeout=10, message="a background recount")
    assert third.queues == 2


async def test_a_fast_count_is_always_exact(db: Database) -> None:
    service = OverviewService(db, max_age=30.0)  # the default 50 ms threshold
    try:
        await _add(db, "ov-a", 2)
        assert (await service.overview(ADMIN)).messages.ready == 2
        await _add(db, "ov-b", 3)
        assert (await service.overview(ADMIN)).messages.ready == 5
    finally:
        await service.close()


async def test_max_age_zero_counts_every_time(db: Database) -> None:
    service = OverviewService(db, max_age=0.0, slow_count=0.0)
    try:
        await _add(db, "ov-a", 2)
        assert (await service.overview(ADMIN)).messages.ready == 2
        await _add(db, "ov-b", 3)
        assert (await service.overview(ADMIN)).messages.ready == 5
    finally:
        await service.close()


async def test_a_count_older_than_max_age_is_not_answered(db: Database) -> None:
    service = OverviewService(db, max_age=0.2, slow_count=0.0)
    try:
        await _add(db, "ov-a", 2)
        assert (await service.overview(ADMIN)).messages.ready == 2
        await _add(db, "ov-b", 3)

        # Within 0.2 s the last count may be answered; after it, never: the first answer
        # with the new count comes before any background recount could (1 s).
        async def exact() -> Overview | None:
            o = await service.overview(ADMIN)
            return o if o.messages.ready == 5 else None

        await async_wait_for(exact, timeout=10, message="a count after max_age")
        assert service._refresh is None  # counted in the request, not in the background
    finally:
        await service.close()
