"""Delivery semantics over WebSocket (contract §10, §12) through a real server.

The module's server sweeps ack timeouts every 100 ms, so a queue declared with
``ack_timeout_seconds: 1`` times out in about a second. Each test has its own queues.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import threading
import time
import uuid
from collections import Counter
from datetime import datetime
from typing import Any

import asyncpg
import httpx
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.faults.harness import sql
from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    admin_sql,
    client,
    login,
    metric,
    running_server,
    wait_for,
)
from tests.support import test_settings as settings_for
from tests.wsclient import (
    WsClient,
    bind,
    browse,
    declare_queue,
    make_user,
    publish,
    publish_many,
    stats,
)

_names = itertools.count()
PASSWORD = "pw-of-the-user"


#: settings of this module's shared server (the ``srv`` fixture in tests/conftest.py)
SERVER_SETTINGS = {"ack_timeout_check_interval_ms": 100}


@pytest.fixture
def url(srv: LiveServer) -> str:
    return srv.ws_url


def fresh(prefix: str = "q") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


@pytest.fixture
def q(adm: httpx.Client, request: pytest.FixtureRequest) -> str:
    """A fresh queue of this test's own, bound to amq.direct with its name as key."""
    name = re.sub(r"[^A-Za-z0-9_.:-]", "_", request.node.name)[:200] + f".{next(_names)}"
    declare_queue(adm, name)
    bind(adm, "amq.direct", name, name)
    return name


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def assert_error(reply: dict[str, Any], code: str) -> dict[str, Any]:
    assert reply["type"] == "ERROR", reply
    assert reply["code"] == code, reply
    return reply


# -- consumers in threads ---------------------------------------------------------------


class Consumer(threading.Thread):
    """Receives on its own socket and ACKs (without id) every delivery, until told to stop."""

    def __init__(
        self, ws: WsClient, seen: list[dict[str, Any]], lock: threading.Lock, work: float
    ) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.ws = ws
        self.got: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.seen = seen
        self.lock = lock
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                frame = self.ws.recv_json(0.1)
            except TimeoutError:
                continue
            if frame["type"] != "MESSAGE_DELIVERED":
                self.errors.append(frame)
                continue
            self.got.append(frame)
            with self.lock:
                self.seen.append(frame)
            if self.work:
                self.stop.wait(self.work)  # the same simulated work for every consumer
            self.ws.send_json({"type": "ACK", "delivery_tag": frame["delivery_tag"]})


def consume_all(
    clients: list[WsClient], total: int, timeout: float, work: float = 0.0
) -> list[Consumer]:
    """Run one acking consumer thread per client until ``total`` deliveries were seen."""
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()
    consumers = [Consumer(ws, seen, lock, work) for ws in clients]
    for c in consumers:
        c.start()
    try:
        wait_for(lambda: len(seen) >= total, timeout, interval=0.02, message=f"{total} deliveries")
    finally:
        for c in consumers:
            c.stop.set()
        for c in consumers:
            c.join(5)
    return consumers


# -- prefetch, fairness, exclusivity ----------------------------------------------------


@pytest.mark.parametrize("prefetch", [1, 4])
def test_prefetch_bounds_unsettled_deliveries_exactly(
    url: str, adm: httpx.Client, q: str, prefetch: int
) -> None:
    publish_many(adm, q, list(range(3 * prefetch)))
    with WsClient.admin(url) as ws:
        ws.subscribe(q, prefetch)
        first = ws.deliveries_n(prefetch)
        assert [d["body"] for d in first] == list(range(prefetch))
        assert ws.quiet(0.5) == []
        assert stats(adm, q)["in_flight"] == prefetch
        # each ACK frees exactly one slot
        assert ws.ack(first[0]["delivery_tag"])["type"] == "ACKED"
        nxt = ws.delivery()
        assert nxt["body"] == prefetch
        assert ws.quiet(0.3) == []
        # a NACK with requeue frees a slot too (and the message comes back in its place)
        assert ws.nack(nxt["delivery_tag"])["outcome"] == "requeued"
        again = ws.delivery()
        assert again["body"] == nxt["body"]
        assert again["redelivered"] is True
        assert ws.quiet(0.3) == []
        assert stats(adm, q)["in_flight"] == prefetch


class RowLock:
    """Holds ``FOR UPDATE`` on one message row from another session (a thread with its own
    loop) until released, so a statement that settles that row waits for it."""

    def __init__(self, database_url: str, message_id: str) -> None:
        self._locked = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._hold(database_url, message_id)), daemon=True
        )

    async def _hold(self, database_url: str, message_id: str) -> None:
        conn = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            async with conn.transaction():
                row = await conn.fetchrow(
                    "SELECT id FROM messages WHERE message_id = $1 FOR UPDATE", message_id
                )
                assert row is not None
                self._locked.set()
                await asyncio.get_running_loop().run_in_executor(None, self._release.wait, 15)
        finally:
            await conn.close()

    def __enter__(self) -> RowLock:
        self._thread.start()
        assert self._locked.wait(10), "could not lock the row"
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._thread.join(15)


