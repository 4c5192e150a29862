"""Single active consumer (contract §13, ``x-single-active-consumer: true``) through the real
server: one subscription — the oldest — receives deliveries, the others wait; the next oldest
takes over (``SUBSCRIPTION_ACTIVE``) once every delivery of the previous one is settled or
released, so order is kept; a pull ``get`` is 409 meanwhile; ``stats.consumers`` counts
both. Across two broker processes: the takeover after the active connection drops on the
other process, and a sampler that never sees two connections holding deliveries of the queue.
(A killed process: tests/faults/test_single_active_crash.py.)
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx

# the two processes and their database, one pair per module
from tests.api.test_multiprocess import (  # one pair of processes per module
    Pair,
    _sql,
    database,  # noqa: F401 - fixture
    pair,  # noqa: F401 - fixture
)
from tests.support import LiveServer, wait_for
from tests.wsclient import WsClient, bind, declare_queue, publish, stats

SERVER_SETTINGS = {"ack_timeout_check_interval_ms": 100}
SAC = {"x-single-active-consumer": True}
_names = itertools.count()


def fresh(prefix: str = "sac") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


def sac_queue(admin: httpx.Client, **body: Any) -> str:
    name = fresh()
    declare_queue(admin, name, arguments=SAC, **body)
    return name


def bodies(frames: list[dict[str, Any]]) -> list[Any]:
    return [f["body"] for f in frames]


def test_plain_subscriptions_are_all_active(srv: LiveServer, adm: httpx.Client) -> None:
    q = fresh("plain")
    declare_queue(adm, q)
    with WsClient.admin(srv.ws_url) as a, WsClient.admin(srv.ws_url) as b:
        assert a.subscribe(q)["active"] is True
        assert b.subscribe(q)["active"] is True


def test_takeover_after_the_last_delivery_is_released(srv: LiveServer, adm: httpx.Client) -> None:
    q = sac_queue(adm)
    for i in range(6):
        publish(adm, q, i)
    first = WsClient.admin(srv.ws_url)
    with WsClient.admin(srv.ws_url) as second, first:
        assert first.subscribe(q, 3)["active"] is True
        held = first.deliveries_n(3)
        assert second.subscribe(q, 10)["active"] is False
        assert first.ack(held[0]["delivery_tag"])["type"] == "ACKED"
        fourth = first.delivery()
        assert fourth["body"] == 3
        assert first.request({"type": "UNSUBSCRIBE", "queue": q})["type"] == "UNSUBSCRIBED"
        assert first.ack(held[1]["delivery_tag"])["type"] == "ACKED"
        assert first.nack(held[2]["delivery_tag"])["outcome"] == "requeued"
        assert second.quiet(0.5) == []
        started = time.monotonic()
        assert first.nack(fourth["delivery_tag"])["outcome"] == "requeued"
        active = second.expect("SUBSCRIPTION_ACTIVE", 3)
        print(f"SUBSCRIPTION_ACTIVE {1000 * (time.monotonic() - started):.0f} ms after")
        assert active == {"type": "SUBSCRIPTION_ACTIVE", "queue": q}
        got = second.deliveries_n(4)
        assert bodies(got) == [2, 3, 4, 5]
        assert [d["redelivered"] for d in got] == [True, True, False, False]
        # the first subscribes again: now it is the one that waits
        assert first.subscribe(q)["active"] is False
        publish(adm, q, 6)
        assert second.delivery()["body"] == 6
        assert first.quiet(0.3) == []
        assert stats(adm, q)["consumers"] == 2


def test_a_close_releases_and_hands_over_in_order(srv: LiveServer, adm: httpx.Client) -> None:
    q = sac_queue(adm)
    for i in range(5):
        publish(adm, q, i)
    with WsClient.admin(srv.ws_url) as second, WsClient.admin(srv.ws_url) as third:
        first = WsClient.admin(srv.ws_url)
        assert first.subscribe(q, 2)["active"] is True
        assert bodies(first.deliveries_n(2)) == [0, 1]
        assert second.subscribe(q, 10)["active"] is False
        assert third.subscribe(q, 10)["active"] is False
        assert stats(adm, q)["consumers"] == 3
        first.close()
        assert second.expect("SUBSCRIPTION_ACTIVE", 3)["queue"] == q
        assert bodies(second.deliveries_n(5)) == [0, 1, 2, 3, 4]
        assert third.quiet(0.3) == []
        assert stats(adm, q)["consumers"] == 2


def test_an_empty_queue_hands_over_too(srv: LiveServer, adm: httpx.Client) -> None:
    q = sac_queue(adm)
    with WsClient.admin(srv.ws_url) as second:
        with WsClient.admin(srv.ws_url) as first:
            assert first.subscribe(q)["active"] is True
            assert second.subscribe(q)["active"] is False
        assert second.expect("SUBSCRIPTION_ACTIVE", 3)["queue"] == q
        publish(adm, q, "after")
        assert second.delivery()["body"] == "after"


def test_pull_get_is_409_while_a_subscription_is_active(srv: LiveServer, adm: httpx.Client) -> None:
    q = sac_queue(adm)
    publish(adm, q, "x")
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 1)
        d = ws.delivery()
        r = adm.post(f"/queues/{q}/get", json={"max_messages": 1})
        assert r.status_code == 409, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "precondition_failed"
        assert ws.nack(d["delivery_tag"])["outcome"] == "requeued"
    # no subscription: pull works again (the close has committed by the time stats says so)
    wait_for(lambda: stats(adm, q)["consumers"] == 0, 3)
    # the requeued copy may have gone back out to the closing socket: a long poll waits for
    # its release
    r = adm.post(f"/queues/{q}/get", json={"max_messages": 1, "wait_ms": 5000})
    assert r.status_code == 200, r.text
    assert [m["body"] for m in r.json()["messages"]] == ["x"]


def test_a_subscription_taken_over_behind_its_back_stops_and_waits_its_turn(
    srv: LiveServer, adm: httpx.Client
) -> None:
    """The claim's gate, not the process's memory, decides: when the holder recorded in the
    database is another connection (as after this process was taken for dead), the
    subscription claims nothing; it gets SUBSCRIPTION_ACTIVE again once it is promoted (the
    other holder has nothing in flight), and only then the message."""
    q = sac_queue(adm)
    url = srv.settings.database_url
    assert url is not None
    with WsClient.admin(srv.ws_url) as ws:
        assert ws.subscribe(q)["active"] is True
        stranger = str(uuid.uuid4())
        _sql(
            url,
            "UPDATE single_active_holders SET connection_id = $1"
            " WHERE queue_id = (SELECT id FROM queues WHERE name = $2)",
            stranger,
            q,
        )
        publish(adm, q, "after the takeover")
        # the gate refuses the claim; the next check (within a second) promotes it again
        assert ws.expect("SUBSCRIPTION_ACTIVE", 3) == {"type": "SUBSCRIPTION_ACTIVE", "queue": q}
        assert ws.delivery()["body"] == "after the takeover"


# -- two broker processes ----------------------------------------------------------------------


def test_takeover_on_another_process_after_the_connection_drops(pair: Pair) -> None:  # noqa: F811
    q = sac_queue(pair.rest_a)
    for i in range(6):
        publish(pair.rest_a, q, i)
    on_a = WsClient.admin(pair.a.ws_url)
    with WsClient.admin(pair.b.ws_url) as on_b:
        assert on_a.subscribe(q, 3)["active"] is True
        held = on_a.deliveries_n(3)
        assert on_a.ack(held[0]["delivery_tag"])["type"] == "ACKED"
        assert on_a.delivery()["body"] == 3
        assert on_b.subscribe(q, 10)["active"] is False
        assert stats(pair.rest_b, q)["consumers"] == 2
        publish(pair.rest_b, q, 6)  # a publish on B does not wake the waiting one
        assert on_b.quiet(0.5) == []
        started = time.monotonic()
        on_a.close()  # holding 1, 2 and 3
        assert on_b.expect("SUBSCRIPTION_ACTIVE", 3) == {"type": "SUBSCRIPTION_ACTIVE", "queue": q}
        elapsed = time.monotonic() - started
        print(f"takeover on the other process {elapsed * 1000:.0f} ms after the close")
        got = on_b.deliveries_n(6)
        assert bodies(got) == [1, 2, 3, 4, 5, 6]
        assert [d["redelivered"] for d in got] == [True, True, True, False, False, False]
        assert elapsed < 2.0


def test_waiting_on_a_takes_over_from_an_unsubscribe_on_b(pair: Pair) -> None:  # noqa: F811
    q = sac_queue(pair.rest_a)
    with WsClient.admin(pair.b.ws_url) as on_b, WsClient.admin(pair.a.ws_url) as on_a:
        assert on_b.subscribe(q, 5)["active"] is True
        publish(pair.rest_a, q, "one")
        one = on_b.delivery()
        assert on_a.subscribe(q, 5)["active"] is False
        assert on_b.request({"type": "UNSUBSCRIBE", "queue": q})["type"] == "UNSUBSCRIBED"
        publish(pair.rest_a, q, "two")
        assert on_a.quiet(0.4) == []  # "one" is still in flight on B
        assert on_b.ack(one["delivery_tag"])["type"] == "ACKED"
        assert on_a.expect("SUBSCRIPTION_ACTIVE", 3)["queue"] == q
        assert on_a.delivery()["body"] == "two"


def _frames(ws: WsClient) -> Iterator[dict[str, Any]]:
    """The frames that have arrived (recorded deliveries first), without waiting long."""
    while ws.deliveries:
        yield ws.deliveries.popleft()
    while True:
        try:
            yield ws.recv_json(0.005)
        except TimeoutError:
            return


class InFlightSampler(threading.Thread):
    """Reads, as fast as it can, which connections hold in-flight copies of a queue."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.database, self.queue = url, queue
        self.stop = threading.Event()
        self.samples = 0
        self.worst: list[str] = []

    def run(self) -> None:
        import asyncio

        import asyncpg

        from app.storage.dsn import asyncpg_dsn

        async def sample() -> None:
            conn = await asyncpg.connect(asyncpg_dsn(self.database))
            try:
                while not self.stop.is_set():
                    rows = await conn.fetch(
                        "SELECT DISTINCT owner_connection::text AS c FROM messages"
                        " WHERE status = 'in_flight'"
                        " AND queue_id = (SELECT id FROM queues WHERE name = $1)",
                        self.queue,
                    )
                    self.samples += 1
                    if len(rows) > len(self.worst):
                        self.worst = [r["c"] for r in rows]
                    await asyncio.sleep(0.002)
            finally:
                await conn.close()

        asyncio.run(sample())


