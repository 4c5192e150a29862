"""What the benchmark runs on: a scratch database, a broker subprocess, and CPU meters.

Everything here targets loopback only: a non-loopback PostgreSQL or RabbitMQ address is
refused before any connection is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg
import httpx
import psutil

from app.storage.dsn import asyncpg_dsn
from bench.stats import BenchError

log = logging.getLogger("bench")

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"

# ----------------------------------------------------------------------------- loopback


def _is_loopback_host(host: str | None) -> bool:
    if not host or host.startswith("/"):  # no host (default socket) or a Unix socket path
        return True
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ensure_loopback(url: str, what: str) -> None:
    """Refuse any target that is not on this machine's loopback (or a Unix socket)."""
    parts = urlsplit(url)
    hosts = [parts.hostname]
    hosts += parse_qs(parts.query).get("host", [])
    for host in hosts:
        if not _is_loopback_host(host):
            raise BenchError(f"{what} must be on loopback (127.0.0.0/8, ::1) or a Unix socket")


def die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the harness dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ----------------------------------------------------------------------------- PostgreSQL


def with_database(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


@dataclass
class Postgres:
    """The server the benchmark uses: the one it was given, or an embedded one."""

    admin_url: str
    embedded: Any = None
    dbname: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    async def provide(cls, url: str) -> Postgres:
        ensure_loopback(url, "--database-url")
        try:
            conn = await asyncpg.connect(asyncpg_dsn(url), timeout=3)
            await conn.close()
            return cls(asyncpg_dsn(url))
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            print(
                f"PostgreSQL at {urlsplit(url).hostname or 'socket'} not reachable "
                f"({type(exc).__name__}); starting an embedded PostgreSQL",
                file=sys.stderr,
            )
        from app.runtime import EmbeddedPostgres

        embedded = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="mx-bench-pg-")))
        try:
            uri = await asyncio.to_thread(embedded.start)
        except BaseException:
            shutil.rmtree(embedded.data_dir, ignore_errors=True)
            raise
        return cls(asyncpg_dsn(uri), embedded=embedded)

    @property
    def url(self) -> str:
        """The bench database's URL."""
        return with_database(self.admin_url, self.dbname)

    async def _admin(self, *statements: str) -> None:
        conn = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            for sql in statements:
                await conn.execute(sql)
        finally:
            await conn.close()

    async def vacuum_messages(self) -> None:
        """VACUUM the bench database's messages table (see Run.scenario)."""
        conn = await asyncpg.connect(self.url, timeout=10)
        try:
            await conn.execute("VACUUM messages")
        finally:
            await conn.close()

    async def drop_stale(self, prefix: str) -> list[str]:
        """Drop ``<prefix><pid>`` databases whose harness process is gone (a killed run)."""
        conn = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            names = await conn.fetch(
                "SELECT datname FROM pg_database WHERE datname ~ $1", f"^{prefix}[0-9]+$"
            )
            stale = [r["datname"] for r in names if not psutil.pid_exists(int(r[0][len(prefix) :]))]
            for name in stale:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
        return stale

    async def create_database(self, name: str) -> None:
        self.dbname = name
        await self._admin(
            f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'
        )
        conn = await asyncpg.connect(self.url, timeout=10)
        try:
            self.info = {
                "server_version": await conn.fetchval("SHOW server_version"),
                "fsync": await conn.fetchval("SHOW fsync"),
                "synchronous_commit": await conn.fetchval("SHOW synchronous_commit"),
                "shared_buffers": await conn.fetchval("SHOW shared_buffers"),
                "embedded": self.embedded is not None,
            }
            # Read while the backend lives: it exits when the connection closes.
            self.info["postmaster_pid"] = _parent_pid(
                await conn.fetchval("SELECT pg_backend_pid()")
            )
        finally:
            await conn.close()

    async def drop_database(self) -> None:
        if self.dbname:
            await self._admin(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')

    def stop(self) -> None:
        if self.embedded is not None:
            try:
                self.embedded.stop()
            finally:
                shutil.rmtree(self.embedded.data_dir, ignore_errors=True)


def _parent_pid(pid: int) -> int | None:
    """The postmaster: the parent of one of its backends (None when not on this machine)."""
    try:
        parent: int = psutil.Process(pid).ppid()
    except (psutil.Error, OSError):
        return None
    return parent


# ----------------------------------------------------------------------------- broker


@dataclass
class BrokerProcess:
    """``messagex serve`` as a subprocess on a free loopback port, so its CPU can be read."""

    database_url: str
    user: str = "bench"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    port: int = 0
    workers: int = 1
    extra_env: dict[str, str] = field(default_factory=dict)
    process: asyncio.subprocess.Process | None = None
    log_path: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="mx-bench-")) / "broker.log"
    )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/v1/ws"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def command(self) -> list[str]:
        script = Path(sys.executable).with_name("messagex")
        head = [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]
        return [
            *head,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
        ]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGEX_")}
        env.update(
            DATABASE_URL=self.database_url,
            MESSAGEX_ADMIN_USER=self.user,
            MESSAGEX_ADMIN_PASSWORD=self.password,
            MESSAGEX_LOG_LEVEL="warning",
            MESSAGEX_LOG_FORMAT="text",
            MESSAGEX_DATA_DIR=str(self.log_path.parent / "data"),
        )
        env.update(self.extra_env)
        return env

    async def start(self, within: float = 60.0) -> None:
        self.port = free_port()
        with self.log_path.open("wb") as out:
            self.process = await asyncio.create_subprocess_exec(
                *self.command(),
                cwd=ROOT,
                env=self.environment(),
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        deadline = time.monotonic() + within
        async with httpx.AsyncClient(base_url=self.base_url, timeout=2) as client:
            while time.monotonic() < deadline:
                if not self.running():
                    raise BenchError(f"the broker exited at start-up:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/readyz")).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise BenchError(f"the broker was not ready within {within:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"

    async def stop(self) -> None:
        proc = self.process
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 10)

    def cleanup(self) -> None:
        """Remove the log and data directory (the log is printed when start-up fails)."""
        shutil.rmtree(self.log_path.parent, ignore_errors=True)


