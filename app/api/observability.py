"""HTTP metrics: request count and latency by route template and status.

A pure ASGI middleware (it never buffers bodies, so streaming and the body limit are
unaffected). The label is the matched route's *template* (``/api/v1/queues/{name}``), never
the raw path, so a scan of random URLs cannot blow up the metric's cardinality: requests
that match no route are labelled ``unmatched``. WebSocket sessions are not counted here.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"
#: a scope key for handlers that answer before the router (app.api.edge): the route template
TEMPLATE_KEY = "messagex.route_template"


def route_template(scope: Scope) -> str:
    """The template of the route the router matched, once routing has happened.

    FastAPI puts the route as declared on its ``APIRouter`` in ``scope["route"]``: its path
    lacks the prefix given to ``include_router`` (``/queues/{name}`` for
    ``/api/v1/queues/q1``). The prefix is the part of the request path before the route's
    own pattern matches; our prefixes are static text, so no raw value reaches a label.
    """
    given = scope.get(TEMPLATE_KEY)
    if given is not None:
        return str(given)
    route: Any = scope.get("route")
    cached = _TEMPLATES.get(id(route)) if route is not None else None
    if cached is not None and cached[0] is route:
        return cached[1]
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    if not isinstance(template, str):
        return UNMATCHED
    full = _full_template(route, template, scope.get("path", ""))
    _TEMPLATES[id(route)] = (route, full)  # prefixes are static: one answer per route
    return full


#: route → its full template (the route is kept alive by the app; stored to check identity)
_TEMPLATES: dict[int, tuple[Any, str]] = {}


def _full_template(route: Any, template: str, path: str) -> str:
    regex = getattr(route, "path_regex", None)
    if regex is None or regex.match(path):
        return template
    for i, char in enumerate(path):
        if char == "/" and i > 0 and regex.match(path[i:]):
            return path[:i] + template
    return template


class HttpMetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees when the app raises before responding

        async def send_recording_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_recording_status)
        finally:
            self._record(scope, status, time.perf_counter() - started)

    @staticmethod
    def _record(scope: Scope, status: int, seconds: float) -> None:
        app = scope.get("app")
        services = getattr(getattr(app, "state", None), "services", None)
        metrics = getattr(services, "metrics", None)
        if metrics is None:  # before the lifespan has built the services
            return
        route = route_template(scope)
        metrics.http_requests.labels(route=route, status=str(status)).inc()
        metrics.http_latency.labels(route=route).observe(seconds)
