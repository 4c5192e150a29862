"""The one error tree of the broker. No HTTP here: ``app.api.problems`` maps it once.

Each class's docstring is its default message.
"""

from __future__ import annotations

from typing import Any


class BrokerError(Exception):
    """The broker could not do that."""

    code = "internal_error"

    def __init__(self, message: str | None = None, **extra: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip()
        self.extra = extra
        super().__init__(self.message)


class InternalError(BrokerError):
    """An internal error occurred; nothing was changed."""

    code = "internal_error"


class BadRequest(BrokerError):
    """The request is malformed."""

    code = "bad_request"


class Unauthorized(BrokerError):
    """Authentication is required: the credentials are missing, wrong, expired or revoked."""

    code = "unauthorized"


class Forbidden(BrokerError):
    """You are authenticated but not allowed to do that."""

    code = "forbidden"


class NotFound(BrokerError):
    """Not found."""

    code = "not_found"


class PreconditionFailed(BrokerError):
    """A precondition failed."""

    code = "precondition_failed"


class MessageTooLarge(BrokerError):
    """The message body is larger than the configured limit."""

    code = "message_too_large"


class ValidationFailed(BrokerError):
    """The request does not match the schema."""

    code = "validation_error"

    def __init__(self, message: str | None = None, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.errors = errors or []

    @classmethod
    def on_field(cls, field: str, message: str, msg: str | None = None) -> ValidationFailed:
        """One field of the request body is wrong: ``message`` as the detail, ``msg``
        (default: the same) as its entry in ``errors``."""
        entry = {"loc": ["body", field], "msg": msg or message, "type": "value_error"}
        return cls(message, errors=[entry])


class Unroutable(BrokerError):
    """The message is mandatory and matched no queue; nothing was stored."""

    code = "unroutable"


class RateLimited(BrokerError):
    """Too many failed authentication attempts; try again later."""

    code = "rate_limited"

    def __init__(self, retry_after: int, message: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)


class LimitExceeded(BrokerError):
    """A per-user or per-connection resource limit was reached."""

    code = "limit_exceeded"


class Unavailable(BrokerError):
    """The database is unreachable; the request did nothing."""

    code = "unavailable"


class DiskFull(Unavailable):
    """The database is out of disk space; the request did nothing (retry once space is freed)."""


class AlreadySubscribed(BrokerError):
    """This connection is already subscribed to that queue."""

    code = "already_subscribed"


class NotSubscribed(BrokerError):
    """This connection is not subscribed to that queue."""

    code = "not_subscribed"


class UnknownDeliveryTag(BrokerError):
    """No in-flight delivery with that tag belongs to this consumer."""

    code = "unknown_delivery_tag"


class BadFrame(BrokerError):
    """The frame is not valid."""

    code = "bad_frame"
