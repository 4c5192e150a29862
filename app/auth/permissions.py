"""Who may do what: the one home of authorization rules (contract §3).

RabbitMQ-style: three regular expressions per user, each matched in full against a resource
name; the empty string allows nothing; ``admin`` may do everything.
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import lru_cache

from app.domain.model import Role, User
from app.errors import Forbidden


class Access(StrEnum):
    CONFIGURE = "configure"
    WRITE = "write"
    READ = "read"


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str] | None:
    if pattern == "":
        return None
    try:
        return re.compile(pattern)
    except re.error:
        return None


def check_pattern(pattern: str) -> str | None:
    """An error message when ``pattern`` is not a valid regular expression, else None."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"invalid regular expression: {exc}"
    return None


def allows(user: User, access: Access, name: str) -> bool:
    if user.role is Role.ADMIN:
        return True
    pattern = _compiled(getattr(user.permissions, access.value))
    return pattern is not None and pattern.fullmatch(name) is not None


def allows_any(user: User, name: str) -> bool:
    """At least one permission on ``name``: enough to see it in lists and read it."""
    return any(allows(user, access, name) for access in Access)


def require(user: User, access: Access, name: str, kind: str) -> None:
    if not allows(user, access, name):
        raise Forbidden(
            f"{access.value} access to {kind} '{name}' is refused for user '{user.username}'"
        )


def require_any(user: User, name: str, kind: str) -> None:
    if not allows_any(user, name):
        raise Forbidden(f"no access to {kind} '{name}' for user '{user.username}'")


def require_admin(user: User) -> None:
    if user.role is not Role.ADMIN:
        raise Forbidden("this operation needs the admin role")
