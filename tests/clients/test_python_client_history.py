"""The charts' history through the Python client: overview_history and queue_history."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from messagex_client import Client, NotFound

from tests.clients.test_python_client import mx, queue, rest

__all__ = ["mx", "rest"]  # fixtures


async def test_overview_and_queue_history(mx: Client, rest: httpx.AsyncClient) -> None:
    name = await queue(rest, "history-client")
    await mx.publish(queue=name, body=1)
    await mx.publish(queue=name, body=2)
    top = mx.topology
    deadline = time.monotonic() + 15  # one sample interval (5 s) and a little
    while True:
        history = await top.queue_history(name)
        if sum(s["published"] for s in history["samples"]) == 2:
            break
        assert time.monotonic() < deadline, "the publishes were never sampled"
        await asyncio.sleep(0.2)
    assert history["interval_seconds"] == 5
    assert len(history["samples"]) == 120
    assert history["samples"][-1]["ready"] in (None, 2)
    overview = await top.overview_history()
    assert sum(s["published"] for s in overview["samples"]) >= 2
    with pytest.raises(NotFound):
        await top.queue_history("history-missing")
