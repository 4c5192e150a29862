"""Pull consumption (contract §9)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictBool, StrictInt

from app.api.schemas.common import MAX_ACK_TAGS, DeliveryTag, StrictModel


class GetRequest(StrictModel):
    max_messages: Annotated[StrictInt, Field(ge=1, le=100)] = 1
    wait_ms: Annotated[
        StrictInt, Field(ge=0, le=20000, description="Long-poll an empty queue this long")
    ] = 0
    ack_timeout_seconds: Annotated[
        StrictInt | None, Field(ge=1, description="Overrides the queue's ack timeout")
    ] = None


class Delivered(BaseModel):
    """A claimed delivery, shaped like the MESSAGE_DELIVERED frame without ``type``.
    Exactly one of ``body`` and ``body_base64`` is present."""

    queue: str
    exchange: str
    routing_key: str
    body: Any = None
    body_base64: str | None = None
    headers: dict[str, Any]
    properties: dict[str, Any]
    message_id: str
    delivery_tag: str
    delivery_count: int
    redelivered: bool
    created_at: str


class GetResponse(BaseModel):
    messages: list[Delivered]


class NackRequest(StrictModel):
    requeue: StrictBool = True


class NackResponse(BaseModel):
    outcome: str = Field(description="requeued, dead_lettered, dead or discarded")


class AckManyRequest(StrictModel):
    delivery_tags: Annotated[
        list[DeliveryTag],
        Field(min_length=1, max_length=MAX_ACK_TAGS, description="Tags from `get` (1 to 1000)"),
    ]


class AckManyResponse(BaseModel):
    acked: list[str] = Field(
        description="Acknowledged, in request order: their messages are deleted"
    )
    unknown: list[str] = Field(
        description="Not in-flight deliveries of yours (or given twice): nothing changed for them"
    )
