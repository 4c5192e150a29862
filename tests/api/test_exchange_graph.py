"""Exchange-to-exchange bindings and alternate exchanges through the real server (contract
§14): routing through the graph (one copy per queue, each exchange once, cycles end), the
alternate exchange and ``mandatory``, the binding API (422, 404, permissions, filters), and
what deleting an exchange takes with it."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import LiveServer, client
from tests.wsclient import WsClient

_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}{next(_names)}g{uuid.uuid4().hex[:6]}"


def ok(response: httpx.Response, *codes: int) -> Any:
    assert response.status_code in (codes or (200, 201, 204)), response.text
    return response.json() if response.content else None


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    return body


def exchange(rest: httpx.Client, kind: str = "fanout", alternate: str | None = None) -> str:
    name = fresh("x")
    arguments = {} if alternate is None else {"alternate-exchange": alternate}
    ok(rest.put(f"/exchanges/{name}", json={"type": kind, "arguments": arguments}), 201)
    return name


def queue(rest: httpx.Client) -> str:
    name = fresh("q")
    ok(rest.put(f"/queues/{name}", json={}), 201)
    return name


def bind(rest: httpx.Client, x: str, q: str, key: str = "", **arguments: Any) -> int:
    body = {"exchange": x, "queue": q, "routing_key": key, "arguments": arguments}
    binding_id: int = ok(rest.post("/bindings", json=body), 201)["id"]
    return binding_id


def link(rest: httpx.Client, source: str, destination: str, key: str = "", **arguments: Any) -> Any:
    body = {
        "exchange": source,
        "destination_exchange": destination,
        "routing_key": key,
        "arguments": arguments,
    }
    return ok(rest.post("/bindings", json=body), 201)


def publish(rest: httpx.Client, x: str, key: str = "", **extra: Any) -> Any:
    return ok(rest.post(f"/exchanges/{x}/publish", json={"routing_key": key, "body": 1, **extra}))


def ready(rest: httpx.Client, q: str) -> int:
    count: int = ok(rest.get(f"/queues/{q}"))["stats"]["ready"]
    return count


def bindings(rest: httpx.Client, **params: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = ok(rest.get("/bindings", params=params))["items"]
    return items


# --------------------------------------------------------------------------- routing


def test_a_cycle_of_exchange_bindings_delivers_one_copy_per_queue(adm: httpx.Client) -> None:
    one, two, three = exchange(adm), exchange(adm), exchange(adm)
    shared, only_two, only_three = queue(adm), queue(adm), queue(adm)
    link(adm, one, two)
    link(adm, two, three)
    link(adm, three, one)  # a cycle
    link(adm, one, three)  # and a second path to three
    bind(adm, one, shared)
    bind(adm, two, shared)
    bind(adm, three, shared)
    bind(adm, two, only_two)
    bind(adm, three, only_three)
    result = publish(adm, one)
    assert result["routed"] is True
    assert sorted(result["queues"]) == sorted([shared, only_two, only_three])
    assert len(result["queues"]) == 3
    assert [ready(adm, q) for q in (shared, only_two, only_three)] == [1, 1, 1]
    # Entered anywhere on the cycle, the same queues, once each.
    assert sorted(publish(adm, three)["queues"]) == sorted([shared, only_two, only_three])
    assert ready(adm, shared) == 2


def test_exchange_bindings_match_with_the_same_key_and_headers(adm: httpx.Client) -> None:
    direct, topic, headers = (
        exchange(adm, "direct"),
        exchange(adm, "topic"),
        exchange(adm, "headers"),
    )
    by_topic, by_headers = queue(adm), queue(adm)
    link(adm, direct, topic, "a.b")
    link(adm, direct, headers, "a.b")
    bind(adm, topic, by_topic, "a.*")
    bind(adm, headers, by_headers, "", kind="x")
    assert publish(adm, direct, "a.b", headers={"kind": "x"})["queues"] == [by_topic, by_headers]
    assert publish(adm, direct, "a.b", headers={"kind": "y"})["queues"] == [by_topic]
    assert publish(adm, direct, "a.c", headers={"kind": "x"})["routed"] is False
    # The message keeps the exchange it was published to.
    copy = ok(adm.get(f"/queues/{by_topic}/messages"))["items"][0]
    assert (copy["exchange"], copy["routing_key"]) == (direct, "a.b")


def test_an_alternate_exchange_satisfies_mandatory(adm: httpx.Client, srv: LiveServer) -> None:
    caught = queue(adm)
    alternate = exchange(adm, "fanout")
    bind(adm, alternate, caught)
    main = exchange(adm, "direct", alternate=alternate)
    bound = queue(adm)
    bind(adm, main, bound, "k")
    assert publish(adm, main, "k", mandatory=True)["queues"] == [bound]  # no detour
    result = publish(adm, main, "other", mandatory=True)
    assert (result["routed"], result["queues"]) == (True, [caught])
    with WsClient.admin(srv.ws_url) as ws:
        reply = ws.request(
            {"type": "PUBLISH", "exchange": main, "routing_key": "x", "body": 1, "mandatory": True}
        )
        assert (reply["type"], reply["routed"], reply["queues"]) == ("PUBLISHED", True, [caught])
    batch = ok(
        adm.post(
            f"/exchanges/{main}/publish-batch",
            json={"messages": [{"routing_key": "k", "body": 1}, {"routing_key": "z", "body": 2}]},
        )
    )
    assert [r["queues"] for r in batch["results"]] == [[bound], [caught]]
    assert ready(adm, caught) == 3
    # Without an alternate, the same publish is unroutable and stores nothing.
    plain = exchange(adm, "direct")
    problem(
        adm.post(f"/exchanges/{plain}/publish", json={"body": 1, "mandatory": True}),
        422,
        "unroutable",
    )


def test_alternate_exchanges_chain_and_each_is_visited_once(adm: httpx.Client) -> None:
    last = exchange(adm, "fanout")
    end = queue(adm)
    bind(adm, last, end)
    middle = exchange(adm, "direct", alternate=last)
    bind(adm, middle, queue(adm), "only-this")
    first = exchange(adm, "topic", alternate=middle)
    assert publish(adm, first, "x.y", mandatory=True)["queues"] == [end]
    # A loop of alternates that matches nothing ends, unrouted.
    a = exchange(adm, "direct")
    b = exchange(adm, "direct", alternate=a)
    c = exchange(adm, "direct", alternate=b)
    ok(adm.delete(f"/exchanges/{a}"))
    ok(adm.put(f"/exchanges/{a}", json={"type": "direct", "arguments": {"alternate-exchange": c}}))
    for entry in (a, b, c):
        assert publish(adm, entry, "nothing")["routed"] is False
        problem(
            adm.post(
                f"/exchanges/{entry}/publish",
                json={"routing_key": "n", "body": 1, "mandatory": True},
            ),
            422,
            "unroutable",
        )
    # An exchange may name itself: visited once, so no detour.
    itself = fresh("x")
    ok(
        adm.put(
            f"/exchanges/{itself}",
            json={"type": "direct", "arguments": {"alternate-exchange": itself}},
        )
    )
    assert publish(adm, itself, "k")["routed"] is False


def test_the_alternate_is_used_when_the_exchange_bindings_reach_no_queue(adm: httpx.Client) -> None:
    caught = queue(adm)
    alternate = exchange(adm, "fanout")
    bind(adm, alternate, caught)
    main = exchange(adm, "direct", alternate=alternate)
    downstream = exchange(adm, "direct")
    link(adm, main, downstream, "k")  # matches...
    reached = queue(adm)
    bind(adm, downstream, reached, "only-this")  # ...but leads nowhere for "k"
    assert publish(adm, main, "k")["queues"] == [caught]
    bind(adm, downstream, reached, "k")  # now it reaches a queue: no detour
    assert publish(adm, main, "k")["queues"] == [reached]
    # A downstream exchange's own alternate catches it first: main has reached a queue.
    inner_caught = queue(adm)
    inner_alternate = exchange(adm, "fanout")
    bind(adm, inner_alternate, inner_caught)
    other = exchange(adm, "direct", alternate=inner_alternate)
    top = exchange(adm, "direct", alternate=alternate)
    link(adm, top, other, "z")
    assert publish(adm, top, "z")["queues"] == [inner_caught]
    assert publish(adm, top, "y")["queues"] == [caught]


def test_a_missing_alternate_is_404_at_declare_and_may_be_deleted_later(adm: httpx.Client) -> None:
    name = fresh("x")
    body = {"type": "direct", "arguments": {"alternate-exchange": fresh("missing")}}
    problem(adm.put(f"/exchanges/{name}", json=body), 404, "not_found")
    assert adm.get(f"/exchanges/{name}").status_code == 404  # nothing stored
    bad = {"type": "direct", "arguments": {"alternate-exchange": 7}}
    assert (
        "alternate-exchange"
        in problem(adm.put(f"/exchanges/{name}", json=bad), 422, "validation_error")["detail"]
    )
    alternate = exchange(adm, "fanout")
    caught = queue(adm)
    bind(adm, alternate, caught)
    main = exchange(adm, "direct", alternate=alternate)
    assert ok(adm.get(f"/exchanges/{main}"))["arguments"] == {"alternate-exchange": alternate}
    assert publish(adm, main, "k")["queues"] == [caught]
    ok(adm.delete(f"/exchanges/{alternate}"), 204)  # allowed, as in RabbitMQ
    assert publish(adm, main, "k")["routed"] is False
    again = ok(adm.put(f"/exchanges/{alternate}", json={"type": "fanout"}), 201)
    assert again["name"] == alternate
    bind(adm, alternate, caught)
    assert publish(adm, main, "k")["queues"] == [caught]  # the name counts, as in RabbitMQ


# --------------------------------------------------------------------------- the API


def test_exactly_one_of_queue_and_destination_exchange(adm: httpx.Client) -> None:
    source, destination, q = exchange(adm), exchange(adm), queue(adm)
    both = {"exchange": source, "queue": q, "destination_exchange": destination}
    body = problem(adm.post("/bindings", json=both), 422, "validation_error")
    assert "destination_exchange" in str(body["errors"])
    body = problem(adm.post("/bindings", json={"exchange": source}), 422, "validation_error")
    assert "queue" in str(body["errors"])
    bad_name = {"exchange": source, "destination_exchange": "no spaces"}
    problem(adm.post("/bindings", json=bad_name), 422, "validation_error")
    assert bindings(adm, exchange=source) == []
    missing = {"exchange": source, "destination_exchange": fresh("missing")}
    problem(adm.post("/bindings", json=missing), 404, "not_found")
    missing_source = {"exchange": fresh("missing"), "destination_exchange": destination}
    problem(adm.post("/bindings", json=missing_source), 404, "not_found")
    headers = exchange(adm, "headers")
    bad_match = {
        "exchange": headers,
        "destination_exchange": destination,
        "arguments": {"x-match": "some"},
    }
    problem(adm.post("/bindings", json=bad_match), 422, "validation_error")


def test_an_exchange_binding_is_idempotent_listed_filtered_and_deleted(adm: httpx.Client) -> None:
    source, destination, q = exchange(adm, "direct"), exchange(adm), queue(adm)
    made = link(adm, source, destination, "k")
    assert made == {
        "id": made["id"],
        "exchange": source,
        "queue": None,
        "destination_exchange": destination,
        "routing_key": "k",
        "arguments": {},
    }
    body = {"exchange": source, "destination_exchange": destination, "routing_key": "k"}
    assert ok(adm.post("/bindings", json=body), 200) == made
    other = link(adm, source, destination, "j")
    to_queue = bind(adm, source, q, "k")
    assert [b["id"] for b in bindings(adm, destination_exchange=destination)] == [
        made["id"],
        other["id"],
    ]
    assert [b["id"] for b in bindings(adm, exchange=source)] == [made["id"], other["id"], to_queue]
    assert bindings(adm, queue=q)[0]["destination_exchange"] is None
    assert bindings(adm, destination_exchange=source) == []
    ok(adm.delete(f"/bindings/{made['id']}"), 204)
    problem(adm.delete(f"/bindings/{made['id']}"), 404, "not_found")
    assert [b["id"] for b in bindings(adm, destination_exchange=destination)] == [other["id"]]


def test_deleting_an_exchange_takes_the_bindings_of_both_sides(adm: httpx.Client) -> None:
    upstream, middle, downstream, q = exchange(adm), exchange(adm), exchange(adm), queue(adm)
    link(adm, upstream, middle)
    link(adm, middle, downstream)
    bind(adm, middle, q)
    kept = link(adm, upstream, downstream)
    assert publish(adm, upstream)["queues"] == [q]
    # if_unused counts both sides: a destination only is in use too.
    problem(
        adm.delete(f"/exchanges/{downstream}", params={"if_unused": "true"}),
        409,
        "precondition_failed",
    )
    only_source = exchange(adm)
    link(adm, only_source, exchange(adm))
    problem(
        adm.delete(f"/exchanges/{only_source}", params={"if_unused": "true"}),
        409,
        "precondition_failed",
    )
    unused = exchange(adm)
    ok(adm.delete(f"/exchanges/{unused}", params={"if_unused": "true"}), 204)
    ok(adm.delete(f"/exchanges/{middle}"), 204)
    assert bindings(adm, destination_exchange=middle) == []
    assert [b["id"] for b in bindings(adm, exchange=upstream)] == [kept["id"]]
    assert bindings(adm, queue=q) == []
    assert publish(adm, upstream)["routed"] is False


def test_an_auto_delete_source_goes_with_its_last_binding_to_a_deleted_exchange(
    adm: httpx.Client,
) -> None:
    source = fresh("x")
    ok(adm.put(f"/exchanges/{source}", json={"type": "fanout", "auto_delete": True}), 201)
    destination = exchange(adm)
    link(adm, source, destination)
    ok(adm.delete(f"/exchanges/{destination}"), 204)
    assert adm.get(f"/exchanges/{source}").status_code == 404


# --------------------------------------------------------------------------- permissions


@pytest.fixture(scope="module")
def user_factory(srv: LiveServer, adm: httpx.Client) -> Iterator[Any]:
    clients: list[httpx.Client] = []

    def make(write: str = "", read: str = "", configure: str = "") -> httpx.Client:
        name = fresh("u")
        password = f"{name}-password"
        permissions = {"configure": configure, "write": write, "read": read}
        ok(
            adm.put(
                f"/users/{name}",
                json={"password": password, "role": "user", "permissions": permissions},
            ),
            201,
        )
        c = client(srv.base_url, auth=(name, password))
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


def test_an_exchange_binding_needs_read_on_the_source_and_write_on_the_destination(
    adm: httpx.Client, user_factory: Any
) -> None:
    source, destination = exchange(adm), exchange(adm)
    body = {"exchange": source, "destination_exchange": destination}
    read_only = user_factory(read=source)
    write_only = user_factory(write=destination)
    wrong_way = user_factory(read=destination, write=source)
    both = user_factory(read=source, write=destination)
    for refused in (read_only, write_only, wrong_way):
        problem(refused.post("/bindings", json=body), 403, "forbidden")
    assert bindings(adm, exchange=source) == []
    made = ok(both.post("/bindings", json=body), 201)
    # Visible to whoever has a permission on the destination exchange.
    assert [b["id"] for b in bindings(write_only)] == [made["id"]]
    for refused in (read_only, write_only, wrong_way):
        problem(refused.delete(f"/bindings/{made['id']}"), 403, "forbidden")
    ok(both.delete(f"/bindings/{made['id']}"), 204)


def test_exchanges_bound_both_ways_deleted_at_once_never_fail(
    adm: httpx.Client, srv: LiveServer
) -> None:
    """Each delete locks the exchange and those bound to it in one id order: two exchanges
    bound to each other, deleted at the same moment (with binds racing), both go — no
    deadlock, no 500."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.support import ADMIN_PASSWORD, ADMIN_USER

    with (
        client(srv.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as one,
        client(srv.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as two,
        ThreadPoolExecutor(2) as pool,
    ):
        for _ in range(15):
            x, y = exchange(adm), exchange(adm)
            link(adm, x, y)
            link(adm, y, x)
            first = pool.submit(one.delete, f"/exchanges/{x}")
            second = pool.submit(two.delete, f"/exchanges/{y}")
            assert first.result().status_code == 204, first.result().text
            assert second.result().status_code == 204, second.result().text
            assert bindings(adm, exchange=x) == bindings(adm, exchange=y) == []


def test_declaring_an_alternate_needs_read_on_the_exchange_and_write_on_the_alternate(
    adm: httpx.Client, user_factory: Any
) -> None:
    alternate = exchange(adm)
    name = fresh("x")
    body = {"type": "direct", "arguments": {"alternate-exchange": alternate}}
    configure_only = user_factory(configure=name)
    no_write = user_factory(configure=name, read=name)
    allowed = user_factory(configure=name, read=name, write=alternate)
    for refused in (configure_only, no_write):
        problem(refused.put(f"/exchanges/{name}", json=body), 403, "forbidden")
    assert adm.get(f"/exchanges/{name}").status_code == 404
    ok(allowed.put(f"/exchanges/{name}", json=body), 201)
    ok(configure_only.put(f"/exchanges/{fresh('x')}", json={"type": "direct"}), 403)
