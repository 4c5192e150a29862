"""Publishing through the real server (contract §1, §7, §12): routing, confirms, errors."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.support import LiveServer, client, running_server
from tests.support import test_settings as settings_for
from tests.wsclient import WsClient

# ----------------------------------------------------------------------------- helpers


def sql(server: LiveServer, query: str, *args: Any) -> list[asyncpg.Record]:
    """Rows of one query on the server's database (to check what was stored)."""

    async def run() -> list[asyncpg.Record]:
        assert server.settings.database_url is not None
        conn = await asyncpg.connect(asyncpg_dsn(server.settings.database_url))
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def stored(server: LiveServer, queue: str | None = None) -> list[asyncpg.Record]:
    """Stored copies (of one queue, or all), by id."""
    return sql(
        server,
        "SELECT m.*, q.name AS queue FROM messages m JOIN queues q ON q.id = m.queue_id "
        "WHERE $1::text IS NULL OR q.name = $1 ORDER BY m.id",
        queue,
    )


def count(server: LiveServer) -> int:
    return int(sql(server, "SELECT count(*) FROM messages")[0][0])


def declare(
    admin: httpx.Client,
    exchanges: dict[str, str] | None = None,
    queues: tuple[str, ...] = (),
    bindings: tuple[tuple[str, str, str, dict[str, Any]], ...] = (),
) -> None:
    for name, kind in (exchanges or {}).items():
        r = admin.put(f"/exchanges/{name}", json={"type": kind})
        assert r.status_code == 201, r.text
    for name in queues:
        r = admin.put(f"/queues/{name}", json={})
        assert r.status_code == 201, r.text
    for exchange, queue, key, arguments in bindings:
        r = admin.post(
            "/bindings",
            json={"exchange": exchange, "queue": queue, "routing_key": key, "arguments": arguments},
        )
        assert r.status_code == 201, r.text


def bind(
    exchange: str, queue: str, key: str = "", /, **arguments: Any
) -> tuple[str, str, str, Any]:
    return (exchange, queue, key, arguments)


def publish(admin: httpx.Client, exchange: str, **message: Any) -> httpx.Response:
    if "body_base64" not in message:
        message.setdefault("body", {"n": 1})
    return admin.post(f"/exchanges/{exchange}/publish", json=message)


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = r.json()
    assert problem["code"] == code
    assert problem["status"] == status
    assert {"type", "title", "detail"} <= problem.keys()
    return problem


@pytest.fixture
def fanout3(admin: httpx.Client) -> tuple[str, ...]:
    queues = ("q1", "q2", "q3")
    declare(admin, {"fan": "fanout"}, queues, tuple(bind("fan", q) for q in queues))
    return queues


# ----------------------------------------------------------------------------- routing


def test_direct_exchange_routes_by_equal_key(admin: httpx.Client, server: LiveServer) -> None:
    declare(
        admin,
        {"dx": "direct"},
        ("qa", "qb", "qab"),
        (
            bind("dx", "qa", "a"),
            bind("dx", "qb", "b"),
            bind("dx", "qab", "a"),
            bind("dx", "qab", "b"),
        ),
    )
    r = publish(admin, "dx", routing_key="a", body={"k": "a"})
    assert r.status_code == 200, r.text
    assert r.json()["routed"] is True
    assert r.json()["queues"] == ["qa", "qab"]
    assert publish(admin, "dx", routing_key="A").json()["queues"] == []  # case-sensitive
    rows = stored(server)
    assert [(row["queue"], row["routing_key"], row["exchange"]) for row in rows] == [
        ("qa", "a", "dx"),
        ("qab", "a", "dx"),
    ]
    assert all(row["status"] == "ready" and not row["binary"] for row in rows)
    assert rows[0]["body"] == b'{"k":"a"}'


