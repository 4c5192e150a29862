"""Exchange routing: which queues a published message goes to (contract §4, §12, §14).

Pure functions, no I/O. :func:`route_graph` is the one entry point that follows
exchange-to-exchange bindings and alternate exchanges; publishing and dead-lettering through
an exchange both route with it. The semantics are AMQP 0-9-1 as RabbitMQ implements them,
except that headers values are compared as JSON values (``1`` equals ``1.0``,
``true`` is not ``1``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from math import isfinite
from typing import Any, assert_never

from app.domain.model import ExchangeType

__all__ = [
    "X_MATCH_VALUES",
    "BindingRule",
    "CompiledRoutes",
    "ExchangeNode",
    "HeadersIndex",
    "TopicTrie",
    "all_match_conditions",
    "check_binding_arguments",
    "headers_match",
    "route",
    "route_graph",
    "topic_matches",
]

#: The values a headers binding's ``x-match`` argument may take.
X_MATCH_VALUES: frozenset[str] = frozenset({"all", "any", "all-with-x", "any-with-x"})

_X_MATCH = "x-match"
_X_PREFIX = "x-"
_DEFAULT_X_MATCH = "all"


@dataclass(frozen=True, slots=True)
class BindingRule:
    """What routing needs to know about one binding of the exchange being published to.

    ``queue`` names the binding's destination: a queue, or for the rules of an exchange's
    exchange-to-exchange bindings (:attr:`ExchangeNode.onward`), the destination exchange.
    """

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
    need_all, with_x = _x_match(arguments)
    for key, expected in _compared(arguments, with_x):
        matched = key in headers and _json_equal(expected, headers[key])
        if matched != need_all:
            # "all" and this one differs, or "any" and this one is equal: decided.
            return matched
    return need_all


def all_match_conditions(arguments: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The (key, value) pairs that a headers binding with these ``arguments`` and
    ``x-match: all`` compares: a message matches when its headers hold every key with a value
    equal in JSON value and type (what a §17 filter's ``headers`` means; storage compares
    them as ``jsonb`` equality, which has the same rules)."""
    return list(_compared(arguments, with_x=False))


def _x_match(arguments: Mapping[str, Any]) -> tuple[bool, bool]:
    """(needs all, compares x- keys) of a headers binding's ``x-match``."""
    mode = arguments.get(_X_MATCH, _DEFAULT_X_MATCH)
    if not isinstance(mode, str) or mode not in X_MATCH_VALUES:
        mode = _DEFAULT_X_MATCH
    return mode.startswith("all"), mode.endswith("-with-x")


def _compared(arguments: Mapping[str, Any], with_x: bool) -> Iterator[tuple[str, Any]]:
    """The (key, value) pairs of a headers binding that are compared with the headers."""
    for key, expected in arguments.items():
        if key == _X_MATCH or (not with_x and key.startswith(_X_PREFIX)):
            continue
        yield key, expected


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


# --------------------------------------------------------------------------- compiled


class _TrieNode:
    __slots__ = ("hash", "is_hash", "star", "terminals", "words")

    def __init__(self, is_hash: bool = False) -> None:
        self.words: dict[str, _TrieNode] = {}
        self.star: _TrieNode | None = None
        self.hash: _TrieNode | None = None
        self.is_hash = is_hash  # reached through a "#": may consume more words and stay
        self.terminals: list[int] = []


