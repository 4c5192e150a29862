"""The hot edge: the per-message routes answered without FastAPI's per-request machinery.

A pure ASGI middleware in front of the router. For ``POST /api/v1/queues/{name}/messages``,
``/exchanges/{name}/publish`` and ``/exchanges/{name}/publish-batch`` it authenticates (before
reading anything of the body: a stranger cannot make it read and parse 16 MiB), reads the JSON
body, decodes the common form of a publish (``schemas.messages.fast_decode_*``),
publishes and writes the same response the routes would; for a pull ACK
(``POST /api/v1/deliveries/{delivery_tag}/ack``) it authenticates and acks. It skips route
matching, dependency solving and response-model serialisation: most of the broker's CPU for
a single publish or ACK (docs/performance.md).

It answers only what it is sure of. Anything else — another content type, a name the path
rule refuses, a body that is not JSON or that the shortcut does not decode (the pydantic
models decide those) — goes on to the FastAPI route with the body replayed,
before anything was done, so errors, 422 details and the OpenAPI document stay the routes'
own. Authentication, publish and ack errors are answered here through the same problem
mapping as the exception handlers. The route's template is put in the scope
(``observability.TEMPLATE_KEY``) so the HTTP metrics keep their route label.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import jsonexact
from app.api.observability import TEMPLATE_KEY
from app.api.problems import broker_error_response
from app.api.rest.consume import ack_pulled
from app.api.schemas.common import MAX_TAG
from app.api.schemas.messages import fast_decode_publish, fast_decode_publish_batch
from app.domain.model import NAME_PATTERN, OutgoingMessage, PublishResult, User
from app.errors import BrokerError

_PATH = re.compile(r"/api/v1/(queues|exchanges)/([^/]+)/(messages|publish|publish-batch)")
_ACK_PATH = re.compile(rf"/api/v1/deliveries/([^/]{{1,{MAX_TAG}}})/ack")
_ACK_TEMPLATE = "/api/v1/deliveries/{delivery_tag}/ack"
_NAME = re.compile(NAME_PATTERN)

#: (collection, action) → (the route's template, decoder, batch?)
_ROUTES: dict[tuple[str, str], tuple[str, Callable[[Any], Any], bool]] = {
    ("queues", "messages"): ("/api/v1/queues/{name}/messages", fast_decode_publish, False),
    ("exchanges", "publish"): ("/api/v1/exchanges/{name}/publish", fast_decode_publish, False),
    ("exchanges", "publish-batch"): (
        "/api/v1/exchanges/{name}/publish-batch",
        fast_decode_publish_batch,
        True,
    ),
}

_JSON_HEADERS = [(b"content-type", b"application/json")]


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json"


def _result(result: PublishResult) -> dict[str, Any]:
    return {"routed": result.routed, "queues": result.queues, "message_id": result.message_id}


@dataclass(frozen=True, slots=True)
class _Target:
    services: Any
    to_queue: bool
    name: str
    template: str
    decode: Callable[[Any], Any]
    batch: bool
    authorization: str | None


def _services(scope: Scope) -> Any:
    """The app's services, once the lifespan has built them."""
    return getattr(getattr(scope.get("app"), "state", None), "services", None)


def _authorization(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"authorization":
            return str(value.decode("latin-1"))
    return None


def _client_host(scope: Scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None


def _target(scope: Scope) -> _Target | None:
    """What the request asks of the edge, or None when the routes should answer it."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    match = _PATH.fullmatch(scope["path"])
    kind = _ROUTES.get((match[1], match[3])) if match else None
    services = _services(scope)
    if match is None or kind is None or services is None:
        return None
    name = match[2]
    if not _NAME.fullmatch(name):  # NAME_PATTERN also bounds the length (255)
        return None
    content_type = next((v for k, v in scope["headers"] if k == b"content-type"), None)
    if content_type is None or not _is_json(content_type):
        return None
    template, decode, batch = kind
    return _Target(
        services, match[1] == "queues", name, template, decode, batch, _authorization(scope)
    )


def _decode(target: _Target, body: bytes) -> Any:
    """The decoded publish, or None (the route decides). The body is read as the routes read
    it (the stdlib's json, integers past 64 bits exact), by the rule of app.jsonexact."""
    try:
        data = jsonexact.loads(body)
    except ValueError:
        return None
    return target.decode(data)


class PublishEdge:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ack = _ACK_PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        services = _services(scope) if ack is not None and scope["method"] == "POST" else None
        if ack is not None and services is not None:
            await _ack(scope, receive, send, services, ack[1])
            return
        target = _target(scope)
        if target is None:
            await self.app(scope, receive, send)
            return
        try:  # before the body (up to MESSAGEX_MAX_REQUEST_BYTES) is read or parsed
            user = await target.services.auth.authenticate(
                target.authorization, _client_host(scope)
            )
        except BrokerError as exc:
            scope[TEMPLATE_KEY] = target.template
            await broker_error_response(exc)(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:  # the client went away
            return
        decoded = _decode(target, body)
        if decoded is None:
            await self.app(scope, _replay(body, receive), send)
            return
        scope[TEMPLATE_KEY] = target.template
        try:
            content = await _publish(target, decoded, user)
        except BrokerError as exc:
            await broker_error_response(exc)(scope, receive, send)
            return
        headers = [(b"content-length", str(len(content)).encode()), *_JSON_HEADERS]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})


async def _publish(target: _Target, decoded: Any, user: User) -> bytes:
    """Publish as ``user``; the response body. Raises BrokerError."""
    services = target.services
    messages: list[OutgoingMessage] = decoded if target.batch else [decoded]
    if target.to_queue:
        results = await services.publisher.publish_to_queue(user, target.name, messages)
    else:
        results = await services.publisher.publish(user, target.name, messages)
    if target.batch:
        return orjson.dumps({"results": [_result(r) for r in results]})
    return orjson.dumps(_result(results[0]))


async def _ack(scope: Scope, receive: Receive, send: Send, services: Any, tag: str) -> None:
    """``POST /deliveries/{delivery_tag}/ack``: 204, or the route's problem (it reads no body)."""
    if await _read_body(receive) is None:
        return
    scope[TEMPLATE_KEY] = _ACK_TEMPLATE
    try:
        user = await services.auth.authenticate(_authorization(scope), _client_host(scope))
        await ack_pulled(services, user, tag)
    except BrokerError as exc:
        await broker_error_response(exc)(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


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
