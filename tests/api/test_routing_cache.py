"""Each broker process keeps its exchanges' bindings compiled (app/broker/routing_cache.py);
a binding created or deleted through one process is still obeyed by the next publish on
every process (contract §4, §10). Two real broker processes on one database: bindings
change through B while A, whose copy is warm, publishes, in turn and racing.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from tests.support import ADMIN_PASSWORD, ADMIN_USER, PgCluster, client, running_server
from tests.support import test_settings as settings_for

_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def pair(pg_cluster: PgCluster, template_db: str) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    name = pg_cluster.create_database(template_db)
    try:
        url = pg_cluster.url_for(name)
        with ExitStack() as stack:
            servers = [stack.enter_context(running_server(settings_for(url))) for _ in range(2)]
            yield tuple(  # type: ignore[misc]
                stack.enter_context(client(s.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)))
                for s in servers
            )
    finally:
        pg_cluster.drop_database(name)


def _another(rest: httpx.Client) -> httpx.Client:
    """A client of its own (for another thread), to the same server as ``rest``."""
    return httpx.Client(base_url=rest.base_url, auth=rest.auth, timeout=30)


def ok(response: httpx.Response, *codes: int) -> Any:
    assert response.status_code in (codes or (200, 201, 204)), response.text
    return response.json() if response.content else None


def exchange(rest: httpx.Client, kind: str, **extra: Any) -> str:
    name = fresh("x")
    ok(rest.put(f"/exchanges/{name}", json={"type": kind, **extra}))
    return name


def queue(rest: httpx.Client) -> str:
    name = fresh("q")
    ok(rest.put(f"/queues/{name}", json={}))
    return name


def bind(rest: httpx.Client, x: str, q: str, key: str = "", **arguments: Any) -> int:
    body = {"exchange": x, "queue": q, "routing_key": key, "arguments": arguments}
    binding_id: int = ok(rest.post("/bindings", json=body))["id"]
    return binding_id


def routed(rest: httpx.Client, x: str, key: str = "", headers: dict[str, Any] | None = None) -> Any:
    body = {"routing_key": key, "body": "m", "headers": headers or {}}
    return ok(rest.post(f"/exchanges/{x}/publish", json=body), 200)["queues"]


@pytest.mark.parametrize(
    ("kind", "key", "pattern", "headers", "arguments"),
    [
        ("direct", "k.1", "k.1", {}, {}),
        ("topic", "a.b.c", "a.#", {}, {}),
        ("topic", "", "#", {}, {}),
        ("fanout", "any", "", {}, {}),
        ("headers", "", "", {"h": 1}, {"h": 1.0}),
    ],
)
def test_a_binding_made_or_removed_on_b_is_obeyed_by_the_next_publish_on_a(
    pair: tuple[httpx.Client, httpx.Client],
    kind: str,
    key: str,
    pattern: str,
    headers: dict[str, Any],
    arguments: dict[str, Any],
) -> None:
    a, b = pair
    x = exchange(b, kind)
    first, second = queue(b), queue(b)
    bind(b, x, first, pattern, **arguments)
    for _ in range(3):  # warm A's compiled copy
        assert routed(a, x, key, headers) == [first]
    created = bind(b, x, second, pattern, **arguments)
    assert routed(a, x, key, headers) == [first, second]
    ok(b.delete(f"/bindings/{created}"))
    assert routed(a, x, key, headers) == [first]
    ok(b.delete(f"/queues/{first}"))  # its bindings go with it
    assert routed(a, x, key, headers) == []


def test_an_exchange_deleted_and_declared_again_on_b_routes_anew_on_a(
    pair: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = pair
    x = exchange(b, "topic")
    q = queue(b)
    bind(b, x, q, "a.*")
    assert routed(a, x, "a.b") == [q]
    ok(b.delete(f"/exchanges/{x}"))
    ok(a.post(f"/exchanges/{x}/publish", json={"routing_key": "a.b", "body": 1}), 404)
    ok(b.put(f"/exchanges/{x}", json={"type": "direct"}))
    assert routed(a, x, "a.b") == []
    bind(b, x, q, "a.b")
    assert routed(a, x, "a.b") == [q]
    assert routed(a, x, "a.c") == []


@pytest.mark.parametrize("through", [False, True], ids=["direct", "through-e2e"])
def test_binding_changes_racing_publishes_are_obeyed_on_every_process(
    pair: tuple[httpx.Client, httpx.Client], through: bool
) -> None:
    """While A publishes to the exchange without pause (its copy always warm) and B churns
    other bindings of it and deletes bound queues, every binding that B's 201/204 answered
    before a publish on A began is obeyed by that publish, and no publish fails. With
    ``through``, A publishes to another exchange bound to it (§14)."""
    a, b = pair
    x = exchange(b, "topic")
    entry = x
    if through:
        entry = exchange(b, "fanout")
        ok(b.post("/bindings", json={"exchange": entry, "destination_exchange": x}))
    steady = queue(b)
    bind(b, x, steady, "s.#")
    stop = threading.Event()
    failures: list[str] = []
    publishes = 0

    def hammer() -> None:
        nonlocal publishes
        with _another(a) as rest:
            while not stop.is_set():
                r = rest.post(
                    f"/exchanges/{entry}/publish-batch",
                    json={"messages": [{"routing_key": "s.t", "body": i} for i in range(5)]},
                )
                publishes += 1
                if r.status_code != 200 or any(
                    steady not in res["queues"] for res in r.json()["results"]
                ):
                    failures.append(r.text)

    def churn() -> None:
        with _another(b) as rest:
            while not stop.is_set():
                doomed = queue(rest)
                bind(rest, x, doomed, "s.*")
                bind(rest, x, doomed, "#")
                ok(rest.delete(f"/queues/{doomed}"))

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    threads.append(threading.Thread(target=churn, daemon=True))
    for thread in threads:
        thread.start()
    try:
        for i in range(25):
            q = queue(b)
            binding = bind(b, x, q, f"r.{i}.*")
            assert q in routed(a, entry, f"r.{i}.z"), i
            ok(b.delete(f"/bindings/{binding}"))
            assert q not in routed(a, entry, f"r.{i}.z"), i
            ok(b.delete(f"/queues/{q}"))
            if i % 5 == 0:
                assert not failures, failures[:3]
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert not failures, failures[:3]
    assert publishes > 25  # the publishes really raced the changes


# --------------------------------------------------------------------------- §14: the graph


def link(rest: httpx.Client, source: str, destination: str, key: str = "") -> int:
    body = {"exchange": source, "destination_exchange": destination, "routing_key": key}
    binding_id: int = ok(rest.post("/bindings", json=body))["id"]
    return binding_id


def test_changes_downstream_of_an_exchange_binding_are_obeyed_on_the_other_process(
    pair: tuple[httpx.Client, httpx.Client],
) -> None:
    """A's copy of the source exchange stays current while B changes what lies beyond it:
    the bindings of a downstream exchange, a new exchange binding, a deleted one, and a
    deleted downstream exchange."""
    a, b = pair
    x, y = exchange(b, "direct"), exchange(b, "topic")
    first, second, third = queue(b), queue(b), queue(b)
    link(b, x, y, "k.1")
    bind(b, y, first, "k.*")
    for _ in range(3):  # warm A's copies of x and y
        assert routed(a, x, "k.1") == [first]
    created = bind(b, y, second, "#")  # a downstream queue binding
    assert routed(a, x, "k.1") == [first, second]
    ok(b.delete(f"/bindings/{created}"))
    assert routed(a, x, "k.1") == [first]
    z = exchange(b, "fanout")  # a new edge, to an exchange A never saw
    bind(b, z, third)
    edge = link(b, y, z, "k.1")
    assert routed(a, x, "k.1") == [first, third]
    ok(b.delete(f"/bindings/{edge}"))
    assert routed(a, x, "k.1") == [first]
    link(b, y, z, "#")
    assert routed(a, x, "k.1") == [first, third]
    ok(b.delete(f"/exchanges/{z}"))  # its bindings, both sides, go with it
    assert routed(a, x, "k.1") == [first]
    ok(b.delete(f"/exchanges/{y}"))
    assert routed(a, x, "k.1") == []


def test_a_plain_exchange_that_gains_an_edge_on_b_routes_through_it_on_a(
    pair: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = pair
    x, y = exchange(b, "fanout"), exchange(b, "fanout")
    own, beyond = queue(b), queue(b)
    bind(b, x, own)
    bind(b, y, beyond)
    for _ in range(3):  # A compiles x as a plain exchange
        assert routed(a, x) == [own]
    edge = link(b, x, y)
    assert routed(a, x) == [own, beyond]
    ok(b.delete(f"/bindings/{edge}"))
    assert routed(a, x) == [own]


def test_alternate_exchanges_changed_on_b_are_obeyed_on_a(
    pair: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = pair
    alternate = exchange(b, "fanout")
    caught, again = queue(b), queue(b)
    bind(b, alternate, caught)
    x = exchange(b, "direct", arguments={"alternate-exchange": alternate})
    for _ in range(3):
        assert routed(a, x, "k") == [caught]
    extra = bind(b, alternate, again)  # the alternate's own bindings change
    assert routed(a, x, "k") == [caught, again]
    ok(b.delete(f"/bindings/{extra}"))
    assert routed(a, x, "k") == [caught]
    bound = queue(b)
    direct = bind(b, x, bound, "k")  # x now matches: no detour
    assert routed(a, x, "k") == [bound]
    ok(b.delete(f"/bindings/{direct}"))
    assert routed(a, x, "k") == [caught]
    ok(b.delete(f"/exchanges/{alternate}"))  # the alternate is missing now
    assert routed(a, x, "k") == []
    ok(b.put(f"/exchanges/{alternate}", json={"type": "direct"}))  # and back, by its name
    bind(b, alternate, again, "k")
    assert routed(a, x, "k") == [again]
    assert routed(a, x, "j") == []


def test_a_plain_exchange_declared_again_with_an_alternate_on_b_uses_it_on_a(
    pair: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = pair
    alternate = exchange(b, "fanout")
    caught = queue(b)
    bind(b, alternate, caught)
    x = exchange(b, "direct")
    for _ in range(3):  # A compiles x as a plain exchange
        assert routed(a, x, "k") == []
    ok(b.delete(f"/exchanges/{x}"))
    ok(
        b.put(
            f"/exchanges/{x}",
            json={"type": "direct", "arguments": {"alternate-exchange": alternate}},
        )
    )
    assert routed(a, x, "k") == [caught]