class TopicTrie:
    """Many topic binding keys compiled into one trie over their words.

    ``match`` returns the indices (in insertion order) of the patterns that match a key,
    with exactly :func:`topic_matches`' semantics. It walks the trie once: the work depends
    on the key and on how many patterns share wildcards along its path, not on the number
    of patterns. States are (node, words consumed) pairs, each visited once, so runs of
    ``#`` cannot make it exponential.
    """

    __slots__ = ("_root",)

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self._root = _TrieNode()
        for index, pattern in enumerate(patterns):
            self._add(pattern, index)

    def _add(self, pattern: str, index: int) -> None:
        node = self._root
        for word in _split_words(pattern):
            if word == "#":
                if node.is_hash:  # "#.#" matches what "#" does
                    continue
                if node.hash is None:
                    node.hash = _TrieNode(is_hash=True)
                node = node.hash
            elif word == "*":
                if node.star is None:
                    node.star = _TrieNode()
                node = node.star
            else:
                child = node.words.get(word)
                if child is None:
                    child = node.words[word] = _TrieNode()
                node = child
        node.terminals.append(index)

    def match(self, routing_key: str) -> list[int]:
        """Indices of the patterns matching ``routing_key``, ascending."""
        return sorted(self.walk(routing_key)[0])

    def walk(self, routing_key: str, budget: int = sys.maxsize) -> tuple[set[int], int]:
        """The indices of the matching patterns and the number of steps (states taken
        from the work list) it took. Raises :class:`WalkBudgetExceeded` past ``budget``
        steps: tests use it to check the work
        is polynomial in the key and the trie, without timing anything."""
        words = _split_words(routing_key)
        end = len(words)
        found: set[int] = set()
        seen: set[tuple[int, int]] = set()
        pending: list[tuple[_TrieNode, int]] = [(self._root, 0)]
        steps = 0
        while pending:
            steps += 1
            if steps > budget:
                raise WalkBudgetExceeded(budget)
            node, at = pending.pop()
            state = (id(node), at)
            if state in seen:
                continue
            seen.add(state)
            if node.hash is not None:  # "#" matching zero words
                pending.append((node.hash, at))
            if at == end:
                found.update(node.terminals)
                continue
            if node.is_hash:  # "#" consuming one more word
                pending.append((node, at + 1))
            child = node.words.get(words[at])
            if child is not None:
                pending.append((child, at + 1))
            if node.star is not None:
                pending.append((node.star, at + 1))
        return found, steps

    def size(self) -> int:
        """The number of nodes in the trie."""
        count = 0
        nodes = [self._root]
        while nodes:
            node = nodes.pop()
            count += 1
            nodes.extend(node.words.values())
            nodes.extend(child for child in (node.star, node.hash) if child is not None)
        return count


class WalkBudgetExceeded(Exception):
    """A :meth:`TopicTrie.walk` took more steps than its budget allowed."""


def _scalar_key(value: Any) -> tuple[str, Any] | None:
    """A hashable key equal for exactly the JSON-equal scalars (``1`` and ``1.0`` alike,
    ``true`` apart from ``1``); None for arrays, objects and non-finite numbers."""
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, int):
        return ("number", value)
    if isinstance(value, float):
        return ("number", value) if isfinite(value) else None
    if isinstance(value, str):
        return ("string", value)
    if value is None:
        return ("null", None)
    return None


class HeadersIndex:
    """Many headers bindings' arguments, indexed so that a message tests few of them.

    An ``all`` binding can match only a message that carries its first compared scalar
    (key, value) pair, so it is filed under that pair; an ``any`` binding whose compared
    values are all scalars can match only a message carrying one of them, so it is filed
    under each. The rest (nothing to compare, only array/object values) are tested on every
    message. Every candidate is then confirmed with :func:`headers_match`, so the index
    only narrows, never decides.
    """

    __slots__ = ("_always", "_arguments", "_by_pair")

    def __init__(self, arguments: Sequence[Mapping[str, Any]]) -> None:
        self._arguments = arguments
        self._by_pair: dict[tuple[str, tuple[str, Any]], list[int]] = {}
        self._always: list[int] = []
        for index, args in enumerate(arguments):
            pairs = self._filing(args)
            if pairs is None:
                self._always.append(index)
            for pair in pairs or ():
                self._by_pair.setdefault(pair, []).append(index)

    @staticmethod
    def _filing(args: Mapping[str, Any]) -> list[tuple[str, tuple[str, Any]]] | None:
        need_all, with_x = _x_match(args)
        pairs: list[tuple[str, tuple[str, Any]]] = []
        for key, expected in _compared(args, with_x):
            scalar = _scalar_key(expected)
            if need_all and scalar is not None:
                return [(key, scalar)]
            if not need_all:
                if scalar is None:
                    return None
                pairs.append((key, scalar))
        # "all" with no scalar to file under is tested always; "any" with nothing to
        # compare matches nothing, and is filed nowhere.
        return None if need_all else pairs

    def match(self, headers: Mapping[str, Any]) -> list[int]:
        """Indices of the bindings whose arguments match ``headers``, ascending."""
        candidates: set[int] = set(self._always)
        if self._by_pair:
            for key, value in headers.items():
                scalar = _scalar_key(value)
                if scalar is not None:
                    candidates.update(self._by_pair.get((key, scalar), ()))
        arguments = self._arguments
        return sorted(i for i in candidates if headers_match(arguments[i], headers))


