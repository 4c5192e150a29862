"""Behind PgBouncer (issue 23, item 3): real ``messagex serve`` processes whose DATABASE_URL is
Debian's PgBouncer (pgbouncer.py) in front of the test database.

- Session pooling: everything works as direct (the REST and WebSocket flow).
- Transaction pooling (``MESSAGEX_DATABASE_POOL_MODE=transaction``): the same flow works
  (no prepared statement or session state outlives a transaction); with
  ``MESSAGEX_LISTEN_DATABASE_URL`` direct, a publish on one process reaches a consumer on
  another at once; without it the process polls: the push still arrives within the poll
  bound, a deleted queue's subscription still ends, the log and ``/readyz`` say so, and the
  diagnosis does not call it ``listen_down``. Under load across two polling processes,
  nothing is lost (checker.py).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.broker.dispatcher import Dispatcher
from tests.faults.checker import Ledger, QueueSpec, check
from tests.faults.harness import (
    BrokerProc,
    Consumer,
    Publisher,
    brokers,
    declare,
    drain,
    join_all,
    remaining_rows,
)
from tests.faults.pgbouncer import MISSING, PgBouncer, PoolMode
from tests.support import PgCluster, admin_sql, unavailable_here, wait_for, with_database
from tests.wsclient import WsClient

#: the poll interval of a polling process (the dispatcher's default), and the slack a shared
#: 2-core machine needs on top of it
POLL_SECONDS: float = (Dispatcher.__init__.__kwdefaults__ or {})["poll_interval"]
SLACK_SECONDS = 1.5
TRANSACTION = {"MESSAGEX_DATABASE_POOL_MODE": "transaction"}


def _need_pgbouncer() -> None:
    if MISSING is not None:
        unavailable_here(MISSING)


@pytest.fixture(scope="module")
def session_url(module_db: str) -> Iterator[str]:
    yield from _bouncer(module_db, "session")


@pytest.fixture(scope="module")
def transaction_url(module_db: str) -> Iterator[str]:
    yield from _bouncer(module_db, "transaction")


def _bouncer(database_url: str, mode: PoolMode) -> Iterator[str]:
    _need_pgbouncer()
    with PgBouncer.in_front_of(database_url, mode) as bouncer:
        yield bouncer.url_for(database_url)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def full_flow(b: BrokerProc) -> None:
    """Declare, bind, publish (routed), WebSocket consume + ack, a delayed message, pull,
    operations by filter, browse, diagnosis, overview and connections."""
    ex, q = _name("pgb-ex"), _name("pgb-q")
    with b.client() as api, WsClient.admin(b.ws_url) as ws:
        assert api.put(f"/exchanges/{ex}", json={"type": "direct"}).status_code == 201
        assert api.put(f"/queues/{q}").status_code == 201
        r = api.post("/bindings", json={"exchange": ex, "queue": q, "routing_key": "k"})
        assert r.status_code == 201, r.text
        ws.subscribe(q, prefetch=10)
        r = api.post(f"/exchanges/{ex}/publish", json={"routing_key": "k", "body": "hello"})
        assert r.status_code == 200, r.text
        d = ws.delivery(timeout=10)
        assert (d["body"], d["exchange"]) == ("hello", ex)
        assert ws.ack(d["delivery_tag"])["type"] != "ERROR"
        started = time.monotonic()
        r = api.post(
            f"/exchanges/{ex}/publish", json={"routing_key": "k", "body": "later", "delay_ms": 500}
        )
        assert r.status_code == 200, r.text
        d = ws.delivery(timeout=10)
        assert d["body"] == "later"
        assert time.monotonic() - started >= 0.45
        assert ws.ack(d["delivery_tag"])["type"] != "ERROR"
        ws.request({"type": "UNSUBSCRIBE", "queue": q})
        assert api.post(f"/queues/{q}/messages", json={"body": "pulled"}).status_code == 200
        r = api.post(f"/queues/{q}/get", json={"max_messages": 5, "wait_ms": 5000})
        assert r.status_code == 200, r.text
        (m,) = r.json()["messages"]
        assert m["body"] == "pulled"
        assert api.post(f"/deliveries/{m['delivery_tag']}/ack").status_code == 204
        # by filter (a transaction with a local statement timeout), browse, the admin views
        assert api.post(f"/queues/{q}/messages", json={"body": "moved"}).status_code == 200
        q2 = _name("pgb-q2")
        assert api.put(f"/queues/{q2}").status_code == 201
        found = api.post(f"/queues/{q}/messages/query", json={"filter": {}})
        assert found.status_code == 200, found.text
        r = api.post(f"/queues/{q}/messages/move", json={"filter": {}, "to": q2})
        assert r.status_code == 200, r.text
        assert r.json()["moved"] == 1
        assert len(api.get(f"/queues/{q2}/messages").json()["items"]) == 1
        r = api.post(f"/queues/{q2}/messages/delete", json={"filter": {}})
        assert r.status_code == 200, r.text
        for path in (f"/queues/{q}/diagnosis", "/diagnosis", "/overview", "/connections"):
            assert api.get(path).status_code == 200, path
        stats = api.get(f"/queues/{q}").json()["stats"]
        assert (stats["ready"], stats["in_flight"]) == (0, 0), stats


def cross_latencies(a: BrokerProc, b: BrokerProc, n: int) -> list[float]:
    """Seconds from a publish answered by ``a`` to its delivery by ``b``, ``n`` times."""
    q = _name("pgb-x")
    out = []
    with a.client() as api, WsClient.admin(b.ws_url) as ws:
        assert api.put(f"/queues/{q}").status_code == 201
        ws.subscribe(q, prefetch=10)
        for i in range(n):
            r = api.post(f"/queues/{q}/messages", json={"body": i})
            assert r.status_code == 200, r.text
            answered = time.monotonic()
            d = ws.delivery(timeout=POLL_SECONDS + 10)
            out.append(time.monotonic() - answered)
            assert d["body"] == i
            ws.ack(d["delivery_tag"])
    return out


def ready_detail(b: BrokerProc) -> str | None:
    with b.client() as api:
        r = api.get("/../../readyz")
        assert r.status_code == 200, r.text
        detail: str | None = r.json().get("detail")
        return detail


def test_session_pooling_works_as_direct(session_url: str, logs: Path) -> None:
    with brokers(session_url, logs, 2) as (a, b):
        full_flow(a)
        assert ready_detail(a) is None
        # LISTEN through a session pooler works: cross-process push at once
        seconds = cross_latencies(a, b, 5)
        assert statistics.median(seconds) < POLL_SECONDS / 2, seconds


def test_transaction_pooling_with_a_direct_listen_url(
    module_db: str, transaction_url: str, logs: Path
) -> None:
    env = {**TRANSACTION, "MESSAGEX_LISTEN_DATABASE_URL": module_db}
    with brokers(transaction_url, logs, 2, **env) as (a, b):
        full_flow(a)
        seconds = cross_latencies(a, b, 10)
        print(f"cross-process push through PgBouncer (transaction) + direct LISTEN: {seconds}")
        # at once, not by the poll
        assert statistics.median(seconds) < POLL_SECONDS / 2, seconds
        assert ready_detail(a) is None
        assert "does not LISTEN" not in a.log_text()
        # no statement_timeout on the role or database yet: the broker says it cannot SET one
        assert "statement_timeout is 0 (none)" in a.log_text()


@pytest.fixture
def timed_db(pg_cluster: PgCluster, template_db: str) -> Iterator[str]:
    """A database of the test's own with the statement timeout where transaction pooling needs
    it (docs/operations.md): PgBouncer's ``*`` entry reaches it with a pool of its own."""
    name = pg_cluster.create_database(template_db)
    try:
        url = pg_cluster.url_for(name)
        admin_sql(url, f"ALTER DATABASE \"{name}\" SET statement_timeout = '30s'")
        yield url
    finally:
        pg_cluster.drop_database(name)


