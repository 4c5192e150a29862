"""The Celery app of ``python -m bench.celery``: the harness and its `celery worker`
subprocesses import it. BENCH_CELERY_BROKER is the broker URL, BENCH_CELERY_QUEUE the queue,
BENCH_CELERY_OUT the file each task appends ``<enqueued> <started>`` (epoch seconds) to."""

from __future__ import annotations

import os
import time
from typing import Any

import messagex_client.kombu_transport  # noqa: F401 - registers messagex://
from celery import Celery

app = Celery("mxbench", broker=os.environ.get("BENCH_CELERY_BROKER", "memory://"))
app.conf.update(
    task_default_queue=os.environ.get("BENCH_CELERY_QUEUE", "celery"),
    task_acks_late=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=int(os.environ.get("BENCH_CELERY_PREFETCH", "10")),
    worker_hijack_root_logger=False,
)

_out: Any = None


@app.task
def stamp(enqueued: float) -> None:
    """Appends when it was sent and when it started (one line, flushed)."""
    global _out  # noqa: PLW0603 - one open file per worker process
    started = time.time()
    if _out is None:
        _out = open(os.environ["BENCH_CELERY_OUT"], "a", buffering=1)  # noqa: SIM115
    _out.write(f"{enqueued} {started}\n")
