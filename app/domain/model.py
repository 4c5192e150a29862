"""The broker's vocabulary: plain values, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

#: Names of exchanges, queues and users (contract §1).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,254}$"
NAME_RE = re.compile(NAME_PATTERN)
RESERVED_PREFIX = "amq."
BUILTIN_EXCHANGES: dict[str, str] = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
}
MAX_DELAY_MS = 604_800_000


def is_valid_name(name: str) -> bool:
    return NAME_RE.fullmatch(name) is not None


class ExchangeType(StrEnum):
    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"
    HEADERS = "headers"


class MessageStatus(StrEnum):
    """Stored statuses. ``delayed`` is derived: ready with ``available_at`` in the future."""

    READY = "ready"
    IN_FLIGHT = "in_flight"
    DEAD = "dead"


class BrowseStatus(StrEnum):
    READY = "ready"
    DELAYED = "delayed"
    IN_FLIGHT = "in_flight"
    DEAD = "dead"


class Role(StrEnum):
    ADMIN = "admin"
    USER = "user"


@dataclass(frozen=True, slots=True)
class Exchange:
    name: str
    type: ExchangeType
    durable: bool = True
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def builtin(self) -> bool:
        return self.name in BUILTIN_EXCHANGES


@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    durable: bool = True
    max_delivery_count: int | None = None
    dead_letter_queue: str | None = None
    ack_timeout_seconds: int | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueStats:
    ready: int = 0
    delayed: int = 0
    in_flight: int = 0
    dead: int = 0
    consumers: int = 0


@dataclass(frozen=True, slots=True)
class Binding:
    """A binding from ``exchange`` to a queue or (contract §14) to another exchange: exactly
    one of ``queue`` and ``destination_exchange`` is set."""

    id: int
    exchange: str
    queue: str | None
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    destination_exchange: str | None = None

    @property
    def destination(self) -> tuple[str, str]:
        """(kind, name) of where it leads: ("queue", name) or ("exchange", name)."""
        if self.queue is not None:
            return "queue", self.queue
        assert self.destination_exchange is not None
        return "exchange", self.destination_exchange


@dataclass(frozen=True, slots=True)
class Permissions:
    """RabbitMQ-style permissions: regular expressions matched in full; "" allows nothing."""

    configure: str = ""
    write: str = ""
    read: str = ""


@dataclass(frozen=True, slots=True)
class User:
    username: str
    role: Role
    permissions: Permissions
    loopback_only: bool = False


# The two values made per message on the hot path are plain (not frozen) slotted
# dataclasses: a frozen one's __init__ sets each field through object.__setattr__, 2.5 µs for
# Delivery's 13 fields against 0.3 µs. Nothing mutates them after construction; evolve()
# is how a changed copy is made.
@dataclass(slots=True)
class OutgoingMessage:
    """One message as a publisher hands it over, before routing.

    ``body`` is the stored bytes: JSON-serialized for ``body`` publishes, raw for
    ``body_base64`` ones (``binary`` is then true and deliveries use base64).
    """

    body: bytes
    binary: bool
    routing_key: str = ""
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    delay_ms: int = 0
    mandatory: bool = False
    message_id: str = ""
    #: headers and properties as the JSON text to store, once the publisher's admission has
    #: encoded them (to measure them against the header limit); None before
    stored_json: tuple[str, str] | None = None

    def evolve(
        self,
        *,
        routing_key: str | None = None,
        properties: dict[str, Any] | None = None,
        message_id: str | None = None,
        stored_json: tuple[str, str] | None = None,
    ) -> OutgoingMessage:
        """A copy with some fields changed: ``dataclasses.replace`` without its per-call
        introspection (it showed at 6 % of a batch publish's CPU). New ``properties`` drop
        the stored JSON unless ``stored_json`` is given with them."""
        if stored_json is None and properties is None:
            stored_json = self.stored_json
        return OutgoingMessage(
            self.body,
            self.binary,
            self.routing_key if routing_key is None else routing_key,
            self.headers,
            self.properties if properties is None else properties,
            self.delay_ms,
            self.mandatory,
            self.message_id if message_id is None else message_id,
            stored_json,
        )


@dataclass(frozen=True, slots=True)
class PublishResult:
    routed: bool
    queues: list[str]
    message_id: str
    #: queues that refused their copy (x-overflow reject-publish / reject-publish-dlx)
    rejected: list[str] = field(default_factory=list)
    #: queues that already had this message_id within their deduplication window (§15)
    duplicates: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message row as browse and delivery see it."""

    id: int
    queue: str
    message_id: str
    status: BrowseStatus
    exchange: str
    routing_key: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    body: bytes
    binary: bool
    delivery_count: int
    created_at: datetime
    available_at: datetime
    delivery_tag: str | None = None


@dataclass(slots=True)
class Delivery:
    """A claimed message on its way to a consumer."""

    slot: int  # which of the claim's owners it went to (0-based)
    id: int
    queue_id: int
    message_id: str
    exchange: str
    routing_key: str
    #: headers and properties as JSON text: as PostgreSQL prints the stored jsonb (a claim),
    #: or as the publisher stored it (a direct hand-off); rendering splices it unparsed
    headers: str
    properties: str
    body: bytes
    binary: bool
    delivery_count: int
    created_at: datetime
    delivery_tag: str
