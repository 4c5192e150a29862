"""Bindings through the real server (contract §6, §12)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support import LiveServer, client

UserFactory = Callable[..., httpx.Client]


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


def setup_topology(admin: httpx.Client, exchanges: dict[str, str], queues: list[str]) -> None:
    for name, kind in exchanges.items():
        assert admin.put(f"/exchanges/{name}", json={"type": kind}).status_code == 201
    for name in queues:
        assert admin.put(f"/queues/{name}").status_code == 201


def bind(
    c: httpx.Client, exchange: str, queue: str, key: str = "", /, **args: Any
) -> httpx.Response:
    return c.post(
        "/bindings",
        json={"exchange": exchange, "queue": queue, "routing_key": key, "arguments": args},
    )


def test_create_defaults_and_idempotence(admin: httpx.Client) -> None:
    setup_topology(admin, {"ex": "direct"}, ["q"])
    r = admin.post("/bindings", json={"exchange": "ex", "queue": "q"})
    assert r.status_code == 201, r.text
    first = r.json()
    assert isinstance(first["id"], int)
    assert first == {
        "id": first["id"],
        "exchange": "ex",
        "queue": "q",
        "destination_exchange": None,
        "routing_key": "",
        "arguments": {},
    }

    # Identical (after defaults): 200 with the existing binding.
    r = bind(admin, "ex", "q")
    assert r.status_code == 200
    assert r.json() == first

    # Differing in key, or only in arguments: distinct bindings.
    keyed = bind(admin, "ex", "q", "k")
    assert keyed.status_code == 201
    with_args = bind(admin, "ex", "q", "k", a=1)
    assert with_args.status_code == 201
    assert len({first["id"], keyed.json()["id"], with_args.json()["id"]}) == 3
    # Arguments are compared as JSON values: 1.0 is 1, key order is irrelevant.
    again = admin.post(
        "/bindings",
        json={"exchange": "ex", "queue": "q", "routing_key": "k", "arguments": {"a": 1.0}},
    )
    assert again.status_code == 200
    assert again.json()["id"] == with_args.json()["id"]
    assert bind(admin, "ex", "q", "k", a=True).status_code == 201  # true is not 1
    assert bind(admin, "ex", "q", "k", a="1").status_code == 201  # "1" is not 1
    assert len(admin.get("/bindings").json()["items"]) == 5


def test_concurrent_identical_binds_all_succeed(admin: httpx.Client) -> None:
    setup_topology(admin, {"ex": "topic"}, ["q"])

    def create(_: int) -> tuple[int, int]:
        r = bind(admin, "ex", "q", "a.#")
        return r.status_code, r.json()["id"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(create, range(16)))
    assert sorted(s for s, _ in results) == [200] * 15 + [201]
    assert len({i for _, i in results}) == 1


def test_missing_exchange_or_queue_is_404(admin: httpx.Client) -> None:
    setup_topology(admin, {"ex": "direct"}, ["q"])
    body = assert_problem(bind(admin, "ghost", "q"), 404, "not_found")
    assert "ghost" in body["detail"]
    body = assert_problem(bind(admin, "ex", "phantom"), 404, "not_found")
    assert "phantom" in body["detail"]
    assert_problem(bind(admin, "ghost", "phantom"), 404, "not_found")
    assert admin.get("/bindings").json()["items"] == []


def test_builtin_exchanges_can_be_bound(admin: httpx.Client) -> None:
    setup_topology(admin, {}, ["q"])
    r = bind(admin, "amq.topic", "q", "orders.*")
    assert r.status_code == 201
    assert r.json()["exchange"] == "amq.topic"


def test_headers_binding_arguments_are_checked(admin: httpx.Client) -> None:
    setup_topology(admin, {"h": "headers", "d": "direct"}, ["q"])
    for bad in ("some", 1, None, "ALL"):
        body = assert_problem(bind(admin, "h", "q", **{"x-match": bad}), 422, "validation_error")
        assert "x-match" in body["detail"]
    for good in ("all", "any", "all-with-x", "any-with-x"):
        assert bind(admin, "h", "q", **{"x-match": good, "k": "v"}).status_code == 201
    assert bind(admin, "h", "q").status_code == 201  # no x-match: "all"
    # Other exchange types store arguments as given.
    assert bind(admin, "d", "q", "k", **{"x-match": "whatever"}).status_code == 201


def test_body_validation(admin: httpx.Client) -> None:
    setup_topology(admin, {"ex": "direct"}, ["q"])
    for body in (
        {"queue": "q"},
        {"exchange": "ex"},
        {"exchange": "bad name", "queue": "q"},
        {"exchange": "ex", "queue": "-q"},
        {"exchange": "ex", "queue": "q", "routing_key": 5},
        {"exchange": "ex", "queue": "q", "routing_key": "k" * 256},
        {"exchange": "ex", "queue": "q", "routing_key": "a\u0000"},
        {"exchange": "ex", "queue": "q", "arguments": [1]},
        {"exchange": "ex", "queue": "q", "extra": 1},
        # Over PostgreSQL's index row limit (the unique index holds the arguments).
        {"exchange": "ex", "queue": "q", "arguments": {"k": secrets.token_hex(6000)}},
    ):
        problem = assert_problem(admin.post("/bindings", json=body), 422, "validation_error")
        assert problem["errors"], body
    r = admin.post("/bindings", content=b"{oops", headers={"content-type": "application/json"})
    assert_problem(r, 400, "bad_request")
    assert bind(admin, "ex", "q", "k" * 255).status_code == 201


def test_list_by_id_with_filters_and_pagination(admin: httpx.Client) -> None:
    setup_topology(admin, {"e1": "direct", "e2": "fanout"}, ["q1", "q2"])
    ids = [
        bind(admin, e, q, k).json()["id"]
        for e, q, k in [("e1", "q1", "a"), ("e2", "q1", ""), ("e1", "q2", "b"), ("e1", "q1", "c")]
    ]
    assert ids == sorted(ids)

    everything = admin.get("/bindings").json()
    assert [b["id"] for b in everything["items"]] == ids
    assert everything["next_after"] is None
    assert everything["items"][0] == {
        "id": ids[0],
        "exchange": "e1",
        "queue": "q1",
        "destination_exchange": None,
        "routing_key": "a",
        "arguments": {},
    }

    def listed(**params: Any) -> list[int]:
        return [b["id"] for b in admin.get("/bindings", params=params).json()["items"]]

    assert listed(exchange="e1") == [ids[0], ids[2], ids[3]]
    assert listed(queue="q1") == [ids[0], ids[1], ids[3]]
    assert listed(exchange="e1", queue="q1") == [ids[0], ids[3]]
    assert listed(exchange="nothing") == []

    page = admin.get("/bindings", params={"limit": 3}).json()
    assert [b["id"] for b in page["items"]] == ids[:3]
    assert page["next_after"] == ids[2]
    page = admin.get("/bindings", params={"limit": 3, "after": page["next_after"]}).json()
    assert [b["id"] for b in page["items"]] == ids[3:]
    assert page["next_after"] is None
    page = admin.get("/bindings", params={"exchange": "e1", "limit": 2}).json()
    assert page["next_after"] == ids[2]
    assert listed(after=ids[-1]) == []
    assert listed(after=0) == ids

    for params in (
        {"after": "abc"},
        {"after": "1.5"},
        {"after": str(2**64)},
        {"limit": 0},
        {"limit": 1001},
        {"exchange": "bad name"},
        {"queue": "-q"},
    ):
        assert_problem(admin.get("/bindings", params=params), 422, "validation_error")


def test_delete(admin: httpx.Client) -> None:
    setup_topology(admin, {"ex": "direct"}, ["q"])
    binding = bind(admin, "ex", "q", "k").json()
    r = admin.delete(f"/bindings/{binding['id']}")
    assert r.status_code == 204
    assert r.content == b""
    assert admin.get("/bindings").json()["items"] == []
    body = assert_problem(admin.delete(f"/bindings/{binding['id']}"), 404, "not_found")
    assert str(binding["id"]) in body["detail"]
    assert_problem(admin.delete("/bindings/0"), 404, "not_found")
    assert_problem(admin.delete("/bindings/abc"), 422, "validation_error")
    assert_problem(admin.delete(f"/bindings/{2**63}"), 422, "validation_error")
    # Re-creating after a delete is a new binding.
    again = bind(admin, "ex", "q", "k")
    assert again.status_code == 201
    assert again.json()["id"] != binding["id"]


def test_unauthenticated_is_401(anon: httpx.Client) -> None:
    for r in (
        anon.get("/bindings"),
        anon.post("/bindings", json={"exchange": "e", "queue": "q"}),
        anon.delete("/bindings/1"),
    ):
        assert_problem(r, 401, "unauthorized")


def test_permission_matrix(admin: httpx.Client, make_user: UserFactory) -> None:
    setup_topology(admin, {"src": "direct", "hidden": "direct"}, ["dst", "private"])
    # Read on the exchange "src" and write on the queue "dst" only.
    carol = make_user("carol", write="dst", read="src")
    reader = make_user("reader", read="src|dst")  # no write anywhere
    writer = make_user("writer", write="dst|private")  # no read anywhere
    nobody = make_user("nobody")

    assert carol.post("/bindings", json={"exchange": "src", "queue": "dst"}).status_code == 201
    assert carol.post("/bindings", json={"exchange": "src", "queue": "dst"}).status_code == 200
    assert_problem(bind(reader, "src", "dst", "r"), 403, "forbidden")  # needs write on queue
    assert_problem(bind(writer, "src", "dst", "w"), 403, "forbidden")  # needs read on exchange
    assert_problem(bind(carol, "hidden", "dst"), 403, "forbidden")
    assert_problem(bind(carol, "src", "private"), 403, "forbidden")
    assert_problem(bind(carol, "ghost", "dst"), 403, "forbidden")  # 403 before 404
    assert_problem(bind(carol, "src", "nope"), 403, "forbidden")

    b_src_dst = bind(admin, "src", "dst", "x").json()
    b_hidden_private = bind(admin, "hidden", "private").json()
    b_hidden_dst = bind(admin, "hidden", "dst").json()
    b_src_private = bind(admin, "src", "private").json()

    def listed(c: httpx.Client, **params: Any) -> list[int]:
        return [b["id"] for b in c.get("/bindings", params=params).json()["items"]]

    # Some permission on the exchange or the queue makes a binding visible.
    everything = listed(admin)
    assert len(everything) == 5
    assert b_hidden_private["id"] not in listed(carol)
    assert set(listed(carol)) == set(everything) - {b_hidden_private["id"]}
    assert listed(writer) == everything  # write on both queues
    assert set(listed(reader)) == set(everything) - {b_hidden_private["id"]}
    assert listed(nobody) == []
    page = carol.get("/bindings", params={"limit": 1, "after": b_src_dst["id"]}).json()
    assert [b["id"] for b in page["items"]] == [b_hidden_dst["id"]]  # hidden→private skipped
    assert page["next_after"] == b_hidden_dst["id"]

    # Delete needs the same pair of permissions as create.
    assert_problem(carol.delete(f"/bindings/{b_hidden_dst['id']}"), 403, "forbidden")
    assert_problem(carol.delete(f"/bindings/{b_src_private['id']}"), 403, "forbidden")
    assert_problem(reader.delete(f"/bindings/{b_src_dst['id']}"), 403, "forbidden")
    assert carol.delete(f"/bindings/{b_src_dst['id']}").status_code == 204
    assert len(listed(admin)) == 4
