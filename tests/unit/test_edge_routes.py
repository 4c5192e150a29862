"""The hot edge (app/api/edge.py) takes its routes from the app's own route table."""

from __future__ import annotations

import pytest
from fastapi import APIRouter

from app.api.edge import HOT_ROUTES, HotRoute, HotRoutes, Publish, PullAck
from app.main import create_app
from tests import support


def _match(routes: HotRoutes, path: str) -> tuple[HotRoute, str] | None:
    match = routes.pattern.fullmatch(path)
    if match is None:
        return None
    group = str(match.lastgroup)
    return routes.by_group[group], match[group]


def test_the_edge_answers_the_routes_the_app_declares_under_their_templates() -> None:
    app = create_app(support.test_settings("postgresql://unused/db"))
    routes = HotRoutes.of(app.routes)
    templates = {hot.template: hot for hot in routes.by_group.values()}
    assert sorted(templates) == [
        "/api/v1/deliveries/{delivery_tag}/ack",
        "/api/v1/exchanges/{name}/publish",
        "/api/v1/exchanges/{name}/publish-batch",
        "/api/v1/queues/{name}/messages",
    ]
    assert all(hot.methods == {"POST"} for hot in templates.values())
    assert all(template in app.openapi()["paths"] for template in templates)

    ack = _match(routes, "/api/v1/deliveries/1.abc/ack")
    assert ack is not None
    assert ack[0].template == "/api/v1/deliveries/{delivery_tag}/ack"
    assert isinstance(ack[0].action, PullAck)
    assert ack[1] == "1.abc"
    batch = _match(routes, "/api/v1/exchanges/ex.1/publish-batch")
    assert batch is not None
    assert batch[0].template == "/api/v1/exchanges/{name}/publish-batch"
    assert batch[1] == "ex.1"
    to_queue = _match(routes, "/api/v1/queues/q/messages")
    assert to_queue is not None
    assert isinstance(to_queue[0].action, Publish)
    assert to_queue[0].action.to_queue
    for other in (
        "/api/v1/deliveries/ack",  # the route for several tags
        "/api/v1/queues/q",
        "/api/v1/queues/a/b/messages",
        "/api/v1/exchanges/ex/publish/x",
        "/api/v2/exchanges/ex/publish",
    ):
        assert _match(routes, other) is None, other


def test_a_table_without_the_hot_routes_is_refused() -> None:
    router = APIRouter()
    first = next(iter(HOT_ROUTES))
    router.add_api_route("/queues/{name}/messages", first, methods=["POST"])
    with pytest.raises(RuntimeError, match="missing"):
        HotRoutes.of(router.routes)
    with pytest.raises(RuntimeError, match="missing"):
        HotRoutes.of([])
