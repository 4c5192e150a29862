"""Queue and exchange arguments of contract §13-§14: parsed in one place (app.domain.arguments)."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.arguments import (
    MAX_TTL_MS,
    Overflow,
    QueueArguments,
    check_dead_letter_target,
    expiration_problem,
    parse_exchange_arguments,
    parse_queue_arguments,
)
from app.errors import ValidationFailed


def test_no_arguments_means_defaults() -> None:
    assert parse_queue_arguments({}) == QueueArguments()
    assert parse_queue_arguments({"x-unknown": [1], "x-queue-type": "quorum"}) == QueueArguments()


def test_every_argument_parsed() -> None:
    parsed = parse_queue_arguments(
        {
            "x-message-ttl": 0,
            "x-expires": 1000,
            "x-max-length": 0,
            "x-max-length-bytes": 10,
            "x-overflow": "reject-publish-dlx",
            "x-max-priority": 255,
            "x-single-active-consumer": True,
            "x-dead-letter-exchange": "dlx",
            "x-dead-letter-routing-key": "",
            "x-deduplication-window-seconds": 86_400,
        }
    )
    assert parsed == QueueArguments(
        message_ttl_ms=0,
        expires_ms=1000,
        max_length=0,
        max_length_bytes=10,
        overflow=Overflow.REJECT_PUBLISH_DLX,
        max_priority=255,
        single_active_consumer=True,
        dead_letter_exchange="dlx",
        dead_letter_routing_key="",
        dedup_window_seconds=86_400,
    )
    assert parsed.limited
    assert parsed.deduplicated
    assert not QueueArguments().deduplicated


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("x-message-ttl", -1),
        ("x-message-ttl", MAX_TTL_MS + 1),
        ("x-message-ttl", 1.0),
        ("x-message-ttl", "1000"),
        ("x-message-ttl", True),
        ("x-expires", 999),
        ("x-expires", 0),
        ("x-expires", None),
        ("x-max-length", -1),
        ("x-max-length", 2**63),
        ("x-max-length-bytes", -5),
        ("x-max-length-bytes", "1"),
        ("x-overflow", "drop-tail"),
        ("x-overflow", 1),
        ("x-max-priority", 0),
        ("x-max-priority", 256),
        ("x-max-priority", False),
        ("x-single-active-consumer", 1),
        ("x-single-active-consumer", "true"),
        ("x-dead-letter-exchange", ""),
        ("x-dead-letter-exchange", "bad name"),
        ("x-dead-letter-exchange", 5),
        ("x-deduplication-window-seconds", 0),
        ("x-deduplication-window-seconds", 86_401),
        ("x-deduplication-window-seconds", 1.0),
        ("x-deduplication-window-seconds", "60"),
        ("x-deduplication-window-seconds", True),
        ("x-deduplication-window-seconds", None),
    ],
)
def test_wrong_type_or_range_names_the_argument(key: str, value: Any) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_queue_arguments({key: value})
    assert key in str(caught.value)
    assert caught.value.errors[0]["loc"] == ["body", "arguments", key]


def test_wrong_combinations() -> None:
    with pytest.raises(ValidationFailed, match="x-dead-letter-routing-key"):
        parse_queue_arguments({"x-dead-letter-routing-key": "k"})
    with pytest.raises(ValidationFailed, match="x-dead-letter-routing-key"):
        parse_queue_arguments({"x-dead-letter-exchange": "e", "x-dead-letter-routing-key": 1})
    both = parse_queue_arguments({"x-dead-letter-exchange": "e"})
    with pytest.raises(ValidationFailed, match="dead_letter_queue"):
        check_dead_letter_target(both, "dlq")
    check_dead_letter_target(both, None)
    check_dead_letter_target(QueueArguments(), "dlq")


def test_priority_of_a_copy() -> None:
    assert QueueArguments().priority_of(9) == 0
    assert QueueArguments(max_priority=5).priority_of(None) == 0
    assert QueueArguments(max_priority=5).priority_of(3) == 3
    assert QueueArguments(max_priority=5).priority_of(200) == 5


def test_ttl_of_a_copy_is_the_smaller() -> None:
    assert QueueArguments().ttl_of(None) is None
    assert QueueArguments().ttl_of("250") == 250
    assert QueueArguments(message_ttl_ms=100).ttl_of(None) == 100
    assert QueueArguments(message_ttl_ms=100).ttl_of("250") == 100
    assert QueueArguments(message_ttl_ms=1000).ttl_of("0") == 0


@pytest.mark.parametrize("value", ["", "-1", "1.5", "1e3", " 1", "١٢", str(MAX_TTL_MS + 1)])
def test_malformed_expiration(value: str) -> None:
    assert expiration_problem(value) is not None


@pytest.mark.parametrize("value", ["0", "007", str(MAX_TTL_MS)])
def test_expiration(value: str) -> None:
    assert expiration_problem(value) is None


def test_exchange_arguments() -> None:
    assert parse_exchange_arguments({}).alternate_exchange is None
    assert parse_exchange_arguments({"alternate-exchange": "ae"}).alternate_exchange == "ae"
    with pytest.raises(ValidationFailed, match="alternate-exchange"):
        parse_exchange_arguments({"alternate-exchange": ["ae"]})
