"""Publish bodies and stored-message views (contract §1, §5, §7).

``PublishBody`` is the one publish model: exchange publish, each batch item, direct-to-queue
publish and the WebSocket ``PUBLISH`` frame all use it (a frame model may subclass it).
Validation encodes the body once (``app.api.codec``) and keeps the bytes, so a publish
serializes or decodes its payload exactly once.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from app.api import codec
from app.api.schemas.common import StrictModel
from app.api.shortcut import FastDecoder
from app.domain.arguments import (
    EXPIRATION_PATTERN,
    MAX_GROUP_ID,
    MAX_PRIORITY,
    expiration_problem,
)
from app.domain.model import (
    MAX_DELAY_MS,
    NAME_PATTERN,
    BrowseStatus,
    OutgoingMessage,
    PublishResult,
)

MAX_BATCH = 1000

#: What the strict decoder (codec._decode_base64) accepts: RFC 4648 standard alphabet, padded.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

#: An exchange or queue name in a URL path (an invalid one is 422).
PathName = Annotated[
    str,
    Path(
        pattern=NAME_PATTERN,
        min_length=1,
        max_length=255,
        description="1-255 characters from A-Z a-z 0-9 _ . : -, first one alphanumeric",
    ),
]
#: A stored message's numeric id (a bigint).
MessageIdPath = Annotated[
    int, Path(ge=1, le=2**63 - 1, description="The message copy's numeric `id`")
]


def _unstorable(value: str) -> str | None:
    """Why PostgreSQL ``text`` cannot hold ``value`` (NUL; being UTF-8, an unpaired
    surrogate), or None when it can."""
    if "\x00" in value:
        return "must not contain NUL (\\u0000) characters"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "must not contain an unpaired UTF-16 surrogate"
    return None


def _storable_text(value: str) -> str:
    reason = _unstorable(value)
    if reason is not None:
        raise ValueError(reason)
    return value


def _expiration(value: str) -> str:
    problem = expiration_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: A string stored in a ``text`` column (routing keys, property values).
StorableText = Annotated[str, AfterValidator(_storable_text)]


class MessageProperties(StrictModel):
    """AMQP-style basic properties; unknown keys are refused."""

    message_id: Annotated[
        Annotated[str, StringConstraints(min_length=1), AfterValidator(_storable_text)] | None,
        Field(description="Publisher-chosen id shared by every copy; a UUID is made when absent"),
    ] = None
    correlation_id: StorableText | None = None
    reply_to: StorableText | None = None
    content_type: StorableText | None = None
    priority: Annotated[
        StrictInt | None,
        Field(
            ge=0,
            le=MAX_PRIORITY,
            description=(
                "0-255; claim order in a queue with x-max-priority (above its maximum counts "
                "as the maximum), stored and ignored elsewhere"
            ),
        ),
    ] = None
    expiration: Annotated[
        Annotated[str, StringConstraints(pattern=EXPIRATION_PATTERN), AfterValidator(_expiration)]
        | None,
        Field(
            description=(
                "Time to live in ms as a string of decimal digits (0-4294967295), as in AMQP; "
                "the smaller of this and the queue's x-message-ttl applies"
            ),
        ),
    ] = None
    group_id: Annotated[
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=MAX_GROUP_ID),
            AfterValidator(_storable_text),
        ]
        | None,
        Field(
            description=(
                "1-128 characters; in a queue with x-message-groups, copies of one group are "
                "delivered one at a time, in order (stored and ignored elsewhere)"
            ),
        ),
    ] = None

    def as_dict(self) -> dict[str, str | int]:
        """The properties that were given a value (``null`` means not given)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


