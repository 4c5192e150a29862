"""A publish stores every copy of every message, or nothing (contract §7), against real
PostgreSQL: failures midway, a queue deleted mid-publish, and the 500 a client then sees."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from app.broker.publisher import Publisher
from app.domain.model import OutgoingMessage, Permissions, Role, User
from app.errors import InternalError, MessageTooLarge, NotFound, Unroutable
from app.metrics import Metrics
from app.storage import messages as store
from app.storage.database import Database
from app.storage.dsn import asyncpg_dsn
from tests.support import ADMIN_PASSWORD, ADMIN_USER, async_wait_for, client
from tests.support import running_server as running_server_
from tests.support import test_settings as settings_for

ADMIN = User("root", Role.ADMIN, Permissions(".*", ".*", ".*"))

# Raises on the insert of one queue's copy, after other copies of the same statement may
# already have been written: the failure lands midway through the publish.
BOOM = """
CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.queue_id = (SELECT id FROM queues WHERE name = 'q2')
       AND convert_from(NEW.body, 'UTF8') LIKE '%boom%' THEN
        RAISE EXCEPTION 'boom: secret internals';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER boom BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION boom();
"""

TOPOLOGY = """
INSERT INTO exchanges (name, type) VALUES ('fan', 'fanout');
INSERT INTO queues (name) VALUES ('q1'), ('q2'), ('q3');
INSERT INTO bindings (exchange_id, queue_id)
    SELECT e.id, q.id FROM exchanges e, queues q WHERE e.name = 'fan' ORDER BY q.id;