def test_never_two_active_across_processes(pair: Pair, database: str) -> None:  # noqa: F811
    """Subscribers on both processes come and go while messages flow; a sampler of the
    database never sees in-flight copies of the queue held by two connections, and every
    message is acknowledged, in publish order, by whoever was active."""
    q = sac_queue(pair.rest_a)
    bind(pair.rest_a, "amq.direct", q, q)
    total = 300
    for start in range(0, total, 100):
        r = pair.rest_a.post(
            "/exchanges/amq.direct/publish-batch",
            json={"messages": [{"routing_key": q, "body": i} for i in range(start, start + 100)]},
        )
        assert r.status_code == 200, r.text
    sampler = InFlightSampler(database, q)
    sampler.start()
    acked: list[int] = []
    servers = [pair.a, pair.b]
    clients = [WsClient.admin(servers[i % 2].ws_url) for i in range(4)]
    try:
        for c in clients:
            c.subscribe(q, 5)
        deadline = time.monotonic() + 40
        turn = 0
        while len(acked) < total and time.monotonic() < deadline:
            # whoever is active acks some, then leaves; a fresh subscriber queues up behind
            for i in range(len(clients)):
                for frame in _frames(clients[i]):
                    if frame["type"] != "MESSAGE_DELIVERED":
                        continue
                    clients[i].send_json({"type": "ACK", "delivery_tag": frame["delivery_tag"]})
                    if frame["body"] in acked:
                        continue  # its ACK had not reached the broker when the socket closed
                    acked.append(frame["body"])
                    if len(acked) % 37 == 0:
                        clients[i].close()
                        clients[i] = WsClient.admin(servers[turn % 2].ws_url)
                        clients[i].subscribe(q, 5)
                        turn += 1
                        break
        assert sorted(set(acked)) == list(range(total)), len(set(acked))
        assert acked == sorted(acked)  # acknowledged in publish order
    finally:
        sampler.stop.set()
        sampler.join(5)
        for c in clients:
            c.close()
    print(f"{sampler.samples} samples of the in-flight owners, at most {len(sampler.worst)}")
    assert sampler.samples > 50
    assert len(sampler.worst) <= 1, sampler.worst
    wait_for(lambda: stats(pair.rest_a, q)["in_flight"] + stats(pair.rest_a, q)["ready"] == 0, 5)