def test_ack_returns_the_prefetch_slot_before_its_delete_commits(
    srv: LiveServer, url: str, adm: httpx.Client, q: str
) -> None:
    """As in RabbitMQ, credit returns when the ACK arrives: the next claim runs beside the
    batched DELETE instead of after it (docs/performance.md)."""
    publish_many(adm, q, ["first", "second"])
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        first = ws.delivery()
        assert first["body"] == "first"
        with RowLock(srv.database_url, first["message_id"]):
            ws.send_json({"type": "ACK", "delivery_tag": first["delivery_tag"], "id": "a1"})
            second = ws.delivery(timeout=5)  # while the ACK's DELETE waits for the lock
            assert second["body"] == "second"
            assert ws.quiet(0.3) == []  # not ACKED yet: it is answered after its commit
        assert ws.expect("ACKED", id="a1")["delivery_tag"] == first["delivery_tag"]
        assert [m["body"] for m in browse(adm, q)] == ["second"]


def test_reconciliation_keeps_the_slots_of_deliveries_handed_out_while_it_queries(
    url: str, adm: httpx.Client, q: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 1 s reconciliation drops local tags the database no longer has in flight. A claim
    that hands out while its query runs committed after the query's snapshot: its tags must
    not be taken for settled, or the consumer would get more than its prefetch."""
    from app.storage import deliveries

    real = deliveries.still_in_flight
    queried, proceed = threading.Event(), threading.Event()

    async def paused(conn: Any, owners: Any) -> set[tuple[str, str]]:
        live = await real(conn, owners)
        if not queried.is_set():
            queried.set()
            await asyncio.get_running_loop().run_in_executor(None, proceed.wait, 10)
        return live

    publish(adm, q, "first")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 2)
        assert ws.delivery()["body"] == "first"
        monkeypatch.setattr(deliveries, "still_in_flight", paused)
        try:
            assert queried.wait(5), "no reconciliation ran"
            publish(adm, q, "second")  # claimed and handed out while the query is paused
            assert ws.delivery()["body"] == "second"
        finally:
            proceed.set()
        publish(adm, q, "third")
        assert ws.quiet(1.5) == []  # prefetch 2 holds: "third" waits for an ACK
        assert stats(adm, q)["in_flight"] == 2


def test_delivery_under_a_server_without_the_send_many_extension(database_url: str) -> None:
    """Our server writes a burst of deliveries in one send (app/server.py, SEND_MANY); under
    any other ASGI server the connection sends them one ``websocket.send`` each."""
    with (
        running_server(settings_for(database_url), plain_websockets=True) as live,
        client(live.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as admin,
        WsClient.admin(live.ws_url) as ws,
    ):
        q = fresh()
        declare_queue(admin, q)
        bind(admin, "amq.direct", q, q)
        ws.subscribe(q, 10)
        publish_many(admin, q, list(range(25)))
        got = []
        for _ in range(25):
            d = ws.delivery()
            got.append(d["body"])
            ws.send_json({"type": "ACK", "delivery_tag": d["delivery_tag"]})
        assert got == list(range(25))
        wait_for(lambda: stats(admin, q)["in_flight"] == 0, 5, message="acks to settle")
        assert stats(admin, q)["ready"] == 0


def test_prefetch_is_per_queue_on_one_connection(url: str, adm: httpx.Client) -> None:
    a, b = fresh(), fresh()
    declare_queue(adm, a)
    declare_queue(adm, b)
    for i in range(4):
        publish(adm, a, f"a{i}")
        publish(adm, b, f"b{i}")
    with WsClient.admin(url) as ws:
        ws.subscribe(a, 2)
        ws.subscribe(b, 1)
        got = ws.deliveries_n(3)
        assert ws.quiet(0.4) == []
        assert Counter(d["queue"] for d in got) == {a: 2, b: 1}


def test_delivery_fifo_and_push_latency(url: str, adm: httpx.Client, q: str) -> None:
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 50)
        started = time.monotonic()
        publish(adm, q, "wake")
        ws.delivery(2)
        latency = time.monotonic() - started
        print(f"publish → MESSAGE_DELIVERED on one process: {latency * 1000:.1f} ms")
        assert latency < 0.5
        publish_many(adm, q, list(range(40)))
        assert [d["body"] for d in ws.deliveries_n(40)] == list(range(40))


def counter(srv: LiveServer, name: str, **labels: str) -> float:
    """A counter of the server's /metrics (0 before its first increment)."""
    return metric(httpx.get(f"{srv.base_url}/metrics").text, name, **labels) or 0.0


def handed_off(srv: LiveServer) -> float:
    return counter(srv, "messagex_deliveries_handed_off_total")


def take_and_ack(ws: WsClient) -> Any:
    """The next delivery's body, once its ACK was answered ACKED."""
    got = ws.delivery()
    assert ws.ack(got["delivery_tag"])["type"] == "ACKED"
    return got["body"]


def claims(srv: LiveServer) -> float:
    return counter(srv, "messagex_claim_statements_total", via="websocket")


def test_an_idle_subscriber_gets_a_publish_straight_from_its_insert(
    srv: LiveServer, url: str, adm: httpx.Client, q: str
) -> None:
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 10)
        before = handed_off(srv)
        publish_many(adm, q, [{"n": 0}, {"n": 1}, {"n": 2}])
        got = ws.deliveries_n(3)
        # handed off by the publish's own statement: no claim, the same frame a claim makes
        assert handed_off(srv) == before + 3
        assert [d["body"] for d in got] == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert all(d["delivery_count"] == 1 and d["redelivered"] is False for d in got)
        assert all(d["exchange"] == "amq.direct" and d["routing_key"] == q for d in got)
        ids = [int(d["delivery_tag"].split(".")[0]) for d in got]
        assert ids == sorted(ids)
        rows = browse(adm, q)
        assert [(r["status"], r["delivery_count"]) for r in rows] == [("in_flight", 1)] * 3
        for d in got:
            ws.ack(d["delivery_tag"])
        wait_for(lambda: browse(adm, q) == [], 3, message="every message acked")


