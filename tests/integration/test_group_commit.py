"""Group commit: concurrent publish calls share one INSERT, each still answered on its own."""

from __future__ import annotations

import asyncio

from app.broker.publisher import Publisher
from app.errors import NotFound, Unroutable
from app.metrics import Metrics
from app.storage.database import Database
from tests.integration.test_publish_atomicity import (
    ADMIN,
    BOOM,
    count,
    execute,
    message,
    topology,  # noqa: F401 - fixture
)


def _value(metrics: Metrics, name: str) -> float:
    return float(metrics.registry.get_sample_value(name) or 0.0)


async def test_concurrent_publishes_share_group_writes(db: Database, topology: str) -> None:  # noqa: F811
    metrics = Metrics()
    publisher = Publisher(db, metrics, max_message_bytes=1024)
    try:
        calls = [publisher.publish(ADMIN, "fan", [message(message_id=f"m{i}")]) for i in range(60)]
        results = await asyncio.gather(*calls)
    finally:
        await publisher.close()
    assert [r[0].message_id for r in results] == [f"m{i}" for i in range(60)]
    assert all(r[0].queues == ["q1", "q2", "q3"] for r in results)
    assert await count(topology) == 180
    groups = _value(metrics, "messagex_publish_group_writes_total")
    assert 1 <= groups < 60  # calls that arrived together were written together


async def test_a_bad_call_in_a_group_fails_alone(db: Database, topology: str) -> None:  # noqa: F811
    await execute(topology, BOOM)
    publisher = Publisher(db, Metrics(), max_message_bytes=1024)
    try:
        outcomes = await asyncio.gather(
            publisher.publish(ADMIN, "fan", [message(message_id="a")]),
            publisher.publish(ADMIN, "missing", [message()]),
            publisher.publish(ADMIN, "fan", [message(b'"boom"')]),
            publisher.publish_to_queue(ADMIN, "q1", [message(message_id="b")]),
            publisher.publish_to_queue(ADMIN, "nope", [message()]),
            publisher.publish(ADMIN, "fan", [message(message_id="c", routing_key="x")]),
            return_exceptions=True,
        )
    finally:
        await publisher.close()
    ok_a, missing, boom, ok_b, nope, ok_c = outcomes
    assert isinstance(missing, NotFound)
    assert isinstance(nope, NotFound)
    assert not isinstance(boom, list)  # the trigger failed that call only
    assert [r.message_id for r in ok_a] == ["a"]  # type: ignore[union-attr]
    assert [r.message_id for r in ok_b] == ["b"]  # type: ignore[union-attr]
    assert [r.message_id for r in ok_c] == ["c"]  # type: ignore[union-attr]
    rows = await execute(topology, "SELECT message_id FROM messages WHERE $1 ORDER BY id", True)
    assert sorted(r[0] for r in rows) == ["a", "a", "a", "b", "c", "c", "c"]


async def test_mandatory_unroutable_in_a_group_stores_nothing_of_that_call(
    db: Database,
    topology: str,  # noqa: F811
) -> None:
    await execute(topology, "DELETE FROM bindings")
    publisher = Publisher(db, Metrics(), max_message_bytes=1024)
    try:
        unroutable, fine = await asyncio.gather(
            publisher.publish(ADMIN, "fan", [message(mandatory=True)]),
            publisher.publish_to_queue(ADMIN, "q2", [message(message_id="d")]),
            return_exceptions=True,
        )
    finally:
        await publisher.close()
    assert isinstance(unroutable, Unroutable)
    assert [r.message_id for r in fine] == ["d"]  # type: ignore[union-attr]
    assert await count(topology) == 1
