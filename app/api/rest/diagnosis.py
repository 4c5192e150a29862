"""REST: diagnosis (contract §19) — a queue's, and the database's side (admin)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ServicesDep, UserDep
from app.api.problems import problem_responses
from app.api.schemas.diagnosis import (
    ConsumerOut,
    DatabaseDiagnosisOut,
    FindingOut,
    HeadOut,
    InFlightOut,
    QueueDiagnosisOut,
)
from app.api.schemas.topology import PathName

router = APIRouter()


@router.get(
    "/queues/{name}/diagnosis",
    name="diagnose_queue",
    tags=["queues"],
    summary="Why is this queue stuck?",
    description=(
        "The head (the next copy a claim would take, or the oldest waiting one) and what "
        "blocks it, the oldest delivery in flight and its holder, the subscriptions, and "
        "findings (most severe first), each saying what to do: `no_consumers`, "
        "`consumer_stalled`, `poison_message`, `group_blocked`, `length_limit_reached`, "
        "`dead_letters_growing`, `expiring`. Needs read permission on the queue."
    ),
    response_model=QueueDiagnosisOut,
    status_code=200,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def diagnose_queue(name: PathName, services: ServicesDep, user: UserDep) -> QueueDiagnosisOut:
    found = await services.diagnosis.queue(user, name)
    now = found.checked_at
    return QueueDiagnosisOut(
        queue=found.queue,
        checked_at=now,
        head=None if found.head is None else HeadOut.of(found.head, now),
        oldest_in_flight=(
            None if found.oldest_in_flight is None else InFlightOut.of(found.oldest_in_flight)
        ),
        consumers=[ConsumerOut.model_validate(c) for c in found.consumers],
        findings=[FindingOut.of(f) for f in found.findings],
    )


@router.get(
    "/diagnosis",
    name="diagnose_database",
    tags=["operations"],
    summary="The database's side of the broker's health (admin)",
    description=(
        "The messages table's live and dead tuples and last autovacuum, the oldest open "
        "transactions and replication slots holding back cleanup, each broker process's "
        "heartbeat, LISTEN connection and pool use (reported with its heartbeat), and "
        "`pg_notification_queue_usage()`, with findings: `bloat`, `xmin_held`, "
        "`process_stale`, `listen_down`, `pool_exhausted`, `notify_queue_filling`."
    ),
    response_model=DatabaseDiagnosisOut,
    status_code=200,
    responses=problem_responses(401, 403, 429, 503),
)
async def diagnose_database(services: ServicesDep, user: UserDep) -> DatabaseDiagnosisOut:
    return DatabaseDiagnosisOut.of(await services.diagnosis.database(user))
