"""Exchanges through the real server (contract §1, §2, §4, §12)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support import LiveServer, client

UserFactory = Callable[..., httpx.Client]
BUILTINS = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
}


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["status"] == status
    assert body["code"] == code
    assert {"type", "title", "detail"} <= body.keys()
    return body


@pytest.fixture
def make_user(server: LiveServer, admin: httpx.Client) -> Iterator[UserFactory]:
    """Create a broker user with the given permissions; a client authenticated as it."""
    clients: list[httpx.Client] = []

    def make(name: str, configure: str = "", write: str = "", read: str = "") -> httpx.Client:
        password = f"{name}-password-123"
        r = admin.put(
            f"/users/{name}",
            json={
                "password": password,
                "role": "user",
                "permissions": {"configure": configure, "write": write, "read": read},
            },
        )
        assert r.status_code == 201, r.text
        c = client(server.base_url, auth=(name, password))
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


def names(page: dict[str, Any]) -> list[str]:
    return [item["name"] for item in page["items"]]


# --------------------------------------------------------------------------- declare


def test_builtins_present_after_migration(admin: httpx.Client) -> None:
    r = admin.get("/exchanges")
    assert r.status_code == 200
    items = {e["name"]: e for e in r.json()["items"]}
    assert set(items) == set(BUILTINS)
    for name, kind in BUILTINS.items():
        assert items[name] == {
            "name": name,
            "type": kind,
            "durable": True,
            "auto_delete": False,
            "arguments": {},
            "builtin": True,
        }
    assert admin.get("/exchanges/amq.topic").json()["type"] == "topic"


def test_declare_created_then_identical_then_conflict(admin: httpx.Client) -> None:
    r = admin.put("/exchanges/orders", json={"type": "topic"})
    assert r.status_code == 201, r.text
    created = {
        "name": "orders",
        "type": "topic",
        "durable": True,
        "auto_delete": False,
        "arguments": {},
        "builtin": False,
    }
    assert r.json() == created
    # Identical is judged after defaults are applied.
    full = {"type": "topic", "durable": True, "auto_delete": False, "arguments": {}}
    for same in ({"type": "topic"}, full):
        r = admin.put("/exchanges/orders", json=same)
        assert r.status_code == 200, r.text
        assert r.json() == created
    for different in (
        {"type": "direct"},
        {"type": "topic", "durable": False},
        {"type": "topic", "auto_delete": True},
        {"type": "topic", "arguments": {"x": 1}},
    ):
        body = assert_problem(
            admin.put("/exchanges/orders", json=different), 409, "precondition_failed"
        )
        assert "orders" in body["detail"]
    assert admin.get("/exchanges/orders").json() == created


def test_declare_compares_arguments_as_json_values(admin: httpx.Client) -> None:
    args = {"a": 1, "b": [True, None, "x"], "c": {"d": 1.5}}
    assert admin.put("/exchanges/x", json={"type": "headers", "arguments": args}).status_code == 201
    reordered = {"c": {"d": 1.5}, "b": [True, None, "x"], "a": 1.0}
    assert (
        admin.put("/exchanges/x", json={"type": "headers", "arguments": reordered}).status_code
        == 200
    )
    for other in ({"a": True, "b": [True, None, "x"], "c": {"d": 1.5}}, {"a": "1"}, {}):
        r = admin.put("/exchanges/x", json={"type": "headers", "arguments": other})
        assert_problem(r, 409, "precondition_failed")


def test_concurrent_identical_declares_all_succeed(admin: httpx.Client) -> None:
    def declare(_: int) -> int:
        return admin.put("/exchanges/race", json={"type": "fanout"}).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(declare, range(16)))
    assert sorted(statuses) == [200] * 15 + [201]


def test_declare_body_validation(admin: httpx.Client) -> None:
    for body in (
        {},
        {"type": "nope"},
        {"type": "direct", "durable": "yes"},
        {"type": "direct", "auto_delete": 1},
        {"type": "direct", "arguments": []},
        {"type": "direct", "arguments": {"k": "a\u0000b"}},
        {"type": "direct", "surprise": True},
    ):
        problem = assert_problem(admin.put("/exchanges/v", json=body), 422, "validation_error")
        assert problem["errors"], body
    assert admin.get("/exchanges/v").status_code == 404


def test_declare_malformed_json_and_non_finite_numbers(admin: httpx.Client) -> None:
    headers = {"content-type": "application/json"}
    r = admin.put("/exchanges/v", content=b'{"type": "direct"', headers=headers)
    assert_problem(r, 400, "bad_request")
    r = admin.put(
        "/exchanges/v", content=b'{"type":"direct","arguments":{"n":NaN}}', headers=headers
    )
    assert_problem(r, 422, "validation_error")
    r = admin.put("/exchanges/v", headers=headers)  # no body: type is required
    assert_problem(r, 422, "validation_error")


def test_invalid_names_in_path_are_422(admin: httpx.Client) -> None:
    for name in ("-x", "_x", "a b", "a,b", "é", "x" * 256):
        r = admin.put(f"/exchanges/{name}", json={"type": "direct"})
        assert_problem(r, 422, "validation_error")
        assert_problem(admin.get(f"/exchanges/{name}"), 422, "validation_error")
        assert_problem(admin.delete(f"/exchanges/{name}"), 422, "validation_error")


def test_longest_valid_name(admin: httpx.Client) -> None:
    name = "a" + "b:._-" * 50 + "1234"
    assert len(name) == 255
    assert admin.put(f"/exchanges/{name}", json={"type": "direct"}).status_code == 201
    assert admin.get(f"/exchanges/{name}").json()["name"] == name


def test_amq_prefix_is_reserved_even_for_admin(admin: httpx.Client) -> None:
    for name in ("amq.custom", "amq.direct"):
        body = assert_problem(
            admin.put(f"/exchanges/{name}", json={"type": "direct"}), 403, "forbidden"
        )
        assert "amq." in body["detail"] or name in body["detail"]
    assert admin.get("/exchanges/amq.custom").status_code == 404
    for name in BUILTINS:
        assert_problem(admin.delete(f"/exchanges/{name}"), 403, "forbidden")
        assert admin.get(f"/exchanges/{name}").status_code == 200
    assert_problem(admin.delete("/exchanges/amq.custom"), 403, "forbidden")
    # Not reserved: only the exact prefix "amq." is.
    assert admin.put("/exchanges/amqp.x", json={"type": "direct"}).status_code == 201
    assert admin.put("/exchanges/AMQ.x", json={"type": "direct"}).status_code == 201


# --------------------------------------------------------------------------- get / delete


def test_get_missing_is_404(admin: httpx.Client) -> None:
    body = assert_problem(admin.get("/exchanges/ghost"), 404, "not_found")
    assert "ghost" in body["detail"]


def test_delete_takes_bindings_along(admin: httpx.Client) -> None:
    admin.put("/exchanges/ex", json={"type": "direct"})
    admin.put("/queues/q1")
    b = admin.post("/bindings", json={"exchange": "ex", "queue": "q1", "routing_key": "k"})
    assert b.status_code == 201, b.text
    r = admin.delete("/exchanges/ex")
    assert r.status_code == 204
    assert r.content == b""
    assert_problem(admin.get("/exchanges/ex"), 404, "not_found")
    assert admin.get("/bindings", params={"queue": "q1"}).json()["items"] == []
    assert_problem(admin.delete(f"/bindings/{b.json()['id']}"), 404, "not_found")
    assert admin.get("/queues/q1").status_code == 200  # the queue stays
    assert_problem(admin.delete("/exchanges/ex"), 404, "not_found")


def test_delete_if_unused(admin: httpx.Client) -> None:
    admin.put("/exchanges/ex", json={"type": "fanout"})
    admin.put("/queues/q1")
    binding = admin.post("/bindings", json={"exchange": "ex", "queue": "q1"}).json()
    body = assert_problem(
        admin.delete("/exchanges/ex", params={"if_unused": "true"}), 409, "precondition_failed"
    )
    assert "ex" in body["detail"]
    assert admin.get("/exchanges/ex").status_code == 200
    assert admin.delete(f"/bindings/{binding['id']}").status_code == 204
    assert admin.delete("/exchanges/ex", params={"if_unused": "true"}).status_code == 204
    assert_problem(
        admin.delete("/exchanges/ex", params={"if_unused": "maybe"}), 422, "validation_error"
    )


# --------------------------------------------------------------------------- auto_delete


def test_auto_delete_exchange_goes_with_its_last_binding(admin: httpx.Client) -> None:
    admin.put("/exchanges/auto", json={"type": "direct", "auto_delete": True})
    admin.put("/exchanges/keep", json={"type": "direct"})
    for q in ("q1", "q2"):
        admin.put(f"/queues/{q}")
    b1 = admin.post("/bindings", json={"exchange": "auto", "queue": "q1"}).json()
    b2 = admin.post(
        "/bindings", json={"exchange": "auto", "queue": "q2", "routing_key": "x"}
    ).json()
    b3 = admin.post("/bindings", json={"exchange": "keep", "queue": "q1"}).json()

    assert admin.delete(f"/bindings/{b1['id']}").status_code == 204
    assert admin.get("/exchanges/auto").status_code == 200  # one binding left
    assert admin.delete(f"/bindings/{b2['id']}").status_code == 204
    assert_problem(admin.get("/exchanges/auto"), 404, "not_found")

    assert admin.delete(f"/bindings/{b3['id']}").status_code == 204
    assert admin.get("/exchanges/keep").status_code == 200  # not auto-delete: stays


def test_auto_delete_exchange_goes_when_queue_deletion_removes_last_binding(
    admin: httpx.Client,
) -> None:
    admin.put("/exchanges/auto", json={"type": "fanout", "auto_delete": True})
    admin.put("/exchanges/auto2", json={"type": "fanout", "auto_delete": True})
    admin.put("/queues/q1")
    admin.put("/queues/q2")
    admin.post("/bindings", json={"exchange": "auto", "queue": "q1"})
    admin.post("/bindings", json={"exchange": "auto", "queue": "q1", "routing_key": "again"})
    admin.post("/bindings", json={"exchange": "auto2", "queue": "q1"})
    admin.post("/bindings", json={"exchange": "auto2", "queue": "q2"})

    assert admin.delete("/queues/q1").status_code == 204
    assert_problem(admin.get("/exchanges/auto"), 404, "not_found")
    assert admin.get("/exchanges/auto2").status_code == 200  # still bound to q2


def test_auto_delete_exchange_without_bindings_stays(admin: httpx.Client) -> None:
    assert (
        admin.put("/exchanges/lonely", json={"type": "topic", "auto_delete": True}).status_code
        == 201
    )
    assert admin.get("/exchanges/lonely").json()["auto_delete"] is True


# --------------------------------------------------------------------------- list


def test_list_pagination_in_byte_order(admin: httpx.Client) -> None:
    for name in ("b", "B", "a", "Z", "a.b", "a-b", "0"):
        assert admin.put(f"/exchanges/{name}", json={"type": "direct"}).status_code == 201
    expected = sorted(["b", "B", "a", "Z", "a.b", "a-b", "0", *BUILTINS], key=str.encode)
    assert expected[:4] == ["0", "B", "Z", "a"]  # byte order: digits < upper < lower

    assert names(admin.get("/exchanges").json()) == expected
    seen: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 3}
        if after is not None:
            params["after"] = after
        page = admin.get("/exchanges", params=params).json()
        seen += names(page)
        assert len(page["items"]) <= 3
        if page["next_after"] is None:
            break
        assert len(page["items"]) == 3
        assert page["next_after"] == page["items"][-1]["name"]
        after = page["next_after"]
    assert seen == expected

    short = admin.get("/exchanges", params={"limit": 1000}).json()
    assert short["next_after"] is None
    after_b = admin.get("/exchanges", params={"after": "B", "limit": 2}).json()
    assert names(after_b) == ["Z", "a"]
    assert after_b["next_after"] == "a"
    assert admin.get("/exchanges", params={"after": "b"}).json() == {
        "items": [],
        "next_after": None,
    }


def test_list_bad_query_is_422(admin: httpx.Client) -> None:
    for params in (
        {"limit": 0},
        {"limit": 1001},
        {"limit": "x"},
        {"after": "-bad"},
        {"after": "x" * 256},
    ):
        assert_problem(admin.get("/exchanges", params=params), 422, "validation_error")


# --------------------------------------------------------------------------- permissions


def test_unauthenticated_is_401(anon: httpx.Client) -> None:
    for r in (
        anon.get("/exchanges"),
        anon.get("/exchanges/amq.direct"),
        anon.put("/exchanges/x", json={"type": "direct"}),
        anon.delete("/exchanges/x"),
    ):
        assert_problem(r, 401, "unauthorized")


def test_permission_matrix(admin: httpx.Client, make_user: UserFactory) -> None:
    for name in ("app.in", "app.out", "other", "shared"):
        admin.put(f"/exchanges/{name}", json={"type": "direct"})
    alice = make_user("alice", configure=r"app\..*", write="shared", read="amq\\.topic")
    nobody = make_user("nobody")

    # Lists show only what the user has some permission on (built-ins included).
    assert names(alice.get("/exchanges").json()) == ["amq.topic", "app.in", "app.out", "shared"]
    assert names(nobody.get("/exchanges").json()) == []
    page = alice.get("/exchanges", params={"limit": 1, "after": "amq.topic"}).json()
    assert names(page) == ["app.in"]
    assert page["next_after"] == "app.in"
    last = alice.get("/exchanges", params={"limit": 1, "after": "app.out"}).json()
    assert names(last) == ["shared"]
    assert last["next_after"] is None  # "other" follows but is not visible

    # GET of one needs some permission; it is 403 whether or not the exchange exists.
    assert alice.get("/exchanges/shared").status_code == 200
    assert alice.get("/exchanges/amq.topic").status_code == 200
    assert_problem(alice.get("/exchanges/other"), 403, "forbidden")
    assert_problem(alice.get("/exchanges/ghost"), 403, "forbidden")
    assert_problem(alice.get("/exchanges/app.ghost"), 404, "not_found")

    # Declare and delete need configure.
    assert alice.put("/exchanges/app.new", json={"type": "topic"}).status_code == 201
    assert alice.put("/exchanges/app.new", json={"type": "topic"}).status_code == 200
    assert_problem(alice.put("/exchanges/shared", json={"type": "direct"}), 403, "forbidden")
    assert_problem(alice.put("/exchanges/mine", json={"type": "direct"}), 403, "forbidden")
    assert_problem(alice.delete("/exchanges/shared"), 403, "forbidden")
    assert admin.get("/exchanges/shared").status_code == 200
    assert alice.delete("/exchanges/app.new").status_code == 204
    assert_problem(alice.delete("/exchanges/app.new"), 404, "not_found")
    # amq. stays reserved whatever the permissions.
    root = make_user("root", configure=".*", write=".*", read=".*")
    assert_problem(root.put("/exchanges/amq.mine", json={"type": "direct"}), 403, "forbidden")
    assert_problem(root.delete("/exchanges/amq.fanout"), 403, "forbidden")
