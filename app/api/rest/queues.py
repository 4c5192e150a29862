"""REST: queues — declare, inspect, delete, purge (contract §5). Messages are in messages.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Response, status

from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.common import Contains, Page
from app.api.schemas.topology import Limit, NameCursor, PathName, Purged, QueueDeclare, QueueOut

router = APIRouter(tags=["queues"])


@router.put(
    "/queues/{name}",
    name="declare_queue",
    summary="Declare a queue",
    description=(
        "201 when created, 200 when an identical queue exists (compared after defaults), "
        "409 when one exists with other properties. An empty body means all defaults. "
        "`dead_letter_queue` may not be the queue itself (422, checked first), must exist "
        "(404) and needs write permission on it. `arguments` (§13, §15, §16): a wrong type, "
        "range or combination of an argument that takes effect is 422 naming it "
        "(`arguments.x-max-length`); setting both `dead_letter_queue` and "
        "`x-dead-letter-exchange`, or `x-dead-letter-routing-key` without "
        "`x-dead-letter-exchange`, is 422. `x-dead-letter-exchange` must name an existing "
        "exchange (404) and needs write permission on it. Other keys are stored as given."
    ),
    response_model=QueueOut,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": QueueOut, "description": "An identical queue already exists"},
        **problem_responses(400, 401, 403, 404, 409, 422, 429, 503),
    },
)
async def declare_queue(
    name: PathName,
    response: Response,
    services: ServicesDep,
    user: UserDep,
    body: Annotated[QueueDeclare | None, Body()] = None,
) -> QueueOut:
    declaration = (body or QueueDeclare()).to_domain(name)
    info, created = await services.topology.declare_queue(user, declaration)
    if not created:
        response.status_code = status.HTTP_200_OK
    return QueueOut.of(info)


@router.get(
    "/queues",
    name="list_queues",
    summary="List queues with their stats",
    description="Ordered by name in byte order; only queues you have some permission on.",
    response_model=Page[QueueOut],
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 422, 429, 503),
)
async def list_queues(
    services: ServicesDep,
    user: UserDep,
    limit: Limit = 100,
    after: NameCursor = None,
    contains: Contains = None,
) -> Page[QueueOut]:
    page = await services.topology.list_queues(user, limit=limit, after=after, contains=contains)
    return Page(items=[QueueOut.of(q) for q in page.items], next_after=page.next_after)


@router.get(
    "/queues/{name}",
    name="get_queue",
    summary="Get one queue with its stats",
    response_model=QueueOut,
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def get_queue(name: PathName, services: ServicesDep, user: UserDep) -> QueueOut:
    return QueueOut.of(await services.topology.get_queue(user, name))


@router.delete(
    "/queues/{name}",
    name="delete_queue",
    summary="Delete a queue with its messages and bindings",
    description=(
        "Its WebSocket subscribers get SUBSCRIPTION_CANCELLED. A queue that another queue "
        "names as its dead-letter queue cannot be deleted (409)."
    ),
    response_model=None,
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=problem_responses(401, 403, 404, 409, 422, 429, 503),
)
async def delete_queue(
    name: PathName,
    services: ServicesDep,
    user: UserDep,
    if_empty: Annotated[
        bool, Query(description="409 unless the queue has no messages in any status")
    ] = False,
    if_unused: Annotated[bool, Query(description="409 unless the queue has no consumers")] = False,
) -> Response:
    await services.topology.delete_queue(user, name, if_empty=if_empty, if_unused=if_unused)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/queues/{name}/purge",
    name="purge_queue",
    summary="Remove the queue's ready, delayed and dead messages",
    description="In-flight messages are left to settle.",
    response_model=Purged,
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def purge_queue(name: PathName, services: ServicesDep, user: UserDep) -> Purged:
    return Purged(purged=await services.topology.purge_queue(user, name))
