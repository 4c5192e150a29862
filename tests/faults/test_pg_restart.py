"""PostgreSQL restarted (immediate and fast) under load, on a server the test owns.

While it is down, requests fail fast with 503 (nothing hangs); nothing acknowledged is lost;
afterwards the broker recovers by itself (no restart): /readyz, publishes and WebSocket push
all come back.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.faults.checker import Ledger, Report, check
from tests.faults.harness import (
    ADMIN,
    TwinSampler,
    brokers,
    drain,
    join_all,
    queue_pair,
    remaining_rows,
    steady_load,
)
from tests.faults.pg import OwnPostgres, migrate
from tests.support import wait_for

#: bound on any answer while the database is down: connect timeout (2 s) + pool timeout (2 s)
#: + slack for a 2-core machine
FAIL_FAST_SECONDS = 6.0
_dbs = itertools.count()


def probe_outage(api: httpx.Client, seconds: float) -> list[tuple[str, int, float]]:
    """Requests of every kind while the database is down: (what, status, seconds)."""
    probes: list[tuple[str, Callable[[], httpx.Response]]] = [
        ("publish", lambda: api.post("/queues/pg/messages", json={"body": "probe"})),
        ("list", lambda: api.get("/queues")),
        ("get", lambda: api.post("/queues/pg/get", json={})),
        ("readyz", lambda: api.get("/../../readyz")),
    ]
    results = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for what, call in probes:
            started = time.monotonic()
            try:
                status = call().status_code
            except httpx.TransportError:
                status = 0
            results.append((what, status, time.monotonic() - started))
    return results


def run_restart(
    own_pg: OwnPostgres, logs: Path, mode: str, down_seconds: float, load: int
) -> Report:
    url = own_pg.database(f"restart_{mode}_{next(_dbs)}")
    migrate(url)
    with brokers(url, logs, 1, ACK_TIMEOUT_SECONDS=3, ACK_TIMEOUT_CHECK_INTERVAL_MS=200) as (a,):
        with a.client() as api:
            specs = queue_pair(api, "pg", max_delivery_count=10)
        names = [s.name for s in specs]
        ledger, stop = Ledger(), threading.Event()
        consumers, pubs = steady_load(ledger, a, names, stop, count=load, seconds=60, pace=0.002)
        sampler = TwinSampler(ledger, url, names, stop)
        sampler.start()
        wait_for(lambda: sum(d.outcome == "acked" for d in ledger.deliveries) >= 30, 20)

        own_pg.stop_server(mode)
        with httpx.Client(base_url=a.api, auth=ADMIN, timeout=30) as api:
            outage = probe_outage(api, down_seconds)
        restarted_at = time.monotonic()
        own_pg.start_server()

        with httpx.Client(base_url=a.base_url, timeout=10) as ops:
            wait_for(lambda: ops.get("/readyz").status_code == 200, 20, interval=0.1)
        ready_after = time.monotonic() - restarted_at

        # push resumes: a message published now reaches a connected consumer
        def delivered_after_restart() -> bool:
            return any(
                d.at > restarted_at and d.outcome == "acked" for d in list(ledger.deliveries)
            )

        wait_for(delivered_after_restart, 20, message="a delivery after the restart")
        push_after = time.monotonic() - restarted_at
        stop.set()
        join_all([*pubs, *consumers, sampler], 30)
        drain(ledger, a.ws_url, url, specs, timeout=30)
        report = check(ledger, specs, remaining_rows(url, names))
        assert a.alive()

    slowest = max(s for _, _, s in outage)
    statuses = {(what, status) for what, status, _ in outage}
    publish_seconds = [p.seconds or 0 for p in ledger.publishes.values()]
    print(
        f"PostgreSQL {mode} restart: {len(outage)} requests while down, slowest "
        f"{slowest:.2f} s, statuses {sorted(statuses)}; /readyz 200 {ready_after:.2f} s and "
        f"push {push_after:.2f} s after the start; slowest publish {max(publish_seconds):.2f} s; "
        f"{report.summary()}"
    )
    assert report.clean, report.summary()
    # fail fast with 503, never a hang, never another status
    assert {status for _, status, _ in outage} == {503}, statuses
    assert slowest < FAIL_FAST_SECONDS
    assert max(publish_seconds) < FAIL_FAST_SECONDS
    assert all(p.status == 503 for p in ledger.publishes.values() if p.outcome == "failed")
    # no transport error (a hang, a reset): an in-doubt commit the broker could not settle
    # while the database was down is an honest 503 that says "it may have been" (unknown)
    assert all(p.status == 503 for p in ledger.publishes.values() if p.outcome == "unknown")
    assert ledger.count("failed") > 0  # the outage really hit the publishers
    return report


@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_postgres_restart_under_load(own_pg: OwnPostgres, logs: Path, mode: str) -> None:
    run_restart(own_pg, logs, mode, down_seconds=1.5, load=2000)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_postgres_long_outage_under_load(own_pg: OwnPostgres, logs: Path, mode: str) -> None:
    run_restart(own_pg, logs, mode, down_seconds=10, load=20000)
