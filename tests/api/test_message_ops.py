"""Operations on messages by filter through the real server (contract §17): query, move,
redrive and delete; each filter condition alone and combined; dry runs; permissions; in-flight
copies never touched; bad input changes nothing."""

from __future__ import annotations

import asyncio
import itertools
import threading
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from app.broker.cluster import CHANNEL, decode
from app.storage.dsn import asyncpg_dsn
from tests.api.test_messages import assert_problem, sql
from tests.support import LiveServer, client, metric

_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def declare(adm: httpx.Client, name: str, **body: Any) -> str:
    r = adm.put(f"/queues/{name}", json=body)
    assert r.status_code == 201, r.text
    return name


def topic_queue(adm: httpx.Client, prefix: str, **body: Any) -> str:
    """A queue bound to amq.topic with its own key prefix: ``<name>.#``."""
    name = declare(adm, fresh(prefix), **body)
    r = adm.post("/bindings", json={"exchange": "amq.topic", "queue": name, "routing_key": "#"})
    assert r.status_code in (200, 201), r.text
    return name


def publish(adm: httpx.Client, queue: str, key: str = "", **message: Any) -> str:
    """Into ``queue`` only (through a direct exchange of its own), with routing key ``key``."""
    exchange = f"x-{queue}"
    adm.put(f"/exchanges/{exchange}", json={"type": "fanout"})
    adm.post("/bindings", json={"exchange": exchange, "queue": queue})
    message.setdefault("body", key)
    r = adm.post(f"/exchanges/{exchange}/publish", json={"routing_key": key, **message})
    assert r.status_code == 200, r.text
    assert r.json()["queues"] == [queue]
    message_id: str = r.json()["message_id"]
    return message_id


def by_filter(srv: LiveServer, operation: str) -> float:
    """messagex_message_copies_by_filter_total{operation} of the module's server."""
    text = httpx.get(f"{srv.base_url}/metrics").text
    return metric(text, "messagex_message_copies_by_filter_total", operation=operation) or 0.0


def rows(srv: LiveServer, queue: str) -> list[dict[str, Any]]:
    """Every copy of ``queue`` as stored, by id."""
    found = sql(
        srv,
        "SELECT m.id, m.message_id, m.status, m.routing_key, m.headers::text AS headers, "
        "m.delivery_count, m.available_at, m.created_at, m.priority, m.expires_at, "
        "m.delivery_tag FROM messages m JOIN queues q ON q.id = m.queue_id WHERE q.name = $1 "
        "ORDER BY m.id",
        queue,
    )
    return [dict(r) for r in found]


def snapshot(srv: LiveServer) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in sql(srv, "SELECT * FROM messages ORDER BY id")]


def query(c: httpx.Client, queue: str, flt: dict[str, Any], **body: Any) -> list[dict[str, Any]]:
    r = c.post(f"/queues/{queue}/messages/query", json={"filter": flt, **body})
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def bodies(c: httpx.Client, queue: str, flt: dict[str, Any]) -> list[Any]:
    return [item["body"] for item in query(c, queue, flt)]


def set_in_flight(srv: LiveServer, row_id: int) -> None:
    sql(
        srv,
        "UPDATE messages SET status = 'in_flight', delivery_tag = id::text || '.t', "
        "lease_expires_at = now() + interval '1 hour', delivered_at = now(), "
        "delivery_count = delivery_count + 1 WHERE id = $1",
        row_id,
    )


