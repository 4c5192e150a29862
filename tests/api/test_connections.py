"""Operator view of connections (contract §20) on two broker processes: GET /connections lists
every process's WebSocket connections by connection_id with their subscriptions; DELETE
/connections/{id} closes one (1008 "closed by an administrator") whichever process holds it,
and its deliveries return to the queue.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed

from tests.api.test_multiprocess import (  # one pair of processes per module
    Pair,
    _sql,
    database,  # noqa: F401 - fixture
    fresh,
    pair,  # noqa: F401 - fixture
)
from tests.support import wait_for
from tests.wsclient import WsClient, declare_queue, make_user, publish, stats


def listing(rest: httpx.Client, **params: Any) -> dict[str, Any]:
    r = rest.get("/connections", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def connection_id(ws: WsClient) -> str:
    assert ws.connected is not None
    found: str = ws.connected["connection_id"]
    return found


def closed_with(ws: WsClient, timeout: float = 5.0) -> tuple[int, str]:
    """Read until the server closes the socket; its close code and reason."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ws.recv_json(deadline - time.monotonic())
        except TimeoutError:
            continue
        except ConnectionClosed as exc:
            received = exc.rcvd
            break
    else:
        raise AssertionError(f"not closed within {timeout} s")
    assert received is not None
    return received.code, received.reason


def test_list_and_close_across_processes(pair: Pair) -> None:  # noqa: F811
    q = fresh("conn")
    declare_queue(pair.rest_a, q)
    for i in range(3):
        publish(pair.rest_a, q, i)
    user = fresh("cu")
    make_user(pair.rest_a, user, read=".*")
    with (
        WsClient.admin(pair.a.ws_url) as on_a,
        WsClient.as_user(pair.b.ws_url, user, "user-password-1") as on_b,
    ):
        on_a.subscribe(q, 2)
        on_a.deliveries_n(2)
        id_a = connection_id(on_a)
        id_b = connection_id(on_b)
        # listed by either process, in connection_id order
        for rest in (pair.rest_a, pair.rest_b):
            items = {c["connection_id"]: c for c in listing(rest)["items"]}
            assert list(items) == sorted(items)
            assert items[id_a]["process"] == pair.a.services.delivery.process_id
            assert items[id_b]["process"] == pair.b.services.delivery.process_id
            assert items[id_b]["username"] == user
            assert items[id_b]["client_address"].startswith("127.0.0.1:")
            assert items[id_b]["subscriptions"] == []
            assert items[id_a]["subscriptions"] == [
                {"queue": q, "prefetch": 2, "unacked": 2, "active": True}
            ]
        page = listing(pair.rest_b, limit=1)
        assert len(page["items"]) == 1
        assert page["next_after"] == page["items"][0]["connection_id"]
        rest_ids = [
            c["connection_id"] for c in listing(pair.rest_b, after=page["next_after"])["items"]
        ]
        assert page["next_after"] not in rest_ids
        # ?contains= (contract §20): by username, case-sensitive
        only = [c["connection_id"] for c in listing(pair.rest_a, contains=user)["items"]]
        assert only == [id_b]
        assert listing(pair.rest_a, contains=user.upper())["items"] == []

        # closed from the other process: 1008 within 5 s, its deliveries back in the queue
        started = time.monotonic()
        assert pair.rest_b.delete(f"/connections/{id_a}").status_code == 204
        assert closed_with(on_a) == (1008, "closed by an administrator")
        print(f"closed {1000 * (time.monotonic() - started):.0f} ms after the DELETE")
        wait_for(lambda: stats(pair.rest_a, q)["ready"] == 3, 5, 0.05, "deliveries released")
        wait_for(
            lambda: id_a not in [c["connection_id"] for c in listing(pair.rest_a)["items"]],
            5,
            0.05,
        )
        # and a connection of this process
        assert pair.rest_b.delete(f"/connections/{id_b}").status_code == 204
        assert closed_with(on_b) == (1008, "closed by an administrator")


def test_unknown_connection_and_permissions(pair: Pair) -> None:  # noqa: F811
    assert (
        pair.rest_a.delete("/connections/00000000-0000-0000-0000-000000000000").status_code == 404
    )
    assert pair.rest_a.delete("/connections/not-an-id").status_code == 404
    assert pair.rest_a.get("/connections", params={"after": "x"}).status_code == 422
    user = fresh("plain")
    make_user(pair.rest_a, user)
    with (
        httpx.Client(base_url=pair.a.base_url + "/api/v1", auth=(user, "user-password-1")) as c,
        WsClient.as_user(pair.a.ws_url, user, "user-password-1") as ws,
    ):
        assert c.get("/connections").status_code == 403
        own = connection_id(ws)
        assert c.delete(f"/connections/{own}").status_code == 403
        assert ws.request({"type": "PING"})["type"] == "PONG"


def test_a_close_whose_event_was_lost_is_done_by_the_heartbeat(pair: Pair) -> None:  # noqa: F811
    """The close request is also recorded in the connection's row: the holding process's
    next heartbeat closes it if the NOTIFY never reached it."""
    with WsClient.admin(pair.a.ws_url) as ws:
        cid = connection_id(ws)
        started = time.monotonic()
        _sql(
            pair.a.database_url,
            "UPDATE websocket_connections SET close_requested_at = now() WHERE connection_id = $1",
            uuid.UUID(cid),
        )
        assert closed_with(ws) == (1008, "closed by an administrator")
        print(f"closed {1000 * (time.monotonic() - started):.0f} ms after the request")