def test_acks_at_light_load_cost_no_empty_claims(
    srv: LiveServer, url: str, adm: httpx.Client, q: str
) -> None:
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        before = claims(srv)
        for n in range(20):
            publish(adm, q, n)
            assert take_and_ack(ws) == n
        # each message was handed off by its publish, and no ACK woke a claim for a queue
        # that had nothing waiting (only the once-a-second poll claims)
        assert claims(srv) - before <= 10
    wait_for(lambda: browse(adm, q) == [], 3, message="every message acked")


def test_copies_beyond_the_prefetch_wait_their_turn(
    srv: LiveServer, url: str, adm: httpx.Client, q: str
) -> None:
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 2)
        before = handed_off(srv)
        publish_many(adm, q, list(range(5)))
        assert [take_and_ack(ws) for _ in range(5)] == list(range(5))
        assert handed_off(srv) - before == 2  # the first two; the other three waited, claimed
        wait_for(lambda: browse(adm, q) == [], 3, message="every message acked")


def test_round_robin_is_fair(url: str, adm: httpx.Client, q: str) -> None:
    clients = [WsClient.admin(url) for _ in range(3)]
    try:
        for ws in clients:
            ws.subscribe(q, 1)
        publish_many(adm, q, list(range(30)))
        # equal consumers (10 ms of work each), so that shares measure the dispatcher's
        # round-robin rather than thread scheduling in the test process
        consumers = consume_all(clients, 30, 15, work=0.01)
    finally:
        for ws in clients:
            ws.close()
    shares = [len(c.got) for c in consumers]
    print("shares:", shares)
    assert sum(shares) == 30
    assert all(8 <= s <= 12 for s in shares), shares
    assert all(not c.errors for c in consumers), [c.errors for c in consumers]
    wait_for(lambda: browse(adm, q) == [], 3, message="every message acked")


def test_no_message_is_in_flight_to_two_consumers(url: str, adm: httpx.Client, q: str) -> None:
    total = 2000
    clients = [WsClient.admin(url) for _ in range(4)]
    try:
        for ws in clients:
            ws.subscribe(q, 10)
        publish_many(adm, q, list(range(total)))
        consumers = consume_all(clients, total, 40)
    finally:
        for ws in clients:
            ws.close()
    frames = [f for c in consumers for f in c.got]
    assert all(not c.errors for c in consumers), [c.errors[:3] for c in consumers]
    assert len(frames) == total
    assert sorted(f["body"] for f in frames) == list(range(total))
    assert len({f["message_id"] for f in frames}) == total
    assert len({f["delivery_tag"] for f in frames}) == total
    assert not any(f["redelivered"] for f in frames)
    assert {f["delivery_count"] for f in frames} == {1}
    assert all(len(c.got) > 0 for c in consumers), [len(c.got) for c in consumers]
    wait_for(lambda: stats(adm, q)["in_flight"] == 0, 5, message="every ack to land")
    assert browse(adm, q) == []


# -- retry path, dead-lettering ---------------------------------------------------------


def test_delivery_limit_dead_letters_with_x_death(url: str, adm: httpx.Client) -> None:
    dlq, q = fresh("dlq"), fresh()
    declare_queue(adm, dlq)
    declare_queue(adm, q, max_delivery_count=2, dead_letter_queue=dlq)
    bind(adm, "amq.topic", q, "orders.#")
    r = adm.post(
        "/exchanges/amq.topic/publish",
        json={
            "routing_key": "orders.eu.new",
            "body": {"order": 7},
            "headers": {"tenant": "acme", "x-death": "not a list"},
            "properties": {"correlation_id": "corr-7", "reply_to": "replies"},
        },
    )
    assert r.status_code == 200, r.text
    message_id = r.json()["message_id"]
    original = browse(adm, q)[0]
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        d1 = ws.delivery()
        assert ws.nack(d1["delivery_tag"])["outcome"] == "requeued"
        d2 = ws.delivery()
        assert d2["delivery_count"] == 2
        assert ws.nack(d2["delivery_tag"])["outcome"] == "dead_lettered"
        assert ws.quiet(0.3) == []
    assert browse(adm, q) == []
    [dead] = browse(adm, dlq)
    assert dead["status"] == "ready"
    assert dead["delivery_count"] == 0
    assert dead["message_id"] == message_id
    assert dead["created_at"] == original["created_at"]
    assert dead["exchange"] == "amq.topic"
    assert dead["routing_key"] == "orders.eu.new"
    assert dead["body"] == {"order": 7}
    assert dead["properties"] == original["properties"]
    assert dead["headers"]["tenant"] == "acme"
    [death] = dead["headers"]["x-death"]
    assert set(death) == {"queue", "reason", "count", "time", "exchange", "routing_keys"}
    assert death["queue"] == q
    assert death["reason"] == "delivery_limit"
    assert death["count"] == 1
    assert death["exchange"] == "amq.topic"
    assert death["routing_keys"] == ["orders.eu.new"]
    assert parse_time(death["time"]) >= parse_time(original["created_at"])
    assert stats(adm, dlq)["ready"] == 1
    # the dead-lettered copy is delivered from the DLQ as a fresh delivery
    with WsClient.admin(url) as ws:
        ws.subscribe(dlq)
        d = ws.delivery()
        assert d["message_id"] == message_id
        assert d["delivery_count"] == 1
        assert d["redelivered"] is False
        assert d["queue"] == dlq
        assert d["headers"]["x-death"][0]["queue"] == q