def test_fanout_exchange_routes_to_every_bound_queue(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    r = publish(admin, "fan", routing_key="ignored")
    assert r.json()["queues"] == list(fanout3)
    assert [row["queue"] for row in stored(server)] == list(fanout3)


def test_topic_exchange_routes_by_pattern(admin: httpx.Client, server: LiveServer) -> None:
    patterns = {"t_star": "a.*", "t_hash": "a.#", "t_all": "#", "t_other": "b.*", "t_exact": "a.b"}
    declare(
        admin,
        {"tx": "topic"},
        tuple(patterns),
        tuple(bind("tx", q, key) for q, key in patterns.items()),
    )
    assert publish(admin, "tx", routing_key="a.b").json()["queues"] == [
        "t_star",
        "t_hash",
        "t_all",
        "t_exact",
    ]
    assert publish(admin, "tx", routing_key="a.b.c").json()["queues"] == ["t_hash", "t_all"]
    assert publish(admin, "tx", routing_key="").json()["queues"] == ["t_all"]
    assert publish(admin, "tx", routing_key="b.").json()["queues"] == ["t_all", "t_other"]
    assert len(stored(server, "t_all")) == 4


def test_headers_exchange_routes_on_json_values(admin: httpx.Client, server: LiveServer) -> None:
    declare(
        admin,
        {"hx": "headers"},
        ("h_all", "h_any", "h_none"),
        (
            bind("hx", "h_all", "ignored", **{"x-match": "all", "kind": "a", "n": 1}),
            bind("hx", "h_any", **{"x-match": "any", "kind": "a", "n": 2}),
            bind("hx", "h_none", **{"kind": "b"}),
        ),
    )
    assert publish(admin, "hx", headers={"kind": "a", "n": 1.0}).json()["queues"] == [
        "h_all",
        "h_any",
    ]
    assert publish(admin, "hx", headers={"kind": "z", "n": 2}).json()["queues"] == ["h_any"]
    assert publish(admin, "hx", headers={"kind": "a", "n": "1"}).json()["queues"] == ["h_any"]
    assert publish(admin, "hx", headers={}).json()["queues"] == []
    assert [row["queue"] for row in stored(server)] == ["h_all", "h_any", "h_any", "h_any"]


def test_builtin_exchanges_route(admin: httpx.Client, server: LiveServer) -> None:
    declare(admin, None, ("bq",), (bind("amq.topic", "bq", "logs.#"),))
    assert publish(admin, "amq.topic", routing_key="logs.error").json()["queues"] == ["bq"]


def test_a_queue_matched_by_two_bindings_gets_one_copy(
    admin: httpx.Client, server: LiveServer
) -> None:
    declare(
        admin,
        {"tx2": "topic"},
        ("dup", "other"),
        (bind("tx2", "dup", "a.*"), bind("tx2", "other", "#"), bind("tx2", "dup", "#")),
    )
    r = publish(admin, "tx2", routing_key="a.b")
    assert r.json()["queues"] == ["dup", "other"]
    assert [row["queue"] for row in stored(server)] == ["dup", "other"]


def test_no_match_is_routed_false_and_stores_nothing(
    admin: httpx.Client, server: LiveServer
) -> None:
    declare(admin, {"lonely": "direct"}, ("q",), (bind("lonely", "q", "k"),))
    r = publish(admin, "lonely", routing_key="other")
    assert r.status_code == 200
    body = r.json()
    assert body["routed"] is False
    assert body["queues"] == []
    uuid.UUID(body["message_id"])
    declare(admin, {"unbound": "fanout"})
    assert publish(admin, "unbound").json()["routed"] is False
    assert count(server) == 0


def test_mandatory_unroutable_is_422_and_stores_nothing(
    admin: httpx.Client, server: LiveServer
) -> None:
    declare(admin, {"m": "direct"}, ("q",), (bind("m", "q", "k"),))
    assert_problem(publish(admin, "m", routing_key="nope", mandatory=True), 422, "unroutable")
    assert count(server) == 0
    assert publish(admin, "m", routing_key="k", mandatory=True).json()["routed"] is True
    assert count(server) == 1


def test_missing_exchange_or_queue_is_404(admin: httpx.Client, server: LiveServer) -> None:
    assert_problem(publish(admin, "nope"), 404, "not_found")
    assert_problem(
        admin.post("/exchanges/nope/publish-batch", json={"messages": [{"body": 1}]}),
        404,
        "not_found",
    )
    assert_problem(admin.post("/queues/nope/messages", json={"body": 1}), 404, "not_found")
    # a name no exchange can have, in the path
    assert admin.post("/exchanges/-bad/publish", json={"body": 1}).status_code in (404, 422)


# ----------------------------------------------------------------------------- message ids


def test_message_id_is_generated_and_shared_by_all_copies(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    first = publish(admin, "fan").json()["message_id"]
    second = publish(admin, "fan").json()["message_id"]
    assert first != second
    uuid.UUID(first)
    rows = stored(server)
    assert len(rows) == 6
    assert {row["message_id"] for row in rows[:3]} == {first}
    assert {row["message_id"] for row in rows[3:]} == {second}
    assert len({row["id"] for row in rows}) == 6


def test_given_message_id_is_kept_and_stored_in_properties(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    props = {"message_id": "order-42", "correlation_id": "c", "reply_to": "r", "content_type": "t"}
    r = publish(admin, "fan", properties=props)
    assert r.json()["message_id"] == "order-42"
    for row in stored(server):
        assert row["message_id"] == "order-42"
        assert sql(server, "SELECT properties FROM messages WHERE id = $1", row["id"])[0][0] == (
            '{"reply_to": "r", "message_id": "order-42", "content_type": "t", '
            '"correlation_id": "c"}'
        )


def test_generated_message_id_is_written_into_properties(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    r = publish(admin, "fan", properties={"content_type": "application/json", "reply_to": None})
    message_id = r.json()["message_id"]
    browse = admin.get("/queues/q2/messages").json()["items"]
    assert browse[0]["properties"] == {"message_id": message_id, "content_type": "application/json"}


# ----------------------------------------------------------------------------- bodies and delay


def test_binary_and_null_bodies_are_stored_as_bytes(
    admin: httpx.Client, server: LiveServer
) -> None:
    declare(admin, None, ("bin",))
    raw = bytes(range(256))
    r = admin.post("/queues/bin/messages", json={"body_base64": base64.b64encode(raw).decode()})
    assert r.status_code == 200, r.text
    admin.post("/queues/bin/messages", json={"body": None})
    rows = stored(server, "bin")
    assert (rows[0]["body"], rows[0]["binary"]) == (raw, True)
    assert (rows[1]["body"], rows[1]["binary"]) == (b"null", False)


def test_delay_makes_the_copies_available_later_on_the_database_clock(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    r = publish(admin, "fan", delay_ms=90_000)
    assert r.status_code == 200
    rows = sql(
        server,
        "SELECT extract(epoch FROM available_at - created_at)::float8 AS delay, "
        "extract(epoch FROM available_at - now())::float8 AS remaining FROM messages",
    )
    assert len(rows) == 3
    for row in rows:
        assert row["delay"] == pytest.approx(90.0, abs=0.001)
        assert 80 < row["remaining"] <= 90
    items = admin.get("/queues/q1/messages", params={"status": "delayed"}).json()["items"]
    assert len(items) == 1
    assert admin.get("/queues/q1/messages", params={"status": "ready"}).json()["items"] == []


def test_maximum_delay_is_accepted(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    assert publish(admin, "fan", delay_ms=604_800_000).status_code == 200


# ----------------------------------------------------------------------------- direct to queue


def test_publish_to_queue_uses_the_default_exchange(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    r = admin.post(
        "/queues/q2/messages",
        json={"body": "hi", "routing_key": "ignored", "properties": {"message_id": "d-1"}},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "routed": True,
        "queues": ["q2"],
        "message_id": "d-1",
        "rejected": [],
        "duplicates": [],
    }
    rows = stored(server)
    assert [(row["queue"], row["exchange"], row["routing_key"]) for row in rows] == [
        ("q2", "", "q2")
    ]


def test_publish_to_queue_honours_delay(admin: httpx.Client, server: LiveServer) -> None:
    declare(admin, None, ("dq",))
    admin.post("/queues/dq/messages", json={"body": 1, "delay_ms": 60_000})
    assert admin.get("/queues/dq/messages").json()["items"][0]["status"] == "delayed"


# ----------------------------------------------------------------------------- batches


def test_batch_results_are_in_order_and_ids_follow_batch_order(
    admin: httpx.Client, server: LiveServer
) -> None:
    declare(
        admin,
        {"bx": "direct"},
        ("b1", "b2"),
        (
            bind("bx", "b1", "one"),
            bind("bx", "b2", "two"),
            bind("bx", "b1", "both"),
            bind("bx", "b2", "both"),
        ),
    )
    keys = ["one", "two", "both", "none", "one", "both"]
    messages = [{"routing_key": k, "body": i} for i, k in enumerate(keys)]
    messages[3]["properties"] = {"message_id": "fourth"}
    r = admin.post("/exchanges/bx/publish-batch", json={"messages": messages})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [res["queues"] for res in results] == [
        ["b1"],
        ["b2"],
        ["b1", "b2"],
        [],
        ["b1"],
        ["b1", "b2"],
    ]
    assert [res["routed"] for res in results] == [True, True, True, False, True, True]
    assert results[3]["message_id"] == "fourth"
    assert len({res["message_id"] for res in results}) == 6
    # within each queue, ids (the claim order for equal available_at) follow the batch order
    assert [row["body"] for row in stored(server, "b1")] == [b"0", b"2", b"4", b"5"]
    assert [row["body"] for row in stored(server, "b2")] == [b"1", b"2", b"5"]
    assert len({row["created_at"] for row in stored(server)}) == 1  # one transaction


def test_batch_with_one_invalid_item_is_422_pointing_at_it(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    messages: list[dict[str, Any]] = [{"body": 1}, {"body": 2}, {"body_base64": "%%%"}, {"body": 3}]
    problem = assert_problem(
        admin.post("/exchanges/fan/publish-batch", json={"messages": messages}),
        422,
        "validation_error",
    )
    assert problem["errors"]
    for error in problem["errors"]:
        assert "messages" in error["loc"]
        assert 2 in error["loc"]
    assert count(server) == 0
    messages[2] = {"body": 0, "delay_ms": "5"}
    problem = assert_problem(
        admin.post("/exchanges/fan/publish-batch", json={"messages": messages}),
        422,
        "validation_error",
    )
    assert problem["errors"][0]["loc"] == ["body", "messages", 2, "delay_ms"]
    assert count(server) == 0


def test_batch_with_one_unroutable_mandatory_item_stores_nothing(
    admin: httpx.Client, server: LiveServer
) -> None:
    declare(admin, {"bm": "direct"}, ("q",), (bind("bm", "q", "k"),))
    messages = [{"routing_key": "k", "body": 1}, {"routing_key": "x", "body": 2, "mandatory": True}]
    problem = assert_problem(
        admin.post("/exchanges/bm/publish-batch", json={"messages": messages}), 422, "unroutable"
    )
    assert "1" in problem["detail"]
    assert count(server) == 0


def test_batch_size_is_1_to_1000(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    for size in (0, 1001):
        r = admin.post("/exchanges/fan/publish-batch", json={"messages": [{"body": 1}] * size})
        assert_problem(r, 422, "validation_error")
    assert_problem(admin.post("/exchanges/fan/publish-batch", json={}), 422, "validation_error")
    assert count(server) == 0


def test_batch_of_1000_is_one_transaction(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    messages = [{"body": i, "routing_key": str(i)} for i in range(1000)]
    r = admin.post("/exchanges/fan/publish-batch", json={"messages": messages})
    assert r.status_code == 200, r.text
    assert len(r.json()["results"]) == 1000
    assert count(server) == 3000
    bodies = [row["body"] for row in stored(server, "q3")]
    assert bodies == [str(i).encode() for i in range(1000)]


# ----------------------------------------------------------------------------- validation


def post_raw(admin: httpx.Client, path: str, content: bytes) -> httpx.Response:
    return admin.post(path, content=content, headers={"Content-Type": "application/json"})


def test_malformed_json_is_400(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    for path in ("/exchanges/fan/publish", "/exchanges/fan/publish-batch", "/queues/q1/messages"):
        assert_problem(post_raw(admin, path, b'{"body": '), 400, "bad_request")
    assert count(server) == 0


INVALID_BODIES: list[tuple[str, dict[str, Any], str]] = [
    ("neither", {"routing_key": "k"}, "body"),
    ("both", {"body": 1, "body_base64": "AA=="}, "body"),
    ("both, body null", {"body": None, "body_base64": ""}, "body"),
    ("bad base64", {"body_base64": "not base64!"}, "body_base64"),
    ("unpadded base64", {"body_base64": "YWI"}, "body_base64"),
    ("base64 null", {"body_base64": None}, "body_base64"),
    ("delay float", {"body": 1, "delay_ms": 1.5}, "delay_ms"),
    ("delay integral float", {"body": 1, "delay_ms": 1000.0}, "delay_ms"),
    ("delay string", {"body": 1, "delay_ms": "10"}, "delay_ms"),
    ("delay bool", {"body": 1, "delay_ms": True}, "delay_ms"),
    ("delay negative", {"body": 1, "delay_ms": -1}, "delay_ms"),
    ("delay over 7 days", {"body": 1, "delay_ms": 604_800_001}, "delay_ms"),
    ("unknown property", {"body": 1, "properties": {"priority": "1"}}, "priority"),
    ("non-string property", {"body": 1, "properties": {"message_id": 5}}, "message_id"),
    ("empty message_id", {"body": 1, "properties": {"message_id": ""}}, "message_id"),
    ("headers not an object", {"body": 1, "headers": [1]}, "headers"),
    ("NUL in a header", {"body": 1, "headers": {"a": "x\u0000"}}, "headers"),
    ("NUL in the routing key", {"body": 1, "routing_key": "a\u0000"}, "routing_key"),
    ("mandatory not a bool", {"body": 1, "mandatory": "yes"}, "mandatory"),
    ("unknown field", {"body": 1, "priority": 5}, "priority"),
    ("routing key not a string", {"body": 1, "routing_key": 5}, "routing_key"),
]


def test_invalid_publish_bodies_are_422_and_store_nothing(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    for case, message, field in INVALID_BODIES:
        for path in ("/exchanges/fan/publish", "/queues/q1/messages"):
            problem = assert_problem(admin.post(path, json=message), 422, "validation_error")
            assert field in problem["errors"][0]["loc"], (case, problem)
        problem = assert_problem(
            admin.post("/exchanges/fan/publish-batch", json={"messages": [{"body": 0}, message]}),
            422,
            "validation_error",
        )
        assert problem["errors"][0]["loc"][:3] == ["body", "messages", 1], (case, problem)
        assert field in problem["errors"][0]["loc"], (case, problem)
    assert count(server) == 0


def test_non_finite_numbers_are_422(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    for literal in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):
        r = post_raw(admin, "/exchanges/fan/publish", b'{"body": {"x": [' + literal + b"]}}")
        assert assert_problem(r, 422, "validation_error")["errors"][0]["loc"] == ["body", "body"]
        r = post_raw(
            admin, "/exchanges/fan/publish", b'{"body": 1, "headers": {"x": ' + literal + b"}}"
        )
        assert assert_problem(r, 422, "validation_error")["errors"][0]["loc"] == [
            "body",
            "headers",
        ]
    assert count(server) == 0


def test_lone_surrogates_are_422(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    for content in (
        b'{"body": "\\ud800"}',
        b'{"body": 1, "routing_key": "\\udc00"}',
        b'{"body": 1, "headers": {"\\ud800": 1}}',
        b'{"body": 1, "properties": {"reply_to": "\\ud800"}}',
    ):
        assert_problem(post_raw(admin, "/exchanges/fan/publish", content), 422, "validation_error")
    assert count(server) == 0


def test_big_integers_survive_in_body_and_headers(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    big = 2**80 + 7
    content = f'{{"body": [{big}, -{big}], "headers": {{"n": {big}}}}}'.encode()
    assert post_raw(admin, "/exchanges/fan/publish", content).status_code == 200
    assert stored(server, "q1")[0]["body"] == f"[{big},-{big}]".encode()
    text = admin.get("/queues/q1/messages").text
    assert f'"body":[{big},-{big}]' in text.replace(" ", "")
    assert f'"n":{big}' in text.replace(" ", "")


# ----------------------------------------------------------------------------- size limit


@pytest.fixture
def small_server(database_url: str) -> Iterator[LiveServer]:
    with running_server(settings_for(database_url, max_message_bytes=100)) as live:
        yield live


def test_body_over_the_limit_is_413_and_stores_nothing(small_server: LiveServer) -> None:
    with client(small_server.base_url, auth=("admin", "admin-secret-password")) as admin:
        declare(admin, {"fan": "fanout"}, ("s1", "s2"), (bind("fan", "s1"), bind("fan", "s2")))
        exact = "x" * 98  # JSON-serialized: 100 bytes with its quotes
        assert publish(admin, "fan", body=exact).status_code == 200
        assert_problem(publish(admin, "fan", body=exact + "y"), 413, "message_too_large")
        # the decoded bytes count, not the base64 text
        assert (
            publish(admin, "fan", body_base64=base64.b64encode(b"z" * 100).decode()).status_code
            == 200
        )
        r = publish(admin, "fan", body_base64=base64.b64encode(b"z" * 101).decode())
        assert_problem(r, 413, "message_too_large")
        # non-ASCII counts in UTF-8 bytes: 49 times "é" = 98 bytes + quotes
        assert publish(admin, "fan", body="é" * 49).status_code == 200
        assert_problem(publish(admin, "fan", body="é" * 50), 413, "message_too_large")
        assert_problem(
            admin.post("/queues/s1/messages", json={"body": exact + "y"}), 413, "message_too_large"
        )
        batch = {"messages": [{"body": 1}, {"body": exact + "y"}, {"body": 2}]}
        problem = assert_problem(
            admin.post("/exchanges/fan/publish-batch", json=batch), 413, "message_too_large"
        )
        assert "1" in problem["detail"]
        assert count(small_server) == 6  # three accepted messages, two queues each


@pytest.fixture
def small_header_server(database_url: str) -> Iterator[LiveServer]:
    with running_server(settings_for(database_url, max_header_bytes=1024)) as live:
        yield live


def test_headers_and_properties_over_the_limit_are_413_and_store_nothing(
    small_header_server: LiveServer,
) -> None:
    """Issue 18, finding 9: only the body counted, so 8 MiB of headers with a 1-byte body
    was stored (200 on main) and then failed every consumer with a 1 MiB frame limit.
    Contract §1: headers and properties together, as compact JSON, within
    MESSAGEX_MAX_HEADER_BYTES (1 KiB here); REST, batch and WebSocket PUBLISH alike."""
    live = small_header_server
    properties = {"message_id": "m1"}  # with its own id the stored properties are known
    fixed = len(b'{"h":""}') + len(b'{"message_id":"m1"}')

    def message(n: int, **extra: Any) -> dict[str, Any]:
        return {"body": 1, "headers": {"h": "x" * n}, "properties": properties, **extra}

    exact = 1024 - fixed
    with client(live.base_url, auth=("admin", "admin-secret-password")) as admin:
        declare(admin, {"hfan": "fanout"}, ("h1",), (bind("hfan", "h1"),))
        assert publish(admin, "hfan", **message(exact)).status_code == 200
        assert_problem(publish(admin, "hfan", **message(exact + 1)), 413, "message_too_large")
        # properties count too, and non-ASCII in UTF-8 bytes
        r = publish(admin, "hfan", body=1, properties={"reply_to": "é" * 600})
        assert_problem(r, 413, "message_too_large")
        r = admin.post("/queues/h1/messages", json=message(exact + 1))
        assert_problem(r, 413, "message_too_large")
        batch = {"messages": [{"body": 1}, message(exact + 1, properties={})]}
        problem = assert_problem(
            admin.post("/exchanges/hfan/publish-batch", json=batch), 413, "message_too_large"
        )
        assert "message 1 of the batch" in problem["detail"]
        # the case: 8 MiB of headers, a 1-byte body
        r = publish(admin, "hfan", body=1, headers={"h": "x" * (8 * 1024 * 1024)})
        assert_problem(r, 413, "message_too_large")
        with WsClient.admin(live.ws_url) as ws:
            reply = ws.request({"type": "PUBLISH", "queue": "h1", **message(exact + 1)})
            assert reply["type"] == "ERROR", reply
            assert reply["code"] == "message_too_large", reply
            reply = ws.request({"type": "PUBLISH", "queue": "h1", **message(exact)})
            assert reply["type"] == "PUBLISHED", reply
        assert count(live) == 2  # the two at the limit, nothing else


# ----------------------------------------------------------------------------- permissions


def make_user(
    admin: httpx.Client, name: str, *, configure: str = "", write: str = "", read: str = ""
) -> None:
    r = admin.put(
        f"/users/{name}",
        json={
            "password": f"{name}-password",
            "role": "user",
            "permissions": {"configure": configure, "write": write, "read": read},
        },
    )
    assert r.status_code == 201, r.text


def test_publish_needs_write_on_the_exchange_or_queue(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    declare(admin, {"other": "fanout"}, (), (bind("other", "q1"),))
    make_user(admin, "pub", write="^(fan|q2)$", read=".*", configure=".*")
    with client(server.base_url, auth=("pub", "pub-password")) as pub:
        assert publish(pub, "fan").status_code == 200
        assert_problem(publish(pub, "other"), 403, "forbidden")
        assert_problem(
            pub.post("/exchanges/other/publish-batch", json={"messages": [{"body": 1}]}),
            403,
            "forbidden",
        )
        assert pub.post("/queues/q2/messages", json={"body": 1}).status_code == 200
        assert_problem(pub.post("/queues/q1/messages", json={"body": 1}), 403, "forbidden")
        # refused before existence is revealed
        assert_problem(publish(pub, "missing"), 403, "forbidden")
    assert count(server) == 4  # three copies of the fanout publish + one direct


def test_publish_needs_credentials(anon: httpx.Client, server: LiveServer) -> None:
    assert_problem(
        anon.post("/exchanges/amq.direct/publish", json={"body": 1}), 401, "unauthorized"
    )


def test_metrics_count_published_messages_and_copies(
    admin: httpx.Client, server: LiveServer, fanout3: tuple[str, ...]
) -> None:
    declare(admin, {"none": "direct"})
    publish(admin, "fan")
    admin.post("/exchanges/fan/publish-batch", json={"messages": [{"body": 1}, {"body": 2}]})
    publish(admin, "none")
    text = httpx.get(f"{server.base_url}/metrics").text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("messagex_") and " " in line
    }
    assert values["messagex_messages_published_total"] == 4
    assert values["messagex_message_copies_stored_total"] == 9
    assert values["messagex_messages_unroutable_total"] == 1
