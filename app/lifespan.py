"""Builds the object graph (engine, services, background tasks) and tears it down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.broker.services import build_services
from app.config import Settings
from app.storage import fastpath, migrations
from app.storage.database import Database, EmbeddedPostgres, create_engine
from app.storage.dsn import redacted
from app.storage.fastpath import HotPath

log = logging.getLogger("messagex")


async def _database_url(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    if settings.database_url is not None:
        log.info("using PostgreSQL at %s", redacted(settings.database_url))
        return settings.database_url, None
    embedded = EmbeddedPostgres(settings.data_dir)
    url = await asyncio.to_thread(embedded.start)
    log.info("no DATABASE_URL: started embedded PostgreSQL in %s", settings.data_dir / "pgdata")
    return url, embedded


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    url, embedded = await _database_url(settings)
    engine = create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        connect_timeout=settings.db_connect_timeout_seconds,
        pool_timeout=settings.db_pool_timeout_seconds,
        statement_timeout_ms=settings.db_statement_timeout_ms,
    )
    fastpath.use_fast_array_checks()
    hot = HotPath(
        url,
        size=settings.db_pool_size,
        connect_timeout=settings.db_connect_timeout_seconds,
        acquire_timeout=settings.db_pool_timeout_seconds,
        statement_timeout_ms=settings.db_statement_timeout_ms,
    )
    db = Database(engine, hot)
    try:
        if settings.migrate_on_start:
            await migrations.upgrade(engine)
        services = build_services(settings, db, url)
        await services.start()
        app.state.services = services
        log.info("messagex ready")
        try:
            yield
        finally:
            await services.stop()
    finally:
        await db.dispose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
            log.info("embedded PostgreSQL stopped")
