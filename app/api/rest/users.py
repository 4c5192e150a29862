"""REST: broker users and their permissions (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Response

from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.auth import UserOut, UserPage, UserPut
from app.api.schemas.common import Contains, Name

router = APIRouter(tags=["users"])

Limit = Annotated[int, Query(ge=1, le=1000, description="Page size")]
After = Annotated[Name | None, Query(description="Cursor: the last name of the previous page")]


@router.get(
    "/users",
    name="list_users",
    summary="List users, ordered by name",
    response_model=UserPage,
    status_code=200,
    responses=problem_responses(401, 403, 422, 429, 503),
)
async def list_users(
    user: UserDep,
    services: ServicesDep,
    limit: Limit = 100,
    after: After = None,
    contains: Contains = None,
) -> UserPage:
    users, next_after = await services.auth.list_users(user, limit, after, contains)
    return UserPage(items=[UserOut.from_domain(u) for u in users], next_after=next_after)


@router.get(
    "/users/{name}",
    name="get_user",
    summary="Get a user",
    response_model=UserOut,
    status_code=200,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def get_user(name: Name, user: UserDep, services: ServicesDep) -> UserOut:
    return UserOut.from_domain(await services.auth.get_user(user, name))


@router.put(
    "/users/{name}",
    name="put_user",
    summary="Create (201) or replace (200) a user",
    response_model=UserOut,
    status_code=200,
    responses={
        201: {"model": UserOut, "description": "Created"},
        **problem_responses(400, 401, 403, 422, 429, 503),
    },
)
async def put_user(
    name: Name,
    user: UserDep,
    services: ServicesDep,
    response: Response,
    body: Annotated[UserPut | None, Body()] = None,
) -> UserOut:
    body = body or UserPut()
    saved, created = await services.auth.put_user(
        user, name, body.password, body.role, body.permissions.to_domain()
    )
    response.status_code = 201 if created else 200
    return UserOut.from_domain(saved)


@router.delete(
    "/users/{name}",
    name="delete_user",
    summary="Delete a user, revoking its sessions and closing its WebSockets",
    status_code=204,
    response_class=Response,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def delete_user(name: Name, user: UserDep, services: ServicesDep) -> Response:
    await services.auth.delete_user(user, name)
    return Response(status_code=204)
