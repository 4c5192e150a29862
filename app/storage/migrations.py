"""Run alembic from inside the broker, serialised by an advisory lock across processes."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from alembic import command

#: pg_advisory_xact_lock key shared by every broker process that migrates at start-up.
MIGRATION_LOCK_KEY = 0x6D65_7373_6167_6578  # "messagex"

_ROOT = Path(__file__).resolve().parents[2]


def alembic_config() -> Config:
    ini = _ROOT / "alembic.ini"
    cfg = Config(str(ini)) if ini.exists() else Config()
    cfg.set_main_option("script_location", str(_ROOT / "alembic"))
    cfg.attributes["configure_logger"] = False
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _upgrade(connection: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def _downgrade(connection: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.downgrade(cfg, revision)


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Migrate to ``revision``; concurrent callers wait for each other on an advisory lock.

    The lock is the transaction's (every migration runs in that one transaction, alembic/env.py):
    a session lock would outlive it on a transaction pooler's server connection, and be
    released, or not, on whichever server connection the unlock reached (storage/pooler.py)."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        await conn.run_sync(_upgrade, revision)
        await conn.commit()


async def downgrade(engine: AsyncEngine, revision: str = "base") -> None:
    async with engine.connect() as conn:
        await conn.run_sync(_downgrade, revision)
        await conn.commit()


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(_current)
