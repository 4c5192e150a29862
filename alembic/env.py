"""alembic environment: async engine over asyncpg, metadata from ``app.storage.tables``.

The connection comes from ``config.attributes["connection"]`` when the broker migrates itself
(``app.storage.migrations``), else from ``DATABASE_URL`` — or, with none set, from the
embedded PostgreSQL in ``MESSAGEX_DATA_DIR``, as ``messagex serve`` would use.
"""

from __future__ import annotations

import asyncio
import logging.config

from sqlalchemy.engine import Connection

from alembic import context
from app.storage.tables import metadata

config = context.config
target_metadata = metadata

if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)


def do_run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    from app import runtime
    from app.config import load_settings
    from app.storage.database import create_engine

    settings = load_settings()
    async with runtime.database(settings) as url:
        engine = create_engine(
            url, pool_size=1, max_overflow=0, pool_mode=settings.database_pool_mode
        )
        try:
            async with engine.connect() as connection:
                await connection.run_sync(do_run_migrations)
                await connection.commit()
        finally:
            await engine.dispose()


connection = config.attributes.get("connection")
if connection is not None:
    do_run_migrations(connection)
elif context.is_offline_mode():
    context.configure(url="postgresql://", target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(run_async_migrations())
