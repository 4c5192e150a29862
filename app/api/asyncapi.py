"""The AsyncAPI 3.0 document of the WebSocket protocol (contract §8 and Part two).

The client frames' schemas come from the models the server parses them with
(``app.api.ws.frames``); the server frames, which the connection builds as plain dicts on
its hot path, are described by the models below. The test suite's WebSocket client checks
every frame it sends and receives against the committed document (tests/wsclient.py), so a
frame the server sends that the document does not describe fails a test, as does a
document that refuses a frame the server accepts.

``messagex asyncapi`` writes it (``make openapi`` writes both documents); the app serves it
at ``/asyncapi.json``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from app import __version__
from app.api.schemas.common import DeliveryTag
from app.api.schemas.consume import Delivered
from app.api.ws import frames

REF = "#/components/schemas/{model}"


class _ServerFrame(BaseModel):
    """Server frames carry exactly these fields: an unknown one fails the suite's check."""

    model_config = ConfigDict(extra="forbid")


class _Reply(_ServerFrame):
    id: frames.FrameId | None = Field(
        default=None, description="The id of the client frame this answers, when it had one"
    )


class UserRef(_ServerFrame):
    username: str
    role: Literal["admin", "user"]


class ConnectedFrame(_Reply):
    """Sent once authentication succeeded (the upgrade's credentials or an AUTH frame)."""

    type: Literal["CONNECTED"]
    connection_id: str
    user: UserRef


class SubscribedFrame(_Reply):
    """The answer to SUBSCRIBE, always before any delivery from the queue."""

    type: Literal["SUBSCRIBED"]
    queue: str
    prefetch: int
    active: bool = Field(
        description="false while another subscription is the single active consumer (§13)"
    )


class UnsubscribedFrame(_Reply):
    type: Literal["UNSUBSCRIBED"]
    queue: str


