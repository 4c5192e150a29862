"""Diagnosis (contract §19): the facts a check gathers and the findings they lead to.

Pure: storage gathers the facts (app/storage/diagnosis.py), the broker asks these rules
(app/broker/diagnosis.py). Each finding's message says what it means and what to do;
docs/operations.md has the runbook built from the same codes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from app.domain.presence import HEARTBEAT_INTERVAL, PROCESS_STALE_AFTER


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    severity: Severity
    message: str


#: ready copies with no subscriber for this long: ``no_consumers``
NO_CONSUMERS_AFTER = timedelta(seconds=30)
#: a copy delivered this many times or more: ``poison_message``
POISON_DELIVERIES = 3
#: ``dead_letters_growing`` counts the copies dead-lettered within this window
DEAD_LETTER_WINDOW = timedelta(minutes=5)
#: ``expiring``: the head has spent this share of its time to live waiting
EXPIRING_SHARE = 0.5
#: ``xmin_held``: info, warning, critical from these ages
XMIN_INFO = timedelta(seconds=10)
XMIN_WARNING = timedelta(minutes=5)
XMIN_CRITICAL = timedelta(hours=1)
#: ``process_stale``: a heartbeat older than this many intervals (then dead at
#: PROCESS_STALE_AFTER, when the other processes reap it)
STALE_HEARTBEATS = 3
#: ``notify_queue_filling``: warning and critical from these shares of the NOTIFY queue
NOTIFY_WARNING = 0.5
NOTIFY_CRITICAL = 0.9
#: ``bloat``: dead tuples of ``messages`` from which (and from which share of all tuples)
BLOAT_MIN_DEAD = 10_000
BLOAT_INFO_SHARE = 0.2
BLOAT_WARNING_SHARE = 0.5

BlockedBy = Literal["delay", "group", "single_active_consumer", "no_subscriber_with_credit"]


# -- one queue ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Holder:
    connection_id: str | None
    username: str | None
    process: str | None
    kind: Literal["websocket", "pull"]


@dataclass(frozen=True, slots=True)
class Head:
    id: int
    message_id: str
    created_at: datetime
    available_at: datetime
    delivery_count: int
    group_id: str | None
    expires_at: datetime | None
    blocked_by: BlockedBy | None = None
    #: the group whose copy in flight holds it back (blocked_by "group")
    blocking_group: str | None = None


@dataclass(frozen=True, slots=True)
class InFlight:
    id: int
    message_id: str
    delivered_at: datetime
    expires_at: datetime
    delivery_count: int
    holder: Holder


@dataclass(frozen=True, slots=True)
class Consumer:
    connection_id: str
    username: str | None
    process: str
    prefetch: int
    unacked: int
    active: bool
    since: datetime
    last_ack_at: datetime | None
    #: when its oldest unsettled delivery of the queue was made (None: it holds none)
    oldest_held_at: datetime | None

    @property
    def has_credit(self) -> bool:
        return self.active and self.unacked < self.prefetch


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """What one check of a queue read, all in one snapshot of the database clock ``now``."""

    queue: str
    now: datetime
    created_at: datetime
    #: when its last subscription ended (None: none ever did)
    unsubscribed_at: datetime | None
    ack_timeout: timedelta
    groups: bool
    single_active: bool
    head: Head | None
    #: copies of the head's group in flight in this queue (only for a group queue's head)
    head_group_in_flight: bool
    oldest_in_flight: InFlight | None
    consumers: Sequence[Consumer]
    #: copies delivered POISON_DELIVERIES times or more among those looked at: (id, count)
    poison: Sequence[tuple[int, int]]
    max_length: int | None
    max_length_bytes: int | None
    #: ready copies (up to max_length), and their body bytes (when max_length_bytes is set)
    ready_counted: int
    ready_bytes: int
    #: where this queue dead-letters to, and how many of its copies arrived there recently
    dead_letter_target: str | None
    dead_lettered_recently: int
    #: copies that arrived recently in this queue by dead-lettering (it is a DLQ)
    dead_letters_received: int
    #: ready_counted / ready_bytes are estimates (a limit too large to count within budget)
    ready_estimated: bool = False


def blocked_by(f: QueueFacts) -> tuple[BlockedBy | None, str | None]:
    """Why the head is not being delivered now, and the blocking group when it is one."""
    head = f.head
    if head is None:
        return None, None
    if head.available_at > f.now:
        return "delay", None
    if f.groups and head.group_id is not None and f.head_group_in_flight:
        return "group", head.group_id
    if not any(c.has_credit for c in f.consumers):
        if f.single_active and f.consumers and not any(c.active for c in f.consumers):
            # subscribers wait for the hand-over: the previous holder's deliveries are unsettled
            return "single_active_consumer", None
        return "no_subscriber_with_credit", None
    return None, None


def _ms(delta: timedelta) -> int:
    return int(delta.total_seconds() * 1000)


def stalled(c: Consumer, now: datetime, ack_timeout: timedelta) -> bool:
    """Holds its full prefetch and settled nothing for half the ack timeout: neither since
    its last settlement nor since its oldest delivery was made."""
    if c.unacked < c.prefetch or c.oldest_held_at is None:
        return False
    last = max(t for t in (c.last_ack_at, c.oldest_held_at) if t is not None)
    return now - last >= ack_timeout / 2


def queue_findings(f: QueueFacts) -> list[Finding]:
    out: list[Finding] = []
    out += _consumer_findings(f)
    out += _head_findings(f)
    out += _message_findings(f)
    order = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(out, key=lambda x: order[x.severity])


def _consumer_findings(f: QueueFacts) -> list[Finding]:
    out: list[Finding] = []
    idle_since = max(t for t in (f.created_at, f.unsubscribed_at) if t is not None)
    due = f.head is not None and f.head.available_at <= f.now
    if due and not f.consumers and f.now - idle_since >= NO_CONSUMERS_AFTER:
        out.append(
            Finding(
                "no_consumers",
                Severity.WARNING,
                f"Ready messages wait and no WebSocket subscriber has been on this queue for "
                f"{int((f.now - idle_since).total_seconds())} s. Start a consumer (or check "
                "why yours cannot connect: its logs, its credentials, its read permission); "
                "pull consumers do not count as subscribers.",
            )
        )
    for c in f.consumers:
        if stalled(c, f.now, f.ack_timeout):
            out.append(
                Finding(
                    "consumer_stalled",
                    Severity.WARNING,
                    f"Connection {c.connection_id} (user {c.username}) holds its full prefetch "
                    f"({c.unacked}/{c.prefetch}) and settled nothing for at least half the ack "
                    f"timeout ({int(f.ack_timeout.total_seconds())} s). Its deliveries return "
                    "to the queue when the ack timeout expires; check the consumer for a hang "
                    "or a slow dependency, or close its connection (DELETE /connections/"
                    f"{c.connection_id}) to release them now.",
                )
            )
    return out


def _head_findings(f: QueueFacts) -> list[Finding]:
    out: list[Finding] = []
    head = f.head
    if head is not None and head.blocked_by == "group":
        out.append(
            Finding(
                "group_blocked",
                Severity.WARNING,
                f"The head of the queue belongs to group '{head.blocking_group}', and a copy "
                "of that group is in flight: the group waits until it is acknowledged, "
                "rejected, or its ack timeout expires. Look at oldest_in_flight for its "
                "holder; a consumer that never settles blocks its group until then.",
            )
        )
    if head is not None and head.expires_at is not None and head.available_at <= f.now:
        ttl = head.expires_at - head.available_at
        waited = f.now - head.available_at
        if ttl.total_seconds() <= 0 or waited >= ttl * EXPIRING_SHARE:
            out.append(
                Finding(
                    "expiring",
                    Severity.WARNING,
                    f"The oldest ready copy has waited {_ms(waited)} ms of its {_ms(ttl)} ms "
                    "time to live: copies expire unconsumed (dead-lettered with reason "
                    "'expired' if the queue has a dead-letter target, else dropped). Add "
                    "consumers or prefetch, or raise x-message-ttl / the messages' expiration.",
                )
            )
    return out


def _message_findings(f: QueueFacts) -> list[Finding]:
    out: list[Finding] = []
    if f.poison:
        listed = ", ".join(f"id {i} ({n} deliveries)" for i, n in f.poison[:5])
        out.append(
            Finding(
                "poison_message",
                Severity.WARNING,
                f"Copies delivered {POISON_DELIVERIES} or more times: {listed}. Consumers keep "
                "failing on them. Inspect them (GET /queues/{name}/messages/{id}), fix the "
                "consumer or delete them; set max_delivery_count with a dead-letter queue so "
                "that such copies leave by themselves.",
            )
        )
    # an estimate counts as at the limit within 5 % of it (the limit holds exactly)
    near = 0.95 if f.ready_estimated else 1.0
    full_count = f.max_length is not None and f.ready_counted >= f.max_length * near
    full_bytes = f.max_length_bytes is not None and f.ready_bytes >= f.max_length_bytes * near
    if full_count or full_bytes:
        limit = (
            f"x-max-length {f.max_length}"
            if full_count
            else f"x-max-length-bytes {f.max_length_bytes}"
        )
        about = " (by the planner's estimate of its size)" if f.ready_estimated else ""
        out.append(
            Finding(
                "length_limit_reached",
                Severity.WARNING,
                f"The queue is at its {limit}{about}: each new publish drops the oldest "
                "ready copy or is rejected, as x-overflow says. Consume faster (more "
                "consumers, more prefetch) or raise the limit (a new queue: arguments cannot "
                "change).",
            )
        )
    minutes = int(DEAD_LETTER_WINDOW.total_seconds() // 60)
    if f.dead_lettered_recently:
        out.append(
            Finding(
                "dead_letters_growing",
                Severity.WARNING,
                f"{f.dead_lettered_recently} copies of this queue were dead-lettered into "
                f"'{f.dead_letter_target}' in the last {minutes} minutes. Look at their "
                "x-death reason (POST /queues/{dlq}/messages/query with death_reason), fix "
                "the cause, then redrive them (messages/move with to: null).",
            )
        )
    if f.dead_letters_received:
        out.append(
            Finding(
                "dead_letters_growing",
                Severity.WARNING,
                f"{f.dead_letters_received} dead-lettered copies arrived in this queue in the "
                f"last {minutes} minutes. Query them by death_reason to learn why their "
                "queue refused them, fix the cause, then redrive (messages/move, to: null).",
            )
        )
    return out


# -- the database ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bloat:
    live_tuples: int
    dead_tuples: int
    last_autovacuum: datetime | None
    last_vacuum: datetime | None


@dataclass(frozen=True, slots=True)
class XminHolder:
    """The oldest open transaction on the database, or a replication slot, holding cleanup."""

    kind: Literal["transaction", "replication_slot"]
    pid: int | None
    application_name: str | None
    state: str | None
    age: timedelta | None
    slot_name: str | None = None
    #: transactions since its xmin (slots: their only age)
    xmin_age: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    listen_pid: int | None
    #: the LISTEN backend named in the last heartbeat still exists
    listening: bool
    pool_in_use: int | None
    pool_size: int | None
    #: it does not LISTEN by choice: its database URL is transaction-pooled and it has no
    #: direct one (MESSAGEX_LISTEN_DATABASE_URL); it polls, and says so in ``/readyz``
    polling: bool = False


@dataclass(frozen=True, slots=True)
class DatabaseFacts:
    now: datetime
    bloat: Bloat | None
    xmin: Sequence[XminHolder]
    processes: Sequence[ProcessFacts]
    notify_queue_usage: float
    findings: list[Finding] = field(default_factory=list)


def _xmin_severity(age: timedelta) -> Severity | None:
    if age >= XMIN_CRITICAL:
        return Severity.CRITICAL
    if age >= XMIN_WARNING:
        return Severity.WARNING
    if age >= XMIN_INFO:
        return Severity.INFO
    return None


def stale_after() -> timedelta:
    return HEARTBEAT_INTERVAL * STALE_HEARTBEATS


def database_findings(f: DatabaseFacts) -> list[Finding]:
    out: list[Finding] = []
    out += _bloat_findings(f.bloat)
    out += _xmin_findings(f.xmin)
    out += _process_findings(f.now, f.processes)
    usage = f.notify_queue_usage
    if usage >= NOTIFY_WARNING:
        out.append(
            Finding(
                "notify_queue_filling",
                Severity.CRITICAL if usage >= NOTIFY_CRITICAL else Severity.WARNING,
                f"PostgreSQL's NOTIFY queue is {usage:.0%} full: a session that LISTENs but "
                "does not read (or a long transaction in a listening session) holds it. When "
                "it is full, every NOTIFY — every commit that wakes consumers — fails. Find "
                "the session (pg_stat_activity, state 'idle in transaction') and end it.",
            )
        )
    order = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(out, key=lambda x: order[x.severity])


def _bloat_findings(b: Bloat | None) -> list[Finding]:
    if b is None or b.dead_tuples < BLOAT_MIN_DEAD:
        return []
    share = b.dead_tuples / max(1, b.dead_tuples + b.live_tuples)
    if share < BLOAT_INFO_SHARE:
        return []
    severity = Severity.WARNING if share >= BLOAT_WARNING_SHARE else Severity.INFO
    vacuumed = b.last_autovacuum.isoformat() if b.last_autovacuum else "never"
    return [
        Finding(
            "bloat",
            severity,
            f"The messages table has {b.dead_tuples} dead tuples ({share:.0%} of its rows); "
            f"last autovacuum: {vacuumed}. Claims slow down as they step over dead rows. "
            "Check xmin_held first (an old transaction stops vacuum from removing them), "
            "then autovacuum's settings for the table, or run VACUUM messages.",
        )
    ]


def _xmin_findings(holders: Sequence[XminHolder]) -> list[Finding]:
    out: list[Finding] = []
    for h in holders:
        if h.kind == "replication_slot":
            out.append(
                Finding(
                    "xmin_held",
                    Severity.WARNING,
                    f"Replication slot '{h.slot_name}' ({h.state}) holds back cleanup by "
                    f"{h.xmin_age} transactions. If its consumer is gone, drop the slot "
                    "(pg_drop_replication_slot); otherwise let it catch up.",
                )
            )
            continue
        severity = _xmin_severity(h.age) if h.age is not None else None
        if severity is None or h.age is None:
            continue
        out.append(
            Finding(
                "xmin_held",
                severity,
                f"Backend pid {h.pid} (application '{h.application_name or ''}', state "
                f"{h.state}) has held a snapshot open for {int(h.age.total_seconds())} s: "
                "vacuum cannot remove dead rows newer than it, so the messages table bloats. "
                f"End its transaction, or SELECT pg_terminate_backend({h.pid}).",
            )
        )
    return out


def _process_findings(now: datetime, processes: Sequence[ProcessFacts]) -> list[Finding]:
    out: list[Finding] = []
    for p in processes:
        silent = now - p.heartbeat_at
        if silent >= stale_after():
            dead = silent >= PROCESS_STALE_AFTER
            out.append(
                Finding(
                    "process_stale",
                    Severity.CRITICAL if dead else Severity.WARNING,
                    f"Broker process {p.id} (pid {p.pid} on {p.hostname}) last wrote its "
                    f"heartbeat {int(silent.total_seconds())} s ago. It is paused, overloaded "
                    "or dead; after "
                    f"{int(PROCESS_STALE_AFTER.total_seconds())} s the other processes release "
                    "what its connections held. Check the process (is it running? its logs, "
                    "its CPU) and restart it.",
                )
            )
            continue
        if not p.listening and not p.polling:
            out.append(
                Finding(
                    "listen_down",
                    Severity.WARNING,
                    f"Broker process {p.id} (pid {p.pid} on {p.hostname}) has no LISTEN "
                    "connection: publishes on other processes reach its consumers only by its "
                    "slow poll. It reconnects by itself; if this persists, check the "
                    "database's connection limit and the network, and the process's logs.",
                )
            )
        if p.pool_size and p.pool_in_use is not None and p.pool_in_use >= p.pool_size:
            out.append(
                Finding(
                    "pool_exhausted",
                    Severity.WARNING,
                    f"Broker process {p.id} had all {p.pool_size} connections of a pool in "
                    "use at its last heartbeat: requests wait for a connection and may fail "
                    "with 503. Look for slow statements (pg_stat_activity) or raise "
                    "MESSAGEX_DB_POOL_SIZE.",
                )
            )
    return out
