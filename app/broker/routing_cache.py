"""Each exchange's bindings, compiled once per change rather than read on every publish.

A publish reads, in one round trip, the current ``(id, routing_version)`` of the exchanges
it names and the bindings of only those whose version differs from the compiled copy kept
here (``storage.messages.load_routes``). Every statement that adds or removes bindings
bumps the version in the same transaction (a trigger: migration 0004), so a binding created or
deleted through any process is obeyed by the next publish on every process, exactly as
when every publish read every binding: the copy is used only when the snapshot that the
publish reads says it is current.

Exchange-to-exchange bindings and alternate exchanges (contract §14) make a publish's route
depend on every exchange reachable from the one it names. Each compiled copy knows its own
edges (its e2e bindings are bindings of it, so they change its version; its alternate is in
its arguments, which change only with its id). While every named exchange's copy has no
edge, the publish reads exactly as before (``graph=False``). Otherwise it reads, still in one
round trip and one snapshot, the versions (and changed bindings) of every exchange reachable
now (``graph=True``: a recursive query), passing the versions of those it reached last time;
so a binding change on a downstream exchange, a new or removed edge, or a deleted or
re-declared alternate is obeyed by the next publish on every process. The plain read carries
each exchange's ``onward`` count (migration 0009), so an exchange that gains its first edge
since it was compiled costs that one publish a second read.

Memory is capped: the least recently published-to exchanges are dropped first once the
copies hold more than ``max_bindings`` bindings in all; an exchange larger than the cap on
its own is never kept (each publish to it reads and compiles its bindings, as before).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from app.domain.model import ExchangeType
from app.domain.routing import CompiledRoutes, ExchangeNode, Matcher, route_graph
from app.storage import messages as store
from app.storage.fastpath import HotPath

#: at most this many bindings are kept compiled in all, per broker process
#: (``MESSAGEX_ROUTING_CACHE_BINDINGS``); about 0.5 KB each with short names and keys
MAX_BINDINGS = 200_000


@dataclass(frozen=True, slots=True)
class Routes:
    """An exchange's bindings, compiled, at one routing version."""

    type: ExchangeType
    at: store.RoutingVersion
    route: CompiledRoutes
    queue_ids: dict[str, int]
    size: int
    #: its exchange-to-exchange bindings, compiled (destination exchange names); None: none
    onward: CompiledRoutes | None = None
    alternate: str | None = None
    #: the exchanges it leads to: e2e destinations, then the alternate
    edges: tuple[str, ...] = ()

    @property
    def leaf(self) -> bool:
        return self.onward is None and self.alternate is None

    def node(self) -> ExchangeNode:
        return ExchangeNode(self.route, self.onward, self.alternate)


class Router:
    """Routes messages published to one exchange (the router's one entry point, for
    publishing and for dead-lettering through an exchange alike): through its compiled
    bindings alone when it is a leaf — exactly as before §14 — else through the graph of the
    exchanges ``found`` with it (``domain.routing.route_graph``). ``queue_ids`` maps every
    queue it can return to its id; ``by_key_only`` says whether the routing key alone
    decides (no headers exchange on the way)."""

    __slots__ = ("_route", "by_key_only", "queue_ids")

    def __init__(self, found: Mapping[str, Routes], exchange: str) -> None:
        root = found[exchange]
        self._route: Matcher
        if root.leaf:
            self._route = root.route
            self.by_key_only = root.route.by_key_only
            self.queue_ids = root.queue_ids
            return
        nodes = {name: routes.node() for name, routes in found.items()}
        self._route = partial(route_graph, nodes, exchange)
        self.by_key_only = all(routes.route.by_key_only for routes in found.values())
        self.queue_ids = {}
        for routes in found.values():
            self.queue_ids.update(routes.queue_ids)

    def __call__(self, routing_key: str, headers: Mapping[str, Any]) -> list[str]:
        """Distinct names of the queues the message goes to."""
        return self._route(routing_key, headers)


