"""The direct hand-off's rule, in the publish statement itself (storage.messages,
INSERT_COPIES_HANDING_OFF), against real PostgreSQL: offered copies of a queue go in flight
to their owners only when no due ready message of that queue waits, all or none per queue;
what is handed off is a delivery like a claimed one, and settles like one."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import asyncpg

from app.domain.model import OutgoingMessage
from app.storage import deliveries
from app.storage import messages as store
from app.storage.database import Database
from tests.integration.test_publish_atomicity import ADMIN, execute, message, publisher_for

PROCESS = str(uuid.uuid4())
OWNER = str(uuid.uuid4())
OTHER = str(uuid.uuid4())


async def queues(url: str, *names: str) -> list[int]:
    rows = await execute(
        url, "INSERT INTO queues (name) SELECT unnest($1::text[]) RETURNING id", list(names)
    )
    return [int(r[0]) for r in rows]


async def rows(url: str) -> list[asyncpg.Record]:
    return await execute(
        url,
        "SELECT id, queue_id, status, delivery_count, delivery_tag, owner_connection::text,"
        " owner_process::text, lease_expires_at - delivered_at AS lease, message_id"
        " FROM messages WHERE $1 ORDER BY id",
        True,
    )


def batch(n: int, **extra: Any) -> list[tuple[str, OutgoingMessage]]:
    return [("", message(message_id=f"m{i}", properties={}, **extra)) for i in range(n)]


async def insert(
    db: Database,
    msgs: list[tuple[str, OutgoingMessage]],
    copies: list[tuple[int, int]],
    owners: list[tuple[str, float] | None],
) -> list[store.HandedOff]:
    target = store.HandOffTo(PROCESS, owners)
    return await store.insert_copies(db.hot, msgs, copies, str(uuid.uuid4()), handoff=target)


async def test_offered_copies_of_an_idle_queue_are_stored_in_flight_to_their_owners(
    db: Database, database_url: str
) -> None:
    (q,) = await queues(database_url, "idle")
    handed = await insert(
        db, batch(3), [(0, q), (1, q), (2, q)], [(OWNER, 30.0), (OTHER, 7.0), None]
    )
    stored = await rows(database_url)
    assert [h.copy for h in handed] == [0, 1]
    assert [h.id for h in handed] == [r["id"] for r in stored[:2]]
    assert [r["message_id"] for r in stored] == ["m0", "m1", "m2"]  # ids in copy order
    first, second, third = stored
    assert (first["status"], first["delivery_count"], first["owner_connection"]) == (
        "in_flight",
        1,
        OWNER,
    )
    assert first["owner_process"] == PROCESS
    assert first["lease"] == timedelta(seconds=30)
    assert (second["owner_connection"], second["lease"]) == (OTHER, timedelta(seconds=7))
    for h, r in zip(handed, stored, strict=False):
        assert h.delivery_tag == r["delivery_tag"]
        assert re.fullmatch(rf"{r['id']}\.[0-9a-f]{{32}}", h.delivery_tag)
    assert (third["status"], third["delivery_count"], third["delivery_tag"]) == ("ready", 0, None)
    # settled like any claimed delivery: by (id, tag, owner), and only so
    acked = await deliveries.ack_many(
        db.hot, [(first["id"], handed[0].delivery_tag, OTHER), (first["id"], "x", OWNER)]
    )
    assert acked == {}
    acked = await deliveries.ack_many(db.hot, [(first["id"], handed[0].delivery_tag, OWNER)])
    assert acked == {(handed[0].delivery_tag, OWNER): q}


async def test_a_due_ready_message_is_never_overtaken(db: Database, database_url: str) -> None:
    waiting, idle = await queues(database_url, "waiting", "idle")
    await store.insert_copies(db.hot, batch(1), [(0, waiting)], str(uuid.uuid4()))
    before = await rows(database_url)
    # a fanout: copies of each message to both queues, interleaved
    copies = [(0, waiting), (0, idle), (1, waiting), (1, idle)]
    handed = await insert(db, batch(2), copies, [(OWNER, 30.0)] * 4)
    assert [h.copy for h in handed] == [1, 3]  # the idle queue's copies only
    after = [r for r in await rows(database_url) if r["id"] > before[-1]["id"]]
    assert [(r["queue_id"], r["status"]) for r in after] == [
        (waiting, "ready"),
        (idle, "in_flight"),
        (waiting, "ready"),
        (idle, "in_flight"),
    ]
    assert [h.id for h in handed] == [after[1]["id"], after[3]["id"]]


async def test_a_delayed_message_not_yet_due_does_not_hold_the_queue(
    db: Database, database_url: str
) -> None:
    (q,) = await queues(database_url, "delayed")
    await store.insert_copies(db.hot, batch(1, delay_ms=60_000), [(0, q)], str(uuid.uuid4()))
    handed = await insert(db, batch(1), [(0, q)], [(OWNER, 30.0)])
    assert [h.copy for h in handed] == [0]
    statuses = [r["status"] for r in await rows(database_url)]
    assert statuses == ["ready", "in_flight"]


async def test_nothing_offered_stores_every_copy_ready(db: Database, database_url: str) -> None:
    (q,) = await queues(database_url, "none")
    assert await insert(db, batch(2), [(0, q), (1, q)], [None, None]) == []
    assert [r["status"] for r in await rows(database_url)] == ["ready", "ready"]


class _BrokenHandOff:
    """A reservation whose hand-out fails after the commit (a bug, say)."""

    process_id = PROCESS

    def __init__(self) -> None:
        self.closed = False

    def owners(self, copies: object, eligible: object) -> list[tuple[str, float] | None]:
        return [(OWNER, 30.0)]

    def deliver(self, handed: object, build: object) -> set[int]:
        raise RuntimeError("hand-out bug")

    def close(self) -> None:
        self.closed = True


async def test_a_failed_hand_out_still_answers_the_stored_publish(
    db: Database, database_url: str
) -> None:
    (q,) = await queues(database_url, "broken")
    broken = _BrokenHandOff()

    async def reserve(wanted: object) -> _BrokenHandOff:
        return broken

    publisher, _metrics, woken = publisher_for(db)
    publisher.set_reserve(reserve)  # type: ignore[arg-type]
    results = await publisher.publish_to_queue(ADMIN, "broken", [message()])
    assert [r.routed for r in results] == [True]
    assert [r["status"] for r in await rows(database_url)] == ["in_flight"]
    assert broken.closed
    assert woken == [{q}]  # woken as for any publish
