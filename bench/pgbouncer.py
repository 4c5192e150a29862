"""Debian's PgBouncer (/usr/sbin/pgbouncer) in front of a database (issue 23, item 3): the
benchmark's ``pooler`` group (bench/pooler.py) and the fault suite (tests/faults/pgbouncer.py).

``PgBouncer.in_front_of(database_url, pool_mode)`` writes an ini of its own (trust auth, a
fallback ``*`` database that forwards every name, loopback on a free port, no Unix socket)
and starts the real pgbouncer on it; ``url_for`` points a database URL at it. The server
behind it is reached as ``database_url`` does: over TCP, or over the embedded PostgreSQL's
Unix socket (``?host=/dir``). PgBouncer refuses to run as root: as root it is started with
``-u`` as the user that owns that socket directory (who can reach it), or ``nobody`` over TCP.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from bench.infra import free_port

PGBOUNCER = Path(os.environ.get("MESSAGEX_TEST_PGBOUNCER", "/usr/sbin/pgbouncer"))
#: why a test that needs PgBouncer is skipped (None: it is there)
MISSING = (
    None
    if PGBOUNCER.exists()
    else f"{PGBOUNCER} is missing: apt-get install pgbouncer (.ci/run does it)"
)
START_SECONDS = 10.0

PoolMode = Literal["session", "transaction"]


def loopback_url(database_url: str, port: int) -> str:
    """``database_url`` (postgresql://user@host:port/db) pointed at 127.0.0.1:``port`` (a
    ``host`` query parameter, a Unix socket directory, is dropped: the target is TCP)."""
    parts = urlsplit(database_url)
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "host"])
    user = f"{parts.username}@" if parts.username else ""
    if parts.password:
        user = f"{parts.username}:{parts.password}@"
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}", query=query))


class PgBouncer:
    def __init__(self, host: str, port: int, user: str, pool_mode: PoolMode) -> None:
        self.server_host = host
        self.server_port = port
        self.user = user
        self.pool_mode = pool_mode
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="messagex-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def in_front_of(cls, database_url: str, pool_mode: PoolMode) -> PgBouncer:
        parts = urlsplit(database_url)
        directory = dict(parse_qsl(parts.query)).get("host")
        host = directory if not parts.hostname and directory else parts.hostname or "127.0.0.1"
        return cls(host, parts.port or 5432, parts.username or "postgres", pool_mode)

    def url_for(self, database_url: str) -> str:
        """``database_url`` pointed at this PgBouncer."""
        return loopback_url(database_url, self.port)

    def ini(self) -> str:
        return "\n".join(
            [
                "[databases]",
                f"* = host={self.server_host} port={self.server_port}",
                "",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {self.dir / 'userlist.txt'}",
                f"pool_mode = {self.pool_mode}",
                "max_client_conn = 1000",
                "default_pool_size = 40",
                "reserve_pool_size = 0",
                f"logfile = {self.dir / 'pgbouncer.log'}",
                f"pidfile = {self.dir / 'pgbouncer.pid'}",
                "",
            ]
        )

    def _run_as(self) -> str | None:
        """The user to drop to (PgBouncer will not run as root), or None when not root."""
        if os.geteuid() != 0:
            return None
        if self.server_host.startswith("/"):
            return pwd.getpwuid(os.stat(self.server_host).st_uid).pw_name
        return "nobody"

    def start(self) -> PgBouncer:
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(self.ini())
        command = [str(PGBOUNCER), "-q"]
        user = self._run_as()
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            for path in self.dir.iterdir():
                os.chown(path, entry.pw_uid, entry.pw_gid)
            command += ["-u", user]
        self.proc = subprocess.Popen(
            [*command, str(ini)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_SECONDS
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"pgbouncer exited with {self.proc.returncode}:\n{self.log}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return self
            if time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"pgbouncer not listening in {START_SECONDS} s:\n{self.log}")
            time.sleep(0.05)

    @property
    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "pgbouncer.log").read_text(errors="replace")
        return ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # PgBouncer's immediate shutdown
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()
