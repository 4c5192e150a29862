"""Operations: health, readiness, metrics (outside /api/v1) and the overview."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field
from starlette.responses import Response

from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.broker.overview import Overview
from app.errors import Unavailable

router = APIRouter(tags=["operations"])
api_router = APIRouter(tags=["operations"])

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyOut(BaseModel):
    status: Literal["ready"] = "ready"
    detail: str | None = Field(
        default=None,
        description=(
            "Present only when the process serves in a degraded way it chose: today, when it "
            "polls instead of LISTENing (transaction-pooled DATABASE_URL without "
            "MESSAGEX_LISTEN_DATABASE_URL), so publishes on other processes reach its "
            "consumers within its poll interval"
        ),
    )


class MessageCountsOut(BaseModel):
    ready: int
    delayed: int
    in_flight: int
    dead: int


class OverviewOut(BaseModel):
    version: str
    queues: int
    exchanges: int
    messages: MessageCountsOut
    connections: int
    subscriptions: int

    @classmethod
    def of(cls, o: Overview) -> OverviewOut:
        m = o.messages
        return cls(
            version=o.version,
            queues=o.queues,
            exchanges=o.exchanges,
            messages=MessageCountsOut(
                ready=m.ready, delayed=m.delayed, in_flight=m.in_flight, dead=m.dead
            ),
            connections=o.connections,
            subscriptions=o.subscriptions,
        )


@router.get(
    "/healthz",
    name="healthz",
    summary="The process is alive",
    description="Answers without touching the database: use it as a liveness probe.",
    response_model=HealthOut,
    status_code=200,
)
async def healthz() -> HealthOut:
    return HealthOut()


@router.get(
    "/readyz",
    name="readyz",
    summary="The broker can serve requests",
    description=(
        "200 when the database answers and its schema is at the latest migration; "
        "otherwise 503 `unavailable`, within a couple of seconds; 503 also from the moment the "
        "process starts shutting down (SIGTERM), so that a load balancer stops sending to it. "
        "Use it as a readiness probe. "
        "A `detail` in the 200 says the process is ready but degraded by configuration."
    ),
    response_model=ReadyOut,
    response_model_exclude_none=True,
    status_code=200,
    responses=problem_responses(503),
)
async def readyz(services: ServicesDep) -> ReadyOut:
    if services.delivery.shutting_down:
        raise Unavailable("the broker is shutting down")
    await services.ops.check_ready()
    return ReadyOut(detail=services.delivery.polling_detail())


@router.get(
    "/metrics",
    name="metrics",
    summary="Prometheus metrics",
    description=(
        "The broker process's metrics in the Prometheus text exposition format, with "
        "per-queue gauges (copies by status, consumers) for the MESSAGEX_METRICS_MAX_QUEUES "
        "deepest queues, counted at most every 5 s."
    ),
    response_class=Response,
    status_code=200,
    responses={
        200: {
            "description": "Prometheus text format 0.0.4",
            "content": {PROMETHEUS_TEXT: {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(services: ServicesDep) -> Response:
    await services.ops.export_queue_gauges(services.metrics)
    return Response(services.metrics.render(), media_type=PROMETHEUS_TEXT)


@api_router.get(
    "/overview",
    name="get_overview",
    summary="Broker-wide counts (admin)",
    description=(
        "Queues, exchanges (built-ins included), messages by status, and the WebSocket "
        "connections and subscriptions of every live broker process. Once the broker holds "
        "100,000 messages or more, the message counts come from a count at most "
        "MESSAGEX_OVERVIEW_MAX_AGE_MS (default 5000) old; the other counts are always current."
    ),
    response_model=OverviewOut,
    status_code=200,
    responses=problem_responses(401, 403, 429, 503),
)
async def get_overview(services: ServicesDep, user: UserDep) -> OverviewOut:
    return OverviewOut.of(await services.ops.overview(user))
