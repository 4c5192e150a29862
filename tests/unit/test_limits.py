"""The length rule's arithmetic (app/domain/limits.py) and the claim priority of a copy."""

from __future__ import annotations

import pytest

from app.broker.limits import priority_of
from app.domain.arguments import QueueArguments
from app.domain.limits import admits, over
from app.domain.model import OutgoingMessage

LENGTH = QueueArguments(max_length=2)
BYTES = QueueArguments(max_length_bytes=10)
BOTH = QueueArguments(max_length=2, max_length_bytes=10)


@pytest.mark.parametrize(
    ("arguments", "ready", "ready_bytes", "size", "expected"),
    [
        (LENGTH, 1, 0, 1_000, True),
        (LENGTH, 2, 0, 0, False),
        (BYTES, 5, 6, 4, True),
        (BYTES, 5, 6, 5, False),
        (BYTES, 0, 0, 11, False),
        (BOTH, 1, 9, 1, True),
        (BOTH, 1, 9, 2, False),
        (BOTH, 2, 0, 0, False),
        (QueueArguments(max_length=0), 0, 0, 0, False),
        (QueueArguments(), 10**9, 10**12, 10**6, True),
    ],
)
def test_admits(
    arguments: QueueArguments, ready: int, ready_bytes: int, size: int, expected: bool
) -> None:
    assert admits(arguments, ready, ready_bytes, size) is expected


def test_over_counts_copies_and_bytes_above_the_limits() -> None:
    assert over(LENGTH, 5, 100) == (3, 0)
    assert over(BYTES, 5, 100) == (0, 90)
    assert over(BOTH, 1, 3) == (0, 0)
    assert over(QueueArguments(), 5, 5) == (0, 0)


def _message(priority: object) -> OutgoingMessage:
    properties = {} if priority is None else {"priority": priority}
    return OutgoingMessage(body=b"1", binary=False, routing_key="k", properties=properties)


@pytest.mark.parametrize(
    ("max_priority", "priority", "expected"),
    [(None, 5, None), (None, None, None), (9, None, 0), (9, 3, 3), (9, 200, 9), (9, 0, 0)],
)
def test_a_copy_stores_the_priority_its_queue_claims_by(
    max_priority: int | None, priority: int | None, expected: int | None
) -> None:
    arguments = QueueArguments(max_priority=max_priority)
    assert priority_of(arguments, _message(priority)) == expected


def test_the_migration_holds_the_trimming_function_the_statement_gives() -> None:
    """Migration 0017 holds TRIMMING_FUNCTION as ``trimming_function()`` wrote it: a change
    of INSERT_TRIMMING (or of the INSERT_COPIES it is built on) fails here until a migration
    replaces the function in the database."""
    import importlib.util
    from pathlib import Path

    from app.storage import limits

    path = Path(__file__).parents[2] / "alembic/versions/0017_insert_trimming_function.py"
    spec = importlib.util.spec_from_file_location("migration_0017", path)
    assert spec is not None
    assert spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    assert limits.trimming_function() == migration.FUNCTION
    assert migration.FUNCTION.startswith(f"CREATE FUNCTION {migration.SIGNATURE} RETURNS")
