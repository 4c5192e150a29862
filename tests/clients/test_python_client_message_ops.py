"""Contract §17 through the Python client: query, dry run, move, redrive and delete by filter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from messagex_client import Client, DeleteResult, MoveResult, NotFound, message_filter

from tests.clients.test_python_client import mx, queue, rest

__all__ = ["mx", "rest"]  # fixtures


async def test_query_move_redrive_and_delete(mx: Client, rest: httpx.AsyncClient) -> None:
    dlq = await queue(rest, "ops-dlq")
    work = await queue(rest, "ops-work", dead_letter_queue=dlq)
    other = await queue(rest, "ops-other")
    for n in range(4):
        await mx.publish(queue=work, body=n, headers={"tenant": "acme" if n % 2 else "zeta"})
    r = await rest.post(f"/queues/{work}/get", json={"max_messages": 4})
    for m in r.json()["messages"]:
        await rest.post(f"/deliveries/{m['delivery_tag']}/nack", json={"requeue": False})
    top = mx.topology
    acme = message_filter(
        headers={"tenant": "acme"},
        death_reason="rejected",
        status=["ready"],
        published_after=datetime.now(UTC) - timedelta(hours=1),
    )
    items, cursor = await top.query_messages(dlq, acme)
    assert [i["body"] for i in items] == [1, 3]
    assert cursor is None
    items, cursor = await top.query_messages(dlq, limit=1)
    assert cursor == items[0]["id"]
    assert await top.move_messages(dlq, acme, to=None, dry_run=True) == MoveResult(2, 0, 0)
    assert await top.move_messages(dlq, acme, to=None) == MoveResult(2, 2, 0)
    assert [i["body"] for i in (await top.query_messages(work))[0]] == [1, 3]
    assert await top.move_messages(dlq, to=other, limit=1) == MoveResult(2, 1, 0)
    assert await top.delete_messages(dlq, dry_run=True) == DeleteResult(1, 0)
    assert await top.delete_messages(dlq) == DeleteResult(1, 1)
    with pytest.raises(NotFound):
        await top.move_messages(work, to="ops-missing")
