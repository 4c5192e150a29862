"""Idempotent publish (contract §15): which copies of a publish group are duplicates, and
the sweep of the window's bookkeeping.

Only copies bound for a queue declared with ``x-deduplication-window-seconds`` come here
(``QueueArguments.deduplicated``, read once per queue by ``broker.limits``); a publish to
plain queues never does. In the publish's one transaction (broker/publisher.py), after the
length-limited queues are locked and before anything is inserted, ``claim`` decides per
copy:

- a (queue, message_id) repeated inside the group (one batch, or two calls that share a
  group write) is a duplicate of its first occurrence, which alone is claimed;
- the first occurrence claims its row (storage/dedup.py): claimed, the copy is stored
  unless the length rule rejects it (its claim is then released); not claimed, a copy with
  that message_id was published into the queue within the window, and this one is a
  duplicate.

The claim waits for a concurrent claim of the same row to commit or roll back (the primary
key serialises them), on whichever broker process or SQL session it runs: exactly one of
two simultaneous publishes is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.model import OutgoingMessage
from app.metrics import Metrics
from app.storage import dedup as store
from app.storage.database import Database
from app.storage.limits import QueueInfo

#: rows deleted per sweep statement (each its own short transaction)
SWEEP_BATCH = 1000
#: sweep statements per sweep at most; the rest waits for the next one
SWEEP_ROUNDS = 50

Key = tuple[int, str]


@dataclass(slots=True)
class Claims:
    """What ``claim`` decided for a publish group's copies (indexes into its copies)."""

    #: copies not to store: their message_id was published into their queue within its
    #: window, or earlier in the group
    duplicates: set[int] = field(default_factory=set)
    #: copies whose row this transaction claimed, with its key
    claimed: dict[int, Key] = field(default_factory=dict)


def first_occurrences(
    messages: Sequence[tuple[str, OutgoingMessage]],
    copies: Sequence[tuple[int, int]],
    infos: Mapping[int, QueueInfo],
) -> tuple[dict[Key, int], set[int]]:
    """The copies bound for deduplicated queues: each distinct (queue id, message_id) with
    the index of its first copy, and the indexes of the copies that repeat one."""
    first: dict[Key, int] = {}
    repeats: set[int] = set()
    for index, (message, queue_id) in enumerate(copies):
        info = infos.get(queue_id)
        if info is None or not info.arguments.deduplicated:
            continue
        key = (queue_id, messages[message][1].message_id)
        if key in first:
            repeats.add(index)
        else:
            first[key] = index
    return first, repeats


class Dedup:
    def __init__(self, db: Database, metrics: Metrics) -> None:
        self.db = db
        self.metrics = metrics

    async def claim(
        self,
        conn: Any,
        messages: Sequence[tuple[str, OutgoingMessage]],
        copies: Sequence[tuple[int, int]],
        infos: Mapping[int, QueueInfo],
    ) -> Claims:
        """In ``conn``'s transaction: claim the message_ids of the copies bound for
        deduplicated queues; the rest of the copies are not looked at."""
        first, repeats = first_occurrences(messages, copies, infos)
        if not first:
            return Claims()
        keys = list(first)
        refused = await store.claim(conn, keys)
        result = Claims(duplicates=repeats)
        for position, key in enumerate(keys):
            if position in refused:
                result.duplicates.add(first[key])
            else:
                result.claimed[first[key]] = key
        return result

    async def release(self, conn: Any, claims: Claims, copies: set[int]) -> None:
        """Undo the claims of ``copies`` (not stored after all: the length rule rejected
        them), so that a later publish of their message_id is stored."""
        keys = [claims.claimed[i] for i in sorted(copies) if i in claims.claimed]
        await store.release(conn, keys)

    def count(self, duplicates: int) -> None:
        if duplicates:
            self.metrics.duplicates.inc(duplicates)

    async def sweep(self) -> int:
        """Delete rows older than their queue's window (contract §15: the bookkeeping does
        not grow without bound), in bounded batches; every process sweeps, SKIP LOCKED
        shares the rows out. Idle, it is one index probe per queue that has rows."""
        total = 0
        for _ in range(SWEEP_ROUNDS):
            done = await store.sweep(self.db.hot, SWEEP_BATCH)
            total += done
            if done < SWEEP_BATCH:
                break
        return total
