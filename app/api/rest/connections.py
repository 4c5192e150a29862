"""REST: every broker process's WebSocket connections, and closing one (contract §20)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.common import Contains, Page
from app.api.schemas.topology import Limit
from app.storage.connections import ConnectionRow

router = APIRouter(tags=["connections"])


class ConnectionSubscriptionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    queue: str
    prefetch: int
    unacked: int
    active: bool


class ConnectionOut(BaseModel):
    connection_id: str
    username: str
    client_address: str | None = Field(description='"host:port" of the peer')
    process: str = Field(description="The broker process holding it")
    connected_at: datetime
    subscriptions: list[ConnectionSubscriptionOut]

    @classmethod
    def of(cls, c: ConnectionRow) -> ConnectionOut:
        return cls(
            connection_id=c.connection_id,
            username=c.username,
            client_address=c.client_address,
            process=c.process,
            connected_at=c.connected_at,
            subscriptions=[ConnectionSubscriptionOut.model_validate(s) for s in c.subscriptions],
        )


ConnectionCursor = Annotated[
    uuid.UUID | None, Query(description="Cursor: the last connection_id of the previous page")
]


@router.get(
    "/connections",
    name="list_connections",
    summary="List WebSocket connections on every broker process (admin)",
    description="Ordered by connection_id; each with its subscriptions and what they hold.",
    response_model=Page[ConnectionOut],
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 403, 422, 429, 503),
)
async def list_connections(
    services: ServicesDep,
    user: UserDep,
    limit: Limit = 100,
    after: ConnectionCursor = None,
    contains: Contains = None,
) -> Page[ConnectionOut]:
    rows, next_after = await services.connections.list(
        user, limit=limit, after=None if after is None else str(after), contains=contains or None
    )
    return Page(items=[ConnectionOut.of(r) for r in rows], next_after=next_after)


@router.delete(
    "/connections/{connection_id}",
    name="close_connection",
    summary="Close a WebSocket connection, whichever process holds it (admin)",
    description=(
        'Closed with code 1008, reason "closed by an administrator", within 5 s; its '
        "deliveries are released as on any disconnect. 404 when no live process holds it."
    ),
    response_model=None,
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=problem_responses(401, 403, 404, 429, 503),
)
async def close_connection(connection_id: str, services: ServicesDep, user: UserDep) -> Response:
    await services.connections.close(user, connection_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
