"""Inbound WebSocket frames: one discriminated union, parsed by one TypeAdapter."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, TypeAdapter, ValidationError, model_validator

from app import jsonexact
from app.api.schemas.common import MAX_ACK_TAGS, MAX_TAG, DeliveryTag, Name, StrictModel
from app.api.schemas.messages import PublishBody
from app.api.shortcut import FastDecoder
from app.errors import BadFrame

FrameId = Annotated[str, Field(max_length=64)] | StrictInt


class _Frame(StrictModel):
    id: FrameId | None = None


class AuthFrame(_Frame):
    type: Literal["AUTH"]
    token: str | None = None
    username: str | None = None
    password: str | None = None

    def well_formed(self) -> bool:
        """Either a token, or a username and a password; never both."""
        if self.token is not None:
            return self.username is None and self.password is None
        return self.username is not None and self.password is not None


class SubscribeFrame(_Frame):
    type: Literal["SUBSCRIBE"]
    queue: Name
    prefetch: Annotated[StrictInt, Field(ge=1, le=1000)] = 1


class UnsubscribeFrame(_Frame):
    type: Literal["UNSUBSCRIBE"]
    queue: Name


class AckFrame(_Frame):
    """``ACK`` of one delivery (``delivery_tag``), or of several in one frame
    (``delivery_tags``, a MessageX addition: each tag settles as if it came in an ACK of its
    own, as AMQP's ``multiple`` or SQS's ``DeleteMessageBatch`` let a consumer do)."""

    type: Literal["ACK"]
    delivery_tag: DeliveryTag | None = None
    delivery_tags: (
        Annotated[list[DeliveryTag], Field(min_length=1, max_length=MAX_ACK_TAGS)] | None
    ) = None

    @model_validator(mode="after")
    def _one_form(self) -> AckFrame:
        if (self.delivery_tag is None) == (self.delivery_tags is None):
            raise ValueError("exactly one of 'delivery_tag' and 'delivery_tags' must be given")
        return self

    @property
    def tags(self) -> list[str]:
        if self.delivery_tags is not None:
            return self.delivery_tags
        assert self.delivery_tag is not None
        return [self.delivery_tag]


class _Plain:
    """What the plain-ACK shortcut makes (``parse``): equal to the AckFrame the models make
    of the same frame (the same tags in the same form, no id), so that the shortcut's result
    and the models' compare as the same (app.api.shortcut). It answers what the connection
    asks of an AckFrame; it carries no ``id``, so no ``ACKED`` is owed."""

    __slots__ = ()
    delivery_tag: str | None
    delivery_tags: list[str] | None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AckFrame) and other.id is not None:
            return False
        if isinstance(other, _Plain | AckFrame):
            mine = (self.delivery_tag, self.delivery_tags)
            return (other.delivery_tag, other.delivery_tags) == mine
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a model, which is unhashable too


class PlainAck(_Plain):
    """``{"type": "ACK", "delivery_tag": "..."}`` and nothing else: what a consumer that acks
    every delivery sends per message."""

    __slots__ = ("delivery_tag",)
    delivery_tag: str
    delivery_tags: None = None

    def __init__(self, delivery_tag: str) -> None:
        self.delivery_tag = delivery_tag

    @property
    def tags(self) -> list[str]:
        return [self.delivery_tag]


class PlainAcks(_Plain):
    """``{"type": "ACK", "delivery_tags": ["...", ...]}`` and nothing else: what a consumer
    that acks in groups sends."""

    __slots__ = ("delivery_tags",)
    delivery_tag: None = None
    delivery_tags: list[str]

    def __init__(self, delivery_tags: list[str]) -> None:
        self.delivery_tags = delivery_tags

    @property
    def tags(self) -> list[str]:
        return self.delivery_tags


Ack = AckFrame | PlainAck | PlainAcks


class NackFrame(_Frame):
    type: Literal["NACK"]
    delivery_tag: DeliveryTag
    requeue: StrictBool = True


class PingFrame(_Frame):
    type: Literal["PING"]


class PublishFrame(PublishBody):
    """``PUBLISH``: a publish body plus ``exchange`` (or ``queue`` for the default exchange)."""

    type: Literal["PUBLISH"]
    id: FrameId | None = None
    exchange: Name | None = None
    queue: Name | None = None

    @model_validator(mode="after")
    def _one_target(self) -> PublishFrame:
        if (self.exchange is None) == (self.queue is None):
            raise ValueError("exactly one of 'exchange' and 'queue' must be given")
        return self


Frame = Annotated[
    AuthFrame | SubscribeFrame | UnsubscribeFrame | AckFrame | NackFrame | PublishFrame | PingFrame,
    Field(discriminator="type"),
]
FRAME: TypeAdapter[Frame] = TypeAdapter(Frame)
_ID: TypeAdapter[str | int] = TypeAdapter(FrameId)


def frame_id_of(raw: Any) -> str | int | None:
    """The frame's ``id`` when it is a valid one, so even a bad frame's ERROR can carry it."""
    if isinstance(raw, dict) and "id" in raw:
        try:
            return _ID.validate_python(raw["id"])
        except ValidationError:
            return None
    return None


# A plain ACK, in any JSON whitespace; the tag is 1 to MAX_TAG characters of a JSON string
# without escapes (so its text is its value), exactly what the models accept for it.
_WS = r"[ \t\n\r]*"
_TAG = rf'"([^"\\\x00-\x1f]{{1,{MAX_TAG}}})"'
_PLAIN_ACK = re.compile(
    rf'{_WS}\{{{_WS}"type"{_WS}:{_WS}"ACK"{_WS},{_WS}"delivery_tag"{_WS}:{_WS}{_TAG}{_WS}\}}{_WS}'
)
#: the same with ``delivery_tags``, a list of such tags (group 1: the list's inside)
_PLAIN_ACKS = re.compile(
    rf'{_WS}\{{{_WS}"type"{_WS}:{_WS}"ACK"{_WS},{_WS}"delivery_tags"{_WS}:{_WS}\['
    rf"({_WS}{_TAG}(?:{_WS},{_WS}{_TAG})*){_WS}\]{_WS}\}}{_WS}"
)
_TAGS = re.compile(_TAG)


def _plain_ack(data: str | bytes) -> tuple[PlainAck | PlainAcks, None] | None:
    """The shortcut: a plain ACK as a PlainAck (one tag) or PlainAcks (a list of them),
    without the models; None for anything else."""
    if type(data) is str:
        plain = _PLAIN_ACK.fullmatch(data)
        if plain is not None:
            return PlainAck(plain.group(1)), None
        many = _PLAIN_ACKS.fullmatch(data)
        if many is not None:
            tags = _TAGS.findall(many.group(1))
            if len(tags) <= MAX_ACK_TAGS:
                return PlainAcks(tags), None
    return None


def _frame_by_models(data: str | bytes) -> tuple[Frame, str | int | None]:
    if type(data) is not str:
        raise BadFrame("frames are JSON text frames, not binary")
    return parse_with_models(data)


#: One WebSocket message → (frame, its id). Raises BadFrame (with the frame's id when it had
#: a valid one); a binary message is a bad frame.
#:
#: The plain ACK a consumer sends per message is matched first, without the models: one
#: regular expression instead of a JSON parse and a validation, 6.4 → 1.8 µs per frame
#: (docs/performance.md, round 8); so is the plain ACK of a list of tags that a consumer
#: acking in groups sends; any other form of them, and every other frame, goes through the
#: models.
FRAMES: FastDecoder[str | bytes, tuple[Frame | PlainAck | PlainAcks, str | int | None]] = (
    FastDecoder("WebSocket frame", _plain_ack, _frame_by_models)
)
parse = FRAMES.decode


def parse_with_models(text: str | bytes) -> tuple[Frame, str | int | None]:
    """One text frame (or UTF-8 bytes) through the models: ``parse`` without the plain-ACK
    shortcut. Raises BadFrame."""
    try:
        # strict (no NaN); integers past 64 bits stay exact, as on REST
        raw = jsonexact.loads(text, strict=True)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError
        raise BadFrame("the frame is not valid JSON") from None
    frame_id = frame_id_of(raw)
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise BadFrame("a frame is a JSON object with a string 'type'", frame_id=frame_id)
    try:
        return FRAME.validate_python(raw), frame_id
    except ValidationError as exc:
        err = exc.errors(include_input=False, include_url=False)[0]
        loc = err["loc"]
        # an unknown "type" (union_tag_invalid) has an empty loc
        where = ".".join(str(p) for p in loc[1:]) or (str(loc[0]) if loc else "type")
        raise BadFrame(f"{where}: {err['msg']}", frame_id=frame_id) from None
