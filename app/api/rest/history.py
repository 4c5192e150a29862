"""REST: the UI charts' history of message rates and queue depths (an addition beyond
contract §20: docs/ui.md, docs/decisions.md "Rate and depth history")."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.topology import PathName
from app.broker.history import History, HistoryService
from app.errors import Unavailable

router = APIRouter(tags=["operations"])


class SampleOut(BaseModel):
    at: datetime = Field(description="End of the sample interval (UTC)")
    published: int = Field(
        description="Messages accepted by publish calls in the interval (overview), or "
        "copies stored in the queue by publish calls (a queue's history)"
    )
    delivered: int = Field(description="Deliveries (WebSocket and pull) in the interval")
    acked: int = Field(description="Deliveries acknowledged in the interval")
    ready: int | None = Field(description="Ready copies at the end of the interval")
    delayed: int | None = Field(description="Ready copies not yet due (delay_ms)")
    in_flight: int | None = Field(description="Copies delivered and not yet settled")
    dead: int | None = Field(description="Dead copies kept in the queue")


class HistoryOut(BaseModel):
    interval_seconds: int = Field(description="Length of each sample interval")
    samples: list[SampleOut] = Field(
        description="The last 10 minutes, oldest first, one per interval. Rates are counts "
        "per interval (divide by interval_seconds for per-second rates), summed over every "
        "broker process; depths are null where no process sampled them"
    )

    @classmethod
    def of(cls, h: History) -> HistoryOut:
        return cls(
            interval_seconds=h.interval_seconds,
            samples=[
                SampleOut(
                    at=s.at,
                    published=s.published,
                    delivered=s.delivered,
                    acked=s.acked,
                    ready=s.ready,
                    delayed=s.delayed,
                    in_flight=s.in_flight,
                    dead=s.dead,
                )
                for s in h.samples
            ],
        )


def _service(services: ServicesDep) -> HistoryService:
    if services.history is None:
        raise Unavailable("the history is not sampled by this process")
    return services.history


@router.get(
    "/overview/history",
    name="get_overview_history",
    summary="Broker-wide message rates and depths of the last 10 minutes (admin)",
    description=(
        "An addition beyond contract §20, for the UI's charts. Every "
        "MESSAGEX_HISTORY_INTERVAL_SECONDS (default 5) each broker process records its "
        "published messages, deliveries and acks, and one process counts the copies by "
        "status; the answer sums the processes per interval."
    ),
    response_model=HistoryOut,
    status_code=200,
    responses=problem_responses(401, 403, 429, 503),
)
async def get_overview_history(services: ServicesDep, user: UserDep) -> HistoryOut:
    return HistoryOut.of(await _service(services).overview_history(user))


@router.get(
    "/queues/{name}/history",
    name="get_queue_history",
    summary="A queue's message rates and depths of the last 10 minutes",
    description=(
        "An addition beyond contract §20, for the UI's charts: as `GET /overview/history`, "
        "for one queue (any permission on the queue)."
    ),
    response_model=HistoryOut,
    status_code=200,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def get_queue_history(name: PathName, services: ServicesDep, user: UserDep) -> HistoryOut:
    return HistoryOut.of(await _service(services).queue_history(user, name))