class RoutingCache:
    def __init__(self, max_bindings: int = MAX_BINDINGS) -> None:
        self.max_bindings = max_bindings
        self._routes: OrderedDict[str, Routes] = OrderedDict()
        self._size = 0
        #: how many exchange reads brought bindings (a compiled copy missing or stale)
        self.compiled = 0

    def __len__(self) -> int:
        return len(self._routes)

    async def load(self, hot: HotPath, names: Sequence[str]) -> dict[str, Routes]:
        """The routes of each named exchange that exists, and of every exchange reachable
        from them (e2e bindings, alternates), current as of one snapshot."""
        routes = self._routes
        if all(name in routes and routes[name].leaf for name in names):
            kept = {name: routes[name] for name in names}
            loaded = await store.load_routes(hot, names, {n: r.at for n, r in kept.items()})
            if all(
                not isinstance(got, store.ExchangeRoutes) or got.complete for got in loaded.values()
            ):
                return self._take(names, kept, loaded)
            # A named exchange gained an edge since it was compiled: read its graph.
        kept = {name: routes[name] for name in self._reach(names) if name in routes}
        known = {n: r.at for n, r in kept.items()}
        return self._take(names, kept, await store.load_routes(hot, names, known, graph=True))

    async def route(
        self, hot: HotPath, exchange: str, routing_key: str, headers: Mapping[str, Any]
    ) -> dict[str, int] | None:
        """One message through ``exchange`` (e.g. a dead-lettered copy): the queues it goes to,
        name → id, in routing order; None when the exchange does not exist."""
        found = await self.load(hot, [exchange])
        if exchange not in found:
            return None
        router = Router(found, exchange)
        return {queue: router.queue_ids[queue] for queue in router(routing_key, headers)}

    def _reach(self, names: Sequence[str]) -> set[str]:
        """The exchanges the compiled copies say ``names`` lead to (themselves included)."""
        reach = set(names)
        pending = list(names)
        while pending:
            got = self._routes.get(pending.pop())
            for edge in got.edges if got is not None else ():
                if edge not in reach:
                    reach.add(edge)
                    pending.append(edge)
        return reach

    def _take(
        self,
        names: Sequence[str],
        kept: dict[str, Routes],
        loaded: dict[str, store.ExchangeRoutes | store.RoutingVersion],
    ) -> dict[str, Routes]:
        """The routes ``loaded`` says are current: ``kept`` copies or newly compiled ones."""
        found: dict[str, Routes] = {}
        for name in names:
            if name not in loaded:  # no such exchange (any more)
                self._drop(name)
        for name, got in loaded.items():
            if isinstance(got, store.RoutingVersion):
                found[name] = kept[name]
                if name in self._routes:
                    self._routes.move_to_end(name)
            else:
                found[name] = self._keep(name, got)
        return found

    def _keep(self, name: str, loaded: store.ExchangeRoutes) -> Routes:
        self.compiled += 1
        size = len(loaded.bindings) + len(loaded.onward) + 1
        edges = [b.queue for b in loaded.onward]
        if loaded.alternate is not None:
            edges.append(loaded.alternate)
        routes = Routes(
            loaded.type,
            loaded.at,
            CompiledRoutes(loaded.type, loaded.bindings),
            loaded.queue_ids,
            size,
            CompiledRoutes(loaded.type, loaded.onward) if loaded.onward else None,
            loaded.alternate,
            tuple(dict.fromkeys(edges)),
        )
        self._drop(name)
        if size > self.max_bindings:
            return routes
        self._routes[name] = routes
        self._size += size
        while self._size > self.max_bindings:
            _, evicted = self._routes.popitem(last=False)
            self._size -= evicted.size
        return routes

    def _drop(self, name: str) -> None:
        gone = self._routes.pop(name, None)
        if gone is not None:
            self._size -= gone.size