# ----------------------------------------------------------------------------- CPU meters

#: per-process CPU seconds (user + system) at one instant, keyed by pid
Sample = dict[int, float]


def _cpu(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
    except (psutil.Error, OSError):
        return None
    return float(times.user + times.system)


def tree_sample(pid: int) -> Sample:
    """A process and all its descendants (the broker, and its workers if it ever has some)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return {}
    out: Sample = {}
    for proc in procs:
        value = _cpu(proc)
        if value is not None:
            out[proc.pid] = value
    return out


# A client backend's title names its client: "... 127.0.0.1(50454) idle" or "... [local] ...".
_CLIENT_BACKEND = re.compile(r"\[local\]|\d+\.\d+\.\d+\.\d+\(\d+\)|[0-9a-f:]+\(\d+\)")


class PostgresSampler:
    """The postmaster's children that work for the bench database, plus the shared ones.

    Counted: client backends whose process title names the bench database, and the
    background processes (checkpointer, background writer, WAL writer, autovacuum, ...).
    Backends of other databases on a shared server are left out; background processes are
    shared, so on a busy server they may include other clients' work.

    Read while the load runs (``Meters.polled``), so it must cost the harness little: on
    Linux the children come from ``/proc/<pid>/task/*/children`` and their CPU times from
    ``/proc/<pid>/stat``, and each process's title is read once (keyed by pid and start
    time). psutil's ``children()`` reads the ``stat`` file of every process on the machine:
    3.8 ms per reading, which held the harness's event loop (and the ACKs it sends) every
    0.2 s in the MessageX and ceiling scenarios only, as RabbitMQ's meters are not polled.
    """

    def __init__(self, postmaster: int, dbname: str, *, backends_only: bool = False) -> None:
        """``backends_only``: the bench database's client backends alone, without the shared
        background processes (which on a shared server also work for other clients)."""
        self.postmaster = postmaster
        self.marker = f" {dbname} "
        self.backends_only = backends_only
        #: (pid, start time) -> whether the process is counted
        self._counted: dict[tuple[int, int], bool] = {}
        self._proc = Path(f"/proc/{postmaster}/task").is_dir()
        self._tick = os.sysconf("SC_CLK_TCK") if self._proc else 100

    def __call__(self) -> Sample:
        if not self._proc:
            return self._psutil_sample()
        out: Sample = {}
        for pid in self._children():
            stat = _proc_stat(pid)
            if stat is None:
                continue
            key = (pid, int(stat[19]))  # starttime: a reused pid is another process
            counted = self._counted.get(key)
            if counted is None:
                title = _proc_title(pid)
                counted = self._counts(title)
                if title is not None and title.startswith("postgres: "):  # its title is set
                    self._counted[key] = counted
            if counted:
                out[pid] = (int(stat[11]) + int(stat[12])) / self._tick  # utime + stime
        return out

    def _children(self) -> list[int]:
        pids: list[int] = []
        for task in Path(f"/proc/{self.postmaster}/task").iterdir():
            with contextlib.suppress(OSError):
                pids.extend(int(p) for p in (task / "children").read_text().split())
        return pids

    def _counts(self, title: str | None) -> bool:
        if title is None:
            return False
        if self.backends_only:
            return self.marker in title and _CLIENT_BACKEND.search(title) is not None
        return not _CLIENT_BACKEND.search(title) or self.marker in title

    def _psutil_sample(self) -> Sample:
        try:
            children = psutil.Process(self.postmaster).children()
        except (psutil.Error, OSError):
            return {}
        out: Sample = {}
        for proc in children:
            try:
                title = " ".join(proc.cmdline()) + " "
            except (psutil.Error, OSError):
                continue
            if self._counts(title):
                value = _cpu(proc)
                if value is not None:
                    out[proc.pid] = value
        return out


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 onwards), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _proc_title(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() + " "


def beam_sample() -> Sample:
    """RabbitMQ's Erlang VM (beam.smp) on this machine."""
    out: Sample = {}
    for proc in psutil.process_iter(["name"]):
        if proc.info.get("name") == "beam.smp":
            value = _cpu(proc)
            if value is not None:
                out[proc.pid] = value
    return out


def self_sample() -> Sample:
    times = os.times()
    return {os.getpid(): times.user + times.system}


def delta(before: Sample, after: Sample) -> float:
    """CPU spent between two samples, per pid: a process absent from ``before`` (started in
    between) counts from zero; one absent from ``after`` counts nothing."""
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


@dataclass
class Meters:
    """Named CPU samplers; ``start``/``stop`` bracket one scenario.

    The samplers named in ``polled`` are also read every ``poll_s`` seconds in between, and
    each process keeps its last reading: PostgreSQL backends come and go (a pool's overflow
    connections close when they are returned), and one that exits mid-scenario would
    otherwise take its CPU time with it. What it spent after its last reading is lost.
    """

    samplers: dict[str, Callable[[], Sample]]
    polled: frozenset[str] = frozenset({"postgres"})
    poll_s: float = 0.2
    _before: dict[str, Sample] = field(default_factory=dict)
    _after: dict[str, Sample] = field(default_factory=dict)
    _poller: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._before = {name: fn() for name, fn in self.samplers.items()}
        self._after = {name: dict(sample) for name, sample in self._before.items()}
        if self.polled & set(self.samplers):
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    def _read(self, names: Iterable[str]) -> None:
        for name in names:
            self._after[name].update(self.samplers[name]())

    async def _poll(self) -> None:
        names = [n for n in self.samplers if n in self.polled]
        while True:
            await asyncio.sleep(self.poll_s)
            # In a thread: a reading takes ~0.4 ms (PostgresSampler), which on the event loop
            # would land in the latencies the scenario is measuring.
            await asyncio.to_thread(self._read, names)

    def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        self._read(self.samplers)

    def per_1k(self, messages: int) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name in self.samplers:
            after = self._after.get(name)
            if not after or messages <= 0:
                out[name] = None
                continue
            spent = delta(self._before.get(name, {}), after)
            out[name] = round(spent / messages * 1000, 4)
        return out
