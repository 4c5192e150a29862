"""The WebSocket limits of contract §8 (issue 18, findings 1 and 6): what a client can make
the broker hold, before and after authentication."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.api.ws import connection as ws_connection
from app.api.ws.connection import WsConnection
from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, client, running_server, wait_for
from tests.support import test_settings as settings_for
from tests.wsclient import WsClient, declare_queue, publish

# -- before authentication --------------------------------------------------------------------


def test_the_eleventh_frame_before_auth_closes_1008(server: LiveServer) -> None:
    """At most 10 frames are answered before AUTH (PINGs, bad frames, anything); the 11th
    closes the connection with 1008 and is not answered."""
    with WsClient.open(server.ws_url) as ws:
        for i in range(5):
            ws.send_json({"type": "PING", "id": i})
        for _ in range(5, 10):
            ws.send_raw("not json")
        ws.send_json({"type": "PING", "id": 10})
        code, frames = ws.expect_close(5)
    assert code == 1008
    assert [f["type"] for f in frames] == ["PONG"] * 5 + ["ERROR"] * 5
    # ten frames, then AUTH, is fine: the limit is on frames before authentication
    with WsClient.open(server.ws_url) as ws:
        for i in range(9):
            ws.send_json({"type": "PING", "id": i})
        ws.send_json({"type": "AUTH", "username": "admin", "password": "admin-secret-password"})
        for i in range(9):
            assert ws.expect("PONG")["id"] == i
        ws.expect("CONNECTED")
        for _ in range(20):
            assert ws.request({"type": "PING"})["type"] == "PONG"


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[weakref.ref[WsConnection]]]:
    """Weak references to every WsConnection made meanwhile, with the cyclic collector off:
    what dies, dies by reference counting (the broker's tuned collector seldom runs a full
    collection, so a connection kept by a cycle stays for a long time)."""
    made: list[weakref.ref[WsConnection]] = []
    init = WsConnection.__init__

    def recording(self: WsConnection, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(WsConnection, "__init__", recording)
    gc.collect()
    gc.disable()
    try:
        yield made
    finally:
        gc.enable()


def alive(made: list[weakref.ref[WsConnection]]) -> int:
    return sum(1 for ref in made if ref() is not None)


def test_a_closed_connection_is_freed_without_the_cyclic_collector(
    server: LiveServer, admin: httpx.Client, connections: list[weakref.ref[WsConnection]]
) -> None:
    declare_queue(admin, "freed")
    publish(admin, "freed", "one")
    # one closed by the rule before AUTH, one that authenticated, consumed and closed, one
    # closed by the broker (the AUTH frame's credentials are bad)
    with WsClient.open(server.ws_url) as ws:
        for i in range(11):
            ws.send_json({"type": "PING", "id": i})
        assert ws.expect_close(5)[0] == 1008
    with WsClient.admin(server.ws_url) as ws:
        ws.subscribe("freed", 5)
        delivery = ws.delivery()
        assert ws.request({"type": "ACK", "delivery_tag": delivery["delivery_tag"]})
        assert ws.request({"type": "PUBLISH", "queue": "freed", "body": 2})["type"] == "PUBLISHED"
        ws.delivery()
    with WsClient.open(server.ws_url) as ws:
        ws.send_json({"type": "AUTH", "username": "admin", "password": "wrong-password"})
        assert ws.expect_close(5)[0] == 4401
    assert len(connections) == 3
    wait_for(lambda: alive(connections) == 0, 10, message="closed connections freed")


def test_replies_that_wait_are_copied_to_their_exact_size() -> None:
    """orjson's output of a few dozen bytes pins about 4 KiB: a frame that has to wait (the
    sender is busy on the socket) is copied first; one taken at once is not."""
    import asyncio

    import orjson

    async def scenario() -> tuple[bool, bool]:
        outbox = ws_connection.Outbox()
        first = orjson.dumps({"type": "PONG", "id": 1})
        outbox.push(first)
        taken = await outbox.take()  # the sender took it: now it sends
        second = orjson.dumps({"type": "PONG", "id": 2})
        outbox.push(second)
        (waiting,) = await outbox.take()
        return taken[0] is first, waiting is not second and waiting == second

    assert asyncio.run(scenario()) == (True, True)


# -- after authentication -----------------------------------------------------------------------


@pytest.fixture
def three_subscriptions(database_url: str) -> Iterator[LiveServer]:
    with running_server(settings_for(database_url, max_subscriptions_per_connection=3)) as live:
        yield live


def test_subscriptions_per_connection_are_limited(three_subscriptions: LiveServer) -> None:
    """Contract §8: at most MESSAGEX_MAX_SUBSCRIPTIONS_PER_CONNECTION (3 here); the next
    SUBSCRIBE is ERROR limit_exceeded and changes nothing; an UNSUBSCRIBE frees a place."""
    live = three_subscriptions
    with client(live.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as admin:
        for n in range(5):
            declare_queue(admin, f"s{n}")
        with WsClient.admin(live.ws_url) as ws, WsClient.admin(live.ws_url) as other:
            for n in range(3):
                ws.subscribe(f"s{n}")
            reply = ws.request({"type": "SUBSCRIBE", "queue": "s3"})
            assert reply["type"] == "ERROR", reply
            assert reply["code"] == "limit_exceeded", reply
            other.subscribe("s3")  # the limit is per connection
            publish(admin, "s3", "for other")
            assert other.delivery()["body"] == "for other"
            assert ws.quiet(0.2) == []
            assert ws.request({"type": "UNSUBSCRIBE", "queue": "s0"})["type"] == "UNSUBSCRIBED"
            ws.subscribe("s4")
            stats = admin.get("/queues/s3").json()["stats"]
            assert stats["consumers"] == 1