class CompiledRoutes:
    """An exchange's bindings compiled for routing many messages: :func:`route`'s answer,
    at a cost that grows with the matches rather than with the number of bindings
    (direct: a dict by key; topic: a :class:`TopicTrie`; headers: a :class:`HeadersIndex`).

    ``by_key_only`` says whether the answer depends on the routing key alone (so callers
    may memoize it per key): every type but headers.
    """

    __slots__ = ("_direct", "_headers", "_queues", "_topic", "by_key_only", "type")

    def __init__(self, exchange_type: ExchangeType, bindings: Sequence[BindingRule]) -> None:
        kind = ExchangeType(exchange_type)
        self.type = kind
        self.by_key_only = kind is not ExchangeType.HEADERS
        self._queues = [b.queue for b in bindings]
        self._direct: dict[str, list[str]] | None = None
        self._topic: TopicTrie | None = None
        self._headers: HeadersIndex | None = None
        if kind is ExchangeType.DIRECT:
            self._direct = {}
            for binding in bindings:
                queues = self._direct.setdefault(binding.routing_key, [])
                if binding.queue not in queues:
                    queues.append(binding.queue)
        elif kind is ExchangeType.FANOUT:
            self._direct = {"": list(dict.fromkeys(self._queues))}
        elif kind is ExchangeType.TOPIC:
            self._topic = TopicTrie(b.routing_key for b in bindings)
        elif kind is ExchangeType.HEADERS:
            self._headers = HeadersIndex([b.arguments for b in bindings])
        else:
            assert_never(kind)

    def __call__(self, routing_key: str, headers: Mapping[str, Any]) -> list[str]:
        """Distinct queue names the message goes to, in order of the first matching
        binding (as :func:`route`)."""
        if self._direct is not None:
            key = "" if self.type is ExchangeType.FANOUT else routing_key
            return list(self._direct.get(key, ()))
        if self._topic is not None:
            matched = self._topic.match(routing_key)
        else:
            assert self._headers is not None
            matched = self._headers.match(headers)
        queues = self._queues
        return list(dict.fromkeys(queues[i] for i in matched))


# --------------------------------------------------------------------------- the graph

#: What routes a message through one exchange's bindings: (routing key, headers) → names.
Matcher = Callable[[str, Mapping[str, Any]], list[str]]


@dataclass(frozen=True, slots=True)
class ExchangeNode:
    """One exchange as :func:`route_graph` walks it: its queue bindings, its
    exchange-to-exchange bindings (None: it has none) and its alternate exchange's name."""

    queues: Matcher
    onward: Matcher | None = None
    alternate: str | None = None

    @property
    def leaf(self) -> bool:
        """Routes to its own queues only: no exchange-to-exchange binding, no alternate."""
        return self.onward is None and self.alternate is None


def route_graph(
    nodes: Mapping[str, ExchangeNode],
    exchange: str,
    routing_key: str,
    headers: Mapping[str, Any],
) -> list[str]:
    """Distinct queue names a message published to ``exchange`` goes to (contract §14).

    The walk is depth first, in binding order, and visits each exchange at most once per
    message (so cycles end). An exchange reaches the queues its queue bindings match and
    those reached through the exchanges its exchange-to-exchange bindings match; when that is
    nothing, the message goes on through its alternate exchange (same key and headers), whose
    queues then count as the exchange's own. A destination already visited counts with what
    it has reached so far; a name missing from ``nodes`` (a deleted alternate exchange)
    reaches nothing. A leaf exchange costs exactly its own match.
    """
    root = nodes.get(exchange)
    if root is None:
        return []
    if root.leaf:
        return root.queues(routing_key, headers)
    found: dict[str, None] = {}  # insertion-ordered set
    reached: dict[str, bool] = {}  # visited exchange → has it reached a queue (so far)
    # (exchange, its matched destinations not yet walked, alternate already tried)
    stack: list[tuple[str, Iterator[str], bool]] = []

    def enter(name: str) -> bool:
        node = nodes.get(name)
        if node is None or name in reached:
            return False
        queues = node.queues(routing_key, headers)
        found.update(dict.fromkeys(queues))
        reached[name] = bool(queues)
        onward = node.onward(routing_key, headers) if node.onward is not None else []
        stack.append((name, iter(onward), False))
        return True

    enter(exchange)
    while stack:
        name, onward, tried = stack[-1]
        destination = next(onward, None)
        if destination is None and not tried and not reached[name]:
            stack[-1] = (name, onward, True)
            destination = nodes[name].alternate
        if destination is not None:
            if not enter(destination) and reached.get(destination):
                reached[name] = True
            continue
        stack.pop()
        if stack and reached[name]:
            reached[stack[-1][0]] = True
    return list(found)


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