"""


async def execute(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        if args:
            return list(await conn.fetch(sql, *args))
        await conn.execute(sql)
        return []
    finally:
        await conn.close()


async def count(url: str) -> int:
    return int((await execute(url, "SELECT count(*) FROM messages WHERE $1", True))[0][0])


def message(body: bytes = b'"ok"', **extra: Any) -> OutgoingMessage:
    return OutgoingMessage(body=body, binary=False, **extra)


@pytest.fixture
async def topology(database_url: str) -> str:
    await execute(database_url, TOPOLOGY)
    return database_url


def publisher_for(db: Database) -> tuple[Publisher, Metrics, list[set[int]]]:
    metrics = Metrics()
    publisher = Publisher(db, metrics, max_message_bytes=1024)
    woken: list[set[int]] = []
    publisher.add_published_listener(woken.append)
    return publisher, metrics, woken


def value(metrics: Metrics, name: str) -> float:
    got = metrics.registry.get_sample_value(name)
    return 0.0 if got is None else float(got)


async def test_a_failure_midway_through_a_multi_queue_publish_stores_nothing(
    db: Database, topology: str
) -> None:
    await execute(topology, BOOM)
    publisher, metrics, woken = publisher_for(db)
    with pytest.raises(InternalError):
        await publisher.publish(ADMIN, "fan", [message(b'"boom"')])
    assert await count(topology) == 0
    # a batch whose second message fails on its second copy: the first message's copies
    # and the second's first copy were written by the same statement, and are gone too
    with pytest.raises(InternalError):
        await publisher.publish(ADMIN, "fan", [message(), message(b'"boom"'), message()])
    assert await count(topology) == 0
    assert woken == []
    assert value(metrics, "messagex_messages_published_total") == 0
    assert value(metrics, "messagex_message_copies_stored_total") == 0
    # the same publisher and pool keep working afterwards
    results = await publisher.publish(ADMIN, "fan", [message(), message()])
    assert [r.queues for r in results] == [["q1", "q2", "q3"]] * 2
    assert await count(topology) == 6
    queue_ids = {row[0] for row in await execute(topology, "SELECT id FROM queues WHERE $1", True)}
    assert woken == [queue_ids]
    assert value(metrics, "messagex_messages_published_total") == 2
    assert value(metrics, "messagex_message_copies_stored_total") == 6


async def test_unroutable_mandatory_or_oversize_item_stores_nothing(
    db: Database, topology: str
) -> None:
    await execute(topology, "INSERT INTO exchanges (name, type) VALUES ('dx', 'direct')")
    await execute(
        topology,
        "INSERT INTO bindings (exchange_id, queue_id, routing_key) SELECT e.id, q.id, 'k' "
        "FROM exchanges e, queues q WHERE e.name = 'dx' AND q.name = 'q1'",
    )
    publisher, _metrics, woken = publisher_for(db)
    with pytest.raises(Unroutable):
        await publisher.publish(
            ADMIN, "dx", [message(routing_key="k"), message(routing_key="x", mandatory=True)]
        )
    oversize = message(b"x" * 1025)
    with pytest.raises(MessageTooLarge):
        await publisher.publish(ADMIN, "fan", [message(), oversize])
    with pytest.raises(MessageTooLarge):
        await publisher.publish_to_queue(ADMIN, "q1", [oversize])
    assert await count(topology) == 0
    assert woken == []


async def test_a_queue_deleted_mid_publish_is_routed_around(db: Database, topology: str) -> None:
    """The publish reads the bindings, then its insert waits on a queue delete in progress;
    when the delete commits the insert fails, and the publish is retried on fresh bindings."""
    publisher, _metrics, woken = publisher_for(db)
    deleter = await asyncpg.connect(asyncpg_dsn(topology))
    try:
        tx = deleter.transaction()
        await tx.start()
        await deleter.execute("DELETE FROM queues WHERE name = 'q2'")  # uncommitted: row locked
        task = asyncio.create_task(publisher.publish(ADMIN, "fan", [message()]))

        async def insert_is_waiting() -> bool:
            rows = await execute(
                topology,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() "
                "AND query LIKE '%INSERT INTO messages%' AND $1",
                True,
            )
            return bool(rows[0][0])

        await async_wait_for(insert_is_waiting, timeout=10, message="the insert to block")
        await tx.commit()
        (result,) = await asyncio.wait_for(task, timeout=10)
    finally:
        await deleter.close()
    assert result.queues == ["q1", "q3"]
    rows = await execute(
        topology,
        "SELECT q.name FROM messages m JOIN queues q ON q.id = m.queue_id WHERE $1 ORDER BY 1",
        True,
    )
    assert [row[0] for row in rows] == ["q1", "q3"]
    assert len(woken) == 1


async def test_direct_publish_to_a_queue_deleted_mid_publish_is_404(
    db: Database, topology: str
) -> None:
    publisher, _metrics, woken = publisher_for(db)
    deleter = await asyncpg.connect(asyncpg_dsn(topology))
    try:
        tx = deleter.transaction()
        await tx.start()
        await deleter.execute("DELETE FROM queues WHERE name = 'q3'")
        task = asyncio.create_task(publisher.publish_to_queue(ADMIN, "q3", [message()]))

        async def insert_is_waiting() -> bool:
            rows = await execute(
                topology,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() "
                "AND query LIKE '%INSERT INTO messages%' AND $1",
                True,
            )
            return bool(rows[0][0])

        await async_wait_for(insert_is_waiting, timeout=10, message="the insert to block")
        await tx.commit()
        with pytest.raises(NotFound):
            await asyncio.wait_for(task, timeout=10)
    finally:
        await deleter.close()
    assert await count(topology) == 0
    assert woken == []


async def test_insert_into_a_missing_queue_is_queue_deleted(db: Database) -> None:
    with pytest.raises(store.QueueDeleted):
        await store.insert_copies(
            db.hot, [("x", message(message_id="m"))], [(0, 999_999)], str(uuid.uuid4())
        )


async def test_a_listener_that_fails_does_not_fail_the_publish(db: Database, topology: str) -> None:
    publisher, _metrics, woken = publisher_for(db)

    def broken(_queue_ids: set[int]) -> None:
        raise RuntimeError("listener bug")

    publisher.add_published_listener(broken)
    publisher.add_published_listener(woken.append)
    (result,) = await publisher.publish(ADMIN, "fan", [message()])
    assert result.routed
    assert len(woken) == 2  # the one before the broken listener and the one after


def test_the_api_answers_a_failure_midway_with_a_bare_500(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    asyncio.run(execute(database_url, TOPOLOGY))
    asyncio.run(execute(database_url, BOOM))
    with (
        running_server_(settings_for(database_url)) as server,
        client(server.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as admin,
    ):
        for path, payload in (
            ("/exchanges/fan/publish", {"body": "boom"}),
            ("/exchanges/fan/publish-batch", {"messages": [{"body": 1}, {"body": "boom"}]}),
            ("/queues/q2/messages", {"body": "boom"}),
        ):
            r = admin.post(path, json=payload)
            assert r.status_code == 500, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            problem = r.json()
            assert problem["code"] == "internal_error"
            assert set(problem) == {"type", "title", "status", "detail", "code"}
            for secret in ("boom", "secret", "INSERT", "messages", "Traceback", "plpgsql"):
                assert secret not in r.text
        assert asyncio.run(count(database_url)) == 0
        # logged, by SQLSTATE: no SQL text, no message data, no trace
        assert "P0001" in caplog.text
        for secret in ("secret", "INSERT", "boom", "Traceback"):
            assert secret not in caplog.text
        ok = admin.post("/exchanges/fan/publish", json={"body": "fine"})
        assert ok.status_code == 200
        assert ok.json()["queues"] == ["q1", "q2", "q3"]


async def test_a_remembered_queue_id_that_went_stale_is_looked_up_again(
    db: Database, topology: str
) -> None:
    """Direct publishes remember queue ids; a queue deleted (and declared again, with a new
    id) behind the publisher's back costs one retry, never a misdirected or lost message."""
    publisher, _metrics, _woken = publisher_for(db)
    await publisher.publish_to_queue(ADMIN, "q1", [message()])  # remembers q1's id
    await execute(topology, "DELETE FROM queues WHERE name = 'q1'")
    await execute(topology, "INSERT INTO queues (name) VALUES ('q1')")
    results = await publisher.publish_to_queue(ADMIN, "q1", [message(b'"again"')])
    assert results[0].queues == ["q1"]
    rows = await execute(
        topology,
        "SELECT convert_from(m.body, 'UTF8') FROM messages m JOIN queues q ON q.id = m.queue_id "
        "WHERE q.name = $1",
        "q1",
    )
    assert [r[0] for r in rows] == ['"again"']
    await execute(topology, "DELETE FROM queues WHERE name = 'q1'")
    with pytest.raises(NotFound):
        await publisher.publish_to_queue(ADMIN, "q1", [message()])
    assert await count(topology) == 0
