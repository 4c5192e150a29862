"""The overview's message counts: exact on a small broker, from a recent count on a big one.

``cache_from=0`` stands for a messages table past the size from which a count is slow
(docs/performance.md, "Scale").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

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


Make = Callable[..., OverviewService]


@pytest.fixture
async def make(db: Database) -> AsyncIterator[Make]:
    """OverviewService(db, **options); each is closed after the test."""
    made: list[OverviewService] = []

    def build(**options: Any) -> OverviewService:
        made.append(OverviewService(db, **options))
        return made[-1]

    yield build
    for service in made:
        await service.close()


async def test_a_big_count_is_answered_from_the_last_then_recounted(
    db: Database, make: Make
) -> None:
    cached = make(max_age=30.0, cache_from=0)
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


@pytest.mark.parametrize(
    "options",
    [
        {"max_age": 30.0},  # a small table (under the default 100,000 messages)
        {"max_age": 0.0, "cache_from": 0},  # max age 0: never from the last count
    ],
    ids=["small-table", "max-age-0"],
)
async def test_counted_for_every_request(db: Database, make: Make, options: dict[str, Any]) -> None:
    service = make(**options)
    await _add(db, "ov-a", 2)
    assert (await service.overview(ADMIN)).messages.ready == 2
    await _add(db, "ov-b", 3)
    assert (await service.overview(ADMIN)).messages.ready == 5


async def test_a_count_older_than_max_age_is_not_answered(db: Database, make: Make) -> None:
    service = make(max_age=0.2, cache_from=0)
    await _add(db, "ov-a", 2)
    assert (await service.overview(ADMIN)).messages.ready == 2
    await _add(db, "ov-b", 3)

    # Within 0.2 s the last count may be answered; after it, never: the first answer with
    # the new count comes before any background recount could (1 s).
    async def exact() -> Overview | None:
        o = await service.overview(ADMIN)
        return o if o.messages.ready == 5 else None

    await async_wait_for(exact, timeout=10, message="a count after max_age")
    assert service._refresh is None  # counted in the request, not in the background
