"""The held-snapshot warning (app/broker/xmin_watch.py, app/storage/health.py) against a real
PostgreSQL: a session holding a REPEATABLE READ snapshot is found and named once per
threshold period; nothing is said once it ends."""

from __future__ import annotations

import logging

import asyncpg
import pytest

from app.broker.xmin_watch import XminWatch
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn
from app.storage.health import oldest_xmin_holder
from tests.support import async_wait_for

THRESHOLD = 0.5


async def test_a_held_snapshot_is_named_once_per_threshold(
    db: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    holder = await asyncpg.connect(
        asyncpg_dsn(database_url), server_settings={"application_name": "forgotten-psql"}
    )
    watch = XminWatch(db, THRESHOLD)
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM messages")
        async with db.connect() as conn:
            found = await oldest_xmin_holder(conn)
        assert found is not None
        assert (found.kind, found.pid, found.name) == (
            "session",
            holder.get_server_pid(),
            "forgotten-psql",
        )
        assert found.state == "idle in transaction"

        with caplog.at_level(logging.WARNING, logger="messagex.vacuum"):
            warned = await async_wait_for(watch.check, 10, message="the warning")
            assert warned.pid == holder.get_server_pid()
            assert await watch.check() is None  # already said within this threshold period
        lines = [r.getMessage() for r in caplog.records if r.name == "messagex.vacuum"]
        assert len(lines) == 1
        assert f"pid {holder.get_server_pid()}, application_name 'forgotten-psql'" in lines[0]
        assert "state 'idle in transaction'" in lines[0]

        await holder.execute("COMMIT")
        async with db.connect() as conn:
            after = await oldest_xmin_holder(conn)
        assert after is None or after.pid != holder.get_server_pid()
        assert await watch.check() is None
    finally:
        await holder.close()
