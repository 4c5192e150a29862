"""Pull consumption over HTTP (contract §9, §12) through a real server.

The module's server sweeps ack timeouts every 100 ms. Each test has its own queues.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    client,
    wait_for,
)
from tests.wsclient import (
    WsClient,
    bind,
    browse,
    declare_queue,
    make_user,
    publish,
    stats,
    waiting_on,
)

_names = itertools.count()
PASSWORD = "pw-of-the-user"
DELIVERY_FIELDS = {
    "queue",
    "exchange",
    "routing_key",
    "headers",
    "properties",
    "message_id",
    "delivery_tag",
    "delivery_count",
    "redelivered",
    "created_at",
}


#: settings of this module's shared server (the ``srv`` fixture in tests/conftest.py)
SERVER_SETTINGS = {"ack_timeout_check_interval_ms": 100}


def fresh(prefix: str = "q") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


@pytest.fixture
def q(adm: httpx.Client, request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^A-Za-z0-9_.:-]", "_", request.node.name)[:200] + f".{next(_names)}"
    declare_queue(adm, name)
    return name


def get(c: httpx.Client, queue: str, **body: Any) -> list[dict[str, Any]]:
    r = c.post(f"/queues/{queue}/get", json=body)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"messages"}
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def assert_problem(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["code"] == code, body
    assert {"type", "title", "status", "detail", "code"} <= body.keys()


def _queue_id_by_name(srv: LiveServer, queue: str) -> int:
    import asyncio

    import asyncpg

    from app.storage.dsn import asyncpg_dsn

    async def run() -> int:
        conn = await asyncpg.connect(asyncpg_dsn(srv.database_url))
        try:
            value = await conn.fetchval("SELECT id FROM queues WHERE name = $1", queue)
            return int(value)
        finally:
            await conn.close()

    return asyncio.run(run())


# -- get ------------------------------------------------------------------------------------


def test_get_returns_deliveries_shaped_like_message_delivered(adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q)
    bind(adm, "amq.direct", q, "k")
    r = adm.post(
        "/exchanges/amq.direct/publish",
        json={
            "routing_key": "k",
            "body": {"a": 1},
            "headers": {"h": True},
            "properties": {"message_id": "mid-1", "reply_to": "r"},
        },
    )
    assert r.status_code == 200
    publish(adm, q, body_base64="AAE=")
    publish(adm, q, None)
    messages = get(adm, q, max_messages=10)
    assert len(messages) == 3
    first, binary, null = messages
    assert set(first) == DELIVERY_FIELDS | {"body"}
    assert first["queue"] == q
    assert first["exchange"] == "amq.direct"
    assert first["routing_key"] == "k"
    assert first["body"] == {"a": 1}
    assert first["headers"] == {"h": True}
    assert first["properties"]["reply_to"] == "r"
    assert first["message_id"] == "mid-1"
    assert first["delivery_count"] == 1
    assert first["redelivered"] is False
    assert "type" not in first
    assert set(binary) == DELIVERY_FIELDS | {"body_base64"}
    assert binary["body_base64"] == "AAE="
    assert set(null) == DELIVERY_FIELDS | {"body"}
    assert null["body"] is None
    assert len({m["delivery_tag"] for m in messages}) == 3
    assert stats(adm, q)["in_flight"] == 3


def test_get_with_headers_orjson_cannot_write(adm: httpx.Client, q: str) -> None:
    big = 2**70
    publish(adm, q, "big", headers={"n": big})
    publish(adm, q, "plain")
    r = adm.post(f"/queues/{q}/get", json={"max_messages": 10})
    assert r.status_code == 200, r.text
    messages = r.json()["messages"]
    assert [m["body"] for m in messages] == ["big", "plain"]
    assert messages[0]["headers"] == {"n": big}


def test_get_defaults_and_max_messages(adm: httpx.Client, q: str) -> None:
    for i in range(5):
        publish(adm, q, i)
    r = adm.post(f"/queues/{q}/get")  # no body: one message
    assert r.status_code == 200, r.text
    assert [m["body"] for m in r.json()["messages"]] == [0]
    assert [m["body"] for m in get(adm, q, max_messages=3)] == [1, 2, 3]
    assert [m["body"] for m in get(adm, q, max_messages=100)] == [4]
    assert get(adm, q, max_messages=100) == []


@pytest.mark.parametrize(
    "body",
    [
        {"max_messages": 0},
        {"max_messages": 101},
        {"max_messages": "1"},
        {"wait_ms": -1},
        {"wait_ms": 20001},
        {"wait_ms": 1.5},
        {"ack_timeout_seconds": 0},
        {"ack_timeout_seconds": "5"},
        {"unknown": 1},
    ],
)
def test_get_validation(adm: httpx.Client, q: str, body: dict[str, Any]) -> None:
    publish(adm, q, 1)
    assert_problem(adm.post(f"/queues/{q}/get", json=body), 422, "validation_error")
    assert stats(adm, q)["ready"] == 1


def test_get_errors(srv: LiveServer, adm: httpx.Client, q: str) -> None:
    assert_problem(adm.post(f"/queues/{fresh('missing')}/get", json={}), 404, "not_found")
    r = httpx.post(f"{srv.base_url}/api/v1/queues/{q}/get", json={})
    assert_problem(r, 401, "unauthorized")
    name = fresh("u")
    make_user(adm, name, PASSWORD, read="nothing-here", write=".*", configure=".*")
    publish(adm, q, 1)
    with client(srv.base_url, auth=(name, PASSWORD)) as user:
        assert_problem(user.post(f"/queues/{q}/get", json={}), 403, "forbidden")
    assert stats(adm, q)["ready"] == 1


def test_empty_queue_returns_no_messages_at_once(adm: httpx.Client, q: str) -> None:
    started = time.monotonic()
    r = adm.post(f"/queues/{q}/get", json={"max_messages": 10})
    assert r.status_code == 200
    assert r.json() == {"messages": []}
    assert time.monotonic() - started < 1.0


def test_long_poll_ends_empty_after_wait_ms(adm: httpx.Client, q: str) -> None:
    started = time.monotonic()
    assert get(adm, q, wait_ms=400) == []
    elapsed = time.monotonic() - started
    assert 0.39 <= elapsed < 3.0, elapsed  # upper bound: slack for a loaded machine


def test_long_poll_returns_at_once_when_messages_exist(adm: httpx.Client, q: str) -> None:
    publish(adm, q, "a")
    publish(adm, q, "b")
    started = time.monotonic()
    assert [m["body"] for m in get(adm, q, max_messages=10, wait_ms=5000)] == ["a", "b"]
    # "at once": well inside the 5 s it would otherwise wait (slack for a loaded machine)
    assert time.monotonic() - started < 2.5


def test_long_poll_is_woken_by_a_publish(srv: LiveServer, adm: httpx.Client, q: str) -> None:
    qid = _queue_id_by_name(srv, q)
    result: dict[str, Any] = {}

    def poll() -> None:
        with client(srv.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as c:
            started = time.monotonic()
            result["messages"] = get(c, q, max_messages=5, wait_ms=5000)
            result["done"] = time.monotonic()
            result["elapsed"] = result["done"] - started

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    wait_for(lambda: waiting_on(srv, qid) == 1, 3, message="the long poll to wait")
    assert "done" not in result
    published = time.monotonic()
    publish(adm, q, "wake up")
    thread.join(6)
    assert [m["body"] for m in result["messages"]] == ["wake up"]
    latency = result["done"] - published
    print(f"long poll woken {latency * 1000:.0f} ms after the publish call")
    # woken by the publish, not by the end of its 5 s wait (slack for a loaded machine)
    assert latency < 2.5
    assert result["elapsed"] < 3
    assert waiting_on(srv, qid) == 0


def test_long_poll_returns_a_delayed_message_when_due(adm: httpx.Client, q: str) -> None:
    started = time.monotonic()
    publish(adm, q, "soon", delay_ms=500)
    messages = get(adm, q, wait_ms=3000)
    elapsed = time.monotonic() - started
    assert [m["body"] for m in messages] == ["soon"]
    assert 0.49 <= elapsed <= 2.5, elapsed  # when due, not at the end of the 3 s wait


def test_pull_consumers_are_not_counted(srv: LiveServer, adm: httpx.Client, q: str) -> None:
    publish(adm, q, 1)
    get(adm, q)
    assert stats(adm, q)["consumers"] == 0
    qid = _queue_id_by_name(srv, q)
    thread = threading.Thread(target=lambda: get(adm, q, wait_ms=1500), daemon=True)
    thread.start()
    wait_for(lambda: waiting_on(srv, qid) == 1, 3, message="the long poll to wait")
    assert stats(adm, q)["consumers"] == 0
    thread.join(5)


# -- ack / nack -----------------------------------------------------------------------------


def test_ack_deletes_and_a_second_ack_is_404(adm: httpx.Client, q: str) -> None:
    publish(adm, q, 1)
    [m] = get(adm, q)
    r = adm.post(f"/deliveries/{m['delivery_tag']}/ack")
    assert r.status_code == 204
    assert r.content == b""
    assert browse(adm, q) == []
    assert_problem(adm.post(f"/deliveries/{m['delivery_tag']}/ack"), 404, "not_found")
    assert_problem(adm.post(f"/deliveries/{m['delivery_tag']}/nack"), 404, "not_found")


@pytest.mark.parametrize("tag", ["garbage", "1." + "0" * 32, "99999999999999999999.x", "%20"])
def test_unknown_tags_are_404(adm: httpx.Client, tag: str) -> None:
    assert_problem(adm.post(f"/deliveries/{tag}/ack"), 404, "not_found")
    assert_problem(adm.post(f"/deliveries/{tag}/nack", json={}), 404, "not_found")


def test_another_users_tag_is_404(srv: LiveServer, adm: httpx.Client, q: str) -> None:
    name = fresh("u")
    make_user(adm, name, PASSWORD, read=".*")
    publish(adm, q, "admin's")
    [m] = get(adm, q)
    with client(srv.base_url, auth=(name, PASSWORD)) as user:
        assert_problem(user.post(f"/deliveries/{m['delivery_tag']}/ack"), 404, "not_found")
        assert_problem(
            user.post(f"/deliveries/{m['delivery_tag']}/nack", json={"requeue": False}),
            404,
            "not_found",
        )
    assert [x["status"] for x in browse(adm, q)] == ["in_flight"]
    assert adm.post(f"/deliveries/{m['delivery_tag']}/ack").status_code == 204


def test_a_websocket_delivery_cannot_be_settled_over_http(
    srv: LiveServer, adm: httpx.Client, q: str
) -> None:
    publish(adm, q, "ws")
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q)
        d = ws.delivery()
        assert_problem(adm.post(f"/deliveries/{d['delivery_tag']}/ack"), 404, "not_found")
        assert_problem(adm.post(f"/deliveries/{d['delivery_tag']}/nack"), 404, "not_found")
        r = adm.post("/deliveries/ack", json={"delivery_tags": [d["delivery_tag"]]})
        assert r.json() == {"acked": [], "unknown": [d["delivery_tag"]]}
        assert [x["status"] for x in browse(adm, q)] == ["in_flight"]
        assert ws.ack(d["delivery_tag"])["type"] == "ACKED"


def test_a_pull_delivery_cannot_be_settled_over_websocket(
    srv: LiveServer, adm: httpx.Client, q: str
) -> None:
    publish(adm, q, "pulled")
    [m] = get(adm, q)
    with WsClient.admin(srv.ws_url) as ws:
        reply = ws.ack(m["delivery_tag"])
        assert (reply["type"], reply["code"]) == ("ERROR", "unknown_delivery_tag")
        ws.subscribe(q)
        assert ws.quiet(0.3) == []  # in flight to the puller: not delivered to the socket
    # closing that socket released nothing: pull deliveries wait for their ack timeout
    assert [x["status"] for x in browse(adm, q)] == ["in_flight"]
    assert adm.post(f"/deliveries/{m['delivery_tag']}/ack").status_code == 204


# -- POST /deliveries/ack: several at once (a MessageX addition, docs/decisions.md) ------


def test_ack_of_several_deletes_each_and_names_the_unknown(
    srv: LiveServer, adm: httpx.Client, q: str
) -> None:
    for i in range(4):
        publish(adm, q, i)
    mine = [m["delivery_tag"] for m in get(adm, q, max_messages=3)]
    name = fresh("u")
    make_user(adm, name, PASSWORD, read=".*")
    with client(srv.base_url, auth=(name, PASSWORD)) as user:
        [theirs] = [m["delivery_tag"] for m in get(user, q)]
        # another user's tag, a tag given twice, a garbage tag
        tags = [mine[0], theirs, mine[1], mine[0], "garbage", mine[2]]
        r = adm.post("/deliveries/ack", json={"delivery_tags": tags})
        assert r.status_code == 200, r.text
        assert r.json() == {"acked": mine, "unknown": [theirs, mine[0], "garbage"]}
        assert [m["status"] for m in browse(adm, q)] == ["in_flight"]  # only theirs is left
        r = adm.post("/deliveries/ack", json={"delivery_tags": mine})
        assert r.json() == {"acked": [], "unknown": mine}
        r = user.post("/deliveries/ack", json={"delivery_tags": [theirs]})
        assert r.json() == {"acked": [theirs], "unknown": []}
    assert browse(adm, q) == []


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"delivery_tags": []},
        {"delivery_tags": ["t"] * 1001},
        {"delivery_tags": ["ok", ""]},
        {"delivery_tags": ["ok", 5]},
        {"delivery_tags": ["x" * 129]},
        {"delivery_tags": "t"},
        {"delivery_tags": ["t"], "requeue": True},
    ],
    ids=["missing", "empty", "1001", "empty-tag", "number", "long", "string", "extra"],
)
def test_ack_of_several_validation(adm: httpx.Client, q: str, body: dict[str, Any]) -> None:
    publish(adm, q, 1)
    [m] = get(adm, q)
    if body.get("delivery_tags") == ["t"]:
        body = {**body, "delivery_tags": [m["delivery_tag"]]}
    assert_problem(adm.post("/deliveries/ack", json=body), 422, "validation_error")
    assert [x["status"] for x in browse(adm, q)] == ["in_flight"]
    r = adm.post("/deliveries/ack", json={"delivery_tags": [m["delivery_tag"]] * 1000})
    assert r.json()["acked"] == [m["delivery_tag"]]
    assert len(r.json()["unknown"]) == 999


def test_ack_of_several_needs_credentials(srv: LiveServer) -> None:
    r = httpx.post(f"{srv.base_url}/api/v1/deliveries/ack", json={"delivery_tags": ["t"]})
    assert_problem(r, 401, "unauthorized")


def test_nack_without_body_requeues(adm: httpx.Client, q: str) -> None:
    publish(adm, q, "again")
    [m] = get(adm, q)
    r = adm.post(f"/deliveries/{m['delivery_tag']}/nack")
    assert r.status_code == 200, r.text
    assert r.json() == {"outcome": "requeued"}
    [m2] = get(adm, q)
    assert m2["message_id"] == m["message_id"]
    assert m2["delivery_tag"] != m["delivery_tag"]
    assert m2["redelivered"] is True
    assert m2["delivery_count"] == 2
    r = adm.post(f"/deliveries/{m2['delivery_tag']}/nack", json={"requeue": True})
    assert r.json() == {"outcome": "requeued"}
    r = adm.post(f"/deliveries/{get(adm, q)[0]['delivery_tag']}/nack", json={})
    assert r.json() == {"outcome": "requeued"}


def test_nack_outcomes(adm: httpx.Client) -> None:
    dlq, with_dlq, plain = fresh("dlq"), fresh(), fresh()
    declare_queue(adm, dlq)
    declare_queue(adm, with_dlq, dead_letter_queue=dlq, max_delivery_count=1)
    declare_queue(adm, plain, max_delivery_count=1)
    cases = [
        (plain, {"requeue": False}, "discarded"),
        (with_dlq, {"requeue": False}, "dead_lettered"),
        (plain, {"requeue": True}, "dead"),
        (with_dlq, None, "dead_lettered"),
    ]
    for queue, body, outcome in cases:
        publish(adm, queue, outcome)
        [m] = get(adm, queue)
        r = adm.post(f"/deliveries/{m['delivery_tag']}/nack", json=body)
        assert r.status_code == 200, r.text
        assert r.json() == {"outcome": outcome}, (queue, body)
    assert [m["status"] for m in browse(adm, plain)] == ["dead"]
    reasons = [m["headers"]["x-death"][0]["reason"] for m in browse(adm, dlq)]
    assert reasons == ["rejected", "delivery_limit"]


def test_nack_validation(adm: httpx.Client, q: str) -> None:
    publish(adm, q, 1)
    [m] = get(adm, q)
    tag = m["delivery_tag"]
    assert_problem(
        adm.post(f"/deliveries/{tag}/nack", json={"requeue": "no"}), 422, "validation_error"
    )
    assert_problem(adm.post(f"/deliveries/{tag}/nack", json={"x": 1}), 422, "validation_error")
    r = adm.post(
        f"/deliveries/{tag}/nack", content=b"{", headers={"content-type": "application/json"}
    )
    assert_problem(r, 400, "bad_request")
    assert [x["status"] for x in browse(adm, q)] == ["in_flight"]


# -- ack timeout ----------------------------------------------------------------------------


def test_ack_timeout_override_redelivers_after_it(adm: httpx.Client, q: str) -> None:
    """The queue's timeout is the broker default (30 s); the get asks for 1 s."""
    publish(adm, q, "lease")
    started = time.monotonic()
    [m] = get(adm, q, ack_timeout_seconds=1)
    assert get(adm, q) == []
    [again] = get(adm, q, wait_ms=5000)
    elapsed = time.monotonic() - started
    print(f"pulled delivery released after {elapsed:.2f} s (override 1 s)")
    assert 0.9 <= elapsed <= 3.0, elapsed
    assert again["message_id"] == m["message_id"]
    assert again["redelivered"] is True
    assert again["delivery_count"] == 2
    assert_problem(adm.post(f"/deliveries/{m['delivery_tag']}/ack"), 404, "not_found")
    assert adm.post(f"/deliveries/{again['delivery_tag']}/ack").status_code == 204


