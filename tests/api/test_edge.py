"""The hot edge (app/api/edge.py) answers exactly as the FastAPI routes would.

The edge takes ``Content-Type: application/json`` only; the routes also take any ``+json``
type, so the same request sent as ``application/vnd.messagex+json`` is answered by the route.
Each case is sent both ways and the answers (status, content type, auth headers, body) and
the stored rows must be the same.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.api.test_publish import declare, sql
from tests.support import LiveServer, metric

EDGE = "application/json"
ROUTE = "application/vnd.messagex+json"

#: stored columns that must match between the edge's copy and the route's
COLUMNS = "q.name AS queue, m.exchange, m.routing_key, m.headers, m.properties, m.body, m.binary"


def _send(http: httpx.Client, path: str, content: bytes, content_type: str) -> httpx.Response:
    return http.post(path, content=content, headers={"Content-Type": content_type})


def _answer(r: httpx.Response) -> tuple[Any, ...]:
    try:
        body: Any = r.json()
    except ValueError:
        body = r.text
    return (
        r.status_code,
        r.headers.get("content-type"),
        r.headers.get("www-authenticate"),
        r.headers.get("retry-after"),
        body,
    )


def _stored(server: LiveServer, message_id: str) -> list[str]:
    """The copies of one message, its id blanked out of the stored properties."""
    rows = sql(
        server,
        f"SELECT {COLUMNS} FROM messages m JOIN queues q ON q.id = m.queue_id "
        "WHERE m.message_id = $1 ORDER BY q.name",
        message_id,
    )
    return [tuple(row).__repr__().replace(message_id, "mid") for row in rows]


@pytest.fixture
def topology(admin: httpx.Client) -> None:
    declare(
        admin,
        {"ex": "direct", "fan": "fanout"},
        ("q1", "q2"),
        (("ex", "q1", "k", {}), ("fan", "q1", "", {}), ("fan", "q2", "", {})),
    )


def _message(message_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "body": {"n": 1, "text": "é"},
        "routing_key": "k",
        "headers": {"h": 1, "s": "x"},
        "properties": {"message_id": message_id, "content_type": "application/json"},
        **extra,
    }


# (path, body) for each case; {mid} is replaced by a per-send message id
SUCCESSES = [
    ("/queues/q1/messages", '{"body": "plain", "properties": {"message_id": "{mid}"}}'),
    ("/exchanges/ex/publish", None),
    ("/exchanges/fan/publish", None),
    ("/exchanges/ex/publish-batch", "batch"),
    (
        "/queues/q2/messages",
        '{"body_base64": "AAEC", "delay_ms": 5, "properties": {"message_id": "{mid}"}}',
    ),
    (  # orjson would read the long integers as floats: they must stay exact
        "/queues/q1/messages",
        '{"body": {"price": 2.5, "big": 1237940039285380274899124225, '
        '"neg": -9223372036854775809, "e": 1e3}, "headers": {"big": 98765432109876543210}, '
        '"properties": {"message_id": "{mid}"}}',
    ),
]


def _content(body: str | None, mid: str) -> bytes:
    import orjson

    if body is None:
        return orjson.dumps(_message(mid))
    if body == "batch":
        return orjson.dumps({"messages": [_message(mid), _message(mid, routing_key="none")]})
    return body.replace("{mid}", mid).encode()


@pytest.mark.parametrize(("path", "body"), SUCCESSES)
def test_successful_publishes_answer_and_store_alike(
    admin: httpx.Client, server: LiveServer, topology: None, path: str, body: str | None
) -> None:
    answers = []
    stored = []
    for content_type, mid in ((EDGE, "edge-1"), (ROUTE, "route-1")):
        r = _send(admin, path, _content(body, mid), content_type)
        assert r.status_code == 200, r.text
        answers.append(_answer(r))
        stored.append(_stored(server, mid))
    edge, route = (re.sub(r"edge-1|route-1", "mid", repr(a)) for a in answers)
    assert edge == route
    assert stored[0]
    assert stored[0] == stored[1]


ERRORS = [
    # (path, content, authenticated)
    ("/queues/q1/messages", b'{"body": 1}', False),  # 401 without credentials
    ("/queues/missing/messages", b'{"body": 1}', True),  # 404
    ("/exchanges/missing/publish", b'{"body": 1}', True),  # 404
    ("/exchanges/ex/publish", b'{"body": 1, "routing_key": "x", "mandatory": true}', True),
    ("/exchanges/amq.default/publish", b'{"body": 1}', True),
    ("/exchanges/ex/publish-batch", b'{"messages": []}', True),  # 422 (models decide)
    ("/queues/q1/messages", b'{"body": NaN}', True),  # orjson refuses: the route decides
    ("/queues/q1/messages", b'{"body": 1237940039285380274899124225}', True),  # exact on both
    ("/queues/q1/messages", b'{"body": 1, "body_base64": "AA=="}', True),  # 422
    ("/queues/q1/messages", b'{"body": 1, "extra": true}', True),  # 422
    ("/queues/q1/messages", b"{not json", True),  # 400
    ("/queues/q1/messages", b"", True),  # 422: body missing
    ("/queues/-bad/messages", b'{"body": 1}', True),  # 422: path name
    ("/queues/q1/messages", b'{"body": "' + b"x" * (1 << 20) + b'"}', True),  # 413: size
]


@pytest.mark.parametrize(("path", "content", "authenticated"), ERRORS)
def test_errors_and_fallbacks_answer_alike(
    admin: httpx.Client,
    server: LiveServer,
    topology: None,
    path: str,
    content: bytes,
    authenticated: bool,
) -> None:
    anonymous = httpx.Client(base_url=f"{server.base_url}/api/v1")
    http = admin if authenticated else anonymous
    before = sql(server, "SELECT count(*) FROM messages")[0][0]
    with anonymous:
        edge = _answer(_send(http, path, content, EDGE))
        route = _answer(_send(http, path, content, ROUTE))
    if edge[0] == 200:  # the broker made the message ids
        edge, route = ((*a[:4], {**a[4], "message_id": "made"}) for a in (edge, route))
    assert edge == route
    if edge[0] != 200:
        assert edge[1] == "application/problem+json"
        assert sql(server, "SELECT count(*) FROM messages")[0][0] == before


def test_edge_publishes_are_counted_under_their_route_template(
    admin: httpx.Client, server: LiveServer, topology: None
) -> None:
    for _ in range(3):
        assert _send(admin, "/queues/q1/messages", b'{"body": 1}', EDGE).status_code == 200
    assert _send(admin, "/queues/nope/messages", b'{"body": 1}', EDGE).status_code == 404
    text = httpx.get(f"{server.base_url}/metrics").text
    route = "/api/v1/queues/{name}/messages"
    assert metric(text, "messagex_http_requests_total", route=route, status="200") == 3.0
    assert metric(text, "messagex_http_requests_total", route=route, status="404") == 1.0
    assert metric(text, "messagex_http_request_seconds_count", route=route) == 4.0
    assert "/queues/q1/" not in text


def test_pull_acks_answer_as_the_contract_says_and_are_counted(
    admin: httpx.Client, server: LiveServer, topology: None
) -> None:
    for n in range(2):
        assert admin.post("/queues/q1/messages", json={"body": n}).status_code == 200
    got = admin.post("/queues/q1/get", json={"max_messages": 2}).json()["messages"]
    tags = [m["delivery_tag"] for m in got]
    r = admin.post(f"/deliveries/{tags[0]}/ack", content=b"ignored")
    assert (r.status_code, r.content, r.headers.get("content-type")) == (204, b"", None)
    again = admin.post(f"/deliveries/{tags[0]}/ack")
    assert again.status_code == 404
    assert again.headers["content-type"] == "application/problem+json"
    assert again.json()["code"] == "not_found"
    with httpx.Client(base_url=f"{server.base_url}/api/v1") as anonymous:
        r = anonymous.post(f"/deliveries/{tags[1]}/ack")
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="messagex"'
    long = admin.post(f"/deliveries/{'1' * 129}/ack")  # longer than a tag may be: the route's 422
    assert long.status_code == 422
    assert long.json()["code"] == "validation_error"
    assert admin.post(f"/deliveries/{tags[1]}/ack").status_code == 204
    assert sql(server, "SELECT count(*) FROM messages")[0][0] == 0
    text = httpx.get(f"{server.base_url}/metrics").text
    route = "/api/v1/deliveries/{delivery_tag}/ack"
    assert metric(text, "messagex_http_requests_total", route=route, status="204") == 2.0
    assert metric(text, "messagex_http_requests_total", route=route, status="404") == 1.0
    assert metric(text, "messagex_http_requests_total", route=route, status="401") == 1.0
