"""Diagnosis (contract §19): the response models, built from app/domain/diagnosis.py."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.domain import diagnosis as d


class FindingOut(BaseModel):
    code: str = Field(description="What was found; docs/operations.md has a runbook per code")
    severity: Literal["info", "warning", "critical"]
    message: str = Field(description="What it means and what to do")

    @classmethod
    def of(cls, f: d.Finding) -> FindingOut:
        return cls(code=f.code, severity=f.severity.value, message=f.message)


def _ms(a: datetime, b: datetime) -> int:
    return max(0, int((a - b).total_seconds() * 1000))


class HeadOut(BaseModel):
    id: int
    message_id: str
    status: Literal["ready", "delayed"]
    age_ms: int = Field(description="Since it was published")
    available_at: datetime
    delivery_count: int
    group_id: str | None
    blocked_by: (
        Literal["delay", "group", "single_active_consumer", "no_subscriber_with_credit"] | None
    ) = Field(description="Why it is not delivered now; null: nothing holds it back")
    blocking_group: str | None = Field(
        None, description='With blocked_by "group": the group whose copy in flight holds it'
    )

    @classmethod
    def of(cls, h: d.Head, now: datetime) -> HeadOut:
        return cls(
            id=h.id,
            message_id=h.message_id,
            status="delayed" if h.available_at > now else "ready",
            age_ms=_ms(now, h.created_at),
            available_at=h.available_at,
            delivery_count=h.delivery_count,
            group_id=h.group_id,
            blocked_by=h.blocked_by,
            blocking_group=h.blocking_group,
        )


class HolderOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    connection_id: str | None = Field(description="null for a pull delivery")
    username: str | None
    process: str | None
    kind: Literal["websocket", "pull"]


class InFlightOut(BaseModel):
    id: int
    message_id: str
    delivered_at: datetime
    expires_at: datetime = Field(description="When its ack timeout releases it")
    delivery_count: int
    holder: HolderOut

    @classmethod
    def of(cls, m: d.InFlight) -> InFlightOut:
        return cls(
            id=m.id,
            message_id=m.message_id,
            delivered_at=m.delivered_at,
            expires_at=m.expires_at,
            delivery_count=m.delivery_count,
            holder=HolderOut.model_validate(m.holder),
        )


class ConsumerOut(BaseModel):
    connection_id: str
    username: str | None
    process: str
    prefetch: int
    unacked: int
    active: bool
    since: datetime
    last_ack_at: datetime | None = Field(
        description="Its last ACK, NACK or REJECT on this queue (reported every 2 s)"
    )

    # read from the domain's Consumer, whose fields it names
    model_config = ConfigDict(from_attributes=True)


class QueueDiagnosisOut(BaseModel):
    queue: str
    checked_at: datetime
    head: HeadOut | None
    oldest_in_flight: InFlightOut | None
    consumers: list[ConsumerOut]
    findings: list[FindingOut] = Field(description="Most severe first")


class BloatOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    live_tuples: int
    dead_tuples: int
    last_autovacuum: datetime | None
    last_vacuum: datetime | None


class XminHolderOut(BaseModel):
    kind: Literal["transaction", "replication_slot"]
    pid: int | None
    application_name: str | None
    state: str | None
    age_ms: int | None = Field(description="Since its transaction began (null for a slot)")
    slot_name: str | None = None
    xmin_age: int | None = Field(None, description="A slot's age in transactions")

    @classmethod
    def of(cls, x: d.XminHolder) -> XminHolderOut:
        return cls(
            kind=x.kind,
            pid=x.pid,
            application_name=x.application_name,
            state=x.state,
            age_ms=None if x.age is None else int(x.age.total_seconds() * 1000),
            slot_name=x.slot_name,
            xmin_age=x.xmin_age,
        )


class ProcessOut(BaseModel):
    id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_ms: int
    listening: bool = Field(description="Its LISTEN connection is up")
    pool_in_use: int | None = Field(description="At its last heartbeat, in its fullest pool")
    pool_size: int | None

    @classmethod
    def of(cls, p: d.ProcessFacts, now: datetime) -> ProcessOut:
        return cls(
            id=p.id,
            hostname=p.hostname,
            pid=p.pid,
            started_at=p.started_at,
            heartbeat_at=p.heartbeat_at,
            heartbeat_age_ms=_ms(now, p.heartbeat_at),
            listening=p.listening,
            pool_in_use=p.pool_in_use,
            pool_size=p.pool_size,
        )


class DatabaseDiagnosisOut(BaseModel):
    checked_at: datetime
    bloat: BloatOut | None = Field(description="The messages table")
    xmin_held: list[XminHolderOut] = Field(
        description="The oldest open transactions on the broker's database, and the "
        "replication slots, that hold back cleanup; oldest first"
    )
    processes: list[ProcessOut]
    notify_queue_usage: float = Field(description="pg_notification_queue_usage(), 0 … 1")
    findings: list[FindingOut] = Field(description="Most severe first")

    @classmethod
    def of(cls, f: d.DatabaseFacts) -> DatabaseDiagnosisOut:
        b = f.bloat
        return cls(
            checked_at=f.now,
            bloat=None if b is None else BloatOut.model_validate(b),
            xmin_held=[XminHolderOut.of(x) for x in f.xmin],
            processes=[ProcessOut.of(p, f.now) for p in f.processes],
            notify_queue_usage=f.notify_queue_usage,
            findings=[FindingOut.of(x) for x in f.findings],
        )