def test_x_death_records_each_hop_newest_first(url: str, adm: httpx.Client) -> None:
    last, middle, first = fresh("last"), fresh("mid"), fresh("first")
    declare_queue(adm, last)
    declare_queue(adm, middle, max_delivery_count=1, dead_letter_queue=last)
    declare_queue(adm, first, dead_letter_queue=middle)
    publish(adm, first, "hop")
    with WsClient.admin(url) as ws:
        ws.subscribe(first)
        assert ws.nack(ws.delivery()["delivery_tag"], requeue=False)["outcome"] == "dead_lettered"
        ws.subscribe(middle)
        assert ws.nack(ws.delivery()["delivery_tag"])["outcome"] == "dead_lettered"
    [dead] = browse(adm, last)
    deaths = dead["headers"]["x-death"]
    assert [(e["queue"], e["reason"], e["count"]) for e in deaths] == [
        (middle, "delivery_limit", 1),
        (first, "rejected", 1),
    ]
    assert all(e["exchange"] == "" and e["routing_keys"] == [first] for e in deaths)


def test_dead_without_dlq_is_browsable_and_never_delivered(url: str, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, max_delivery_count=1)
    publish(adm, q, "poison")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 5)
        d = ws.delivery()
        assert ws.nack(d["delivery_tag"])["outcome"] == "dead"
        assert ws.quiet(0.5) == []
        publish(adm, q, "fine")
        fine = ws.delivery()
        assert fine["body"] == "fine"  # the queue still works, the dead one stays
        assert ws.ack(fine["delivery_tag"])["type"] == "ACKED"
        assert ws.quiet(0.3) == []
    [dead] = browse(adm, q, "dead")
    assert dead["body"] == "poison"
    assert dead["status"] == "dead"
    assert dead["message_id"] == d["message_id"]
    assert stats(adm, q)["dead"] == 1
    assert "x-death" not in dead["headers"]