def dead_letter(adm: httpx.Client, queue: str, n: int) -> None:
    """Pull ``n`` copies of ``queue`` and reject them: the retry path dead-letters them."""
    r = adm.post(f"/queues/{queue}/get", json={"max_messages": n})
    assert r.status_code == 200, r.text
    got = r.json()["messages"]
    assert len(got) == n
    for m in got:
        r = adm.post(f"/deliveries/{m['delivery_tag']}/nack", json={"requeue": False})
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def corpus(srv: LiveServer, adm: httpx.Client) -> str:
    """One queue holding a copy of each kind (bodies name them):
    ``a`` order.created {tenant: acme, n: 1} ready, published long ago;
    ``b`` order.eu.paid {tenant: other} ready; ``c`` user.x {tenant: acme, n: 1.0} delayed;
    ``d`` order.created dead, delivered 3 times, x-death newest reason expired;
    ``e`` "" {n: "1"} ready; ``f`` order.created in flight."""
    q = declare(adm, fresh("corpus"))
    publish(adm, q, "order.created", body="a", headers={"tenant": "acme", "n": 1})
    publish(adm, q, "order.eu.paid", body="b", headers={"tenant": "other"})
    publish(adm, q, "user.x", body="c", headers={"tenant": "acme", "n": 1.0}, delay_ms=3_600_000)
    publish(
        adm,
        q,
        "order.created",
        body="d",
        headers={
            "x-death": [{"queue": q, "reason": "expired"}, {"queue": q, "reason": "rejected"}]
        },
    )
    publish(adm, q, "", body="e", headers={"n": "1"})
    publish(adm, q, "order.created", body="f")
    ids = [r["id"] for r in rows(srv, q)]
    sql(srv, "UPDATE messages SET created_at = '2020-01-01T00:00:00Z' WHERE id = $1", ids[0])
    sql(srv, "UPDATE messages SET status = 'dead', delivery_count = 3 WHERE id = $1", ids[3])
    set_in_flight(srv, ids[5])
    return q


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({}, ["a", "b", "c", "d", "e"]),
        ({"status": ["ready"]}, ["a", "b", "e"]),
        ({"status": ["delayed"]}, ["c"]),
        ({"status": ["dead"]}, ["d"]),
        ({"status": ["in_flight"]}, ["f"]),
        ({"status": ["ready", "delayed", "dead", "in_flight"]}, ["a", "b", "c", "d", "e", "f"]),
        ({"routing_key": "order.*"}, ["a", "d"]),
        ({"routing_key": "order.#"}, ["a", "b", "d"]),
        ({"routing_key": "*.*.paid"}, ["b"]),
        ({"routing_key": "#"}, ["a", "b", "c", "d", "e"]),
        ({"routing_key": ""}, ["e"]),
        ({"routing_key": "*"}, []),
        ({"routing_key": "order.created"}, ["a", "d"]),
        ({"headers": {"tenant": "acme"}}, ["a", "c"]),
        ({"headers": {"n": 1}}, ["a", "c"]),  # 1 = 1.0, as a headers binding compares
        ({"headers": {"n": "1"}}, ["e"]),  # 1 ≠ "1"
        ({"headers": {}}, ["a", "b", "c", "d", "e"]),
        ({"published_before": "2021-01-01T00:00:00Z"}, ["a"]),
        ({"published_after": "2021-01-01T00:00:00+01:00"}, ["b", "c", "d", "e"]),
        # bounds that exclude every instant match nothing (not a 422)
        (
            {"published_after": "2024-01-02T00:00:00Z", "published_before": "2024-01-01T00:00:00Z"},
            [],
        ),
        ({"min_delivery_count": 1}, ["d"]),
        ({"min_delivery_count": 0}, ["a", "b", "c", "d", "e"]),
        ({"death_reason": "expired"}, ["d"]),
        ({"death_reason": "rejected"}, []),  # only the newest entry counts
        ({"routing_key": "order.#", "headers": {"tenant": "acme"}, "status": ["ready"]}, ["a"]),
        ({"routing_key": "#", "headers": {"n": 1}, "status": ["delayed", "dead"]}, ["c"]),
        (
            {"published_after": "2021-01-01T00:00:00Z", "routing_key": "order.#"},
            ["b", "d"],
        ),
        ({"death_reason": "expired", "min_delivery_count": 3, "routing_key": "*.created"}, ["d"]),
        ({"death_reason": "expired", "min_delivery_count": 4}, []),
    ],
)
def test_each_condition_alone_and_combined(
    srv: LiveServer, adm: httpx.Client, corpus: str, flt: dict[str, Any], expected: list[str]
) -> None:
    assert bodies(adm, corpus, flt) == expected
    if "in_flight" in flt.get("status", []):
        return
    # move and delete count the same copies (dry run: nothing changes)
    before = snapshot(srv)
    r = adm.post(f"/queues/{corpus}/messages/delete", json={"filter": flt, "dry_run": True})
    assert r.json() == {"matched": len(expected), "deleted": 0}
    r = adm.post(
        f"/queues/{corpus}/messages/move", json={"filter": flt, "to": None, "dry_run": True}
    )
    assert r.status_code == 200, r.text
    assert r.json()["matched"] == len(expected)
    assert r.json()["moved"] == 0
    assert snapshot(srv) == before


