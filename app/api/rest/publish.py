"""REST: publish to an exchange (one message or a batch) or straight to a queue (§5, §7).

A 200 is a publisher confirm: the rows are committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Header, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError, WithJsonSchema

from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.messages import (
    PathName,
    PublishBatch,
    PublishBatchResponse,
    PublishBody,
    PublishResponse,
    decode_publish,
    decode_publish_batch,
    result_fields,
)
from app.domain.model import OutgoingMessage, PublishResult
from app.domain.tracecontext import with_trace_context

router = APIRouter(tags=["publish"])

T = TypeVar("T")

#: request models these routes validate themselves; app.main puts them in the OpenAPI document
BODY_MODELS = (PublishBody, PublishBatch)

_ERRORS = problem_responses(400, 401, 403, 404, 413, 422, 429, 503)

# The bodies are taken as decoded JSON and turned into domain messages by
# app.api.schemas.messages (no pydantic model per message in the common case; the models
# decide everything else and their errors are this route's 422, as if FastAPI had raised
# them). The OpenAPI document still names the models: app.main registers them.
_PublishBody = Annotated[Any, Body(), WithJsonSchema({"$ref": "#/components/schemas/PublishBody"})]
_PublishBatch = Annotated[
    Any, Body(), WithJsonSchema({"$ref": "#/components/schemas/PublishBatch"})
]


def _decoded(decode: Callable[[Any], T], payload: Any) -> T:
    try:
        return decode(payload)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in errors], body=payload
        ) from None


_Traceparent = Annotated[
    str | None,
    Header(
        description="W3C trace context: copied into the message's headers (unless they carry "
        "a traceparent already), so every delivery carries it"
    ),
]
_Tracestate = Annotated[str | None, Header(description="W3C trace context, with traceparent")]


def _traced(
    messages: list[OutgoingMessage], traceparent: str | None, tracestate: str | None
) -> list[OutgoingMessage]:
    return list(with_trace_context(messages, traceparent, tracestate))


def _result(result: PublishResult) -> PublishResponse:
    return PublishResponse(**result_fields(result))


@router.post(
    "/exchanges/{name}/publish",
    name="publish_message",
    summary="Publish a message to an exchange",
    description=(
        "Routes the message and stores one copy per matched queue, in one transaction; a "
        "200 means the copies are committed. No match: 200 with `routed: false`, or 422 "
        "`unroutable` (nothing stored) when `mandatory` is true. A body over the size limit "
        "is 413 `message_too_large` (nothing stored)."
    ),
    response_model=PublishResponse,
    status_code=status.HTTP_200_OK,
    responses=_ERRORS,
)
async def publish_message(
    name: PathName,
    message: _PublishBody,
    services: ServicesDep,
    user: UserDep,
    traceparent: _Traceparent = None,
    tracestate: _Tracestate = None,
) -> PublishResponse:
    messages = _traced([_decoded(decode_publish, message)], traceparent, tracestate)
    results = await services.publisher.publish(user, name, messages)
    return _result(results[0])


@router.post(
    "/exchanges/{name}/publish-batch",
    name="publish_batch",
    summary="Publish 1 to 1000 messages to an exchange in one transaction",
    description=(
        "All messages are stored, or none: one invalid item (422, its `errors` pointing at "
        "`messages` and the item's index), one oversize body (413) or one unroutable "
        "mandatory message (422 `unroutable`) rejects the whole batch. Results are in order."
    ),
    response_model=PublishBatchResponse,
    status_code=status.HTTP_200_OK,
    responses=_ERRORS,
)
async def publish_batch(
    name: PathName,
    batch: _PublishBatch,
    services: ServicesDep,
    user: UserDep,
    traceparent: _Traceparent = None,
    tracestate: _Tracestate = None,
) -> PublishBatchResponse:
    messages = _traced(_decoded(decode_publish_batch, batch), traceparent, tracestate)
    results = await services.publisher.publish(user, name, messages)
    return PublishBatchResponse(results=[_result(r) for r in results])


@router.post(
    "/queues/{name}/messages",
    name="publish_to_queue",
    summary="Publish a message straight into a queue (the default exchange)",
    description=(
        "Same body as an exchange publish; no routing: the message is stored in this queue "
        'with exchange `""` and routing key equal to the queue\'s name (a `routing_key` in '
        "the body is ignored). Needs write permission on the queue; 404 when it is missing."
    ),
    response_model=PublishResponse,
    status_code=status.HTTP_200_OK,
    responses=_ERRORS,
)
async def publish_to_queue(
    name: PathName,
    message: _PublishBody,
    services: ServicesDep,
    user: UserDep,
    traceparent: _Traceparent = None,
    tracestate: _Tracestate = None,
) -> PublishResponse:
    messages = _traced([_decoded(decode_publish, message)], traceparent, tracestate)
    results = await services.publisher.publish_to_queue(user, name, messages)
    return _result(results[0])
