"""Request and response models of exchanges, queues and bindings (contract §4, §5, §6)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StrictBool

from app.api.schemas.common import Name, StrictModel
from app.broker.topology import QueueInfo
from app.domain.model import NAME_PATTERN, Binding, Exchange, ExchangeType, Queue

#: Integer columns are 32-bit.
INT32_MAX = 2**31 - 1
#: As in AMQP 0-9-1, a binding key is a short string.
MAX_ROUTING_KEY_LENGTH = 255


def _storable(value: Any) -> None:
    """Raise ValueError for what JSON-in-PostgreSQL cannot hold: NUL characters, unpaired
    UTF-16 surrogates (``"\\ud800"`` is valid JSON but not UTF-8), NaN, ±Infinity.

    Iterative, so deeply nested values cannot exhaust the stack.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            _storable_string(item)
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("numbers must be finite (no NaN or Infinity)")
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _storable_string(item: str) -> None:
    if "\x00" in item:
        raise ValueError("strings may not contain the NUL character")
    if not item.isascii():
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("strings may not contain an unpaired UTF-16 surrogate") from None


def _storable_value(value: Any) -> Any:
    _storable(value)
    return value


def _routing_key(value: str) -> str:
    _storable(value)
    return value


#: Each key and value checked on its own, so that a 422 names the argument
#: (``body.arguments.x-dead-letter-routing-key``), as the checks of app.domain.arguments do.
Arguments = Annotated[
    dict[
        Annotated[str, AfterValidator(_storable_value)],
        Annotated[Any, AfterValidator(_storable_value)],
    ],
    Field(description="Free-form JSON object, stored as given"),
]
PositiveInt32 = Annotated[int, Field(strict=True, ge=1, le=INT32_MAX)]
RoutingKey = Annotated[str, Field(max_length=MAX_ROUTING_KEY_LENGTH), AfterValidator(_routing_key)]


#: Parameters shared by the topology routes.
PathName = Annotated[
    str,
    Path(
        pattern=NAME_PATTERN,
        min_length=1,
        max_length=255,
        description="1-255 characters from A-Z a-z 0-9 _ . : -, first one alphanumeric",
    ),
]
Limit = Annotated[int, Query(ge=1, le=1000, description="Page size")]
NameCursor = Annotated[
    str | None,
    Query(
        pattern=NAME_PATTERN,
        max_length=255,
        description="`next_after` of the previous page: the last name seen (byte order)",
    ),
]
BigInt = Annotated[int, Field(ge=1, le=2**63 - 1)]


# --------------------------------------------------------------------------- exchanges


class ExchangeDeclare(StrictModel):
    """``PUT /exchanges/{name}``: ``type`` is required, the rest take the defaults shown."""

    type: ExchangeType
    durable: StrictBool = True
    auto_delete: Annotated[
        StrictBool, Field(description="Deleted when its last binding is removed")
    ] = False
    arguments: Arguments = Field(default_factory=dict)

    def to_domain(self, name: str) -> Exchange:
        return Exchange(
            name=name,
            type=self.type,
            durable=self.durable,
            auto_delete=self.auto_delete,
            arguments=self.arguments,
        )


class ExchangeOut(BaseModel):
    name: str
    type: ExchangeType
    durable: bool
    auto_delete: bool
    arguments: dict[str, Any]
    builtin: Annotated[bool, Field(description="One of the amq.* exchanges made by migration")]

    @classmethod
    def of(cls, exchange: Exchange) -> ExchangeOut:
        return cls(
            name=exchange.name,
            type=exchange.type,
            durable=exchange.durable,
            auto_delete=exchange.auto_delete,
            arguments=exchange.arguments,
            builtin=exchange.builtin,
        )


# --------------------------------------------------------------------------- queues