def test_message_ids_condition(srv: LiveServer, adm: httpx.Client) -> None:
    q = declare(adm, fresh("ids"))
    first = publish(adm, q, body=1)
    publish(adm, q, body=2)
    third = publish(adm, q, body=3)
    flt = {"message_ids": [third, first, "nope"]}
    assert bodies(adm, q, flt) == [1, 3]


def test_query_pages_by_id(adm: httpx.Client, srv: LiveServer) -> None:
    q = declare(adm, fresh("pages"))
    for n in range(5):
        publish(adm, q, "k.odd" if n % 2 else "k.even", body=n)
    flt = {"routing_key": "k.even"}
    r = adm.post(f"/queues/{q}/messages/query", json={"filter": flt, "limit": 2})
    page = r.json()
    assert [i["body"] for i in page["items"]] == [0, 2]
    assert page["next_after"] == page["items"][-1]["id"]
    r = adm.post(
        f"/queues/{q}/messages/query",
        json={"filter": flt, "limit": 2, "after": page["next_after"]},
    )
    assert r.json()["items"][0]["body"] == 4
    assert r.json()["next_after"] is None
    # the browse item shape, exactly
    browse = adm.get(f"/queues/{q}/messages", params={"limit": 1}).json()["items"][0]
    assert query(adm, q, {}, limit=1)[0] == browse


def test_move_to_a_queue(srv: LiveServer, adm: httpx.Client) -> None:
    src = declare(adm, fresh("msrc"))
    dst = declare(adm, fresh("mdst"))
    for n in range(6):
        publish(adm, src, "t", body=n, headers={"h": n % 2})
    ids = [r["id"] for r in rows(srv, src)]
    set_in_flight(srv, ids[1])  # body 1, h 1: in flight, never moved
    sql(srv, "UPDATE messages SET status = 'dead', delivery_count = 5 WHERE id = $1", ids[3])
    before = {r["id"]: r for r in rows(srv, src)}
    r = adm.post(
        f"/queues/{src}/messages/move",
        json={"filter": {"headers": {"h": 1}}, "to": dst, "limit": 1},
    )
    assert r.status_code == 200, r.text
    # matched: bodies 3 and 5 (1 is in flight); the limit moved the first only
    assert r.json() == {"matched": 2, "moved": 1, "skipped": 0}
    (moved,) = rows(srv, dst)
    assert moved["id"] == ids[3]
    assert moved["status"] == "ready"
    assert moved["delivery_count"] == 0
    assert moved["message_id"] == before[ids[3]]["message_id"]
    assert moved["created_at"] == before[ids[3]]["created_at"]
    assert moved["available_at"] > before[ids[3]]["available_at"]
    assert moved["headers"] == before[ids[3]]["headers"]
    r = adm.post(f"/queues/{src}/messages/move", json={"filter": {"headers": {"h": 1}}, "to": dst})
    assert r.json() == {"matched": 1, "moved": 1, "skipped": 0}
    assert [x["body"] for x in query(adm, dst, {})] == [3, 5]
    left = rows(srv, src)
    assert [x["id"] for x in left] == [ids[0], ids[1], ids[2], ids[4]]
    assert left[1] == before[ids[1]]  # the in-flight copy: untouched
    # the moved copies are delivered from the target
    got = adm.post(f"/queues/{dst}/get", json={"max_messages": 10}).json()["messages"]
    assert [m["body"] for m in got] == [3, 5]


