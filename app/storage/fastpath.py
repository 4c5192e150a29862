"""The hot path's executor: statements written with SQLAlchemy Core, compiled once, and run
as prepared statements on a plain asyncpg pool — no ORM, no SQLAlchemy execution machinery,
and no transaction wrapper around a single statement (PostgreSQL runs it atomically alone).

Measured (docs/performance.md): per statement this saves the BEGIN and COMMIT round trips
and about 0.1 ms of CPU that SQLAlchemy's execute path costs, which on publish, claim and
ack is most of the broker's own work. Everything else (topology, accounts, browse) keeps
the SQLAlchemy engine: it is not hot, and there the convenience wins.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson
from sqlalchemy.dialects.postgresql import asyncpg as asyncpg_dialect
from sqlalchemy.sql.elements import TextClause

from app import jsonexact
from app.errors import BrokerError
from app.storage import driver_errors, planner, pooler
from app.storage.dsn import asyncpg_dsn

#: how much longer than the server's statement timeout the client waits for an answer before
#: it takes the connection for dead (a peer gone silent: no FIN, no RST); docs/reliability.md
COMMAND_MARGIN_SECONDS = 2.0


def command_timeout(connect_timeout: float, statement_timeout_ms: int) -> float:
    """The client-side bound on any one statement: the server cancels it at its statement
    timeout and answers; no answer by then plus ``COMMAND_MARGIN_SECONDS`` means the link is
    gone, and waiting on would hang the request until TCP gives up (minutes)."""
    return max(connect_timeout, statement_timeout_ms / 1000 + COMMAND_MARGIN_SECONDS)


def use_fast_array_checks() -> bool:
    """Let asyncpg tell an array parameter's nested arrays by type, not by ABC: a patch of
    asyncpg's protocol module for the whole process, which the broker applies at start-up
    (app/lifespan.py), never on import. Returns whether it is in effect; calling it again
    changes nothing.

    To find nested arrays, asyncpg's array encoder asks ``isinstance(element, Iterable)`` and
    ``isinstance(element, Sized)`` of every element of every array parameter, and each ask is
    a Python-level ``ABCMeta.__instancecheck__`` call (0.5 µs per element, measured): a
    100-message publish passes about 1,000 elements, and the profile put 3.3 % of the
    broker's samples there (docs/performance.md, round 6). With ``(list, tuple)`` the check
    is a C type test. The one thing it changes: an array parameter (or a nested array) must
    be a list or a tuple, not any sized iterable; every array the broker passes is a list
    (tests/integration/test_fastpath_arrays.py). When a later asyncpg no longer has these module
    names, nothing is patched and the encoder works as it does upstream.
    """
    from asyncpg.protocol import protocol

    if not all(hasattr(protocol, name) for name in ("IterableABC", "SizedABC")):
        return False
    protocol.IterableABC = (list, tuple)
    protocol.SizedABC = (list, tuple)
    return True


_DIALECT = asyncpg_dialect.dialect()  # type: ignore[no-untyped-call]


class Statement:
    """A Core statement compiled once to asyncpg's ``$n`` form, with its parameter order."""

    def __init__(self, clause: TextClause) -> None:
        compiled = clause.compile(dialect=_DIALECT)
        self.sql = str(compiled)
        self.names: tuple[str, ...] = tuple(compiled.positiontup or ())

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        return [params[name] for name in self.names]


