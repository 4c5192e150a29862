"""The hot edge: the per-message routes answered without FastAPI's per-request machinery.

A pure ASGI middleware in front of the router. For the three publish routes (one message to
an exchange, a batch to an exchange, one message straight to a queue) it authenticates
(before reading anything of the body: a stranger cannot make it read and parse 16 MiB), reads
the JSON body, decodes the common form of a publish (the ``fast`` form of
``schemas.messages.PUBLISH`` / ``PUBLISH_BATCH``, app.api.shortcut), publishes and writes the
same response the routes would; for a pull ACK it authenticates and acks. It skips route
matching, dependency solving and response-model serialisation: most of the broker's CPU for
a single publish or ACK (docs/performance.md).

It answers only what it is sure of. Anything else — another content type, a name the path
rule refuses, a body that is not JSON or that the shortcut does not decode (the pydantic
models decide those) — goes on to the FastAPI route with the body replayed,
before anything was done, so errors, 422 details and the OpenAPI document stay the routes'
own. Authentication, publish and ack errors are answered here through the same problem
mapping as the exception handlers. The route's template is put in the scope
(``observability.TEMPLATE_KEY``) so the HTTP metrics keep their route label.

Which routes it answers is named by their endpoints (``HOT_ROUTES``); their paths, methods
and path patterns come from the app's own route table, once, when the middleware is built.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi.routing import iter_route_contexts
from starlette.convertors import StringConvertor
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import jsonexact
from app.api.observability import TEMPLATE_KEY
from app.api.problems import broker_error_response
from app.api.rest import consume, publish
from app.api.schemas.common import MAX_TAG
from app.api.schemas.messages import PUBLISH, PUBLISH_BATCH, result_fields
from app.broker.services import Services
from app.domain.model import NAME_PATTERN, OutgoingMessage, PublishResult, User
from app.domain.tracecontext import with_trace_context
from app.errors import BrokerError

_NAME = re.compile(NAME_PATTERN)
_JSON_HEADERS = [(b"content-type", b"application/json")]

#: the publish body's fast decoder: one message, or a batch's messages in order
FastPublish = Callable[[Any], OutgoingMessage | list[OutgoingMessage] | None]


@dataclass(frozen=True, slots=True)
class Publish:
    """A publish route: its body's shortcut, and whether it publishes straight to a queue."""

    fast: FastPublish
    to_queue: bool = False

    async def answer(
        self,
        route: ASGIApp,
        hot: HotRoute,
        name: str,
        services: Services,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        # NAME_PATTERN also bounds the length (255)
        if not _NAME.fullmatch(name) or not _json_content(scope):
            await route(scope, receive, send)
            return
        try:  # before the body (up to MESSAGEX_MAX_REQUEST_BYTES) is read or parsed
            user = await services.auth.authenticate(_authorization(scope), _client_host(scope))
        except BrokerError as exc:
            scope[TEMPLATE_KEY] = hot.template
            await broker_error_response(exc)(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:  # the client went away
            return
        decoded = _decode(self.fast, body)
        if decoded is None:
            await route(scope, _replay(body, receive), send)
            return
        scope[TEMPLATE_KEY] = hot.template
        try:
            content = await self._publish(services, user, name, decoded, _trace_context(scope))
        except BrokerError as exc:
            await broker_error_response(exc)(scope, receive, send)
            return
        headers = [(b"content-length", str(len(content)).encode()), *_JSON_HEADERS]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def _publish(
        self,
        services: Services,
        user: User,
        name: str,
        decoded: OutgoingMessage | list[OutgoingMessage],
        trace: tuple[str | None, str | None],
    ) -> bytes:
        """Publish as ``user``; the response body. Raises BrokerError."""
        messages = with_trace_context(decoded if isinstance(decoded, list) else [decoded], *trace)
        if self.to_queue:
            results = await services.publisher.publish_to_queue(user, name, messages)
        else:
            results = await services.publisher.publish(user, name, messages)
        if isinstance(decoded, list):
            return orjson.dumps({"results": [_result(r) for r in results]})
        return orjson.dumps(_result(results[0]))


@dataclass(frozen=True, slots=True)
class PullAck:
    """A pull ACK: 204, or the route's problem (it reads no body)."""

    async def answer(
        self,
        route: ASGIApp,
        hot: HotRoute,
        tag: str,
        services: Services,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        if len(tag) > MAX_TAG:  # the route's 422
            await route(scope, receive, send)
            return
        if await _read_body(receive) is None:
            return
        scope[TEMPLATE_KEY] = hot.template
        try:
            user = await services.auth.authenticate(_authorization(scope), _client_host(scope))
            await consume.ack_pulled(services, user, tag)
        except BrokerError as exc:
            await broker_error_response(exc)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


#: The routes the edge answers, by endpoint, and how.
HOT_ROUTES: Mapping[Callable[..., Any], Publish | PullAck] = {
    publish.publish_message: Publish(PUBLISH.fast),
    publish.publish_batch: Publish(PUBLISH_BATCH.fast),
    publish.publish_to_queue: Publish(PUBLISH.fast, to_queue=True),
    consume.ack_delivery: PullAck(),
}


@dataclass(frozen=True, slots=True)
class HotRoute:
    """One of HOT_ROUTES as the app's route table has it."""

    template: str  # the full path template, the metrics' route label
    methods: frozenset[str]
    action: Publish | PullAck


@dataclass(frozen=True, slots=True)
class HotRoutes:
    """HOT_ROUTES out of the app's route table: one regular expression made of the routes'
    own path patterns (Starlette's ``path_regex``), each route's one path parameter renamed
    to a group of its own, so that one match rules a request in or out and says which route
    and what parameter (the old hand-written patterns took one or two matches)."""

    pattern: re.Pattern[str]
    by_group: dict[str, HotRoute]

    @classmethod
    def of(cls, routes: Iterable[BaseRoute]) -> HotRoutes:
        """Raises RuntimeError when the table lacks one, or a path does not fit (a bug)."""
        parts: list[str] = []
        by_group: dict[str, HotRoute] = {}
        for route in iter_route_contexts(list(routes)):
            action = HOT_ROUTES.get(route.endpoint) if route.endpoint is not None else None
            if action is None:
                continue
            group = f"p{len(parts)}"
            source: str = route.path_regex.pattern
            part = re.sub(
                r"\(\?P<\w+>", f"(?P<{group}>", source.removeprefix("^").removesuffix("$")
            )
            convertors = list(route.param_convertors.values())
            compiled = re.compile(part)
            if (
                len(convertors) != 1
                or not isinstance(convertors[0], StringConvertor)
                or compiled.groups != 1
                or group not in compiled.groupindex
            ):
                raise RuntimeError(f"the hot edge cannot answer {route.path}")
            parts.append(part)
            by_group[group] = HotRoute(str(route.path), frozenset(route.methods or ()), action)
        if len(parts) != len(HOT_ROUTES):
            raise RuntimeError("a route the hot edge answers is missing from the app")
        return cls(re.compile("|".join(parts)), by_group)


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json"


def _json_content(scope: Scope) -> bool:
    content_type = next((v for k, v in scope["headers"] if k == b"content-type"), None)
    return content_type is not None and _is_json(content_type)


def _result(result: PublishResult) -> dict[str, Any]:
    return result_fields(result)


def _services(scope: Scope) -> Services | None:
    """The app's services, once the lifespan has built them."""
    services: Services | None = getattr(getattr(scope.get("app"), "state", None), "services", None)
    return services


def _trace_context(scope: Scope) -> tuple[str | None, str | None]:
    """The request's W3C ``traceparent`` and ``tracestate`` headers (app.domain.tracecontext)."""
    traceparent = tracestate = None
    for key, value in scope["headers"]:
        if key == b"traceparent":
            traceparent = value.decode("latin-1")
        elif key == b"tracestate":
            tracestate = value.decode("latin-1")
    return traceparent, tracestate


def _authorization(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"authorization":
            return str(value.decode("latin-1"))
    return None


def _client_host(scope: Scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None


def _decode(fast: FastPublish, body: bytes) -> OutgoingMessage | list[OutgoingMessage] | None:
    """The decoded publish, or None (the route decides). The body is read as the routes read
    it (the stdlib's json, integers past 64 bits exact), by the rule of app.jsonexact."""
    try:
        data = jsonexact.loads(body)
    except ValueError:
        return None
    return fast(data)


class PublishEdge:
    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        self.routes = HotRoutes.of(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = self.routes.pattern.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if match is not None:
            group = str(match.lastgroup)
            hot = self.routes.by_group[group]
            services = _services(scope) if scope["method"] in hot.methods else None
            if services is not None:
                await hot.action.answer(self.app, hot, match[group], services, scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the already-read body once, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
