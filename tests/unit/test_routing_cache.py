"""The routing cache's memory cap (app/broker/routing_cache.py): least recently used
exchanges go first, and an exchange larger than the cap is compiled but never kept. That a
kept copy is used only while current is proven across processes in
tests/api/test_routing_cache.py."""

from __future__ import annotations

from app.broker.routing_cache import RoutingCache
from app.domain.model import ExchangeType
from app.domain.routing import BindingRule
from app.storage.messages import ExchangeRoutes, RoutingVersion


def routes(n: int, version: int = 1) -> ExchangeRoutes:
    bindings = [BindingRule(f"q{i}", f"k{i}", {}) for i in range(n)]
    return ExchangeRoutes(
        ExchangeType.DIRECT, RoutingVersion(1, version), bindings, {f"q{i}": i for i in range(n)}
    )


def test_the_least_recently_used_exchanges_are_dropped_past_the_cap() -> None:
    cache = RoutingCache(max_bindings=10)  # each exchange counts its bindings + 1
    cache._keep("a", routes(3))
    cache._keep("b", routes(3))
    assert len(cache) == 2
    cache._keep("c", routes(3))  # 12 > 10: "a" goes
    assert set(cache._routes) == {"b", "c"}
    cache._keep("b", routes(4, version=2))  # replaced, not added twice
    assert set(cache._routes) == {"c", "b"}
    assert cache._size == 9


def test_an_exchange_larger_than_the_cap_is_compiled_but_not_kept() -> None:
    cache = RoutingCache(max_bindings=10)
    cache._keep("small", routes(2))
    big = cache._keep("big", routes(20))
    assert big.route("k7", {}) == ["q7"]
    assert set(cache._routes) == {"small"}
    assert RoutingCache(max_bindings=0)._keep("x", routes(1)).route("k0", {}) == ["q0"]
