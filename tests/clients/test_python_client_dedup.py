"""Idempotent publish (contract §15) through messagex_client: ``declare_queue`` takes the
window, ``PublishResult.duplicates`` names the queue that already had the message_id, and a
publish repeated after a lost reply stores one copy."""

from __future__ import annotations

import httpx
import pytest
from messagex_client import Client
from messagex_client.errors import BrokerError

from tests.clients.test_python_client import mx, rest, stats

__all__ = ["mx", "rest"]  # the fixtures of the client's tests


async def test_a_window_from_declare_queue_and_duplicates_in_the_result(
    mx: Client, rest: httpx.AsyncClient
) -> None:
    made = await mx.topology.declare_queue("py-dedup", dedup_window_seconds=60)
    assert made["arguments"] == {"x-deduplication-window-seconds": 60}
    first = await mx.publish(None, {"order": 1}, queue="py-dedup", message_id="order-1")
    assert (first.queues, first.duplicates) == (["py-dedup"], [])
    again = await mx.publish(None, {"order": 1}, queue="py-dedup", message_id="order-1")
    assert (again.routed, again.queues, again.duplicates) == (True, [], ["py-dedup"])
    assert (await stats(rest, "py-dedup"))["ready"] == 1
    with pytest.raises(BrokerError, match="x-deduplication-window-seconds") as bad:
        await mx.topology.declare_queue("py-dedup-bad", dedup_window_seconds=86_401)
    assert bad.value.code == "validation_error"
    assert (await rest.get("/queues/py-dedup-bad")).status_code == 404