def jsonb_text(value: Any) -> str:
    """The one encoder of json/jsonb parameters (the connections' codec, and the publish's
    headers and properties): text passes as it is (already JSON: the callers serialize
    once); the rest is written by orjson, or by the stdlib when orjson cannot (an integer
    beyond 64 bits), so that what ``jsonexact.loads`` read is stored exactly."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def jsonb_text_sized(value: Any) -> tuple[str, int]:
    """``jsonb_text(value)`` and its size in UTF-8 bytes, from one encoding."""
    try:
        raw = orjson.dumps(value)
    except TypeError:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        return text, len(text.encode("utf-8", "surrogatepass"))
    return raw.decode(), len(raw)


def _decode_json(text: str) -> Any:
    return jsonexact.loads(text)


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(
            typename, encoder=jsonb_text, decoder=_decode_json, schema="pg_catalog"
        )


async def _no_reset(conn: asyncpg.Connection) -> None:
    return None


async def _drop_read_only(pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
    """A statement was refused as read-only: the server is no longer the primary (see
    ``database._read_only_is_disconnect``). This connection is closed and the pool's others
    are replaced as they are next released, so new ones find the primary."""
    conn.terminate()
    await pool.expire_connections()


class HotPath:
    """Small asyncpg pools, opened on first use: one for the hot path's statements, and a
    smaller one for those that may keep generic plans (``connection(stable=True)``,
    storage/planner.py)."""

    #: connections of the stable pool: only the publisher's group writer, one write at a time
    #: per process, uses it
    STABLE_SIZE = 2

    def __init__(
        self,
        dsn: str,
        *,
        size: int = 10,
        connect_timeout: float = 5.0,
        acquire_timeout: float = 5.0,
        statement_timeout_ms: int = 30_000,
        pool_mode: pooler.PoolMode = pooler.SESSION,
    ) -> None:
        self.dsn = asyncpg_dsn(dsn)
        #: how the URL reaches PostgreSQL (storage/pooler.py)
        self.pool_mode = pool_mode
        self.size = size
        self.connect_timeout = connect_timeout
        self.acquire_timeout = acquire_timeout
        #: a statement with no answer by then fails (TimeoutError → 503): see
        #: ``command_timeout``; without it a silent network hangs the request
        self.command_timeout = command_timeout(connect_timeout, statement_timeout_ms)
        self.server_settings = {"application_name": "messagex"}
        if statement_timeout_ms:
            self.server_settings["statement_timeout"] = str(statement_timeout_ms)
        self._pools: dict[bool, asyncpg.Pool] = {}
        self._opening = asyncio.Lock()

    async def _get_pool(self, stable: bool) -> asyncpg.Pool:
        pool = self._pools.get(stable)
        if pool is None:
            async with self._opening:
                pool = self._pools.get(stable)
                if pool is None:
                    pool = self._pools[stable] = await asyncpg.create_pool(
                        self.dsn,
                        min_size=0,
                        max_size=self.STABLE_SIZE if stable else self.size,
                        timeout=self.connect_timeout,
                        command_timeout=self.command_timeout,
                        init=self._init_connection(stable),
                        # The hot path never leaves a transaction, LISTEN or advisory lock
                        # open, so the default reset (one more round trip per release) is
                        # pure cost.
                        reset=_no_reset,
                        server_settings=pooler.startup_settings(self.server_settings),
                        **pooler.driver_args(self.pool_mode),
                    )
        return pool

    def _init_connection(
        self, stable: bool
    ) -> Callable[[asyncpg.Connection], Coroutine[Any, Any, None]]:
        """A new connection's set-up: the JSON codecs, and the settings (storage/pooler.py)."""
        settings = {**self.server_settings, **(planner.STABLE if stable else planner.SETTINGS)}
        setup = pooler.session_setup(self.pool_mode, settings)

        async def init(conn: asyncpg.Connection) -> None:
            await _init_connection(conn)
            if setup is not None:
                await conn.execute(setup)

        return init

    @asynccontextmanager
    async def connection(self, *, stable: bool = False) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; driver failures become Unavailable (503) or InternalError
        (500, logged by SQLSTATE and constraint only, never with SQL or data). ``stable``:
        for a statement whose every plan is safe (it reads nothing of messages), which may
        keep a generic plan (storage/planner.py)."""
        connected = False
        try:
            pool = await self._get_pool(stable)
            async with pool.acquire(timeout=self.acquire_timeout) as conn:
                connected = True
                try:
                    yield conn
                except (TimeoutError, asyncio.CancelledError):
                    # A statement cut short (no answer in time, or the caller gave up): the
                    # connection is mid-query, or its link is dead. Closed now, it is not
                    # handed out again, and the pool's release does not wait (without a
                    # bound) for asyncpg's cancel request to get through.
                    conn.terminate()
                    raise
                except asyncpg.PostgresError as exc:
                    if exc.sqlstate == driver_errors.READ_ONLY:
                        await _drop_read_only(pool, conn)
                    raise
        except BrokerError:
            raise  # domain errors, including those callers mapped from constraints
        except Exception as exc:
            mapped = driver_errors.domain_error(exc, connecting=not connected)
            if mapped is None:
                raise
            raise mapped from None

    async def fetch(self, stmt: Statement, params: Mapping[str, Any]) -> Sequence[Any]:
        async with self.connection() as conn:
            rows: Sequence[Any] = await conn.fetch(stmt.sql, *stmt.args(params))
            return rows

    async def fetchval(self, stmt: Statement, params: Mapping[str, Any]) -> Any:
        async with self.connection() as conn:
            return await conn.fetchval(stmt.sql, *stmt.args(params))

    def use(self) -> tuple[int, int]:
        """(connections in use, most it may open) of the hot path's main pool."""
        pool = self._pools.get(False)
        if pool is None:
            return 0, self.size
        return pool.get_size() - pool.get_idle_size(), pool.get_max_size()

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()
