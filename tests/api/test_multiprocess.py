"""Two broker processes on one database (contract §10, §12): LISTEN/NOTIFY wake-ups,
shared consumer counts, release when a process stops, cancellations and revocations that
cross processes. Each "process" is a real uvicorn server with its own engine and pool.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    PgCluster,
    admin_sql,
    client,
    login,
    running_server,
    wait_for,
)
from tests.support import test_settings as settings_for
from tests.wsclient import WsClient, browse, declare_queue, make_user, publish, stats, waiting_on

_names = itertools.count()
PASSWORD = "pw-of-the-user"


def fresh(prefix: str = "q") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


class Pair:
    def __init__(self, a: LiveServer, b: LiveServer, rest_a: httpx.Client, rest_b: httpx.Client):
        self.a, self.b, self.rest_a, self.rest_b = a, b, rest_a, rest_b


def start_pair(stack: ExitStack, url: str, **overrides: Any) -> Pair:
    a = stack.enter_context(running_server(settings_for(url, **overrides)))
    b = stack.enter_context(running_server(settings_for(url, **overrides)))
    rest_a = stack.enter_context(client(a.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)))
    rest_b = stack.enter_context(client(b.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)))
    return Pair(a, b, rest_a, rest_b)


@pytest.fixture(scope="module")
def database(pg_cluster: PgCluster, template_db: str) -> Iterator[str]:
    name = pg_cluster.create_database(template_db)
    try:
        yield pg_cluster.url_for(name)
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture(scope="module")
def pair(database: str) -> Iterator[Pair]:
    with ExitStack() as stack:
        yield start_pair(stack, database)


def test_publish_on_b_wakes_a_subscriber_on_a(pair: Pair) -> None:
    q = fresh()
    declare_queue(pair.rest_b, q)
    latencies = []
    with WsClient.admin(pair.a.ws_url) as ws:
        ws.subscribe(q, 10)
        for i in range(5):
            started = time.monotonic()
            publish(pair.rest_b, q, i)
            d = ws.delivery(timeout=3)
            latencies.append(time.monotonic() - started)
            assert d["body"] == i
            assert ws.ack(d["delivery_tag"])["type"] == "ACKED"
    median = statistics.median(latencies)
    print(
        "publish on B → MESSAGE_DELIVERED on A: "
        + ", ".join(f"{x * 1000:.0f}" for x in latencies)
        + f" ms (median {median * 1000:.0f} ms)"
    )
    # The contract wants ~100 ms (NOTIFY, not the 1 s poll); the bound allows CI noise, and
    # the median below the poll interval shows the wake-up came from NOTIFY.
    assert max(latencies) < 1.0, latencies
    assert median < 0.5, latencies


def test_delayed_message_published_on_b_is_on_time_on_a(pair: Pair) -> None:
    q = fresh()
    declare_queue(pair.rest_b, q)
    with WsClient.admin(pair.a.ws_url) as ws:
        ws.subscribe(q)
        started = time.monotonic()
        publish(pair.rest_b, q, "later", delay_ms=500)
        ws.delivery(timeout=3)
        elapsed = time.monotonic() - started
        print(f"delay_ms=500 across processes: {elapsed * 1000:.0f} ms")
        assert 0.49 <= elapsed <= 0.9, elapsed


def test_long_poll_on_a_is_woken_by_a_publish_on_b(pair: Pair, database: str) -> None:
    q = fresh()
    declare_queue(pair.rest_a, q)
    result: dict[str, Any] = {}

    def poll() -> None:
        r = pair.rest_a.post(f"/queues/{q}/get", json={"wait_ms": 5000})
        result["done"] = time.monotonic()
        result["response"] = r

    qid = _sql(database, "SELECT id FROM queues WHERE name = $1", q)[0]["id"]
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    wait_for(lambda: waiting_on(pair.a, qid) == 1, 3, message="the long poll on A to wait")
    published = time.monotonic()
    publish(pair.rest_b, q, "cross")
    thread.join(6)
    r = result["response"]
    assert r.status_code == 200
    assert [m["body"] for m in r.json()["messages"]] == ["cross"]
    latency = result["done"] - published
    print(f"long poll on A woken {latency * 1000:.0f} ms after the publish on B")
    assert latency < 0.9


def test_consumers_are_counted_on_every_process(pair: Pair) -> None:
    q = fresh()
    declare_queue(pair.rest_a, q)
    a1 = WsClient.admin(pair.a.ws_url)
    b1 = WsClient.admin(pair.b.ws_url)
    try:
        a1.subscribe(q)
        assert stats(pair.rest_b, q)["consumers"] == 1
        b1.subscribe(q)
        assert stats(pair.rest_a, q)["consumers"] == 2
        assert stats(pair.rest_b, q)["consumers"] == 2
        a1.close()
        wait_for(lambda: stats(pair.rest_b, q)["consumers"] == 1, 3, message="A's consumer gone")
    finally:
        a1.close()
        b1.close()
    wait_for(lambda: stats(pair.rest_a, q)["consumers"] == 0, 3, message="no consumers")
    # if_unused sees subscribers of the other process
    with WsClient.admin(pair.a.ws_url) as ws:
        ws.subscribe(q)
        r = pair.rest_b.delete(f"/queues/{q}", params={"if_unused": "true"})
        assert r.status_code == 409, r.text


def test_queue_deleted_on_b_cancels_subscriptions_on_a(pair: Pair) -> None:
    q = fresh()
    declare_queue(pair.rest_a, q)
    publish(pair.rest_a, q, "held")
    with WsClient.admin(pair.a.ws_url) as ws:
        ws.subscribe(q)
        held = ws.delivery()
        assert pair.rest_b.delete(f"/queues/{q}").status_code == 204
        started = time.monotonic()
        assert ws.expect("SUBSCRIPTION_CANCELLED", 3) == {
            "type": "SUBSCRIPTION_CANCELLED",
            "queue": q,
            "reason": "queue_deleted",
        }
        print(f"SUBSCRIPTION_CANCELLED on A {(time.monotonic() - started) * 1000:.0f} ms later")
        reply = ws.ack(held["delivery_tag"])
        assert (reply["type"], reply["code"]) == ("ERROR", "unknown_delivery_tag")


def test_ack_on_a_frees_credit_after_a_release_seen_on_b(pair: Pair) -> None:
    """A message released by B's ack-timeout sweep (or any process) frees A's prefetch slot."""
    q = fresh()
    declare_queue(pair.rest_a, q)
    publish(pair.rest_a, q, "first")
    publish(pair.rest_a, q, "second")
    with WsClient.admin(pair.a.ws_url) as ws:
        ws.subscribe(q, 1)
        held = ws.delivery()
        [row] = browse(pair.rest_b, q, "in_flight")
        assert pair.rest_b.delete(f"/queues/{q}/messages/{row['id']}").status_code == 204
        assert ws.delivery(timeout=3)["body"] == "second"
        reply = ws.ack(held["delivery_tag"])
        assert reply["code"] == "unknown_delivery_tag"


def test_user_deleted_on_b_closes_sockets_on_a(pair: Pair) -> None:
    name = fresh("u")
    make_user(pair.rest_b, name, PASSWORD)
    with WsClient.as_user(pair.a.ws_url, name, PASSWORD) as ws:
        started = time.monotonic()
        assert pair.rest_b.delete(f"/users/{name}").status_code == 204
        code, _ = ws.expect_close(6)
        assert code == 4401
        elapsed = time.monotonic() - started
        print(f"closed on A {elapsed:.2f} s after DELETE /users on B")
        assert elapsed <= 5.5


def test_password_changed_on_b_closes_the_old_passwords_sockets_everywhere(pair: Pair) -> None:
    """Issue 18, finding 8: after an admin changed a user's password, that user's WebSocket
    authenticated with the old one still published 7 s later (main). Contract §3: the
    sockets that authenticated with the old password close (4401) within 5 s on every
    process, header and AUTH frame alike, and so do those riding on its sessions; one opened
    with the new password stays."""
    name = fresh("u")
    make_user(pair.rest_b, name, PASSWORD, write=".*")
    token = login(pair.b.base_url, name, PASSWORD)
    on_a = WsClient.as_user(pair.a.ws_url, name, PASSWORD)
    by_frame = WsClient.open(pair.a.ws_url)
    by_frame.send_json({"type": "AUTH", "username": name, "password": PASSWORD})
    by_frame.expect("CONNECTED")
    on_b = WsClient.as_user(pair.b.ws_url, name, PASSWORD)
    with_token = WsClient.with_token(pair.a.ws_url, token)
    started = time.monotonic()
    new_password = PASSWORD + "-changed"
    r = pair.rest_b.put(
        f"/users/{name}",
        json={
            "password": new_password,
            "role": "user",
            "permissions": {"configure": "", "write": ".*", "read": ""},
        },
    )
    assert r.status_code == 200, r.text
    with WsClient.as_user(pair.a.ws_url, name, new_password) as fresh_socket:
        elapsed = {}
        for label, ws in (("A", on_a), ("A by AUTH", by_frame), ("B", on_b), ("token", with_token)):
            code, _ = ws.expect_close(6)
            assert code == 4401, label
            elapsed[label] = round(time.monotonic() - started, 2)
        print(f"old-password sockets closed after {elapsed} s")
        assert max(elapsed.values()) <= 5.5
        reply = fresh_socket.request({"type": "PUBLISH", "exchange": "amq.direct", "body": 1})
        assert reply["type"] == "PUBLISHED"


def test_connections_per_user_are_counted_across_processes(database: str) -> None:
    """Contract §8: at most MESSAGEX_MAX_CONNECTIONS_PER_USER (2 here) WebSocket connections
    per user on all processes together; the upgrade past it is 429 limit_exceeded (an AUTH
    frame past it: ERROR limit_exceeded, then 1008). Other users are not affected; a
    closed connection frees its place."""
    with ExitStack() as stack:
        p = start_pair(stack, database, max_connections_per_user=2)
        name = fresh("u")
        make_user(p.rest_b, name, PASSWORD)
        first = WsClient.as_user(p.a.ws_url, name, PASSWORD)
        second = WsClient.open(p.b.ws_url)
        second.send_json({"type": "AUTH", "username": name, "password": PASSWORD})
        second.expect("CONNECTED")
        for url in (p.a.ws_url, p.b.ws_url):
            r = httpx.get(
                url.replace("ws://", "http://"),
                auth=(name, PASSWORD),
                headers={
                    "Connection": "Upgrade",
                    "Upgrade": "websocket",
                    "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                },
            )
            assert r.status_code == 429, r.text
            assert r.json()["code"] == "limit_exceeded"
        with WsClient.open(p.a.ws_url) as third:
            third.send_json({"type": "AUTH", "username": name, "password": PASSWORD, "id": 1})
            code, frames = third.expect_close(5)
            assert code == 1008
            assert [(f["type"], f["code"]) for f in frames] == [("ERROR", "limit_exceeded")]
        with WsClient.admin(p.a.ws_url), WsClient.admin(p.b.ws_url):
            pass  # another user has places of its own
        second.close()
        wait_for(
            lambda: _opens(p.a.ws_url, name),
            5,
            message="a place freed by the closed connection",
        )
        first.close()


def _opens(url: str, name: str) -> bool:
    """Whether ``name`` may open a WebSocket now (False: 429, its limit is reached)."""
    try:
        WsClient.as_user(url, name, PASSWORD).close()
    except InvalidStatus as exc:
        if exc.response.status_code != 429:
            raise
        return False
    return True


def test_logout_on_b_closes_the_token_socket_on_a(pair: Pair) -> None:
    name = fresh("u")
    make_user(pair.rest_b, name, PASSWORD)
    token = login(pair.b.base_url, name, PASSWORD)
    with WsClient.with_token(pair.a.ws_url, token) as ws:
        started = time.monotonic()
        r = httpx.post(
            f"{pair.b.base_url}/api/v1/auth/logout", headers={"Authorization": f"Bearer {token}"}
        )
        assert r.status_code == 204
        code, _ = ws.expect_close(6)
        assert code == 4401
        assert time.monotonic() - started <= 5.5


def test_read_permission_withdrawn_on_b_cancels_on_a(pair: Pair) -> None:
    q = fresh()
    declare_queue(pair.rest_a, q)
    name = fresh("u")
    make_user(pair.rest_b, name, PASSWORD, read=".*")
    with WsClient.as_user(pair.a.ws_url, name, PASSWORD) as ws:
        ws.subscribe(q)
        started = time.monotonic()
        r = pair.rest_b.put(
            f"/users/{name}",
            json={"role": "user", "permissions": {"configure": "", "write": "", "read": ""}},
        )
        assert r.status_code == 200, r.text
        frame = ws.expect("SUBSCRIPTION_CANCELLED", 6)
        assert frame["reason"] == "forbidden"
        assert frame["queue"] == q
        assert time.monotonic() - started <= 5.5


def test_a_stopped_process_releases_what_its_sockets_held(database: str) -> None:
    """A stops (graceful shutdown) while its subscriber holds an unacked delivery: a subscriber
    on B gets it — by the release on shutdown, or failing that the heartbeat/ack-timeout path."""
    with ExitStack() as stack:
        p = start_pair(stack, database, ack_timeout_check_interval_ms=200)
        q = fresh()
        declare_queue(p.rest_b, q, ack_timeout_seconds=10)
        publish(p.rest_b, q, "held by A")
        on_a = WsClient.admin(p.a.ws_url)
        on_a.subscribe(q)
        held = on_a.delivery()
        with WsClient.admin(p.b.ws_url) as on_b:
            on_b.subscribe(q)
            assert on_b.quiet(0.2) == []
            started = time.monotonic()
            p.a.stop()
            code, _ = on_a.expect_close(5)
            print(f"A's socket closed with {code}")
            assert code == 1001
            d = on_b.delivery(timeout=12)
            elapsed = time.monotonic() - started
            print(f"released to B {elapsed:.2f} s after A began to stop")
            assert elapsed < 10  # the ack timeout (10 s) would be the slowest path
            assert d["message_id"] == held["message_id"]
            assert d["redelivered"] is True
            assert d["delivery_count"] == 2
            assert on_b.ack(d["delivery_tag"])["type"] == "ACKED"
            # A left the process table and its subscription rows went with it
            assert stats(p.rest_b, q)["consumers"] == 1


def _sql(url: str, sql: str, *args: Any) -> Any:
    import asyncio

    import asyncpg

    from app.storage.dsn import asyncpg_dsn

    async def run() -> Any:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def test_a_crashed_process_is_reaped_and_its_deliveries_released(pair: Pair, database: str) -> None:
    """A process that died without cleaning up (kill -9) is simulated by its rows: a
    broker_processes row with a stale heartbeat, a subscription, and an in-flight delivery
    owned by one of its connections. A live process reaps it and releases the delivery."""
    q = fresh()
    declare_queue(pair.rest_a, q)
    publish(pair.rest_a, q, "held by the dead")
    ghost, connection = str(uuid.uuid4()), str(uuid.uuid4())
    _sql(
        database,
        "INSERT INTO broker_processes (id, hostname, pid, heartbeat_at)"
        " VALUES ($1, 'ghost', 1, now() - interval '1 minute')",
        ghost,
    )
    _sql(
        database,
        "INSERT INTO subscriptions (connection_id, queue_id, process_id, prefetch)"
        " SELECT $1, id, $2, 1 FROM queues WHERE name = $3",
        connection,
        ghost,
        q,
    )
    rows = _sql(
        database,
        "UPDATE messages SET status = 'in_flight', delivery_count = 1, delivered_at = now(),"
        " lease_expires_at = now() + interval '1 hour',"
        " delivery_tag = id::text || '.' || repeat('a', 32),"
        " owner_process = $1, owner_connection = $2"
        " WHERE queue_id = (SELECT id FROM queues WHERE name = $3) RETURNING message_id",
        ghost,
        connection,
        q,
    )
    assert len(rows) == 1
    # a dead process's subscribers are not live consumers
    assert stats(pair.rest_b, q)["consumers"] == 0
    with WsClient.admin(pair.b.ws_url) as ws:
        ws.subscribe(q)
        started = time.monotonic()
        d = ws.delivery(timeout=8)  # heartbeats run every 2 s
        print(f"dead process reaped, delivery released after {time.monotonic() - started:.2f} s")
        assert d["message_id"] == rows[0]["message_id"]
        assert d["redelivered"] is True
        assert d["delivery_count"] == 2
    assert _sql(database, "SELECT 1 FROM broker_processes WHERE id = $1", ghost) == []
    assert _sql(database, "SELECT 1 FROM subscriptions WHERE process_id = $1", ghost) == []


# -- idle subscriptions (issue 19) ----------------------------------------------------------
# Idle subscriptions cost no task and no statement of their own, and still get everything: a
# publish to any of many idle queues, a row no NOTIFY announced (within the 1 s poll), and
# delayed messages at their due time, across the two processes.


def dispatcher(server: LiveServer) -> Any:
    app: Any = server.server.config.app
    return app.state.services.delivery.dispatcher


def idle_names(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"idle{tag}-{i}" for i in range(n)]


def subscribe_all(ws: WsClient, queues: list[str]) -> None:
    for q in queues:
        ws.send_json({"type": "SUBSCRIBE", "queue": q, "prefetch": 1})
    for _ in queues:
        assert ws.recv_json()["type"] == "SUBSCRIBED"


def test_every_idle_subscriber_of_500_queues_gets_a_publish_from_either_process(
    pair: Pair,
) -> None:
    a, rest_a, rest_b = pair.a, pair.rest_a, pair.rest_b
    queues = idle_names(500)
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
    pair: Pair, database: str, many: bool
) -> None:
    """A row inserted by SQL, with no NOTIFY (a lost wake-up), is found by the 1 s poll: for a
    process subscribed to few queues (one probe each) and to more than PROBE_MAX (a listing of
    the queues with ready rows)."""
    a, rest_a = pair.a, pair.rest_a
    queues = idle_names(150 if many else 1)
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
    pair: Pair,
) -> None:
    """Published on B with delays, to queues subscribed on A: none early, none long after its
    due time (the per-process timer, not the 1 s poll, wakes them)."""
    a, rest_a, rest_b = pair.a, pair.rest_a, pair.rest_b
    queues = idle_names(20)
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