def test_nack_without_requeue_rejects_to_dlq_or_discards(url: str, adm: httpx.Client) -> None:
    dlq, with_dlq, without = fresh("dlq"), fresh(), fresh()
    declare_queue(adm, dlq)
    declare_queue(adm, with_dlq, dead_letter_queue=dlq)
    declare_queue(adm, without)
    publish(adm, with_dlq, "r")
    publish(adm, without, "d")
    with WsClient.admin(url) as ws:
        ws.subscribe(with_dlq)
        ws.subscribe(without)
        outcomes = {}
        for d in ws.deliveries_n(2):
            outcomes[d["queue"]] = ws.nack(d["delivery_tag"], requeue=False)["outcome"]
    assert outcomes == {with_dlq: "dead_lettered", without: "discarded"}
    assert browse(adm, without) == []
    assert browse(adm, with_dlq) == []
    [moved] = browse(adm, dlq)
    assert moved["body"] == "r"
    assert moved["delivery_count"] == 0
    [death] = moved["headers"]["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (with_dlq, "rejected", 1)


# -- ack timeout, disconnect ------------------------------------------------------------


def test_ack_timeout_redelivers_to_another_consumer(url: str, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, ack_timeout_seconds=1)
    publish(adm, q, "slow")
    with WsClient.admin(url) as a, WsClient.admin(url) as b:
        a.subscribe(q)
        first = a.delivery()
        got_at = time.monotonic()
        # stop a's subscription: its unsettled delivery stays owned until it times out
        assert a.request({"type": "UNSUBSCRIBE", "queue": q})["type"] == "UNSUBSCRIBED"
        b.subscribe(q)
        second = b.delivery(timeout=5)
        elapsed = time.monotonic() - got_at
        print(f"redelivered after {elapsed:.2f} s (ack timeout 1 s, sweep every 100 ms)")
        assert 0.8 <= elapsed <= 3.0, elapsed
        assert second["message_id"] == first["message_id"]
        assert second["delivery_tag"] != first["delivery_tag"]
        assert second["redelivered"] is True
        assert second["delivery_count"] == 2
        late = assert_error(a.ack(first["delivery_tag"]), "unknown_delivery_tag")
        assert late["delivery_tag"] == first["delivery_tag"]
        # the late ACK changed nothing: b still holds it
        assert [m["status"] for m in browse(adm, q)] == ["in_flight"]
        assert b.ack(second["delivery_tag"])["type"] == "ACKED"
    assert browse(adm, q) == []


def test_ack_timeout_frees_the_prefetch_slot(url: str, adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, ack_timeout_seconds=1)
    publish(adm, q, "a")
    publish(adm, q, "b")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        first = ws.delivery()
        assert first["body"] == "a"
        # after the timeout the slot is free again: "a" is back in its place and comes again
        again = ws.delivery(timeout=5)
        assert again["body"] == "a"
        assert again["redelivered"] is True
        assert again["delivery_count"] == 2
        assert_error(ws.ack(first["delivery_tag"]), "unknown_delivery_tag")
        assert ws.ack(again["delivery_tag"])["type"] == "ACKED"
        assert ws.delivery()["body"] == "b"


@pytest.mark.parametrize("how", ["close", "drop"])
def test_a_closed_connections_delivery_goes_to_another_subscriber_at_once(
    url: str, adm: httpx.Client, q: str, how: str
) -> None:
    publish(adm, q, "held")
    with WsClient.admin(url) as b:
        a = WsClient.admin(url)
        a.subscribe(q)
        held = a.delivery()
        b.subscribe(q)
        assert b.quiet(0.2) == []
        started = time.monotonic()
        if how == "close":
            a.close()
        else:  # the TCP connection vanishes without a close frame
            a.ws.socket.shutdown(socket.SHUT_RDWR)
            a.ws.socket.close()
        d = b.delivery(timeout=3)
        elapsed = time.monotonic() - started
        print(f"released to another subscriber after {elapsed * 1000:.0f} ms ({how})")
        assert elapsed < 1.0
        assert d["message_id"] == held["message_id"]
        assert d["redelivered"] is True
        assert d["delivery_count"] == 2
        assert b.ack(d["delivery_tag"])["type"] == "ACKED"


def test_disconnect_releases_everything_the_connection_held(url: str, adm: httpx.Client) -> None:
    a, b = fresh(), fresh()
    declare_queue(adm, a)
    declare_queue(adm, b)
    for i in range(3):
        publish(adm, a, i)
        publish(adm, b, i)
    with WsClient.admin(url) as ws:
        ws.subscribe(a, 3)
        ws.subscribe(b, 3)
        ws.deliveries_n(6)
        assert stats(adm, a)["in_flight"] == 3
    wait_for(
        lambda: stats(adm, a)["ready"] == 3 and stats(adm, b)["ready"] == 3,
        3,
        message="release on disconnect",
    )
    assert {m["delivery_count"] for m in browse(adm, a) + browse(adm, b)} == {1}


def test_poison_message_whose_consumer_keeps_dying_ends_in_the_dlq(
    url: str, adm: httpx.Client
) -> None:
    dlq, q = fresh("dlq"), fresh()
    declare_queue(adm, dlq)
    declare_queue(adm, q, max_delivery_count=3, dead_letter_queue=dlq)
    publish(adm, q, "poison")
    for attempt in (1, 2, 3):
        with WsClient.admin(url) as ws:
            ws.subscribe(q)
            d = ws.delivery()
            assert d["delivery_count"] == attempt
            assert d["redelivered"] is (attempt > 1)
        # the crash (close without settling) releases it through the retry path
    wait_for(lambda: browse(adm, dlq), 3, message="the poison message in the DLQ")
    [dead] = browse(adm, dlq)
    assert dead["body"] == "poison"
    assert dead["headers"]["x-death"][0]["reason"] == "delivery_limit"
    assert dead["headers"]["x-death"][0]["queue"] == q
    assert browse(adm, q) == []


# -- delayed messages -------------------------------------------------------------------


def test_delayed_message_is_neither_early_nor_late(url: str, adm: httpx.Client, q: str) -> None:
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        started = time.monotonic()
        publish(adm, q, "later", delay_ms=500)
        assert stats(adm, q)["delayed"] == 1
        d = ws.delivery(timeout=3)
        elapsed = time.monotonic() - started
        print(f"delay_ms=500 delivered after {elapsed * 1000:.0f} ms")
        assert d["body"] == "later"
        assert elapsed >= 0.49, elapsed  # not early (same machine: same clock)
        assert elapsed <= 0.8, elapsed  # due time + 100 ms, plus slack for CI


def test_a_delayed_publish_wakes_no_claim_before_it_is_due(
    srv: LiveServer, url: str, adm: httpx.Client, q: str
) -> None:
    # Issue 19: a claim task woken by a delayed publish finds nothing due. The publish puts
    # the queue on the dispatcher's timer instead; its one claim is the one at the due time.
    with WsClient.admin(url) as ws:
        ws.subscribe(q)
        before = claims(srv)
        started = time.monotonic()
        publish(adm, q, "later", delay_ms=700)
        d = ws.delivery(timeout=5)
        elapsed = time.monotonic() - started
        assert d["body"] == "later"
        assert elapsed >= 0.69, elapsed
        assert claims(srv) - before == 1
        ws.send_json({"type": "ACK", "delivery_tag": d["delivery_tag"]})
    wait_for(lambda: browse(adm, q) == [], 3, message="the message acked")


def test_delayed_messages_of_many_queues_falling_due_together_share_a_claim(
    srv: LiveServer, url: str, adm: httpx.Client
) -> None:
    # Issue 19: the timer claims the queues whose delayed messages fall due together in one
    # statement (with each one's next due time), not one claim and one look-up per queue;
    # every queue still gets its own message, none early, none late. A second message per
    # queue, due 400 ms after the first, is found by that statement's next-due answer.
    tag = uuid.uuid4().hex[:8]
    exchange = f"due-together-{tag}"
    r = adm.put(f"/exchanges/{exchange}", json={"type": "fanout"})
    assert r.status_code in (200, 201), r.text
    queues = [f"due-{tag}-{i}" for i in range(30)]
    for name in queues:
        declare_queue(adm, name)
        bind(adm, exchange, name)
    with WsClient.admin(url) as ws:
        subscribed = claims(srv)
        for name in queues:
            ws.subscribe(name, 5)
        # each subscription's first claim (its queue is empty) runs after SUBSCRIBED: wait
        # for all 30, or a loaded machine counts some of them below
        wait_for(lambda: claims(srv) >= subscribed + len(queues), message="first claims")
        before = claims(srv)
        started = time.monotonic()
        for body, delay in (("first", 800), ("second", 1200)):
            r = adm.post(f"/exchanges/{exchange}/publish", json={"body": body, "delay_ms": delay})
            assert r.status_code == 200, r.text
        got: dict[str, list[tuple[str, float]]] = {name: [] for name in queues}
        for _ in range(2 * len(queues)):
            d = ws.delivery(timeout=5)
            got[d["queue"]].append((d["body"], time.monotonic() - started))
            ws.send_json({"type": "ACK", "delivery_tag": d["delivery_tag"]})
        statements = claims(srv) - before
    for name, seen in got.items():
        assert [body for body, _ in seen] == ["first", "second"], (name, seen)
        (_, first), (_, second) = seen
        assert 0.79 <= first <= 1.3, (name, seen)  # not early; due + 100 ms, CI slack
        assert 1.19 <= second <= 1.7, (name, seen)
    print(f"{2 * len(queues)} delayed deliveries in {statements:.0f} claim statements")
    # one a queue each time would be 60 (and as many next-due look-ups); a loaded machine
    # may split a turn (the timer's, or a poll's that finds them due first): room for that
    assert statements <= 20, statements


def test_the_queues_a_poll_finds_due_are_claimed_together(
    srv: LiveServer, url: str, adm: httpx.Client
) -> None:
    # Copies written by hand (no NOTIFY, no wake-up) into 30 subscribed queues: the poll
    # finds them all due in one statement and claims them as the timer's due queues are
    # claimed, together, not one claim per queue (30).
    tag = uuid.uuid4().hex[:8]
    queues = [f"polled-{tag}-{i}" for i in range(30)]
    for name in queues:
        declare_queue(adm, name)
    with WsClient.admin(url) as ws:
        subscribed = claims(srv)
        for name in queues:
            ws.subscribe(name, 5)
        wait_for(lambda: claims(srv) >= subscribed + len(queues), message="first claims")
        before = claims(srv)
        database = srv.settings.database_url
        assert database is not None
        admin_sql(
            database,
            "INSERT INTO messages (queue_id, message_id, exchange, routing_key, body) "
            "SELECT id, 'unannounced', '', name, convert_to('\"x\"', 'UTF8') "
            f"FROM queues WHERE name LIKE 'polled-{tag}-%'",
        )
        got = {ws.delivery(timeout=5)["queue"] for _ in queues}
        statements = claims(srv) - before
    assert got == set(queues)
    print(f"{len(queues)} unannounced copies in {statements:.0f} claim statements")
    assert statements <= 5, statements


def test_single_active_and_group_queues_falling_due_with_plain_ones_are_served(
    url: str, adm: httpx.Client
) -> None:
    # The timer claims plain queues together; a single-active queue goes through its gate
    # and a group queue through the group claim, woken as a publish wakes them, in the
    # same turn. Each gets its delayed copy, on time.
    tag = uuid.uuid4().hex[:8]
    exchange = f"due-mixed-{tag}"
    r = adm.put(f"/exchanges/{exchange}", json={"type": "fanout"})
    assert r.status_code in (200, 201), r.text
    kinds: dict[str, dict[str, bool]] = {f"plain-{tag}-{i}": {} for i in range(3)} | {
        f"sac-{tag}": {"x-single-active-consumer": True},
        f"groups-{tag}": {"x-message-groups": True},
    }
    for name, arguments in kinds.items():
        declare_queue(adm, name, arguments=arguments)
        bind(adm, exchange, name)
    with WsClient.admin(url) as ws:
        for name in kinds:
            ws.subscribe(name, 2)
        started = time.monotonic()
        r = adm.post(
            f"/exchanges/{exchange}/publish",
            json={"body": "due", "delay_ms": 700, "properties": {"group_id": "g"}},
        )
        assert r.status_code == 200, r.text
        seen = {}
        for _ in kinds:
            d = ws.delivery(timeout=5)
            seen[d["queue"]] = time.monotonic() - started
            ws.send_json({"type": "ACK", "delivery_tag": d["delivery_tag"]})
    assert set(seen) == set(kinds)
    for name, elapsed in seen.items():
        assert 0.69 <= elapsed <= 1.2, (name, elapsed)


def test_ready_messages_pass_a_delayed_one(url: str, adm: httpx.Client, q: str) -> None:
    publish(adm, q, "delayed", delay_ms=60_000)
    publish(adm, q, "now")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 5)
        now = ws.delivery()
        assert now["body"] == "now"
        assert ws.quiet(0.4) == []
        assert ws.ack(now["delivery_tag"])["type"] == "ACKED"
    s = stats(adm, q)
    assert (s["delayed"], s["ready"], s["in_flight"]) == (1, 0, 0)