class PublishBody(StrictModel):
    """One message to publish. Exactly one of ``body`` and ``body_base64`` must be present."""

    # ...and the OpenAPI document says so, so that schema-driven fuzzers know that both (or
    # neither) is invalid. Not as a top-level ``oneOf``: openapi-python-client turns a schema
    # holding one into an untyped ``Any`` body and drops the model; ``not`` and ``if``/``then``
    # say the same thing and generators leave the model alone
    # (tests/clients/test_generated_client.py).
    model_config = ConfigDict(
        **StrictModel.model_config,
        json_schema_extra={
            "not": {"required": ["body", "body_base64"]},
            "if": {"not": {"required": ["body"]}},
            "then": {"required": ["body_base64"]},
        },
    )

    routing_key: StorableText = ""
    body: Annotated[
        Any,
        Field(
            description=(
                "Any JSON value, null included; stored as its JSON serialization. "
                "Exclusive with body_base64."
            )
        ),
    ] = None
    body_base64: Annotated[
        str | None,  # None: not sent (an explicit null is refused by _encode)
        WithJsonSchema({"type": "string", "contentEncoding": "base64", "pattern": BASE64_PATTERN}),
        Field(
            description=(
                "Binary payload, base64 (RFC 4648, standard alphabet, padded); delivered "
                "as body_base64. Exclusive with body."
            ),
        ),
    ] = None
    headers: Annotated[
        dict[str, Any], Field(description="JSON object; a headers exchange routes on it")
    ] = Field(default_factory=dict)
    properties: MessageProperties = Field(default_factory=MessageProperties)
    delay_ms: Annotated[
        StrictInt,
        Field(
            ge=0,
            le=MAX_DELAY_MS,
            description="Make the copies available only after this many ms (database clock)",
        ),
    ] = 0
    mandatory: Annotated[
        StrictBool, Field(description="Refuse (422 unroutable) when no queue matches")
    ] = False

    _payload: bytes = PrivateAttr(default=b"")
    _binary: bool = PrivateAttr(default=False)

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, Any]) -> dict[str, Any]:
        codec.check_json_object(value)
        return value

    @model_validator(mode="after")
    def _encode(self) -> PublishBody:
        given = self.model_fields_set
        try:
            self._payload, self._binary = codec.encode_body(
                body=self.body if "body" in given else codec.ABSENT,
                body_base64=self.body_base64 if "body_base64" in given else codec.ABSENT,
            )
        except codec.BodyError as exc:
            # Raised as a field error so that its loc names the key ("body_base64"), under
            # the batch item's index when this is one item of a batch.
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "body_invalid", "{reason}", {"reason": exc.message}
                        ),
                        loc=(exc.field,),
                        input=None,
                    )
                ],
            ) from None
        return self

    def to_outgoing(self) -> OutgoingMessage:
        """The domain message (body already encoded) for ``Publisher``."""
        properties = self.properties.as_dict()
        return OutgoingMessage(
            body=self._payload,
            binary=self._binary,
            routing_key=self.routing_key,
            headers=self.headers,
            properties=properties,
            delay_ms=self.delay_ms,
            mandatory=self.mandatory,
            message_id=str(properties.get("message_id", "")),
        )


class PublishBatch(StrictModel):
    """1 to 1000 messages published in one transaction: all stored, or none."""

    messages: Annotated[list[PublishBody], Field(min_length=1, max_length=MAX_BATCH)]


# ----------------------------------------------------------------------------- the hot path
#
# A publish body in its common, valid form becomes an OutgoingMessage without pydantic: the
# checks below accept exactly what the models above accept (for JSON-decoded input), and
# anything else — an unknown key, a wrong type, an unstorable string, a bad body — goes to
# the models, which raise the ValidationError a client sees. So the rules keep one home (the
# models, and app.api.codec for bodies); this is a shortcut that gives up, never a second
# validator (app.api.shortcut.FastDecoder; tests/unit/test_fast_decoders.py checks the two
# agree). It saves ~15 µs of model building per message (1.9 ms per batch of 100).

_ITEM_KEYS = frozenset(PublishBody.model_fields)
#: The string properties; ``priority``, ``expiration`` and ``group_id`` are left to the model.
_PROPERTY_KEYS = frozenset(MessageProperties.model_fields) - {"priority", "expiration", "group_id"}


def _plain_text(value: Any) -> bool:
    return type(value) is str and _unstorable(value) is None


def _fast_headers(item: dict[str, Any]) -> dict[str, Any] | None:
    headers = item.get("headers", codec.ABSENT)
    if headers is codec.ABSENT:
        return {}
    if type(headers) is not dict:
        return None
    if headers:
        try:
            codec.check_json_object(headers)
        except ValueError:
            return None
    return headers


def _fast_properties(item: dict[str, Any]) -> dict[str, Any] | None:
    given = item.get("properties", codec.ABSENT)
    if given is codec.ABSENT:
        return {}
    if type(given) is not dict or not given.keys() <= _PROPERTY_KEYS:
        return None
    properties = {}
    for key, value in given.items():
        if value is None:
            continue
        if not value or not _plain_text(value):
            return None  # (an empty string: the models decide; message_id may not be)
        properties[key] = value
    return properties


