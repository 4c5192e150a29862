"""Diagnosis (contract §19): "why is this queue stuck?" and the database's side.

Gathers the facts (app/storage/diagnosis.py) in one transaction, so that every time is on
one database clock, and asks the rules of app/domain/diagnosis.py for the findings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from app.auth.permissions import Access, require, require_admin
from app.domain.diagnosis import (
    Consumer,
    DatabaseFacts,
    Finding,
    Head,
    InFlight,
    QueueFacts,
    blocked_by,
    database_findings,
    queue_findings,
)
from app.domain.model import User
from app.errors import NotFound
from app.storage import diagnosis as store
from app.storage.database import Database


@dataclass(frozen=True, slots=True)
class QueueDiagnosis:
    queue: str
    checked_at: datetime
    head: Head | None
    oldest_in_flight: InFlight | None
    consumers: list[Consumer]
    findings: list[Finding]


class Diagnosis:
    def __init__(self, db: Database, default_ack_timeout_seconds: int) -> None:
        self.db = db
        self.default_ack_timeout = default_ack_timeout_seconds

    async def queue(self, actor: User, name: str) -> QueueDiagnosis:
        """Needs read on the queue; 404 when it does not exist."""
        require(actor, Access.READ, name, "queue")
        async with self.db.transaction() as conn:
            row = await store.queue_row(conn, name)
            if row is None:
                raise NotFound(f"queue '{name}' not found")
            facts = await self._facts(conn, name, row)
        by, group = blocked_by(facts)
        head = facts.head and replace(facts.head, blocked_by=by, blocking_group=group)
        facts = replace(facts, head=head)
        return QueueDiagnosis(
            queue=name,
            checked_at=facts.now,
            head=head,
            oldest_in_flight=facts.oldest_in_flight,
            consumers=list(facts.consumers),
            findings=queue_findings(facts),
        )

    async def _facts(self, conn: Any, name: str, row: Any) -> QueueFacts:
        queue_id, raw_args, ack_seconds, created_at, unsubscribed_at, now, dlq, dlq_id = row
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        groups = args.get("x-message-groups") is True
        single_active = args.get("x-single-active-consumer") is True
        max_length = _int_or_none(args.get("x-max-length"))
        max_bytes = _int_or_none(args.get("x-max-length-bytes"))
        head = await store.head(conn, queue_id)
        counted, counted_exact = (
            await store.ready_count(conn, queue_id, max_length)
            if max_length is not None
            else (0, True)
        )
        size, size_exact = (
            await store.ready_bytes(conn, queue_id) if max_bytes is not None else (0, True)
        )
        group_blocked = bool(
            groups
            and head is not None
            and head.group_id is not None
            and await store.group_in_flight(conn, queue_id, head.group_id)
        )
        return QueueFacts(
            queue=name,
            now=now,
            created_at=created_at,
            unsubscribed_at=unsubscribed_at,
            ack_timeout=store.ack_timeout(ack_seconds, self.default_ack_timeout),
            groups=groups,
            single_active=single_active,
            head=head,
            head_group_in_flight=group_blocked,
            oldest_in_flight=await store.oldest_in_flight(conn, queue_id),
            consumers=await store.consumers(conn, queue_id, single_active),
            poison=await store.poison(conn, queue_id),
            max_length=max_length,
            max_length_bytes=max_bytes,
            ready_counted=counted,
            ready_bytes=size,
            ready_estimated=not (counted_exact and size_exact),
            dead_letter_target=dlq,
            dead_lettered_recently=(
                await store.dead_letters(conn, dlq_id, source=name, own=name)
                if dlq_id is not None
                else 0
            ),
            dead_letters_received=await store.dead_letters(conn, queue_id, source=None, own=name),
        )

    async def database(self, actor: User) -> DatabaseFacts:
        """The database's side (admin only)."""
        require_admin(actor)
        async with self.db.transaction() as conn:
            facts = DatabaseFacts(
                now=await store.now(conn),
                bloat=await store.bloat(conn),
                xmin=await store.xmin_holders(conn),
                processes=await store.processes(conn),
                notify_queue_usage=await store.notify_queue_usage(conn),
            )
        return replace(facts, findings=database_findings(facts))


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
