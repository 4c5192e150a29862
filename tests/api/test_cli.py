"""``messagex serve`` and ``messagex migrate`` as a user runs them: real subprocesses."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.storage import migrations
from app.storage.dsn import asyncpg_dsn
from tests.support import free_port, wait_for

MESSAGEX = Path(sys.executable).with_name("messagex")
READY_DEADLINE = 90.0


def _base_env(**extra: str) -> dict[str, str]:
    """The machine's environment minus every broker setting, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MESSAGEX_") and k not in {"DATABASE_URL", "ACK_TIMEOUT_SECONDS"}
    }
    env.update(extra)
    return env


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    seconds_to_ready: float

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_DEADLINE
    while True:
        if proc.poll() is not None:
            raise AssertionError(
                f"messagex serve exited with {proc.returncode}:\n{log.read_text()}"
            )
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"/readyz not 200 within {READY_DEADLINE} s:\n{log.read_text()}")
        time.sleep(0.05)


@contextmanager
def serve(data_dir: Path, log: Path) -> Iterator[Served]:
    port = free_port()
    env = _base_env(
        MESSAGEX_DATA_DIR=str(data_dir),
        MESSAGEX_PORT=str(port),
        MESSAGEX_ADMIN_USER="cli-admin",
        MESSAGEX_ADMIN_PASSWORD="cli-admin-password",
        MESSAGEX_LOG_FORMAT="json",
    )
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(MESSAGEX), "serve"], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}/readyz", log)
        yield Served(proc, port, log, time.monotonic() - started)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().splitlines()[0])


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _gone(pid: int) -> bool:
    return not _alive(pid)


def _stop(served: Served) -> int:
    served.proc.send_signal(signal.SIGTERM)
    return served.proc.wait(timeout=60)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data directory outside pytest's tmp root: a pytest session starting elsewhere on the
    machine makes that root private again (0700), which would lock out the embedded server's
    system user when the tests run as root."""
    root = Path(tempfile.mkdtemp(prefix="messagex-cli-"))
    try:
        yield root / "data"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_serve_on_embedded_postgresql_starts_and_stops_cleanly(
    tmp_path: Path, data_dir: Path
) -> None:
    pgdata = data_dir / "pgdata"
    timings = {}
    for run in ("cold", "warm"):
        log = tmp_path / f"serve-{run}.log"
        with serve(data_dir, log) as served:
            timings[run] = served.seconds_to_ready
            r = httpx.get(
                f"{served.base_url}/api/v1/overview", auth=("cli-admin", "cli-admin-password")
            )
            assert r.status_code == 200, r.text
            assert r.json()["exchanges"] == 4
            pid = _postmaster_pid(pgdata)
            assert _alive(pid)
            if run == "warm":
                _check_database_url(data_dir)
            assert _stop(served) == 0, log.read_text()
        text = log.read_text()
        assert "embedded PostgreSQL" in text
        assert str(pgdata) in text  # the log says where the data lives
        assert "Traceback" not in text
        # The embedded server went away with the broker.
        assert not (pgdata / "postmaster.pid").exists()
        wait_for(partial(_gone, pid), timeout=10, message="embedded postgres to exit")
    stopped = _database_url_command(MESSAGEX_DATA_DIR=str(data_dir))
    assert stopped.returncode == 1
    assert "no embedded PostgreSQL is running" in stopped.stderr
    print(
        f"\nmessagex serve -> /readyz 200: cold {timings['cold']:.2f} s, "
        f"warm {timings['warm']:.2f} s"
    )


def _database_url_command(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MESSAGEX), "database-url"],
        env=_base_env(**env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _check_database_url(data_dir: Path) -> None:
    """``messagex database-url`` prints a URL an application connects to (§18)."""
    result = _database_url_command(MESSAGEX_DATA_DIR=str(data_dir))
    assert result.returncode == 0, result.stderr
    url = result.stdout.strip()

    async def exchanges() -> int:
        conn = await asyncpg.connect(url)
        try:
            count: int = await conn.fetchval("SELECT count(*) FROM exchanges")
        finally:
            await conn.close()
        return count

    assert asyncio.run(exchanges()) == 4


def test_database_url_prints_database_url_as_set() -> None:
    url = "postgresql://app@db.example:5432/orders"
    result = _database_url_command(DATABASE_URL=url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == url + "\n"


def test_migrate_command_brings_a_database_to_head(empty_database_url: str) -> None:
    result = subprocess.run(
        [str(MESSAGEX), "migrate"],
        env=_base_env(DATABASE_URL=empty_database_url, MESSAGEX_LOG_FORMAT="text"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr

    async def revision_and_exchanges() -> tuple[str, int]:
        conn = await asyncpg.connect(asyncpg_dsn(empty_database_url))
        try:
            revision = await conn.fetchval("SELECT version_num FROM alembic_version")
            count = await conn.fetchval("SELECT count(*) FROM exchanges")
        finally:
            await conn.close()
        return revision, count

    revision, count = asyncio.run(revision_and_exchanges())
    assert revision == migrations.head_revision()
    assert count == 4
    # The password, if any, never reaches the log; the target does.
    assert "migrating" in result.stderr


@pytest.mark.parametrize(
    "argv", [["--help"], ["serve", "--help"], ["migrate", "--help"], ["database-url", "--help"]]
)
def test_help_exits_zero(argv: list[str]) -> None:
    result = subprocess.run(
        [str(MESSAGEX), *argv],
        env=_base_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: messagex" in result.stdout


def test_serve_with_two_workers_shares_the_port_and_stops_cleanly(
    database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    env = _base_env(
        DATABASE_URL=database_url,
        MESSAGEX_ADMIN_USER="admin",
        MESSAGEX_ADMIN_PASSWORD="workers-secret",
        MESSAGEX_LOG_FORMAT="text",
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(MESSAGEX), "serve", "--port", str(port), "--workers", "2"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(proc, f"{base}/readyz", log)

        async def live_processes() -> int:
            conn = await asyncpg.connect(asyncpg_dsn(database_url))
            try:
                return int(await conn.fetchval("SELECT count(*) FROM broker_processes"))
            finally:
                await conn.close()

        wait_for(lambda: asyncio.run(live_processes()) == 2, timeout=30, message="2 workers")
        auth = ("admin", "workers-secret")
        with httpx.Client(base_url=f"{base}/api/v1", auth=auth, timeout=10) as c:
            assert c.put("/queues/w", json={}).status_code == 201
            for i in range(20):  # new connections: the kernel spreads them over the workers
                assert c.post("/queues/w/messages", json={"body": i}).status_code == 200
            got = c.post("/queues/w/get", json={"max_messages": 100}).json()["messages"]
            assert sorted(m["body"] for m in got) == list(range(20))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert asyncio.run(live_processes()) == 0  # each worker left the heartbeat table
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
