"""kill -9 of the broker process whose subscription is a queue's single active consumer
(contract §13): the waiting subscription on the other process takes over once the dead
process is found dead — within 5 s of the kill, by its LISTEN backend gone from
pg_stat_activity (broker/presence.py) — with SUBSCRIPTION_ACTIVE and in order.

The ack timeout is 60 s, so a takeover within seconds can only be the reaper's release.
That a live process is not taken for dead is tests/faults/test_takeover.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.faults.harness import brokers
from tests.wsclient import WsClient


def test_kill9_of_the_active_consumers_process_hands_over_in_order(
    database_url: str, logs: Path
) -> None:
    with brokers(database_url, logs, 2, ACK_TIMEOUT_SECONDS=60) as (a, b):
        q = "sac.crash"
        with b.client() as api:
            r = api.put(f"/queues/{q}", json={"arguments": {"x-single-active-consumer": True}})
            assert r.status_code == 201, r.text
            for i in range(6):
                assert api.post(f"/queues/{q}/messages", json={"body": i}).status_code == 200
        on_a = WsClient.admin(a.ws_url)
        with WsClient.admin(b.ws_url) as on_b:
            assert on_a.subscribe(q, 3)["active"] is True
            assert [d["body"] for d in on_a.deliveries_n(3)] == [0, 1, 2]
            assert on_b.subscribe(q, 10)["active"] is False
            a.kill9()
            killed = time.monotonic()
            assert on_b.expect("SUBSCRIPTION_ACTIVE", 10) == {
                "type": "SUBSCRIPTION_ACTIVE",
                "queue": q,
            }
            takeover = time.monotonic() - killed
            got = on_b.deliveries_n(6, 5)
            print(f"takeover {takeover:.2f} s after the kill")
            assert [d["body"] for d in got] == [0, 1, 2, 3, 4, 5]
            assert [d["redelivered"] for d in got] == [True, True, True, False, False, False]
            assert takeover < 5  # issue 25's bound (the fast liveness check runs every 1 s)
            with b.client() as api:
                assert api.get(f"/queues/{q}").json()["stats"]["consumers"] == 1
