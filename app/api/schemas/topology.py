"""Request and response models of exchanges, queues and bindings (contract §4, §5, §6)."""

from __future__ import annotations

import math
from typing import Annotated, Any, TypeVar

from fastapi import Path, Query
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    WithJsonSchema,
)

from app.api.schemas.common import Name, StrictModel
from app.broker.topology import QueueInfo
from app.domain import arguments as args
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


_V = TypeVar("_V")


def _storable_value(value: _V) -> _V:
    """``value``, if PostgreSQL can store it (else ValueError: a 422 naming its place)."""
    _storable(value)
    return value


#: Each key and value checked on its own, so that a 422 names the argument
#: (``body.arguments.x-dead-letter-routing-key``), as the checks of app.domain.arguments do.
_StorableObject = dict[
    Annotated[str, AfterValidator(_storable_value)],
    Annotated[Any, AfterValidator(_storable_value)],
]
Arguments = Annotated[_StorableObject, Field(description="Free-form JSON object, stored as given")]


# The queue and exchange arguments that take effect, for the OpenAPI document only: the
# domain (app.domain.arguments) checks them when the broker declares, so a wrong one is the
# broker's problem+json 422 naming it, not a model's. Ranges come from its constants;
# tests/api/test_openapi.py checks that every key it reads is listed here and no other.

_NAMED: dict[str, JsonValue] = {"type": "string"}
_EXCHANGE_NAME: dict[str, JsonValue] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 255,
    "pattern": NAME_PATTERN,
}


def _integer(low: int, high: int, description: str) -> dict[str, JsonValue]:
    # A bound a double cannot hold (2**63 - 1) is said in words only, as QueryBody.after
    # does: the document's numbers are doubles, and it would come out as 2**63.
    if float(high) != high:
        return {"type": "integer", "minimum": low, "description": f"{description} At most {high}."}
    return {"type": "integer", "minimum": low, "maximum": high, "description": description}


_QUEUE_ARGUMENTS: dict[str, JsonValue] = {
    args.MESSAGE_TTL: _integer(
        0,
        args.MAX_TTL_MS,
        "RabbitMQ's x-message-ttl (§13): milliseconds a copy may stay ready in this queue "
        "(counted from its available_at) before it expires; with a message's "
        "properties.expiration the smaller one applies. An expired copy is never delivered: "
        "it is dead-lettered (reason expired) when the queue has a dead-letter target, "
        "else deleted.",
    ),
    args.EXPIRES: _integer(
        args.MIN_EXPIRES_MS,
        args.MAX_EXPIRES_MS,
        "RabbitMQ's x-expires (§13): milliseconds; a queue with no subscription, no get and "
        "no re-declaration for that long is deleted, as DELETE /queues/{name} would.",
    ),
    args.MAX_LENGTH_KEY: _integer(
        0,
        args.MAX_LENGTH,
        "RabbitMQ's x-max-length (§13): the most ready copies the queue holds (delayed and "
        "in-flight ones do not count); x-overflow says what a publish beyond it does.",
    ),
    args.MAX_LENGTH_BYTES: _integer(
        0,
        args.MAX_LENGTH,
        "RabbitMQ's x-max-length-bytes (§13): the most body bytes its ready copies hold "
        "together; x-overflow says what a publish beyond it does.",
    ),
    args.OVERFLOW: {
        "type": "string",
        "enum": [o.value for o in args.Overflow],
        "description": (
            "RabbitMQ's x-overflow (§13): what a publish that would pass x-max-length or "
            "x-max-length-bytes does. drop-head (also when absent): the oldest ready copies "
            "leave to make room (dead-lettered, reason maxlen, when the queue has a "
            "dead-letter target, else deleted); reject-publish: the new copy is not stored "
            "in this queue (the publish result lists the queue under rejected); "
            "reject-publish-dlx: as reject-publish, and the rejected copy is dead-lettered "
            "(reason maxlen)."
        ),
    },
    args.MAX_PRIORITY_KEY: _integer(
        1,
        args.MAX_PRIORITY,
        "RabbitMQ's x-max-priority (§13): ready copies are claimed highest "
        "properties.priority first (none: 0; above this maximum: the maximum). Without it "
        "priority is stored and ignored.",
    ),
    args.SINGLE_ACTIVE_CONSUMER: {
        "type": "boolean",
        "description": (
            "RabbitMQ's x-single-active-consumer (§13; absent: false): only the oldest "
            "WebSocket subscription, across every broker process, receives deliveries; the "
            "others wait (SUBSCRIBED says active: false) and the next one takes over once "
            "the previous one's deliveries are settled. A pull get while one is active is "
            "409."
        ),
    },
    args.MESSAGE_GROUPS: {
        "type": "boolean",
        "description": (
            "x-message-groups (§16; MessageX's own, RabbitMQ has none; absent: false): copies "
            "with the same properties.group_id are delivered one at a time, in claim order; "
            "other copies in parallel as usual."
        ),
    },
    args.DEAD_LETTER_EXCHANGE: {
        **_EXCHANGE_NAME,
        "description": (
            "RabbitMQ's x-dead-letter-exchange (§13): an existing exchange (404 if missing; "
            "needs write permission on it) through which dead-lettered copies are routed as "
            "new copies. Not together with dead_letter_queue (422). The exchange cannot be "
            "deleted while a queue names it (409)."
        ),
    },
    args.DEAD_LETTER_ROUTING_KEY: {
        "type": "string",
        "description": (
            "RabbitMQ's x-dead-letter-routing-key (§13): the routing key dead-lettered copies "
            "are routed with through x-dead-letter-exchange, which it needs (422 without); "
            "default: the message's own routing key. No NUL characters."
        ),
    },
    args.DEDUP_WINDOW: _integer(
        args.MIN_DEDUP_WINDOW_SECONDS,
        args.MAX_DEDUP_WINDOW_SECONDS,
        "x-deduplication-window-seconds (§15; MessageX's own, RabbitMQ has none): a publish "
        "with the message_id of a copy published into this queue less than this many "
        "seconds ago, whether that copy is still there or not, stores nothing here (the "
        "publish result lists the queue under duplicates).",
    ),
}

