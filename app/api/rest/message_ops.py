"""REST: query, move (and redrive) and delete a queue's copies by filter (contract §17)."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api import codec
from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.message_ops import (
    DeleteBody,
    DeleteResponse,
    MoveBody,
    MoveResponse,
    QueryBody,
)
from app.api.schemas.messages import PathName, StoredMessagePage

#: the largest message id (a bigint)
MAX_ID = 2**63 - 1

router = APIRouter(tags=["messages"])

_FILTER_DOC = (
    " The filter's conditions all hold for a matching copy: `status` (default ready, delayed "
    "and dead), `routing_key` (a topic pattern), `headers` (as a headers binding with "
    "`x-match: all`), `message_ids`, `published_after`/`published_before` (RFC 3339, "
    "exclusive, on `created_at`), `min_delivery_count`, `death_reason` (the newest "
    "`x-death` entry's)."
)


@router.post(
    "/queues/{name}/messages/query",
    name="query_messages",
    summary="Find a queue's copies by filter",
    description=(
        "The browse list shape (`GET /queues/{name}/messages`), keyset-paginated by `id`, "
        "of the copies matching `filter`; consumes nothing. Needs read on the queue." + _FILTER_DOC
    ),
    response_model=StoredMessagePage,
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def query_messages(
    name: PathName, body: QueryBody, services: ServicesDep, user: UserDep
) -> Response:
    items, next_after = await services.message_ops.query(
        user,
        name,
        body.filter.to_filter(),
        limit=body.limit,
        after=None if body.after is None else min(body.after, MAX_ID),
    )
    return Response(codec.browse_page(items, next_after), media_type="application/json")


@router.post(
    "/queues/{name}/messages/move",
    name="move_messages",
    summary="Move (or redrive) a queue's copies by filter",
    description=(
        "Moves up to `limit` matching copies (never one in flight), in one transaction, to "
        "the queue `to` — or, with `to: null`, each back to the queue named by its newest "
        "`x-death` entry (redrive; copies without one, or whose queue is gone, are `skipped` "
        "and stay). Moved copies are ready and available now, with `delivery_count` 0; "
        "`message_id`, body, properties and headers (`x-death` included) are kept; the "
        "target's priority, TTL and length limit apply (drop-head), deduplication does not. "
        "`matched` counts every matching copy; `dry_run` counts and changes nothing. Needs "
        "configure on the source and write on every target." + _FILTER_DOC
    ),
    response_model=MoveResponse,
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def move_messages(
    name: PathName, body: MoveBody, services: ServicesDep, user: UserDep
) -> MoveResponse:
    result = await services.message_ops.move(
        user, name, body.filter.to_filter(), to=body.to, limit=body.limit, dry_run=body.dry_run
    )
    return MoveResponse(matched=result.matched, moved=result.moved, skipped=result.skipped)


@router.post(
    "/queues/{name}/messages/delete",
    name="delete_messages",
    summary="Delete a queue's copies by filter",
    description=(
        "Deletes up to `limit` matching copies (never one in flight) in one transaction. "
        "`matched` counts every matching copy; `dry_run` counts and changes nothing. Needs "
        "configure on the queue." + _FILTER_DOC
    ),
    response_model=DeleteResponse,
    status_code=status.HTTP_200_OK,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def delete_messages(
    name: PathName, body: DeleteBody, services: ServicesDep, user: UserDep
) -> DeleteResponse:
    result = await services.message_ops.delete(
        user, name, body.filter.to_filter(), limit=body.limit, dry_run=body.dry_run
    )
    return DeleteResponse(matched=result.matched, deleted=result.deleted)
