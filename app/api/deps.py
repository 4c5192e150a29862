"""Small dependency getters: the services built by the lifespan, and the caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBasic, HTTPBearer

from app.broker.services import Services
from app.domain.model import User

# Declared for the OpenAPI document; the header itself is parsed by the auth service.
_bearer = HTTPBearer(auto_error=False, description="Session token from POST /auth/login")
_basic = HTTPBasic(auto_error=False, description="Username and password")


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def client_host(request: Request) -> str | None:
    return request.client.host if request.client else None


async def current_user(
    request: Request,
    services: Annotated[Services, Depends(get_services)],
    _b: Annotated[object, Depends(_bearer)] = None,
    _c: Annotated[object, Depends(_basic)] = None,
) -> User:
    return await services.auth.authenticate(
        request.headers.get("authorization"), client_host(request)
    )


ServicesDep = Annotated[Services, Depends(get_services)]
UserDep = Annotated[User, Depends(current_user)]