async def test_a_move_tells_every_process_of_the_target_and_the_source(
    srv: LiveServer, adm: httpx.Client
) -> None:
    """The NOTIFY a publish sends (broker/cluster.py) names the target queue after a move:
    its consumers on every process wake at once."""
    src = declare(adm, fresh("wsrc"))
    dst = declare(adm, fresh("wdst"))
    publish(adm, src, body="wake")
    found = await asyncio.to_thread(sql, srv, "SELECT name, id FROM queues")
    queue_ids = {r["name"]: r["id"] for r in found}
    heard: asyncio.Queue[str] = asyncio.Queue()
    assert srv.settings.database_url is not None
    conn = await asyncpg.connect(asyncpg_dsn(srv.settings.database_url))
    try:
        await conn.add_listener(CHANNEL, lambda *args: heard.put_nowait(args[-1]))
        r = await asyncio.to_thread(
            adm.post, f"/queues/{src}/messages/move", json={"filter": {}, "to": dst}
        )
        assert r.json()["moved"] == 1
        woken: set[int] = set()
        async with asyncio.timeout(10):
            while queue_ids[dst] not in woken:
                event = decode(await heard.get())
                if event is not None:
                    woken |= set(event.queues)
    finally:
        await conn.close()
    assert queue_ids[src] in woken  # groups (§16): a head may have left the source


def test_redrive_returns_copies_to_their_x_death_queue(srv: LiveServer, adm: httpx.Client) -> None:
    dlq = declare(adm, fresh("dlq"))
    work = declare(adm, fresh("work"), dead_letter_queue=dlq, max_delivery_count=1)
    gone = declare(adm, fresh("gone"), dead_letter_queue=dlq)
    for n in range(3):
        publish(adm, work, "w", body=f"w{n}", headers={"tenant": "acme" if n else "zeta"})
    publish(adm, gone, "g", body="g0")
    dead_letter(adm, work, 3)
    dead_letter(adm, gone, 1)
    assert adm.delete(f"/queues/{gone}").status_code == 204
    publish(adm, dlq, "p", body="plain")  # no x-death: skipped
    in_dlq = rows(srv, dlq)
    assert [x["delivery_count"] for x in in_dlq] == [0] * 5
    set_in_flight(srv, in_dlq[2]["id"])  # w2 in flight in the DLQ: never moved
    sql(srv, "UPDATE messages SET delivery_count = 7 WHERE id = $1", in_dlq[1]["id"])
    # a filtered dry run first
    flt = {"death_reason": "rejected", "headers": {"tenant": "acme"}}
    before = snapshot(srv)
    r = adm.post(f"/queues/{dlq}/messages/move", json={"filter": flt, "to": None, "dry_run": True})
    assert r.json() == {"matched": 1, "moved": 0, "skipped": 0}
    assert snapshot(srv) == before
    redriven_before = by_filter(srv, "redriven")
    r = adm.post(f"/queues/{dlq}/messages/move", json={"filter": {}, "to": None})
    assert r.status_code == 200, r.text
    # w0, w1 moved back; g0 (queue gone) and plain (no x-death) skipped; w2 in flight
    assert r.json() == {"matched": 4, "moved": 2, "skipped": 2}
    assert by_filter(srv, "redriven") == redriven_before + 2
    back = rows(srv, work)
    assert [x["id"] for x in back] == [in_dlq[0]["id"], in_dlq[1]["id"]]
    assert {x["status"] for x in back} == {"ready"}
    assert {x["delivery_count"] for x in back} == {0}
    assert all('"x-death"' in x["headers"] for x in back)  # x-death kept
    assert [x["body"] for x in query(adm, dlq, {"status": ["ready", "in_flight"]})] == [
        "w2",
        "g0",
        "plain",
    ]
    # they are delivered again, and a second failure dead-letters them again (count 2)
    dead_letter(adm, work, 2)
    item = query(adm, dlq, {"death_reason": "rejected", "headers": {"tenant": "zeta"}})[0]
    assert item["headers"]["x-death"][0]["count"] == 2