def test_queue_ack_timeout_applies_to_pull(adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, ack_timeout_seconds=1)
    publish(adm, q, "lease")
    started = time.monotonic()
    [m] = get(adm, q)
    [again] = get(adm, q, wait_ms=5000)
    assert 0.9 <= time.monotonic() - started <= 3.0
    assert again["message_id"] == m["message_id"]
    assert again["delivery_count"] == 2


def test_a_longer_override_outlasts_the_queue_timeout(adm: httpx.Client) -> None:
    q = fresh()
    declare_queue(adm, q, ack_timeout_seconds=1)
    publish(adm, q, "lease")
    [m] = get(adm, q, ack_timeout_seconds=30)
    assert get(adm, q, wait_ms=2000) == []
    assert adm.post(f"/deliveries/{m['delivery_tag']}/ack").status_code == 204


def test_delivery_limit_applies_to_timeouts(adm: httpx.Client) -> None:
    dlq, q = fresh("dlq"), fresh()
    declare_queue(adm, dlq)
    declare_queue(adm, q, ack_timeout_seconds=1, max_delivery_count=1, dead_letter_queue=dlq)
    publish(adm, q, "never acked")
    [m] = get(adm, q)
    [dead] = get(adm, dlq, wait_ms=5000)
    assert dead["message_id"] == m["message_id"]
    assert dead["delivery_count"] == 1
    assert dead["headers"]["x-death"][0]["reason"] == "delivery_limit"
    assert browse(adm, q) == []


def test_pull_and_websocket_share_a_queue_without_duplicates(
    srv: LiveServer, adm: httpx.Client, q: str
) -> None:
    n = 60
    r = adm.post("/bindings", json={"exchange": "amq.fanout", "queue": q})
    assert r.status_code in (200, 201)
    r = adm.post(
        "/exchanges/amq.fanout/publish-batch",
        json={"messages": [{"body": i} for i in range(n)]},
    )
    assert r.status_code == 200
    seen: list[Any] = []
    with WsClient.admin(srv.ws_url) as ws:
        ws.subscribe(q, 5)
        while len(seen) < n:
            for m in get(adm, q, max_messages=7):
                seen.append(m["body"])
                assert adm.post(f"/deliveries/{m['delivery_tag']}/ack").status_code == 204
            frames = [*ws.deliveries, *ws.quiet(0.05)]
            ws.deliveries.clear()
            for d in frames:
                assert d["type"] == "MESSAGE_DELIVERED", d
                seen.append(d["body"])
                ws.send_json({"type": "ACK", "delivery_tag": d["delivery_tag"]})
    assert sorted(seen) == list(range(n))
