"""The error format every route shares (contract §2): RFC 9457 problem+json, never a trace."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    admin_sql,
    client,
    running_server,
)
from tests.support import test_settings as settings_for

PROBLEM = "application/problem+json"
LIMIT = 2048


def _problem(r: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, object] = r.json()
    assert body["type"] == "about:blank"
    assert body["status"] == status
    assert body["code"] == code
    assert isinstance(body["title"], str)
    assert body["title"]
    assert isinstance(body["detail"], str)
    assert body["detail"]
    return body


@pytest.fixture
def small_server(database_url: str) -> Iterator[LiveServer]:
    """A broker whose request bodies may not exceed ``LIMIT`` bytes."""
    with running_server(settings_for(database_url, max_request_bytes=LIMIT)) as live:
        yield live


def test_unknown_route_is_a_404_problem(anon: httpx.Client, server: LiveServer) -> None:
    _problem(anon.get("/no-such-resource"), 404, "not_found")
    _problem(httpx.get(f"{server.base_url}/nothing/here"), 404, "not_found")


def test_wrong_method_is_a_405_problem(server: LiveServer) -> None:
    r = httpx.delete(f"{server.base_url}/healthz")
    _problem(r, 405, "method_not_allowed")


def test_malformed_json_is_a_400_problem(admin: httpx.Client) -> None:
    r = admin.put(
        "/exchanges/bad-json",
        content=b'{"type": "direct",',
        headers={"Content-Type": "application/json"},
    )
    _problem(r, 400, "bad_request")


def test_declared_content_length_over_the_limit_is_refused(small_server: LiveServer) -> None:
    with client(small_server.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as c:
        r = c.put(
            "/exchanges/too-big",
            content=b"{" + b" " * (LIMIT * 2) + b"}",
            headers={"Content-Type": "application/json"},
        )
    _problem(r, 413, "message_too_large")


def test_chunked_body_over_the_limit_is_refused(small_server: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"type": "direct", "arguments": {"pad": "'
        for _ in range(3):
            yield b"x" * 1024
        yield b'"}}'

    with client(small_server.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as c:
        request = c.build_request(
            "PUT",
            "/exchanges/too-big-chunked",
            content=chunks(),
            headers={"Content-Type": "application/json"},
        )
        assert "content-length" not in request.headers
        assert request.headers["transfer-encoding"] == "chunked"
        r = c.send(request)
        _problem(r, 413, "message_too_large")
        # Nothing was declared.
        assert c.get("/exchanges/too-big-chunked").status_code == 404


def test_a_body_under_the_limit_is_accepted(small_server: LiveServer) -> None:
    with client(small_server.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as c:
        r = c.put("/exchanges/small-enough", json={"type": "direct"})
    assert r.status_code == 201, r.text


def test_an_internal_error_shows_no_trace(
    admin: httpx.Client, server: LiveServer, database_url: str
) -> None:
    # A schema the code does not expect: the query fails with a driver error that is not a
    # connection error, so the broker answers 500 — without leaking what went wrong.
    admin_sql(database_url, "ALTER TABLE messages RENAME COLUMN status TO state")
    r = admin.get("/overview")
    body = _problem(r, 500, "internal_error")
    text = r.text
    for leak in ("Traceback", "SELECT", "does not exist", "sqlalchemy", "asyncpg", 'File "'):
        assert leak not in text, leak
    assert body["detail"] == "An internal error occurred; nothing was changed."
