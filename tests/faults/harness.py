"""Fault harness: real broker processes, the database seen from outside, load workers.

- ``BrokerProc``: ``messagex serve`` as a subprocess (so kill -9 and SIGSTOP are real), with
  short ack timeouts from the environment; its RSS is read with psutil.
- ``sql`` / ``backdate_heartbeat`` / ``terminate``: the test's own view of the database.
- ``Publisher`` / ``Consumer``: threads that load a broker on loopback, bounded in count and
  time, recording everything in a ``Ledger`` (checker.py).
- ``drain``: fresh consumers that empty the queues after the faults stop.
- ``TwinSampler``: watches for a message with rows in two queues at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from app.storage.dsn import asyncpg_dsn
from tests.faults.checker import Delivery, Ledger, QueueSpec
from tests.support import ADMIN_PASSWORD, ADMIN_USER, LoopbackUrls, free_port
from tests.wsclient import WsClient, basic

MESSAGEX = Path(sys.executable).with_name("messagex")
REPO = Path(__file__).resolve().parents[2]
READY_SECONDS = 60.0
ADMIN = (ADMIN_USER, ADMIN_PASSWORD)

# -- a WebSocket by hand -------------------------------------------------------------------


def raw_upgrade(port: int, headers: dict[str, str] | None = None) -> socket.socket:
    """A WebSocket opened by hand on a plain socket (which then reads only when the test
    does: a client that stops reading), with ``headers``; the 101 head read."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    sock.sendall(
        (
            f"GET /api/v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "the server closed during the upgrade"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


# -- the database from outside --------------------------------------------------------------


async def _sql(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(asyncpg_dsn(url), timeout=10)
    try:
        return [dict(r) for r in await conn.fetch(query, *args)]
    finally:
        await conn.close()


def sql(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    """Run one statement on a fresh connection (the test's own, not a broker's)."""
    return asyncio.run(_sql(url, query, *args))


def backdate_heartbeat(url: str, pid: int) -> int:
    """Make a broker process look silent for an hour (instead of waiting 15 s)."""
    rows = sql(
        url,
        "UPDATE broker_processes SET heartbeat_at = now() - interval '1 hour' "
        "WHERE pid = $1 RETURNING id",
        pid,
    )
    return len(rows)


def terminate(url: str, application_name: str | None = None) -> int:
    """pg_terminate_backend every broker session on this test's database (or those of one
    application_name). Never touches another database, nor the test's own sessions."""
    query = (
        "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND application_name LIKE 'messagex%'"
    )
    args: tuple[Any, ...] = ()
    if application_name is not None:
        query += " AND application_name = $1"
        args = (application_name,)
    return int(sql(url, query, *args)[0]["n"])


def sessions(url: str) -> list[dict[str, Any]]:
    """The broker sessions on this test's database (state, application name)."""
    return sql(
        url,
        "SELECT pid, application_name, state, backend_type, "
        "extract(epoch FROM now() - state_change)::float8 AS seconds_in_state "
        "FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND application_name LIKE 'messagex%'",
    )


def remaining_rows(url: str, queues: list[str]) -> list[tuple[str, str, str]]:
    rows = sql(
        url,
        "SELECT m.message_id, q.name, m.status FROM messages m JOIN queues q ON q.id = m.queue_id "
        "WHERE q.name = ANY($1::text[])",
        queues,
    )
    return [(r["message_id"], r["name"], r["status"]) for r in rows]


def pending_rows(url: str, queues: list[str]) -> int:
    rows = sql(
        url,
        "SELECT count(*) AS n FROM messages m JOIN queues q ON q.id = m.queue_id "
        "WHERE q.name = ANY($1::text[]) AND m.status <> 'dead'",
        queues,
    )
    return int(rows[0]["n"])


# -- broker processes -----------------------------------------------------------------------


def broker_env(database_url: str, **extra: Any) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MESSAGEX_")
        and k not in {"DATABASE_URL", "ACK_TIMEOUT_SECONDS", "ACK_TIMEOUT_CHECK_INTERVAL_MS"}
    }
    env.update(
        {
            "DATABASE_URL": database_url,
            "MESSAGEX_ADMIN_USER": ADMIN_USER,
            "MESSAGEX_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "MESSAGEX_LOG_FORMAT": "text",
            "MESSAGEX_LOG_LEVEL": "info",
            "MESSAGEX_ARGON2_TIME_COST": "1",
            "MESSAGEX_ARGON2_MEMORY_KIB": "1024",
            "MESSAGEX_ARGON2_PARALLELISM": "1",
            "MESSAGEX_DB_POOL_SIZE": "5",
            "MESSAGEX_DB_MAX_OVERFLOW": "5",
            "MESSAGEX_DB_CONNECT_TIMEOUT_SECONDS": "2",
            "MESSAGEX_DB_POOL_TIMEOUT_SECONDS": "2",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class BrokerProc(LoopbackUrls):
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    database_url: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                return -9
        return self.proc.returncode

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("auth", ADMIN)
        kwargs.setdefault("timeout", 10)
        return httpx.Client(base_url=self.api, **kwargs)


def start_broker(
    database_url: str,
    log_dir: Path,
    *,
    launcher: list[str] | None = None,
    port: int | None = None,
    **env: Any,
) -> BrokerProc:
    """``messagex serve`` on ``port`` (a free loopback port by default); returns once /readyz
    is 200."""
    port = port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"broker-{port}.log"
    for n in itertools.count(2):  # a replacement on the same port keeps the old log
        if not log.exists():
            break
        log = log_dir / f"broker-{port}.{n}.log"
    command = launcher or [str(MESSAGEX)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "serve", "--port", str(port), "--no-migrate"],
            env=broker_env(database_url, **env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=REPO,
        )
    broker = BrokerProc(proc, port, log, database_url)
    deadline = time.monotonic() + READY_SECONDS
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"broker exited with {proc.returncode}:\n{broker.log_text()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{broker.base_url}/readyz", timeout=2).status_code == 200:
                return broker
        if time.monotonic() > deadline:
            broker.terminate()
            raise AssertionError(f"broker not ready in {READY_SECONDS} s:\n{broker.log_text()}")
        time.sleep(0.05)


@contextmanager
def brokers(database_url: str, log_dir: Path, n: int = 1, **env: Any) -> Iterator[list[BrokerProc]]:
    started: list[BrokerProc] = []
    try:
        for _ in range(n):
            started.append(start_broker(database_url, log_dir, **env))
        yield started
    finally:
        for b in started:
            if b.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(b.pid, signal.SIGCONT)  # a paused one must be able to stop
                b.terminate()


def declare(api: httpx.Client, spec: QueueSpec) -> None:
    body: dict[str, Any] = {}
    if spec.max_delivery_count:
        body["max_delivery_count"] = spec.max_delivery_count
    if spec.dead_letter_queue:
        body["dead_letter_queue"] = spec.dead_letter_queue
    r = api.put(f"/queues/{spec.name}", json=body)
    assert r.status_code in (200, 201), r.text


def queue_pair(api: httpx.Client, name: str, max_delivery_count: int = 5) -> list[QueueSpec]:
    """A queue with a delivery limit and its dead-letter queue."""
    dlq = QueueSpec(f"{name}.dlq")
    main = QueueSpec(name, max_delivery_count, dlq.name)
    declare(api, dlq)
    declare(api, main)
    return [main, dlq]


# -- load workers ---------------------------------------------------------------------------

_run_ids = itertools.count()


class Worker(threading.Thread):
    def __init__(self, name: str, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.stop_event = stop
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # reported by join_all
            self.error = exc

    def work(self) -> None:
        raise NotImplementedError


class Publisher(Worker):
    """Publishes ``count`` messages (at most ``seconds``) round-robin over ``targets`` (base
    API URLs), each with a unique message id, into ``queue``."""

    def __init__(
        self,
        ledger: Ledger,
        targets: list[str] | Callable[[], list[str]],
        queue: str,
        stop: threading.Event,
        *,
        count: int = 500,
        seconds: float = 30.0,
        pace: float = 0.0,
        timeout: float = 10.0,
        body_bytes: int = 0,
    ) -> None:
        super().__init__(f"pub-{next(_run_ids)}", stop)
        self.ledger = ledger
        self.targets = targets
        self.queue = queue
        self.count = count
        self.seconds = seconds
        self.pace = pace
        self.timeout = timeout
        self.pad = "x" * body_bytes
        self.prefix = uuid.uuid4().hex[:8]

    def work(self) -> None:
        deadline = time.monotonic() + self.seconds
        clients: dict[str, httpx.Client] = {}
        try:
            for i in range(self.count):
                if self.stop_event.is_set() or time.monotonic() > deadline:
                    return
                targets = self.targets() if callable(self.targets) else self.targets
                target = targets[i % len(targets)]
                c = clients.get(target)
                if c is None:
                    c = clients[target] = httpx.Client(
                        base_url=target, auth=ADMIN, timeout=self.timeout
                    )
                self.publish_one(c, target, f"{self.prefix}-{i}")
                if self.pace:
                    time.sleep(self.pace)
        finally:
            for c in clients.values():
                c.close()

    def publish_one(self, c: httpx.Client, target: str, mid: str) -> None:
        record = self.ledger.invoked(mid, self.queue, target)
        outcome, status, code = self.attempt(c, mid)
        self.ledger.published(record, outcome, status, code)
        if outcome != "ok":
            time.sleep(0.05 if status is None else 0.02)

    def attempt(self, c: httpx.Client, mid: str) -> tuple[str, int | None, str | None]:
        """Publish ``mid`` once: (outcome as the ledger records it, status, code)."""
        body = {"body": {"mid": mid, "pad": self.pad}, "properties": {"message_id": mid}}
        try:
            r = c.post(f"/queues/{self.queue}/messages", json=body)
        except httpx.ConnectError:
            return "failed", None, "connect"  # nothing was sent
        except httpx.TransportError as exc:
            return "unknown", None, type(exc).__name__
        if r.status_code == 200:
            assert r.json()["message_id"] == mid, r.text
            return "ok", 200, None
        if "json" not in r.headers.get("content-type", ""):
            # not the broker's answer but a proxy's: its 503 (no broker to send it to) sent
            # nothing; after a 502 or 504 it may have been stored
            return ("failed" if r.status_code == 503 else "unknown"), r.status_code, None
        problem = r.json()
        # a 503 whose in-doubt commit the broker could not settle says "it may have been"
        outcome = "unknown" if "may have been" in str(problem.get("detail")) else "failed"
        return outcome, r.status_code, problem.get("code")


#: a consumer's policy for one delivery: "ack", "nack" (requeue), "reject" (requeue false),
#: or "hold" (never settle it: it ends by timeout or disconnect)
Policy = Callable[[dict[str, Any]], str]


def always_ack(_frame: dict[str, Any]) -> str:
    return "ack"


def record_delivery(
    ledger: Ledger, frame: dict[str, Any], consumer: str, connection: str
) -> Delivery:
    """A ``MESSAGE_DELIVERED`` frame, recorded in the ledger (unsettled)."""
    d = Delivery(
        consumer=consumer,
        connection=connection,
        queue=frame["queue"],
        message_id=frame["message_id"],
        tag=frame["delivery_tag"],
        delivery_count=frame["delivery_count"],
        redelivered=frame["redelivered"],
        at=time.monotonic(),
    )
    ledger.delivered(d)
    return d


class Consumer(Worker):
    """A WebSocket consumer that records every delivery and settle outcome; reconnects (to
    the next URL) when its socket dies, until stopped."""

    def __init__(
        self,
        ledger: Ledger,
        ws_urls: list[str] | Callable[[], list[str]],
        queues: list[str],
        stop: threading.Event,
        *,
        prefetch: int = 10,
        policy: Policy = always_ack,
        seconds: float = 60.0,
        reconnect: bool = True,
        name: str | None = None,
    ) -> None:
        super().__init__(name or f"cons-{next(_run_ids)}", stop)
        self.ledger = ledger
        self.ws_urls = ws_urls
        self.queues = queues
        self.prefetch = prefetch
        self.policy = policy
        self.seconds = seconds
        self.reconnect = reconnect
        self.connections = 0
        self.held: dict[str, Delivery] = {}  # tag → delivery not settled yet
        self.pending: dict[str, tuple[Delivery, str]] = {}  # frame id → (delivery, op)
        self.connected = threading.Event()
        self.ws: WsClient | None = None
        self._ids = itertools.count()

    def unsettled(self) -> int:
        return len(self.held)

    def work(self) -> None:
        deadline = time.monotonic() + self.seconds
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            urls = self.ws_urls() if callable(self.ws_urls) else self.ws_urls
            url = urls[self.connections % len(urls)]
            self.connections += 1
            conn_name = f"{self.name}/{self.connections}"
            try:
                self.ws = WsClient.open(url, basic())
                self.ws.expect("CONNECTED")
                for q in self.queues:
                    self.ws.subscribe(q, self.prefetch)
                self.connected.set()
                self._loop(self.ws, conn_name, deadline)
            except (ConnectionClosed, OSError, InvalidHandshake, AssertionError, TimeoutError):
                pass
            finally:
                self.connected.clear()
                self._lost()
                if self.ws is not None:
                    with contextlib.suppress(Exception):
                        self.ws.close()
            if not self.reconnect:
                return
            time.sleep(0.2)

    def _loop(self, ws: WsClient, conn_name: str, deadline: float) -> None:
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            while ws.deliveries:  # recorded while subscribing
                self._on_delivery(ws, conn_name, ws.deliveries.popleft())
            try:
                frame = ws.recv_json(0.2)
            except TimeoutError:
                continue
            self._on_frame(ws, conn_name, frame)

    def _on_frame(self, ws: WsClient, conn_name: str, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == "MESSAGE_DELIVERED":
            self._on_delivery(ws, conn_name, frame)
            return
        pending = self.pending.pop(frame["id"], None) if "id" in frame else None
        if pending is None:
            return
        delivery, op = pending
        self.held.pop(delivery.tag, None)
        if kind == "ACKED":
            self.ledger.settled(delivery, "acked")
        elif kind == "NACKED":
            self.ledger.settled(delivery, f"nacked:{frame['outcome']}")
        elif kind == "ERROR":
            self.ledger.settled(delivery, f"{op}_rejected:{frame['code']}")

    def _on_delivery(self, ws: WsClient, conn_name: str, frame: dict[str, Any]) -> None:
        d = record_delivery(self.ledger, frame, self.name, conn_name)
        self.held[d.tag] = d
        action = self.policy(frame)
        if action == "hold":
            return
        frame_id = f"{action}{next(self._ids)}"
        self.pending[frame_id] = (d, "ack" if action == "ack" else "nack")
        if action == "ack":
            ws.send_json({"type": "ACK", "delivery_tag": d.tag, "id": frame_id})
        else:
            ws.send_json(
                {"type": "NACK", "delivery_tag": d.tag, "id": frame_id, "requeue": action == "nack"}
            )

    def _lost(self) -> None:
        """The socket is gone: what it held was released (or acked without a reply)."""
        for delivery, op in self.pending.values():
            self.ledger.settled(delivery, f"{op}_unconfirmed")
            self.held.pop(delivery.tag, None)
        for delivery in self.held.values():
            self.ledger.settled(delivery, "unsettled")
        self.pending.clear()
        self.held.clear()


def steady_load(
    ledger: Ledger,
    broker: BrokerProc,
    queues: list[str],
    stop: threading.Event,
    *,
    consumers: int = 2,
    publishers: int = 2,
    prefetch: int = 5,
    consumer_seconds: float = 60.0,
    **publish: Any,
) -> tuple[list[Consumer], list[Publisher]]:
    """Acking WebSocket consumers of ``queues`` and publishers into ``queues[0]`` (with
    ``publish``: count, seconds, pace, ...) on one broker, started."""
    started_consumers = [
        Consumer(ledger, [broker.ws_url], queues, stop, prefetch=prefetch, seconds=consumer_seconds)
        for _ in range(consumers)
    ]
    started_publishers = [
        Publisher(ledger, [broker.api], queues[0], stop, **publish) for _ in range(publishers)
    ]
    for w in [*started_consumers, *started_publishers]:
        w.start()
    return started_consumers, started_publishers


def join_all(workers: Sequence[Worker], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    for w in workers:
        w.join(max(deadline - time.monotonic(), 0.1))
        assert not w.is_alive(), f"{w.name} did not stop within {timeout} s"
    errors = [w.error for w in workers if w.error is not None]
    if errors:
        raise errors[0]


class TwinSampler(Worker):
    """Every ``interval`` s: any message id with rows in two of ``queues`` at once."""

    def __init__(
        self,
        ledger: Ledger,
        url: str,
        queues: list[str],
        stop: threading.Event,
        interval: float = 0.1,
    ) -> None:
        super().__init__("twin-sampler", stop)
        self.ledger, self.url, self.queues, self.interval = ledger, url, queues, interval
        self.samples = 0

    def work(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        conn = None
        while not self.stop_event.is_set():
            try:
                if conn is None:
                    conn = await asyncpg.connect(asyncpg_dsn(self.url), timeout=2)
                rows = await conn.fetch(
                    "SELECT message_id FROM messages m JOIN queues q ON q.id = m.queue_id "
                    "WHERE q.name = ANY($1::text[]) GROUP BY message_id HAVING count(*) > 1",
                    self.queues,
                )
                self.samples += 1
                if rows:
                    self.ledger.saw_twin_rows([r["message_id"] for r in rows])
            except Exception:  # the database is down or restarting: sample again later
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.terminate()
                conn = None
            await asyncio.sleep(self.interval)
        if conn is not None:
            await conn.close()


def drain(
    ledger: Ledger,
    ws_url: str,
    database_url: str,
    queues: list[QueueSpec],
    *,
    timeout: float = 30.0,
) -> None:
    """Fresh consumers ack everything left in ``queues`` until only dead rows remain."""
    names = [q.name for q in queues]
    stop = threading.Event()
    drainer = Consumer(
        ledger, [ws_url], names, stop, prefetch=200, seconds=timeout + 5, name="drain"
    )
    drainer.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            if pending_rows(database_url, names) == 0 and not drainer.pending:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"drain: {pending_rows(database_url, names)} rows left after {timeout} s"
                )
            time.sleep(0.1)
    finally:
        stop.set()
        join_all([drainer], 15)


def rest_latency(
    api: httpx.Client, path: str = "/queues", timeout: float = 15
) -> tuple[int, float]:
    """(status or 0 for a transport error, seconds) of one GET."""
    started = time.monotonic()
    try:
        status = api.get(path, timeout=timeout).status_code
    except httpx.TransportError:
        status = 0
    return status, time.monotonic() - started
