"""Message bodies on the wire, for every transport (REST now, WebSocket frames later).

A published ``body`` is any JSON value and is stored as its compact JSON serialization; a
``body_base64`` is stored as the decoded raw bytes with ``binary`` set, and is delivered as
``body_base64`` again (contract §1). This module is the one place that turns one into the
other, so the rules (NaN refused, big integers exact, strict base64) hold for every transport.

orjson does the common case; the stdlib ``json`` module covers what orjson cannot do
exactly: integers beyond 64 bits (orjson refuses to write them and reads them as floats).
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import orjson

from app import jsonexact
from app.domain.model import StoredMessage

__all__ = [
    "ABSENT",
    "BodyError",
    "MessageLike",
    "body_field",
    "body_fields",
    "browse_item",
    "check_json_object",
    "dumps_json",
    "encode_body",
    "message_fields",
    "render",
    "rfc3339",
]


class _Absent:
    """The type of :data:`ABSENT`: a key that was not sent at all (``null`` is a value)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


#: Marks ``body`` / ``body_base64`` as not sent, as opposed to ``"body": null``.
ABSENT: Final = _Absent()


class BodyError(ValueError):
    """A body that cannot be published; ``field`` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


# ----------------------------------------------------------------------------- encoding


def _stdlib_dumps(value: Any) -> bytes:
    # allow_nan=False: NaN and ±Infinity are not JSON. ensure_ascii=False + strict UTF-8
    # encoding: an unpaired surrogate (legal in a Python str, not in UTF-8) raises.
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(
        "utf-8"
    )


def dumps_json(value: Any) -> bytes:
    """Compact JSON bytes of ``value``; ValueError when it is not representable as JSON.

    orjson first. It writes NaN and ±Infinity as ``null``, so an output containing ``null``
    is re-checked with the stdlib (cheap guard, exact answer); integers beyond 64 bits make
    orjson fail, and the stdlib writes them exactly.
    """
    try:
        out = orjson.dumps(value)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        if "surrogates" in str(exc):
            raise ValueError("contains an unpaired UTF-16 surrogate") from None
        try:
            return _stdlib_dumps(value)
        except (ValueError, TypeError, RecursionError, UnicodeEncodeError) as inner:
            raise ValueError(_reason(inner)) from None
    if b"null" in out:
        try:
            _stdlib_dumps(value)
        except (ValueError, TypeError, RecursionError, UnicodeEncodeError) as inner:
            raise ValueError(_reason(inner)) from None
    return out


def _reason(exc: BaseException) -> str:
    if isinstance(exc, UnicodeEncodeError):
        return "contains an unpaired UTF-16 surrogate"
    if isinstance(exc, RecursionError):
        return "is nested too deeply"
    if "Out of range float" in str(exc):
        return "contains NaN or Infinity, which are not JSON"
    return "is not representable as JSON"


def _has_nul(value: Any) -> bool:
    """Whether a NUL character occurs in any string (key or value) of a JSON value."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, Mapping):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False


