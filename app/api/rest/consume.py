"""REST: pull consumption for clients that cannot hold a WebSocket (contract §9)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path
from fastapi.responses import Response

from app.api.codec import render
from app.api.deliveries import delivery_fields
from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.common import MAX_TAG, Name
from app.api.schemas.consume import (
    AckManyRequest,
    AckManyResponse,
    GetRequest,
    GetResponse,
    NackRequest,
    NackResponse,
)
from app.broker.services import Services
from app.domain.model import User
from app.errors import NotFound, UnknownDeliveryTag

router = APIRouter(tags=["consume"])

#: REST speaks the contract's §2 codes: a missing delivery is 404 `not_found`
#: (`unknown_delivery_tag` is the WebSocket ERROR code).
_NO_DELIVERY = "no in-flight delivery with that tag belongs to you"


@router.post(
    "/queues/{name}/get",
    name="get_messages",
    summary="Claim up to max_messages deliveries, long-polling an empty queue up to wait_ms",
    description="409 `precondition_failed` while a queue declared with"
    " `x-single-active-consumer: true` has a WebSocket subscription (contract §13).",
    response_model=GetResponse,
    responses=problem_responses(400, 401, 403, 404, 409, 422, 429, 503),
)
async def get_messages(
    name: Annotated[Name, Path()],
    services: ServicesDep,
    user: UserDep,
    request: Annotated[GetRequest | None, Body()] = None,
) -> Response:
    request = request or GetRequest()
    claimed = await services.pull.get(
        user,
        name,
        max_messages=request.max_messages,
        wait_ms=request.wait_ms,
        ack_timeout_seconds=request.ack_timeout_seconds,
    )
    if services.tracing is not None:
        services.tracing.delivered(name, claimed)
    # codec.render falls back to the stdlib for headers orjson cannot write (big integers):
    # the deliveries are already claimed, so this response must not fail.
    body = render(
        lambda raw: {"messages": [delivery_fields(name, item, raw_json=raw) for item in claimed]}
    )
    return Response(body, media_type="application/json")


@router.post(
    "/deliveries/{delivery_tag}/ack",
    name="ack_delivery",
    summary="Acknowledge a pulled delivery: the message is deleted",
    status_code=204,
    responses=problem_responses(401, 404, 422, 429, 503),
)
async def ack_delivery(
    delivery_tag: Annotated[str, Path(max_length=MAX_TAG)], services: ServicesDep, user: UserDep
) -> Response:
    await ack_pulled(services, user, delivery_tag)
    return Response(status_code=204)


@router.post(
    "/deliveries/ack",
    name="ack_deliveries",
    summary="Acknowledge several pulled deliveries at once, each as if acked alone",
    description=(
        "Deletes the messages of the given tags that are in-flight deliveries of yours, in one "
        "statement, and lists the others under `unknown` (nothing changed for them: settled, "
        "timed out, another user's, delivered over a WebSocket or not a tag). A tag given "
        "twice is acknowledged once."
    ),
    response_model=AckManyResponse,
    responses=problem_responses(400, 401, 422, 429, 503),
)
async def ack_deliveries(
    request: AckManyRequest, services: ServicesDep, user: UserDep
) -> AckManyResponse:
    acked, unknown = await services.pull.ack_many(user, request.delivery_tags)
    if services.tracing is not None:
        services.tracing.settled("ack", acked)
    return AckManyResponse(acked=acked, unknown=unknown)


async def ack_pulled(services: Services, user: User, delivery_tag: str) -> None:
    """ACK a pulled delivery (this route, and app.api.edge that answers it first)."""
    try:
        await services.pull.ack(user, delivery_tag)
    except UnknownDeliveryTag:
        raise NotFound(_NO_DELIVERY) from None
    if services.tracing is not None:
        services.tracing.settled("ack", [delivery_tag])


@router.post(
    "/deliveries/{delivery_tag}/nack",
    name="nack_delivery",
    summary="Reject a pulled delivery: requeue (default), dead-letter or discard it",
    response_model=NackResponse,
    responses=problem_responses(400, 401, 404, 422, 429, 503),
)
async def nack_delivery(
    delivery_tag: Annotated[str, Path(max_length=MAX_TAG)],
    services: ServicesDep,
    user: UserDep,
    request: Annotated[NackRequest | None, Body()] = None,
) -> NackResponse:
    request = request or NackRequest()
    try:
        outcome = await services.pull.nack(user, delivery_tag, request.requeue)
    except UnknownDeliveryTag:
        raise NotFound(_NO_DELIVERY) from None
    if services.tracing is not None:
        services.tracing.settled("nack", [delivery_tag], outcome.value)
    return NackResponse(outcome=outcome.value)
