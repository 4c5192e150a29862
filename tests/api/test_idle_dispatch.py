"""Idle subscriptions cost no task and no statement of their own (issue 19), and still get
everything: a publish to any of many idle queues, a row no NOTIFY announced (within the 1 s
poll), and delayed messages at their due time — across two broker processes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    PgCluster,
    admin_sql,
    client,
    running_server,
    wait_for,
)
from tests.support import test_settings as settings_for
from tests.wsclient import WsClient, declare_queue, publish


@pytest.fixture(scope="module")
def database(pg_cluster: PgCluster, template_db: str) -> Iterator[str]:
    name = pg_cluster.create_database(template_db)
    try:
        yield pg_cluster.url_for(name)
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture(scope="module")
def servers(database: str) -> Iterator[tuple[LiveServer, LiveServer, httpx.Client, httpx.Client]]:
    with ExitStack() as stack:
        a = stack.enter_context(running_server(settings_for(database)))
        b = stack.enter_context(running_server(settings_for(database)))
        rest_a = stack.enter_context(client(a.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)))
        rest_b = stack.enter_context(client(b.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)))
        yield a, b, rest_a, rest_b


def dispatcher(server: LiveServer) -> Any:
    app: Any = server.server.config.app
    return app.state.services.delivery.dispatcher


def names(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"idle{tag}-{i}" for i in range(n)]


def subscribe_all(ws: WsClient, queues: list[str]) -> None:
    for q in queues:
        ws.send_json({"type": "SUBSCRIBE", "queue": q, "prefetch": 1})
    for _ in queues:
        assert ws.recv_json()["type"] == "SUBSCRIBED"


def test_every_idle_subscriber_of_500_queues_gets_a_publish_from_either_process(
    servers: tuple[LiveServer, LiveServer, httpx.Client, httpx.Client],
) -> None:
    a, _, rest_a, rest_b = servers
    queues = names(500)
    for q in queues:
        declare_queue(rest_a, q)
    with ExitStack() as stack:
        sockets = [stack.enter_context(WsClient.admin(a.ws_url)) for _ in range(5)]
        for i, ws in enumerate(sockets):
            subscribe_all(ws, queues[i * 100 : (i + 1) * 100])
        # Idle: no claim task per subscribed queue.
        wait_for(lambda: not dispatcher(a)._workers, 5, message="no dispatch task while idle")
        for i, q in enumerate(queues):
            publish(rest_b if i % 2 else rest_a, q, {"n": i})  # B: through NOTIFY
        for i, ws in enumerate(sockets):
            got = sorted(d["body"]["n"] for d in ws.deliveries_n(100, timeout=15))
            assert got == list(range(i * 100, (i + 1) * 100))
        wait_for(lambda: not dispatcher(a)._workers, 5, message="the tasks to end")


@pytest.mark.parametrize("many", [False, True], ids=["probe", "scan"])
def test_a_row_no_notify_announced_is_delivered_within_the_poll(
    servers: tuple[LiveServer, LiveServer, httpx.Client, httpx.Client], database: str, many: bool
) -> None:
    """A row inserted by SQL, with no NOTIFY (a lost wake-up), is found by the 1 s poll: for a
    process subscribed to few queues (one probe each) and to more than PROBE_MAX (a listing of
    the queues with ready rows)."""
    a, _, rest_a, _ = servers
    queues = names(150 if many else 1)
    for q in queues:
        declare_queue(rest_a, q)
    target = queues[-1]
    with ExitStack() as stack:
        sockets = [stack.enter_context(WsClient.admin(a.ws_url)) for _ in range(2 if many else 1)]
        for i, ws in enumerate(sockets):
            subscribe_all(ws, queues[i * 100 : (i + 1) * 100])
        wait_for(lambda: not dispatcher(a)._workers, 5, message="no dispatch task while idle")
        started = time.monotonic()
        admin_sql(
            database,
            "INSERT INTO messages (queue_id, message_id, exchange, routing_key, body) "
            f"SELECT id, 'lost', '', name, convert_to('\"unannounced\"', 'UTF8') "
            f"FROM queues WHERE name = '{target}'",
        )
        delivery = sockets[-1].delivery(timeout=5)
        waited = time.monotonic() - started
        assert delivery["body"] == "unannounced"
        assert delivery["queue"] == target
        assert waited < 2.5  # the poll bound (1 s), with room for a loaded machine


def test_delayed_messages_arrive_at_their_due_time_on_the_other_process(
    servers: tuple[LiveServer, LiveServer, httpx.Client, httpx.Client],
) -> None:
    """Published on B with delays, to queues subscribed on A: none early, none long after its
    due time (the per-process timer, not the 1 s poll, wakes them)."""
    a, _, rest_a, rest_b = servers
    queues = names(20)
    for q in queues:
        declare_queue(rest_a, q)
    with WsClient.admin(a.ws_url) as ws:
        subscribe_all(ws, queues)
        due: dict[int, float] = {}
        for i, q in enumerate(queues):
            delay_ms = 800 + 60 * i  # falling due one after the other, 60 ms apart
            due[i] = time.monotonic() + delay_ms / 1000
            publish(rest_b, q, {"n": i}, delay_ms=delay_ms)
        late: list[float] = []
        for _ in queues:
            d = ws.delivery(timeout=5)
            arrived = time.monotonic()
            n = d["body"]["n"]
            # due[n] was taken before the publish, so the true due time is later still
            assert arrived >= due[n] - 0.005, f"message {n} early by {due[n] - arrived:.3f} s"
            late.append(arrived - due[n])
            ws.ack(d["delivery_tag"])
        late.sort()
        # Contract §10: within 100 ms of the due time; the median holds it on a loaded CI
        # machine, the worst case gets slack (still far below the 1 s poll).
        assert late[len(late) // 2] < 0.1, late
        assert late[-1] < 0.6, late
