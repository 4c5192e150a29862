"""Unit tests for app.domain.routing (contract §4 "Exchanges" and §12 "Fine points")."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.model import ExchangeType
from app.domain.routing import (
    X_MATCH_VALUES,
    BindingRule,
    CompiledRoutes,
    HeadersIndex,
    TopicTrie,
    WalkBudgetExceeded,
    check_binding_arguments,
    headers_match,
    route,
    topic_matches,
)


def rule(queue: str, routing_key: str = "", arguments: dict[str, Any] | None = None) -> BindingRule:
    return BindingRule(queue=queue, routing_key=routing_key, arguments=arguments or {})


# --------------------------------------------------------------------------- topic


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        # plain words
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.b", "a.b.c", False),
        ("a.b.c", "a.b.d", False),
        ("A", "a", False),
        # "*" is exactly one word
        ("*", "a", True),
        ("*", "a.b", False),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("*.b.*", "a.b.c", True),
        ("*.*", "a", False),
        ("*.*.*", "a.b.c", True),
        # "*" matches an empty word
        ("a.*.b", "a..b", True),
        ("a..b", "a..b", True),
        ("a..b", "a.b", False),
        ("a.b", "a..b", False),
        ("a.*", "a.", True),
        ("a.", "a.", True),
        ("a.", "a", False),
        ("a", "a.", False),
        ("*.a", ".a", True),
        ("*", ".", False),
        ("*.*", ".", True),
        ("*.*.*", "..", True),
        ("*", "", False),
        # "#" alone and repeated
        ("#", "", True),
        ("#", "a", True),
        ("#", "a.b.c", True),
        ("#", ".", True),
        ("#", "a..b.", True),
        ("#.#", "", True),
        ("#.#", "a", True),
        ("#.#", "a.b.c", True),
        ("#.#.#", "", True),
        # "#" matches zero words
        ("a.#", "a", True),
        ("a.#", "a.b", True),
        ("a.#", "a.b.c", True),
        ("a.#", "a.", True),
        ("a.#", "b", False),
        ("a.#", "", False),
        ("#.a", "a", True),
        ("#.a", "x.y.a", True),
        ("#.a", "a.x", False),
        ("#.a", "", False),
        # "#" in the middle
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a..b", True),
        ("a.#.b", "a.b.c", False),
        ("a.#.b", "a", False),
        ("a.#.b", "b", False),
        ("a.#.#.b", "a.b", True),
        ("a.#.b.#.c", "a.b.c", True),
        ("a.#.b.#.c", "a.x.b.y.z.c", True),
        ("a.#.b.#.c", "a.x.c.y.z.b", False),
        # "#" and "*" together
        ("#.*", "", False),
        ("#.*", "a", True),
        ("#.*", "a.b.c", True),
        ("*.#", "", False),
        ("*.#", "a", True),
        ("*.#.*", "a", False),
        ("*.#.*", "a.b", True),
        ("*.#.*", "a.b.c.d", True),
        ("#.*.#", "", False),
        ("#.*.#", ".", True),
        ("#.b.*", "a.b.c", True),
        ("#.b.*", "b.c.b", False),
        ("#.b.*", "b.b.b", True),
        # the empty key has no words; the empty pattern has no words
        ("", "", True),
        ("", "a", False),
        ("", ".", False),
        ("a", "", False),
        ("", "#", False),
        (".", "", False),
        # wildcards only count as whole words; keys may contain them literally
        ("a*", "ab", False),
        ("a*", "a*", True),
        ("a#", "a.b", False),
        ("a#", "a#", True),
        ("#a", "x.a", False),
        ("a.b", "a.*", False),
        ("*", "*", True),
        ("#", "#", True),
        ("a.#", "a.#", True),
        # the key is not a regular expression either
        ("a.b", "aXb", False),
        ("a+", "aa", False),
        ("(a|b)", "a", False),
    ],
)
def test_topic_matches(pattern: str, key: str, expected: bool) -> None:
    assert topic_matches(pattern, key) is expected


@pytest.mark.parametrize("pattern", ["#", "#.#", "#.#.#.#", ""])
def test_empty_key_is_matched_by_hashes_and_the_empty_pattern(pattern: str) -> None:
    assert topic_matches(pattern, "")
    assert route(ExchangeType.TOPIC, [rule("q", pattern)], "", {}) == ["q"]


@pytest.mark.parametrize("pattern", ["*", "*.#", "#.*", "a", ".", "*.*"])
def test_empty_key_is_not_matched_by_patterns_needing_a_word(pattern: str) -> None:
    assert not topic_matches(pattern, "")
    assert route(ExchangeType.TOPIC, [rule("q", pattern)], "", {}) == []


def test_topic_long_keys_match_quickly() -> None:
    key = ".".join(f"w{i}" for i in range(300))
    assert len(key) > 255
    cases = [
        (key, True),
        ("#", True),
        ("#.w299", True),
        ("w0.#", True),
        ("w0.#.w150.#.w299", True),
        ("#.w150.#", True),
        (".".join(["*"] * 300), True),
        (".".join(["*"] * 299), False),
        (".".join(["*"] * 301), False),
        ("#." + ".".join(["*"] * 300), True),
        ("#." + ".".join(["*"] * 301), False),
        ("#.w299.w0", False),
        ("w1.#", False),
    ]
    started = time.thread_time()
    for pattern, expected in cases:
        assert topic_matches(pattern, key) is expected, pattern
    assert time.thread_time() - started < 1.0


_PATHOLOGICAL_TOPIC_CASES = [
    ("#.#.#.#.#.#.x", ".".join(["a"] * 300), False),
    ("#.#.#.#.#.#.x", ".".join(["a"] * 300) + ".x", True),
    ("#.a." * 60 + "b", ".".join(["a"] * 400), False),
    ("#.a." * 60 + "b", ".".join(["a"] * 400) + ".b", True),
    ("#.*." * 60 + "b", ".".join(["a"] * 400), False),
    ("*.#." * 60 + "b", "." * 400, False),
    (".".join(["#"] * 500), "." * 500, True),
    (".".join(["#", "a"] * 150 + ["c"]), ".".join(["a"] * 300 + ["b"]), False),
    ("#." * 200 + "*." * 200 + "#", ".".join(["z"] * 199), False),
    ("#." * 200 + "*." * 200 + "#", ".".join(["z"] * 200), True),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), _PATHOLOGICAL_TOPIC_CASES)
def test_topic_pathological_patterns_are_not_exponential(
    pattern: str, key: str, expected: bool
) -> None:
    # CPU time of this thread, not wall-clock time: a loaded machine (CI, other sessions)
    # delays the thread but does not make it spend more CPU. Linear work takes ~1 ms here;
    # anything backtracking would take years.
    started = time.thread_time()
    for _ in range(10):
        assert topic_matches(pattern, key) is expected
    assert time.thread_time() - started < 1.0


def test_topic_many_bindings_long_key_route_quickly() -> None:
    key = ".".join(["seg"] * 255)
    bindings = [rule(f"q{i}", "#." * (i % 7) + "seg.#." * (i % 5) + "x") for i in range(2000)]
    bindings.append(rule("hit", "#.seg"))
    started = time.thread_time()  # CPU time: immune to the machine's load
    assert route(ExchangeType.TOPIC, bindings, key, {}) == ["hit"]
    assert time.thread_time() - started < 2.0


# A simple, obviously-correct reference: a key of words w1..wn is written ".w1.wn" (the empty
# key is ""), "*" becomes one "\.[^.]*" and "#" any number of them.
def reference_topic_matches(pattern: str, key: str) -> bool:
    def words(s: str) -> list[str]:
        return s.split(".") if s else []

    regex = "".join(
        r"(?:\.[^.]*)*" if w == "#" else r"\.[^.]*" if w == "*" else re.escape("." + w)
        for w in words(pattern)
    )
    subject = "".join("." + w for w in words(key))
    return re.fullmatch(regex, subject) is not None


_KEY_WORDS = st.sampled_from(["", "a", "b", "ab"])
_PATTERN_WORDS = st.sampled_from(["", "a", "b", "ab", "*", "#"])


def _join(words: list[str]) -> str:
    return ".".join(words)


@pytest.mark.parametrize(
    ("pattern", "key"),
    [("#", ""), ("*", ""), ("", ""), ("a.*", "a."), ("a.#.b", "a.b"), ("*", "."), ("", "a")],
)
def test_reference_agrees_on_known_cases(pattern: str, key: str) -> None:
    assert reference_topic_matches(pattern, key) is topic_matches(pattern, key)


@settings(max_examples=2000, deadline=None)
@given(
    pattern=st.lists(_PATTERN_WORDS, max_size=7).map(_join),
    key=st.lists(_KEY_WORDS, max_size=9).map(_join),
)
def test_topic_matches_agrees_with_reference(pattern: str, key: str) -> None:
    assert topic_matches(pattern, key) is reference_topic_matches(pattern, key)


@settings(max_examples=500, deadline=None)
@given(key=st.lists(_KEY_WORDS, max_size=9).map(_join))
def test_topic_key_matches_itself_and_hash(key: str) -> None:
    assert topic_matches(key, key)
    assert topic_matches("#", key)
    assert topic_matches("#.#", key)
    words = key.split(".") if key else []
    assert topic_matches(".".join(["*"] * len(words)), key)
    assert topic_matches("*", key) is (len(words) == 1)


# --------------------------------------------------------------------------- headers


@pytest.mark.parametrize(
    ("arguments", "headers", "expected"),
    [
        # x-match all (the default)
        ({}, {}, True),
        ({}, {"a": 1}, True),
        ({"x-match": "all"}, {}, True),
        ({"x-match": "all"}, {"a": 1}, True),
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1}, {"a": 1, "b": 2}, True),
        ({"a": 1}, {}, False),
        ({"a": 1}, {"a": 2}, False),
        ({"a": 1}, {"b": 1}, False),
        ({"a": 1, "b": 2}, {"a": 1, "b": 2}, True),
        ({"a": 1, "b": 2}, {"a": 1}, False),
        ({"a": 1, "b": 2}, {"a": 1, "b": 3}, False),
        ({"x-match": "all", "a": "x", "b": "y"}, {"a": "x", "b": "y"}, True),
        ({"x-match": "all", "a": "x", "b": "y"}, {"a": "x", "b": "z"}, False),
        # keys are case-sensitive
        ({"a": 1}, {"A": 1}, False),
        # x- arguments are ignored by all/any
        ({"x-foo": "bar"}, {}, True),
        ({"x-foo": "bar"}, {"x-foo": "baz"}, True),
        ({"x-foo": "bar", "a": 1}, {"a": 1}, True),
        ({"x-match": "all", "x-foo": "bar", "a": 1}, {"a": 1, "x-foo": "nope"}, True),
        # x-match any
        ({"x-match": "any"}, {}, False),
        ({"x-match": "any"}, {"a": 1}, False),
        ({"x-match": "any", "a": 1}, {"a": 1}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 2, "b": 3}, False),
        ({"x-match": "any", "a": 1, "b": 2}, {}, False),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 9, "b": 2}, True),
        ({"x-match": "any", "x-foo": "bar"}, {"x-foo": "bar"}, False),
        ({"x-match": "any", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, False),
        # x-match all-with-x compares x- keys too, except x-match itself
        ({"x-match": "all-with-x"}, {}, True),
        ({"x-match": "all-with-x"}, {"x-match": "any"}, True),
        ({"x-match": "all-with-x", "x-foo": "bar"}, {"x-foo": "bar"}, True),
        ({"x-match": "all-with-x", "x-foo": "bar"}, {"x-foo": "baz"}, False),
        ({"x-match": "all-with-x", "x-foo": "bar"}, {}, False),
        ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, False),
        ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar", "a": 1}, True),
        # x-match any-with-x
        ({"x-match": "any-with-x"}, {}, False),
        ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
        ({"x-match": "any-with-x", "x-foo": "bar"}, {"x-foo": "bar"}, True),
        ({"x-match": "any-with-x", "x-foo": "bar"}, {"x-foo": "baz"}, False),
        ({"x-match": "any-with-x", "x-foo": "bar", "a": 1}, {"a": 1}, True),
        ({"x-match": "any-with-x", "x-foo": "bar", "a": 1}, {"a": 2, "x-foo": "bar"}, True),
        ({"x-match": "any-with-x", "x-foo": "bar", "a": 1}, {"a": 2}, False),
        # the message's own x- headers do not matter when the binding does not name them
        ({"a": 1}, {"a": 1, "x-death": [{"queue": "q"}]}, True),
        # an x-match value not validated at bind time routes as "all", like RabbitMQ
        ({"x-match": "bogus", "a": 1}, {"a": 1}, True),
        ({"x-match": "bogus", "a": 1}, {}, False),
        ({"x-match": 1, "a": 1}, {"a": 1}, True),
        ({"x-match": None}, {}, True),
    ],
)
def test_headers_match(arguments: dict[str, Any], headers: dict[str, Any], expected: bool) -> None:
    assert headers_match(arguments, headers) is expected


@pytest.mark.parametrize(
    ("expected_value", "header_value", "equal"),
    [
        # numbers: value, not representation
        (1, 1, True),
        (1, 1.0, True),
        (1.0, 1, True),
        (0, -0.0, True),
        (1.5, 1.5, True),
        (1, 2, False),
        (10**20, 1e20, True),
        # type matters
        (1, "1", False),
        ("1", 1, False),
        (1.0, "1.0", False),
        # booleans are not numbers
        (True, 1, False),
        (1, True, False),
        (False, 0, False),
        (0, False, False),
        (True, 1.0, False),
        (True, True, True),
        (False, False, True),
        (True, False, False),
        (True, "true", False),
        # null
        (None, None, True),
        (None, 0, False),
        (None, False, False),
        (None, "", False),
        (None, [], False),
        (None, {}, False),
        (0, None, False),
        ("", None, False),
        # strings
        ("", "", True),
        ("abc", "abc", True),
        ("abc", "ABC", False),
        ("é", "é", True),
        # arrays: order, length and element types matter
        ([], [], True),
        ([1, 2], [1, 2], True),
        ([1, 2], [1.0, 2.0], True),
        ([1, 2], [2, 1], False),
        ([1, 2], [1, 2, 3], False),
        ([1], [True], False),
        ([True], [1], False),
        ([None], [None], True),
        ([None], [], False),
        ("ab", ["a", "b"], False),
        ([], {}, False),
        ([], "", False),
        # objects: same keys, equal values
        ({}, {}, True),
        ({"k": 1}, {"k": 1.0}, True),
        ({"k": 1}, {"k": True}, False),
        ({"k": True}, {"k": 1}, False),
        ({"k": 1}, {"k": 1, "j": 2}, False),
        ({"k": 1, "j": 2}, {"j": 2, "k": 1}, True),
        ({"k": None}, {}, False),
        ({"k": None}, {"k": None}, True),
        ({"k": "1"}, {"k": 1}, False),
        # nested
        ({"a": [1, {"b": [True, None]}]}, {"a": [1.0, {"b": [True, None]}]}, True),
        ({"a": [1, {"b": [True, None]}]}, {"a": [1, {"b": [1, None]}]}, False),
        ({"a": [1, {"b": [True, None]}]}, {"a": [1, {"b": [True, 0]}]}, False),
        ({"a": [1, {"b": [True, None]}]}, {"a": [1, {"b": [True]}]}, False),
        ([[[[0]]]], [[[[0.0]]]], True),
        ([[[[0]]]], [[[[False]]]], False),
        ([[[["0"]]]], [[[[0]]]], False),
    ],
)
def test_headers_compare_json_values(expected_value: Any, header_value: Any, equal: bool) -> None:
    assert headers_match({"k": expected_value}, {"k": header_value}) is equal
    assert headers_match({"x-match": "any", "k": expected_value}, {"k": header_value}) is equal
    with_x = {"x-match": "all-with-x", "x-k": expected_value}
    assert headers_match(with_x, {"x-k": header_value}) is equal


def test_headers_null_argument_needs_the_key_present() -> None:
    assert headers_match({"k": None}, {"k": None})
    assert not headers_match({"k": None}, {})
    assert not headers_match({"x-match": "any", "k": None}, {"j": None})
    assert headers_match({"x-match": "any", "k": None, "j": 1}, {"k": None})


def test_headers_deeply_nested_values_do_not_overflow_the_stack() -> None:
    def nest(depth: int, leaf: Any) -> Any:
        value = leaf
        for i in range(depth):
            value = [value] if i % 2 else {"n": value}
        return value

    depth = 20_000
    assert headers_match({"k": nest(depth, 1)}, {"k": nest(depth, 1.0)})
    assert not headers_match({"k": nest(depth, 1)}, {"k": nest(depth, True)})
    assert not headers_match({"k": nest(depth, 1)}, {"k": nest(depth - 1, 1)})


def test_headers_match_does_not_mutate_its_inputs() -> None:
    arguments = {"x-match": "any-with-x", "x-a": [1, {"b": 2}], "c": None}
    headers = {"x-a": [1.0, {"b": 2}], "c": None}
    arguments_copy = {"x-match": "any-with-x", "x-a": [1, {"b": 2}], "c": None}
    headers_copy = {"x-a": [1.0, {"b": 2}], "c": None}
    assert headers_match(arguments, headers)
    assert arguments == arguments_copy
    assert headers == headers_copy


# --------------------------------------------------------------------------- route


def test_direct_routes_on_equal_keys_only() -> None:
    bindings = [
        rule("q1", "orders"),
        rule("q2", "orders.eu"),
        rule("q3", ""),
        rule("q4", "Orders"),
        rule("q5", "orders"),
        rule("q6", "#"),
        rule("q7", "*"),
    ]
    assert route(ExchangeType.DIRECT, bindings, "orders", {}) == ["q1", "q5"]
    assert route(ExchangeType.DIRECT, bindings, "", {}) == ["q3"]
    assert route(ExchangeType.DIRECT, bindings, "#", {}) == ["q6"]
    assert route(ExchangeType.DIRECT, bindings, "nothing", {}) == []


def test_direct_ignores_binding_arguments_and_headers() -> None:
    bindings = [rule("q", "k", {"x-match": "any", "a": 1})]
    assert route(ExchangeType.DIRECT, bindings, "k", {}) == ["q"]
    assert route(ExchangeType.DIRECT, bindings, "other", {"a": 1}) == []


def test_fanout_routes_to_every_binding_whatever_the_key() -> None:
    bindings = [rule("q1", "x"), rule("q2", ""), rule("q3", "#", {"x-match": "any", "a": 1})]
    for key in ["", "x", "anything.at.all"]:
        assert route(ExchangeType.FANOUT, bindings, key, {"b": 2}) == ["q1", "q2", "q3"]


def test_topic_route() -> None:
    bindings = [
        rule("all", "#"),
        rule("eu", "orders.eu.*"),
        rule("created", "*.*.created"),
        rule("empty", ""),
        rule("star", "*"),
    ]
    assert route(ExchangeType.TOPIC, bindings, "orders.eu.created", {}) == [
        "all",
        "eu",
        "created",
    ]
    assert route(ExchangeType.TOPIC, bindings, "orders.us.created", {}) == ["all", "created"]
    assert route(ExchangeType.TOPIC, bindings, "", {}) == ["all", "empty"]
    assert route(ExchangeType.TOPIC, bindings, "x", {}) == ["all", "star"]
    assert route(ExchangeType.TOPIC, bindings[1:], "no.pe", {}) == []


def test_headers_route() -> None:
    bindings = [
        rule("pdf", "ignored", {"format": "pdf"}),
        rule("report-or-pdf", "", {"x-match": "any", "type": "report", "format": "pdf"}),
        rule("pdf-report", "", {"x-match": "all", "type": "report", "format": "pdf"}),
        rule("everything", "", {}),
        rule("nothing", "", {"x-match": "any"}),
        rule("priority", "", {"x-match": "all-with-x", "x-priority": 1}),
    ]
    assert route(ExchangeType.HEADERS, bindings, "any", {"format": "pdf", "type": "report"}) == [
        "pdf",
        "report-or-pdf",
        "pdf-report",
        "everything",
    ]
    assert route(ExchangeType.HEADERS, bindings, "", {"type": "report"}) == [
        "report-or-pdf",
        "everything",
    ]
    assert route(ExchangeType.HEADERS, bindings, "", {"x-priority": 1.0}) == [
        "everything",
        "priority",
    ]
    assert route(ExchangeType.HEADERS, bindings[4:5], "", {"a": 1}) == []


@pytest.mark.parametrize("exchange_type", list(ExchangeType))
def test_route_without_bindings_is_unroutable(exchange_type: ExchangeType) -> None:
    assert route(exchange_type, [], "k", {"a": 1}) == []


@pytest.mark.parametrize(
    ("exchange_type", "key", "headers", "bindings", "expected"),
    [
        (
            ExchangeType.DIRECT,
            "k",
            {},
            [rule("q1", "k"), rule("q2", "k"), rule("q1", "k"), rule("q2", "k")],
            ["q1", "q2"],
        ),
        (
            ExchangeType.FANOUT,
            "",
            {},
            [rule("b", "x"), rule("a", "y"), rule("b", "z"), rule("a", "")],
            ["b", "a"],
        ),
        (
            ExchangeType.TOPIC,
            "a.b",
            {},
            [rule("q1", "#"), rule("q2", "a.*"), rule("q1", "a.b"), rule("q2", "*.b")],
            ["q1", "q2"],
        ),
        (
            ExchangeType.TOPIC,
            "a.b",
            {},
            [rule("q1", "x"), rule("q2", "a.*"), rule("q1", "a.b")],
            ["q2", "q1"],
        ),
        (
            ExchangeType.HEADERS,
            "",
            {"a": 1, "b": 2},
            [rule("q", "", {"a": 1}), rule("q", "", {"b": 2}), rule("q", "", {})],
            ["q"],
        ),
    ],
)
def test_route_delivers_at_most_once_per_queue_in_first_match_order(
    exchange_type: ExchangeType,
    key: str,
    headers: dict[str, Any],
    bindings: list[BindingRule],
    expected: list[str],
) -> None:
    assert route(exchange_type, bindings, key, headers) == expected


def test_route_accepts_any_iterable_of_bindings() -> None:
    bindings = (rule(f"q{i % 3}", "k") for i in range(10))
    assert route(ExchangeType.DIRECT, bindings, "k", {}) == ["q0", "q1", "q2"]


def test_route_accepts_exchange_type_values_as_strings() -> None:
    assert route(ExchangeType("topic"), [rule("q", "a.#")], "a", {}) == ["q"]
    assert route("fanout", [rule("q")], "x", {}) == ["q"]  # type: ignore[arg-type]


def test_route_rejects_unknown_exchange_type() -> None:
    with pytest.raises(ValueError, match="bogus"):
        route("bogus", [rule("q")], "", {})  # type: ignore[arg-type]


def test_binding_rule_is_frozen_and_hashable() -> None:
    r = rule("q", "k", {"a": [1]})
    with pytest.raises(AttributeError):
        r.queue = "other"  # type: ignore[misc]
    assert r == rule("q", "k", {"a": [1]})
    assert r != rule("q", "k", {"a": [2]})
    assert len({r, rule("q", "k", {"a": [1]})}) == 1


# --------------------------------------------------------------------------- validation


def test_x_match_values() -> None:
    assert frozenset({"all", "any", "all-with-x", "any-with-x"}) == X_MATCH_VALUES


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"a": 1},
        {"x-match": "all"},
        {"x-match": "any"},
        {"x-match": "all-with-x", "x-foo": 1},
        {"x-match": "any-with-x"},
        {"x-other": "bogus", "b": [1, {"c": None}]},
    ],
)
def test_check_binding_arguments_accepts_valid_headers_arguments(
    arguments: dict[str, Any],
) -> None:
    check_binding_arguments(ExchangeType.HEADERS, arguments)


@pytest.mark.parametrize(
    ("x_match", "message"),
    [
        ("bogus", "'bogus'"),
        ("ALL", "'ALL'"),
        ("", "''"),
        (" all", "' all'"),
        ("all ", "'all '"),
        ("any-with-X", "'any-with-X'"),
    ],
)
def test_check_binding_arguments_rejects_unknown_x_match(x_match: str, message: str) -> None:
    with pytest.raises(ValueError, match="x-match") as excinfo:
        check_binding_arguments(ExchangeType.HEADERS, {"x-match": x_match, "a": 1})
    text = str(excinfo.value)
    assert message in text
    for value in X_MATCH_VALUES:
        assert f'"{value}"' in text


@pytest.mark.parametrize(
    ("x_match", "type_name"),
    [
        (None, "null"),
        (1, "number"),
        (1.5, "number"),
        (True, "boolean"),
        (["all"], "array"),
        ({"all": True}, "object"),
    ],
)
def test_check_binding_arguments_rejects_non_string_x_match(x_match: Any, type_name: str) -> None:
    with pytest.raises(ValueError, match="expected a string") as excinfo:
        check_binding_arguments(ExchangeType.HEADERS, {"x-match": x_match})
    assert type_name in str(excinfo.value)


@pytest.mark.parametrize(
    "exchange_type", [ExchangeType.DIRECT, ExchangeType.FANOUT, ExchangeType.TOPIC]
)
@pytest.mark.parametrize("x_match", ["bogus", 1, None])
def test_check_binding_arguments_ignores_x_match_on_other_exchange_types(
    exchange_type: ExchangeType, x_match: Any
) -> None:
    check_binding_arguments(exchange_type, {"x-match": x_match})


# --------------------------------------------------------------------------- compiled routes
# CompiledRoutes (the trie, the headers index, the direct dict) must answer exactly what
# the reference ``route`` (one binding at a time) answers.


@settings(max_examples=1500, deadline=None)
@given(
    patterns=st.lists(st.lists(_PATTERN_WORDS, max_size=6).map(_join), max_size=12),
    key=st.lists(_KEY_WORDS, max_size=8).map(_join),
)
def test_topic_trie_agrees_with_topic_matches(patterns: list[str], key: str) -> None:
    expected = [i for i, pattern in enumerate(patterns) if topic_matches(pattern, key)]
    assert TopicTrie(patterns).match(key) == expected


@pytest.mark.parametrize(
    ("pattern", "key"),
    [
        ("#", ""),
        ("#.#", ""),
        ("", ""),
        ("*", ""),
        ("a.#.#.b", "a.b"),
        ("a.", "a."),
        ("*.*", "."),
        ("#.*.#", "."),
    ],
)
def test_topic_trie_empty_words_and_empty_key(pattern: str, key: str) -> None:
    assert TopicTrie([pattern]).match(key) == ([0] if topic_matches(pattern, key) else [])


@pytest.mark.parametrize(("pattern", "key", "expected"), _PATHOLOGICAL_TOPIC_CASES)
def test_topic_trie_pathological_patterns_are_not_exponential(
    pattern: str, key: str, expected: bool
) -> None:
    """Counted, not timed: each (node, words consumed) state is expanded once and pushes at
    most four successors, so a walk takes at most 1 + 4 x nodes x (words + 1) steps; one
    that backtracks through the runs of wildcards exceeds that budget and is stopped."""
    trie = TopicTrie([pattern, "#.x", "*"])
    words = len(key.split(".")) if key else 0
    budget = 1 + 4 * trie.size() * (words + 1)
    found, steps = trie.walk(key, budget)
    assert (0 in found) is expected
    assert steps <= budget


def test_topic_trie_walk_budget_stops_a_walk() -> None:
    trie = TopicTrie(["#.a.#.b"])
    _found, steps = trie.walk("a.a.a.c")
    assert steps > 3
    with pytest.raises(WalkBudgetExceeded):
        trie.walk("a.a.a.c", steps - 1)
    assert trie.walk("a.a.a.c", steps) == (set(), steps)
    assert trie.size() == 5


_HEADER_VALUES = st.sampled_from([1, 1.0, 2, True, False, "1", "a", None, [1], {"k": 1}, 0.5])
_HEADER_KEYS = st.sampled_from(["a", "b", "x-c"])
_X_MATCH_ARG = st.sampled_from([None, "all", "any", "all-with-x", "any-with-x", "bogus", 1])


def _arguments(x_match: Any, pairs: dict[str, Any]) -> dict[str, Any]:
    return pairs if x_match is None else {"x-match": x_match, **pairs}


@settings(max_examples=1500, deadline=None)
@given(
    bindings=st.lists(
        st.tuples(_X_MATCH_ARG, st.dictionaries(_HEADER_KEYS, _HEADER_VALUES, max_size=3)),
        max_size=10,
    ),
    headers=st.dictionaries(_HEADER_KEYS, _HEADER_VALUES, max_size=3),
)
def test_headers_index_agrees_with_headers_match(
    bindings: list[tuple[Any, dict[str, Any]]], headers: dict[str, Any]
) -> None:
    arguments = [_arguments(x_match, pairs) for x_match, pairs in bindings]
    expected = [i for i, args in enumerate(arguments) if headers_match(args, headers)]
    assert HeadersIndex(arguments).match(headers) == expected


@settings(max_examples=500, deadline=None)
@given(
    exchange_type=st.sampled_from(list(ExchangeType)),
    bindings=st.lists(
        st.tuples(
            st.sampled_from(["q1", "q2", "q3"]),
            st.lists(_PATTERN_WORDS, max_size=4).map(_join),
            st.dictionaries(_HEADER_KEYS, _HEADER_VALUES, max_size=2),
        ),
        max_size=8,
    ),
    key=st.lists(_KEY_WORDS, max_size=5).map(_join),
    headers=st.dictionaries(_HEADER_KEYS, _HEADER_VALUES, max_size=2),
)
def test_compiled_routes_agree_with_route(
    exchange_type: ExchangeType,
    bindings: list[tuple[str, str, dict[str, Any]]],
    key: str,
    headers: dict[str, Any],
) -> None:
    rules = [rule(queue, pattern, arguments) for queue, pattern, arguments in bindings]
    compiled = CompiledRoutes(exchange_type, rules)
    assert compiled(key, headers) == route(exchange_type, rules, key, headers)
    assert compiled.by_key_only is (exchange_type is not ExchangeType.HEADERS)


def test_compiled_topic_routes_many_bindings_in_time_independent_of_their_number() -> None:
    rules = [rule(f"q{i}", f"k{i}.*.*.#") for i in range(100_000)] + [rule("hit", "k7.x")]
    compiled = CompiledRoutes(ExchangeType.TOPIC, rules)
    started = time.thread_time()
    for _ in range(1000):
        assert compiled("k7.x", {}) == ["hit"]
    assert time.thread_time() - started < 1.0


def test_compiled_headers_index_tests_only_candidates() -> None:
    rules = [rule(f"q{i}", "", {"id": i, "kind": "x"}) for i in range(10_000)]
    rules.append(rule("every", "", {}))
    rules.append(rule("any", "", {"x-match": "any", "id": 5, "other": "y"}))
    compiled = CompiledRoutes(ExchangeType.HEADERS, rules)
    started = time.thread_time()
    for _ in range(1000):
        assert compiled("", {"id": 5.0, "kind": "x"}) == ["q5", "every", "any"]
    assert time.thread_time() - started < 1.0
    assert compiled("", {"id": True, "kind": "x"}) == ["every"]