def test_dead_copies_kept_in_their_own_queue_are_moved_back_by_name(
    srv: LiveServer, adm: httpx.Client
) -> None:
    """Without a dead-letter target a copy stays ``dead`` in its queue, with no x-death entry
    (contract §10): a redrive skips it; a move to the queue's own name makes it ready."""
    q = declare(adm, fresh("inplace"), max_delivery_count=1)
    publish(adm, q, body="x")
    r = adm.post(f"/queues/{q}/get", json={})
    tag = r.json()["messages"][0]["delivery_tag"]
    assert adm.post(f"/deliveries/{tag}/nack", json={}).json()["outcome"] == "dead"
    (item,) = query(adm, q, {})
    assert (item["status"], item["delivery_count"]) == ("dead", 1)
    dead = {"filter": {"status": ["dead"]}}
    r = adm.post(f"/queues/{q}/messages/move", json=dead | {"to": None})
    assert r.json() == {"matched": 1, "moved": 0, "skipped": 1}
    r = adm.post(f"/queues/{q}/messages/move", json=dead | {"to": q})
    assert r.json() == {"matched": 1, "moved": 1, "skipped": 0}
    (item,) = query(adm, q, {})
    assert (item["status"], item["delivery_count"]) == ("ready", 0)


def test_target_semantics_priority_ttl_and_length(srv: LiveServer, adm: httpx.Client) -> None:
    src = declare(adm, fresh("ssrc"))
    prio = declare(adm, fresh("sprio"), arguments={"x-max-priority": 5})
    ttl = declare(adm, fresh("sttl"), arguments={"x-message-ttl": 600_000})
    short = declare(adm, fresh("sshort"), arguments={"x-max-length": 2})
    publish(adm, src, "p", body="p", properties={"priority": 9})
    for n in range(3):
        publish(adm, short, "old", body=f"old{n}")
    for n in range(3):
        publish(adm, src, "s", body=f"s{n}")
    publish(adm, src, "t", body="t")
    move = adm.post
    assert (
        move(
            f"/queues/{src}/messages/move", json={"filter": {"routing_key": "p"}, "to": prio}
        ).json()["moved"]
        == 1
    )
    assert rows(srv, prio)[0]["priority"] == 5  # capped at the target's x-max-priority
    assert (
        move(
            f"/queues/{src}/messages/move", json={"filter": {"routing_key": "t"}, "to": ttl}
        ).json()["moved"]
        == 1
    )
    (t_row,) = rows(srv, ttl)
    assert t_row["expires_at"] - t_row["available_at"] == timedelta(minutes=10)
    assert t_row["priority"] is None
    assert (
        move(
            f"/queues/{src}/messages/move", json={"filter": {"routing_key": "s"}, "to": short}
        ).json()["moved"]
        == 3
    )
    # the target holds its limit: drop-head, the oldest ready copies left
    assert [x["body"] for x in query(adm, short, {})] == ["s1", "s2"]