def test_transaction_pooling_without_a_listen_url_polls(
    transaction_url: str, timed_db: str, logs: Path
) -> None:
    url = with_database(transaction_url, urlsplit(timed_db).path.lstrip("/"))
    with brokers(url, logs, 2, **TRANSACTION) as (a, b):
        assert "statement_timeout" not in a.log_text()
        full_flow(a)
        seconds = cross_latencies(a, b, 5)
        print(f"cross-process push through PgBouncer (transaction), polling: {seconds}")
        assert max(seconds) < POLL_SECONDS + SLACK_SECONDS, seconds
        detail = ready_detail(b)
        assert detail is not None
        assert "polling" in detail, detail
        assert "does not LISTEN" in b.log_text()
        # a queue deleted on a: b's subscriber is told within the poll bound
        q = _name("pgb-del")
        with a.client() as api, WsClient.admin(b.ws_url) as ws:
            assert api.put(f"/queues/{q}").status_code == 201
            ws.subscribe(q)
            assert api.delete(f"/queues/{q}").status_code == 204
            frame = ws.expect("SUBSCRIPTION_CANCELLED", timeout=POLL_SECONDS + 5)
            assert (frame["queue"], frame["reason"]) == (q, "queue_deleted")
            # polling by choice is not "listen_down"
            findings = api.get("/diagnosis").json()["findings"]
            assert "listen_down" not in {f["code"] for f in findings}, findings


def test_transaction_pooling_under_load_loses_nothing(
    module_db: str, transaction_url: str, logs: Path
) -> None:
    """Publishers on one polling process, WebSocket consumers on the other."""
    with brokers(
        transaction_url,
        logs,
        2,
        ACK_TIMEOUT_SECONDS=5,
        ACK_TIMEOUT_CHECK_INTERVAL_MS=200,
        **TRANSACTION,
    ) as (a, b):
        spec = QueueSpec(_name("pgb-load"))
        with a.client() as api:
            declare(api, spec)
        ledger, stop = Ledger(), threading.Event()
        consumers = [
            Consumer(ledger, [b.ws_url], [spec.name], stop, prefetch=20, seconds=60)
            for _ in range(2)
        ]
        pubs = [
            Publisher(ledger, [a.api], spec.name, stop, count=400, seconds=40) for _ in range(3)
        ]
        for w in consumers:
            w.start()
        for c in consumers:
            assert c.connected.wait(10)
        for p in pubs:
            p.start()
        join_all(pubs, 60)
        published = sum(r.outcome == "ok" for r in ledger.publishes.values())
        wait_for(
            lambda: sum(d.outcome == "acked" for d in ledger.deliveries) >= published,
            30,
            message="every publish acked",
        )
        stop.set()
        join_all(consumers, 30)
        drain(ledger, b.ws_url, module_db, [spec], timeout=30)
        report = check(ledger, [spec], remaining_rows(module_db, [spec.name]))
    print(f"through PgBouncer (transaction), polling: {report.summary()}")
    assert published == 1200
    assert report.clean, report.summary()
