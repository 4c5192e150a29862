"""The walk through exchange-to-exchange bindings and alternate exchanges
(app.domain.routing.route_graph, contract §14), without a database.

Generated graphs check that the walk over compiled bindings (what the publisher runs) answers
what a plain recursive reading of §14 over the reference ``route`` answers, binding by
binding; hand-written cases pin the rules: each exchange once, one copy per queue, the
alternate when an exchange reaches no queue counting its e2e bindings, chains of alternates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.broker.routing_cache import Router, Routes
from app.domain.model import ExchangeType
from app.domain.routing import BindingRule, CompiledRoutes, ExchangeNode, route, route_graph
from app.storage.messages import RoutingVersion


@dataclass
class Spec:
    """One exchange of a generated graph."""

    type: ExchangeType
    queues: list[BindingRule] = field(default_factory=list)
    exchanges: list[BindingRule] = field(default_factory=list)  # destination in ``queue``
    alternate: str | None = None


def compiled(specs: Mapping[str, Spec]) -> dict[str, ExchangeNode]:
    return {
        name: ExchangeNode(
            CompiledRoutes(s.type, s.queues),
            CompiledRoutes(s.type, s.exchanges) if s.exchanges else None,
            s.alternate,
        )
        for name, s in specs.items()
    }


def reference(
    specs: Mapping[str, Spec], exchange: str, key: str, headers: Mapping[str, Any]
) -> list[str]:
    """§14 read recursively, one binding at a time."""
    found: dict[str, None] = {}
    reached: dict[str, bool] = {}

    def visit(name: str) -> None:
        spec = specs[name]
        queues = route(spec.type, spec.queues, key, headers)
        found.update(dict.fromkeys(queues))
        reached[name] = bool(queues)
        for destination in route(spec.type, spec.exchanges, key, headers):
            if destination in specs and destination not in reached:
                visit(destination)
            reached[name] = reached[name] or reached.get(destination, False)
        alternate = spec.alternate
        if not reached[name] and alternate is not None:
            if alternate in specs and alternate not in reached:
                visit(alternate)
            reached[name] = reached.get(alternate, False)

    if exchange in specs:
        visit(exchange)
    return list(found)


def node(kind: ExchangeType, queues: str = "", to: str = "", alternate: str | None = None) -> Spec:
    """A fanout-like shorthand: every name in ``queues``/``to`` bound with key ``k``."""
    return Spec(
        kind,
        [BindingRule(q, "k", {}) for q in queues.split()],
        [BindingRule(x, "k", {}) for x in to.split()],
        alternate,
    )


F = ExchangeType.FANOUT
D = ExchangeType.DIRECT


def walk(specs: Mapping[str, Spec], exchange: str, key: str = "k") -> list[str]:
    got = route_graph(compiled(specs), exchange, key, {})
    assert got == reference(specs, exchange, key, {})
    return got


def test_a_cycle_ends_and_each_queue_gets_one_copy() -> None:
    specs = {
        "a": node(F, "q1", "b c"),
        "b": node(F, "q1 q2", "c a"),
        "c": node(F, "q2 q3", "a"),
    }
    assert walk(specs, "a") == ["q1", "q2", "q3"]
    assert walk(specs, "c") == ["q2", "q3", "q1"]


def test_the_alternate_is_taken_only_when_nothing_is_reached() -> None:
    specs = {
        "x": node(D, "", "y", alternate="ae"),
        "y": node(D, "q"),
        "ae": node(F, "caught"),
    }
    assert walk(specs, "x") == ["q"]
    assert walk(specs, "x", "other") == ["caught"]
    specs["y"] = node(D, "")  # y reaches nothing: x's e2e binding leads nowhere
    assert walk(specs, "x") == ["caught"]


def test_alternates_chain_and_loop_once() -> None:
    specs = {
        "x": node(D, "q", alternate="a1"),
        "a1": node(D, "q1", alternate="a2"),
        "a2": node(F, "end"),
    }
    assert walk(specs, "x", "nothing") == ["end"]
    loop = {"x": node(D, alternate="y"), "y": node(D, alternate="x")}
    assert walk(loop, "x") == []
    assert walk({"x": node(D, alternate="x")}, "x") == []


def test_a_downstream_alternate_counts_for_the_upstream_exchange() -> None:
    specs = {
        "x": node(D, "", "y", alternate="outer"),
        "y": node(D, alternate="inner"),
        "inner": node(F, "inner-q"),
        "outer": node(F, "outer-q"),
    }
    assert walk(specs, "x") == ["inner-q"]


def test_missing_exchanges_reach_nothing() -> None:
    specs = {"x": node(D, "q", "gone", alternate="also-gone")}
    assert walk(specs, "x") == ["q"]
    assert walk(specs, "x", "z") == []
    assert route_graph(compiled(specs), "nowhere", "k", {}) == []


def test_a_chain_longer_than_the_recursion_limit_is_walked() -> None:
    n = 5000
    specs = {f"x{i}": node(F, "", f"x{i + 1}") for i in range(n)}
    specs[f"x{n}"] = node(F, "end")
    assert route_graph(compiled(specs), "x0", "", {}) == ["end"]


_NAMES = ["x0", "x1", "x2", "x3"]
_QUEUES = ["q1", "q2", "q3"]
_KEYS = st.sampled_from(["a", "b", "a.b", "#", "*", ""])
_HEADERS = st.dictionaries(
    st.sampled_from(["h", "x-k"]), st.sampled_from([1, "1", True]), max_size=2
)


@st.composite
def graphs(draw: st.DrawFn) -> dict[str, Spec]:
    specs: dict[str, Spec] = {}
    for name in draw(st.lists(st.sampled_from(_NAMES), min_size=1, unique=True)):
        spec = Spec(draw(st.sampled_from(list(ExchangeType))))
        for _ in range(draw(st.integers(0, 3))):
            spec.queues.append(
                BindingRule(draw(st.sampled_from(_QUEUES)), draw(_KEYS), draw(_HEADERS))
            )
        for _ in range(draw(st.integers(0, 3))):
            spec.exchanges.append(
                BindingRule(draw(st.sampled_from(_NAMES)), draw(_KEYS), draw(_HEADERS))
            )
        spec.alternate = draw(st.none() | st.sampled_from(_NAMES))
        specs[name] = spec
    return specs


@settings(max_examples=300, deadline=None)
@given(
    specs=graphs(),
    entry=st.sampled_from(_NAMES),
    key=st.sampled_from(["a", "b", "a.b", ""]),
    headers=_HEADERS,
)
def test_the_compiled_walk_agrees_with_the_reference(
    specs: dict[str, Spec], entry: str, key: str, headers: dict[str, Any]
) -> None:
    expected = reference(specs, entry, key, headers)
    assert route_graph(compiled(specs), entry, key, headers) == expected
    assert len(set(expected)) == len(expected)
    if entry in specs:
        # The router the publisher uses (routing_cache.Router) answers the same, with ids.
        found = {
            name: Routes(
                s.type,
                RoutingVersion(1, 1),
                CompiledRoutes(s.type, s.queues),
                {r.queue: int(r.queue[1:]) for r in s.queues},
                1,
                CompiledRoutes(s.type, s.exchanges) if s.exchanges else None,
                s.alternate,
            )
            for name, s in specs.items()
        }
        router = Router(found, entry)
        assert router(key, headers) == expected
        assert all(router.queue_ids[q] == int(q[1:]) for q in expected)
        kinds = {s.type for s in specs.values()}
        if ExchangeType.HEADERS not in kinds:
            assert router.by_key_only


def test_a_leaf_exchange_is_routed_by_its_own_bindings_alone() -> None:
    queues = CompiledRoutes(D, [BindingRule("q", "k", {})])
    leaf = ExchangeNode(queues)
    assert leaf.leaf
    assert route_graph({"x": leaf}, "x", "k", {}) == ["q"]
    found = {"x": Routes(D, RoutingVersion(1, 1), queues, {"q": 1}, 1)}
    router = Router(found, "x")
    assert router.queue_ids is found["x"].queue_ids  # nothing merged for a leaf
    assert partial(router, "k")({}) == ["q"]