def test_delete_by_filter(srv: LiveServer, adm: httpx.Client) -> None:
    q = declare(adm, fresh("del"))
    for n in range(5):
        publish(adm, q, "a.b" if n < 4 else "z", body=n)
    ids = [r["id"] for r in rows(srv, q)]
    set_in_flight(srv, ids[0])
    deleted_before = by_filter(srv, "deleted")
    r = adm.post(
        f"/queues/{q}/messages/delete", json={"filter": {"routing_key": "a.*"}, "limit": 2}
    )
    assert r.json() == {"matched": 3, "deleted": 2}
    assert by_filter(srv, "deleted") == deleted_before + 2
    assert [x["body"] for x in query(adm, q, {"status": ["ready", "in_flight"]})] == [0, 3, 4]
    r = adm.post(f"/queues/{q}/messages/delete", json={"filter": {}})
    assert r.json() == {"matched": 2, "deleted": 2}
    assert [x["id"] for x in rows(srv, q)] == [ids[0]]  # in flight: kept
    stats = adm.get(f"/queues/{q}").json()["stats"]
    assert (stats["ready"], stats["in_flight"]) == (0, 1)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("query", {"filter": {"nope": 1}}),
        ("query", {"filter": {}, "extra": 1}),
        ("query", {"filter": {"status": []}}),
        ("query", {"filter": {"status": ["queued"]}}),
        ("query", {"filter": {"routing_key": 5}}),
        ("query", {"filter": {"headers": {"x-death": []}}}),
        ("query", {"filter": {"headers": {"k": "a\u0000b"}}}),
        ("query", {"filter": {"published_after": "yesterday"}}),
        ("query", {"filter": {"published_after": "2024-01-01T00:00:00"}}),  # no offset
        ("query", {"filter": {"min_delivery_count": -1}}),
        ("query", {"filter": {"min_delivery_count": "2"}}),
        ("query", {"filter": {"death_reason": "bored"}}),
        ("query", {"filter": {"message_ids": []}}),
        ("query", {"limit": 1001}),
        ("move", {"filter": {}}),  # "to" is required (null: redrive)
        ("move", {"filter": {}, "to": None, "limit": 0}),
        ("move", {"filter": {}, "to": None, "limit": 100_001}),
        ("move", {"filter": {}, "to": "bad name"}),
        ("move", {"filter": {"status": ["in_flight"]}, "to": None}),
        ("move", {"filter": {}, "to": None, "dry_run": "yes"}),
        ("delete", {"filter": {"status": ["ready", "in_flight"]}}),
        ("delete", {"filter": {"routing_key": None, "bogus": True}}),
        ("delete", {"filter": {}, "limit": 1.5}),
    ],
)
def test_a_bad_request_is_422_and_changes_nothing(
    srv: LiveServer, adm: httpx.Client, corpus: str, path: str, body: dict[str, Any]
) -> None:
    before = snapshot(srv)
    r = adm.post(f"/queues/{corpus}/messages/{path}", json=body)
    assert_problem(r, 422, "validation_error")
    assert snapshot(srv) == before


def test_unknown_queues_are_404(srv: LiveServer, adm: httpx.Client, corpus: str) -> None:
    before = snapshot(srv)
    for path, body in [
        ("query", {}),
        ("move", {"to": None}),
        ("move", {"to": corpus}),
        ("delete", {}),
    ]:
        assert_problem(adm.post(f"/queues/nosuch/messages/{path}", json=body), 404, "not_found")
    r = adm.post(f"/queues/{corpus}/messages/move", json={"to": "nosuch"})
    assert_problem(r, 404, "not_found")
    assert snapshot(srv) == before


