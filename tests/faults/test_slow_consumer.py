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
import orjson
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
    raw_upgrade,
    remaining_rows,
    sessions,
)
from tests.support import wait_for
from tests.wsclient import WsClient, _masked, basic

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


def test_a_consumer_that_never_reads_is_sent_no_more_and_cut_off(
    database_url: str, logs: Path
) -> None:
    """Issue 18, finding 6: 150 x 900 KiB messages at prefetch 150 to a client that never
    reads. On main the whole batch went into the transport's buffer, so no send waited and
    the send timeout never fired: +375 MiB after 2 s, +485 MiB after 37 s, no log line.
    Contract §8: nothing more is sent once MESSAGEX_MAX_CONNECTION_BUFFER_BYTES (16 MiB)
    wait for it, and it is closed, its deliveries released, when a send waited (2 s here)."""
    launcher = [sys.executable, "-m", "tests.faults.launch"]
    messages, body = 150, "x" * (900 * 1024 - 2)  # 900 KiB as JSON
    with brokers(
        database_url,
        logs,
        1,
        launcher=launcher,
        MXT_SEND_TIMEOUT_SECONDS=SEND_TIMEOUT,
        ACK_TIMEOUT_SECONDS=300,
    ) as (a,):
        with a.client(timeout=30) as api:
            declare(api, QueueSpec("stuck"))
            started = time.monotonic()
            for _ in range(messages):  # a backlog: one claim takes all of it
                assert api.post("/queues/stuck/messages", json={"body": body}).status_code == 200
            published = time.monotonic() - started
            baseline = a.rss()
            sock = raw_upgrade(a.port, basic())
            port = sock.getsockname()[1]
            subscribe = {"type": "SUBSCRIBE", "queue": "stuck", "prefetch": messages}
            sock.sendall(_masked(1, orjson.dumps(subscribe)))
            started = time.monotonic()
            peak = baseline
            while time.monotonic() - started < 2:
                peak = max(peak, a.rss())
                time.sleep(0.05)
            after_2s = (a.rss() - baseline) / MB
            # main kept it open (and its memory) for good: look for 40 s at most
            closed_after: float | None = None
            while closed_after is None and time.monotonic() - started < 40:
                peak = max(peak, a.rss())
                if not established_to(a, port):
                    closed_after = time.monotonic() - started
                time.sleep(0.05)
            # what it held is released: every message ready again, none in flight
            if closed_after is not None:
                wait_for(
                    lambda: api.get("/queues/stuck").json()["stats"]["in_flight"] == 0,
                    10,
                    message="the deliveries released",
                )
            stats = api.get("/queues/stuck").json()["stats"]
        sock.close()
        growth = (peak - baseline) / MB
        timed_out = "send timeout" in a.log_text()
        print(
            f"never-reading consumer: a backlog of {messages} x 900 KiB (published in "
            f"{published:.1f} s), subscribed at prefetch {messages}; broker RSS "
            f"+{after_2s:.0f} MiB after 2 s, +{growth:.0f} MiB at peak; socket closed after "
            f"{closed_after} s; send-timeout logged: {timed_out}; "
            f"queue after: {stats}"
        )
        assert closed_after is not None
        assert timed_out
        assert stats["ready"] == messages
        # 16 MiB waiting, one 1 MiB chunk being sent, what the kernel's socket buffers took,
        # and the transient copies of rendering and framing
        assert growth < 80
