"""The length rule's arithmetic (contract §13), no I/O: storage/limits.py counts and locks,
broker/limits.py decides with these."""

from __future__ import annotations

from app.domain.arguments import QueueArguments


def admits(arguments: QueueArguments, ready: int, ready_bytes: int, size: int) -> bool:
    """Whether one more ready copy of ``size`` body bytes fits a queue that holds ``ready``
    copies of ``ready_bytes`` bytes."""
    if arguments.max_length is not None and ready + 1 > arguments.max_length:
        return False
    return arguments.max_length_bytes is None or ready_bytes + size <= arguments.max_length_bytes


def over(arguments: QueueArguments, ready: int, ready_bytes: int) -> tuple[int, int]:
    """How many copies and body bytes a queue holds above its limits (0, 0 when within)."""
    copies = max(0, ready - arguments.max_length) if arguments.max_length is not None else 0
    limit = arguments.max_length_bytes
    return copies, max(0, ready_bytes - limit) if limit is not None else 0
