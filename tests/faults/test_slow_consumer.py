"""A consumer that stops reading: bounded memory, others unaffected, no database connection
held, and the socket closed after the send timeout (2 s here instead of 30 s, through
tests/faults/launch.py) with what it held redelivered to the others.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.faults.checker import Ledger, QueueSpec, check
from tests.faults.harness import (
    ADMIN,
    BrokerProc,
    Consumer,
    Publisher,
    brokers,
    declare,
    join_all,
    remaining_rows,
    sessions,
)
from tests.support import wait_for
from tests.wsclient import WsClient, basic

SEND_TIMEOUT = 2.0
BODY = 300_000
PREFETCH = 100
MB = 1024 * 1024


def established_to(broker: BrokerProc, client_port: int) -> list[str]:
    return [
        c.status
        for c in psutil.Process(broker.pid).net_connections()
        if c.raddr and c.raddr.port == client_port
    ]


def run_stalled(database_url: str, logs: Path, messages: int) -> dict[str, float]:
    launcher = [sys.executable, "-m", "tests.faults.launch"]
    with brokers(
        database_url,
        logs,
        1,
        launcher=launcher,
        MXT_SEND_TIMEOUT_SECONDS=SEND_TIMEOUT,
        ACK_TIMEOUT_SECONDS=120,
    ) as (a,):
        with a.client() as api:
            declare(api, QueueSpec("slow"))
            declare(api, QueueSpec("other"))
        baseline = a.rss()
        stalled = WsClient.open(a.ws_url, basic())
        stalled.expect("CONNECTED")
        stalled.subscribe("slow", PREFETCH)
        port = stalled.ws.socket.getsockname()[1]
        # From here on nobody reads `stalled`: its library stops reading after 16 frames and
        # TCP backpressure reaches the broker.
        ledger, stop = Ledger(), threading.Event()
        peer = Consumer(ledger, [a.ws_url], ["slow"], stop, prefetch=10, name="peer")
        pub = Publisher(ledger, [a.api], "slow", stop, count=messages, seconds=120, body_bytes=BODY)
        peer.start()
        pub.start()

        peak = baseline
        latencies: list[float] = []
        states: set[str] = set()
        with WsClient.admin(a.ws_url) as other, httpx.Client(base_url=a.api, auth=ADMIN) as api:
            other.subscribe("other", 1)
            while pub.is_alive() or not latencies:
                started = time.monotonic()
                assert api.post("/queues/other/messages", json={"body": "x"}).status_code == 200
                d = other.delivery(timeout=5)
                latencies.append(time.monotonic() - started)
                assert other.ack(d["delivery_tag"])["type"] == "ACKED"
                peak = max(peak, a.rss())
                # a session busy (or inside a transaction) for more than a second would be
                # one held while a send waits: there must be none
                states |= {
                    s["state"]
                    for s in sessions(database_url)
                    if s["state"] != "idle" and s["seconds_in_state"] > 1.0
                }
                time.sleep(0.1)
        join_all([pub], 120)

        # The broker gives up on the stalled socket: it really closes it (not only forgets it)
        stalled_at = time.monotonic()
        wait_for(
            lambda: not established_to(a, port),
            SEND_TIMEOUT + 10,
            message="the broker to close the stalled socket",
        )
        closed_after = time.monotonic() - stalled_at
        # ...and what it held goes to the peer
        wait_for(lambda: not remaining_rows(database_url, ["slow"]), 30, message="slow drained")
        stop.set()
        join_all([peer], 20)
        stalled.ws.socket.close()
        report = check(ledger, [QueueSpec("slow")], remaining_rows(database_url, ["slow"]))
        growth = (peak - baseline) / MB
        print(
            f"stalled consumer: {messages} x {BODY // 1000} kB published, prefetch {PREFETCH}; "
            f"broker RSS +{growth:.1f} MB at peak; other queue's latency max "
            f"{max(latencies) * 1000:.0f} ms over {len(latencies)} probes; socket closed "
            f"{closed_after:.1f} s after the load ended; session states {sorted(states)}; "
            f"{report.summary()}"
        )
        assert report.clean, report.summary()
        assert ledger.count("ok") == messages
        assert max(latencies) < 1.0
        assert states == set(), states
        return {"growth_mb": growth, "published_mb": messages * BODY / MB}


def test_a_consumer_that_stops_reading(database_url: str, logs: Path) -> None:
    figures = run_stalled(database_url, logs, messages=150)
    # bounded by prefetch x body (30 MB) plus slack, whatever is published
    assert figures["growth_mb"] < 80


@pytest.mark.slow
def test_a_consumer_that_stops_reading_under_a_large_backlog(database_url: str, logs: Path) -> None:
    figures = run_stalled(database_url, logs, messages=1000)
    assert figures["growth_mb"] < 80  # while 286 MB went through the queue
