"""alembic: head matches ``app.storage.tables``; down and up again; concurrent upgrades."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.model import BUILTIN_EXCHANGES
from app.storage import migrations
from app.storage.database import create_engine
from app.storage.tables import metadata


@pytest.fixture
async def engine(empty_database_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_engine(empty_database_url, pool_size=2, max_overflow=2)
    try:
        yield eng
    finally:
        await eng.dispose()


def _diff(conn: Connection) -> list[Any]:
    context = MigrationContext.configure(
        conn, opts={"compare_type": True, "compare_server_default": True}
    )
    return list(compare_metadata(context, metadata))


async def _tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        )
        return {r[0] for r in rows}


async def test_upgrade_from_empty_matches_the_tables_module(engine: AsyncEngine) -> None:
    assert await _tables(engine) == set()
    await migrations.upgrade(engine)
    assert await migrations.current_revision(engine) == migrations.head_revision()
    async with engine.connect() as conn:
        assert await conn.run_sync(_diff) == []
    assert await _tables(engine) == set(metadata.tables) | {"alembic_version"}


async def test_builtin_exchanges_exist_after_migration(engine: AsyncEngine) -> None:
    await migrations.upgrade(engine)
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT name, type FROM exchanges"))
        assert {name: kind for name, kind in rows} == BUILTIN_EXCHANGES


async def test_downgrade_to_base_and_upgrade_again(engine: AsyncEngine) -> None:
    await migrations.upgrade(engine)
    await migrations.downgrade(engine, "base")
    assert await _tables(engine) <= {"alembic_version"}
    assert await migrations.current_revision(engine) is None
    async with engine.connect() as conn:
        leftovers = await conn.execute(
            text(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relname <> 'alembic_version' "
                "AND c.relname NOT LIKE 'alembic_version%'"
            )
        )
        assert leftovers.scalars().all() == []
    await migrations.upgrade(engine)
    assert await migrations.current_revision(engine) == migrations.head_revision()
    async with engine.connect() as conn:
        assert await conn.run_sync(_diff) == []


async def test_concurrent_upgrades_both_succeed(empty_database_url: str) -> None:
    """Two brokers starting at once on an empty database: the advisory lock serialises them."""
    engines = [create_engine(empty_database_url, pool_size=1, max_overflow=0) for _ in range(2)]
    try:
        await asyncio.gather(*(migrations.upgrade(e) for e in engines))
        for e in engines:
            assert await migrations.current_revision(e) == migrations.head_revision()
        async with engines[0].connect() as conn:
            count = await conn.scalar(text("SELECT count(*) FROM exchanges"))
        assert count == len(BUILTIN_EXCHANGES)
    finally:
        for e in engines:
            await e.dispose()
