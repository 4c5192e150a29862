"""Auth under attack: token expiry and logout close the user's open sockets; a foreign Origin
is refused; brute force gets 429 shared across two broker processes; an unknown user and a
wrong password get the same answer; an authorization matrix (two users and an admin by every
operation on each other's resources) answers 403 / 404, never a leak and never a 5xx.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from tests.faults.harness import sql
from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    client,
    login,
    running_server,
)
from tests.support import test_settings as settings_for
from tests.wsclient import (
    WsClient,
    bearer,
    declare_queue,
    publish,
    refused_status,
)

PASSWORD = "user-password-1"


def user(admin: httpx.Client, name: str, pattern: str) -> None:
    r = admin.put(
        f"/users/{name}",
        json={
            "password": PASSWORD,
            "role": "user",
            "permissions": {"configure": pattern, "write": pattern, "read": pattern},
        },
    )
    assert r.status_code in (200, 201), r.text


# -- sessions end, sockets close --------------------------------------------------------------


def test_token_expiry_closes_the_users_open_sockets(
    server: LiveServer, admin: httpx.Client, database_url: str
) -> None:
    user(admin, "exp", ".*")
    token = login(server.base_url, "exp", PASSWORD)
    by_header = WsClient.with_token(server.ws_url, token)
    by_frame = WsClient.open(server.ws_url)
    assert by_frame.request({"type": "AUTH", "token": token})["type"] == "CONNECTED"
    by_password = WsClient.as_user(server.ws_url, "exp", PASSWORD)
    # expire the session by backdating it (instead of waiting out its TTL)
    rows = sql(
        database_url,
        "UPDATE management_sessions SET expires_at = now() - interval '1 second' RETURNING user_id",
    )
    assert len(rows) == 1
    for ws in (by_header, by_frame):
        code, _ = ws.expect_close(8)
        assert code == 4401
    with client(server.base_url, token) as c:
        assert c.get("/auth/me").status_code == 401
    # the same user's password-authenticated socket is not a session: it stays
    assert by_password.request({"type": "PING"})["type"] == "PONG"
    by_password.close()


def test_logout_closes_the_sessions_sockets_at_once(
    server: LiveServer, admin: httpx.Client
) -> None:
    user(admin, "bye", ".*")
    token = login(server.base_url, "bye", PASSWORD)
    other_token = login(server.base_url, "bye", PASSWORD)
    ws = WsClient.with_token(server.ws_url, token)
    other = WsClient.with_token(server.ws_url, other_token)
    with client(server.base_url, token) as c:
        assert c.post("/auth/logout").status_code == 204
        assert c.get("/auth/me").status_code == 401
    code, _ = ws.expect_close(3)
    assert code == 4401
    assert other.request({"type": "PING"})["type"] == "PONG"  # another session is untouched
    other.close()
    assert refused_status(server.ws_url, bearer(token)) == 401


# -- Origin ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    ["http://evil.example", "null", "http://127.0.0.1.evil.example", "https://127.0.0.1:1"],
)
def test_a_foreign_origin_is_refused(server: LiveServer, origin: str) -> None:
    headers = {
        "Authorization": "Basic " + base64.b64encode(b"admin:admin-secret-password").decode()
    }
    assert refused_status(server.ws_url, headers, origin=origin) == 403


def test_the_same_origin_is_accepted(server: LiveServer) -> None:
    ws = WsClient.open(server.ws_url, origin=server.base_url)
    assert ws.request({"type": "PING"})["type"] == "PONG"
    ws.close()


# -- brute force ------------------------------------------------------------------------------


@pytest.fixture
def two_processes(database_url: str) -> Iterator[tuple[LiveServer, LiveServer]]:
    with ExitStack() as stack:
        a = stack.enter_context(running_server(settings_for(database_url)))
        b = stack.enter_context(running_server(settings_for(database_url)))
        yield a, b


def test_brute_force_gets_429_shared_across_two_processes(
    two_processes: tuple[LiveServer, LiveServer],
) -> None:
    a, b = two_processes
    with client(a.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as admin:
        user(admin, "victim", ".*")
    statuses = []
    for i in range(10):  # 10 failures, alternating between the two processes
        target = (a, b)[i % 2]
        r = httpx.post(
            f"{target.base_url}/api/v1/auth/login",
            json={"username": "victim", "password": f"guess-{i}"},
        )
        statuses.append(r.status_code)
    assert statuses == [401] * 10
    for target in (a, b):
        # now even the right password is refused, on both processes, by every door
        r = httpx.post(
            f"{target.base_url}/api/v1/auth/login",
            json={"username": "victim", "password": PASSWORD},
        )
        assert r.status_code == 429, r.text
        assert r.json()["code"] == "rate_limited"
        assert 0 < int(r.headers["Retry-After"]) <= 60
        r = httpx.get(f"{target.base_url}/api/v1/auth/me", auth=("victim", PASSWORD))
        assert r.status_code == 429
        assert refused_status(target.ws_url, basic_header("victim", PASSWORD)) == 429
    # another user is not locked out
    r = httpx.get(f"{a.base_url}/api/v1/auth/me", auth=(ADMIN_USER, ADMIN_PASSWORD))
    assert r.status_code == 200


def basic_header(name: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


# -- unknown user vs wrong password -----------------------------------------------------------


def test_unknown_user_and_wrong_password_get_the_same_answer(
    server: LiveServer, admin: httpx.Client
) -> None:
    user(admin, "known", ".*")

    def answers(name: str) -> list[Any]:
        out: list[Any] = []
        r = httpx.post(
            f"{server.base_url}/api/v1/auth/login", json={"username": name, "password": "wrong"}
        )
        out.append((r.status_code, r.content, r.headers.get("www-authenticate")))
        r = httpx.get(f"{server.base_url}/api/v1/queues", auth=(name, "wrong"))
        out.append((r.status_code, r.content, r.headers.get("www-authenticate")))
        out.append(refused_status(server.ws_url, basic_header(name, "wrong")))
        ws = WsClient.open(server.ws_url)
        ws.send_json({"type": "AUTH", "username": name, "password": "wrong", "id": 1})
        out.append(ws.expect_close(5))
        return out

    assert answers("known") == answers("nobody-at-all")


# -- the authorization matrix -----------------------------------------------------------------


Op = Callable[[httpx.Client, str], httpx.Response]


def ops(admin: httpx.Client) -> dict[str, Op]:
    """Every REST operation, aimed at the resources of ``owner`` (``owner.q``, ``owner.x``)."""

    def message_id(owner: str) -> int:
        items = admin.get(f"/queues/{owner}.q/messages").json()["items"]
        return int(items[0]["id"])

    def binding_id(owner: str) -> int:
        items = admin.get("/bindings", params={"queue": f"{owner}.q"}).json()["items"]
        return int(items[0]["id"])

    one = {"body": 1}
    return {
        "declare queue": lambda c, o: c.put(f"/queues/{o}.q", json={}),
        "declare new queue": lambda c, o: c.put(f"/queues/{o}.new", json={}),
        "get queue": lambda c, o: c.get(f"/queues/{o}.q"),
        "purge queue": lambda c, o: c.post(f"/queues/{o}.q/purge"),
        "delete queue": lambda c, o: c.delete(f"/queues/{o}.q"),
        "browse": lambda c, o: c.get(f"/queues/{o}.q/messages"),
        "get message": lambda c, o: c.get(f"/queues/{o}.q/messages/{message_id(o)}"),
        "delete message": lambda c, o: c.delete(f"/queues/{o}.q/messages/{message_id(o)}"),
        "publish to queue": lambda c, o: c.post(f"/queues/{o}.q/messages", json=one),
        "publish to exchange": lambda c, o: c.post(f"/exchanges/{o}.x/publish", json=one),
        "publish batch": lambda c, o: c.post(
            f"/exchanges/{o}.x/publish-batch", json={"messages": [one]}
        ),
        "pull": lambda c, o: c.post(f"/queues/{o}.q/get", json={}),
        "declare exchange": lambda c, o: c.put(f"/exchanges/{o}.x", json={"type": "direct"}),
        "get exchange": lambda c, o: c.get(f"/exchanges/{o}.x"),
        "delete exchange": lambda c, o: c.delete(f"/exchanges/{o}.x"),
        "bind their queue": lambda c, o: c.post(
            "/bindings", json={"exchange": "amq.direct", "queue": f"{o}.q", "routing_key": "k"}
        ),
        "bind from their exchange": lambda c, o: c.post(
            "/bindings", json={"exchange": f"{o}.x", "queue": "amq.none", "routing_key": "k"}
        ),
        "delete binding": lambda c, o: c.delete(f"/bindings/{binding_id(o)}"),
        "get user": lambda c, o: c.get(f"/users/{o}"),
        "put user": lambda c, o: c.put(
            f"/users/{o}", json={"password": "x", "role": "admin", "permissions": {}}
        ),
        "delete user": lambda c, o: c.delete(f"/users/{o}"),
        "list users": lambda c, o: c.get("/users"),
        "overview": lambda c, o: c.get("/overview"),
    }


def setup_owner(admin: httpx.Client, owner: str) -> None:
    user(admin, owner, rf"{owner}\..*")
    declare_queue(admin, f"{owner}.q")
    assert admin.put(f"/exchanges/{owner}.x", json={"type": "direct"}).status_code in (200, 201)
    r = admin.post(
        "/bindings", json={"exchange": f"{owner}.x", "queue": f"{owner}.q", "routing_key": "k"}
    )
    assert r.status_code in (200, 201)
    publish(admin, f"{owner}.q", "secret")


def test_authorization_matrix(server: LiveServer, admin: httpx.Client) -> None:
    for owner in ("alice", "bob"):
        setup_owner(admin, owner)
    table = ops(admin)
    outcomes: dict[tuple[str, str], int] = {}
    for actor, owner in (("alice", "bob"), ("bob", "alice")):
        with client(server.base_url, auth=(actor, PASSWORD)) as c:
            for name, op in table.items():
                r = op(c, owner)
                outcomes[(actor, name)] = r.status_code
                assert r.status_code in (403, 404), (actor, name, r.status_code, r.text)
                assert r.json()["code"] in ("forbidden", "not_found")
                assert "secret" not in r.text
            # lists show nothing of the other's
            for path in ("/queues", "/exchanges", "/bindings"):
                names = str(c.get(path, params={"limit": 1000}).json()["items"])
                assert f"{owner}." not in names, (actor, path, names)
            # WebSocket: subscribe and publish are refused, the socket stays
            with WsClient.as_user(server.ws_url, actor, PASSWORD) as ws:
                reply = ws.request({"type": "SUBSCRIBE", "queue": f"{owner}.q"})
                assert reply["code"] == "forbidden"
                reply = ws.request({"type": "PUBLISH", "queue": f"{owner}.q", "body": 1})
                assert reply["code"] == "forbidden"
    # nothing of theirs changed
    for owner in ("alice", "bob"):
        assert admin.get(f"/queues/{owner}.q").json()["stats"]["ready"] == 1
        assert admin.get(f"/users/{owner}").json()["role"] == "user"

    # pull deliveries belong to their user: another user's ack/nack is 404
    with client(server.base_url, auth=("alice", PASSWORD)) as alice_c:
        got = alice_c.post("/queues/alice.q/get", json={}).json()["messages"]
        tag = got[0]["delivery_tag"]
    with client(server.base_url, auth=("bob", PASSWORD)) as bob_c:
        assert bob_c.post(f"/deliveries/{tag}/ack").status_code == 404
        assert bob_c.post(f"/deliveries/{tag}/nack").status_code == 404
    assert admin.post(f"/deliveries/{tag}/ack").status_code == 404  # even the admin's
    with client(server.base_url, auth=("alice", PASSWORD)) as alice_c:
        assert alice_c.post(f"/deliveries/{tag}/ack").status_code == 204

    # the admin may do every one of them
    for name, op in table.items():
        if name in ("delete user", "put user"):
            continue
        setup_owner(admin, "bob")
        r = op(admin, "bob")
        missing_target = r.status_code == 404 and name == "bind from their exchange"
        assert r.status_code < 400 or missing_target, (name, r.status_code, r.text)
    print("authorization matrix:", len(outcomes), "operations refused:", outcomes)
