"""broker.tasks.every: a periodic task that meets an unavailable database (a restart, a
failover) logs one warning line, no traceback, and goes on; any other failure keeps its
traceback."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.broker.tasks import every
from app.errors import Unavailable


async def _run(fail: BaseException, calls: int) -> int:
    done = 0

    async def task() -> None:
        nonlocal done
        done += 1
        raise fail

    runner = asyncio.create_task(every(0.001, task, "probe"))
    while done < calls:
        await asyncio.sleep(0.001)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    return done


def test_unavailable_is_a_warning_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="messagex.tasks"):
        assert asyncio.run(_run(Unavailable(), 3)) >= 3  # the loop went on
    records = [r for r in caplog.records if r.name == "messagex.tasks"]
    assert records
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in records)
    assert f"periodic task probe failed: {Unavailable().message}" in caplog.text


def test_other_failures_keep_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="messagex.tasks"):
        asyncio.run(_run(RuntimeError("bug"), 1))
    assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)
