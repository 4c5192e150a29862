"""kill -9 of a broker process that holds deliveries; a second process on the same database
takes over (its reaper releases the dead process's WebSocket deliveries once the dead
process's LISTEN backend has left pg_stat_activity: within 5 s of the kill, issue 25).

The ack timeout is 60 s, so a takeover within seconds can only be the reaper's work.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults.checker import Ledger, check
from tests.faults.harness import (
    Consumer,
    Publisher,
    TwinSampler,
    brokers,
    drain,
    join_all,
    queue_pair,
    remaining_rows,
    sql,
)
from tests.support import wait_for

HOLD = 20


def hold(_frame: dict[str, Any]) -> str:
    return "hold"


def run_kill9(database_url: str, logs: Path, publishes: int) -> dict[str, float]:
    with brokers(
        database_url, logs, 2, ACK_TIMEOUT_SECONDS=60, ACK_TIMEOUT_CHECK_INTERVAL_MS=200
    ) as (a, b):
        with b.client() as api:
            specs = queue_pair(api, "crash", max_delivery_count=3)
        names = [s.name for s in specs]
        ledger, stop = Ledger(), threading.Event()
        holder = Consumer(
            ledger, [a.ws_url], ["crash"], stop, prefetch=HOLD, policy=hold, reconnect=False
        )
        steady = Consumer(ledger, [b.ws_url], names, stop, prefetch=10)
        half = publishes // 2
        pubs = [
            Publisher(ledger, [a.api, b.api], "crash", stop, count=half, seconds=30),
            Publisher(ledger, [b.api, a.api], "crash", stop, count=half, seconds=30),
        ]
        sampler = TwinSampler(ledger, database_url, names, stop)
        workers = [holder, steady, *pubs, sampler]
        for w in workers:
            w.start()
        wait_for(lambda: holder.unsettled() >= HOLD, 20, message="A's consumer to hold 20")
        held = {d.message_id for d in list(holder.held.values())}

        a.kill9()
        started = time.monotonic()

        def taken_over() -> bool:
            again = {
                d.message_id
                for d in list(ledger.deliveries)
                if d.consumer == steady.name and d.redelivered
            }
            return held <= again

        wait_for(taken_over, 10, message="B to redeliver what A's consumer held")
        takeover = time.monotonic() - started
        gone = sql(database_url, "SELECT count(*) AS n FROM broker_processes WHERE pid = $1", a.pid)
        assert gone[0]["n"] == 0

        join_all(pubs, 40)
        # B goes on serving by itself: a publish after the crash is delivered
        after = Publisher(ledger, [b.api], "crash", stop, count=1)
        after.work()
        assert ledger.publishes[f"{after.prefix}-0"].outcome == "ok"
        stop.set()
        join_all([holder, steady, sampler], 20)
        drain(ledger, b.ws_url, database_url, specs)
        report = check(ledger, specs, remaining_rows(database_url, names))
        print(f"kill -9: takeover {takeover:.2f} s after the kill; {report.summary()}")
        assert report.clean, report.summary()
        # the load really ran (about half of it went to A, refused once A was dead)
        assert report.stats["published_ok"] >= publishes // 4
        for d in ledger.deliveries:
            if d.message_id in held and d.consumer == steady.name and d.redelivered:
                assert d.delivery_count == 2
        return {"takeover_seconds": takeover}


def test_kill9_of_a_broker_holding_deliveries_second_process_takes_over(
    database_url: str, logs: Path
) -> None:
    figures = run_kill9(database_url, logs, publishes=300)
    # The ack timeout is 60 s: this is the reaper (its liveness check runs every 1 s on B).
    assert figures["takeover_seconds"] < 5


@pytest.mark.slow
def test_kill9_under_heavier_load(database_url: str, logs: Path) -> None:
    figures = run_kill9(database_url, logs, publishes=3000)
    assert figures["takeover_seconds"] < 5
