"""REST: browse, read and delete a queue's stored messages without consuming them (§5)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.api import codec
from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.messages import MessageIdPath, PathName, StoredMessagePage, StoredMessageView
from app.domain.model import BrowseStatus

router = APIRouter(tags=["messages"])


def _json(build: Callable[[bool], object]) -> Response:
    # Stored JSON bodies are embedded as they are: no parse, no re-encode (codec.render).
    return Response(codec.render(build), media_type="application/json")


@router.get(
    "/queues/{name}/messages",
    name="browse_messages",
    summary="Browse a queue's messages without consuming them",
    description=(
        "Keyset-paginated by message `id`. `status` filters by `ready`, `delayed` (ready but "
        "not yet due, by the database clock), `in_flight` or `dead`; absent means all. "
        "Needs read permission on the queue. `next_after` is the last id of a full page."
    ),
    response_model=StoredMessagePage,
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def browse_messages(
    name: PathName,
    services: ServicesDep,
    user: UserDep,
    status_: Annotated[
        BrowseStatus | None, Query(alias="status", description="Only messages in this status")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size")] = 100,
    after: Annotated[
        int | None,
        Query(ge=0, le=2**63 - 1, description="`next_after` of the previous page"),
    ] = None,
) -> Response:
    items, next_after = await services.browser.browse(
        user, name, status=status_, limit=limit, after=after
    )
    return Response(codec.browse_page(items, next_after), media_type="application/json")


@router.get(
    # {id:int}: only digits, so that §17's /messages/query, /move and /delete are never taken
    # for a message id (their other methods are 405, as the document says)
    "/queues/{name}/messages/{id:int}",
    name="get_message",
    summary="Read one stored message",
    description="Whatever its status. Needs read on the queue.",
    response_model=StoredMessageView,
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def get_message(
    name: PathName, id: MessageIdPath, services: ServicesDep, user: UserDep
) -> Response:
    message = await services.browser.get(user, name, id)
    return _json(lambda raw: codec.browse_item(message, raw_json=raw))


@router.delete(
    "/queues/{name}/messages/{id:int}",
    name="delete_message",
    summary="Delete one stored message",
    description=(
        "Whatever its status; deleting an in-flight message frees its consumer's prefetch "
        "slot, and a later ACK of its tag is `unknown_delivery_tag`. Needs configure "
        "permission on the queue."
    ),
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def delete_message(
    name: PathName, id: MessageIdPath, services: ServicesDep, user: UserDep
) -> Response:
    await services.browser.delete(user, name, id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
