"""A dedicated PostgreSQL connection for LISTEN/NOTIFY, watched and re-established.

NOTIFY is only a hint here: callers keep a slow poll for lost wake-ups, and a failed
``notify`` is logged and dropped, never raised into a publish.

Behind a transaction pooler a LISTEN would be made on whichever server connection the pooler
lent for that one statement, and the notifications would go to nobody (silently). There the
connection is made with ``listen=False``: it only sends, and the owner polls instead
(broker/cluster.py, storage/pooler.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

import asyncpg

from app.storage import pooler
from app.storage.dsn import asyncpg_dsn

log = logging.getLogger("messagex.listener")

#: PostgreSQL caps a NOTIFY payload just under 8000 bytes.
MAX_PAYLOAD = 7900
#: the LISTEN pid a process reports when it polls by choice (no backend has pid 0): its
#: connection is transaction-pooled and it has no direct one (diagnosis, §19)
POLLING_PID = 0


def wants_primary(dsn: str) -> bool:
    """Whether ``dsn`` asks for a read-write server (``target_session_attrs=read-write`` or
    ``primary``): then a connection whose server turned read-only is left for another."""
    query = parse_qsl(dsn.partition("?")[2], keep_blank_values=True)
    return any(k == "target_session_attrs" and v in ("read-write", "primary") for k, v in query)


class Listener:
    def __init__(
        self,
        dsn: str,
        channel: str,
        on_message: Callable[[str], None],
        on_connected: Callable[[], None],
        *,
        keepalive_seconds: float = 5.0,
        connect_timeout: float = 5.0,
        listen: bool = True,
        pool_mode: pooler.PoolMode = pooler.SESSION,
    ) -> None:
        self.dsn = asyncpg_dsn(dsn)
        #: False: the connection only sends (NOTIFY), it never LISTENs (see above)
        self.listen = listen
        self.pool_mode = pool_mode
        self.channel = channel
        self.on_message = on_message
        self.on_connected = on_connected
        self.keepalive_seconds = keepalive_seconds
        self.connect_timeout = connect_timeout
        #: the URL asks for the primary (``target_session_attrs``, docs/operations.md "High
        #: availability of the database"): the keep-alive check then also leaves a server
        #: that turned read-only (fenced in a failover), and reconnecting finds the new
        #: primary, where the other brokers' NOTIFYs go
        self.wants_primary = wants_primary(self.dsn)
        self._conn: Any = None
        #: the server pid of the LISTEN connection while it is up (diagnosis, §19)
        self.backend_pid: int | None = None
        self._lock = asyncio.Lock()
        self.connected = asyncio.Event()
        #: Set when the connection is known to be broken (the server closed it, or a NOTIFY on
        #: it failed): the watcher reconnects at once instead of at its next keep-alive check.
        self._lost = asyncio.Event()

    def _callback(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        try:
            self.on_message(payload)
        except Exception:
            log.exception("notification handler failed")

    async def run(self) -> None:
        """Listen forever: connect, LISTEN, check the connection, reconnect after a failure."""
        backoff = 0.1
        while True:
            try:
                await self._connect()
                backoff = 0.1
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", type(exc).__name__)
            finally:
                self.connected.clear()
                await self._close()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _connect(self) -> None:
        conn = await asyncpg.connect(
            self.dsn,
            timeout=self.connect_timeout,
            server_settings={"application_name": "messagex-listener"},
            **pooler.driver_args(self.pool_mode),
        )
        try:
            if self.listen:
                await conn.add_listener(self.channel, self._callback)
        except BaseException:
            # Not yet in ``self._conn``, so ``_close`` cannot reach it: a failed LISTEN, or a
            # cancel (shutdown) landing during it, would leave the socket open until the event
            # loop closes over it (a ResourceWarning, and uvloop's close failing with EBUSY).
            conn.terminate()
            raise
        conn.add_termination_listener(lambda _conn: self._lost.set())
        self._lost.clear()
        self._conn = conn
        self.backend_pid = conn.get_server_pid() if self.listen else None
        self.connected.set()
        # After a (re)connect, wake-ups sent meanwhile are lost: let the owner poll once.
        self.on_connected()

    async def _watch(self) -> None:
        """Return (to reconnect) when the connection is lost; check it every keep-alive period,
        since a peer that vanished without closing the socket is noticed only by asking."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), self.keepalive_seconds)
            if self._lost.is_set():
                raise ConnectionError("the LISTEN connection was closed")
            async with self._lock:
                read_only = await asyncio.wait_for(
                    self._conn.fetchval(
                        "SELECT pg_is_in_recovery()"
                        " OR current_setting('transaction_read_only')::bool"
                    ),
                    self.connect_timeout,
                )
            if read_only and self.wants_primary:
                raise ConnectionError("the LISTEN connection's server is no longer the primary")

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        self.backend_pid = None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to do
                conn.terminate()

    async def notify(self, payload: str) -> bool:
        """Send a notification on this connection; False (logged) when it could not be sent."""
        conn = self._conn
        if conn is None:
            return False
        try:
            async with self._lock:
                await asyncio.wait_for(
                    conn.execute("SELECT pg_notify($1, $2)", self.channel, payload),
                    self.connect_timeout,
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("NOTIFY failed (%s); the poll fallback covers it", type(exc).__name__)
            if not isinstance(exc, asyncpg.PostgresError):  # no answer: the link is broken
                self._lost.set()  # reconnect now, not at the next keep-alive check
            return False
        return True

    async def close(self) -> None:
        await self._close()