def fast_decode_publish(item: Any) -> OutgoingMessage | None:
    """The message for a valid publish body in the common form; None: ask the models."""
    if type(item) is not dict or not item.keys() <= _ITEM_KEYS:
        return None
    routing_key = item.get("routing_key", "")
    delay_ms = item.get("delay_ms", 0)
    mandatory = item.get("mandatory", False)
    if (
        not _plain_text(routing_key)
        or type(delay_ms) is not int
        or not 0 <= delay_ms <= MAX_DELAY_MS
        or type(mandatory) is not bool
    ):
        return None
    headers = _fast_headers(item)
    properties = _fast_properties(item)
    if headers is None or properties is None:
        return None
    try:
        payload, binary = codec.encode_body(
            body=item.get("body", codec.ABSENT),
            body_base64=item.get("body_base64", codec.ABSENT),
        )
    except codec.BodyError:
        return None
    return OutgoingMessage(
        body=payload,
        binary=binary,
        routing_key=routing_key,
        headers=headers,
        properties=properties,
        delay_ms=delay_ms,
        mandatory=mandatory,
        message_id=properties.get("message_id", ""),
    )


def fast_decode_publish_batch(payload: Any) -> list[OutgoingMessage] | None:
    """A publish-batch body whose items are all in the common form → the domain messages, in
    order; None: ask the models."""
    if type(payload) is not dict or payload.keys() != {"messages"}:
        return None
    items = payload["messages"]
    if type(items) is not list or not 1 <= len(items) <= MAX_BATCH:
        return None
    messages = []
    for item in items:
        message = fast_decode_publish(item)
        if message is None:
            return None
        messages.append(message)
    return messages


def _publish_by_models(payload: Any) -> OutgoingMessage:
    return PublishBody.model_validate(payload).to_outgoing()


def _publish_batch_by_models(payload: Any) -> list[OutgoingMessage]:
    return [m.to_outgoing() for m in PublishBatch.model_validate(payload).messages]


#: One publish body → the domain message (the shortcut, else the models: their
#: ValidationError). ``PUBLISH.fast`` alone is what app.api.edge tries before the route.
PUBLISH: FastDecoder[Any, OutgoingMessage] = FastDecoder(
    "publish body", fast_decode_publish, _publish_by_models
)
#: A publish-batch body → the domain messages, in order; raises ValidationError.
PUBLISH_BATCH: FastDecoder[Any, list[OutgoingMessage]] = FastDecoder(
    "publish-batch body", fast_decode_publish_batch, _publish_batch_by_models
)
decode_publish = PUBLISH.decode
decode_publish_batch = PUBLISH_BATCH.decode


class PublishResponse(BaseModel):
    routed: bool = Field(
        description="Routing matched at least one queue (true even when every one rejected)"
    )
    queues: list[str] = Field(description="The queues that received a copy, each once")
    message_id: str
    rejected: list[str] = Field(
        description=(
            "Queues that matched but did not store a copy: full, with x-overflow "
            "reject-publish or reject-publish-dlx (contract §13); empty when none"
        )
    )
    duplicates: list[str] = Field(
        description=(
            "Queues that matched but did not store a copy because a copy with this "
            "message_id was published into them within their "
            "x-deduplication-window-seconds (contract §15), or earlier in the same batch; "
            "empty when none"
        )
    )


def result_fields(result: PublishResult) -> dict[str, Any]:
    """A publish result as every API answers it (REST, batch items, WebSocket PUBLISHED)."""
    return {
        "routed": result.routed,
        "queues": result.queues,
        "message_id": result.message_id,
        "rejected": result.rejected,
        "duplicates": result.duplicates,
    }


class PublishBatchResponse(BaseModel):
    results: list[PublishResponse] = Field(description="One result per message, in order")


class StoredMessageView(BaseModel):
    """A stored message as browse shows it. Exactly one of body and body_base64 is present."""

    id: int = Field(description="This copy's numeric id (the keyset cursor)")
    message_id: str
    status: BrowseStatus
    routing_key: str
    exchange: str = Field(description='"" for a message published straight to the queue')
    headers: dict[str, Any]
    properties: dict[str, Any]
    body: Any = Field(default=None, description="Present unless the message is binary")
    body_base64: str | None = Field(
        default=None, description="Present for messages published with body_base64"
    )
    delivery_count: int
    created_at: str = Field(description="RFC 3339, UTC")
    available_at: str = Field(description="RFC 3339, UTC")


class StoredMessagePage(BaseModel):
    items: list[StoredMessageView]
    next_after: int | None = Field(
        default=None, description="Cursor for the next page (`?after=`); null on the last page"
    )
