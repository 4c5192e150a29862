"""haproxy in front of several broker processes, on loopback (issue 25).

``Haproxy`` writes deploy/haproxy.cfg with loopback substitutions (free ports, its own
servers), runs Debian's ``/usr/sbin/haproxy`` in the foreground, and talks to its runtime API
over a unix socket: which servers are UP, and ``drain`` / ``ready`` for a rolling restart.
HTTP and WebSocket both go through its one frontend. Used by tests/faults/test_several_brokers.py
and by ``python -m bench brokers``; it needs only the standard library and httpx.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench.infra import free_port
from tests.support import LoopbackUrls

HAPROXY = Path("/usr/sbin/haproxy")
#: haproxy's health check of each broker: this often, marked down after FALL failures
CHECK_INTERVAL_MS = 500
FALL = 2
RISE = 1


def missing() -> str | None:
    """Why haproxy cannot run here, or None."""
    if not HAPROXY.exists():
        return f"{HAPROXY} is missing: apt-get install haproxy (.ci/run does it)"
    return None


#: the configuration shipped for operators; the tests run it, with loopback substitutions
DEPLOYED = Path(__file__).resolve().parents[2] / "deploy" / "haproxy.cfg"


def config(
    port: int,
    servers: Sequence[tuple[str, int]],
    stats_socket: Path,
    *,
    balance: str = "leastconn",
) -> str:
    """deploy/haproxy.cfg, as the tests run it: the frontend on 127.0.0.1:``port``,
    ``servers`` (name, port) on loopback instead of its brokers, a unix runtime socket, no
    DNS resolvers, and a lower maxconn (a test's open-file limit). Everything else (timeouts,
    health checks on /readyz, retries) is the shipped file's, so that is what is tested."""
    swaps = {
        "maxconn": "maxconn 4096",
        "stats socket": f"stats socket {stats_socket} mode 600 level admin",
        "bind ": f"bind 127.0.0.1:{port}",
        "balance ": f"balance {balance}",
        "default-server": f"default-server inter {CHECK_INTERVAL_MS}ms fall {FALL} rise {RISE}",
    }
    out: list[str] = []
    in_resolvers = False
    for line in DEPLOYED.read_text().splitlines():
        stripped = line.strip()
        if in_resolvers:
            in_resolvers = stripped != ""
            continue
        if stripped == "resolvers dns":
            in_resolvers = True
            continue
        if stripped.startswith(("#", "server ")):
            continue
        swap = next((new for old, new in swaps.items() if stripped.startswith(old)), None)
        out.append(line if swap is None else f"    {swap}")
    out += [f"    server {name} 127.0.0.1:{p} check" for name, p in servers]
    return "\n".join(out) + "\n"


class Haproxy(LoopbackUrls):
    """haproxy on a free loopback port in front of ``servers`` (name, port)."""

    def __init__(self, servers: Sequence[tuple[str, int]], *, balance: str = "leastconn") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="messagex-haproxy-"))
        self.port = free_port()
        self.socket_path = self.dir / "admin.sock"
        self.cfg = self.dir / "haproxy.cfg"
        self.cfg.write_text(config(self.port, servers, self.socket_path, balance=balance))
        self.log = self.dir / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, within: float = 20.0) -> None:
        """Run haproxy and wait until it answers /readyz through a broker."""
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(HAPROXY), "-db", "-f", str(self.cfg)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + within
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"haproxy exited with {self.proc.returncode}:\n{self.log_text()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"haproxy not serving within {within} s:\n{self.log_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> Haproxy:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    # -- the runtime API ---------------------------------------------------------------------

    def command(self, line: str) -> str:
        """One runtime API command; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.socket_path))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def statuses(self) -> dict[str, str]:
        """Each server's state as haproxy sees it (``UP``, ``DOWN``, ``DRAIN``, ``MAINT``...)."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        name, kind, status = header.index("svname"), header.index("type"), header.index("status")
        out = {}
        for row in lines[1:]:
            cols = row.split(",")
            if len(cols) > status and cols[kind] == "2":  # 2: a server
                out[cols[name]] = cols[status]
        return out

    def drain(self, server: str) -> None:
        """Send ``server`` no new connections; those it has go on (before stopping it)."""
        self.command(f"set server brokers/{server} state drain")

    def ready(self, server: str) -> None:
        """Take ``server`` back (it is UP again once its health check passes)."""
        self.command(f"set server brokers/{server} state ready")

    def wait_status(self, server: str, wanted: str, within: float = 10.0) -> float:
        """Poll until haproxy reports ``server`` in state ``wanted``; the seconds it took."""
        started = time.monotonic()
        while True:
            found = self.statuses().get(server)
            if found is not None and found.startswith(wanted):
                return time.monotonic() - started
            if time.monotonic() - started > within:
                raise AssertionError(
                    f"haproxy: {server} is {found}, not {wanted}, after {within} s"
                )
            time.sleep(0.05)
