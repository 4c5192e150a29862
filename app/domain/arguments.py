"""Queue and exchange ``arguments`` that take effect, and the message properties that go
with them (contract §13, §14, §15): parsed and checked in one place, no I/O.

Every declaration path calls :func:`parse_queue_arguments` / :func:`parse_exchange_arguments`
before anything is stored, so a wrong type, range or combination is one 422 naming the
argument (``arguments.x-max-length``) and changes nothing. Keys not listed here are stored and
ignored, as before. Types are strict as in JSON: ``1.0`` is not an integer, ``1`` is not a
boolean, ``"1"`` is not a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.domain.model import is_valid_name
from app.errors import ValidationFailed

#: AMQP's ``expiration`` and ``x-message-ttl`` range: an unsigned 32-bit count of ms.
MAX_TTL_MS = 4_294_967_295
#: ``expiration`` in full: decimal digits (leading zeros allowed) of 0 … 4294967295 — the
#: OpenAPI document's pattern, so that a schema-valid value is a valid one.
EXPIRATION_PATTERN = (
    r"^0*([0-9]{1,9}|[1-3][0-9]{9}|4[01][0-9]{8}|42[0-8][0-9]{7}|429[0-3][0-9]{6}"
    r"|4294[0-8][0-9]{5}|42949[0-5][0-9]{4}|429496[0-6][0-9]{3}|4294967[01][0-9]{2}"
    r"|42949672[0-8][0-9]|429496729[0-5])$"
)
#: ``x-expires`` has no upper bound in the contract; ~8,900 years keeps ``now() + interval``
#: inside PostgreSQL's timestamp range.
MAX_EXPIRES_MS = 2**48
MIN_EXPIRES_MS = 1000
MAX_PRIORITY = 255
#: ``properties.group_id``: 1 to this many characters (contract §16)
MAX_GROUP_ID = 128
#: Length limits are stored and compared as bigint.
MAX_LENGTH = 2**63 - 1
#: ``x-deduplication-window-seconds`` (contract §15): 1 s to one day.
MIN_DEDUP_WINDOW_SECONDS = 1
MAX_DEDUP_WINDOW_SECONDS = 86_400


class Overflow(StrEnum):
    """What a publish that would pass ``x-max-length``/``x-max-length-bytes`` does."""

    DROP_HEAD = "drop-head"
    REJECT_PUBLISH = "reject-publish"
    REJECT_PUBLISH_DLX = "reject-publish-dlx"


class DeathReason(StrEnum):
    """``x-death`` reasons (contract §10, §13)."""

    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"
    DELIVERY_LIMIT = "delivery_limit"


# The RabbitMQ names, one constant each: the UI, the client and the docs spell them the same.
MESSAGE_TTL = "x-message-ttl"
EXPIRES = "x-expires"
MAX_LENGTH_KEY = "x-max-length"
MAX_LENGTH_BYTES = "x-max-length-bytes"
OVERFLOW = "x-overflow"
MAX_PRIORITY_KEY = "x-max-priority"
SINGLE_ACTIVE_CONSUMER = "x-single-active-consumer"
MESSAGE_GROUPS = "x-message-groups"
DEAD_LETTER_EXCHANGE = "x-dead-letter-exchange"
DEAD_LETTER_ROUTING_KEY = "x-dead-letter-routing-key"
ALTERNATE_EXCHANGE = "alternate-exchange"
DEDUP_WINDOW = "x-deduplication-window-seconds"


@dataclass(frozen=True, slots=True)
class QueueArguments:
    """The arguments of one queue that change how it behaves; ``None``: not set."""

    message_ttl_ms: int | None = None
    expires_ms: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Overflow = Overflow.DROP_HEAD
    max_priority: int | None = None
    single_active_consumer: bool = False
    #: ``x-message-groups`` (contract §16): one copy of a group in flight at a time
    message_groups: bool = False
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    #: ``x-deduplication-window-seconds`` (contract §15); None: no deduplication
    dedup_window_seconds: int | None = None

    @property
    def deduplicated(self) -> bool:
        """Whether a publish into the queue claims its message_id (contract §15)."""
        return self.dedup_window_seconds is not None

    @property
    def limited(self) -> bool:
        """Whether a length limit applies to the queue's ready copies."""
        return self.max_length is not None or self.max_length_bytes is not None

    def priority_of(self, priority: int | None) -> int:
        """The priority a copy is claimed by in this queue: 0 in a queue without
        ``x-max-priority``, and a priority above the maximum counts as the maximum."""
        if self.max_priority is None or priority is None:
            return 0
        return min(priority, self.max_priority)

    def ttl_of(self, expiration: str | None) -> int | None:
        """A copy's time to live in this queue, in ms: the smaller of ``x-message-ttl`` and
        the message's ``expiration``; None: it never expires."""
        ttls = [t for t in (self.message_ttl_ms, parse_expiration(expiration)) if t is not None]
        return min(ttls) if ttls else None


