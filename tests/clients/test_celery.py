"""Real Celery on MessageX: a `celery worker` subprocess (solo pool) consumes through the
Kombu transport (messagex_client.kombu_transport) from a live broker; results come back
through Celery's file:// result backend. Covers results, a group, a chord, a retry with
countdown, a countdown held by the broker (delay_ms), and a worker killed with SIGKILL
mid-task (acks_late) whose task MessageX redelivers to a restarted worker."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest
from celery import chord, group

from tests import support
from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, client, wait_for

ROOT = Path(__file__).resolve().parents[2]


class Workers:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs, self.count = env, logs, 0
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *options: str) -> subprocess.Popen[bytes]:
        """A worker; by default the solo pool on the default queue."""
        self.count += 1
        with (self.logs / f"worker-{self.count}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.clients.celery_app", "worker",
                 "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "--loglevel=INFO", "-n", f"w{self.count}@%h", *(options or ["--pool=solo"])],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        live = [proc for proc in self.procs if proc.poll() is None]
        for proc in live:  # all at once: a warm shutdown takes a few seconds each
            proc.terminate()
        for proc in live:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def consumers(broker: LiveServer, queue: str = "celery") -> int:
    with client(broker.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
        r = rest.get(f"/queues/{queue}")
        return int(r.json()["stats"]["consumers"]) if r.status_code == 200 else 0


@pytest.fixture(scope="module")
def celery_env(
    broker: LiveServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    results = tmp_path_factory.mktemp("celery-results")
    env = {
        **os.environ,
        "MX_CELERY_BROKER": f"messagex://{ADMIN_USER}:{ADMIN_PASSWORD}@127.0.0.1:{broker.port}/",
        "MX_CELERY_RESULTS": str(results),
        "PYTHONPATH": str(ROOT),
    }
    saved = {k: os.environ.get(k) for k in ("MX_CELERY_BROKER", "MX_CELERY_RESULTS")}
    os.environ.update({k: env[k] for k in saved})
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def tasks(celery_env: dict[str, str]) -> Iterator[ModuleType]:
    sys.modules.pop("tests.clients.celery_app", None)
    module = importlib.import_module("tests.clients.celery_app")
    yield module
    module.app.close()


@pytest.fixture(scope="module")
def workers(
    broker: LiveServer,
    celery_env: dict[str, str],
    tasks: ModuleType,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Workers]:
    pool = Workers(celery_env, tmp_path_factory.mktemp("celery-logs"))
    pool.start()
    try:
        wait_for(lambda: consumers(broker) >= 1, timeout=30)
        yield pool
    finally:
        pool.stop()


def test_results_group_and_chord(tasks: ModuleType, workers: Workers) -> None:
    assert tasks.add.delay(2, 3).get(timeout=20) == 5
    assert group(tasks.add.s(i, i) for i in range(5))().get(timeout=20) == [0, 2, 4, 6, 8]
    # The file:// backend has no atomic counter: Celery's chord_unlock polls, retrying
    # itself with a countdown — more delayed messages through MessageX.
    assert chord(tasks.add.s(i, 1) for i in range(3))(tasks.total.s()).get(timeout=30) == 6


def test_retry_with_countdown_runs_again(tasks: ModuleType, workers: Workers) -> None:
    assert tasks.flaky.delay("once").get(timeout=20) == 1
    assert (Path(os.environ["MX_CELERY_RESULTS"]) / "flaky-once").exists()


def test_countdown_is_held_by_the_broker(
    broker: LiveServer, tasks: ModuleType, workers: Workers
) -> None:
    sent = time.time()
    result = tasks.started_at.apply_async(countdown=2)
    with client(broker.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
        stats = rest.get("/queues/celery").json()["stats"]
    assert stats["delayed"] == 1  # MessageX holds it (delay_ms), not the worker's timer
    ran = result.get(timeout=20)
    assert ran >= sent + 2 - 0.1  # the database clock and ours may differ by a little


def test_worker_killed_mid_task_is_redelivered(
    broker: LiveServer, tasks: ModuleType, workers: Workers
) -> None:
    starts = Path(os.environ["MX_CELERY_RESULTS"]) / "slow-kill"
    result = tasks.slow.delay("kill", 2.0)
    wait_for(lambda: starts.exists() and starts.read_text().count("\n") == 1, timeout=20)
    victim = workers.procs[-1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    workers.start()
    assert result.get(timeout=30).startswith("done by ")
    pids = starts.read_text().split()
    assert len(pids) == 2
    assert pids[0] == str(victim.pid)
    assert pids[1] != pids[0]


def test_pool_process_killed_mid_task_is_rejected_and_redelivered(
    broker: LiveServer, tasks: ModuleType, workers: Workers
) -> None:
    """Prefork, 2 processes: SIGKILL the pool process running the task. Celery rejects it
    with requeue (task_reject_on_worker_lost) → NACK → MessageX delivers it again."""
    main = workers.start("--pool=prefork", "--concurrency=2", "-Q", "mx-prefork")
    wait_for(lambda: consumers(broker, "mx-prefork") >= 1, timeout=30)
    starts = Path(os.environ["MX_CELERY_RESULTS"]) / "slow-pool"
    result = tasks.slow.apply_async(("pool", 1.0), queue="mx-prefork")
    wait_for(lambda: starts.exists() and starts.read_text().count("\n") == 1, timeout=20)
    child = int(starts.read_text().split()[0])
    assert child != main.pid
    os.kill(child, signal.SIGKILL)
    assert result.get(timeout=30).startswith("done by ")
    pids = starts.read_text().split()
    assert len(pids) == 2
    assert pids[1] != pids[0]
    assert main.poll() is None  # the worker itself lives on


def test_remote_control_over_the_pidbox_fanout(
    broker: LiveServer, tasks: ModuleType, workers: Workers
) -> None:
    """`celery inspect ping`: a broadcast through the fanout exchange celery.pidbox, the
    reply through reply.celery.pidbox into a reply queue — all routed by MessageX."""
    replies = tasks.app.control.ping(timeout=5, limit=1)
    assert len(replies) == 1
    assert next(iter(replies[0].values())) == {"ok": "pong"}
    with client(broker.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
        kinds = {e["name"]: e["type"] for e in rest.get("/exchanges").json()["items"]}
    assert kinds["celery.pidbox"] == "fanout"
    assert kinds["reply.celery.pidbox"] == "direct"


@pytest.mark.slow
def test_worker_reconnects_when_its_broker_restarts(
    broker: LiveServer,
    tasks: ModuleType,
    workers: Workers,
    celery_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's broker process (a second one on the same database, a fixed port) stops
    and starts again: Kombu sees the WebSocket close as a connection error, Celery
    reconnects and subscribes again, and the next task runs."""
    port = support.free_port()
    monkeypatch.setattr(support, "free_port", lambda: port)
    own = support.start_server(broker.settings)
    url = f"messagex://{ADMIN_USER}:{ADMIN_PASSWORD}@127.0.0.1:{port}/"
    pool = Workers({**celery_env, "MX_CELERY_BROKER": url}, workers.logs)
    try:
        pool.start("--pool=solo", "-Q", "mx-reconnect")
        wait_for(lambda: consumers(broker, "mx-reconnect") >= 1, timeout=30)
        assert tasks.add.apply_async((1, 1), queue="mx-reconnect").get(timeout=20) == 2
        own.stop()
        wait_for(lambda: consumers(broker, "mx-reconnect") == 0, timeout=20)
        own = support.start_server(broker.settings)
        assert tasks.add.apply_async((2, 2), queue="mx-reconnect").get(timeout=40) == 4
        assert pool.procs[0].poll() is None
    finally:
        pool.stop()
        own.stop()


