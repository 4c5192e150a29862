"""REST: exchanges (contract §4)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.common import Contains, Page
from app.api.schemas.topology import ExchangeDeclare, ExchangeOut, Limit, NameCursor, PathName

router = APIRouter(tags=["exchanges"])


@router.put(
    "/exchanges/{name}",
    name="declare_exchange",
    summary="Declare an exchange",
    description=(
        "201 when created, 200 when an identical exchange exists (compared after defaults), "
        "409 when one exists with other properties. Names starting with `amq.` are reserved. "
        '`arguments["alternate-exchange"]` names an existing exchange (404 if missing; 422 '
        "naming it if it is not an exchange name) through which a message this exchange "
        "routes to no queue goes on (§14); naming one needs read on this exchange and write "
        "on the alternate. Other keys are stored as given."
    ),
    response_model=ExchangeOut,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": ExchangeOut, "description": "An identical exchange already exists"},
        **problem_responses(400, 401, 403, 404, 409, 422, 429, 503),
    },
)
async def declare_exchange(
    name: PathName,
    body: ExchangeDeclare,
    response: Response,
    services: ServicesDep,
    user: UserDep,
) -> ExchangeOut:
    exchange, created = await services.topology.declare_exchange(user, body.to_domain(name))
    if not created:
        response.status_code = status.HTTP_200_OK
    return ExchangeOut.of(exchange)


@router.get(
    "/exchanges",
    name="list_exchanges",
    summary="List exchanges (built-ins included)",
    description="Ordered by name in byte order; only exchanges you have some permission on.",
    response_model=Page[ExchangeOut],
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 422, 429, 503),
)
async def list_exchanges(
    services: ServicesDep,
    user: UserDep,
    limit: Limit = 100,
    after: NameCursor = None,
    contains: Contains = None,
) -> Page[ExchangeOut]:
    page = await services.topology.list_exchanges(user, limit=limit, after=after, contains=contains)
    return Page(items=[ExchangeOut.of(e) for e in page.items], next_after=page.next_after)


@router.get(
    "/exchanges/{name}",
    name="get_exchange",
    summary="Get one exchange",
    response_model=ExchangeOut,
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def get_exchange(name: PathName, services: ServicesDep, user: UserDep) -> ExchangeOut:
    return ExchangeOut.of(await services.topology.get_exchange(user, name))


@router.delete(
    "/exchanges/{name}",
    name="delete_exchange",
    summary="Delete an exchange and its bindings",
    description=(
        "Deletes the bindings it is source or destination of. Built-in and `amq.` "
        "exchanges cannot be deleted (403). An exchange another names as its "
        "`alternate-exchange` may be deleted: that exchange then has no alternate until "
        "one of that name is declared again. An exchange that a queue names as its "
        "`x-dead-letter-exchange` cannot be deleted, `if_unused` or not (409, naming the "
        "queues)."
    ),
    response_model=None,
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=problem_responses(401, 403, 404, 409, 422, 429, 503),
)
async def delete_exchange(
    name: PathName,
    services: ServicesDep,
    user: UserDep,
    if_unused: Annotated[
        bool,
        Query(description="409 unless the exchange is neither source nor destination of a binding"),
    ] = False,
) -> Response:
    await services.topology.delete_exchange(user, name, if_unused=if_unused)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