def test_permissions(srv: LiveServer, adm: httpx.Client) -> None:
    """configure on the source, write on every target (a redrive's too), read to query."""
    src = declare(adm, fresh("perm-src"))
    ok = declare(adm, fresh("perm-ok"), dead_letter_queue=src)
    closed = declare(adm, fresh("perm-closed"), dead_letter_queue=src)
    user = fresh("op")
    r = adm.put(
        f"/users/{user}",
        json={
            "password": "secret-password",
            "role": "user",
            "permissions": {"configure": "perm-src-.*", "write": "perm-ok-.*", "read": ""},
        },
    )
    assert r.status_code == 201, r.text
    publish(adm, ok, body="from-ok")
    dead_letter(adm, ok, 1)
    with client(srv.base_url, auth=(user, "secret-password")) as c:
        before = snapshot(srv)
        assert_problem(c.post(f"/queues/{src}/messages/query", json={}), 403, "forbidden")
        assert_problem(
            c.post(f"/queues/{src}/messages/move", json={"to": closed}), 403, "forbidden"
        )
        assert_problem(c.post(f"/queues/{ok}/messages/delete", json={}), 403, "forbidden")
        assert_problem(c.post(f"/queues/{ok}/messages/move", json={"to": src}), 403, "forbidden")
        assert snapshot(srv) == before
        # a redrive to a writable queue works
        r = c.post(f"/queues/{src}/messages/move", json={"to": None})
        assert r.json() == {"matched": 1, "moved": 1, "skipped": 0}
        # a redrive with one copy whose x-death queue is not writable: 403, nothing moves
        publish(adm, closed, body="from-closed")
        dead_letter(adm, closed, 1)
        publish(adm, ok, body="again")
        dead_letter(adm, ok, 1)
        before = snapshot(srv)
        assert_problem(c.post(f"/queues/{src}/messages/move", json={"to": None}), 403, "forbidden")
        assert snapshot(srv) == before
        # ... unless the filter leaves it out
        items = query(adm, src, {})
        (from_ok,) = (m for m in items if m["headers"]["x-death"][0]["queue"] == ok)
        flt = {"routing_key": "", "published_after": "2020-01-01T00:00:00Z"}
        r = c.post(
            f"/queues/{src}/messages/move",
            json={"filter": flt | {"message_ids": [from_ok["message_id"]]}, "to": None},
        )
        assert r.json() == {"matched": 1, "moved": 1, "skipped": 0}
        r = c.post(f"/queues/{src}/messages/delete", json={"dry_run": True})
        assert r.json() == {"matched": 1, "deleted": 0}


def test_moves_racing_claims_never_take_a_copy_in_flight(
    srv: LiveServer, adm: httpx.Client
) -> None:
    """Pull consumers claim from the source while moves run against it: every claimed copy
    is still in the source and acks (no move took it), every moved copy is ready with
    delivery_count 0, and no copy is lost or duplicated."""
    src = declare(adm, fresh("race-src"))
    dst = declare(adm, fresh("race-dst"))
    total = 400
    publish(adm, src, body=-1)  # binds the queue to its own fanout exchange x-<queue>
    sql(srv, "DELETE FROM messages WHERE body = '-1'::bytea")
    for start in range(0, total, 200):
        batch = [{"body": n} for n in range(start, start + 200)]
        r = adm.post(f"/exchanges/x-{src}/publish-batch", json={"messages": batch})
        assert r.status_code == 200, r.text
    claimed: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            with client(srv.base_url, auth=adm.auth) as c:
                for _ in range(10):
                    got = c.post(f"/queues/{src}/get", json={"max_messages": 10}).json()
                    claimed.extend(got["messages"])
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=claim) for _ in range(2)]
    for w in workers:
        w.start()
    moved = 0
    while any(w.is_alive() for w in workers):
        r = adm.post(f"/queues/{src}/messages/move", json={"to": dst, "limit": 7})
        assert r.status_code == 200, r.text
        moved += r.json()["moved"]
    for w in workers:
        w.join()
    assert errors == []
    assert claimed
    assert moved > 0
    for m in claimed:  # each claimed delivery is still the source's, in flight: it acks
        r = adm.post(f"/deliveries/{m['delivery_tag']}/ack")
        assert r.status_code == 204, r.text
    in_dst = rows(srv, dst)
    assert len(in_dst) == moved
    assert {(x["status"], x["delivery_count"]) for x in in_dst} == {("ready", 0)}
    left = rows(srv, src)
    assert {x["status"] for x in left} <= {"ready"}
    bodies_claimed = {m["body"] for m in claimed}
    assert len(bodies_claimed) == len(claimed)  # no copy delivered twice
    assert len(claimed) + len(in_dst) + len(left) == total
