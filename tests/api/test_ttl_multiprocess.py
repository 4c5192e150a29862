"""Contract §13 across two broker processes on one database: both expiry sweeps run at once
and share the expired copies (SKIP LOCKED), each copy dead-lettered (and counted) exactly
once; queues with x-expires go through whichever process looks first, each once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from tests.api.test_multiprocess import Pair, start_pair
from tests.support import PgCluster, metric, wait_for
from tests.wsclient import browse, declare_queue

COPIES = 3000


@pytest.fixture(scope="module")
def pair(pg_cluster: PgCluster, template_db: str) -> Iterator[Pair]:
    name = pg_cluster.create_database(template_db)
    try:
        with ExitStack() as stack:
            yield start_pair(stack, pg_cluster.url_for(name))
    finally:
        pg_cluster.drop_database(name)


def expired_on(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics").text
    return metric(text, "messagex_messages_expired_total", outcome="dead_lettered") or 0.0


def test_two_processes_expire_each_copy_exactly_once(pair: Pair) -> None:
    q, target = f"ttl-{uuid.uuid4().hex[:8]}", f"target-{uuid.uuid4().hex[:8]}"
    declare_queue(pair.rest_a, target)
    arguments = {
        "x-message-ttl": 500,
        "x-dead-letter-exchange": "amq.direct",
        "x-dead-letter-routing-key": f"dead.{q}",
    }
    declare_queue(pair.rest_a, q, arguments=arguments)
    for queue, key in ((q, f"in.{q}"), (target, f"dead.{q}")):
        body = {"exchange": "amq.direct", "queue": queue, "routing_key": key}
        r = pair.rest_a.post("/bindings", json=body)
        assert r.status_code == 201, r.text
    before = expired_on(pair.a.base_url) + expired_on(pair.b.base_url)
    for start in range(0, COPIES, 1000):
        r = pair.rest_b.post(
            "/exchanges/amq.direct/publish-batch",
            json={
                "messages": [
                    {"routing_key": f"in.{q}", "body": i} for i in range(start, start + 1000)
                ]
            },
        )
        assert r.status_code == 200, r.text

    def moved() -> bool:
        ready: int = pair.rest_a.get(f"/queues/{target}").json()["stats"]["ready"]
        return ready == COPIES

    wait_for(moved, 15, message="every copy dead-lettered")
    bodies = [m["body"] for m in browse(pair.rest_a, target)]
    assert browse(pair.rest_a, q) == []
    after = expired_on(pair.a.base_url) + expired_on(pair.b.base_url)
    assert after - before == COPIES  # counted once each, whichever process swept it
    # every copy once (browse shows the first 1000 of them; the count says the rest)
    assert len(set(bodies)) == len(bodies)


def test_a_queue_expires_once_whichever_process_deletes_it(pair: Pair) -> None:
    queues = [f"exp-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    for q in queues:
        declare_queue(pair.rest_b, q, arguments={"x-expires": 1000})

    def gone() -> bool:
        return all(pair.rest_a.get(f"/queues/{q}").status_code == 404 for q in queues)

    wait_for(gone, 5, message="the queues expired")