# -- queue deletion, stats, deleting in-flight messages ---------------------------------


def test_queue_deletion_cancels_subscriptions(url: str, adm: httpx.Client, q: str) -> None:
    publish(adm, q, "in flight")
    with WsClient.admin(url) as ws, WsClient.admin(url) as other:
        ws.subscribe(q)
        other.subscribe(q)
        held = ws.delivery()
        assert adm.delete(f"/queues/{q}").status_code == 204
        for c in (ws, other):
            assert c.expect("SUBSCRIPTION_CANCELLED", 3) == {
                "type": "SUBSCRIPTION_CANCELLED",
                "queue": q,
                "reason": "queue_deleted",
            }
        late = assert_error(ws.ack(held["delivery_tag"]), "unknown_delivery_tag")
        assert late["delivery_tag"] == held["delivery_tag"]
        assert_error(ws.nack(held["delivery_tag"]), "unknown_delivery_tag")
        assert_error(ws.request({"type": "UNSUBSCRIBE", "queue": q}), "not_subscribed")
        # a queue of the same name later is a new queue: subscribing again works
        declare_queue(adm, q)
        ws.subscribe(q)
        publish(adm, q, "new")
        assert ws.delivery()["body"] == "new"


def test_stats_consumers_counts_live_subscribers(url: str, adm: httpx.Client, q: str) -> None:
    assert stats(adm, q)["consumers"] == 0
    a = WsClient.admin(url)
    b = WsClient.admin(url)
    try:
        a.subscribe(q)
        b.subscribe(q, 5)
        assert stats(adm, q)["consumers"] == 2
        r = adm.get("/queues", params={"limit": 1000})
        [listed] = [item for item in r.json()["items"] if item["name"] == q]
        assert listed["stats"]["consumers"] == 2
        a.close()
        wait_for(lambda: stats(adm, q)["consumers"] == 1, 3, message="consumers to drop to 1")
        assert b.request({"type": "UNSUBSCRIBE", "queue": q})["type"] == "UNSUBSCRIBED"
        wait_for(lambda: stats(adm, q)["consumers"] == 0, 3, message="consumers to drop to 0")
    finally:
        a.close()
        b.close()


