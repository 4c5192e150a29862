"""The publisher's per-call router (app.broker.publisher._Router), without a database: it
routes as app.domain.routing does, routing each distinct key once per call (headers routing
once per message), and a direct exchange looks only at the bindings with the message's key."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from app.broker import publisher
from app.domain.model import ExchangeType, OutgoingMessage
from app.domain.routing import BindingRule, route
from app.storage.messages import ExchangeRoutes

Call = tuple[str, list[str]]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Each call of the routing function: the message's key and the bindings' queues."""
    seen: list[Call] = []

    def counting(kind: ExchangeType, bindings: Iterable[BindingRule], *key_headers: Any) -> Any:
        bindings = list(bindings)
        seen.append((key_headers[0], [b.queue for b in bindings]))
        return route(kind, bindings, *key_headers)

    monkeypatch.setattr(publisher, "route", counting)
    return seen


def router(kind: ExchangeType, *bindings: tuple[str, str, dict[str, Any]]) -> Any:
    rules = [BindingRule(queue, key, arguments) for queue, key, arguments in bindings]
    return publisher._Router(ExchangeRoutes(kind, rules, {}))


def message(key: str, **headers: Any) -> OutgoingMessage:
    return OutgoingMessage(b"1", False, routing_key=key, headers=headers)


def test_a_direct_exchange_looks_only_at_the_bindings_with_the_key(calls: list[Call]) -> None:
    r = router(
        ExchangeType.DIRECT,
        ("q1", "a", {}),
        ("q2", "b", {}),
        ("q3", "a", {}),
        ("q1", "a", {}),  # a queue bound twice gets one copy
    )
    assert r(message("a")) == ["q1", "q3"]
    assert r(message("b")) == ["q2"]
    assert r(message("a")) == ["q1", "q3"]
    assert r(message("none")) == []
    assert calls == [("a", ["q1", "q3", "q1"]), ("b", ["q2"]), ("none", [])]


def test_topic_and_fanout_route_each_distinct_key_once(calls: list[Call]) -> None:
    topic = router(ExchangeType.TOPIC, ("all", "#", {}), ("orders", "order.*", {}))
    keys = ["order.created", "order.created", "user.created", "order.created"]
    assert [topic(message(k)) for k in keys] == [
        ["all", "orders"],
        ["all", "orders"],
        ["all"],
        ["all", "orders"],
    ]
    assert [key for key, _ in calls] == ["order.created", "user.created"]
    calls.clear()
    fanout = router(ExchangeType.FANOUT, ("q1", "", {}), ("q2", "x", {}))
    assert fanout(message("k")) == fanout(message("k")) == ["q1", "q2"]
    assert len(calls) == 1


def test_headers_routing_runs_per_message(calls: list[Call]) -> None:
    r = router(
        ExchangeType.HEADERS,
        ("eu", "", {"x-match": "all", "region": "eu"}),
        ("any", "", {"x-match": "any", "region": "eu", "kind": "a"}),
    )
    assert r(message("k", region="eu")) == ["eu", "any"]
    assert r(message("k", region="us", kind="a")) == ["any"]
    assert r(message("k", region="us")) == []
    assert len(calls) == 3  # the same key, different headers: no memo
