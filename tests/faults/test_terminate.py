"""pg_terminate_backend of every broker session, and of the LISTEN sessions alone, with two
broker processes on one database: push resumes by itself, and no wake-up is lost for longer
than the 1 s poll fallback.
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx

from tests.faults.checker import Ledger, QueueSpec, check
from tests.faults.harness import (
    ADMIN,
    BrokerProc,
    Consumer,
    Publisher,
    TwinSampler,
    declare,
    drain,
    join_all,
    queue_pair,
    remaining_rows,
    sessions,
    terminate,
)
from tests.support import wait_for
from tests.wsclient import WsClient

POLL_FALLBACK = 1.0
#: the poll fallback plus a claim, a send and a loaded 2-core machine
LOST_WAKEUP_BOUND = POLL_FALLBACK + 0.6
LISTENER = "messagex-listener"


def cross_latencies(a: BrokerProc, b: BrokerProc, queue: str, n: int) -> list[float]:
    """Publish on B, receive on A (a WebSocket subscriber): seconds, per message."""
    out = []
    with WsClient.admin(a.ws_url) as ws, httpx.Client(base_url=b.api, auth=ADMIN) as api:
        ws.subscribe(queue, 10)
        for i in range(n):
            started = time.monotonic()
            r = api.post(f"/queues/{queue}/messages", json={"body": i})
            assert r.status_code == 200, r.text
            d = ws.delivery(timeout=5)
            out.append(time.monotonic() - started)
            assert d["body"] == i
            assert ws.ack(d["delivery_tag"])["type"] == "ACKED"
            time.sleep(0.05)
    return out


def listeners(url: str) -> int:
    return sum(1 for s in sessions(url) if s["application_name"] == LISTENER)


def test_terminate_every_broker_session_push_resumes(
    module_db: str, pair: list[BrokerProc]
) -> None:
    a, b = pair
    database_url = module_db
    with a.client() as api:
        specs = queue_pair(api, "term", max_delivery_count=10)
    names = [s.name for s in specs]
    ledger, stop = Ledger(), threading.Event()
    consumers = [
        Consumer(ledger, [a.ws_url], names, stop, prefetch=5),
        Consumer(ledger, [b.ws_url], names, stop, prefetch=5),
    ]
    pubs = [Publisher(ledger, [a.api, b.api], "term", stop, count=3000, seconds=60, pace=0.005)]
    sampler = TwinSampler(ledger, database_url, names, stop)
    for w in [*consumers, *pubs, sampler]:
        w.start()
    wait_for(lambda: sum(d.outcome == "acked" for d in ledger.deliveries) >= 30, 20)
    killed = terminate(database_url)
    assert killed >= 4  # two pools and two listeners at least
    killed_at = time.monotonic()

    def acked_after() -> bool:
        return any(d.at > killed_at and d.outcome == "acked" for d in list(ledger.deliveries))

    wait_for(acked_after, 10, message="a delivery after the sessions were terminated")
    resumed = time.monotonic() - killed_at
    wait_for(lambda: listeners(database_url) == 2, 15, message="both LISTENs back")
    relisten = time.monotonic() - killed_at
    # both processes' push works again across processes (NOTIFY, not the poll)
    with a.client() as api:
        declare(api, QueueSpec("term.x"))
    lat = cross_latencies(a, b, "term.x", 5) + cross_latencies(b, a, "term.x", 5)
    stop.set()
    join_all([*pubs, *consumers, sampler], 30)
    drain(ledger, a.ws_url, database_url, specs)
    report = check(ledger, specs, remaining_rows(database_url, names))
    failed = [p for p in ledger.publishes.values() if p.outcome == "failed"]
    print(
        f"terminate all ({killed} sessions): push resumed {resumed:.2f} s after, LISTENs "
        f"back {relisten:.2f} s after; {len(failed)} publishes refused (statuses, 0 for no "
        f"answer: {sorted({p.status or 0 for p in failed})}); cross-process latency after: median "
        f"{statistics.median(lat) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms; "
        f"{report.summary()}"
    )
    assert report.clean, report.summary()
    assert all(p.status == 503 for p in failed)
    assert ledger.count("unknown") == 0
    assert resumed < 5
    assert max(lat) < LOST_WAKEUP_BOUND
    assert statistics.median(lat) < 0.3  # NOTIFY again, not the 1 s poll


def test_terminate_the_listen_sessions_alone_no_wakeup_lost_beyond_the_poll(
    module_db: str, pair: list[BrokerProc]
) -> None:
    a, b = pair
    database_url = module_db
    with a.client() as api:
        declare(api, QueueSpec("listen"))
    before = cross_latencies(a, b, "listen", 5)
    assert listeners(database_url) == 2
    assert terminate(database_url, LISTENER) == 2
    killed_at = time.monotonic()
    # While the LISTEN connections are down (they are re-checked every 5 s), every
    # wake-up from the other process is lost: the poll fallback must cover each one.
    during = cross_latencies(a, b, "listen", 6)
    wait_for(lambda: listeners(database_url) == 2, 15, message="both LISTENs back")
    relisten = time.monotonic() - killed_at
    after = cross_latencies(a, b, "listen", 6)
    print(
        "LISTEN terminated: cross-process publish→delivery ms before "
        f"{[round(x * 1000) for x in before]}, while down {[round(x * 1000) for x in during]}"
        f", after {[round(x * 1000) for x in after]}; LISTEN back after {relisten:.1f} s"
    )
    assert max(during) < LOST_WAKEUP_BOUND
    assert max(after) < LOST_WAKEUP_BOUND
    assert statistics.median(after) < 0.3
    assert a.alive()
    assert b.alive()
