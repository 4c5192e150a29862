"""REST: bindings (contract §6)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.common import Name, Page
from app.api.schemas.topology import BindingCreate, BindingOut, Limit

router = APIRouter(tags=["bindings"])

#: Binding ids are PostgreSQL bigints.
_ID_MIN, _ID_MAX = -(2**63), 2**63 - 1
BindingId = Annotated[int, Path(alias="id", ge=_ID_MIN, le=_ID_MAX, description="The binding's id")]
IdCursor = Annotated[
    int | None,
    Query(ge=_ID_MIN, le=_ID_MAX, description="`next_after` of the previous page: the last id"),
]


@router.post(
    "/bindings",
    name="create_binding",
    summary="Bind a queue, or another exchange, to an exchange",
    description=(
        "Give exactly one of `queue` and `destination_exchange` (else 422). 201 when "
        "created, 200 with the existing binding when an identical one (same exchange, "
        "destination, routing key and arguments) exists. Needs read on the exchange and "
        "write on the queue or destination exchange. A message matching a binding to an "
        "exchange is routed on through that exchange's bindings (each exchange once per "
        "publish; a queue reached by several paths gets one copy)."
    ),
    response_model=BindingOut,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": BindingOut, "description": "An identical binding already exists"},
        **problem_responses(400, 401, 403, 404, 422, 429, 503),
    },
)
async def create_binding(
    body: BindingCreate, response: Response, services: ServicesDep, user: UserDep
) -> BindingOut:
    binding, created = await services.topology.create_binding(
        user,
        exchange=body.exchange,
        queue=body.queue,
        destination_exchange=body.destination_exchange,
        routing_key=body.routing_key,
        arguments=body.arguments,
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return BindingOut.of(binding)


@router.get(
    "/bindings",
    name="list_bindings",
    summary="List bindings, by id",
    description=(
        "Only bindings whose exchange, queue or destination exchange you have some permission on."
    ),
    response_model=Page[BindingOut],
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 422, 429, 503),
)
async def list_bindings(
    services: ServicesDep,
    user: UserDep,
    exchange: Annotated[Name | None, Query(description="Only bindings from this exchange")] = None,
    queue: Annotated[Name | None, Query(description="Only bindings to this queue")] = None,
    destination_exchange: Annotated[
        Name | None, Query(description="Only bindings to this exchange")
    ] = None,
    limit: Limit = 100,
    after: IdCursor = None,
) -> Page[BindingOut]:
    page = await services.topology.list_bindings(
        user,
        limit=limit,
        after=after,
        exchange=exchange,
        queue=queue,
        destination_exchange=destination_exchange,
    )
    return Page(items=[BindingOut.of(b) for b in page.items], next_after=page.next_after)


@router.delete(
    "/bindings/{id}",
    name="delete_binding",
    summary="Delete a binding",
    description="An auto-delete exchange goes with its last binding.",
    response_model=None,
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def delete_binding(binding_id: BindingId, services: ServicesDep, user: UserDep) -> Response:
    await services.topology.delete_binding(user, binding_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