QueueDeclareArguments = Annotated[
    _StorableObject,
    WithJsonSchema(
        {
            "type": "object",
            "properties": _QUEUE_ARGUMENTS,
            "additionalProperties": True,
            "dependentRequired": {
                args.DEAD_LETTER_ROUTING_KEY: [args.DEAD_LETTER_EXCHANGE],
            },
            "description": (
                "Queue arguments (§13, §15, §16). The ones listed take effect, with "
                "RabbitMQ's names and meanings; a wrong type, range or combination is 422 "
                "naming the argument (arguments.x-max-length) and changes nothing. Integers "
                'must be JSON integers (not 1.0, not "1"). Any other key is stored as '
                "given and ignored. Arguments are compared on re-declaration (409 if they "
                "differ)."
            ),
        }
    ),
]

ExchangeDeclareArguments = Annotated[
    _StorableObject,
    WithJsonSchema(
        {
            "type": "object",
            "properties": {
                args.ALTERNATE_EXCHANGE: {
                    **_EXCHANGE_NAME,
                    "description": (
                        "RabbitMQ's alternate-exchange (§14): an existing exchange (404 if "
                        "missing; this exchange itself is allowed) through which a message "
                        "this exchange routes to no queue goes on, with the same key and "
                        "headers. Needs read on this exchange and write on the alternate. "
                        "The alternate may be deleted later."
                    ),
                },
            },
            "additionalProperties": True,
            "description": (
                "Exchange arguments (§14). alternate-exchange takes effect (422 naming it if "
                "it is not an exchange name); any other key is stored as given and ignored. "
                "Arguments are compared on re-declaration (409 if they differ)."
            ),
        }
    ),
]
PositiveInt32 = Annotated[int, Field(strict=True, ge=1, le=INT32_MAX)]
RoutingKey = Annotated[
    str, Field(max_length=MAX_ROUTING_KEY_LENGTH), AfterValidator(_storable_value)
]


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
    arguments: ExchangeDeclareArguments = Field(default_factory=dict)

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

    # Not both dead-letter targets (§13: 422), said as BindingCreate says its rule.
    model_config = ConfigDict(
        **StrictModel.model_config,
        json_schema_extra={
            "not": {
                "properties": {
                    "dead_letter_queue": _NAMED,
                    "arguments": {"required": [args.DEAD_LETTER_EXCHANGE]},
                },
                "required": ["dead_letter_queue", "arguments"],
            },
        },
    )

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
    arguments: QueueDeclareArguments = Field(default_factory=dict)

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
