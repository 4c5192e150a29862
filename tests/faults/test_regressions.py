"""Regression tests for the defects this suite found (docs/reliability.md, "Defects found").

Fixed ones pass; ones in files owned elsewhere are ``xfail(strict=True)`` with the fix
proposed in their reason, so the suite stays green and turns red the day they are fixed
(remove the marker then).
"""

from __future__ import annotations

import json
import time

import httpx
import jsonschema_rs  # schemathesis brings it (uv.lock)

from tests.faults.harness import sessions, terminate
from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer

# -- the OpenAPI document tells the truth (found by schemathesis) ------------------------------


def test_405_allow_names_every_method_of_the_path(server: LiveServer) -> None:
    """Starlette's Allow named only the first route of the path: ``OPTIONS /bindings`` said
    ``Allow: POST`` although GET /bindings exists."""
    expected = {
        "/api/v1/bindings": "GET, POST",
        "/api/v1/queues/q": "DELETE, GET, PUT",
        "/api/v1/queues/q/messages": "GET, POST",
        "/api/v1/queues/q/messages/1": "DELETE, GET",
        "/api/v1/users/u": "DELETE, GET, PUT",
        "/healthz": "GET",
    }
    for path, allow in expected.items():
        r = httpx.request("OPTIONS", f"{server.base_url}{path}")
        assert r.status_code == 405, path
        assert r.headers["Allow"] == allow, path
        assert r.json()["code"] == "method_not_allowed"


def test_every_authenticated_operation_documents_429(server: LiveServer) -> None:
    """Any authenticated call of a rate-limited user or address is 429; publish, browse,
    pull, ack/nack and overview did not say so."""
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    missing = [
        f"{method.upper()} {path}"
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if op.get("security") and "429" not in op["responses"]
    ]
    assert missing == []


def test_publish_schema_says_exactly_one_of_body_and_body_base64(server: LiveServer) -> None:
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    body = doc["components"]["schemas"]["PublishBody"]
    rule = jsonschema_rs.Draft202012Validator(
        {key: body[key] for key in ("not", "if", "then", "oneOf", "anyOf", "allOf") if key in body}
    )
    assert rule.is_valid({"body": None})
    assert rule.is_valid({"body_base64": "AA=="})
    assert not rule.is_valid({"body": 1, "body_base64": "AA=="})
    assert not rule.is_valid({"routing_key": "k"})
    b64 = body["properties"]["body_base64"]
    pattern = (b64.get("anyOf") or [b64])[0].get("pattern") or json.dumps(b64)
    assert "A-Za-z0-9+/" in pattern


# -- a consumer that stops reading is really disconnected ------------------------------------
# (test_slow_consumer.py: the socket used to stay ESTABLISHED for as long as the peer kept its
# window shut, because a graceful close waits for the write buffer to drain.)

# -- unstorable strings were 500 ------------------------------------------------------------
# (test_hostile_input.py::test_unstorable_strings_are_422_not_500)


# -- stale pooled connections after the server ended the broker's sessions ------------------
# (app/storage/database.py: the first request on each stale pooled connection was 503 although
# the database was up; a pool checkout now discards a connection the server has closed.)


def test_a_request_after_the_servers_sessions_were_killed_succeeds(
    server: LiveServer, admin: httpx.Client, database_url: str
) -> None:
    for _ in range(3):
        assert admin.get("/queues").status_code == 200  # the pool holds a connection
        before = {row["pid"] for row in sessions(database_url)}
        assert terminate(database_url) >= 1
        deadline = time.monotonic() + 10
        while before & {row["pid"] for row in sessions(database_url)}:  # the backends exit
            assert time.monotonic() < deadline, "terminated backends did not exit"
            time.sleep(0.02)
        assert admin.get("/queues").status_code == 200


# -- a name ending in an encoded slash (found by the heavy hypothesis run) --------------------


def test_a_name_ending_in_an_encoded_slash_is_not_redirected_to_another_resource(
    server: LiveServer,
) -> None:
    """``PUT /queues/a%2F`` was answered 307 to ``/queues/a`` (the router's trailing-slash
    redirect), and a client that follows redirects (fetch, ``curl -L``) re-sent the PUT there:
    declaring ``a/`` declared ``a``. Now it is a plain 404, and nothing is declared."""
    auth = (ADMIN_USER, ADMIN_PASSWORD)
    with httpx.Client(base_url=f"{server.base_url}/api/v1", auth=auth) as api:
        for method, path, body in (
            ("PUT", "/queues/a%2F", {}),
            ("PUT", "/exchanges/a%2F", {"type": "direct"}),
            ("GET", "/queues/", None),
            ("POST", "/queues/a%2F/messages", {"body": 1}),
        ):
            r = api.request(method, path, json=body)
            assert r.status_code == 404, (method, path, r.status_code)
            assert "location" not in r.headers
            assert r.json()["code"] == "not_found"
        assert api.get("/queues/a").status_code == 404
        assert api.get("/exchanges/a").status_code == 404