class QueueDeclare(StrictModel):
    """``PUT /queues/{name}``: every field is optional; an empty body means all defaults."""

    durable: StrictBool = True
    max_delivery_count: Annotated[
        PositiveInt32 | None, Field(description="Deliveries before dead-lettering; null: unlimited")
    ] = None
    dead_letter_queue: Annotated[
        Name | None,
        Field(description="An existing queue (not this one) that receives dead-lettered messages"),
    ] = None
    ack_timeout_seconds: Annotated[
        PositiveInt32 | None, Field(description="null: the broker default (ACK_TIMEOUT_SECONDS)")
    ] = None
    arguments: Arguments = Field(default_factory=dict)

    def to_domain(self, name: str) -> Queue:
        return Queue(
            name=name,
            durable=self.durable,
            max_delivery_count=self.max_delivery_count,
            dead_letter_queue=self.dead_letter_queue,
            ack_timeout_seconds=self.ack_timeout_seconds,
            arguments=self.arguments,
        )


class QueueStatsOut(BaseModel):
    ready: Annotated[int, Field(description="Ready now (available_at has passed)")]
    delayed: Annotated[int, Field(description="Ready later (available_at in the future)")]
    in_flight: Annotated[int, Field(description="Delivered, not yet settled")]
    dead: Annotated[int, Field(description="Over the delivery limit, no dead-letter queue")]
    consumers: Annotated[int, Field(description="Live WebSocket subscriptions")]


class QueueOut(BaseModel):
    name: str
    durable: bool
    max_delivery_count: int | None
    dead_letter_queue: str | None
    ack_timeout_seconds: int | None
    arguments: dict[str, Any]
    stats: QueueStatsOut

    @classmethod
    def of(cls, info: QueueInfo) -> QueueOut:
        q, s = info.queue, info.stats
        return cls(
            name=q.name,
            durable=q.durable,
            max_delivery_count=q.max_delivery_count,
            dead_letter_queue=q.dead_letter_queue,
            ack_timeout_seconds=q.ack_timeout_seconds,
            arguments=q.arguments,
            stats=QueueStatsOut(
                ready=s.ready,
                delayed=s.delayed,
                in_flight=s.in_flight,
                dead=s.dead,
                consumers=s.consumers,
            ),
        )


class Purged(BaseModel):
    purged: Annotated[int, Field(description="Ready, delayed and dead messages removed")]


# --------------------------------------------------------------------------- bindings


_NAMED: dict[str, JsonValue] = {"type": "string"}


class BindingCreate(StrictModel):
    """Exactly one of ``queue`` and ``destination_exchange`` (else 422)."""

    # ...and the OpenAPI document says so, as PublishBody does for its body (``not`` and
    # ``if``/``then`` rather than a top-level ``oneOf``, which client generators turn into an
    # untyped body): not both named, and without a queue a destination exchange.
    model_config = ConfigDict(
        **StrictModel.model_config,
        json_schema_extra={
            "not": {
                "properties": {"queue": _NAMED, "destination_exchange": _NAMED},
                "required": ["queue", "destination_exchange"],
            },
            "if": {"not": {"properties": {"queue": _NAMED}, "required": ["queue"]}},
            "then": {
                "properties": {"destination_exchange": _NAMED},
                "required": ["destination_exchange"],
            },
        },
    )

    exchange: Name
    queue: Annotated[Name | None, Field(description="The queue bound to")] = None
    destination_exchange: Annotated[
        Name | None,
        Field(description="The exchange bound to (an exchange-to-exchange binding, §14)"),
    ] = None
    routing_key: RoutingKey = ""
    arguments: Arguments = Field(
        default_factory=dict, description='For a headers exchange: match values and "x-match"'
    )


class BindingOut(BaseModel):
    id: int
    exchange: str
    queue: Annotated[str | None, Field(description="null for an exchange-to-exchange binding")]
    destination_exchange: Annotated[
        str | None, Field(description="The exchange bound to; null for a queue binding")
    ]
    routing_key: str
    arguments: dict[str, Any]

    @classmethod
    def of(cls, binding: Binding) -> BindingOut:
        return cls(
            id=binding.id,
            exchange=binding.exchange,
            queue=binding.queue,
            destination_exchange=binding.destination_exchange,
            routing_key=binding.routing_key,
            arguments=binding.arguments,
        )
