"""The app factory: settings in, FastAPI out. Nothing is built at import."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.models import OpenAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema

from app import __version__
from app.api import docs, problems, ui
from app.api.edge import PublishEdge
from app.api.exposure import STATE_CHANGING, ExposureGuard
from app.api.limits import BodyLimitMiddleware
from app.api.observability import HttpMetricsMiddleware
from app.api.rest import (
    auth,
    bindings,
    connections,
    consume,
    diagnosis,
    exchanges,
    history,
    message_ops,
    messages,
    ops,
    publish,
    queues,
    users,
)
from app.api.ws import endpoint as ws_endpoint
from app.config import Settings, load_settings
from app.lifespan import lifespan

API_PREFIX = "/api/v1"
REF_TEMPLATE = "#/components/schemas/{model}"

TAGS = [
    {"name": "auth", "description": "Log in and out; who am I"},
    {"name": "users", "description": "Broker users and their permissions (admin only)"},
    {"name": "exchanges", "description": "Declare, list and delete exchanges"},
    {"name": "queues", "description": "Declare, list, purge and delete queues"},
    {"name": "bindings", "description": "Bind queues to exchanges"},
    {"name": "publish", "description": "Publish messages (publisher confirms: 200 = committed)"},
    {"name": "messages", "description": "Browse, read and delete stored messages"},
    {"name": "consume", "description": "Pull consumption: get, ack and nack over HTTP"},
    {"name": "operations", "description": "Health, readiness, metrics, overview"},
    {"name": "connections", "description": "WebSocket connections of every process (admin)"},
]


def _operation_id(route: APIRoute) -> str:
    """Stable operation ids for generated clients: the route's function name."""
    return route.name


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()
    app = FastAPI(
        title="MessageX",
        version=__version__,
        summary="A message broker over HTTP and WebSocket that keeps every message in PostgreSQL",
        openapi_tags=TAGS,
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        # No trailing-slash redirects: a name segment ending in an encoded slash
        # (PUT /queues/a%2F) would be redirected, method and body kept, to another
        # resource (/queues/a), and fetch() and curl -L follow such a redirect.
        redirect_slashes=False,
        # /docs is app.api.docs (Swagger UI from the package, not a CDN); no ReDoc (a CDN too)
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    problems.install(app)
    # Publishes and pull ACKs are answered before routing (PublishEdge, below); the rest in
    # the order the OpenAPI document lists them.
    for module in (
        auth,
        users,
        exchanges,
        queues,
        bindings,
        publish,
        messages,
        message_ops,
        consume,
        diagnosis,
        connections,
    ):
        app.include_router(module.router, prefix=API_PREFIX)
    app.include_router(ws_endpoint.router, prefix=API_PREFIX)
    app.include_router(ops.router)
    app.include_router(ops.api_router, prefix=API_PREFIX)
    app.include_router(history.router, prefix=API_PREFIX)
    app.include_router(docs.router)  # Swagger UI at /docs (not in OpenAPI)
    ui.install(app)  # the web UI at / and its assets at /static (not in OpenAPI)
    # innermost: the body limit and the metrics apply to it; it finds its routes in app.routes
    app.add_middleware(PublishEdge, routes=app.routes)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(HttpMetricsMiddleware)  # counts refused bodies too
    app.add_middleware(ExposureGuard, settings=settings)  # outermost: client address, Host
    _register_body_models(app, publish.BODY_MODELS)
    return app


def _register_body_models(app: FastAPI, models: Sequence[type[BaseModel]]) -> None:
    """Put request models that routes take as plain JSON (and validate themselves) into the
    OpenAPI components, where their requestBody ``$ref`` points, as FastAPI would have."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            # the same generator and final pass as FastAPI's own (fastapi.openapi.utils)
            generator = GenerateJsonSchema(ref_template=REF_TEMPLATE)
            inputs = [(m, "validation", TypeAdapter(m).core_schema) for m in models]
            _, definitions = generator.generate_definitions(inputs)  # type: ignore[arg-type]
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(definitions)
            document["components"]["schemas"] = dict(sorted(schemas.items()))
            _document_guard_responses(document)
            app.openapi_schema = jsonable_encoder(
                OpenAPI(**document), by_alias=True, exclude_none=True
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


#: what app.api.exposure answers before any route: (status, description, which operations)
_GUARD_RESPONSES = (
    (400, "Malformed JSON, a form content type, or a Host that is not allowed", None),
    (403, "Not allowed (role, permissions, or a cross-site request)", STATE_CHANGING),
)


def _document_guard_responses(document: dict[str, Any]) -> None:
    """Every operation may get the Host check's 400, and every state-changing one the
    cross-site check's 403 (app.api.exposure): say so where a route did not already."""
    ref = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            responses = operation.get("responses")
            if not isinstance(responses, dict):
                continue
            for status, description, methods in _GUARD_RESPONSES:
                applies = methods is None or (
                    method.upper() in methods and path.startswith(API_PREFIX)
                )
                if applies and str(status) not in responses:
                    responses[str(status)] = {
                        "description": description,
                        "content": {"application/problem+json": ref, "application/json": ref},
                    }
            operation["responses"] = dict(sorted(responses.items(), key=lambda kv: kv[0]))
