"""Many subscribed queues woken at once must not starve publishes of database connections
(issue 19): a publish that wakes the dispatchers of a hundred queues is followed by a hundred
claims, and those must leave the pool room for the next publish."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.support import ADMIN_PASSWORD, ADMIN_USER, client, login, running_server, wait_for
from tests.support import test_settings as settings_for
from tests.wsclient import WsClient, bind, declare_queue

QUEUES = 100
BATCHES = 24
PER_BATCH = 20


def test_delayed_publishes_to_many_subscribed_queues_never_wait_out_the_pool(
    database_url: str,
) -> None:
    # A pool of 2 with a 1 s checkout wait: claims that take every connection make a
    # publish wait its second out and answer 503.
    settings = settings_for(database_url, db_pool_size=2, db_pool_timeout_seconds=1.0)
    with running_server(settings) as live:
        token = login(live.base_url, ADMIN_USER, ADMIN_PASSWORD)
        with client(live.base_url, token) as admin:
            tag = uuid.uuid4().hex[:8]
            exchange = f"fan-{tag}"
            r = admin.put(f"/exchanges/{exchange}", json={"type": "fanout"})
            assert r.status_code in (200, 201), r.text
            queues = [f"many-{tag}-{i}" for i in range(QUEUES)]

            def declare(q: str) -> None:
                with client(live.base_url, token) as c:
                    declare_queue(c, q)
                    bind(c, exchange, q)

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(declare, queues))
            ws = WsClient.admin(live.ws_url)
            received: list[dict[str, Any]] = []
            stop = threading.Event()
            consumer = None
            try:
                for q in queues:
                    ws.subscribe(q, prefetch=100)

                def consume() -> None:
                    while not stop.is_set():
                        try:
                            frame = ws.recv_json(0.1)
                        except TimeoutError:
                            continue
                        received.append(frame)
                        if frame["type"] != "MESSAGE_DELIVERED":
                            continue
                        ws.send_json({"type": "ACK", "delivery_tag": frame["delivery_tag"]})

                consumer = threading.Thread(target=consume, daemon=True)
                consumer.start()
                statuses: list[int] = []

                def publish(batch: int) -> None:
                    messages = [
                        {"body": f"{batch}-{i}", "delay_ms": 300 + 20 * i} for i in range(PER_BATCH)
                    ]
                    with client(live.base_url, token) as c:
                        r = c.post(
                            f"/exchanges/{exchange}/publish-batch", json={"messages": messages}
                        )
                    statuses.append(r.status_code)

                started = time.monotonic()
                with ThreadPoolExecutor(6) as pool:
                    list(pool.map(publish, range(BATCHES)))
                print(f"published in {time.monotonic() - started:.2f} s: {statuses}")
                assert statuses == [200] * BATCHES
                total = QUEUES * BATCHES * PER_BATCH
                wait_for(lambda: len(received) >= total, 90, message=f"{total} deliveries")
                assert {f["type"] for f in received} == {"MESSAGE_DELIVERED"}
                bodies = {(f["queue"], f["body"]) for f in received}
                assert len(bodies) == total == len(received)
            finally:
                stop.set()
                if consumer is not None:
                    consumer.join(5)
                ws.close()