def test_deleting_an_in_flight_message_frees_the_prefetch_slot(
    url: str, adm: httpx.Client, q: str
) -> None:
    publish(adm, q, "first")
    publish(adm, q, "second")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        held = ws.delivery()
        assert held["body"] == "first"
        assert ws.quiet(0.2) == []
        [in_flight] = browse(adm, q, "in_flight")
        assert in_flight["message_id"] == held["message_id"]
        assert adm.delete(f"/queues/{q}/messages/{in_flight['id']}").status_code == 204
        started = time.monotonic()
        nxt = ws.delivery(timeout=3)
        print(f"slot freed after {(time.monotonic() - started) * 1000:.0f} ms")
        assert nxt["body"] == "second"
        assert_error(ws.ack(held["delivery_tag"]), "unknown_delivery_tag")
        assert ws.ack(nxt["delivery_tag"])["type"] == "ACKED"


# -- users, sessions and permissions change under a live socket -------------------------


def test_deleting_a_user_closes_their_sockets_with_4401(
    srv: LiveServer, adm: httpx.Client, q: str
) -> None:
    name = fresh("u")
    make_user(adm, name, PASSWORD)
    by_header = WsClient.as_user(srv.ws_url, name, PASSWORD)
    by_frame = WsClient.open(srv.ws_url)
    by_frame.send_json({"type": "AUTH", "username": name, "password": PASSWORD})
    assert by_frame.recv_json()["type"] == "CONNECTED"
    by_header.subscribe(q)
    with WsClient.admin(srv.ws_url) as bystander:
        started = time.monotonic()
        assert adm.delete(f"/users/{name}").status_code == 204
        for ws in (by_header, by_frame):
            code, _ = ws.expect_close(6)
            assert code == 4401
        print(f"closed {time.monotonic() - started:.2f} s after DELETE /users")
        assert time.monotonic() - started <= 5.5
        assert bystander.request({"type": "PING"})["type"] == "PONG"
    wait_for(lambda: stats(adm, q)["consumers"] == 0, 3, message="the subscription to go")


def test_logout_closes_the_sockets_of_that_token_with_4401(
    srv: LiveServer, adm: httpx.Client
) -> None:
    name = fresh("u")
    make_user(adm, name, PASSWORD)
    token = login(srv.base_url, name, PASSWORD)
    other_token = login(srv.base_url, name, PASSWORD)
    by_header = WsClient.with_token(srv.ws_url, token)
    by_frame = WsClient.open(srv.ws_url)
    by_frame.send_json({"type": "AUTH", "token": token})
    assert by_frame.recv_json()["type"] == "CONNECTED"
    with (
        WsClient.with_token(srv.ws_url, other_token) as same_user,
        WsClient.as_user(srv.ws_url, name, PASSWORD) as by_password,
    ):
        started = time.monotonic()
        r = httpx.post(
            f"{srv.base_url}/api/v1/auth/logout", headers={"Authorization": f"Bearer {token}"}
        )
        assert r.status_code == 204
        for ws in (by_header, by_frame):
            code, _ = ws.expect_close(6)
            assert code == 4401
        assert time.monotonic() - started <= 5.5
        # other sessions of the same user, and Basic sockets, are not affected
        assert same_user.request({"type": "PING"})["type"] == "PONG"
        assert by_password.request({"type": "PING"})["type"] == "PONG"


def test_withdrawing_read_permission_cancels_the_subscription(
    srv: LiveServer, adm: httpx.Client
) -> None:
    keep, lose = fresh("keep"), fresh("lose")
    declare_queue(adm, keep)
    declare_queue(adm, lose)
    name = fresh("u")
    make_user(adm, name, PASSWORD, read=".*")
    publish(adm, lose, "held")
    with WsClient.as_user(srv.ws_url, name, PASSWORD) as ws:
        ws.subscribe(keep)
        ws.subscribe(lose, 5)
        held = ws.delivery()
        started = time.monotonic()
        r = adm.put(
            f"/users/{name}",
            json={"role": "user", "permissions": {"configure": "", "write": "", "read": "keep.*"}},
        )
        assert r.status_code == 200, r.text
        cancelled = ws.expect("SUBSCRIPTION_CANCELLED", 6)
        assert time.monotonic() - started <= 5.5
        assert cancelled == {"type": "SUBSCRIPTION_CANCELLED", "queue": lose, "reason": "forbidden"}
        # no more deliveries from it; the unsettled one stays owned and can be acked
        publish(adm, lose, "not for you")
        publish(adm, keep, "still yours")
        assert ws.delivery()["body"] == "still yours"
        assert ws.quiet(0.4) == []
        assert ws.ack(held["delivery_tag"])["type"] == "ACKED"
        assert_error(ws.request({"type": "SUBSCRIBE", "queue": lose}), "forbidden")
        assert stats(adm, lose)["consumers"] == 0
        assert stats(adm, keep)["consumers"] == 1


