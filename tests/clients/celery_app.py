"""The Celery app of tests/clients/test_celery.py: the test process and the `celery worker`
subprocess both import it. Configured from the environment (set by the test before import):
MX_CELERY_BROKER (a messagex:// URL), MX_CELERY_RESULTS (a directory: the file:// result
backend, which needs no server; the tasks also leave marker files there)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import messagex_client.kombu_transport  # noqa: F401 - registers messagex://
from celery import Celery

RESULTS = Path(os.environ.get("MX_CELERY_RESULTS", "/tmp/mx-celery-results"))

app = Celery(
    "mxtest",
    broker=os.environ.get("MX_CELERY_BROKER", "messagex://guest:guest@127.0.0.1:8000/"),
    backend=f"file://{RESULTS}",
)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"ack_timeout_seconds": 30},
    result_chord_join_timeout=20,
    worker_lost_wait=1.0,  # how long prefork waits before declaring a killed child lost (10)
)


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
def total(values: list[int]) -> int:
    return sum(values)


@app.task
def started_at() -> float:
    """When the worker ran it (the countdown test compares with when it was sent)."""
    return time.time()


@app.task(bind=True, max_retries=3)
def flaky(self: Any, key: str) -> int:
    """Fails (retries with countdown=1) the first time it runs for ``key``."""
    marker = RESULTS / f"flaky-{key}"
    if not marker.exists():
        marker.write_text("failed once")
        raise self.retry(countdown=1)
    return int(self.request.retries)


@app.task
def slow(key: str, seconds: float) -> str:
    """Records each start (with the worker's pid), then works for ``seconds``."""
    with (RESULTS / f"slow-{key}").open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return f"done by {os.getpid()}"
