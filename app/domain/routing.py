"""Exchange routing: which queues a published message goes to (contract §4, §12).

Pure functions, no I/O. The semantics are AMQP 0-9-1 as RabbitMQ implements them,
except that headers values are compared as JSON values (``1`` equals ``1.0``,
``true`` is not ``1``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, assert_never

from app.domain.model import ExchangeType

__all__ = [
    "X_MATCH_VALUES",
    "BindingRule",
    "check_binding_arguments",
    "headers_match",
    "route",
    "topic_matches",
]

#: The values a headers binding's ``x-match`` argument may take.
X_MATCH_VALUES: frozenset[str] = frozenset({"all", "any", "all-with-x", "any-with-x"})

_X_MATCH = "x-match"
_X_PREFIX = "x-"
_DEFAULT_X_MATCH = "all"


@dataclass(frozen=True, slots=True)
class BindingRule:
    """What routing needs to know about one binding of the exchange being published to."""

    queue: str
    routing_key: str
    # Left out of the hash so that a rule holding a plain dict stays hashable.
    arguments: Mapping[str, Any] = field(hash=False)


def route(
    exchange_type: ExchangeType,
    bindings: Iterable[BindingRule],
    routing_key: str,
    headers: Mapping[str, Any],
) -> list[str]:
    """Distinct queue names the message goes to, in order of the first matching binding."""
    matches = _binding_predicate(exchange_type, routing_key, headers)
    queues: dict[str, None] = {}  # insertion-ordered set
    for binding in bindings:
        if binding.queue not in queues and matches(binding):
            queues[binding.queue] = None
    return list(queues)


def _binding_predicate(
    exchange_type: ExchangeType, routing_key: str, headers: Mapping[str, Any]
) -> Callable[[BindingRule], bool]:
    kind = ExchangeType(exchange_type)  # ValueError for an unknown type given as a str
    if kind is ExchangeType.DIRECT:
        return lambda binding: binding.routing_key == routing_key
    if kind is ExchangeType.FANOUT:
        return lambda _binding: True
    if kind is ExchangeType.TOPIC:
        words = _split_words(routing_key)
        return lambda binding: _compile_topic(binding.routing_key).matches(routing_key, words)
    if kind is ExchangeType.HEADERS:
        return lambda binding: headers_match(binding.arguments, headers)
    assert_never(kind)


# --------------------------------------------------------------------------- topic


def _split_words(key: str) -> tuple[str, ...]:
    """``""`` has no words; any other key is split on ``.`` (empty words included)."""
    return tuple(key.split(".")) if key else ()


@dataclass(frozen=True, slots=True)
class _TopicPattern:
    """A topic binding key compiled to a bit-parallel NFA.

    Bit ``i`` of a state set means "the first ``i`` pattern words have been matched".
    Runs of ``#`` are collapsed to one, so one shift computes the epsilon closure
    (a ``#`` may match zero words). Matching takes one pass over the key: a few integer
    operations per key word, each on ints as wide as the pattern, with no backtracking.
    """

    pattern: str
    literal: bool  # no wildcards: the pattern matches exactly the same string
    start: int
    accept: int
    hashes: int
    stars: int
    literals: Mapping[str, int]

    def matches(self, key: str, key_words: tuple[str, ...]) -> bool:
        if self.literal:
            return key == self.pattern
        hashes, stars, literals = self.hashes, self.stars, self.literals
        state = self.start
        for word in key_words:
            # "#" consumes the word and stays; "*" or an equal literal consumes it and moves on.
            state = (state & hashes) | ((state & (stars | literals.get(word, 0))) << 1)
            if not state:
                return False
            state |= (state & hashes) << 1
        return bool(state & self.accept)


@lru_cache(maxsize=4096)
def _compile_topic(pattern: str) -> _TopicPattern:
    words: list[str] = []
    for word in _split_words(pattern):
        if word == "#" and words and words[-1] == "#":
            continue
        words.append(word)
    hashes = stars = 0
    literals: dict[str, int] = {}
    for position, word in enumerate(words):
        bit = 1 << position
        if word == "#":
            hashes |= bit
        elif word == "*":
            stars |= bit
        else:
            literals[word] = literals.get(word, 0) | bit
    return _TopicPattern(
        pattern=pattern,
        literal=not (hashes or stars),
        start=1 | ((1 & hashes) << 1),
        accept=1 << len(words),
        hashes=hashes,
        stars=stars,
        literals=literals,
    )


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether a topic binding key matches a routing key.

    Both are split on ``.`` into words, ``""`` having no words; ``*`` matches exactly
    one word (which may be empty) and ``#`` zero or more words.
    """
    return _compile_topic(pattern).matches(routing_key, _split_words(routing_key))


# --------------------------------------------------------------------------- headers


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    """Whether a headers binding's ``arguments`` match a message's ``headers``.

    ``x-match`` ``all`` (the default) needs every compared argument present and equal
    (vacuously true), ``any`` at least one (false when there is nothing to compare).
    Arguments whose keys start with ``x-`` are compared only in the ``-with-x`` modes,
    and ``x-match`` itself never. An ``x-match`` that is not one of
    :data:`X_MATCH_VALUES` (rejected at bind time) is read as ``all``, as RabbitMQ does.
    """
    mode = arguments.get(_X_MATCH, _DEFAULT_X_MATCH)
    if not isinstance(mode, str) or mode not in X_MATCH_VALUES:
        mode = _DEFAULT_X_MATCH
    need_all = mode.startswith("all")
    with_x = mode.endswith("-with-x")
    for key, expected in arguments.items():
        if key == _X_MATCH or (not with_x and key.startswith(_X_PREFIX)):
            continue
        matched = key in headers and _json_equal(expected, headers[key])
        if matched != need_all:
            # "all" and this one differs, or "any" and this one is equal: decided.
            return matched
    return need_all


_JSON_TYPE_NAMES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "boolean"),
    ((int, float), "number"),
    (str, "string"),
    (type(None), "null"),
    ((list, tuple), "array"),
    (Mapping, "object"),
)


def _json_type_name(value: Any) -> str:
    for types, name in _JSON_TYPE_NAMES:
        if isinstance(value, types):
            return name
    return type(value).__name__


def _json_equal(left: Any, right: Any) -> bool:
    """Equality of JSON value and type: ``1 == 1.0``, ``1 != "1"``, ``true != 1``.

    Iterative, so deeply nested values cannot exhaust the interpreter's stack.
    """
    pending: list[tuple[Any, Any]] = [(left, right)]
    while pending:
        a, b = pending.pop()
        kind = _json_type_name(a)
        if kind != _json_type_name(b):
            return False
        if kind == "array":
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif kind == "object":
            if a.keys() != b.keys():
                return False
            pending.extend((a[key], b[key]) for key in a)
        elif a != b:
            return False
    return True


# --------------------------------------------------------------------------- validation


def check_binding_arguments(exchange_type: ExchangeType, arguments: Mapping[str, Any]) -> None:
    """Raise ValueError with a clear message when a headers binding has an unknown/non-string
    x-match."""
    if ExchangeType(exchange_type) is not ExchangeType.HEADERS or _X_MATCH not in arguments:
        return
    value = arguments[_X_MATCH]
    expected = ", ".join(f'"{v}"' for v in sorted(X_MATCH_VALUES))
    if not isinstance(value, str):
        raise ValueError(
            f'invalid "x-match" argument: expected a string, one of {expected}; '
            f"got {_json_type_name(value)}"
        )
    if value not in X_MATCH_VALUES:
        raise ValueError(f'invalid "x-match" argument {value!r}: expected one of {expected}')