def test_a_change_no_event_announced_is_applied_by_the_periodic_check(
    srv: LiveServer, adm: httpx.Client, q: str
) -> None:
    """A permission withdrawn by SQL (an operator's, or one whose cluster event was lost)
    reaches live sockets through the 2 s re-check: those the last round saw, and one that
    connected after that round, by the Basic cache's copy of the old permissions, which the
    round walks even though the user's row did not change again since."""
    name = fresh("u")
    make_user(adm, name, PASSWORD, read=".*")
    url = srv.settings.database_url
    assert url is not None
    with WsClient.as_user(srv.ws_url, name, PASSWORD) as early:
        early.subscribe(q)
        started = time.monotonic()
        sql(url, "UPDATE broker_users SET perm_read = '^nothing$' WHERE username = $1", name)
        cancelled = early.expect("SUBSCRIPTION_CANCELLED", 6)
        assert cancelled["reason"] == "forbidden"
        assert time.monotonic() - started <= 5.5
        # within the Basic cache's 5 s: admitted with the old permissions
        with WsClient.as_user(srv.ws_url, name, PASSWORD) as late:
            late.subscribe(q)
            joined = time.monotonic()
            cancelled = late.expect("SUBSCRIPTION_CANCELLED", 6)
            assert cancelled == {
                "type": "SUBSCRIPTION_CANCELLED",
                "queue": q,
                "reason": "forbidden",
            }
            assert time.monotonic() - joined <= 5.5
    wait_for(lambda: stats(adm, q)["consumers"] == 0, 3, message="the subscriptions to go")


def test_headers_orjson_cannot_write_do_not_strand_deliveries(
    url: str, adm: httpx.Client, q: str
) -> None:
    """Headers may hold integers beyond 64 bits (publish accepts them); delivering such a
    message must work and must not take the other messages of the same claim down with it."""
    big = 2**70
    publish(adm, q, "big", headers={"n": big})
    publish(adm, q, "plain")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 5)
        got = ws.deliveries_n(2, timeout=3)
        assert [d["body"] for d in got] == ["big", "plain"]
        assert got[0]["headers"] == {"n": big}
        for d in got:
            assert ws.ack(d["delivery_tag"])["type"] == "ACKED"


HEADERS = {
    "big": 2**70,
    "neg": -(2**65),
    "half": 1.5,
    "tiny": 1e-7,
    "text": 'ü "quoted"\n\ttab \\ /',
    "nested": {"list": [1, None, True, False, "x"], "empty": {}},
}


@pytest.mark.parametrize("path", ["claimed", "handed off"])
def test_headers_and_properties_arrive_as_published(
    srv: LiveServer, url: str, adm: httpx.Client, q: str, path: str
) -> None:
    """Claimed deliveries carry headers and properties as PostgreSQL prints the stored jsonb,
    spliced into the frame; handed-off ones as the publisher stored them. Either way a
    consumer reads the values that were published."""
    properties = {"content_type": "application/json", "reply_to": "r\u00fc", "message_id": "m-1"}
    with WsClient.admin(url) as ws:
        if path == "handed off":
            ws.subscribe(q, 5)
        before = handed_off(srv)
        publish(adm, q, "h", headers=HEADERS, properties=properties)
        if path == "claimed":
            ws.subscribe(q, 5)
        got = ws.delivery()
        assert handed_off(srv) - before == (1 if path == "handed off" else 0)
        assert got["headers"] == HEADERS
        assert got["properties"] == properties
        assert got["message_id"] == "m-1"
        assert ws.ack(got["delivery_tag"])["type"] == "ACKED"


# -- edges of ownership -----------------------------------------------------------------


def test_resubscribing_does_not_exceed_prefetch(url: str, adm: httpx.Client, q: str) -> None:
    """With prefetch N a (connection, queue) pair holds at most N unsettled deliveries —
    also when the connection unsubscribes and subscribes again while it still holds some."""
    publish(adm, q, "a")
    publish(adm, q, "b")
    with WsClient.admin(url) as ws:
        ws.subscribe(q, 1)
        held = ws.delivery()
        assert ws.request({"type": "UNSUBSCRIBE", "queue": q})["type"] == "UNSUBSCRIBED"
        ws.subscribe(q, 1)
        assert ws.quiet(0.5) == [], "a second unsettled delivery on a prefetch-1 pair"
        assert ws.ack(held["delivery_tag"])["type"] == "ACKED"
        assert ws.delivery()["body"] == "b"


def test_acks_sent_just_before_closing_are_honoured(url: str, adm: httpx.Client, q: str) -> None:
    """ACK frames the server read before the close frame settle; they never turn into a
    release (and a redelivery) because the socket closed right after them."""
    n = 50
    for _ in range(6):
        publish_many(adm, q, list(range(n)))
        ws = WsClient.admin(url)
        ws.subscribe(q, n)
        tags = [d["delivery_tag"] for d in ws.deliveries_n(n)]
        ws.burst_and_close([{"type": "ACK", "delivery_tag": t} for t in tags])
        wait_for(lambda: stats(adm, q)["in_flight"] == 0, 5, message="acks or releases to land")
        ws.close()
        assert stats(adm, q)["ready"] == 0, "ACKs read before the close were dropped"