class AckedFrame(_Reply):
    """Sent for an ACK that had an ``id``: the tag, or the tags, it settled."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["delivery_tag"]}, {"required": ["delivery_tags"]}]
        }
    )
    type: Literal["ACKED"]
    delivery_tag: str | None = None
    delivery_tags: list[str] | None = None


class NackedFrame(_Reply):
    type: Literal["NACKED"]
    delivery_tag: str
    outcome: Literal["requeued", "dead_lettered", "dead", "discarded"]


class PublishedFrame(_Reply):
    """The publish confirm, sent after the commit."""

    type: Literal["PUBLISHED"]
    routed: bool
    queues: list[str]
    message_id: str
    rejected: list[str]
    duplicates: list[str]


class PongFrame(_Reply):
    type: Literal["PONG"]


class ErrorFrame(_Reply):
    """A frame failed; the connection stays open (but see the contract's limits)."""

    type: Literal["ERROR"]
    code: str = Field(
        description="unauthorized, forbidden, not_found, already_subscribed, not_subscribed, "
        "unknown_delivery_tag, bad_frame, message_too_large, unroutable, limit_exceeded, ..."
    )
    message: str
    delivery_tag: DeliveryTag | None = None
    delivery_tags: list[str] | None = Field(
        default=None, description="The tags of a multi-tag ACK that were not in flight"
    )


class MessageDeliveredFrame(Delivered):
    """A delivery: the fields of a pulled message (``Delivered``) and ``type``. Exactly one of
    ``body`` and ``body_base64`` is present."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["body"]}, {"required": ["body_base64"]}]},
    )
    type: Literal["MESSAGE_DELIVERED"]


class SubscriptionCancelledFrame(_ServerFrame):
    type: Literal["SUBSCRIPTION_CANCELLED"]
    queue: str
    reason: Literal["queue_deleted", "forbidden"]


class SubscriptionActiveFrame(_ServerFrame):
    """A waiting subscription of a single-active-consumer queue became the active one (§13)."""

    type: Literal["SUBSCRIPTION_ACTIVE"]
    queue: str


#: client frame type → (model, its success reply types)
CLIENT: dict[str, tuple[type[BaseModel], tuple[str, ...]]] = {
    "AUTH": (frames.AuthFrame, ("CONNECTED",)),
    "SUBSCRIBE": (frames.SubscribeFrame, ("SUBSCRIBED",)),
    "UNSUBSCRIBE": (frames.UnsubscribeFrame, ("UNSUBSCRIBED",)),
    "ACK": (frames.AckFrame, ("ACKED",)),
    "NACK": (frames.NackFrame, ("NACKED",)),
    "PUBLISH": (frames.PublishFrame, ("PUBLISHED",)),
    "PING": (frames.PingFrame, ("PONG",)),
}
#: server frame type → model
SERVER: dict[str, type[BaseModel]] = {
    "CONNECTED": ConnectedFrame,
    "SUBSCRIBED": SubscribedFrame,
    "UNSUBSCRIBED": UnsubscribedFrame,
    "ACKED": AckedFrame,
    "NACKED": NackedFrame,
    "PUBLISHED": PublishedFrame,
    "PONG": PongFrame,
    "ERROR": ErrorFrame,
    "MESSAGE_DELIVERED": MessageDeliveredFrame,
    "SUBSCRIPTION_CANCELLED": SubscriptionCancelledFrame,
    "SUBSCRIPTION_ACTIVE": SubscriptionActiveFrame,
}
#: server frames sent unasked
PUSHED = ("MESSAGE_DELIVERED", "SUBSCRIPTION_CANCELLED", "SUBSCRIPTION_ACTIVE")


def _message(kind: str, model: type[BaseModel], direction: str) -> dict[str, Any]:
    doc = (model.__doc__ or "").strip()
    return {
        "name": kind,
        "title": kind,
        "summary": f"{direction}: {doc.splitlines()[0]}" if doc else direction,
        "contentType": "application/json",
        "payload": {"$ref": REF.format(model=model.__name__)},
    }


def _ref(kind: str) -> dict[str, str]:
    return {"$ref": f"#/channels/ws/messages/{kind}"}


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document (a JSON-able dict)."""
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (model, "validation") for model, _ in CLIENT.values()
    ]
    models += [(model, "serialization") for model in SERVER.values()]
    _, defs = models_json_schema(models, ref_template=REF)
    schemas = defs.get("$defs", {})
    # What the frames' model validators add to their fields' schemas: exactly one of two.
    schemas["AckFrame"]["oneOf"] = [{"required": ["delivery_tag"]}, {"required": ["delivery_tags"]}]
    schemas["PublishFrame"]["oneOf"] = [{"required": ["exchange"]}, {"required": ["queue"]}]
    messages = {
        kind: _message(kind, model, "client → server") for kind, (model, _) in CLIENT.items()
    }
    messages |= {kind: _message(kind, model, "server → client") for kind, model in SERVER.items()}
    channel = {"$ref": "#/channels/ws"}
    operations: dict[str, Any] = {}
    for kind, (_, replies) in CLIENT.items():
        operations[f"receive{kind.title().replace('_', '')}"] = {
            "action": "receive",
            "channel": channel,
            "summary": f"The client sends {kind}",
            "messages": [_ref(kind)],
            "reply": {"channel": channel, "messages": [_ref(r) for r in (*replies, "ERROR")]},
        }
    for kind in PUSHED:
        operations[f"send{kind.title().replace('_', '')}"] = {
            "action": "send",
            "channel": channel,
            "summary": f"The broker pushes {kind}",
            "messages": [_ref(kind)],
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "MessageX WebSocket protocol",
            "version": __version__,
            "description": (
                "JSON text frames over one WebSocket (contract §8, Part two). A client frame "
                "may carry an id (string of at most 64 characters, or an integer); each frame "
                "with an id gets exactly one reply with that id: its success frame or ERROR. "
                "Authenticate with the upgrade's Authorization header or a first AUTH frame "
                "within 10 s. The REST API is described by /openapi.json."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "127.0.0.1:8000",
                "protocol": "ws",
                "description": "`messagex serve` on its default address (wss behind TLS)",
            }
        },
        "channels": {
            "ws": {
                "address": "/api/v1/ws",
                "title": "The broker's WebSocket",
                "servers": [{"$ref": "#/servers/local"}],
                "messages": messages,
                "bindings": {"ws": {"method": "GET", "bindingVersion": "0.1.0"}},
            }
        },
        "operations": operations,
        "components": {"schemas": schemas},
    }
