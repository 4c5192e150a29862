"""Browsing, reading and deleting stored messages through the real server (contract §5, §12)."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.support import LiveServer, client

ITEM_KEYS = {
    "id",
    "message_id",
    "status",
    "routing_key",
    "exchange",
    "headers",
    "properties",
    "delivery_count",
    "created_at",
    "available_at",
}


def sql(server: LiveServer, query: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        assert server.settings.database_url is not None
        conn = await asyncpg.connect(asyncpg_dsn(server.settings.database_url))
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def count(server: LiveServer) -> int:
    return int(sql(server, "SELECT count(*) FROM messages")[0][0])


def put_queue(admin: httpx.Client, name: str) -> None:
    r = admin.put(f"/queues/{name}", json={})
    assert r.status_code == 201, r.text


def send(admin: httpx.Client, queue: str, **message: Any) -> str:
    if "body_base64" not in message:
        message.setdefault("body", None)
    r = admin.post(f"/queues/{queue}/messages", json=message)
    assert r.status_code == 200, r.text
    message_id: str = r.json()["message_id"]
    return message_id


def ids(server: LiveServer, queue: str) -> list[int]:
    rows = sql(
        server,
        "SELECT m.id FROM messages m JOIN queues q ON q.id = m.queue_id WHERE q.name = $1 "
        "ORDER BY m.id",
        queue,
    )
    return [row[0] for row in rows]


def mark(server: LiveServer, message_id: int, status: str) -> None:
    """Put a row in another status, as a claim or the retry path would."""
    if status == "in_flight":
        sql(
            server,
            "UPDATE messages SET status = 'in_flight', delivery_tag = id::text || '.t', "
            "lease_expires_at = now() + interval '1 hour', delivered_at = now(), "
            "delivery_count = delivery_count + 1 WHERE id = $1",
            message_id,
        )
    else:
        sql(server, "UPDATE messages SET status = $2 WHERE id = $1", message_id, status)


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = r.json()
    assert problem["code"] == code
    return problem


def parse_time(value: str) -> datetime:
    assert value.endswith("Z"), value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.fixture
def four_states(admin: httpx.Client, server: LiveServer) -> list[int]:
    """Queue "q" with one message in each status: ready, delayed, in_flight, dead (by id)."""
    put_queue(admin, "q")
    send(admin, "q", body="ready")
    send(admin, "q", body="delayed", delay_ms=3_600_000)
    send(admin, "q", body="in_flight")
    send(admin, "q", body="dead")
    message_ids = ids(server, "q")
    mark(server, message_ids[2], "in_flight")
    mark(server, message_ids[3], "dead")
    return message_ids


# ----------------------------------------------------------------------------- browse


def test_browse_shows_every_status_without_consuming(
    admin: httpx.Client, server: LiveServer, four_states: list[int]
) -> None:
    r = admin.get("/queues/q/messages")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    page = r.json()
    assert page["next_after"] is None
    items = page["items"]
    assert [item["id"] for item in items] == four_states
    assert [item["status"] for item in items] == ["ready", "delayed", "in_flight", "dead"]
    assert [item["body"] for item in items] == ["ready", "delayed", "in_flight", "dead"]
    assert [item["delivery_count"] for item in items] == [0, 0, 1, 0]
    for item in items:
        assert set(item) == ITEM_KEYS | {"body"}
        assert item["exchange"] == ""
        assert item["routing_key"] == "q"
        assert item["properties"] == {"message_id": item["message_id"]}
    # browsing consumed nothing and changed nothing
    assert admin.get("/queues/q/messages").json() == page


def test_browse_filters_by_status(
    admin: httpx.Client, server: LiveServer, four_states: list[int]
) -> None:
    for index, status in enumerate(["ready", "delayed", "in_flight", "dead"]):
        items = admin.get("/queues/q/messages", params={"status": status}).json()["items"]
        assert [item["id"] for item in items] == [four_states[index]], status
        assert items[0]["status"] == status


def test_a_delayed_message_becomes_ready_when_due(admin: httpx.Client, server: LiveServer) -> None:
    put_queue(admin, "d")
    send(admin, "d", delay_ms=60_000)
    (item,) = admin.get("/queues/d/messages").json()["items"]
    assert item["status"] == "delayed"
    delay = parse_time(item["available_at"]) - parse_time(item["created_at"])
    assert delay.total_seconds() == pytest.approx(60.0, abs=0.001)
    # move the row's clock back instead of waiting: due on the database clock now
    sql(server, "UPDATE messages SET available_at = now() - interval '1 ms'")
    (item,) = admin.get("/queues/d/messages").json()["items"]
    assert item["status"] == "ready"


def test_browse_is_keyset_paginated_by_id(admin: httpx.Client, server: LiveServer) -> None:
    put_queue(admin, "p")
    put_queue(admin, "other")
    for n in range(5):
        send(admin, "p", body=n)
        send(admin, "other", body=n)
    expected = ids(server, "p")
    seen: list[int] = []
    after: int | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if after is not None:
            params["after"] = after
        page = admin.get("/queues/p/messages", params=params).json()
        pages += 1
        seen.extend(item["id"] for item in page["items"])
        if page["next_after"] is None:
            assert len(page["items"]) < 2
            break
        assert page["next_after"] == page["items"][-1]["id"]
        after = page["next_after"]
    assert seen == expected
    assert pages == 3
    # a full last page may carry a cursor whose next page is empty
    page = admin.get("/queues/p/messages", params={"limit": 5}).json()
    assert page["next_after"] == expected[-1]
    assert admin.get("/queues/p/messages", params={"after": expected[-1]}).json() == {
        "items": [],
        "next_after": None,
    }


def test_browse_round_trips_null_binary_and_big_numbers(
    admin: httpx.Client, server: LiveServer
) -> None:
    put_queue(admin, "b")
    raw = bytes(range(256))
    encoded = base64.b64encode(raw).decode()
    send(admin, "b", body=None)
    send(admin, "b", body_base64=encoded)
    send(admin, "b", body_base64="")
    send(admin, "b", body={"nested": [1, 2.5, "é", {"ok": True}], "empty": {}})
    big = 2**90 + 1
    r = admin.post(
        "/queues/b/messages",
        content=f'{{"body": {big}, "headers": {{"big": {big}, "list": [null, false]}}}}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text
    items = admin.get("/queues/b/messages").json()["items"]
    assert "body" in items[0]
    assert items[0]["body"] is None
    assert "body_base64" not in items[0]
    assert items[1]["body_base64"] == encoded
    assert "body" not in items[1]
    assert items[2]["body_base64"] == ""
    assert items[3]["body"] == {"nested": [1, 2.5, "é", {"ok": True}], "empty": {}}
    assert items[4]["body"] == big  # httpx decodes with the stdlib: exact
    assert items[4]["headers"] == {"big": big, "list": [None, False]}
    # the single-message read renders the same way
    for item in items:
        assert admin.get(f"/queues/b/messages/{item['id']}").json() == item


def test_browse_times_are_rfc3339_utc_from_the_database_clock(
    admin: httpx.Client, server: LiveServer
) -> None:
    put_queue(admin, "t")
    send(admin, "t")
    (item,) = admin.get("/queues/t/messages").json()["items"]
    (db_now,) = sql(server, "SELECT now()")[0]
    created = parse_time(item["created_at"])
    assert created.tzinfo == UTC
    assert abs((db_now - created).total_seconds()) < 10
    assert item["available_at"] == item["created_at"]


def test_browse_errors(admin: httpx.Client, server: LiveServer) -> None:
    put_queue(admin, "q")
    assert_problem(admin.get("/queues/missing/messages"), 404, "not_found")
    for params in (
        {"status": "sleeping"},
        {"limit": 0},
        {"limit": 1001},
        {"limit": "x"},
        {"after": -1},
        {"after": "abc"},
        {"after": 2**63},
    ):
        assert_problem(admin.get("/queues/q/messages", params=params), 422, "validation_error")
    assert admin.get("/queues/q/messages", params={"limit": 1000}).status_code == 200


# ----------------------------------------------------------------------------- one message


def test_get_one_message_in_any_status(
    admin: httpx.Client, server: LiveServer, four_states: list[int]
) -> None:
    for message_id, status in zip(
        four_states, ["ready", "delayed", "in_flight", "dead"], strict=True
    ):
        r = admin.get(f"/queues/q/messages/{message_id}")
        assert r.status_code == 200, r.text
        assert r.json()["id"] == message_id
        assert r.json()["status"] == status
        assert set(r.json()) == ITEM_KEYS | {"body"}


def test_get_one_message_errors(admin: httpx.Client, server: LiveServer) -> None:
    put_queue(admin, "a")
    put_queue(admin, "b")
    send(admin, "a")
    (in_a,) = ids(server, "a")
    assert_problem(admin.get(f"/queues/b/messages/{in_a}"), 404, "not_found")  # other queue
    assert_problem(admin.get(f"/queues/a/messages/{in_a + 1000}"), 404, "not_found")
    assert_problem(admin.get(f"/queues/missing/messages/{in_a}"), 404, "not_found")
    for bad in ("0", str(2**63)):
        assert_problem(admin.get(f"/queues/a/messages/{bad}"), 422, "validation_error")
    # not digits: no such message path (§17's /messages/query, /move, /delete live beside it)
    for bad in ("abc", "1.5"):
        assert_problem(admin.get(f"/queues/a/messages/{bad}"), 404, "not_found")


def test_delete_one_message_whatever_its_status(
    admin: httpx.Client, server: LiveServer, four_states: list[int]
) -> None:
    for message_id in four_states:
        r = admin.delete(f"/queues/q/messages/{message_id}")
        assert r.status_code == 204, r.text
        assert r.content == b""
        assert_problem(admin.get(f"/queues/q/messages/{message_id}"), 404, "not_found")
        assert_problem(admin.delete(f"/queues/q/messages/{message_id}"), 404, "not_found")
    assert count(server) == 0


def test_deleting_an_in_flight_message_tells_the_listeners(
    admin: httpx.Client, server: LiveServer, four_states: list[int]
) -> None:
    deleted: list[Any] = []
    server.services.browser.add_deleted_listener(deleted.append)
    ready, delayed, in_flight, dead = four_states
    for message_id in (ready, delayed, dead):
        assert admin.delete(f"/queues/q/messages/{message_id}").status_code == 204
    assert deleted == []  # only an in-flight copy holds a consumer's prefetch slot
    assert admin.delete(f"/queues/q/messages/{in_flight}").status_code == 204
    (gone,) = deleted
    assert gone.status == "in_flight"
    assert gone.delivery_tag == f"{in_flight}.t"
    assert gone.queue_id == sql(server, "SELECT id FROM queues WHERE name = 'q'")[0][0]


def test_delete_only_touches_that_queue(admin: httpx.Client, server: LiveServer) -> None:
    put_queue(admin, "a")
    put_queue(admin, "b")
    send(admin, "a")
    send(admin, "b")
    (in_a,) = ids(server, "a")
    assert_problem(admin.delete(f"/queues/b/messages/{in_a}"), 404, "not_found")
    assert_problem(admin.delete(f"/queues/missing/messages/{in_a}"), 404, "not_found")
    assert count(server) == 2
    assert admin.delete(f"/queues/a/messages/{in_a}").status_code == 204
    assert ids(server, "a") == []
    assert len(ids(server, "b")) == 1


# ----------------------------------------------------------------------------- permissions


def make_user(
    admin: httpx.Client, server: LiveServer, name: str, **permissions: str
) -> httpx.Client:
    perms = {"configure": "", "write": "", "read": ""} | permissions
    r = admin.put(
        f"/users/{name}",
        json={"password": f"{name}-password", "role": "user", "permissions": perms},
    )
    assert r.status_code == 201, r.text
    return client(server.base_url, auth=(name, f"{name}-password"))


def test_browse_and_get_need_read_delete_needs_configure(
    admin: httpx.Client, server: LiveServer
) -> None:
    put_queue(admin, "q")
    send(admin, "q")
    (message_id,) = ids(server, "q")
    one = f"/queues/q/messages/{message_id}"
    with make_user(admin, server, "writer", write="^q$") as writer:
        assert_problem(writer.get("/queues/q/messages"), 403, "forbidden")
        assert_problem(writer.get(one), 403, "forbidden")
        assert_problem(writer.delete(one), 403, "forbidden")
    with make_user(admin, server, "reader", read="^q$") as reader:
        assert reader.get("/queues/q/messages").status_code == 200
        assert reader.get(one).status_code == 200
        assert_problem(reader.delete(one), 403, "forbidden")
        # refused before existence is revealed
        assert_problem(reader.get("/queues/nope/messages"), 403, "forbidden")
    with make_user(
        admin, server, "stranger", read="^other$", write="^other$", configure="^other$"
    ) as s:
        assert_problem(s.get("/queues/q/messages"), 403, "forbidden")
        assert_problem(s.get(one), 403, "forbidden")
        assert_problem(s.delete(one), 403, "forbidden")
    assert count(server) == 1
    with make_user(admin, server, "configurer", configure="^q$") as configurer:
        assert_problem(configurer.get("/queues/q/messages"), 403, "forbidden")
        assert_problem(configurer.get(one), 403, "forbidden")
        assert configurer.delete(one).status_code == 204
    assert count(server) == 0


def test_browse_needs_credentials(anon: httpx.Client, server: LiveServer) -> None:
    assert_problem(anon.get("/queues/q/messages"), 401, "unauthorized")
    assert_problem(anon.get("/queues/q/messages/1"), 401, "unauthorized")
    assert_problem(anon.delete("/queues/q/messages/1"), 401, "unauthorized")


def test_a_write_only_user_cannot_read_a_message_body(
    admin: httpx.Client, server: LiveServer
) -> None:
    """Issue 18, finding 5: message ids are sequential, and a user with write on `secret`
    only read any message's body with GET /queues/secret/messages/{id} (200 on main, where
    "some permission" was enough). Contract §12: reading content needs read."""
    put_queue(admin, "secret")
    send(admin, "secret", body={"card": "4111-1111"})
    (message_id,) = ids(server, "secret")
    with make_user(admin, server, "pub", write="^secret$") as pub:
        assert pub.post("/queues/secret/messages", json={"body": 1}).status_code == 200
        refused = pub.get(f"/queues/secret/messages/{message_id}")
        assert_problem(refused, 403, "forbidden")
        assert "4111" not in refused.text
        assert_problem(pub.get("/queues/secret/messages"), 403, "forbidden")