@dataclass(frozen=True, slots=True)
class ExchangeArguments:
    alternate_exchange: str | None = None


def _fail(key: str, message: str) -> ValidationFailed:
    detail = f"arguments.{key}: {message}"
    entry = {"loc": ["body", "arguments", key], "msg": message, "type": "value_error"}
    return ValidationFailed(detail, errors=[entry])


def _integer(raw: dict[str, Any], key: str, low: int, high: int) -> int | None:
    if key not in raw:
        return None
    value = raw[key]
    if type(value) is not int:  # bool is an int subclass; JSON true is not a number here
        raise _fail(key, f"must be an integer from {low} to {high}")
    if not low <= value <= high:
        raise _fail(key, f"must be an integer from {low} to {high}")
    return value


def _name(raw: dict[str, Any], key: str) -> str | None:
    if key not in raw:
        return None
    value = raw[key]
    if not isinstance(value, str) or not is_valid_name(value):
        raise _fail(key, "must be an exchange name (1-255 characters from A-Z a-z 0-9 _ . : -)")
    return value


def parse_queue_arguments(raw: dict[str, Any]) -> QueueArguments:
    """The arguments of ``raw`` that take effect; 422 naming the first wrong one."""
    overflow = Overflow.DROP_HEAD
    if OVERFLOW in raw:
        try:
            overflow = Overflow(raw[OVERFLOW])
        except (ValueError, TypeError):
            choices = ", ".join(o.value for o in Overflow)
            raise _fail(OVERFLOW, f"must be one of {choices}") from None
    sac = raw.get(SINGLE_ACTIVE_CONSUMER, False)
    if not isinstance(sac, bool):
        raise _fail(SINGLE_ACTIVE_CONSUMER, "must be true or false")
    groups = raw.get(MESSAGE_GROUPS, False)
    if not isinstance(groups, bool):
        raise _fail(MESSAGE_GROUPS, "must be true or false")
    routing_key = raw.get(DEAD_LETTER_ROUTING_KEY)
    if DEAD_LETTER_ROUTING_KEY in raw:
        if not isinstance(routing_key, str) or "\x00" in routing_key:
            raise _fail(DEAD_LETTER_ROUTING_KEY, "must be a string without NUL characters")
        if DEAD_LETTER_EXCHANGE not in raw:
            raise _fail(DEAD_LETTER_ROUTING_KEY, f"needs {DEAD_LETTER_EXCHANGE}")
    return QueueArguments(
        message_ttl_ms=_integer(raw, MESSAGE_TTL, 0, MAX_TTL_MS),
        expires_ms=_integer(raw, EXPIRES, MIN_EXPIRES_MS, MAX_EXPIRES_MS),
        max_length=_integer(raw, MAX_LENGTH_KEY, 0, MAX_LENGTH),
        max_length_bytes=_integer(raw, MAX_LENGTH_BYTES, 0, MAX_LENGTH),
        overflow=overflow,
        max_priority=_integer(raw, MAX_PRIORITY_KEY, 1, MAX_PRIORITY),
        single_active_consumer=sac,
        message_groups=groups,
        dead_letter_exchange=_name(raw, DEAD_LETTER_EXCHANGE),
        dead_letter_routing_key=routing_key,
        dedup_window_seconds=_integer(
            raw, DEDUP_WINDOW, MIN_DEDUP_WINDOW_SECONDS, MAX_DEDUP_WINDOW_SECONDS
        ),
    )


def check_dead_letter_target(arguments: QueueArguments, dead_letter_queue: str | None) -> None:
    """A queue sets at most one of ``dead_letter_queue`` and ``x-dead-letter-exchange``."""
    if dead_letter_queue is not None and arguments.dead_letter_exchange is not None:
        raise _fail(
            DEAD_LETTER_EXCHANGE, "a queue sets at most one of dead_letter_queue and this argument"
        )


def parse_exchange_arguments(raw: dict[str, Any]) -> ExchangeArguments:
    return ExchangeArguments(alternate_exchange=_name(raw, ALTERNATE_EXCHANGE))


def parse_expiration(expiration: str | None) -> int | None:
    """A message's ``expiration`` property in ms (already checked by
    :func:`expiration_problem`); None when absent."""
    return None if expiration is None else int(expiration)


def expiration_problem(value: str) -> str | None:
    """Why ``value`` is not a valid ``expiration`` (AMQP: decimal digits, ms), or None."""
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_TTL_MS:
        return f"must be a string of decimal digits: milliseconds from 0 to {MAX_TTL_MS}"
    return None
