"""Operations (contract §11): health, readiness, metrics, overview; 503 when the DB is gone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
from websockets.exceptions import InvalidStatus

from app import __version__
from app.storage.dsn import asyncpg_dsn
from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    PgCluster,
    admin_sql,
    client,
    metric,
    running_server,
    wait_for,
)
from tests.support import test_settings as settings_for
from tests.wsclient import WsClient, declare_queue, publish

PROBLEM = "application/problem+json"


def _assert_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["code"] == "unavailable"
    assert body["status"] == 503
    assert {"type", "title", "status", "detail", "code"} <= body.keys()


# --- health and readiness -----------------------------------------------------------------


def test_healthz_needs_no_credentials(server: LiveServer) -> None:
    r = httpx.get(f"{server.base_url}/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_readyz_is_ready_on_a_migrated_database(server: LiveServer) -> None:
    r = httpx.get(f"{server.base_url}/readyz")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ready"}


def test_a_shutting_down_broker_is_not_ready_and_refuses_websockets(server: LiveServer) -> None:
    """From SIGTERM on (``DeliveryEngine.drain``), a load balancer must stop sending to the
    process and reconnecting clients must reach another one: /readyz 503 and upgrades 503.
    Before: both were served until the listening socket closed, after the drain."""
    delivery = server.server.broker_app.state.services.delivery
    with WsClient.as_user(server.ws_url, ADMIN_USER, ADMIN_PASSWORD):
        pass  # opens while running
    delivery.shutting_down = True
    try:
        _assert_unavailable(httpx.get(f"{server.base_url}/readyz"))
        with pytest.raises(InvalidStatus) as refused:
            WsClient.as_user(server.ws_url, ADMIN_USER, ADMIN_PASSWORD)
        assert refused.value.response.status_code == 503
    finally:
        delivery.shutting_down = False
    assert httpx.get(f"{server.base_url}/readyz").status_code == 200


def test_readyz_is_unavailable_when_the_schema_is_not_at_head(
    server: LiveServer, database_url: str
) -> None:
    admin_sql(database_url, "UPDATE alembic_version SET version_num = '0000_older'")
    r = httpx.get(f"{server.base_url}/readyz")
    _assert_unavailable(r)
    assert "0000_older" in r.json()["detail"]
    admin_sql(database_url, "DELETE FROM alembic_version")
    _assert_unavailable(httpx.get(f"{server.base_url}/readyz"))


async def test_readyz_answers_promptly_when_the_database_hangs(
    server: LiveServer, database_url: str
) -> None:
    """A lock that blocks the revision query: /readyz gives up after its short bound."""
    locker = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE")
        async with httpx.AsyncClient(timeout=30) as http:
            started = time.monotonic()
            r = await http.get(f"{server.base_url}/readyz")
            elapsed = time.monotonic() - started
            _assert_unavailable(r)
            assert elapsed < 4.0, f"/readyz took {elapsed:.1f} s"
            await tx.rollback()
            # The cancelled check left no broken connection behind.
            for _ in range(3):
                r = await http.get(f"{server.base_url}/readyz")
                assert r.status_code == 200, r.text
    finally:
        await locker.close()


# --- metrics ------------------------------------------------------------------------------


def test_metrics_are_prometheus_text_without_credentials(server: LiveServer) -> None:
    assert httpx.get(f"{server.base_url}/healthz").status_code == 200
    assert httpx.get(f"{server.base_url}/no/such/path/abc123").status_code == 404
    r = httpx.get(f"{server.base_url}/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = r.text
    assert "# TYPE messagex_http_requests_total counter" in text
    assert metric(text, "messagex_http_requests_total", route="/healthz", status="200") == 1.0
    # Requests that match no route share one label: raw paths never become label values.
    assert metric(text, "messagex_http_requests_total", route="unmatched", status="404") == 1.0
    assert "abc123" not in text
    assert metric(text, "messagex_http_request_seconds_count", route="/healthz") == 1.0
    assert "messagex_messages_published_total" in text


def test_metrics_label_requests_by_route_template(server: LiveServer, admin: httpx.Client) -> None:
    for _ in range(2):
        assert admin.get("/queues/metrics-probe-q").status_code == 404
    text = httpx.get(f"{server.base_url}/metrics").text
    assert (
        metric(text, "messagex_http_requests_total", route="/api/v1/queues/{name}", status="404")
        == 2.0
    )
    assert "metrics-probe-q" not in text


def test_metrics_export_per_queue_depth_and_consumers(
    server: LiveServer, admin: httpx.Client
) -> None:
    declare_queue(admin, "depth-deep")
    declare_queue(admin, "depth-idle")
    for body in range(3):
        publish(admin, "depth-deep", body)
    publish(admin, "depth-deep", "later", delay_ms=600_000)
    with WsClient.admin(server.ws_url) as ws:
        ws.subscribe("depth-idle", 4)
        text = httpx.get(f"{server.base_url}/metrics").text
    assert metric(text, "messagex_queues") == 2.0
    assert metric(text, "messagex_queue_messages", queue="depth-deep", status="ready") == 3.0
    assert metric(text, "messagex_queue_messages", queue="depth-deep", status="delayed") == 1.0
    assert metric(text, "messagex_queue_messages", queue="depth-deep", status="in_flight") == 0.0
    assert metric(text, "messagex_queue_messages", queue="depth-idle", status="ready") == 0.0
    assert metric(text, "messagex_queue_consumers", queue="depth-idle") == 1.0
    assert metric(text, "messagex_queue_consumers", queue="depth-deep") == 0.0
    # prometheus_client's _created series are off: they double the exposition for nothing.
    assert "_created" not in text


def test_metrics_export_only_the_deepest_queues_up_to_the_cap(database_url: str) -> None:
    settings = settings_for(database_url, metrics_max_queues=1)
    with (
        running_server(settings) as live,
        client(live.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as admin,
    ):
        for name in ("cap-a", "cap-b", "cap-c"):
            declare_queue(admin, name)
        publish(admin, "cap-b", "x")
        text = httpx.get(f"{live.base_url}/metrics").text
    assert metric(text, "messagex_queues") == 3.0
    assert metric(text, "messagex_queue_messages", queue="cap-b", status="ready") == 1.0
    assert 'queue="cap-a"' not in text
    assert 'queue="cap-c"' not in text


# --- overview -----------------------------------------------------------------------------


def test_overview_of_a_fresh_broker(admin: httpx.Client) -> None:
    r = admin.get("/overview")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "version": __version__,
        "queues": 0,
        "exchanges": 4,  # the built-in amq.* exchanges count
        "messages": {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0},
        "connections": 0,
        "subscriptions": 0,
    }


def _seed(database_url: str) -> None:
    """Rows as the topology, publish and delivery code would leave them (written directly,
    so this test does not depend on their endpoints)."""
    admin_sql(
        database_url,
        "INSERT INTO exchanges (name, type) VALUES ('ov.x', 'topic')",
        "INSERT INTO queues (name) VALUES ('ov.q1'), ('ov.q2'), ('ov.q3')",
        """
        INSERT INTO messages (queue_id, status, message_id, exchange, routing_key, body,
                              available_at, delivery_tag, lease_expires_at)
        SELECT q.id, v.status, 'm', '', 'k', '\\x00'::bytea,
               now() + v.delay, v.tag, CASE WHEN v.tag IS NULL THEN NULL ELSE now() END
        FROM queues q,
             (VALUES ('ready', interval '0', NULL), ('ready', interval '-1 minute', NULL),
                     ('ready', interval '1 hour', NULL),
                     ('in_flight', interval '0', 't1'), ('in_flight', interval '0', 't2'),
                     ('dead', interval '0', NULL)) AS v(status, delay, tag)
        WHERE q.name = 'ov.q1'
        """,
        # Two live processes and one whose heartbeat is stale (crashed): its rows don't count.
        """
        INSERT INTO broker_processes (id, hostname, pid, connections, heartbeat_at) VALUES
          ('00000000-0000-0000-0000-000000000001', 'a', 1, 3, now()),
          ('00000000-0000-0000-0000-000000000002', 'b', 2, 2, now() - interval '5 seconds'),
          ('00000000-0000-0000-0000-000000000003', 'c', 3, 50, now() - interval '1 minute')
        """,
        """
        INSERT INTO subscriptions (connection_id, queue_id, process_id, prefetch)
        SELECT c.conn::uuid, q.id, c.proc::uuid, 1
        FROM queues q,
             (VALUES ('10000000-0000-0000-0000-000000000001',
                      '00000000-0000-0000-0000-000000000001'),
                     ('10000000-0000-0000-0000-000000000002',
                      '00000000-0000-0000-0000-000000000002'),
                     ('10000000-0000-0000-0000-000000000003',
                      '00000000-0000-0000-0000-000000000003')) AS c(conn, proc)
        WHERE q.name IN ('ov.q1', 'ov.q2')
        """,
    )


def test_overview_counts_everything_across_live_processes(
    admin: httpx.Client, database_url: str
) -> None:
    _seed(database_url)
    r = admin.get("/overview")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "version": __version__,
        "queues": 3,
        "exchanges": 5,
        "messages": {"ready": 2, "delayed": 1, "in_flight": 2, "dead": 1},
        "connections": 5,  # 3 + 2; the stale process's 50 are not counted
        "subscriptions": 4,  # 2 live processes x 2 queues
    }


def test_overview_needs_credentials(anon: httpx.Client) -> None:
    r = anon.get("/overview")
    assert r.status_code == 401
    assert r.json()["code"] == "unauthorized"


def test_overview_is_admin_only(server: LiveServer, admin: httpx.Client) -> None:
    r = admin.put(
        "/users/ov-user",
        json={
            "password": "ov-user-password",
            "role": "user",
            "permissions": {"configure": ".*", "write": ".*", "read": ".*"},
        },
    )
    assert r.status_code == 201, r.text
    with client(server.base_url, auth=("ov-user", "ov-user-password")) as user:
        r = user.get("/overview")
    assert r.status_code == 403
    assert r.headers["content-type"].startswith(PROBLEM)
    assert r.json()["code"] == "forbidden"


# --- the database goes away and comes back ------------------------------------------------


@pytest.fixture
def refusable_database(pg_cluster: PgCluster, database_url: str) -> Iterator[str]:
    """The test database's name; connections to it are allowed again afterwards."""
    name = urlsplit(database_url).path.lstrip("/")
    try:
        yield name
    finally:
        admin_sql(pg_cluster.url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def _refuse_connections(pg_cluster: PgCluster, name: str) -> None:
    admin_sql(
        pg_cluster.url,
        f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false',
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()",
    )


def _timed(fn: object, *args: object) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = fn(*args)  # type: ignore[operator]
    return r, time.monotonic() - started


def test_unreachable_database_gives_503_promptly_and_recovers(
    server: LiveServer, admin: httpx.Client, pg_cluster: PgCluster, refusable_database: str
) -> None:
    ready_url = f"{server.base_url}/readyz"
    # Warm up: the pool holds live connections, the Basic cache knows the admin.
    assert admin.get("/overview").status_code == 200
    assert admin.get("/exchanges").status_code == 200
    assert httpx.get(ready_url).status_code == 200

    _refuse_connections(pg_cluster, refusable_database)

    # The first calls meet the terminated pooled connections, later ones a refused connect.
    for _ in range(3):
        for fn, arg in (
            (httpx.get, ready_url),
            (admin.get, "/exchanges"),
            (admin.get, "/overview"),
        ):
            r, elapsed = _timed(fn, arg)
            _assert_unavailable(r)
            assert elapsed < 2.0, f"{arg} took {elapsed:.1f} s"
            assert "SELECT" not in r.text
            assert "Traceback" not in r.text

    admin_sql(pg_cluster.url, f'ALTER DATABASE "{refusable_database}" ALLOW_CONNECTIONS true')

    # Recovery without a restart.
    wait_for(
        lambda: httpx.get(ready_url).status_code == 200, timeout=5, message="/readyz back to 200"
    )
    assert admin.get("/exchanges").status_code == 200
    r = admin.get("/overview")
    assert r.status_code == 200, r.text
    assert r.json()["exchanges"] == 4
