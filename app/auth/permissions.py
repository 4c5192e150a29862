"""Who may do what: the one home of authorization rules (contract §3).

RabbitMQ-style: three regular expressions per user, each matched in full against a resource
name; the empty string allows nothing; ``admin`` may do everything.

The expressions run on RE2 (``google-re2``): an automaton, so a match takes time linear in the
name whatever an admin sets (contract §3). Python's backtracking ``re`` took 47 ms for
``(a|aa)+`` against 28 characters, and doubled with each more one, on the event loop. RE2 has
no backreferences or lookaround: such a pattern is refused at ``PUT /users`` (422).
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]

from app.domain.model import Role, User
from app.errors import Forbidden


class Access(StrEnum):
    CONFIGURE = "configure"
    WRITE = "write"
    READ = "read"


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a bad pattern is the caller's answer, not a line on stderr
    return options


_OPTIONS = _options()


def compile_pattern(pattern: str) -> Any:
    """The linear-time matcher of ``pattern`` (RE2); raises ``re2.error``."""
    return re2.compile(pattern, _OPTIONS)


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> Any:
    if pattern == "":
        return None
    try:
        return compile_pattern(pattern)
    except re2.error:
        return None  # a stored pattern RE2 refuses (set before RE2) allows nothing


def check_pattern(pattern: str) -> str | None:
    """An error message when RE2 cannot compile ``pattern``, else None."""
    try:
        compile_pattern(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "not valid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        return f"invalid regular expression (RE2 syntax, no backreferences or lookaround): {reason}"
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
