"""Queues through the real server: declare, get, list with stats, delete, purge (contract §5).

Messages and subscriptions are inserted with SQL straight into the test database, so that
every status (ready, delayed, in flight, dead) and live/stale consumers can be set up exactly.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg
import httpx
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.support import LiveServer, client

UserFactory = Callable[..., httpx.Client]

DEFAULTS: dict[str, Any] = {
    "durable": True,
    "max_delivery_count": None,
    "dead_letter_queue": None,
    "ack_timeout_seconds": None,
    "arguments": {},
}
ZERO = {"ready": 0, "delayed": 0, "in_flight": 0, "dead": 0, "consumers": 0}


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["status"] == status
    assert body["code"] == code
    assert {"type", "title", "detail"} <= body.keys()
    return body


def sql(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


_STATUS_SQL = {
    "ready": "'ready', NULL, NULL, now() - interval '1 second'",
    "delayed": "'ready', NULL, NULL, now() + interval '1 hour'",
    "in_flight": "'in_flight', gen_random_uuid()::text, now() + interval '1 hour', now()",
    "dead": "'dead', NULL, NULL, now()",
}


def add_messages(url: str, queue: str, status: str, n: int) -> None:
    sql(
        url,
        "INSERT INTO messages (queue_id, message_id, exchange, routing_key, body,"
        " status, delivery_tag, lease_expires_at, available_at)"
        f" SELECT q.id, gen_random_uuid()::text, '', q.name, '\"x\"'::bytea, {_STATUS_SQL[status]}"
        " FROM queues q, generate_series(1, $2) WHERE q.name = $1",
        queue,
        n,
    )


def add_process(url: str, *, stale: bool = False) -> str:
    process_id = str(uuid.uuid4())
    age = "interval '1 minute'" if stale else "interval '0 seconds'"
    sql(
        url,
        "INSERT INTO broker_processes (id, hostname, pid, heartbeat_at)"
        f" VALUES ($1::uuid, 'test', 1, now() - {age})",
        process_id,
    )
    return process_id


def add_subscription(url: str, queue: str, process_id: str) -> None:
    sql(
        url,
        "INSERT INTO subscriptions (connection_id, queue_id, process_id, prefetch)"
        " SELECT gen_random_uuid(), id, $2::uuid, 1 FROM queues WHERE name = $1",
        queue,
        process_id,
    )


def count_messages(url: str, queue: str | None = None) -> int:
    if queue is None:
        return int(sql(url, "SELECT count(*) FROM messages")[0][0])
    rows = sql(
        url,
        "SELECT count(*) FROM messages m JOIN queues q ON q.id = m.queue_id WHERE q.name = $1",
        queue,
    )
    return int(rows[0][0])


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


def test_declare_with_no_body_uses_defaults(admin: httpx.Client) -> None:
    r = admin.put("/queues/jobs")
    assert r.status_code == 201, r.text
    assert r.json() == {"name": "jobs", **DEFAULTS, "stats": ZERO}
    # Empty body, {} and the explicit defaults are all identical.
    assert admin.put("/queues/jobs", content=b"").status_code == 200
    assert admin.put("/queues/jobs", json={}).status_code == 200
    r = admin.put("/queues/jobs", content=b"null", headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert admin.put("/queues/jobs", json=DEFAULTS).status_code == 200
    assert admin.get("/queues/jobs").json() == {"name": "jobs", **DEFAULTS, "stats": ZERO}


def test_declare_identical_and_conflicting(admin: httpx.Client) -> None:
    admin.put("/queues/dlq")
    props = {
        "durable": False,
        "max_delivery_count": 3,
        "dead_letter_queue": "dlq",
        "ack_timeout_seconds": 60,
        "arguments": {"x-note": ["a", 1]},
    }
    r = admin.put("/queues/work", json=props)
    assert r.status_code == 201, r.text
    assert r.json() == {"name": "work", **props, "stats": ZERO}
    r = admin.put("/queues/work", json=props)
    assert r.status_code == 200
    assert r.json() == {"name": "work", **props, "stats": ZERO}
    change: dict[str, Any]
    for change in (
        {"durable": True},
        {"max_delivery_count": None},
        {"max_delivery_count": 4},
        {"dead_letter_queue": None},
        {"ack_timeout_seconds": 61},
        {"arguments": {}},
    ):
        body = assert_problem(
            admin.put("/queues/work", json={**props, **change}), 409, "precondition_failed"
        )
        assert "work" in body["detail"]
        assert next(iter(change)) in body["detail"]  # names the differing property
    assert admin.put("/queues/work").status_code == 409  # defaults differ from what exists


def test_concurrent_identical_declares_all_succeed(admin: httpx.Client) -> None:
    def declare(_: int) -> int:
        return admin.put("/queues/race", json={"max_delivery_count": 2}).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(declare, range(16)))
    assert sorted(statuses) == [200] * 15 + [201]


def test_declare_validation(admin: httpx.Client) -> None:
    body: object
    for body in (
        {"max_delivery_count": 0},
        {"max_delivery_count": -1},
        {"max_delivery_count": "5"},
        {"max_delivery_count": 2.5},
        {"max_delivery_count": 2**31},
        {"ack_timeout_seconds": 0},
        {"ack_timeout_seconds": True},
        {"durable": "true"},
        {"dead_letter_queue": "bad name"},
        {"dead_letter_queue": ""},
        {"arguments": "x"},
        {"unknown": 1},
        [],
    ):
        problem = assert_problem(admin.put("/queues/v", json=body), 422, "validation_error")
        assert problem["errors"], body
    r = admin.put("/queues/v", content=b"{", headers={"content-type": "application/json"})
    assert_problem(r, 400, "bad_request")
    for name in ("-v", "a b", "q" * 256):
        assert_problem(admin.put(f"/queues/{name}"), 422, "validation_error")
        assert_problem(admin.get(f"/queues/{name}"), 422, "validation_error")
        assert_problem(admin.delete(f"/queues/{name}"), 422, "validation_error")
        assert_problem(admin.post(f"/queues/{name}/purge"), 422, "validation_error")
    assert admin.get("/queues").json()["items"] == []


def test_amq_prefix_is_reserved(admin: httpx.Client) -> None:
    assert_problem(admin.put("/queues/amq.q"), 403, "forbidden")
    assert_problem(admin.delete("/queues/amq.q"), 403, "forbidden")
    assert admin.put("/queues/amqp.q").status_code == 201


# --------------------------------------------------------------------------- dead-letter queue


def test_dead_letter_queue_rules(admin: httpx.Client) -> None:
    # Itself: 422, before anything else (even when the queue does not exist yet).
    body = assert_problem(
        admin.put("/queues/self", json={"dead_letter_queue": "self"}), 422, "validation_error"
    )
    assert "dead_letter_queue" in str(body["errors"])
    assert admin.get("/queues/self").status_code == 404
    # ... and before the 409 of a re-declaration with other properties.
    admin.put("/queues/self", json={"max_delivery_count": 5})
    r = admin.put("/queues/self", json={"dead_letter_queue": "self"})
    assert_problem(r, 422, "validation_error")

    # Missing: 404, naming it; nothing created.
    body = assert_problem(
        admin.put("/queues/work", json={"dead_letter_queue": "ghost"}), 404, "not_found"
    )
    assert "ghost" in body["detail"]
    assert admin.get("/queues/work").status_code == 404

    admin.put("/queues/dlq")
    r = admin.put("/queues/work", json={"dead_letter_queue": "dlq"})
    assert r.status_code == 201
    assert r.json()["dead_letter_queue"] == "dlq"
    assert admin.put("/queues/work2", json={"dead_letter_queue": "dlq"}).status_code == 201

    # Referenced: deleting it is 409, naming every referring queue; nothing deleted.
    body = assert_problem(admin.delete("/queues/dlq"), 409, "precondition_failed")
    assert "work" in body["detail"]
    assert "work2" in body["detail"]
    assert admin.get("/queues/dlq").status_code == 200
    assert admin.delete("/queues/work").status_code == 204
    body = assert_problem(admin.delete("/queues/dlq"), 409, "precondition_failed")
    assert "work2" in body["detail"]
    assert admin.delete("/queues/work2").status_code == 204
    assert admin.delete("/queues/dlq").status_code == 204


def test_dead_letter_queue_of_a_re_declaration_must_exist_too(admin: httpx.Client) -> None:
    admin.put("/queues/dlq")
    admin.put("/queues/work", json={"dead_letter_queue": "dlq"})
    assert_problem(admin.put("/queues/work", json={"dead_letter_queue": "gone"}), 404, "not_found")
    r = admin.put("/queues/work", json={"dead_letter_queue": "dlq"})
    assert r.status_code == 200


# --------------------------------------------------------------------------- stats


def test_stats_per_status(admin: httpx.Client, database_url: str) -> None:
    admin.put("/queues/busy")
    admin.put("/queues/idle")
    add_messages(database_url, "busy", "ready", 2)
    add_messages(database_url, "busy", "delayed", 3)
    add_messages(database_url, "busy", "in_flight", 4)
    add_messages(database_url, "busy", "dead", 5)
    live = add_process(database_url)
    stale = add_process(database_url, stale=True)
    add_subscription(database_url, "busy", live)
    add_subscription(database_url, "busy", live)
    add_subscription(database_url, "busy", stale)  # its process stopped heartbeating
    add_subscription(database_url, "idle", stale)

    expected = {"ready": 2, "delayed": 3, "in_flight": 4, "dead": 5, "consumers": 2}
    assert admin.get("/queues/busy").json()["stats"] == expected
    assert admin.get("/queues/idle").json()["stats"] == ZERO
    listed = {q["name"]: q["stats"] for q in admin.get("/queues").json()["items"]}
    assert listed == {"busy": expected, "idle": ZERO}
    # A re-declaration answers with the current stats too.
    assert admin.put("/queues/busy").json()["stats"] == expected


def test_delayed_becomes_ready_by_the_database_clock(
    admin: httpx.Client, database_url: str
) -> None:
    admin.put("/queues/later")
    add_messages(database_url, "later", "delayed", 1)
    assert admin.get("/queues/later").json()["stats"]["delayed"] == 1
    sql(database_url, "UPDATE messages SET available_at = now() - interval '1 millisecond'")
    stats = admin.get("/queues/later").json()["stats"]
    assert (stats["ready"], stats["delayed"]) == (1, 0)


# --------------------------------------------------------------------------- purge


def test_purge_removes_ready_delayed_and_dead_not_in_flight(
    admin: httpx.Client, database_url: str
) -> None:
    admin.put("/queues/p")
    admin.put("/queues/other")
    add_messages(database_url, "p", "ready", 2)
    add_messages(database_url, "p", "delayed", 3)
    add_messages(database_url, "p", "in_flight", 4)
    add_messages(database_url, "p", "dead", 5)
    add_messages(database_url, "other", "ready", 1)

    r = admin.post("/queues/p/purge")
    assert r.status_code == 200
    assert r.json() == {"purged": 10}
    assert admin.get("/queues/p").json()["stats"] == {**ZERO, "in_flight": 4}
    assert count_messages(database_url, "other") == 1
    assert admin.post("/queues/p/purge").json() == {"purged": 0}
    assert_problem(admin.post("/queues/ghost/purge"), 404, "not_found")


# --------------------------------------------------------------------------- delete


def test_delete_takes_messages_and_bindings_along(admin: httpx.Client, database_url: str) -> None:
    admin.put("/queues/gone")
    admin.put("/queues/stays")
    admin.put("/exchanges/ex", json={"type": "direct"})
    admin.post("/bindings", json={"exchange": "ex", "queue": "gone"})
    admin.post("/bindings", json={"exchange": "ex", "queue": "stays"})
    for status in ("ready", "in_flight", "dead"):
        add_messages(database_url, "gone", status, 2)
    add_messages(database_url, "stays", "ready", 1)
    add_subscription(database_url, "gone", add_process(database_url))

    r = admin.delete("/queues/gone")
    assert r.status_code == 204
    assert r.content == b""
    assert_problem(admin.get("/queues/gone"), 404, "not_found")
    assert count_messages(database_url) == 1
    assert [b["queue"] for b in admin.get("/bindings").json()["items"]] == ["stays"]
    assert sql(database_url, "SELECT count(*) FROM subscriptions")[0][0] == 0
    assert admin.get("/exchanges/ex").status_code == 200
    assert_problem(admin.delete("/queues/gone"), 404, "not_found")


def test_delete_if_empty(admin: httpx.Client, database_url: str) -> None:
    admin.put("/queues/q")
    for status in ("ready", "delayed", "in_flight", "dead"):
        add_messages(database_url, "q", status, 1)
        body = assert_problem(
            admin.delete("/queues/q", params={"if_empty": "true"}), 409, "precondition_failed"
        )
        assert "q" in body["detail"]
        sql(database_url, "DELETE FROM messages")
    assert admin.delete("/queues/q", params={"if_empty": "true"}).status_code == 204


def test_delete_if_unused(admin: httpx.Client, database_url: str) -> None:
    admin.put("/queues/q")
    add_messages(database_url, "q", "ready", 1)
    add_subscription(database_url, "q", add_process(database_url, stale=True))
    add_subscription(database_url, "q", add_process(database_url))
    assert_problem(
        admin.delete("/queues/q", params={"if_unused": "true"}), 409, "precondition_failed"
    )
    # Only the stale one left: not a consumer. Messages do not matter to if_unused.
    sql(
        database_url,
        "DELETE FROM broker_processes WHERE heartbeat_at > now() - interval '15 seconds'",
    )
    assert_problem(
        admin.delete("/queues/q", params={"if_unused": "true", "if_empty": "true"}),
        409,
        "precondition_failed",
    )
    assert admin.delete("/queues/q", params={"if_unused": "true"}).status_code == 204


# --------------------------------------------------------------------------- list


def test_list_pagination_in_byte_order(admin: httpx.Client, database_url: str) -> None:
    all_names = ["b", "B", "a", "Z", "a.b", "a-b", "0", "a:b", "a_b"]
    for name in all_names:
        assert admin.put(f"/queues/{name}").status_code == 201
    add_messages(database_url, "Z", "ready", 2)
    expected = sorted(all_names, key=str.encode)
    assert expected[:4] == ["0", "B", "Z", "a"]

    assert names(admin.get("/queues").json()) == expected
    seen: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if after is not None:
            params["after"] = after
        page = admin.get("/queues", params=params).json()
        seen += names(page)
        for item in page["items"]:
            assert item["stats"]["ready"] == (2 if item["name"] == "Z" else 0)
        if page["next_after"] is None:
            break
        assert len(page["items"]) == 2
        assert page["next_after"] == page["items"][-1]["name"]
        after = page["next_after"]
    assert seen == expected
    assert admin.get("/queues", params={"after": "B", "limit": 1}).json() == {
        "items": [admin.get("/queues/Z").json()],
        "next_after": "Z",
    }
    for params in ({"limit": 0}, {"limit": 1001}, {"after": "not valid"}):
        assert_problem(admin.get("/queues", params=params), 422, "validation_error")


# --------------------------------------------------------------------------- permissions


def test_unauthenticated_is_401(anon: httpx.Client) -> None:
    for r in (
        anon.get("/queues"),
        anon.get("/queues/q"),
        anon.put("/queues/q"),
        anon.delete("/queues/q"),
        anon.post("/queues/q/purge"),
    ):
        assert_problem(r, 401, "unauthorized")


def test_permission_matrix(admin: httpx.Client, make_user: UserFactory, database_url: str) -> None:
    for name in ("app.jobs", "app.dlq", "other", "readable", "writable"):
        admin.put(f"/queues/{name}")
    add_messages(database_url, "readable", "ready", 1)
    bob = make_user("bob", configure=r"app\..*", write="writable|app\\.dlq", read="readable")
    nobody = make_user("nobody")

    assert names(bob.get("/queues").json()) == ["app.dlq", "app.jobs", "readable", "writable"]
    assert names(nobody.get("/queues").json()) == []
    assert bob.get("/queues/readable").json()["stats"]["ready"] == 1
    assert bob.get("/queues/writable").status_code == 200
    assert_problem(bob.get("/queues/other"), 403, "forbidden")
    assert_problem(bob.get("/queues/ghost"), 403, "forbidden")
    assert_problem(bob.get("/queues/app.ghost"), 404, "not_found")

    # configure: declare, delete, purge.
    assert bob.put("/queues/app.new").status_code == 201
    assert_problem(bob.put("/queues/readable"), 403, "forbidden")
    assert_problem(bob.post("/queues/readable/purge"), 403, "forbidden")
    assert_problem(bob.delete("/queues/readable"), 403, "forbidden")
    assert count_messages(database_url, "readable") == 1
    assert bob.post("/queues/app.jobs/purge").json() == {"purged": 0}
    assert bob.delete("/queues/app.new").status_code == 204

    # A dead-letter queue needs write permission on it.
    r = bob.put("/queues/app.a", json={"dead_letter_queue": "readable"})
    assert_problem(r, 403, "forbidden")
    assert bob.put("/queues/app.a", json={"dead_letter_queue": "app.dlq"}).status_code == 201
    assert bob.put("/queues/app.b", json={"dead_letter_queue": "writable"}).status_code == 201