def check_json_object(value: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``value`` can be stored as ``jsonb`` (headers, properties).

    Beyond being JSON, ``jsonb`` refuses ``\\u0000`` inside strings.
    """
    out = dumps_json(value)
    if b"\\u0000" in out and _has_nul(value):
        raise ValueError("must not contain NUL (\\u0000) characters")


def _decode_base64(data: str) -> bytes:
    try:
        return binascii.a2b_base64(data.encode("ascii"), strict_mode=True)
    except (UnicodeEncodeError, binascii.Error):
        raise BodyError(
            "body_base64", "is not valid base64 (RFC 4648 standard alphabet, padded)"
        ) from None


def encode_body(*, body: Any = ABSENT, body_base64: Any = ABSENT) -> tuple[bytes, bool]:
    """The stored bytes of a published body and whether it is binary.

    Exactly one of ``body`` (any JSON value, ``None`` included) and ``body_base64`` must be
    given; pass :data:`ABSENT` for the one that was not sent. Raises :class:`BodyError`.
    """
    has_body = body is not ABSENT
    has_base64 = body_base64 is not ABSENT
    if has_body == has_base64:
        which = "both" if has_body else "neither"
        raise BodyError(
            "body", f"exactly one of 'body' and 'body_base64' must be present (got {which})"
        )
    if has_base64:
        if not isinstance(body_base64, str):
            raise BodyError("body_base64", "must be a base64 string")
        return _decode_base64(body_base64), True
    try:
        return dumps_json(body), False
    except ValueError as exc:
        raise BodyError("body", str(exc)) from None


# ----------------------------------------------------------------------------- decoding


def body_field(body: bytes, binary: bool, *, raw_json: bool = False) -> tuple[str, Any]:
    """``("body", <json>)`` or ``("body_base64", "<b64>")`` for stored bytes.

    With ``raw_json`` the JSON body is an ``orjson.Fragment`` holding the stored bytes as they
    are (no parse, no re-serialization): only for output serialized with ``orjson.dumps``.
    Stored bytes that are not JSON (written behind the broker's back) are rendered as
    ``body_base64`` rather than breaking the document.
    """
    if not binary:
        if raw_json:
            return "body", orjson.Fragment(body)
        try:
            return "body", jsonexact.loads(body)
        except ValueError:
            pass
    return "body_base64", binascii.b2a_base64(body, newline=False).decode("ascii")


def json_field(text: str, *, raw_json: bool = False) -> Any:
    """Stored JSON text (a delivery's headers or properties) for output: with ``raw_json`` an
    ``orjson.Fragment`` of the text as it is, else the parsed value (integers past 64 bits
    exact), for the stdlib."""
    return orjson.Fragment(text) if raw_json else jsonexact.loads(text)


def body_fields(body: bytes, binary: bool, *, raw_json: bool = False) -> dict[str, Any]:
    """``body_field`` as a one-key dict."""
    return dict((body_field(body, binary, raw_json=raw_json),))


#: the last moment rendered and its text: the rows of one publish share their created_at (the
#: transaction's now()), and a claim hands out runs of them
_last_rendered: list[tuple[datetime, str]] = [(datetime.min.replace(tzinfo=UTC), "")]


def rfc3339(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds: ``2026-01-31T12:00:00.000000Z``."""
    last = _last_rendered[0]
    if moment == last[0]:
        return last[1]
    utc = moment if moment.tzinfo is UTC else moment.astimezone(UTC)
    # isoformat ends "+00:00" for UTC; a fifth of strftime's cost (once per delivery)
    text = utc.isoformat(timespec="microseconds")[:-6] + "Z"
    _last_rendered[0] = (moment, text)
    return text


class MessageLike(Protocol):
    """A stored message row as browse (``StoredMessage``) or delivery (``Delivery``) has it."""

    @property
    def message_id(self) -> str: ...
    @property
    def exchange(self) -> str: ...
    @property
    def routing_key(self) -> str: ...
    @property
    def headers(self) -> dict[str, Any]: ...
    @property
    def properties(self) -> dict[str, Any]: ...
    @property
    def body(self) -> bytes: ...
    @property
    def binary(self) -> bool: ...
    @property
    def delivery_count(self) -> int: ...
    @property
    def created_at(self) -> datetime: ...


def message_fields(stored: MessageLike, *, raw_json: bool = False) -> dict[str, Any]:
    """The fields every rendering of a stored message shares (browse, deliveries).

    ``message_id, exchange, routing_key, headers, properties, body|body_base64,
    delivery_count, created_at``; callers add their own (``id``/``status``/``available_at``
    for browse; ``queue``/``delivery_tag``/``redelivered`` for a delivery).
    """
    fields: dict[str, Any] = {
        "message_id": stored.message_id,
        "exchange": stored.exchange,
        "routing_key": stored.routing_key,
        "headers": stored.headers,
        "properties": stored.properties,
    }
    fields.update(body_fields(stored.body, stored.binary, raw_json=raw_json))
    fields["delivery_count"] = stored.delivery_count
    fields["created_at"] = rfc3339(stored.created_at)
    return fields


def render(build: Callable[[bool], Any]) -> bytes:
    """JSON bytes of a document holding message fields, built by ``build(raw_json)``.

    First with stored bodies embedded as they are (``raw_json=True``) and orjson; when the
    document holds what orjson cannot write (an integer beyond 64 bits in headers), it is
    built again with parsed bodies and written by the stdlib.
    """
    try:
        return orjson.dumps(build(True))
    except TypeError:
        return _stdlib_dumps(build(False))


def browse_page(items: Sequence[StoredMessage], next_after: int | None) -> bytes:
    """The JSON of a browse page (``GET /queues/{name}/messages`` and §17's query), stored
    JSON bodies embedded as they are (``render``)."""
    return render(
        lambda raw: {
            "items": [browse_item(m, raw_json=raw) for m in items],
            "next_after": next_after,
        }
    )


def browse_item(stored: StoredMessage, *, raw_json: bool = False) -> dict[str, Any]:
    """One item of ``GET /queues/{name}/messages`` (contract §5)."""
    item: dict[str, Any] = {"id": stored.id, "status": stored.status.value}
    item.update(message_fields(stored, raw_json=raw_json))
    item["available_at"] = rfc3339(stored.available_at)
    return item