def test_names_and_eta_map_onto_messagex() -> None:
    from messagex_client.kombu_transport import MAX_DELAY_MS, delay_ms_for, mx_name

    assert mx_name("celery") == "celery"
    assert mx_name("celery@w1.celery.pidbox") == "celery_x40w1.celery.pidbox"
    assert mx_name("_private") == "q_private"  # the first character must be alphanumeric
    assert mx_name("amq.gen-1") == "amq.gen-1"  # a valid name is left alone
    now = 1_800_000_000.0
    assert delay_ms_for({"eta": "2027-01-15T08:00:02+00:00"}, now=now) == 2000
    assert delay_ms_for({"eta": "2027-01-15T07:59:00+00:00"}, now=now) == 0  # past: at once
    assert delay_ms_for({"eta": "not a date"}, now=now) == 0
    assert delay_ms_for({"eta": None}, now=now) == 0
    assert delay_ms_for({}, now=now) == 0
    due = datetime.fromtimestamp(now + 2.5, tz=UTC).isoformat()
    assert delay_ms_for({"eta": due}, now=now) == 2500
    naive_utc = datetime.fromtimestamp(now + 1, tz=UTC).replace(tzinfo=None).isoformat()
    assert delay_ms_for({"eta": naive_utc}, now=now) == 1000
    far = datetime.fromtimestamp(now + 30 * 86400, tz=UTC).isoformat()
    assert delay_ms_for({"eta": far}, now=now) == MAX_DELAY_MS


def test_kombu_basic_get_publish_and_settle_over_rest(broker: LiveServer) -> None:
    """Plain Kombu, no Celery: a topic exchange routed by MessageX, ``basic_get`` (a §9
    pull), reject with requeue (→ nack) and ack (→ ack) over REST, body and properties
    byte-exact."""
    import messagex_client.kombu_transport  # noqa: F401 - registers messagex://
    from kombu import Connection, Exchange, Queue  # type: ignore[attr-defined]

    url = f"messagex://{ADMIN_USER}:{ADMIN_PASSWORD}@127.0.0.1:{broker.port}/"
    exchange = Exchange("kx-orders", type="topic")
    queue = Queue("kx-eu", exchange=exchange, routing_key="order.eu.*")
    with Connection(url) as conn, conn.channel() as channel:
        bound = queue(channel)
        bound.declare()
        producer = conn.Producer(channel)
        binary = {"content_type": "application/octet-stream", "content_encoding": "binary"}
        producer.publish(b"\x00\xffraw", exchange=exchange, routing_key="order.us.1", **binary)
        producer.publish({"n": 1}, exchange=exchange, routing_key="order.eu.1",
                         correlation_id="c-1", headers={"h": "v"})  # fmt: skip
        producer.publish(b"\x00\xffraw", exchange=exchange, routing_key="order.eu.2", **binary)
        first = bound.get()
        assert first is not None
        assert first.payload == {"n": 1}
        assert first.headers == {"h": "v"}
        assert first.properties["correlation_id"] == "c-1"
        assert first.delivery_info["routing_key"] == "order.eu.1"
        first.reject(requeue=True)
        again = bound.get()
        assert again is not None
        assert again.payload == {"n": 1}
        assert again.delivery_info["redelivered"] is True
        again.ack()
        raw = bound.get()
        assert raw is not None
        assert raw.body == b"\x00\xffraw"
        raw.ack()
        assert bound.get() is None  # order.us.1 matched no binding: routed by MessageX
    with client(broker.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as rest:
        stats = rest.get("/queues/kx-eu").json()["stats"]
    assert (stats["ready"], stats["in_flight"]) == (0, 0)
