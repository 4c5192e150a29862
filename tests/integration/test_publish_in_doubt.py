"""A publish whose connection broke while its statement was committing (contract §7, 503 "the
request did nothing"): the broker learns from the database, through the publish receipt,
whether it was stored, and answers accordingly. Real PostgreSQL; the broken connection is
injected at the storage edge, after (or instead of) the real statement."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from app.broker import publisher as publisher_module
from app.errors import DiskFull, InternalError, Unavailable
from app.storage import messages as store
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn
from tests.integration.test_publish_atomicity import ADMIN, count, execute, message, publisher_for


@pytest.fixture
async def queue(database_url: str) -> str:
    await execute(database_url, "INSERT INTO queues (name) VALUES ('q1')")
    return database_url


def break_after_commit(monkeypatch: pytest.MonkeyPatch, *, commit: bool) -> list[str]:
    """insert_copies runs for real (commit) or not at all, then the connection "breaks"."""
    real = store.insert_copies
    receipts: list[str] = []

    async def broken(
        hot: Any, messages: Any, copies: Any, receipt: str, handoff: Any, **kw: Any
    ) -> None:
        receipts.append(receipt)
        if commit:
            await real(hot, messages, copies, receipt, handoff, **kw)
        raise store.PublishInDoubt()

    monkeypatch.setattr(store, "insert_copies", broken)
    return receipts


async def test_a_stored_publish_whose_reply_was_lost_is_answered_as_stored(
    db: Database, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    receipts = break_after_commit(monkeypatch, commit=True)
    publisher, _metrics, woken = publisher_for(db)
    results = await publisher.publish_to_queue(ADMIN, "q1", [message(), message()])
    assert [r.routed for r in results] == [True, True]
    assert await count(queue) == 2
    assert len(woken) == 1  # consumers are woken as for any publish
    assert len(receipts) == 1


async def test_a_publish_that_did_not_commit_is_503_and_can_never_commit_later(
    db: Database, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    receipts = break_after_commit(monkeypatch, commit=False)
    publisher, _metrics, woken = publisher_for(db)
    with pytest.raises(Unavailable) as failed:
        await publisher.publish_to_queue(ADMIN, "q1", [message()])
    assert "may have" not in str(failed.value)  # a plain 503: the request did nothing
    assert await count(queue) == 0
    assert woken == []
    # the fence holds: the original statement, were it to arrive now, would fail whole
    monkeypatch.undo()
    q1 = (await execute(queue, "SELECT id FROM queues WHERE name = $1", "q1"))[0][0]
    with pytest.raises(InternalError):  # the receipt's primary key: nothing is stored
        await store.insert_copies(
            db.hot, [("", message(message_id="m", properties={}))], [(0, q1)], receipts[0]
        )
    assert await count(queue) == 0


async def test_the_fence_waits_for_a_commit_in_progress(db: Database, database_url: str) -> None:
    token = str(uuid.uuid4())
    other = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("INSERT INTO publish_receipts (token) VALUES ($1::uuid)", token)
        settling = asyncio.create_task(store.settle_in_doubt(db.hot, token))
        await asyncio.sleep(0)  # let it reach the database; it must wait, not answer
        done, _ = await asyncio.wait({settling}, timeout=0.3)
        assert not done, "the fence answered while the publish's commit was in progress"
        await tx.commit()
        assert await asyncio.wait_for(settling, 10) is True  # committed: stored
        token2 = str(uuid.uuid4())
        tx = other.transaction()
        await tx.start()
        await other.execute("INSERT INTO publish_receipts (token) VALUES ($1::uuid)", token2)
        settling = asyncio.create_task(store.settle_in_doubt(db.hot, token2))
        done, _ = await asyncio.wait({settling}, timeout=0.3)
        assert not done
        await tx.rollback()
        assert await asyncio.wait_for(settling, 10) is False  # rolled back: not stored
    finally:
        await other.close()


async def test_unanswerable_doubt_is_a_503_that_says_the_outcome_is_unknown(
    db: Database, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    break_after_commit(monkeypatch, commit=True)

    async def unreachable(hot: Any, receipt: str) -> bool:
        raise Unavailable()

    monkeypatch.setattr(store, "settle_in_doubt", unreachable)
    monkeypatch.setattr(publisher_module, "IN_DOUBT_SECONDS", 0.3)
    publisher, _metrics, _woken = publisher_for(db)
    with pytest.raises(Unavailable, match="may have been"):
        await publisher.publish_to_queue(ADMIN, "q1", [message()])


async def test_old_receipts_are_swept(db: Database, database_url: str) -> None:
    await execute(
        database_url,
        "INSERT INTO publish_receipts (token, created_at) VALUES "
        f"('{uuid.uuid4()}', now() - interval '1 hour'), ('{uuid.uuid4()}', now())",
    )
    assert await store.sweep_receipts(db.hot, 300) == 1
    rows = await execute(database_url, "SELECT count(*) FROM publish_receipts WHERE $1", True)
    assert rows[0][0] == 1


async def test_a_full_disk_is_not_in_doubt(
    db: Database, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """53100 is PostgreSQL's answer to the statement (it rolled back): the publish is a 503
    that says the disk is full at once, without a settle, whose receipt insert a full disk
    would refuse too (tests/faults/test_disk_full.py)."""

    async def disk_full(*_args: Any, **_kw: Any) -> None:
        raise store.PublishInDoubt(DiskFull())

    async def settle(hot: Any, receipt: str) -> bool:
        raise AssertionError("a full disk's refusal was settled as if in doubt")

    monkeypatch.setattr(store, "insert_copies", disk_full)
    monkeypatch.setattr(store, "settle_in_doubt", settle)
    publisher, _metrics, woken = publisher_for(db)
    with pytest.raises(DiskFull, match="out of disk space"):
        await publisher.publish_to_queue(ADMIN, "q1", [message()])
    assert await count(queue) == 0
    assert woken == []
