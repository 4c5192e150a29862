"""The publisher's per-call router (app.broker.publisher._Router), without a database: it
routes through an exchange's compiled bindings, each distinct key once per call (headers
routing once per message)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.broker import publisher
from app.broker.routing_cache import Routes
from app.domain.model import ExchangeType, OutgoingMessage
from app.domain.routing import BindingRule, CompiledRoutes
from app.storage.messages import RoutingVersion

Call = tuple[str, dict[str, Any]]


class Counting(CompiledRoutes):
    """The compiled routes, recording each call: the message's key and headers."""

    __slots__ = ("calls",)

    def __init__(self, kind: ExchangeType, bindings: list[BindingRule]) -> None:
        super().__init__(kind, bindings)
        self.calls: list[Call] = []

    def __call__(self, routing_key: str, headers: Mapping[str, Any]) -> list[str]:
        self.calls.append((routing_key, dict(headers)))
        return super().__call__(routing_key, headers)


def router(
    kind: ExchangeType, *bindings: tuple[str, str, dict[str, Any]]
) -> tuple[publisher._Router, list[Call]]:
    rules = [BindingRule(queue, key, arguments) for queue, key, arguments in bindings]
    compiled = Counting(kind, rules)
    routes = Routes(kind, RoutingVersion(1, 1), compiled, {}, len(rules))
    return publisher._Router(routes), compiled.calls  # a leaf: routed by its own copy


def message(key: str, **headers: Any) -> OutgoingMessage:
    return OutgoingMessage(b"1", False, routing_key=key, headers=headers)


def test_a_direct_exchange_routes_each_distinct_key_once() -> None:
    r, calls = router(
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
    assert [key for key, _ in calls] == ["a", "b", "none"]


def test_topic_and_fanout_route_each_distinct_key_once() -> None:
    topic, calls = router(ExchangeType.TOPIC, ("all", "#", {}), ("orders", "order.*", {}))
    keys = ["order.created", "order.created", "user.created", "order.created"]
    assert [topic(message(k)) for k in keys] == [
        ["all", "orders"],
        ["all", "orders"],
        ["all"],
        ["all", "orders"],
    ]
    assert [key for key, _ in calls] == ["order.created", "user.created"]
    fanout, calls = router(ExchangeType.FANOUT, ("q1", "", {}), ("q2", "x", {}))
    assert fanout(message("k")) == fanout(message("k")) == ["q1", "q2"]
    assert len(calls) == 1


def test_headers_routing_runs_per_message() -> None:
    r, calls = router(
        ExchangeType.HEADERS,
        ("eu", "", {"x-match": "all", "region": "eu"}),
        ("any", "", {"x-match": "any", "region": "eu", "kind": "a"}),
    )
    assert r(message("k", region="eu")) == ["eu", "any"]
    assert r(message("k", region="us", kind="a")) == ["any"]
    assert r(message("k", region="us")) == []
    assert len(calls) == 3  # the same key, different headers: no memo
    assert calls[1] == ("k", {"region": "us", "kind": "a"})
