"""Each exchange's bindings, compiled once per change rather than read on every publish.

A publish reads, in one round trip, the current ``(id, routing_version)`` of the exchanges
it names and the bindings of only those whose version differs from the compiled copy kept
here (``storage.messages.load_routes``). Every statement that adds or removes bindings
bumps the version in the same transaction (a trigger: migration 0004), so a binding created or
deleted through any process is obeyed by the next publish on every process, exactly as
when every publish read every binding: the copy is used only when the snapshot that the
publish reads says it is current.

Memory is capped: the least recently published-to exchanges are dropped first once the
copies hold more than ``max_bindings`` bindings in all; an exchange larger than the cap on
its own is never kept (each publish to it reads and compiles its bindings, as before).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.model import ExchangeType
from app.domain.routing import CompiledRoutes
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
        """The routes of each named exchange that exists, current as of one snapshot."""
        known = {name: self._routes[name].at for name in names if name in self._routes}
        loaded = await store.load_routes(hot, names, known)
        found: dict[str, Routes] = {}
        for name in names:
            got = loaded.get(name)
            if got is None:  # no such exchange (any more)
                self._drop(name)
            elif isinstance(got, store.RoutingVersion):
                found[name] = self._routes[name]
                self._routes.move_to_end(name)
            else:
                found[name] = self._keep(name, got)
        return found

    def _keep(self, name: str, loaded: store.ExchangeRoutes) -> Routes:
        self.compiled += 1
        size = len(loaded.bindings) + 1
        routes = Routes(
            loaded.type,
            loaded.at,
            CompiledRoutes(loaded.type, loaded.bindings),
            loaded.queue_ids,
            size,
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
