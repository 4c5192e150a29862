"""Builds the object graph (engine, services, background tasks) and tears it down."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app import runtime
from app.broker.services import build_services
from app.config import Settings
from app.storage import fastpath, health, migrations, pooler
from app.storage.database import Database, create_engine
from app.storage.fastpath import HotPath

log = logging.getLogger("messagex")


async def warn_if_autovacuum_off(db: Database) -> None:
    """Say once, at start, when autovacuum will not visit ``messages`` (the server's
    ``autovacuum = off``, or the table's ``autovacuum_enabled = false``): every ACK leaves a
    dead row that only VACUUM reclaims (docs/operations.md, "Bloat and autovacuum")."""
    try:
        async with db.connect() as conn:
            on = await health.autovacuum_on_messages(conn)
    except Exception as exc:  # the database is down: the broker says so elsewhere
        log.warning("could not read the autovacuum setting (%s)", type(exc).__name__)
        return
    if not on:
        log.warning(
            "autovacuum is off for the messages table: the rows of acknowledged messages are "
            "never reclaimed and the table grows without bound; turn it on, or run VACUUM "
            "messages regularly (docs/operations.md, Bloat and autovacuum)"
        )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    async with runtime.database(settings) as url:
        engine = create_engine(
            url,
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
            connect_timeout=settings.db_connect_timeout_seconds,
            pool_timeout=settings.db_pool_timeout_seconds,
            statement_timeout_ms=settings.db_statement_timeout_ms,
            pool_mode=settings.database_pool_mode,
        )
        fastpath.use_fast_array_checks()
        hot = HotPath(
            url,
            size=settings.db_pool_size,
            connect_timeout=settings.db_connect_timeout_seconds,
            acquire_timeout=settings.db_pool_timeout_seconds,
            statement_timeout_ms=settings.db_statement_timeout_ms,
            pool_mode=settings.database_pool_mode,
        )
        db = Database(engine, hot, pool_mode=settings.database_pool_mode)
        try:
            if settings.migrate_on_start:
                await migrations.upgrade(engine)
            await pooler.check_statement_timeout(
                settings.database_pool_mode, hot, settings.db_statement_timeout_ms
            )
            await warn_if_autovacuum_off(db)
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
