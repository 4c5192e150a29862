"""Test plumbing: a real PostgreSQL (external or embedded), template databases, a real server."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import orjson
import pytest

from app.broker.services import Services
from app.config import Settings, load_settings
from app.main import create_app
from app.server import BrokerServer, build_server
from app.storage.dsn import asyncpg_dsn

T = TypeVar("T")

ADMIN_USER = "admin"
ADMIN_PASSWORD = "admin-secret-password"


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 5.0,
    interval: float = 0.01,
    message: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy (so never None) or the deadline
    passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


async def async_wait_for(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    interval: float = 0.01,
    message: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


def with_database(url: str, dbname: str) -> str:
    """``url`` pointed at another database (works for host/port and socket URLs alike)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


async def _admin_sql(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


def admin_sql(url: str, *statements: str) -> None:
    asyncio.run(_admin_sql(url, *statements))


#: of the embedded test server (PostgreSQL's default is 100)
MAX_CONNECTIONS = 500


class PgCluster:
    """Where the test databases live: MESSAGEX_TEST_DATABASE_URL, or an embedded server."""

    def __init__(self, tmp: Path | None = None) -> None:
        self.embedded: Any = None
        url = os.environ.get("MESSAGEX_TEST_DATABASE_URL")
        if not url:
            from app.runtime import EmbeddedPostgres

            # Its own directory outside pytest's shared temp root: another pytest session on
            # the machine may prune that root while this one runs.
            self._own_dir = Path(tempfile.mkdtemp(prefix="messagex-pg-", dir=tmp))
            self.embedded = EmbeddedPostgres(self._own_dir)
            url = self.embedded.start()
            # A throwaway cluster: durability buys nothing here.
            admin_sql(
                url,
                "ALTER SYSTEM SET fsync = off",
                "ALTER SYSTEM SET synchronous_commit = off",
                "ALTER SYSTEM SET full_page_writes = off",
                # pytest-xdist workers share this server: each runs brokers (a pool of up to
                # 10 sessions and a LISTEN session each), some of them several processes.
                f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}",
            )
            # max_connections takes a restart (the settings above come along)
            self.embedded.stop()
            url = self.embedded.start()
        self.url = url
        self._counter = itertools.count()
        self.prefix = f"mxt_{os.getpid()}"

    def template(self) -> str:
        """Create and migrate the template database once; returns its name."""
        from app import runtime

        name = f"{self.prefix}_template"
        admin_sql(
            self.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'
        )
        asyncio.run(runtime.migrate(with_database(self.url, name)))
        return name

    def create_database(self, template: str | None) -> str:
        name = f"{self.prefix}_{next(self._counter)}"
        clause = f' TEMPLATE "{template}"' if template else ""
        admin_sql(
            self.url,
            f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
            f'CREATE DATABASE "{name}"{clause}',
        )
        return name

    def drop_database(self, name: str) -> None:
        admin_sql(self.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def url_for(self, name: str) -> str:
        return with_database(self.url, name)

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()
            shutil.rmtree(self._own_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LoopbackUrls:
    """``base_url``, ``api`` and ``ws_url`` of whatever listens on 127.0.0.1:``port``: a
    test server, a broker process, or haproxy in front of several."""

    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        return f"{self.base_url}/api/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/v1/ws"


@dataclass
class LiveServer(LoopbackUrls):
    """A real uvicorn server in a thread of this process, on a loopback port."""

    settings: Settings
    server: BrokerServer
    thread: threading.Thread
    port: int

    @property
    def database_url(self) -> str:
        url = self.settings.database_url
        assert url is not None, "a test server always has its database"
        return url

    @property
    def services(self) -> Services:
        """The running broker's services (white box: tests that watch it from inside)."""
        services: Services = self.server.broker_app.state.services
        return services

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def test_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "admin_user": ADMIN_USER,
        "admin_password": ADMIN_PASSWORD,
        "log_format": "text",
        "db_pool_size": 5,
        "db_max_overflow": 5,
        # Cheap hashes keep the suite fast; production parameters are tested in test_accounts.
        "argon2_time_cost": 1,
        "argon2_memory_kib": 1024,
        "argon2_parallelism": 1,
    }
    values.update(overrides)
    return load_settings(**values)


def start_server(settings: Settings, *, plain_websockets: bool = False) -> LiveServer:
    """``plain_websockets``: uvicorn's own WebSocket protocol instead of ours, as under any
    other ASGI server (no ``SEND_MANY`` extension)."""
    app = create_app(settings)
    port = free_port()
    server = build_server(app, settings, "127.0.0.1", port, log_level="warning")
    if plain_websockets:
        server.config.ws = "websockets-sansio"
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    live = LiveServer(settings, server, thread, port)
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the test server failed to start")
        if time.monotonic() > deadline:
            live.stop()
            raise RuntimeError("the test server did not start within 30 s")
        time.sleep(0.005)
    return live


@contextmanager
def running_server(settings: Settings, *, plain_websockets: bool = False) -> Iterator[LiveServer]:
    live = start_server(settings, plain_websockets=plain_websockets)
    try:
        yield live
    finally:
        live.stop()


def login(base_url: str, username: str, password: str) -> str:
    r = httpx.post(
        f"{base_url}/api/v1/auth/login", json={"username": username, "password": password}
    )
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


def client(base_url: str, token: str | None = None, **kwargs: Any) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=f"{base_url}/api/v1", headers=headers, timeout=30, **kwargs)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a Prometheus text exposition, or None when absent."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith((name + "{", name + " ")):
            continue
        sample, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', sample[len(name) :]))
        if found == labels:
            return float(value)
    return None


class Sql:
    """An application's own connection (asyncpg, on a loop of its own: the tests are sync, as
    the WebSocket and HTTP clients are). JSON in and out as Python values."""

    def __init__(self, dsn: str, *, codec: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self.conn: asyncpg.Connection = self.loop.run_until_complete(asyncpg.connect(dsn))
        if codec:
            self.loop.run_until_complete(
                self.conn.set_type_codec(
                    "jsonb", encoder=_json, decoder=orjson.loads, schema="pg_catalog"
                )
            )
        self.depth = 0

    def val(self, query: str, *args: Any) -> Any:
        return self.loop.run_until_complete(self.conn.fetchval(query, *args))

    def rows(self, query: str, *args: Any) -> list[asyncpg.Record]:
        found: list[asyncpg.Record] = self.loop.run_until_complete(self.conn.fetch(query, *args))
        return found

    def exec(self, query: str, *args: Any) -> None:
        self.loop.run_until_complete(self.conn.execute(query, *args))

    @contextmanager
    def tx(self) -> Iterator[None]:
        """A transaction, or inside one a savepoint; rolled back by an exception."""
        self.depth += 1
        name = f"s{self.depth}"
        self.exec("BEGIN" if self.depth == 1 else f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self.exec("ROLLBACK" if self.depth == 1 else f"ROLLBACK TO SAVEPOINT {name}")
            raise
        else:
            self.exec("COMMIT" if self.depth == 1 else f"RELEASE SAVEPOINT {name}")
        finally:
            self.depth -= 1

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def dsn_as(url: str, user: str, database: str | None = None) -> str:
    """``url`` (a broker DATABASE_URL, TCP or a Unix socket's ``?host=``) as an asyncpg DSN
    that logs in as ``user`` (no password: the test servers trust local logins), to
    ``database`` when given."""
    from urllib.parse import urlsplit, urlunsplit

    from app.storage.dsn import asyncpg_dsn

    parts = urlsplit(asyncpg_dsn(url))
    host = parts.netloc.rpartition("@")[2]
    path = f"/{database}" if database is not None else parts.path
    return urlunsplit((parts.scheme, f"{user}@{host}", path, parts.query, parts.fragment))


def unavailable_here(reason: str) -> NoReturn:
    """A system tool or privilege a test needs is missing: skip it on a developer's machine,
    but fail in CI (``CI`` set), where .ci/run installs what the suite needs."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)
