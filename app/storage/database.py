"""The engine factory and ``Database``; driver errors are mapped by ``driver_errors``, the
embedded PostgreSQL is started by ``app.runtime``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.storage import driver_errors, dsn, planner, pooler
from app.storage.driver_errors import guard
from app.storage.fastpath import HotPath, command_timeout

#: A connection as the layers above storage hold it (they never use SQLAlchemy themselves).
Connection = AsyncConnection


def create_engine(
    url: str,
    *,
    pool_size: int = 10,
    max_overflow: int = 10,
    connect_timeout: float = 5.0,
    pool_timeout: float = 5.0,
    statement_timeout_ms: int = 30_000,
    application_name: str = "messagex",
    pool_mode: pooler.PoolMode = pooler.SESSION,
) -> AsyncEngine:
    """An async engine over asyncpg whose every wait is bounded, so requests fail fast (503);
    ``pool_mode``: how the URL reaches PostgreSQL (storage/pooler.py)."""
    server_settings = {"application_name": application_name, **planner.SETTINGS}
    if statement_timeout_ms:
        server_settings["statement_timeout"] = str(statement_timeout_ms)
    engine = create_async_engine(
        dsn.sqlalchemy_url(url),
        hide_parameters=True,  # message bodies and passwords never reach an error text
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout,
        pool_pre_ping=False,
        pool_recycle=1800,
        connect_args={
            "timeout": connect_timeout,
            "command_timeout": command_timeout(connect_timeout, statement_timeout_ms),
            "server_settings": pooler.startup_settings(server_settings),
            **pooler.dialect_args(pool_mode),
        },
    )
    event.listen(engine.sync_engine, "handle_error", _read_only_is_disconnect)
    event.listen(engine.sync_engine.pool, "checkout", _refuse_closed_connection)
    _set_on_connect(engine, pooler.session_setup(pool_mode, server_settings))
    return engine


def _set_on_connect(engine: AsyncEngine, setup: str | None) -> None:
    """Run ``setup`` (storage/pooler.py: the settings a pooler would refuse at start-up) once
    on each new connection, outside any transaction (a rollback must not undo it)."""
    if setup is None:
        return

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.run_async(lambda raw: raw.execute(setup))

    event.listen(engine.sync_engine, "connect", on_connect)


def _refuse_closed_connection(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Pool checkout: a pooled connection whose server session has ended (pg_terminate_backend,
    a restart, a failover, an idle timeout) is discarded and replaced before it is handed out,
    instead of failing the request it was given to with a 503.

    Free, unlike ``pool_pre_ping`` (a round trip per checkout): asyncpg notices the server's
    close on its own, as soon as the event loop reads the socket's EOF, and says so in
    ``is_closed()``. Raising ``DisconnectionError`` here makes the pool drop the connection and
    check out another (SQLAlchemy retries up to three times). A peer that vanished without a
    FIN is not noticed here; that request gets a 503 and the connection is invalidated.
    """
    raw = getattr(dbapi_connection, "_connection", None)  # the asyncpg connection
    if raw is not None and raw.is_closed():
        raise sa_exc.DisconnectionError("the server closed this pooled connection")


def _read_only_is_disconnect(context: Any) -> None:
    """A statement refused as read-only (25006): this connection's server is no longer the
    primary (a failover fenced it read-only, or a DNS name moved to another server). Taken
    as a disconnect, so SQLAlchemy discards the connection and every pooled one opened
    before it (they reached the same server), and the next checkout connects afresh: with
    a multi-host DATABASE_URL and ``target_session_attrs=read-write``, to the new primary.
    The request itself gets a 503 (docs/operations.md, "High availability of the database").
    """
    if driver_errors.sqlstate(context.original_exception) == driver_errors.READ_ONLY:
        context.is_disconnect = True


class Database:
    """The engine and the two ways to use it (a transaction, or one autocommit statement),
    plus ``hot``: the asyncpg executor of the hot path (publish, claim, ack)."""

    def __init__(
        self,
        engine: AsyncEngine,
        hot: HotPath | None = None,
        *,
        pool_mode: pooler.PoolMode = pooler.SESSION,
    ) -> None:
        self.engine = engine
        #: how the engine's URL reaches PostgreSQL (storage/pooler.py)
        self.pool_mode = pool_mode
        self.hot = hot or HotPath(
            engine.url.render_as_string(hide_password=False),
            size=engine.pool.size(),  # type: ignore[attr-defined]
            pool_mode=pool_mode,
        )

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        async with guard(), self.engine.begin() as conn:
            yield conn

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection without a transaction block (autocommit per statement)."""
        async with guard(), self.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn

    def pool_use(self) -> tuple[int, int]:
        """(connections in use, most it may open) of the fuller of this process's pools: the
        engine's (look-ups, transactions) and the hot path's (publish, claim, ack)."""
        pool: Any = self.engine.pool
        overflow = max(0, getattr(pool, "_max_overflow", 0))  # QueuePool's; -1: unbounded
        engine = (pool.checkedout(), pool.size() + overflow)
        return max(engine, self.hot.use(), key=lambda u: u[0] / u[1] if u[1] else 0.0)

    async def dispose(self) -> None:
        await self.hot.close()
        await self.engine.dispose()
