"""Errors raised by the client. Broker errors carry the broker's ``code`` (contract §8)."""

from __future__ import annotations

from typing import Any


class MessageXError(Exception):
    """Base class. ``code`` is the broker's error code (``not_found``, ``forbidden``, …) or
    one of the client's own (``connection_lost``, ``timeout``, ``closed``, …)."""

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None, frame: Any = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.frame: dict[str, Any] | None = frame

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class BrokerError(MessageXError):
    """The broker answered an ``ERROR`` frame."""


class AuthenticationError(BrokerError):
    """Bad credentials (close 4401 or HTTP 401 at the upgrade). Final: no reconnect."""

    code = "unauthorized"


class RateLimited(BrokerError):
    """Too many failed authentications for this user or address (4429 / HTTP 429)."""

    code = "rate_limited"


class NotFound(BrokerError):
    code = "not_found"


class Forbidden(BrokerError):
    code = "forbidden"


class Unroutable(BrokerError):
    """A ``mandatory`` publish matched no queue; nothing was stored."""

    code = "unroutable"


class UnknownDeliveryTag(BrokerError):
    """The delivery is not (any longer) this connection's to settle."""

    code = "unknown_delivery_tag"


class ConnectionLost(MessageXError):
    """The connection closed before the reply came. For a publish, the outcome is unknown:
    it may have been stored (set ``message_id`` to de-duplicate a retry)."""

    code = "connection_lost"


class StaleDelivery(MessageXError):
    """The delivery came on a connection that has since closed: the broker has released it
    and will deliver it again, so it can no longer be acked or nacked."""

    code = "stale_delivery"


class SubscriptionCancelled(MessageXError):
    """The broker ended the subscription: ``reason`` is ``queue_deleted`` or ``forbidden``
    (or the broker's error code when resubscribing after a reconnect failed)."""

    code = "subscription_cancelled"

    def __init__(self, queue: str, reason: str) -> None:
        super().__init__(f"subscription to {queue!r} cancelled: {reason}")
        self.queue = queue
        self.reason = reason


class ClientClosed(MessageXError):
    code = "closed"


_BY_CODE: dict[str, type[BrokerError]] = {
    cls.code: cls
    for cls in (
        AuthenticationError,
        RateLimited,
        NotFound,
        Forbidden,
        Unroutable,
        UnknownDeliveryTag,
    )
}


def error_from_frame(frame: dict[str, Any]) -> BrokerError:
    code = str(frame.get("code", "error"))
    cls = _BY_CODE.get(code, BrokerError)
    return cls(str(frame.get("message", code)), code=code, frame=frame)
