"""Ordered message groups (contract §16, ``x-message-groups: true``) through real servers: one
copy of a group in flight at a time, in claim order; other groups and copies without a group
proceed; a requeue keeps the head; an ack, dead-lettering, expiry or deletion of the head lets
the next one go; a delayed copy holds back only the copies after it; priority and single active
consumer combine with groups. WebSocket and pull, on two broker processes sharing a database,
and a randomized run (consumers that ack, NACK, time out and disconnect on both processes)
with a sampler of the database that never sees two copies of a group in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import asyncpg
import httpx
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.api.test_multiprocess import (  # the module's database: one per module
    Pair,
    database,  # noqa: F401 - fixture
    start_pair,
)
from tests.support import wait_for
from tests.wsclient import WsClient, bind, declare_queue, publish

GROUPS = {"x-message-groups": True}
_names = itertools.count()


def fresh(prefix: str = "grp") -> str:
    return f"{prefix}{next(_names)}x{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def pair(database: str) -> Iterator[Pair]:  # noqa: F811
    with ExitStack() as stack:
        yield start_pair(stack, database, ack_timeout_check_interval_ms=100)


def group_queue(rest: httpx.Client, arguments: dict[str, Any] | None = None, **body: Any) -> str:
    name = fresh()
    declare_queue(rest, name, arguments={**GROUPS, **(arguments or {})}, **body)
    return name


def send(rest: httpx.Client, queue: str, body: Any, group: str | None, **extra: Any) -> None:
    properties = {"group_id": group} if group is not None else {}
    publish(rest, queue, body, properties={**properties, **extra.pop("properties", {})}, **extra)


def bodies(frames: list[dict[str, Any]]) -> list[Any]:
    return [f["body"] for f in frames]


def get(rest: httpx.Client, queue: str, n: int = 10, **extra: Any) -> list[dict[str, Any]]:
    r = rest.post(f"/queues/{queue}/get", json={"max_messages": n, **extra})
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def test_group_id_is_validated_and_stored(pair: Pair) -> None:
    q = group_queue(pair.rest_a)
    for bad in ["", "x" * 129, 7]:
        body = {"body": 1, "properties": {"group_id": bad}}
        r = pair.rest_a.post(f"/queues/{q}/messages", json=body)
        assert r.status_code == 422, r.text
    item = {"routing_key": q, "body": 1, "properties": {"group_id": ""}}
    r = pair.rest_a.post("/exchanges/amq.direct/publish-batch", json={"messages": [item]})
    assert r.status_code == 422, r.text
    with WsClient.admin(pair.a.ws_url) as ws:
        frame = {"type": "PUBLISH", "queue": q, "body": 1, "properties": {"group_id": ""}}
        assert ws.request(frame)["type"] == "ERROR"
    assert pair.rest_a.get(f"/queues/{q}/messages").json()["items"] == []
    send(pair.rest_a, q, 1, "g" * 128)
    items = pair.rest_a.get(f"/queues/{q}/messages").json()["items"]
    assert [i["properties"]["group_id"] for i in items] == ["g" * 128]
    r = pair.rest_a.put(f"/queues/{fresh()}", json={"arguments": {"x-message-groups": 1}})
    assert r.status_code == 422, r.text


def test_one_in_flight_per_group_in_order_over_websocket(pair: Pair) -> None:
    q = group_queue(pair.rest_a)
    for body, group in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("x", None), ("a3", "a")]:
        send(pair.rest_a, q, body, group)
    send(pair.rest_a, q, "y", None)
    with WsClient.admin(pair.a.ws_url) as ws:
        ws.subscribe(q, 10)
        got = ws.deliveries_n(4)
        assert bodies(got) == ["a1", "b1", "x", "y"]
        assert ws.quiet(0.3) == []
        assert ws.ack(got[0]["delivery_tag"])["type"] == "ACKED"
        a2 = ws.delivery()
        assert a2["body"] == "a2"
        assert ws.quiet(0.3) == []
        assert ws.ack(a2["delivery_tag"])["type"] == "ACKED"
        assert ws.delivery()["body"] == "a3"


def test_requeue_keeps_the_head(pair: Pair) -> None:
    q = group_queue(pair.rest_a)
    for i in range(3):
        send(pair.rest_a, q, i, "g")
    with WsClient.admin(pair.a.ws_url) as ws:
        ws.subscribe(q, 5)
        head = ws.delivery()
        assert head["body"] == 0
        assert ws.nack(head["delivery_tag"])["outcome"] == "requeued"
        again = ws.delivery()
        assert again["body"] == 0
        assert again["delivery_count"] == 2
        assert ws.quiet(0.3) == []
    # the disconnect released it: still the head, over pull too
    assert bodies(get(pair.rest_b, q)) == [0]


def test_pull_on_two_processes_one_at_a_time(pair: Pair) -> None:
    q = group_queue(pair.rest_a)
    for i in range(3):
        send(pair.rest_a, q, i, "g")
    send(pair.rest_a, q, "other", "h")
    first = get(pair.rest_a, q)
    assert bodies(first) == [0, "other"]
    assert get(pair.rest_b, q) == []
    tag = first[0]["delivery_tag"]
    # the ack on A wakes B's long poll
    acked = threading.Timer(0.3, lambda: pair.rest_a.post(f"/deliveries/{tag}/ack"))
    acked.start()
    r = pair.rest_b.post(f"/queues/{q}/get", json={"max_messages": 5, "wait_ms": 3000})
    acked.join()
    assert r.status_code == 200, r.text
    assert bodies(r.json()["messages"]) == [1]


def test_ack_on_one_process_wakes_a_subscriber_on_the_other(pair: Pair) -> None:
    q = group_queue(pair.rest_a)
    send(pair.rest_a, q, 0, "g")
    send(pair.rest_a, q, 1, "g")
    held = get(pair.rest_a, q)
    assert bodies(held) == [0]
    with WsClient.admin(pair.b.ws_url) as ws:
        ws.subscribe(q, 5)
        assert ws.quiet(0.3) == []
        started = time.monotonic()
        r = pair.rest_a.post(f"/deliveries/{held[0]['delivery_tag']}/ack")
        assert r.status_code == 204
        assert ws.delivery(3)["body"] == 1
        print(f"next copy {1000 * (time.monotonic() - started):.0f} ms after the ack")


def test_dead_lettering_and_deletion_of_the_head_release_the_next(pair: Pair) -> None:
    dlq = fresh("dlq")
    declare_queue(pair.rest_a, dlq, arguments=GROUPS)
    q = group_queue(pair.rest_a, dead_letter_queue=dlq)
    for i in range(4):
        send(pair.rest_a, q, i, "g")
    with WsClient.admin(pair.a.ws_url) as ws:
        ws.subscribe(q, 5)
        head = ws.delivery()
        assert head["body"] == 0
        assert ws.nack(head["delivery_tag"], requeue=False)["outcome"] == "dead_lettered"
        second = ws.delivery()
        assert second["body"] == 1
        # deleting the in-flight head (an operator) releases the next
        message_id = second["delivery_tag"].split(".")[0]
        pair.rest_a.delete(f"/queues/{q}/messages/{message_id}").raise_for_status()
        assert ws.delivery()["body"] == 2
    # the dead-lettered copy kept its group in the dead-letter queue
    (dead,) = get(pair.rest_a, dlq)
    assert dead["properties"]["group_id"] == "g"


def test_an_expired_ready_head_releases_the_next(pair: Pair) -> None:
    q = group_queue(pair.rest_a)
    send(pair.rest_a, q, "blocker", "g")
    held = get(pair.rest_a, q)
    send(pair.rest_a, q, "expires", "g", properties={"expiration": "200"})
    send(pair.rest_a, q, "next", "g")
    # the head expires while the blocker is in flight; then the blocker is acked
    wait_for(lambda: len(pair.rest_a.get(f"/queues/{q}/messages").json()["items"]) == 2)
    pair.rest_a.post(f"/deliveries/{held[0]['delivery_tag']}/ack").raise_for_status()
    assert bodies(get(pair.rest_b, q, wait_ms=3000)) == ["next"]


def test_a_delayed_copy_holds_back_only_later_ones(pair: Pair) -> None:
    q = group_queue(pair.rest_a)
    send(pair.rest_a, q, "late", "g", delay_ms=800)
    send(pair.rest_a, q, "now", "g")
    send(pair.rest_a, q, "later", "g", delay_ms=1200)
    with WsClient.admin(pair.a.ws_url) as ws:
        ws.subscribe(q, 5)
        now = ws.delivery()
        assert now["body"] == "now"  # falls due before "late": not held back by it
        assert ws.ack(now["delivery_tag"])["type"] == "ACKED"
        late = ws.delivery(3)
        assert late["body"] == "late"
        # "later" falls due meanwhile, and waits behind "late"
        assert ws.quiet(0.8) == []
        assert ws.ack(late["delivery_tag"])["type"] == "ACKED"
        assert ws.delivery(3)["body"] == "later"


def test_priority_queue_with_groups(pair: Pair) -> None:
    q = group_queue(pair.rest_a, {"x-max-priority": 9})
    send(pair.rest_a, q, "g-low", "g", properties={"priority": 1})
    send(pair.rest_a, q, "g-high", "g", properties={"priority": 9})
    send(pair.rest_a, q, "h-mid", "h", properties={"priority": 5})
    send(pair.rest_a, q, "none-low", None, properties={"priority": 0})
    got = get(pair.rest_b, q)
    assert bodies(got) == ["g-high", "h-mid", "none-low"]
    pair.rest_b.post(f"/deliveries/{got[0]['delivery_tag']}/ack").raise_for_status()
    assert bodies(get(pair.rest_b, q)) == ["g-low"]


def test_single_active_consumer_with_groups(pair: Pair) -> None:
    q = group_queue(pair.rest_a, {"x-single-active-consumer": True})
    for body, group in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")]:
        send(pair.rest_a, q, body, group)
    with WsClient.admin(pair.a.ws_url) as first, WsClient.admin(pair.b.ws_url) as second:
        assert first.subscribe(q, 10)["active"] is True
        assert second.subscribe(q, 10)["active"] is False
        got = first.deliveries_n(2)
        assert bodies(got) == ["a1", "b1"]
        assert first.quiet(0.3) == []
        assert first.ack(got[1]["delivery_tag"])["type"] == "ACKED"
        assert first.delivery()["body"] == "b2"
        assert second.quiet(0.2) == []


# -- the randomized run --------------------------------------------------------------------

IN_FLIGHT_TWICE = """
SELECT group_id, count(*) FROM messages
WHERE queue_id = $1 AND status = 'in_flight' AND group_id IS NOT NULL
GROUP BY group_id HAVING count(*) > 1
"""


class Sampler(threading.Thread):
    """Reads the queue's in-flight copies again and again until stopped: a group with two
    copies in flight at once is recorded."""

    def __init__(self, url: str, queue_id: int) -> None:
        super().__init__(daemon=True)
        self.database = url
        self.queue_id = queue_id
        self.stop = threading.Event()
        self.samples = 0
        self.violations: list[Any] = []

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        conn = await asyncpg.connect(asyncpg_dsn(self.database))
        try:
            while not self.stop.is_set():
                rows = await conn.fetch(IN_FLIGHT_TWICE, self.queue_id)
                self.samples += 1
                self.violations.extend(tuple(r) for r in rows)
        finally:
            await conn.close()


class Consumer(threading.Thread):
    """A WebSocket consumer that acks most deliveries, NACKs (requeue) some, leaves some
    unsettled (their ack timeout redelivers them) and now and then disconnects, releasing
    what it holds. Records (receive time, group, sequence) of every delivery and the time it
    sent each ack."""

    def __init__(self, url: str, queue: str, seed: int, until: float, log: list[Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.queue, self.until, self.log = url, queue, until, log
        self.rng = random.Random(seed)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while time.monotonic() < self.until:
                self._session()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _session(self) -> None:
        with WsClient.admin(self.url) as ws:
            ws.subscribe(self.queue, self.rng.choice([1, 3, 10]))
            for _ in range(self.rng.randint(5, 40)):
                if time.monotonic() >= self.until:
                    return
                try:
                    frame = ws.delivery(0.5)
                except AssertionError:
                    continue  # nothing free for us right now
                body = frame["body"]
                self.log.append(("got", time.monotonic(), body["g"], body["s"]))
                roll = self.rng.random()
                if roll < 0.1:
                    ws.nack(frame["delivery_tag"])
                elif roll < 0.15:
                    pass  # never settled: its ack timeout (1 s) redelivers it
                else:
                    sent = time.monotonic()
                    if ws.ack(frame["delivery_tag"])["type"] == "ACKED":
                        self.log.append(("ack", sent, body["g"], body["s"]))
            # leaving releases what this session holds


def test_randomized_many_groups_never_two_in_flight_and_in_order(
    pair: Pair,
    database: str,  # noqa: F811
) -> None:
    groups, per_group = 40, 8
    q = group_queue(pair.rest_a, ack_timeout_seconds=1)
    bind(pair.rest_a, "amq.direct", q, q)
    queue_id = asyncio.run(_queue_id(database, q))
    seq = [f"g{g}" for _ in range(per_group) for g in range(groups)]
    random.Random(7).shuffle(seq)
    order: dict[str, int] = defaultdict(int)
    messages = []
    for group in seq:  # publish order per group: s = 0, 1, 2, ...
        body = {"g": group, "s": order[group]}
        messages.append({"routing_key": q, "body": body, "properties": {"group_id": group}})
        order[group] += 1
    sampler = Sampler(database, queue_id)
    sampler.start()
    log: list[Any] = []
    until = time.monotonic() + 9
    consumers = [
        Consumer(url, q, seed, until, log)
        for seed, url in enumerate([pair.a.ws_url, pair.b.ws_url] * 3)
    ]
    for c in consumers:
        c.start()
    r = pair.rest_b.post("/exchanges/amq.direct/publish-batch", json={"messages": messages})
    assert r.status_code == 200, r.text
    for c in consumers:
        c.join(20)
    sampler.stop.set()
    sampler.join(5)
    for c in consumers:
        assert c.error is None, c.error
    assert sampler.samples > 10
    assert sampler.violations == []
    # per group, by time: deliveries never go back before an acked copy, never skip one, and
    # a copy is first delivered only after the previous one's ack was sent
    by_group: dict[str, list[Any]] = defaultdict(list)
    for event in sorted(log, key=lambda e: e[1]):
        by_group[event[2]].append(event)
    acked_total = 0
    for group, events in by_group.items():
        done = -1  # highest sequence acked (and so deleted)
        for kind, _, _, s in events:
            if kind == "got":
                assert s == done + 1, (group, events)
            else:
                assert s == done + 1, (group, events)
                done = s
        acked_total += done + 1
    assert acked_total > groups  # the run made progress


async def _queue_id(url: str, name: str) -> int:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return int(await conn.fetchval("SELECT id FROM queues WHERE name = $1", name))
    finally:
        await conn.close()
