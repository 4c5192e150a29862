"""REST: log in (a bearer session token), log out, who am I."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.deps import ServicesDep, UserDep, client_host
from app.api.problems import problem_responses
from app.api.schemas.auth import LoginRequest, LoginResponse, UserOut

router = APIRouter(tags=["auth"])


@router.post(
    "/auth/login",
    name="login",
    summary="Exchange a username and password for a bearer session token",
    response_model=LoginResponse,
    status_code=201,
    responses=problem_responses(400, 401, 422, 429, 503),
)
async def login(body: LoginRequest, request: Request, services: ServicesDep) -> LoginResponse:
    token, expires_at = await services.auth.login(
        body.username, body.password, client_host(request)
    )
    return LoginResponse(token=token, token_type="bearer", expires_at=expires_at)  # noqa: S106


@router.post(
    "/auth/logout",
    name="logout",
    summary="Revoke the bearer token of this request (with Basic: nothing to revoke)",
    status_code=204,
    response_class=Response,
    responses=problem_responses(401, 429, 503),
)
async def logout(request: Request, user: UserDep, services: ServicesDep) -> Response:
    await services.auth.logout(request.headers.get("authorization"))
    return Response(status_code=204)


@router.get(
    "/auth/me",
    name="get_me",
    summary="The authenticated user: name, role and permissions",
    response_model=UserOut,
    status_code=200,
    responses=problem_responses(401, 429, 503),
)
async def get_me(user: UserDep) -> UserOut:
    return UserOut.from_domain(user)
