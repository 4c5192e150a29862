"""The network between the broker and PostgreSQL black-holed under load (issue 23, item 4).

The broker's DATABASE_URL points at a proxy (proxy.py), so every connection — the pools, the
LISTEN connection, the in-doubt settle — goes through it. The proxy then drops everything
silently (no FIN, no RST) for a while and heals. Asserted: publishes answer 503 within the
configured timeouts and never hang, WebSockets stay open, nothing acknowledged is lost, the
publishes left in doubt are settled after healing by publishing again with the same
message_id (docs/reliability.md), and push resumes by itself within seconds.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.faults.checker import Ledger, Report, check
from tests.faults.harness import (
    ADMIN,
    brokers,
    drain,
    join_all,
    queue_pair,
    remaining_rows,
    rest_latency,
    steady_load,
)
from tests.faults.proxy import Blackhole
from tests.support import wait_for

#: the broker's database timeouts in this scenario (its defaults are 5 s, 5 s and 30 s)
CONNECT_TIMEOUT = 2.0
POOL_TIMEOUT = 2.0
STATEMENT_TIMEOUT_MS = 1500
#: the longest any publish may take: a statement that never gets its answer gives up at the
#: statement timeout + COMMAND_MARGIN (app/storage/database.py), then the in-doubt settle asks
#: for at most 5 s (IN_DOUBT_SECONDS); + slack for a shared 2-core machine
COMMAND_MARGIN = 2.0
PUBLISH_BOUND = STATEMENT_TIMEOUT_MS / 1000 + COMMAND_MARGIN + 5.0 + 3.0


def _log_times(text: str, pattern: str) -> list[float]:
    """Wall-clock times (epoch seconds) of the log lines matching ``pattern``."""
    times = []
    for line in text.splitlines():
        if re.search(pattern, line):
            stamp = re.match(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,]\d+)", line)
            if stamp:
                times.append(datetime.fromisoformat(stamp.group(1).replace(",", ".")).timestamp())
    return times


def _retry_in_doubt(ledger: Ledger, api: httpx.Client) -> int:
    """Publish again, with the same message_id, every publish whose outcome is unknown (no
    answer, or a 503 that says it may have been stored), as docs/reliability.md tells a
    publisher to do; returns how many were retried."""
    with ledger.lock:
        in_doubt = [p for p in ledger.publishes.values() if p.outcome == "unknown"]
    for pub in in_doubt:
        body = {"body": {"mid": pub.message_id}, "properties": {"message_id": pub.message_id}}
        r = api.post(f"/queues/{pub.queue}/messages", json=body)
        assert r.status_code == 200, r.text
        ledger.republished(pub)
    return len(in_doubt)


def run_blackhole(database_url: str, logs: Path, hole_seconds: float, load: int) -> Report:
    with (
        Blackhole.in_front_of(database_url) as hole,
        brokers(
            hole.url_for(database_url),
            logs,
            1,
            ACK_TIMEOUT_SECONDS=5,
            ACK_TIMEOUT_CHECK_INTERVAL_MS=200,
            MESSAGEX_DB_CONNECT_TIMEOUT_SECONDS=CONNECT_TIMEOUT,
            MESSAGEX_DB_POOL_TIMEOUT_SECONDS=POOL_TIMEOUT,
            MESSAGEX_DB_STATEMENT_TIMEOUT_MS=STATEMENT_TIMEOUT_MS,
            MESSAGEX_WS_PING_INTERVAL_SECONDS=2,
            MESSAGEX_WS_PING_TIMEOUT_SECONDS=2,
        ) as (a,),
    ):
        with a.client() as api:
            specs = queue_pair(api, "bh", max_delivery_count=10)
        names = [s.name for s in specs]
        ledger, stop = Ledger(), threading.Event()
        consumers, pubs = steady_load(
            ledger, a, names, stop, publishers=3, count=load, seconds=120, pace=0.005, timeout=60
        )
        wait_for(lambda: sum(d.outcome == "acked" for d in ledger.deliveries) >= 30, 20)
        connections_before = [c.connections for c in consumers]

        hole.drop()
        dropped_wall = time.time()
        # /readyz and a REST read (the SQLAlchemy engine's path) during the hole
        probes: list[tuple[str, int, float]] = []
        with a.client(timeout=60) as probe:
            while time.monotonic() - (hole.dropped_at or 0) < hole_seconds:
                for path in ("/../../readyz", "/queues"):
                    status, seconds = rest_latency(probe, path, timeout=60)
                    probes.append((path, status, seconds))
        hole.heal()
        healed = hole.healed_at or 0.0
        dropped = hole.dropped_at or 0.0

        # push resumes by itself: a publish confirmed after the heal reaches a consumer
        def pushed_after_heal() -> float | None:
            with ledger.lock:
                ok_after = {
                    p.message_id
                    for p in ledger.publishes.values()
                    if p.outcome == "ok" and p.invoked_at > healed
                }
                for d in ledger.deliveries:
                    if d.message_id in ok_after:
                        return d.at
            return None

        push_at = wait_for(pushed_after_heal, 30, message="a delivery published after the heal")
        with a.client() as ops:
            wait_for(lambda: ops.get("/../../readyz").status_code == 200, 30, interval=0.1)
        ready_after = time.monotonic() - healed
        time.sleep(0.001)
        stop.set()
        join_all([*pubs, *consumers], 60)
        with httpx.Client(base_url=a.api, auth=ADMIN, timeout=30) as api:
            retried = _retry_in_doubt(ledger, api)
        drain(ledger, a.ws_url, database_url, specs, timeout=30)
        report = check(ledger, specs, remaining_rows(database_url, names))
        log = a.log_text()
        assert a.alive()

    during = [
        p
        for p in ledger.publishes.values()
        if p.invoked_at < healed and p.invoked_at + (p.seconds or 0) > dropped
    ]
    slowest = max((p.seconds or 0) for p in during)
    outcomes: dict[str, int] = {}
    for p in during:
        key = f"{p.outcome}:{p.status}:{p.code}"
        outcomes[key] = outcomes.get(key, 0) + 1
    refused = sorted(p.seconds or 0 for p in during if p.status == 503)
    listen_lost = [t - dropped_wall for t in _log_times(log, "LISTEN connection lost")]
    unavailable = [t - dropped_wall for t in _log_times(log, "database unavailable")]
    heartbeat = [t - dropped_wall for t in _log_times(log, "periodic task heartbeat failed")]
    print(
        f"black hole {hole_seconds:.0f} s: {len(during)} publishes met it, slowest "
        f"{slowest:.2f} s (bound {PUBLISH_BOUND:.1f} s), outcomes {outcomes}, 503s answered "
        f"in {refused[0] if refused else -1:.2f} to {refused[-1] if refused else -1:.2f} s; "
        f"first 503 after {min(unavailable, default=-1):.2f} s; LISTEN lost after "
        f"{min(listen_lost, default=-1):.2f} s; heartbeat failed after "
        f"{min(heartbeat, default=-1):.2f} s; push {push_at - healed:.2f} s and /readyz "
        f"{ready_after:.2f} s after the heal; {retried} in doubt published again; "
        f"consumer reconnects {[c.connections for c in consumers]} (before "
        f"{connections_before}); {report.summary()}"
    )
    print(
        f"  probes during the hole: {len(probes)}, statuses "
        f"{sorted({(p, st) for p, st, _ in probes})}, slowest {max(x for *_, x in probes):.2f} s"
    )
    assert report.clean, report.summary()
    assert {st for _, st, _ in probes} == {503}
    assert max(x for *_, x in probes) < PUBLISH_BOUND
    # never a hang: every publish that met the black hole was answered within the bound
    assert slowest < PUBLISH_BOUND, slowest
    assert not [p for p in during if p.outcome == "unknown" and p.status is None]
    assert all(p.status == 503 for p in during if p.outcome in ("failed", "unknown"))
    assert sum(p.status == 503 for p in during) > 0  # the hole really hit publishers
    # the WebSockets stayed open all along (no consumer had to reconnect)
    assert [c.connections for c in consumers] == connections_before
    return report


@pytest.mark.timeout(120)
def test_blackhole_under_load(module_db: str, logs: Path) -> None:
    run_blackhole(module_db, logs, hole_seconds=10, load=5000)


@pytest.mark.slow
def test_long_blackhole_under_load(module_db: str, logs: Path) -> None:
    run_blackhole(module_db, logs, hole_seconds=30, load=20000)
