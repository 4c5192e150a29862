"""The app factory: settings in, FastAPI out. Nothing is built at import."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute

from app import __version__
from app.api import problems, ui
from app.api.limits import BodyLimitMiddleware
from app.api.observability import HttpMetricsMiddleware
from app.api.rest import (
    auth,
    bindings,
    consume,
    exchanges,
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
    )
    app.state.settings = settings
    problems.install(app)
    for module in (auth, users, exchanges, queues, bindings, publish, messages, consume):
        app.include_router(module.router, prefix=API_PREFIX)
    app.include_router(ws_endpoint.router, prefix=API_PREFIX)
    app.include_router(ops.router)
    app.include_router(ops.api_router, prefix=API_PREFIX)
    ui.install(app)  # the web UI at / and its assets at /static (not in OpenAPI)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(HttpMetricsMiddleware)  # outermost: counts refused bodies too
    return app
