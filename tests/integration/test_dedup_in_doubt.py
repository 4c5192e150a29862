"""The in-doubt retry of docs/reliability.md with a deduplication window (contract §15): the
connection breaks while a publish into a windowed queue commits and the database cannot be
asked in time (503 "it may have been"); the publisher sends the same message_id again, and
the queue ends with exactly one copy whichever way the first commit went. Real PostgreSQL;
the broken connection is injected around the publish's transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from app.broker import publisher as publisher_module
from app.errors import Unavailable
from app.storage import messages as store
from app.storage.database import Database
from tests.integration.test_publish_atomicity import ADMIN, count, execute, message, publisher_for


@pytest.fixture
async def windowed(database_url: str) -> str:
    await execute(
        database_url,
        "INSERT INTO queues (name, arguments) "
        "VALUES ('w', '{\"x-deduplication-window-seconds\": 600}')",
    )
    return database_url


def break_the_next_commit(monkeypatch: pytest.MonkeyPatch, db: Database, *, commit: bool) -> None:
    """The next publish into a windowed queue loses its connection: after its transaction
    committed (``commit``), or while its INSERT was being sent (so nothing committed). The
    database cannot be asked afterwards. Later publishes run as usual."""
    real_connection = db.hot.connection
    real_insert = store.insert_copies
    calls = 0

    @asynccontextmanager
    async def connection(*, stable: bool = False) -> AsyncIterator[Any]:
        nonlocal calls
        calls += stable
        async with real_connection(stable=stable) as conn:
            yield conn
        if stable and calls == 1:
            raise Unavailable()  # the transaction inside has committed

    async def insert_copies(*args: Any, **kwargs: Any) -> Any:
        if calls == 1:
            raise Unavailable()  # sent, never answered: rolled back
        return await real_insert(*args, **kwargs)

    async def unreachable(hot: Any, receipt: str) -> bool:
        raise Unavailable()

    monkeypatch.setattr(db.hot, "connection", connection)
    if not commit:
        monkeypatch.setattr(store, "insert_copies", insert_copies)
    monkeypatch.setattr(store, "settle_in_doubt", unreachable)
    monkeypatch.setattr(publisher_module, "IN_DOUBT_SECONDS", 0.2)


@pytest.mark.parametrize("committed", [True, False])
async def test_the_retry_after_an_unknown_outcome_leaves_one_copy(
    db: Database, windowed: str, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    break_the_next_commit(monkeypatch, db, commit=committed)
    publisher, _metrics, _woken = publisher_for(db)
    sent = message(message_id="pay-7", properties={"message_id": "pay-7"})
    with pytest.raises(Unavailable, match="may have been"):
        await publisher.publish_to_queue(ADMIN, "w", [sent])
    assert await count(windowed) == (1 if committed else 0)
    (retry,) = await publisher.publish_to_queue(ADMIN, "w", [sent])
    if committed:
        assert (retry.queues, retry.duplicates) == ([], ["w"])
    else:
        assert (retry.queues, retry.duplicates) == (["w"], [])
    assert await count(windowed) == 1
    (again,) = await publisher.publish_to_queue(ADMIN, "w", [sent])
    assert again.duplicates == ["w"]
    assert await count(windowed) == 1
