"""app.auth.permissions: RabbitMQ-style regular expressions, matched in full."""

from __future__ import annotations

import pytest

from app.auth.permissions import (
    Access,
    allows,
    allows_any,
    check_pattern,
    require,
    require_admin,
    require_any,
)
from app.domain.model import Permissions, Role, User
from app.errors import Forbidden


def user(configure: str = "", write: str = "", read: str = "") -> User:
    return User("u", Role.USER, Permissions(configure, write, read))


ADMIN = User("root", Role.ADMIN, Permissions())


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        (".*", "anything", True),
        (".*", "amq.direct", True),
        ("orders", "orders", True),
        ("orders", "orders2", False),  # matched in full, not as a prefix
        ("orders", "my-orders", False),  # nor as a substring
        ("orders\\..*", "orders.eu", True),
        ("orders\\..*", "orders", False),
        ("a|b", "a", True),
        ("a|b", "b", True),
        ("a|b", "ab", False),
        ("^q$", "q", True),
        ("", "anything", False),  # the empty string allows nothing
        ("", "", False),
        ("(unclosed", "(unclosed", False),  # a broken stored pattern allows nothing
    ],
)
def test_patterns_match_in_full(pattern: str, name: str, expected: bool) -> None:
    for access in Access:
        perms = {access.value: pattern}
        assert allows(user(**perms), access, name) is expected


def test_each_access_kind_uses_its_own_pattern() -> None:
    u = user(configure="c", write="w", read="r")
    assert allows(u, Access.CONFIGURE, "c")
    assert not allows(u, Access.CONFIGURE, "w")
    assert allows(u, Access.WRITE, "w")
    assert not allows(u, Access.WRITE, "r")
    assert allows(u, Access.READ, "r")
    assert not allows(u, Access.READ, "c")


def test_admin_may_do_everything_whatever_its_patterns() -> None:
    for access in Access:
        assert allows(ADMIN, access, "whatever")
        require(ADMIN, access, "whatever", "queue")
    assert allows_any(ADMIN, "x")
    require_any(ADMIN, "x", "exchange")
    require_admin(ADMIN)


def test_allows_any_needs_at_least_one_permission() -> None:
    assert not allows_any(user(), "q")
    assert allows_any(user(read="q"), "q")
    assert allows_any(user(write="q"), "q")
    assert allows_any(user(configure="q"), "q")
    assert not allows_any(user(configure="p", write="p", read="p"), "q")


def test_require_raises_forbidden_naming_the_resource() -> None:
    u = user(read="mine")
    require(u, Access.READ, "mine", "queue")
    with pytest.raises(Forbidden) as info:
        require(u, Access.WRITE, "mine", "queue")
    assert info.value.code == "forbidden"
    assert "write" in info.value.message
    assert "queue 'mine'" in info.value.message
    with pytest.raises(Forbidden, match="queue 'other'"):
        require_any(u, "other", "queue")
    require_any(u, "mine", "queue")


def test_require_admin_refuses_users_even_with_every_permission() -> None:
    with pytest.raises(Forbidden):
        require_admin(user(".*", ".*", ".*"))


@pytest.mark.parametrize("pattern", ["", ".*", "a|b", "orders\\..*", "[a-z]+", "(?i)abc"])
def test_check_pattern_accepts_valid_expressions(pattern: str) -> None:
    assert check_pattern(pattern) is None


# backreferences and lookaround: not linear-time, so RE2 refuses them (contract §3)
@pytest.mark.parametrize("pattern", ["(", "[a-", "*", "a{2,1}", "(a)\\1", "(?=a)a", "(?<!b)a"])
def test_check_pattern_explains_invalid_expressions(pattern: str) -> None:
    problem = check_pattern(pattern)
    assert problem is not None
    assert problem.startswith("invalid regular expression")
